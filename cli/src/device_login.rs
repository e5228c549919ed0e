//! `kumo login --device`: for a terminal without a browser. The server
//! starts an OAuth device authorization grant at the institution; the
//! user opens the address shown (on any device) and enters the code; this
//! command asks the server at the provider's pace until the user has
//! agreed, and gets an API token.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use serde::Deserialize;
use serde_json::json;

#[derive(Deserialize)]
struct Started {
    handle: String,
    user_code: String,
    verification_uri: String,
    verification_uri_complete: Option<String>,
    interval: u64,
    expires_in: u64,
}

#[derive(Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
enum Polled {
    Pending { interval: u64 },
    Done { token: String, user: String },
}

/// The server's refusal in words (a problem's detail, else its title).
async fn refusal(r: reqwest::Response) -> anyhow::Error {
    let status = r.status();
    let body: serde_json::Value = r.json().await.unwrap_or_default();
    let why = body["detail"]
        .as_str()
        .or(body["title"].as_str())
        .unwrap_or("no reason given");
    anyhow!("{why} (HTTP {})", status.as_u16())
}

pub async fn run(
    server: &str,
    provider: Option<&str>,
    out: &mut dyn Write,
) -> anyhow::Result<String> {
    let base = server.trim_end_matches('/');
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    let r = http
        .post(format!("{base}/auth/device"))
        .json(&json!({ "provider": provider }))
        .send()
        .await
        .with_context(|| format!("cannot reach {base}"))?;
    if !r.status().is_success() {
        return Err(refusal(r).await.context("the device login could not start"));
    }
    let s: Started = r.json().await.context("the server's answer")?;
    writeln!(
        out,
        "On any device, open\n  {}\nand enter the code  {}",
        s.verification_uri, s.user_code
    )?;
    if let Some(c) = &s.verification_uri_complete {
        writeln!(out, "(or open {c})")?;
    }
    out.flush()?;
    let deadline = Instant::now() + Duration::from_secs(s.expires_in.clamp(1, 3600));
    let mut interval = s.interval.max(1);
    let progress = crate::progress::Progress::start("waiting for the code to be entered");
    loop {
        if Instant::now() >= deadline {
            bail!("the code expired before it was entered; run `kumo login --device` again");
        }
        tokio::time::sleep(Duration::from_secs(interval)).await;
        let r = http
            .post(format!("{base}/auth/device/token"))
            .json(&json!({ "handle": s.handle }))
            .send()
            .await
            .with_context(|| format!("cannot reach {base}"))?;
        if !r.status().is_success() {
            return Err(refusal(r).await.context("the device login failed"));
        }
        match r.json().await.context("the server's answer")? {
            Polled::Pending { interval: i } => interval = i.max(1),
            Polled::Done { token, user } => {
                drop(progress);
                writeln!(out, "Signed in as {user}.")?;
                return Ok(token);
            }
        }
    }
}
