//! Makes every error answer RFC 9457 problem+json, including those made by
//! layers that know nothing of problems (timeouts, unknown routes, wrong
//! methods), and stamps each problem with the request id and path. The
//! portal's own error pages (HTML: a form shown again with the API's
//! reason) are left as they are.

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use kumo_api_types::{Problem, PROBLEM_JSON};

use crate::error::problem_for_status;
use crate::http::extract::REQUEST_ID_HEADER;

const MAX_PROBLEM_BYTES: usize = 64 * 1024;

pub async fn layer(req: Request, next: Next) -> Response {
    let request_id = req
        .headers()
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let path = req.uri().path().to_owned();
    let resp = next.run(req).await;
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let is_page = resp
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/html"));
    if is_page {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let is_problem = parts
        .headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(PROBLEM_JSON.as_bytes()));
    let mut problem = if is_problem {
        match axum::body::to_bytes(body, MAX_PROBLEM_BYTES).await {
            Ok(bytes) => serde_json::from_slice::<Problem>(&bytes)
                .unwrap_or_else(|_| problem_for_status(status)),
            Err(_) => problem_for_status(status),
        }
    } else {
        problem_for_status(status)
    };
    problem.request_id = request_id;
    problem.instance = Some(path);
    let bytes = serde_json::to_vec(&problem).unwrap_or_default();
    parts
        .headers
        .insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    parts.headers.remove(CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(bytes))
}
