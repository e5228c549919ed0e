//! `kumo login --device`: the OAuth 2.0 device authorization grant (RFC
//! 8628) at an institution's provider, for terminals without a browser.
//! `POST /auth/device` starts one and tells the command where the user
//! enters the code; `POST /auth/device/token` asks the provider once per
//! call whether the user has agreed, and when they have, verifies the ID
//! token as a browser login would, applies the e-mail domain rule,
//! provisions the user and answers a 90-day API token. The provider's
//! device code and the client secret stay on the server.

use axum::extract::State;
use axum::routing::post;
use axum::Router;
use chrono::{Duration, Utc};
use openidconnect::core::{CoreIdToken, CoreTokenResponse};
use openidconnect::{OAuth2TokenResponse, TokenResponse};
use sea_orm::{ActiveModelTrait, EntityTrait, Set};
use serde::{Deserialize, Serialize};

use crate::config::OidcProvider;
use crate::context::AppState;
use crate::entity::{device_logins, users};
use crate::error::ApiError;
use crate::http::sso::{admit, http, identity_of, metadata, provider, random_token};

/// How long the API token `kumo login --device` receives lasts.
const TOKEN_DAYS: i64 = 90;

#[derive(Deserialize)]
struct DeviceStart {
    /// The institution; may be left out when only one is configured.
    provider: Option<String>,
}

#[derive(Serialize)]
struct DeviceStarted {
    /// What the command polls with.
    handle: String,
    user_code: String,
    verification_uri: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    verification_uri_complete: Option<String>,
    interval: u64,
    expires_in: u64,
}

/// The provider's answer to a device authorization request (RFC 8628 §3.2).
#[derive(Deserialize)]
struct Authorization {
    device_code: String,
    user_code: String,
    verification_uri: String,
    verification_uri_complete: Option<String>,
    expires_in: u64,
    interval: Option<u64>,
}

/// The provider's refusal at its token endpoint (RFC 8628 §3.5).
#[derive(Deserialize)]
struct TokenError {
    error: String,
    error_description: Option<String>,
}

fn chosen<'a>(st: &'a AppState, name: Option<&str>) -> Result<&'a OidcProvider, ApiError> {
    match (name, st.config.auth.oidc.as_slice()) {
        (Some(n), _) => provider(st, n),
        (None, [only]) => Ok(only),
        (None, []) => Err(ApiError::not_found("no institution is configured")),
        (None, _) => Err(ApiError::field(
            "provider",
            "several institutions are configured: name one",
        )),
    }
}

async fn start(
    State(st): State<AppState>,
    crate::http::extract::Json(body): crate::http::extract::Json<DeviceStart>,
) -> Result<axum::Json<DeviceStarted>, ApiError> {
    let p = chosen(&st, body.provider.as_deref())?.clone();
    let m = metadata(&st, &p, false).await?;
    let endpoint = m
        .additional_metadata()
        .device_authorization_endpoint
        .clone()
        .ok_or_else(|| {
            ApiError::Conflict(format!(
                "{} does not offer the device authorization grant: use `kumo login` with a browser",
                p.display_name
            ))
        })?;
    let scope = p.scopes.join(" ");
    let answer = http(&st)?
        .post(endpoint.url().as_str())
        .basic_auth(&p.client_id, Some(&p.client_secret))
        .form(&[
            ("client_id", p.client_id.as_str()),
            ("scope", scope.as_str()),
        ])
        .send()
        .await
        .map_err(|e| {
            tracing::warn!(provider = %p.name, error = %e, "device authorization failed");
            ApiError::Unavailable
        })?;
    if !answer.status().is_success() {
        let status = answer.status();
        let why = answer.text().await.unwrap_or_default();
        tracing::warn!(provider = %p.name, %status, %why, "device authorization refused");
        return Err(ApiError::Unavailable);
    }
    let a: Authorization = answer.json().await.map_err(|e| {
        tracing::warn!(provider = %p.name, error = %e, "device authorization answer");
        ApiError::Unavailable
    })?;
    let handle = random_token();
    let now = Utc::now();
    let interval = a.interval.unwrap_or(5).clamp(1, 60);
    device_logins::ActiveModel {
        id: Set(crate::app::auth::hash_secret(&handle)),
        provider: Set(p.name.clone()),
        device_code: Set(a.device_code),
        interval_secs: Set(interval as i32),
        created_at: Set(now),
        expires_at: Set(now + Duration::seconds(a.expires_in.min(3600) as i64)),
    }
    .insert(&st.db)
    .await?;
    Ok(axum::Json(DeviceStarted {
        handle,
        user_code: a.user_code,
        verification_uri: a.verification_uri,
        verification_uri_complete: a.verification_uri_complete,
        interval,
        expires_in: a.expires_in,
    }))
}

#[derive(Deserialize)]
struct DevicePoll {
    handle: String,
}

/// Either still waiting (with how long to wait) or done with a token.
#[derive(Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
enum DevicePolled {
    Pending { interval: u64 },
    Done { token: String, user: String },
}

async fn poll(
    State(st): State<AppState>,
    origin: crate::context::Origin,
    crate::http::extract::Json(body): crate::http::extract::Json<DevicePoll>,
) -> Result<axum::Json<DevicePolled>, ApiError> {
    let id = crate::app::auth::hash_secret(&body.handle);
    let flow = device_logins::Entity::find_by_id(id.clone())
        .one(&st.db)
        .await?
        .ok_or_else(|| ApiError::not_found("no such device login (finished, or never begun)"))?;
    let gone = || async {
        device_logins::Entity::delete_by_id(id.clone())
            .exec(&st.db)
            .await
    };
    if flow.expires_at <= Utc::now() {
        gone().await?;
        return Err(ApiError::Forbidden(
            "the code expired before it was entered; start again".into(),
        ));
    }
    let p = provider(&st, &flow.provider)?.clone();
    let m = metadata(&st, &p, false).await?;
    let answer = http(&st)?
        .post(m.token_endpoint().map(|u| u.url().as_str()).unwrap_or(""))
        .basic_auth(&p.client_id, Some(&p.client_secret))
        .form(&[
            ("grant_type", "urn:ietf:params:oauth:grant-type:device_code"),
            ("device_code", flow.device_code.as_str()),
            ("client_id", p.client_id.as_str()),
        ])
        .send()
        .await
        .map_err(|e| {
            tracing::warn!(provider = %p.name, error = %e, "device token request failed");
            ApiError::Unavailable
        })?;
    if !answer.status().is_success() {
        let e: TokenError = answer.json().await.map_err(|_| ApiError::Unavailable)?;
        return match e.error.as_str() {
            "authorization_pending" => Ok(axum::Json(DevicePolled::Pending {
                interval: flow.interval_secs as u64,
            })),
            "slow_down" => {
                let slower = (flow.interval_secs + 5).min(60);
                let mut f: device_logins::ActiveModel = flow.into();
                f.interval_secs = Set(slower);
                f.update(&st.db).await?;
                Ok(axum::Json(DevicePolled::Pending {
                    interval: slower as u64,
                }))
            }
            other => {
                gone().await?;
                Err(ApiError::Forbidden(format!(
                    "the provider ended the login: {other}{}",
                    e.error_description
                        .map(|d| format!(" ({d})"))
                        .unwrap_or_default()
                )))
            }
        };
    }
    // Spent either way from here: a second poll must not mint again.
    gone().await?;
    let tokens: CoreTokenResponse = answer.json().await.map_err(|e| {
        tracing::warn!(provider = %p.name, error = %e, "device token answer");
        ApiError::Unavailable
    })?;
    let id_token: &CoreIdToken = tokens
        .id_token()
        .ok_or_else(|| ApiError::Forbidden("login refused: no ID token".into()))?;
    let identity = identity_of(&st, &p, id_token, tokens.access_token(), None).await?;
    let user_id = admit(&st, &p, &identity).await?;
    let user = users::Entity::find_by_id(user_id)
        .one(&st.db)
        .await?
        .ok_or_else(|| ApiError::Internal("the admitted user vanished".into()))?;
    let minted = crate::app::tokens::mint_for(
        &st,
        &crate::http::portal::ctx_of(&user, origin),
        &user,
        kumo_api_types::TokenCreate {
            description: Some("kumo login --device".into()),
            expires_at: Some(Utc::now() + Duration::days(TOKEN_DAYS)),
        },
    )
    .await?;
    tracing::info!(provider = %p.name, user = %user.name, "device login");
    Ok(axum::Json(DevicePolled::Done {
        token: minted.token,
        user: user.name,
    }))
}

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/auth/device", post(start))
        .route("/auth/device/token", post(poll))
}
