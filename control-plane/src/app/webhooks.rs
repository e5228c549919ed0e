//! A project's webhook: its address sealed at rest with the server's key
//! (a webhook's address is often its only secret, Slack's for one), and
//! notices posted to it in the background, to public addresses only,
//! without following redirects, with the outcome kept for the project to
//! see.

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use base64::Engine;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use uuid::Uuid;

use crate::context::AppState;
use crate::domain::idle_gpus::{unacceptable_among, webhook_url};
use crate::error::ApiError;
use crate::store::idle_gpus as store;

const TIMEOUT: Duration = Duration::from_secs(5);

fn key_path(st: &AppState) -> std::path::PathBuf {
    st.config
        .idle
        .webhook_key_file
        .clone()
        .unwrap_or_else(|| st.config.data_dir.join("webhook.key"))
}

/// The sealing key: read from its file, made (0600) on first use.
fn key(st: &AppState) -> Result<LessSafeKey, ApiError> {
    let path = key_path(st);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut bytes = [0u8; 32];
            SystemRandom::new()
                .fill(&mut bytes)
                .map_err(|_| ApiError::Internal("no randomness for the webhook key".into()))?;
            let made = {
                use std::os::unix::fs::OpenOptionsExt;
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&path)
            };
            match made {
                Ok(mut f) => {
                    f.write_all(hex::encode(bytes).as_bytes())
                        .map_err(|e| ApiError::Internal(format!("{}: {e}", path.display())))?;
                }
                // Another request made it first: read theirs.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(ApiError::Internal(format!("{}: {e}", path.display()))),
            }
            std::fs::read_to_string(&path)
                .map_err(|e| ApiError::Internal(format!("{}: {e}", path.display())))?
        }
        Err(e) => return Err(ApiError::Internal(format!("{}: {e}", path.display()))),
    };
    let bytes = hex::decode(text.trim())
        .ok()
        .filter(|b| b.len() == 32)
        .ok_or_else(|| ApiError::Internal(format!("{}: not 32 bytes in hex", path.display())))?;
    let unbound = UnboundKey::new(&AES_256_GCM, &bytes)
        .map_err(|_| ApiError::Internal("the webhook key is not an AES-256 key".into()))?;
    Ok(LessSafeKey::new(unbound))
}

/// The address sealed (AES-256-GCM, a fresh nonce each time; the tenant's
/// id is bound in, so a sealed address moved to another project's row
/// does not open).
pub fn seal(st: &AppState, tenant: Uuid, url: &str) -> Result<String, ApiError> {
    let key = key(st)?;
    let mut nonce = [0u8; NONCE_LEN];
    SystemRandom::new()
        .fill(&mut nonce)
        .map_err(|_| ApiError::Internal("no randomness for a nonce".into()))?;
    let mut data = url.as_bytes().to_vec();
    key.seal_in_place_append_tag(
        Nonce::assume_unique_for_key(nonce),
        Aad::from(tenant.as_bytes()),
        &mut data,
    )
    .map_err(|_| ApiError::Internal("sealing the webhook failed".into()))?;
    let mut out = nonce.to_vec();
    out.extend(data);
    Ok(base64::engine::general_purpose::STANDARD.encode(out))
}

fn open(st: &AppState, tenant: Uuid, sealed: &str) -> Result<String, String> {
    let key = key(st).map_err(|e| e.to_string())?;
    let mut data = base64::engine::general_purpose::STANDARD
        .decode(sealed)
        .map_err(|_| "the sealed address is not base64".to_string())?;
    if data.len() < NONCE_LEN {
        return Err("the sealed address is too short".into());
    }
    let mut nonce = [0u8; NONCE_LEN];
    nonce.copy_from_slice(&data[..NONCE_LEN]);
    let plain = key
        .open_in_place(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(tenant.as_bytes()),
            &mut data[NONCE_LEN..],
        )
        .map_err(|_| "the address does not open with this server's key".to_string())?;
    String::from_utf8(plain.to_vec()).map_err(|_| "the address is not text".into())
}

/// Posts `body` to the project's webhook, if it has one, in the
/// background; the outcome is kept on the project's policy.
pub fn notify(st: &AppState, tenant: Uuid, event: &'static str, body: serde_json::Value) {
    let st = st.clone();
    tokio::spawn(async move {
        let outcome = match deliver(&st, tenant, event, &body).await {
            Ok(None) => return,
            Ok(Some(status)) => format!("delivered (HTTP {status})"),
            Err(e) => {
                tracing::warn!(%tenant, error = %e, "webhook not delivered");
                format!("not delivered: {e}")
            }
        };
        let now = st.config.clock.now();
        if let Err(e) = store::webhook_result(&st.db, tenant, now, &outcome).await {
            tracing::warn!(%tenant, error = %e, "webhook outcome not kept");
        }
    });
}

async fn deliver(
    st: &AppState,
    tenant: Uuid,
    event: &str,
    body: &serde_json::Value,
) -> Result<Option<u16>, String> {
    let row = store::policy(&st.db, tenant)
        .await
        .map_err(|e| e.to_string())?;
    let Some(sealed) = row.and_then(|r| r.webhook_sealed) else {
        return Ok(None);
    };
    let allow_loopback = st.config.idle.allow_loopback_webhooks;
    let url = webhook_url(&open(st, tenant, &sealed)?, allow_loopback)?;
    let host = url.host_str().ok_or("no host")?.to_owned();
    let port = url.port_or_known_default().ok_or("no port")?;
    // Every address the name has must be acceptable, and the request goes
    // to the one checked (no second lookup to rebind).
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((bare, port))
        .await
        .map_err(|e| format!("{host} does not resolve: {e}"))?
        .collect();
    let Some(first) = addrs.first().copied() else {
        return Err(format!("{host} has no address"));
    };
    // IPv6 answers that carry an IPv4 address (mapped, 6to4, Teredo,
    // NAT64, …) are judged by the one they carry.
    if let Some(bad) = unacceptable_among(addrs.iter().map(|a| a.ip()), allow_loopback) {
        return Err(format!("{host} resolves to {bad}, not a public address"));
    }
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(TIMEOUT)
        .resolve(bare, first)
        .build()
        .map_err(|e| e.to_string())?;
    let r = client
        .post(url)
        .header("Kumo-Event", event)
        .json(body)
        .send()
        .await
        .map_err(|e| e.without_url().to_string())?;
    let status = r.status().as_u16();
    if r.status().is_success() {
        Ok(Some(status))
    } else {
        Err(format!("HTTP {status}"))
    }
}
