//! `Idempotency-Key` on mutating POSTs: the first request with a key runs
//! and its answer is stored; a retry with the same key and the same request
//! gets that answer again (`Idempotent-Replayed: true`) and changes nothing.
//!
//! The key is claimed by inserting a row under a unique (user, key) primary
//! key before the handler runs, so two concurrent retries cannot both run:
//! the loser is told the first is still in progress (409). A claim left
//! behind by a crash expires after [`ABANDONED_AFTER`], and server errors
//! release the claim so the client may retry.
//!
//! A secret is shown once and never kept: an answer that carries one (a new
//! API token, a join token) is not stored. A replay of such a request
//! answers 409 naming the resource it made, so the client can find it (and
//! revoke it) without the secret ever sitting in the database.

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use chrono::{Duration, Utc};
use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter, Set};
use sha2::{Digest, Sha256};

use crate::context::AppState;
use crate::entity::idempotency_keys;
use crate::error::{is_unique_violation, ApiError};
use crate::http::extract::AuthOutcome;

pub const HEADER: &str = "idempotency-key";
pub const REPLAYED_HEADER: &str = "idempotent-replayed";
/// Stored answers are kept this long; the reclaimer purges older rows.
pub use crate::store::idempotency::RETENTION;
/// A claim without an answer this old belongs to a request that died.
const ABANDONED_AFTER: Duration = Duration::minutes(5);
/// The largest answer kept: Kumo's answers to POSTs are one resource, a
/// few KiB; a larger one is answered but not kept (its key is released).
const MAX_STORED_RESPONSE: usize = 256 << 10;
/// The most answers one user may have kept at once (within
/// [`RETENTION`]): each key is a row in the shared database.
pub const MAX_KEYS_PER_USER: u64 = 1000;

pub async fn layer(State(state): State<AppState>, req: Request, next: Next) -> Response {
    match handle(&state, req, next).await {
        Ok(resp) => resp,
        Err(e) => e.into_response(),
    }
}

async fn handle(state: &AppState, req: Request, next: Next) -> Result<Response, ApiError> {
    if req.method() != Method::POST {
        return Ok(next.run(req).await);
    }
    let Some(key) = req.headers().get(HEADER) else {
        return Ok(next.run(req).await);
    };
    // Without a caller the handler answers 401, before anything about the
    // request is judged; there is nothing to scope the key to either.
    let Some(AuthOutcome::Caller(caller)) = req.extensions().get::<AuthOutcome>().cloned() else {
        return Ok(next.run(req).await);
    };
    let key = key
        .to_str()
        .ok()
        .filter(|k| (1..=255).contains(&k.len()) && k.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or_else(|| ApiError::field("Idempotency-Key", "1–255 visible ASCII characters"))?
        .to_owned();
    let user_id = caller.user.id;

    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, state.config.body_limit_bytes)
        .await
        .map_err(|_| ApiError::PayloadTooLarge("request body exceeds the size limit".into()))?;
    let hash = request_hash(parts.method.as_str(), parts.uri.path(), &body);

    let now = Utc::now();
    let kept = idempotency_keys::Entity::find()
        .filter(idempotency_keys::Column::UserId.eq(user_id))
        .filter(idempotency_keys::Column::CreatedAt.gt(now - RETENTION))
        .count(&state.db)
        .await?;
    if kept >= MAX_KEYS_PER_USER {
        let known = idempotency_keys::Entity::find_by_id((user_id, key.clone()))
            .one(&state.db)
            .await?
            .is_some();
        if !known {
            return Err(ApiError::TooManyRequests {
                detail: format!(
                    "{MAX_KEYS_PER_USER} Idempotency-Keys of yours are kept (24 h each); retry this without a new key, or later"
                ),
                retry_after_secs: 3600,
            });
        }
    }
    let claim = idempotency_keys::ActiveModel {
        user_id: Set(user_id),
        key: Set(key.clone()),
        request_hash: Set(hash.clone()),
        status: Set(None),
        content_type: Set(None),
        body: Set(None),
        created_at: Set(now),
        completed_at: Set(None),
    };
    if let Err(e) = claim.clone().insert(&state.db).await {
        if !is_unique_violation(&e) {
            return Err(e.into());
        }
        let existing = idempotency_keys::Entity::find_by_id((user_id, key.clone()))
            .one(&state.db)
            .await?;
        match existing {
            Some(row)
                if now - row.created_at < RETENTION
                    && !(row.status.is_none() && now - row.created_at > ABANDONED_AFTER) =>
            {
                if row.request_hash != hash {
                    return Err(ApiError::IdempotencyKeyReuse(
                        "this Idempotency-Key was used for a different request".into(),
                    ));
                }
                return match row.status {
                    Some(status) => Ok(replay(&row, status)),
                    None => Err(ApiError::Conflict(
                        "a request with this Idempotency-Key is still in progress".into(),
                    )),
                };
            }
            // Expired or abandoned: take the key over. The delete is
            // conditional on the row we saw, so two takers cannot both win.
            Some(row) => {
                let deleted = idempotency_keys::Entity::delete_many()
                    .filter(idempotency_keys::Column::UserId.eq(user_id))
                    .filter(idempotency_keys::Column::Key.eq(key.clone()))
                    .filter(idempotency_keys::Column::CreatedAt.eq(row.created_at))
                    .exec(&state.db)
                    .await?;
                if deleted.rows_affected != 1 {
                    return Err(ApiError::Conflict(
                        "a request with this Idempotency-Key is still in progress".into(),
                    ));
                }
                claim.insert(&state.db).await.map_err(|e| {
                    if is_unique_violation(&e) {
                        ApiError::Conflict(
                            "a request with this Idempotency-Key is still in progress".into(),
                        )
                    } else {
                        e.into()
                    }
                })?;
            }
            // Deleted between our insert and read: a retry will succeed.
            None => {
                return Err(ApiError::Conflict(
                    "a request with this Idempotency-Key is still in progress".into(),
                ))
            }
        }
    }

    let resp = next.run(Request::from_parts(parts, Body::from(body))).await;
    let (resp_parts, resp_body) = resp.into_parts();
    let bytes = match axum::body::to_bytes(resp_body, usize::MAX).await {
        Ok(b) => b,
        Err(e) => {
            release(state, user_id, &key).await;
            return Err(ApiError::Internal(format!(
                "reading the response to store it: {e}"
            )));
        }
    };
    if bytes.len() > MAX_STORED_RESPONSE {
        tracing::warn!(
            bytes = bytes.len(),
            "an answer too large to keep for its Idempotency-Key; not kept"
        );
        release(state, user_id, &key).await;
    } else if resp_parts.status.is_server_error() {
        release(state, user_id, &key).await;
    } else {
        let content_type = resp_parts
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let (status, content_type, stored) = match shown_once(&bytes) {
            None => (
                resp_parts.status,
                content_type,
                String::from_utf8_lossy(&bytes).into_owned(),
            ),
            Some(made) => withheld(made),
        };
        let done = idempotency_keys::ActiveModel {
            user_id: Set(user_id),
            key: Set(key.clone()),
            status: Set(Some(i32::from(status.as_u16()))),
            content_type: Set(content_type),
            body: Set(Some(stored)),
            completed_at: Set(Some(Utc::now())),
            ..Default::default()
        };
        if let Err(e) = done.update(&state.db).await {
            tracing::error!(error = %e, "storing the idempotent answer failed; the key will expire");
        }
    }
    Ok(Response::from_parts(resp_parts, Body::from(bytes)))
}

/// When an answer carries a secret: `Some` with the id of what it made
/// (its `id` field), if it names one.
fn shown_once(body: &[u8]) -> Option<Option<String>> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    fn holds_secret(v: &serde_json::Value) -> bool {
        match v {
            serde_json::Value::String(s) => crate::app::auth::is_secret(s),
            serde_json::Value::Array(a) => a.iter().any(holds_secret),
            serde_json::Value::Object(o) => o.values().any(holds_secret),
            _ => false,
        }
    }
    holds_secret(&v).then(|| v.get("id").and_then(|i| i.as_str()).map(str::to_owned))
}

/// What a replay of an answer with a secret gets instead: 409, naming
/// what the first request made.
fn withheld(made: Option<String>) -> (StatusCode, Option<String>, String) {
    let what = match made {
        Some(id) => {
            format!("its answer made {id} and held a secret, which is shown once and not kept")
        }
        None => "its answer held a secret, which is shown once and not kept".to_owned(),
    };
    let e = ApiError::Conflict(format!(
        "this Idempotency-Key was used already: {what}; list the resource to find it"
    ));
    let problem = e.to_problem();
    (
        StatusCode::CONFLICT,
        Some(kumo_api_types::PROBLEM_JSON.to_owned()),
        serde_json::to_string(&problem).unwrap_or_default(),
    )
}

fn request_hash(method: &str, path: &str, body: &Bytes) -> String {
    let mut h = Sha256::new();
    h.update(method.as_bytes());
    h.update([0]);
    h.update(path.as_bytes());
    h.update([0]);
    h.update(body);
    hex::encode(h.finalize())
}

fn replay(row: &idempotency_keys::Model, status: i32) -> Response {
    let status = u16::try_from(status)
        .ok()
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = (status, row.body.clone().unwrap_or_default()).into_response();
    if let Some(ct) = row
        .content_type
        .as_deref()
        .and_then(|c| HeaderValue::from_str(c).ok())
    {
        resp.headers_mut().insert(CONTENT_TYPE, ct);
    }
    resp.headers_mut()
        .insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    resp
}

async fn release(state: &AppState, user_id: uuid::Uuid, key: &str) {
    if let Err(e) = idempotency_keys::Entity::delete_by_id((user_id, key.to_owned()))
        .exec(&state.db)
        .await
    {
        tracing::error!(error = %e, "releasing an idempotency key failed; it will expire");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_with_secrets_are_not_kept() {
        let token = crate::app::auth::mint().token;
        let body = format!(r#"{{"id":"0190","token":"{token}","name":"ci"}}"#);
        assert_eq!(shown_once(body.as_bytes()), Some(Some("0190".into())));
        let nested = format!(r#"{{"items":[{{"credential":"{token}"}}]}}"#);
        assert_eq!(shown_once(nested.as_bytes()), Some(None));
        assert_eq!(shown_once(br#"{"id":"0190","name":"ci"}"#), None);
        assert_eq!(shown_once(b"not json"), None);
        let (status, _, stored) = withheld(Some("0190".into()));
        assert_eq!(status, StatusCode::CONFLICT);
        assert!(stored.contains("0190") && !stored.contains(&token));
    }

    #[test]
    fn hash_covers_method_path_and_body() {
        let a = request_hash("POST", "/api/v1/tenants", &Bytes::from_static(b"{}"));
        assert_ne!(
            a,
            request_hash("POST", "/api/v1/users", &Bytes::from_static(b"{}"))
        );
        assert_ne!(
            a,
            request_hash("POST", "/api/v1/tenants", &Bytes::from_static(b"{ }"))
        );
        assert_eq!(
            a,
            request_hash("POST", "/api/v1/tenants", &Bytes::from_static(b"{}"))
        );
    }
}
