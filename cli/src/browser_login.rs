//! `kumo login` without a token: the portal signs the user in (through
//! their institution) and, once they allow it, the browser posts an API
//! token to a one-shot listener on this machine's loopback, checked by a
//! random state. The token travels in the POST body, never in a URL, so
//! it stays out of the browser's history.

use std::io::Write;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long to wait for the browser.
const WAIT: Duration = Duration::from_secs(300);

/// How long one connection may take to send its request.
const READ_WAIT: Duration = Duration::from_secs(10);

/// The largest request the listener reads: a form with a state and a token.
const MAX_REQUEST: usize = 8192;

/// `state` and `token` from a complete `POST / HTTP/1.1` request whose
/// body is `state=…&token=…` (form-encoded; both values are URL-safe).
/// `None` for anything else, a token in the query string included.
pub fn parse_request(request: &[u8]) -> Option<(String, String)> {
    let (head, body) = split_request(request)?;
    let mut request_line = head.lines().next()?.split_whitespace();
    if request_line.next()? != "POST" || request_line.next()? != "/" {
        return None;
    }
    let body = std::str::from_utf8(body).ok()?;
    let mut state = None;
    let mut token = None;
    for pair in body.split('&') {
        match pair.split_once('=') {
            Some(("state", v)) => state = Some(v.to_owned()),
            Some(("token", v)) => token = Some(v.to_owned()),
            _ => {}
        }
    }
    Some((state?, token?))
}

/// The head and the body of a request that has arrived whole (its body as
/// long as its `Content-Length`); `None` while more is to come.
fn split_request(request: &[u8]) -> Option<(&str, &[u8])> {
    let end = request.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&request[..end]).ok()?;
    let length: usize = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0);
    let body = request.get(end + 4..end + 4 + length)?;
    Some((head, body))
}

async fn read_request(sock: &mut tokio::net::TcpStream) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; MAX_REQUEST];
    let mut n = 0;
    while n < buf.len() {
        let read = sock.read(&mut buf[n..]).await?;
        if read == 0 {
            break;
        }
        n += read;
        if split_request(&buf[..n]).is_some() {
            break;
        }
    }
    buf.truncate(n);
    Ok(buf)
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
    let _progress = crate::progress::Progress::start("waiting for the browser's sign-in");
    loop {
        let (mut sock, _) = tokio::time::timeout(WAIT, listener.accept())
            .await
            .map_err(|_| anyhow!("no answer from the browser within {} s", WAIT.as_secs()))??;
        // Another local program may connect and say nothing: it gets a
        // few seconds, then the listener waits for the browser again.
        let Ok(request) = tokio::time::timeout(READ_WAIT, read_request(&mut sock)).await else {
            continue;
        };
        let Some((got_state, token)) = parse_request(&request?) else {
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
    fn the_answer_is_read_from_a_posted_form_only() {
        let post = |body: &str| {
            format!(
                "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
        };
        assert_eq!(
            parse_request(post("state=abc&token=kumo_1_x").as_bytes()),
            Some(("abc".into(), "kumo_1_x".into()))
        );
        // Not yet whole: the body is shorter than announced.
        let cut = post("state=abc&token=kumo_1_x");
        assert_eq!(parse_request(&cut.as_bytes()[..cut.len() - 3]), None);
        // A token in a URL is never taken.
        assert_eq!(
            parse_request(b"GET /?state=abc&token=kumo_1_x HTTP/1.1\r\nHost: x\r\n\r\n"),
            None
        );
        assert_eq!(parse_request(b"GET /favicon.ico HTTP/1.1\r\n\r\n"), None);
        assert_eq!(parse_request(b""), None);
    }
}
