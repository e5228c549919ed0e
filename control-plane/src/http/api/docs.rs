//! The OpenAPI document, a human-readable page rendered from it on the
//! server (no JavaScript, no assets from elsewhere), and one page per
//! problem type so that each `type` URI resolves to its explanation.

use std::fmt::Write;
use std::sync::Arc;

use axum::extract::Path;
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use utoipa::openapi::path::{HttpMethod, Operation};
use utoipa::openapi::OpenApi;

use crate::context::AppState;
use crate::error::PROBLEM_KINDS;

pub fn router(doc: Arc<OpenApi>) -> Router<AppState> {
    let json = Arc::new(doc.to_pretty_json().unwrap_or_default());
    let html = Arc::new(render(&doc));
    Router::new()
        .route(
            "/api/v1/openapi.json",
            get(move || {
                let json = json.clone();
                async move {
                    (
                        [(CONTENT_TYPE, "application/json")],
                        json.as_str().to_owned(),
                    )
                }
            }),
        )
        .route(
            "/api/docs",
            get(move || {
                let html = html.clone();
                async move { Html(html.as_str().to_owned()) }
            }),
        )
        .route("/problems", get(problems_index))
        .route("/problems/{kind}", get(problem_page))
}

pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#1d2330}\
code,pre{font-family:ui-monospace,monospace}h2{margin-top:2rem;border-bottom:1px solid #ccd}\
.op{margin:1rem 0;padding:.5rem 1rem;border-left:4px solid #4a6fd1;background:#f6f8fc}\
.m{display:inline-block;min-width:4.5rem;font-weight:bold}table{border-collapse:collapse}td,th{padding:.2rem .6rem;text-align:left;vertical-align:top}";

fn method_name(m: &HttpMethod) -> &'static str {
    match m {
        HttpMethod::Get => "GET",
        HttpMethod::Post => "POST",
        HttpMethod::Put => "PUT",
        HttpMethod::Delete => "DELETE",
        HttpMethod::Patch => "PATCH",
        HttpMethod::Head => "HEAD",
        HttpMethod::Options => "OPTIONS",
        HttpMethod::Trace => "TRACE",
    }
}

/// Operations of a path in a fixed method order.
pub fn operations(item: &utoipa::openapi::PathItem) -> Vec<(HttpMethod, &Operation)> {
    [
        (HttpMethod::Get, &item.get),
        (HttpMethod::Post, &item.post),
        (HttpMethod::Put, &item.put),
        (HttpMethod::Patch, &item.patch),
        (HttpMethod::Delete, &item.delete),
    ]
    .into_iter()
    .filter_map(|(m, op)| op.as_ref().map(|op| (m, op)))
    .collect()
}

fn render(doc: &OpenApi) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!doctype html><html lang=en><meta charset=utf-8><title>{t} {v}</title><style>{STYLE}</style><body><h1>{t} <small>{v}</small></h1><p>{d}</p>\
         <p>Machine-readable: <a href=\"/api/v1/openapi.json\">/api/v1/openapi.json</a> (OpenAPI 3.1). \
         Error types: <a href=\"/problems\">/problems</a>.</p>",
        t = escape(&doc.info.title),
        v = escape(&doc.info.version),
        d = escape(doc.info.description.as_deref().unwrap_or("")),
    );
    for (path, item) in &doc.paths.paths {
        for (method, op) in operations(item) {
            let _ = write!(
                h,
                "<div class=op><p><span class=m>{}</span><code>{}</code></p><p><b>{}</b></p>",
                method_name(&method),
                escape(path),
                escape(op.summary.as_deref().unwrap_or("")),
            );
            if let Some(desc) = &op.description {
                let _ = write!(h, "<p>{}</p>", escape(desc));
            }
            if let Some(params) = &op.parameters {
                h.push_str(
                    "<table><tr><th>parameter</th><th>in</th><th>required</th><th></th></tr>",
                );
                for p in params {
                    let location = serde_json::to_value(&p.parameter_in)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default();
                    let required =
                        serde_json::to_value(&p.required).ok() == Some(serde_json::json!(true));
                    let _ = write!(
                        h,
                        "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td></tr>",
                        escape(&p.name),
                        escape(&location),
                        if required { "yes" } else { "no" },
                        escape(p.description.as_deref().unwrap_or("")),
                    );
                }
                h.push_str("</table>");
            }
            let codes: Vec<&str> = op.responses.responses.keys().map(String::as_str).collect();
            let _ = write!(h, "<p>Answers: {}</p></div>", escape(&codes.join(", ")));
        }
    }
    h.push_str("</body></html>");
    h
}

async fn problems_index() -> Html<String> {
    let mut h = format!("<!doctype html><html lang=en><meta charset=utf-8><title>Kumo problem types</title><style>{STYLE}</style><body><h1>Problem types</h1><p>Every error answer is <code>application/problem+json</code> (RFC 9457). Branch on <code>type</code>.</p><table><tr><th>type</th><th>status</th><th>title</th></tr>");
    for (kind, title, status) in PROBLEM_KINDS {
        let _ = write!(
            h,
            "<tr><td><a href=\"/problems/{k}\"><code>/problems/{k}</code></a></td><td>{status}</td><td>{t}</td></tr>",
            k = escape(kind),
            t = escape(title)
        );
    }
    h.push_str("</table></body></html>");
    Html(h)
}

async fn problem_page(Path(kind): Path<String>) -> Response {
    match PROBLEM_KINDS.iter().find(|(k, _, _)| *k == kind) {
        Some((k, title, status)) => Html(format!(
            "<!doctype html><html lang=en><meta charset=utf-8><title>{t}</title><style>{STYLE}</style><body><h1>{t}</h1><p><code>type: /problems/{k}</code>, HTTP {status}.</p><p><a href=\"/problems\">All problem types</a></p></body></html>",
            t = escape(title),
            k = escape(k),
        ))
        .into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}
