//! The OpenAPI document: served, checked in, and in step with the code.

use serde_json::Value;

use crate::harness::{Backend, TestServer};

fn checked_in_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../api-spec/openapi.json")
}

/// Fails when `api-spec/openapi.json` differs from what the code generates.
/// `cargo xtask openapi` rewrites it.
#[test]
fn checked_in_document_matches_the_code() {
    let generated = kumo_server::http::api::openapi_json();
    let checked_in = std::fs::read_to_string(checked_in_path()).unwrap_or_default();
    assert!(
        generated == checked_in,
        "api-spec/openapi.json is out of date: run `cargo xtask openapi` and commit the result"
    );
}

#[test]
fn document_is_openapi_3_1_with_problem_errors() {
    let doc: Value = serde_json::from_str(&kumo_server::http::api::openapi_json()).unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let responses = op["responses"].as_object().unwrap();
            assert!(
                responses.keys().any(|c| c.starts_with('2')),
                "{method} {path} documents success"
            );
            if path.starts_with("/api/v1") {
                let unauth = &responses["401"]["content"]["application/problem+json"];
                assert!(
                    unauth.is_object(),
                    "{method} {path} documents problem+json errors"
                );
            }
            if method == "post" && path.starts_with("/api/v1") {
                let params = op["parameters"].as_array().unwrap();
                assert!(
                    params.iter().any(|p| p["name"] == "Idempotency-Key"),
                    "{method} {path} documents Idempotency-Key"
                );
            }
        }
    }
}

#[tokio::test]
async fn served_document_and_docs_page() {
    let s = TestServer::start(Backend::Sqlite).await;
    let served = s
        .http()
        .get(format!("{}/api/v1/openapi.json", s.url))
        .send()
        .await
        .unwrap();
    assert_eq!(served.headers()["content-type"], "application/json");
    let served: Value = served.json().await.unwrap();
    let generated: Value = serde_json::from_str(&kumo_server::http::api::openapi_json()).unwrap();
    assert_eq!(served, generated);

    let html = s
        .http()
        .get(format!("{}/api/docs", s.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for path in generated["paths"].as_object().unwrap().keys() {
        assert!(
            html.contains(&format!("<code>{path}</code>")),
            "docs page lists {path}"
        );
    }
    assert!(
        !html.contains("<script"),
        "the docs page needs no JavaScript"
    );

    // Every problem type URI resolves to its explanation.
    for kind in [
        "validation",
        "not-found",
        "quota-exceeded",
        "idempotency-key-reuse",
    ] {
        let r = s
            .http()
            .get(format!("{}/problems/{kind}", s.url))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{kind}");
    }
    assert_eq!(
        s.http()
            .get(format!("{}/problems/nonsense", s.url))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    s.stop().await;
}
