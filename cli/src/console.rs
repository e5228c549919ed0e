//! `kumo vm console VM`: the VM's serial console in this terminal.
//!
//! The terminal goes raw (every key goes to the guest, Ctrl-] leaves) when
//! standard input is one, and its size (now and after each `SIGWINCH`) is
//! set on the guest's serial line; otherwise standard input is sent as it
//! comes and the console stays open until the server closes it. With
//! `--log`, it prints the console's scrollback (from boot, up to ~1 MiB)
//! and leaves. Events from the server (taken over, closed) are printed on
//! standard error.

use std::io::Write;

use futures_util::{SinkExt, StreamExt};
use kumo_api_types::{ConsoleControl, ConsoleEvent, ConsoleMode, ConsoleTicket};
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

/// The terminal's size, when standard output is one.
fn window() -> Option<ConsoleControl> {
    let (terminal_size::Width(cols), terminal_size::Height(rows)) =
        terminal_size::terminal_size_of(std::io::stdout())?;
    Some(ConsoleControl::Resize { cols, rows })
}

fn control(c: &ConsoleControl) -> Message {
    Message::Text(serde_json::to_string(c).unwrap_or_default().into())
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
    let url = kumo_api_types::websocket_url(c.base(), &ticket.url);
    let (ws, _) = tokio_tungstenite::connect_async(url)
        .await
        .map_err(|e| anyhow::anyhow!("opening the console: {e}"))?;
    let (mut tx, mut rx) = ws.split();
    let interactive = !log && std::io::IsTerminal::is_terminal(&std::io::stdin());
    if interactive {
        eprint!("Connected to {vm}'s console; Ctrl-] leaves.\r\n");
    }
    let _raw = if interactive {
        Some(Raw::enter())
    } else {
        None
    };
    let writing = !log && !read_only;
    // The guest's serial line takes the terminal's size, now and whenever
    // it changes.
    let mut resized =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())?;
    if writing {
        if let Some(size) = window() {
            tx.send(control(&size)).await?;
        }
    }
    let mut stdin = tokio::io::stdin();
    let mut buf = vec![0u8; 4096];
    let mut stdin_open = writing;
    let mut out = std::io::stdout();
    let why = loop {
        tokio::select! {
            msg = rx.next() => match msg {
                Some(Ok(Message::Binary(b))) => {
                    out.write_all(&b)?;
                    out.flush()?;
                }
                Some(Ok(Message::Text(t))) => match serde_json::from_str(t.as_str()) {
                    // `--log` prints the scrollback, up to where the live
                    // output begins.
                    Ok(ConsoleEvent::Live) if log => break "end of the log".to_owned(),
                    Ok(ConsoleEvent::TookOver { from }) => eprint!("[kumo: took the console over from {from}]\r\n"),
                    Ok(ConsoleEvent::TakenOver { by }) => eprint!("\r\n[kumo: {by} took the console over; read-only now]\r\n"),
                    Ok(ConsoleEvent::ReadOnly { reason }) => eprint!("\r\n[kumo: read-only now: {reason}]\r\n"),
                    Ok(ConsoleEvent::Closed { reason }) => break reason,
                    _ => {}
                },
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
            Some(()) = resized.recv(), if writing => {
                if let Some(size) = window() {
                    tx.send(control(&size)).await?;
                }
            },
        }
    };
    let _ = tx.close().await;
    Ok(why)
}
