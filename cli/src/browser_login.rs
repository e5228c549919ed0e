//! `kumo login` without a token: the portal signs the user in (through
//! their institution) and, once they allow it, sends an API token to a
//! one-shot listener on this machine's loopback, checked by a random state.

use std::io::Write;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long to wait for the browser.
const WAIT: Duration = Duration::from_secs(300);

/// `state` and `token` from `GET /?state=…&token=… HTTP/1.1`.
pub fn parse_request(head: &str) -> Option<(String, String)> {
    let target = head.lines().next()?.split_whitespace().nth(1)?;
    let query = target.split_once('?')?.1;
    let mut state = None;
    let mut token = None;
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("state", v)) => state = Some(v.to_owned()),
            Some(("token", v)) => token = Some(v.to_owned()),
            _ => {}
        }
    }
    Some((state?, token?))
}

pub async fn run(server: &str, no_browser: bool, out: &mut dyn Write) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("opening a loopback port for the browser's answer")?;
    let port = listener.local_addr()?.port();
    let state = format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    let url = format!(
        "{}/login/cli?port={port}&state={state}",
        server.trim_end_matches('/')
    );
    writeln!(out, "Open this page to sign in:\n  {url}")?;
    out.flush()?;
    if !no_browser {
        // Best effort: the address is printed either way.
        let _ = std::process::Command::new("xdg-open").arg(&url).spawn();
    }
    loop {
        let (mut sock, _) = tokio::time::timeout(WAIT, listener.accept())
            .await
            .map_err(|_| anyhow!("no answer from the browser within {} s", WAIT.as_secs()))??;
        let mut buf = vec![0u8; 8192];
        let mut n = 0;
        while n < buf.len() {
            let read = sock.read(&mut buf[n..]).await?;
            if read == 0 {
                break;
            }
            n += read;
            if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
        let head = String::from_utf8_lossy(&buf[..n]).into_owned();
        let Some((got_state, token)) = parse_request(&head) else {
            // Not the answer (a favicon, a probe): not for us.
            let _ = sock
                .write_all(
                    b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                )
                .await;
            continue;
        };
        let (status, body) = if got_state != state {
            (
                "400 Bad Request",
                "This sign-in is not the one the kumo command started.",
            )
        } else {
            (
                "200 OK",
                "Signed in: you can close this window and return to the terminal.",
            )
        };
        let reply = format!(
            "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = sock.write_all(reply.as_bytes()).await;
        if got_state != state {
            bail!("the browser answered another sign-in (state mismatch)");
        }
        return Ok(token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_is_read_from_the_request_line() {
        assert_eq!(
            parse_request("GET /?state=abc&token=kumo_1_x HTTP/1.1\r\nHost: x\r\n\r\n"),
            Some(("abc".into(), "kumo_1_x".into()))
        );
        assert_eq!(parse_request("GET /favicon.ico HTTP/1.1\r\n"), None);
        assert_eq!(parse_request(""), None);
    }
}
