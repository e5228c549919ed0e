//! `Idempotency-Key` replays the first answer and creates nothing twice.

use kumo_api_types::{Problem, Tenant, TokenCreated};
use sea_orm::EntityTrait;

use crate::harness::{on_both_backends, TestServer};

async fn post(s: &TestServer, path: &str, key: &str, body: &str) -> reqwest::Response {
    s.http()
        .post(format!("{}{path}", s.url))
        .bearer_auth(&s.admin_token)
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(body.to_owned())
        .send()
        .await
        .unwrap()
}

on_both_backends! {
    async fn a_retry_replays_the_first_answer(s: &TestServer) {
        let first = post(s, "/api/v1/tenants", "k-1", r#"{"name":"once"}"#).await;
        assert_eq!(first.status(), 201);
        assert!(first.headers().get("idempotent-replayed").is_none());
        let first: Tenant = first.json().await.unwrap();
        let again = post(s, "/api/v1/tenants", "k-1", r#"{"name":"once"}"#).await;
        assert_eq!(again.status(), 201);
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        assert_eq!(again.headers()["content-type"], "application/json");
        let again: Tenant = again.json().await.unwrap();
        assert_eq!(again, first);
        assert_eq!(s.admin.list_tenants().await.unwrap().len(), 1);
        let creates = s.admin.audit(None, 100).await.unwrap().into_iter().filter(|e| e.action == "tenant.create").count();
        assert_eq!(creates, 1);

        // A token is minted once, and its secret is shown once: the replay
        // mints no second token and answers 409 naming the first, and the
        // secret is nowhere in the idempotency store.
        let t1: TokenCreated = post(s, "/api/v1/tokens", "tok-1", "{}").await.json().await.unwrap();
        let again = post(s, "/api/v1/tokens", "tok-1", "{}").await;
        assert_eq!(again.status(), 409);
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        let p: Problem = again.json().await.unwrap();
        let detail = p.detail.unwrap_or_default();
        assert!(detail.contains(&t1.id.to_string()), "{detail}");
        assert!(!detail.contains(&t1.token));
        assert_eq!(s.admin.list_tokens().await.unwrap().len(), 2);
        let secret = kumo_server::app::auth::parse(&t1.token).unwrap().1.to_owned();
        for row in kumo_server::entity::idempotency_keys::Entity::find().all(s.db()).await.unwrap() {
            assert!(!row.body.unwrap_or_default().contains(&secret), "a secret was kept");
        }
        // So is a join token's.
        let j = post(s, "/api/v1/hosts/join-tokens", "join-1", "{}").await;
        assert_eq!(j.status(), 201);
        assert_eq!(post(s, "/api/v1/hosts/join-tokens", "join-1", "{}").await.status(), 409);

        // Answers older than a day are purged.
        let later = chrono::Utc::now() + chrono::Duration::hours(25);
        let purged = kumo_server::store::idempotency::purge(s.db(), later).await.unwrap();
        assert!(purged >= 3, "{purged}");
        assert!(kumo_server::entity::idempotency_keys::Entity::find().all(s.db()).await.unwrap().is_empty());
    }

    async fn errors_replay_too_and_keys_are_per_request(s: &TestServer) {
        let bad = post(s, "/api/v1/tenants", "k-2", r#"{"name":"X"}"#).await;
        assert_eq!(bad.status(), 400);
        let again = post(s, "/api/v1/tenants", "k-2", r#"{"name":"X"}"#).await;
        assert_eq!(again.status(), 400);
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        // The same key for a different body is refused.
        let other = post(s, "/api/v1/tenants", "k-2", r#"{"name":"different"}"#).await;
        assert_eq!(other.status(), 422);
        let p: Problem = other.json().await.unwrap();
        assert_eq!(p.kind, "/problems/idempotency-key-reuse");
        assert!(s.admin.list_tenants().await.unwrap().is_empty());
        // Keys are scoped to the caller: another user's identical key is theirs alone.
        let (_, token) = s.user("alice").await;
        let mine = s.http().post(format!("{}/api/v1/tokens", s.url)).bearer_auth(&token)
            .header("content-type", "application/json").header("idempotency-key", "tok-x").body("{}").send().await.unwrap();
        let theirs = post(s, "/api/v1/tokens", "tok-x", "{}").await;
        assert_eq!(mine.status(), 201);
        assert_eq!(theirs.status(), 201);
        assert!(theirs.headers().get("idempotent-replayed").is_none());
        // A malformed key is a validation problem.
        let resp = post(s, "/api/v1/tenants", "bad key with spaces", r#"{"name":"spaced"}"#).await;
        assert_eq!(resp.status(), 400);
    }

    async fn concurrent_retries_create_once(s: &TestServer) {
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let url = format!("{}/api/v1/tenants", s.url);
            let token = s.admin_token.clone();
            tasks.push(tokio::spawn(async move {
                reqwest::Client::new()
                    .post(url)
                    .bearer_auth(token)
                    .header("content-type", "application/json")
                    .header("idempotency-key", "race-1")
                    .body(r#"{"name":"raced"}"#)
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            }));
        }
        let mut statuses = Vec::new();
        for t in tasks {
            statuses.push(t.await.unwrap());
        }
        // Every answer is the replayed 201 or "still in progress" (409); never a second tenant.
        assert!(statuses.iter().all(|s| *s == 201 || *s == 409), "{statuses:?}");
        assert!(statuses.contains(&201));
        assert_eq!(s.admin.list_tenants().await.unwrap().len(), 1);
    }

    /// One user cannot fill the shared database through kept answers: a
    /// problem echoes at most a bounded part of what it was sent, and a
    /// user has at most 1,000 keys kept at once (then 429; a retry of a
    /// kept key still replays).
    async fn kept_answers_are_bounded_per_user(s: &TestServer) {
        let huge = format!(r#"{{"{}":1}}"#, "z".repeat(900_000));
        let r = post(s, "/api/v1/tenants", "big", &huge).await;
        assert_eq!(r.status(), 400, "not a 500");
        let body = r.bytes().await.unwrap();
        assert!(body.len() < 8 << 10, "{} bytes echoed", body.len());
        let kept = kumo_server::entity::idempotency_keys::Entity::find()
            .all(s.db())
            .await
            .unwrap();
        let stored: usize = kept.iter().map(|k| k.body.as_deref().unwrap_or("").len()).sum();
        assert!(stored < 8 << 10, "{stored} bytes kept");
        for i in 1..1000 {
            let r = post(s, "/api/v1/tenants", &format!("fill-{i}"), r#"{"name":"x y"}"#).await;
            assert_eq!(r.status(), 400, "key {i}");
        }
        let r = post(s, "/api/v1/tenants", "one-too-many", r#"{"name":"x y"}"#).await;
        assert_eq!(r.status(), 429);
        assert!(r.headers().get("retry-after").is_some());
        let again = post(s, "/api/v1/tenants", "fill-7", r#"{"name":"x y"}"#).await;
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        // Without a key, the request is simply served.
        let r = s
            .http()
            .post(format!("{}/api/v1/tenants", s.url))
            .bearer_auth(&s.admin_token)
            .json(&serde_json::json!({"name": "fine"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
    }
}
