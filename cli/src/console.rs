//! `kumo vm console VM`: the VM's serial console in this terminal.
//!
//! The terminal goes raw (every key goes to the guest, Ctrl-] leaves) when
//! standard input is one; otherwise standard input is sent as it comes
//! and the console stays open until the server closes it (or, with
//! `--log`, until it has been quiet for a moment: what the console shows
//! right after opening, then nothing). Events from the server (taken
//! over, closed) are printed on standard error.

use std::io::Write;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use kumo_api_types::{ConsoleMode, ConsoleTicket};
use reqwest::Method;
use tokio::io::AsyncReadExt;
use tokio_tungstenite::tungstenite::Message;

use crate::client::{segment, Client, ClientError};

/// Ctrl-]: leaves the console, as in telnet and `virsh console`.
const ESCAPE: u8 = 0x1d;

impl Client {
    /// A ticket for a VM's console.
    pub async fn console_ticket(
        &self,
        tenant: &str,
        vm: &str,
        mode: ConsoleMode,
    ) -> Result<ConsoleTicket, ClientError> {
        let mode = match mode {
            ConsoleMode::Write => "write",
            ConsoleMode::Read => "read",
        };
        self.send(self.request(
            Method::POST,
            &format!(
                "/api/v1/tenants/{}/vms/{}/console?mode={mode}",
                segment(tenant),
                segment(vm)
            ),
        ))
        .await
    }
}

/// The terminal in raw mode until dropped (restored even on error).
struct Raw(Option<nix::sys::termios::Termios>);

impl Raw {
    fn enter() -> Raw {
        use nix::sys::termios::{cfmakeraw, tcgetattr, tcsetattr, SetArg};
        let stdin = std::io::stdin();
        let Ok(saved) = tcgetattr(&stdin) else {
            return Raw(None);
        };
        let mut raw = saved.clone();
        cfmakeraw(&mut raw);
        match tcsetattr(&stdin, SetArg::TCSANOW, &raw) {
            Ok(()) => Raw(Some(saved)),
            Err(_) => Raw(None),
        }
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        if let Some(t) = &self.0 {
            let _ = nix::sys::termios::tcsetattr(
                std::io::stdin(),
                nix::sys::termios::SetArg::TCSANOW,
                t,
            );
        }
    }
}

/// Runs a console session; answers the reason it closed.
pub async fn run(
    c: &Client,
    tenant: &str,
    vm: &str,
    read_only: bool,
    log: bool,
) -> anyhow::Result<String> {
    let mode = if read_only || log {
        ConsoleMode::Read
    } else {
        ConsoleMode::Write
    };
    let ticket = c.console_ticket(tenant, vm, mode).await?;
    let base = c.base();
    let ws_base = if let Some(rest) = base.strip_prefix("https://") {
        format!("wss://{rest}")
    } else if let Some(rest) = base.strip_prefix("http://") {
        format!("ws://{rest}")
    } else {
        base.to_owned()
    };
    let (ws, _) = tokio_tungstenite::connect_async(format!("{ws_base}{}", ticket.url))
        .await
        .map_err(|e| anyhow::anyhow!("opening the console: {e}"))?;
    let (mut tx, mut rx) = ws.split();
    let interactive = !log && std::io::IsTerminal::is_terminal(&std::io::stdin());
    if interactive {
        eprint!("Connected to {vm}'s console; Ctrl-] leaves.\r\n");
        if let Some(w) = &ticket.writer {
            eprint!("(taken over from {w})\r\n");
        }
    }
    let _raw = if interactive {
        Some(Raw::enter())
    } else {
        None
    };
    let mut stdin = tokio::io::stdin();
    let mut buf = vec![0u8; 4096];
    let mut stdin_open = !log && !read_only;
    let quiet = Duration::from_millis(1500);
    let mut out = std::io::stdout();
    let why = loop {
        let idle = tokio::time::sleep(quiet);
        tokio::select! {
            msg = rx.next() => match msg {
                Some(Ok(Message::Binary(b))) => {
                    out.write_all(&b)?;
                    out.flush()?;
                }
                Some(Ok(Message::Text(t))) => {
                    let v: serde_json::Value = serde_json::from_str(t.as_str()).unwrap_or_default();
                    match v["event"].as_str() {
                        Some("taken_over") => eprint!("\r\n[kumo: {} took the console over; read-only now]\r\n", v["by"].as_str().unwrap_or("someone")),
                        Some("closed") => break v["reason"].as_str().unwrap_or("closed").to_owned(),
                        _ => {}
                    }
                }
                Some(Ok(Message::Close(_))) | None => break "closed".to_owned(),
                Some(Err(e)) => break format!("connection lost: {e}"),
                Some(Ok(_)) => {}
            },
            n = stdin.read(&mut buf), if stdin_open => match n {
                Ok(0) | Err(_) => stdin_open = false,
                Ok(n) => {
                    let data = &buf[..n];
                    if interactive {
                        if let Some(i) = data.iter().position(|b| *b == ESCAPE) {
                            if i > 0 {
                                tx.send(Message::Binary(data[..i].to_vec().into())).await?;
                            }
                            break "left".to_owned();
                        }
                    }
                    tx.send(Message::Binary(data.to_vec().into())).await?;
                }
            },
            _ = idle, if log => break "end of the log".to_owned(),
        }
    };
    let _ = tx.close().await;
    Ok(why)
}
