//! Axum extractors whose rejections are problem+json, and the request
//! context (caller, request id, source address) every handler receives.

use std::net::SocketAddr;

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{ConnectInfo, FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use crate::context::{Actor, AppState, Caller, Origin};
use crate::error::ApiError;

/// `axum::Json` with RFC 9457 rejections.
pub struct Json<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Json<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(Json(v)),
            Err(rej) => Err(json_rejection(rej)),
        }
    }
}

fn json_rejection(rej: JsonRejection) -> ApiError {
    match rej {
        JsonRejection::MissingJsonContentType(_) => ApiError::UnsupportedMediaType(
            "expected a request body with Content-Type: application/json".into(),
        ),
        JsonRejection::BytesRejection(b) if b.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            ApiError::PayloadTooLarge("request body exceeds the size limit".into())
        }
        // Serde's message names the field and the position, which is what a
        // client needs to fix the request.
        JsonRejection::JsonDataError(e) => ApiError::validation(e.body_text()),
        JsonRejection::JsonSyntaxError(e) => ApiError::validation(e.body_text()),
        other => ApiError::validation(other.body_text()),
    }
}

pub struct Path<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(v)| Path(v))
            .map_err(|e: PathRejection| ApiError::validation(e.body_text()))
    }
}

pub struct Query<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(v)| Query(v))
            .map_err(|e: QueryRejection| ApiError::validation(e.body_text()))
    }
}

/// The actor of an API request: the caller the authentication layer
/// found, with the request id and the source address.
impl FromRequestParts<AppState> for Actor {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        // The authentication layer has already checked the token; a request
        // that reaches here without a caller presented none (or a bad one).
        let caller = match parts.extensions.get::<AuthOutcome>() {
            Some(AuthOutcome::Caller(c)) => c.clone(),
            Some(AuthOutcome::Rejected(e)) => return Err(ApiError::Unauthenticated(e.clone())),
            None => {
                return Err(ApiError::Unauthenticated(
                    "send an API token as `Authorization: Bearer kumo_…`".into(),
                ))
            }
        };
        Ok(Actor::new(
            caller,
            Origin::from_request_parts(parts, state).await?,
        ))
    }
}

/// What the authentication layer concluded about the request's token.
#[derive(Debug, Clone)]
pub enum AuthOutcome {
    Caller(Caller),
    Rejected(String),
}

pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// The token of an `Authorization: Bearer …` header: `None` without the
/// header, `Err` with why it is unusable. The scheme is case-insensitive
/// (RFC 9110 §11.1).
pub fn bearer_token(headers: &axum::http::HeaderMap) -> Option<Result<&str, &'static str>> {
    let value = headers.get(axum::http::header::AUTHORIZATION)?;
    let Ok(value) = value.to_str() else {
        return Some(Err("Authorization header is not ASCII"));
    };
    Some(
        value
            .split_once(' ')
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim())
            .ok_or("use the Bearer scheme"),
    )
}

/// A request id header as the request-id layer left it.
fn header(parts: &Parts, name: &str) -> Option<String> {
    parts
        .headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// The client's address, as the audit log records it.
pub fn source_ip(parts: &Parts) -> String {
    parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ci| ci.0.ip().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// Where a request came from, and when: what its audit entry records.
impl FromRequestParts<AppState> for Origin {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        Ok(Origin {
            source_ip: source_ip(parts),
            request_id: header(parts, REQUEST_ID_HEADER).unwrap_or_default(),
            client_request_id: header(
                parts,
                crate::http::middleware::request_ids::CLIENT_REQUEST_ID_HEADER,
            ),
            at: state.config.clock.now(),
        })
    }
}
