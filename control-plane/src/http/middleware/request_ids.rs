//! Request ids: the server names every request itself, so the id the audit
//! log and the access log record cannot be chosen (or collided) by a
//! client. A client's own `x-request-id` is kept beside it as
//! `x-client-request-id` (cleaned and bounded, since it is outside data),
//! for correlating with the client's logs; both come back on the response.

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;

use crate::http::extract::REQUEST_ID_HEADER;

pub const CLIENT_REQUEST_ID_HEADER: &str = "x-client-request-id";

/// The longest client id kept; the audit column holds 64 characters.
const MAX_CLIENT_ID: usize = 64;

/// A client's id as the server keeps it: visible ASCII only, at most
/// [`MAX_CLIENT_ID`] characters; anything else is dropped, not trimmed,
/// so a kept id is always exactly what the client sent.
pub fn clean_client_id(raw: &[u8]) -> Option<&str> {
    let s = std::str::from_utf8(raw).ok()?;
    (!s.is_empty() && s.len() <= MAX_CLIENT_ID && s.bytes().all(|b| b.is_ascii_graphic()))
        .then_some(s)
}

pub async fn layer(mut req: Request, next: Next) -> Response {
    // A UUID's text is always a valid header value.
    let Ok(server_id) = HeaderValue::try_from(uuid::Uuid::now_v7().to_string()) else {
        return next.run(req).await;
    };
    let client_id = req
        .headers()
        .get(REQUEST_ID_HEADER)
        .and_then(|v| clean_client_id(v.as_bytes()))
        .and_then(|s| HeaderValue::from_str(s).ok());
    let headers = req.headers_mut();
    // Only this layer may say what the client's id was.
    headers.remove(CLIENT_REQUEST_ID_HEADER);
    headers.insert(
        HeaderName::from_static(REQUEST_ID_HEADER),
        server_id.clone(),
    );
    if let Some(id) = &client_id {
        headers.insert(
            HeaderName::from_static(CLIENT_REQUEST_ID_HEADER),
            id.clone(),
        );
    }
    let mut resp = next.run(req).await;
    let headers = resp.headers_mut();
    headers.insert(HeaderName::from_static(REQUEST_ID_HEADER), server_id);
    if let Some(id) = client_id {
        headers.insert(HeaderName::from_static(CLIENT_REQUEST_ID_HEADER), id);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::clean_client_id;

    #[test]
    fn client_ids_are_kept_only_when_clean_and_short() {
        assert_eq!(clean_client_id(b"req-1"), Some("req-1"));
        assert_eq!(clean_client_id(b""), None);
        assert_eq!(clean_client_id(b"a b"), None);
        assert_eq!(clean_client_id(b"a\x1bb"), None);
        assert_eq!(clean_client_id("é".as_bytes()), None);
        assert_eq!(clean_client_id(&[b'x'; 65]), None);
        assert!(clean_client_id(&[b'x'; 64]).is_some());
    }
}
