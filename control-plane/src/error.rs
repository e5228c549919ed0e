//! The errors a handler can answer with, each mapped to an RFC 9457 problem
//! with a stable `type`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use kumo_api_types::{FieldError, Problem, PROBLEM_JSON};

/// Every kind of problem the API reports: `(type suffix, title, status)`.
/// `/problems` documents these, and tests check that each is reachable.
pub const PROBLEM_KINDS: &[(&str, &str, u16)] = &[
    ("validation", "Invalid request", 400),
    ("unauthenticated", "Authentication required", 401),
    ("forbidden", "Not allowed", 403),
    ("not-found", "Not found", 404),
    ("method-not-allowed", "Method not allowed", 405),
    ("timeout", "Request timed out", 408),
    ("conflict", "Conflict", 409),
    ("payload-too-large", "Request body too large", 413),
    ("unsupported-media-type", "Unsupported media type", 415),
    ("idempotency-key-reuse", "Idempotency key reused", 422),
    ("quota-exceeded", "Quota exceeded", 409),
    ("insufficient-capacity", "Insufficient capacity", 409),
    ("points-exhausted", "Points exhausted", 402),
    ("too-many-requests", "Too many requests", 429),
    ("internal", "Internal server error", 500),
    ("unavailable", "Service unavailable", 503),
];

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{detail}")]
    Validation {
        detail: String,
        errors: Vec<FieldError>,
    },
    #[error("authentication required: {0}")]
    Unauthenticated(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    IdempotencyKeyReuse(String),
    #[error("quota exceeded for {resource}: {detail}")]
    QuotaExceeded { resource: String, detail: String },
    #[error("{0}")]
    InsufficientCapacity(String),
    #[error("{0}")]
    PointsExhausted(String),
    /// Too many changes too fast; `Retry-After` says when to try again.
    #[error("{detail}")]
    TooManyRequests {
        detail: String,
        retry_after_secs: u64,
    },
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("database unavailable")]
    Unavailable,
    /// A host (its agent) did not answer in time: try again.
    #[error("{0}")]
    Unreachable(String),
    /// The database gave up the transaction for a conflicting one
    /// (PostgreSQL's deadlock or serialization failure): nothing was
    /// written; the operation may simply be tried again.
    #[error("the database gave way to a conflicting change; nothing was done: try again")]
    Contention,
    #[error("internal error: {0}")]
    Internal(String),
}

/// A problem echoes what it was sent (an unknown field's name, a value)
/// only this far: its answer is stored (idempotency keys) and logged.
const MAX_DETAIL: usize = 1000;
const MAX_FIELD: usize = 200;
const MAX_FIELD_ERRORS: usize = 64;

/// `s` cut to `max` characters, marked where it was cut.
fn bounded(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_owned(),
        Some((i, _)) => format!("{}…", &s[..i]),
    }
}

impl ApiError {
    pub fn validation(detail: impl Into<String>) -> Self {
        ApiError::Validation {
            detail: detail.into(),
            errors: Vec::new(),
        }
    }

    pub fn field(field: &str, message: impl Into<String>) -> Self {
        ApiError::fields(vec![FieldError {
            field: field.to_owned(),
            message: message.into(),
        }])
    }

    /// Several fields refused at once (`a: …; b: …`).
    pub fn fields(errors: Vec<FieldError>) -> Self {
        ApiError::Validation {
            detail: errors
                .iter()
                .map(|e| format!("{}: {}", e.field, e.message))
                .collect::<Vec<_>>()
                .join("; "),
            errors,
        }
    }

    /// The HTTP status its problem carries.
    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.to_problem().status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    pub fn not_found(what: impl Into<String>) -> Self {
        ApiError::NotFound(what.into())
    }

    fn kind(&self) -> &'static str {
        match self {
            ApiError::Validation { .. } => "validation",
            ApiError::Unauthenticated(_) => "unauthenticated",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::NotFound(_) => "not-found",
            ApiError::Conflict(_) => "conflict",
            ApiError::IdempotencyKeyReuse(_) => "idempotency-key-reuse",
            ApiError::QuotaExceeded { .. } => "quota-exceeded",
            ApiError::InsufficientCapacity(_) => "insufficient-capacity",
            ApiError::PointsExhausted(_) => "points-exhausted",
            ApiError::TooManyRequests { .. } => "too-many-requests",
            ApiError::PayloadTooLarge(_) => "payload-too-large",
            ApiError::UnsupportedMediaType(_) => "unsupported-media-type",
            ApiError::Unavailable | ApiError::Unreachable(_) | ApiError::Contention => {
                "unavailable"
            }
            ApiError::Internal(_) => "internal",
        }
    }

    pub fn to_problem(&self) -> Problem {
        let kind = self.kind();
        let mut p = problem_of_kind(kind);
        p.detail = match self {
            // Internal details go to the log, never to the client.
            ApiError::Internal(_) => None,
            other => Some(bounded(&other.to_string(), MAX_DETAIL)),
        };
        match self {
            ApiError::Validation { errors, .. } => {
                p.errors = errors
                    .iter()
                    .take(MAX_FIELD_ERRORS)
                    .map(|e| FieldError {
                        field: bounded(&e.field, MAX_FIELD),
                        message: bounded(&e.message, MAX_DETAIL),
                    })
                    .collect()
            }
            ApiError::QuotaExceeded { resource, .. } => p.resource = Some(resource.clone()),
            _ => {}
        }
        p
    }
}

/// A problem with the type, title and status of one of [`PROBLEM_KINDS`].
pub fn problem_of_kind(kind: &str) -> Problem {
    let (kind, title, status) = PROBLEM_KINDS
        .iter()
        .find(|(k, _, _)| *k == kind)
        .copied()
        .unwrap_or(("internal", "Internal server error", 500));
    Problem {
        kind: format!("/problems/{kind}"),
        title: title.to_owned(),
        status,
        detail: None,
        instance: None,
        request_id: None,
        errors: Vec::new(),
        resource: None,
    }
}

/// The problem kind that answers a bare HTTP status (from a layer that
/// produced no problem of its own).
pub fn problem_for_status(status: StatusCode) -> Problem {
    let kind = match status.as_u16() {
        400 => "validation",
        401 => "unauthenticated",
        403 => "forbidden",
        404 => "not-found",
        405 => "method-not-allowed",
        408 => "timeout",
        409 => "conflict",
        413 => "payload-too-large",
        415 => "unsupported-media-type",
        503 => "unavailable",
        _ => "internal",
    };
    let mut p = problem_of_kind(kind);
    p.status = status.as_u16();
    if p.status != 500 && kind == "internal" {
        p.title = status.canonical_reason().unwrap_or("Error").to_owned();
        p.kind = "about:blank".to_owned();
    }
    p
}

pub fn problem_response(problem: &Problem) -> Response {
    let status = StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = serde_json::to_vec(problem).unwrap_or_default();
    let mut resp = (status, body).into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    if status == StatusCode::UNAUTHORIZED {
        resp.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"kumo\""),
        );
    }
    resp
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let ApiError::Internal(msg) = &self {
            tracing::error!(error = %msg, "internal error");
        }
        let mut r = problem_response(&self.to_problem());
        if let ApiError::TooManyRequests {
            retry_after_secs, ..
        } = &self
        {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(*retry_after_secs));
        }
        r
    }
}

impl From<sea_orm::DbErr> for ApiError {
    fn from(e: sea_orm::DbErr) -> Self {
        use sea_orm::{DbErr, RuntimeErr};
        match &e {
            DbErr::ConnectionAcquire(_) | DbErr::Conn(RuntimeErr::SqlxError(_)) => {
                tracing::error!(error = %e, "database unavailable");
                ApiError::Unavailable
            }
            _ if is_contention(&e) => {
                tracing::warn!(error = %e, "transaction given up for a conflicting one");
                ApiError::Contention
            }
            _ => ApiError::Internal(e.to_string()),
        }
    }
}

/// PostgreSQL gave the transaction up for another: a deadlock (40P01)
/// or a serialization failure (40001).
pub fn is_contention(e: &sea_orm::DbErr) -> bool {
    matches!(db_code(e).as_deref(), Some("40P01" | "40001"))
}

/// The database's own code for an error a statement met (PostgreSQL's
/// SQLSTATE, SQLite's extended result code).
fn db_code(e: &sea_orm::DbErr) -> Option<String> {
    use sea_orm::{DbErr, RuntimeErr};
    match e {
        DbErr::Exec(RuntimeErr::SqlxError(sea_orm::sqlx::Error::Database(d)))
        | DbErr::Query(RuntimeErr::SqlxError(sea_orm::sqlx::Error::Database(d))) => {
            d.code().map(|c| c.into_owned())
        }
        _ => None,
    }
}

/// A 409 with `detail` when the database refused a write for a unique
/// constraint; any other database error as usual.
pub fn conflict_if_unique(e: sea_orm::DbErr, detail: impl FnOnce() -> String) -> ApiError {
    if is_unique_violation(&e) {
        ApiError::Conflict(detail())
    } else {
        e.into()
    }
}

/// True when the database refused a write for a foreign key: something
/// still refers to the row.
pub fn is_fk_violation(e: &sea_orm::DbErr) -> bool {
    matches!(
        e.sql_err(),
        Some(sea_orm::SqlErr::ForeignKeyConstraintViolation(_))
    ) || sqlite_fk_in_cascade(e)
}

/// SQLite reports a foreign key that refuses a row deleted by a cascade
/// (deleting a tenant cascades to its quota rows) with the trigger code,
/// 1811 (`SQLITE_CONSTRAINT_TRIGGER`), which sea-orm does not map.
fn sqlite_fk_in_cascade(e: &sea_orm::DbErr) -> bool {
    db_code(e).as_deref() == Some("1811") && e.to_string().contains("FOREIGN KEY constraint failed")
}

/// True when the database refused a write because of a unique constraint:
/// the arbiter of every "at most one" rule.
pub fn is_unique_violation(e: &sea_orm::DbErr) -> bool {
    matches!(
        e.sql_err(),
        Some(sea_orm::SqlErr::UniqueConstraintViolation(_))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_echoes_what_it_was_sent_only_so_far() {
        let huge = "z".repeat(450_000);
        let e = ApiError::fields(vec![FieldError {
            field: huge.clone(),
            message: format!("unknown field `{huge}`"),
        }]);
        let p = e.to_problem();
        assert!(p.detail.unwrap().chars().count() <= MAX_DETAIL + 1);
        assert!(p.errors[0].field.chars().count() <= MAX_FIELD + 1);
        assert!(p.errors[0].message.chars().count() <= MAX_DETAIL + 1);
        assert!(serde_json::to_vec(&e.to_problem()).unwrap().len() < 8 << 10);
        assert_eq!(bounded("日本語", 2), "日本…");
    }

    #[test]
    fn every_error_maps_to_a_declared_kind() {
        let errors = [
            ApiError::validation("x"),
            ApiError::Unauthenticated("x".into()),
            ApiError::Forbidden("x".into()),
            ApiError::not_found("x"),
            ApiError::Conflict("x".into()),
            ApiError::IdempotencyKeyReuse("x".into()),
            ApiError::QuotaExceeded {
                resource: "vcpus".into(),
                detail: "x".into(),
            },
            ApiError::PayloadTooLarge("x".into()),
            ApiError::InsufficientCapacity("x".into()),
            ApiError::PointsExhausted("x".into()),
            ApiError::TooManyRequests {
                detail: "x".into(),
                retry_after_secs: 1,
            },
            ApiError::UnsupportedMediaType("x".into()),
            ApiError::Unavailable,
            ApiError::Contention,
            ApiError::Internal("secret detail".into()),
        ];
        for e in errors {
            let p = e.to_problem();
            let kind = p.kind.trim_start_matches("/problems/");
            assert!(
                PROBLEM_KINDS
                    .iter()
                    .any(|(k, _, s)| *k == kind && *s == p.status),
                "{p:?}"
            );
        }
    }

    #[test]
    fn internal_errors_hide_their_detail() {
        let p = ApiError::Internal("password=hunter2".into()).to_problem();
        assert_eq!(p.status, 500);
        assert!(p.detail.is_none());
    }

    #[test]
    fn quota_problem_names_the_resource() {
        let p = ApiError::QuotaExceeded {
            resource: "gpus.H100".into(),
            detail: "8 > 4".into(),
        }
        .to_problem();
        assert_eq!(p.kind, "/problems/quota-exceeded");
        assert_eq!(p.resource.as_deref(), Some("gpus.H100"));
    }
}
