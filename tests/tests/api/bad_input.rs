//! Malformed requests get a 4xx problem+json and write nothing.

use kumo_api_types::Problem;
use reqwest::Method;

use crate::harness::{on_both_backends, TestServer};

/// Sends a raw request as admin and checks the answer is the expected problem.
async fn expect_problem(
    s: &TestServer,
    method: Method,
    path: &str,
    content_type: Option<&str>,
    body: Vec<u8>,
    status: u16,
    kind: &str,
) -> Problem {
    let mut req = s
        .http()
        .request(method, format!("{}{path}", s.url))
        .bearer_auth(&s.admin_token)
        .body(body);
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status().as_u16(), status, "{path}");
    assert_eq!(
        resp.headers()["content-type"],
        "application/problem+json",
        "{path}"
    );
    let request_id = resp.headers()["x-request-id"].to_str().unwrap().to_owned();
    let p: Problem = resp.json().await.unwrap();
    assert_eq!(p.kind, kind, "{path}: {p:?}");
    assert_eq!(p.status, status);
    assert_eq!(p.request_id.as_deref(), Some(request_id.as_str()));
    assert_eq!(p.instance.as_deref(), Some(path.split('?').next().unwrap()));
    p
}

const JSON: Option<&str> = Some("application/json");

on_both_backends! {
    async fn malformed_bodies_are_refused_and_change_nothing(s: &TestServer) {
        s.tenant("alpha").await;
        let before_tenants = s.admin.list_tenants().await.unwrap();
        let before_users = s.admin.list_users().await.unwrap();
        let before_audit = s.admin.audit(None, 500).await.unwrap().len();

        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("/api/v1/tenants", b"{".to_vec(), "syntax"),
            ("/api/v1/tenants", b"[]".to_vec(), "array"),
            ("/api/v1/tenants", br#"{"name": 42}"#.to_vec(), "name"),
            ("/api/v1/tenants", br#"{"name": "ok-name", "owner": "x"}"#.to_vec(), "owner"),
            ("/api/v1/tenants", br#"{"display_name": "no name"}"#.to_vec(), "name"),
            ("/api/v1/tenants", br#"{"name": "Bad_Name"}"#.to_vec(), "name"),
            ("/api/v1/tenants", br#"{"name": "ab"}"#.to_vec(), "name"),
            ("/api/v1/tenants", br#"{"name": "fine-name", "display_name": "tab\there"}"#.to_vec(), "display_name"),
            ("/api/v1/tenants", br#"{"name": "fine-name", "display_name": "   "}"#.to_vec(), "display_name"),
            ("/api/v1/users", br#"{"name": "x"}"#.to_vec(), "name"),
            ("/api/v1/users", br#"{"name": "carol", "email": "not-an-email"}"#.to_vec(), "email"),
            ("/api/v1/users", br#"{"name": "carol", "kind": "robot"}"#.to_vec(), "kind"),
            ("/api/v1/users", "\u{feff}{}".as_bytes().to_vec(), "bom"),
        ];
        for (path, body, why) in cases {
            let p = expect_problem(s, Method::POST, path, JSON, body, 400, "/problems/validation").await;
            assert!(p.detail.is_some(), "{why}: a validation problem says what is wrong");
        }
        // Wrong values in PUT/PATCH bodies.
        expect_problem(s, Method::PUT, "/api/v1/tenants/alpha/members/admin", JSON, br#"{"role": "god"}"#.to_vec(), 400, "/problems/validation").await;
        expect_problem(s, Method::PUT, "/api/v1/tenants/alpha/quota", JSON, br#"{"vcpus": -1}"#.to_vec(), 400, "/problems/validation").await;
        expect_problem(s, Method::PUT, "/api/v1/tenants/alpha/quota", JSON, br#"{"vcpus": 99999999}"#.to_vec(), 400, "/problems/validation").await;
        expect_problem(s, Method::PUT, "/api/v1/tenants/alpha/quota", JSON, br#"{"gpus": {"A100": "many"}}"#.to_vec(), 400, "/problems/validation").await;
        expect_problem(s, Method::PATCH, "/api/v1/tenants/alpha", JSON, br#"{"name": "renamed"}"#.to_vec(), 400, "/problems/validation").await;
        expect_problem(s, Method::POST, "/api/v1/tokens", JSON, br#"{"expires_at": "tomorrow"}"#.to_vec(), 400, "/problems/validation").await;
        // Missing or wrong media type.
        expect_problem(s, Method::POST, "/api/v1/tenants", None, br#"{"name":"gamma"}"#.to_vec(), 415, "/problems/unsupported-media-type").await;
        expect_problem(s, Method::POST, "/api/v1/tenants", Some("text/plain"), br#"{"name":"gamma"}"#.to_vec(), 415, "/problems/unsupported-media-type").await;
        // Oversized body (limit 1 MiB), with and without an idempotency key.
        let mut big = br#"{"name":"gamma","description":""#.to_vec();
        big.extend(std::iter::repeat_n(b'x', 2 << 20));
        big.extend(br#""}"#);
        expect_problem(s, Method::POST, "/api/v1/tenants", JSON, big.clone(), 413, "/problems/payload-too-large").await;
        let resp = s.http().post(format!("{}/api/v1/tenants", s.url)).bearer_auth(&s.admin_token)
            .header("content-type", "application/json").header("idempotency-key", "big-1").body(big).send().await.unwrap();
        assert_eq!(resp.status(), 413);
        // Bad query strings and page tokens.
        expect_problem(s, Method::GET, "/api/v1/tenants?limit=0", None, vec![], 400, "/problems/validation").await;
        expect_problem(s, Method::GET, "/api/v1/tenants?limit=abc", None, vec![], 400, "/problems/validation").await;
        expect_problem(s, Method::GET, "/api/v1/tenants?page_token=%25%25", None, vec![], 400, "/problems/validation").await;
        // Unknown routes and methods.
        expect_problem(s, Method::GET, "/api/v1/nothing-here", None, vec![], 404, "/problems/not-found").await;
        expect_problem(s, Method::DELETE, "/api/v1/users", None, vec![], 405, "/problems/method-not-allowed").await;
        // Paths that name nothing.
        expect_problem(s, Method::GET, "/api/v1/tenants/..%2F..%2Fetc", None, vec![], 404, "/problems/not-found").await;
        expect_problem(s, Method::DELETE, "/api/v1/tokens/not-a-uuid", None, vec![], 404, "/problems/not-found").await;

        assert_eq!(s.admin.list_tenants().await.unwrap(), before_tenants);
        assert_eq!(s.admin.list_users().await.unwrap(), before_users);
        assert_eq!(s.admin.audit(None, 500).await.unwrap().len(), before_audit, "refused requests write no audit entries");
    }

    async fn problems_survive_compression(s: &TestServer) {
        // Browsers always ask for gzip; a problem must still arrive intact.
        let resp = s
            .http()
            .post(format!("{}/api/v1/tenants", s.url))
            .bearer_auth(&s.admin_token)
            .header("accept-encoding", "gzip")
            .header("content-type", "application/json")
            .body(r#"{"name":"Bad_Name"}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 400);
        assert_eq!(resp.headers()["content-type"], "application/problem+json");
        let gzipped = resp.headers().get("content-encoding").is_some_and(|v| v == "gzip");
        let bytes = resp.bytes().await.unwrap();
        let body = if gzipped {
            let mut out = Vec::new();
            std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut out).unwrap();
            out
        } else {
            bytes.to_vec()
        };
        let p: Problem = serde_json::from_slice(&body).unwrap();
        assert_eq!(p.kind, "/problems/validation");
        assert!(p.detail.unwrap().contains("[a-z][a-z0-9-]"));
        assert!(p.request_id.is_some());
        // Large successful answers are compressed.
        for i in 0..40 {
            s.tenant(&format!("bulk-{i:02}")).await;
        }
        let resp = s.http().get(format!("{}/api/v1/tenants", s.url)).bearer_auth(&s.admin_token)
            .header("accept-encoding", "gzip").send().await.unwrap();
        assert_eq!(resp.headers()["content-encoding"], "gzip");
    }

    async fn bad_tokens_are_401_problems(s: &TestServer) {
        for header in ["Bearer", "Bearer kumo_", "Basic YWRtaW46YWRtaW4=", "Bearer kumo_0123456789abcdef0123456789abcdef_wrong"] {
            let resp = s.http().get(format!("{}/api/v1/users/me", s.url)).header("authorization", header).send().await.unwrap();
            assert_eq!(resp.status(), 401, "{header}");
            assert_eq!(resp.headers()["www-authenticate"], "Bearer realm=\"kumo\"");
            let p: Problem = resp.json().await.unwrap();
            assert_eq!(p.kind, "/problems/unauthenticated");
        }
        // The scheme is case-insensitive.
        let resp = s.http().get(format!("{}/api/v1/users/me", s.url))
            .header("authorization", format!("bearer {}", s.admin_token)).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        // A real token id with a forged secret.
        let (id, _) = kumo_server::app::auth::parse(&s.admin_token).unwrap();
        let forged = format!("kumo_{}_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", id.simple());
        assert_eq!(s.client(Some(&forged)).me().await.unwrap_err().status(), Some(401));
    }
}
