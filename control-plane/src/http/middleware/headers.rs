//! Security headers on every page: a Content-Security-Policy (scripts only
//! from this site, no framing), `X-Frame-Options` for older browsers, a
//! referrer kept to this site, no MIME sniffing; and `Cache-Control:
//! no-store` on HTML, since pages show secrets (a new token, a join token)
//! and what a signed-in user may see.

use axum::extract::Request;
use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS,
    X_FRAME_OPTIONS,
};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;

/// Styles may be inline (the pages' `<style>` and SVG attributes); scripts
/// may not. Forms may post anywhere this site redirects them (sign-out
/// ends at the provider), so `form-action` is left out.
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
img-src 'self' data:; object-src 'none'; base-uri 'self'; frame-ancestors 'none'";

pub async fn layer(req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    h.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    let html = h
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/html"));
    if html {
        h.insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
        h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    resp
}
