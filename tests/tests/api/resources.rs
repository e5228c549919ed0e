//! Every handler's behaviour, on both databases.

use std::os::unix::fs::PermissionsExt;

use chrono::{Duration, SubsecRound, Utc};
use kumo_api_types::{
    MemberPut, Page, Quota, Role, TenantCreate, TenantUpdate, TokenCreate, UserCreate, UserKind,
};
use kumo_server::entity::api_tokens;
use sea_orm::{ActiveModelTrait, EntityTrait, Set};

use crate::harness::on_both_backends;

on_both_backends! {
    async fn bootstrap_writes_a_private_admin_token(s: &TestServer) {
        let path = s.data_dir.join("admin-token");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let me = s.admin.me().await.unwrap();
        assert_eq!(me.user.name, "admin");
        assert!(me.user.is_admin);
        // A restart on the same database creates no second admin and keeps
        // the first token valid.
        let again = kumo_server::app::bootstrap::bootstrap(s.db(), &s.data_dir, chrono::Utc::now())
            .await
            .unwrap();
        assert!(again.is_none());
        assert_eq!(s.admin.list_users().await.unwrap().len(), 1);
    }

    async fn tenants_are_created_listed_updated_and_deleted(s: &TestServer) {
        let t = s
            .admin
            .create_tenant(&TenantCreate {
                name: "llm-lab".into(),
                display_name: Some("LLM 研究室".into()),
                description: Some("pre-training".into()),
            })
            .await
            .unwrap();
        assert_eq!(t.display_name, "LLM 研究室");
        // Names and ids both address it.
        assert_eq!(s.admin.tenant("llm-lab").await.unwrap(), t);
        assert_eq!(s.admin.tenant(&t.id.to_string()).await.unwrap(), t);
        let u = s
            .admin
            .update_tenant(
                "llm-lab",
                &TenantUpdate {
                    display_name: None,
                    description: Some("fine-tuning".into()),
                },
            )
            .await
            .unwrap();
        assert_eq!(u.description, "fine-tuning");
        assert_eq!(u.display_name, "LLM 研究室");
        assert!(u.updated_at >= t.updated_at);
        let dup = s
            .admin
            .create_tenant(&TenantCreate {
                name: "llm-lab".into(),
                display_name: None,
                description: None,
            })
            .await
            .unwrap_err();
        assert_eq!(dup.problem().unwrap().kind, "/problems/conflict");
        s.admin.delete_tenant("llm-lab").await.unwrap();
        let gone = s.admin.tenant("llm-lab").await.unwrap_err();
        assert_eq!(gone.status(), Some(404));
        assert!(s.admin.list_tenants().await.unwrap().is_empty());
    }

    async fn deleting_a_tenant_removes_its_members_and_quota(s: &TestServer) {
        s.tenant("doomed").await;
        let (alice, _) = s.user("alice").await;
        s.add("doomed", "alice", Role::Owner).await;
        assert_eq!(alice.me().await.unwrap().memberships.len(), 1);
        s.admin.delete_tenant("doomed").await.unwrap();
        assert!(alice.me().await.unwrap().memberships.is_empty());
        // The name is free again, with a clean slate.
        s.bare_tenant("doomed").await;
        assert!(s.admin.list_members("doomed").await.unwrap().is_empty());
        assert_eq!(s.admin.quota("doomed").await.unwrap(), Quota::default());
    }

    async fn users_see_only_their_tenants(s: &TestServer) {
        s.tenant("alpha").await;
        s.tenant("beta").await;
        let (alice, _) = s.user("alice").await;
        s.add("alpha", "alice", Role::Member).await;
        let names: Vec<_> = alice.list_tenants().await.unwrap().into_iter().map(|t| t.name).collect();
        assert_eq!(names, vec!["alpha"]);
        assert_eq!(alice.tenant("beta").await.unwrap_err().status(), Some(404));
        let me = alice.me().await.unwrap();
        assert_eq!(me.memberships.len(), 1);
        assert_eq!(me.memberships[0].tenant, "alpha");
        assert_eq!(me.memberships[0].role, Role::Member);
        let all: Vec<_> = s.admin.list_tenants().await.unwrap().into_iter().map(|t| t.name).collect();
        assert_eq!(all, vec!["alpha", "beta"]);
    }

    async fn users_and_service_accounts(s: &TestServer) {
        let svc = s
            .admin
            .create_user(&UserCreate {
                name: "ci-bot".into(),
                display_name: Some("CI".into()),
                email: Some("ci@lab.ac.jp".into()),
                kind: Some(UserKind::Service),
                is_admin: false,
            })
            .await
            .unwrap();
        assert_eq!(svc.kind, UserKind::Service);
        let dup = s
            .admin
            .create_user(&UserCreate {
                name: "ci-bot".into(),
                display_name: None,
                email: None,
                kind: None,
                is_admin: false,
            })
            .await
            .unwrap_err();
        assert_eq!(dup.status(), Some(409));
        let bad = s
            .admin
            .create_user(&UserCreate {
                name: "robot".into(),
                display_name: None,
                email: None,
                kind: Some(UserKind::Service),
                is_admin: true,
            })
            .await
            .unwrap_err();
        assert_eq!(bad.status(), Some(400));
        let names: Vec<_> = s.admin.list_users().await.unwrap().into_iter().map(|u| u.name).collect();
        assert_eq!(names, vec!["admin", "ci-bot"]);
    }

    async fn members_are_added_changed_and_removed(s: &TestServer) {
        s.tenant("alpha").await;
        let (owner, _) = s.user("olga").await;
        s.user("mika").await;
        s.add("alpha", "olga", Role::Owner).await;
        // An owner manages members; PUT creates (201), then changes (200).
        let m = owner.put_member("alpha", "mika", &MemberPut { role: Role::Viewer }).await.unwrap();
        assert_eq!(m.role, Role::Viewer);
        let resp = s
            .http()
            .put(format!("{}/api/v1/tenants/alpha/members/mika", s.url))
            .bearer_auth(&s.admin_token)
            .json(&MemberPut { role: Role::Member })
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let roles: Vec<_> = owner
            .list_members("alpha")
            .await
            .unwrap()
            .into_iter()
            .map(|m| (m.user, m.role))
            .collect();
        assert!(roles.contains(&("mika".into(), Role::Member)));
        assert!(roles.contains(&("olga".into(), Role::Owner)));
        // The last owner can be neither demoted nor removed.
        let e = owner.put_member("alpha", "olga", &MemberPut { role: Role::Member }).await.unwrap_err();
        assert_eq!(e.status(), Some(409));
        let e = owner.remove_member("alpha", "olga").await.unwrap_err();
        assert_eq!(e.status(), Some(409));
        owner.remove_member("alpha", "mika").await.unwrap();
        assert_eq!(owner.list_members("alpha").await.unwrap().len(), 1);
        assert_eq!(owner.remove_member("alpha", "mika").await.unwrap_err().status(), Some(404));
        assert_eq!(
            owner.put_member("alpha", "nobody", &MemberPut { role: Role::Viewer }).await.unwrap_err().status(),
            Some(404)
        );
    }

    async fn tokens_are_shown_once_hashed_and_revocable(s: &TestServer) {
        let (alice, _) = s.user("alice").await;
        let created = alice
            .create_token(&TokenCreate {
                description: Some("laptop".into()),
                expires_at: Some(Utc::now() + Duration::days(30)),
            })
            .await
            .unwrap();
        assert!(created.token.starts_with(&format!("kumo_{}_", created.id.simple())));
        // Only a hash is stored.
        let row = api_tokens::Entity::find_by_id(created.id).one(s.db()).await.unwrap().unwrap();
        assert!(!created.token.contains(&row.secret_hash));
        assert_eq!(row.secret_hash.len(), 64);
        // The secret is base64url and may itself contain `_`.
        let (_, secret) = kumo_server::app::auth::parse(&created.token).unwrap();
        assert_eq!(row.secret_hash, kumo_server::app::auth::hash_secret(secret));

        let laptop = s.client(Some(&created.token));
        assert_eq!(laptop.me().await.unwrap().user.name, "alice");
        let listed = alice.list_tokens().await.unwrap();
        assert_eq!(listed.len(), 2);
        let info = listed.iter().find(|t| t.id == created.id).unwrap();
        assert_eq!(info.description, "laptop");
        assert!(info.last_used_at.is_some(), "using a token records last_used_at");
        assert!(serde_json::to_string(&listed).unwrap().find("kumo_").is_none(), "lists never show secrets");

        alice.revoke_token(&created.id.to_string()).await.unwrap();
        assert_eq!(laptop.me().await.unwrap_err().status(), Some(401));
        assert_eq!(alice.list_tokens().await.unwrap().len(), 1);
        // Revoking twice, or someone else's token, is "not found".
        assert_eq!(alice.revoke_token(&created.id.to_string()).await.unwrap_err().status(), Some(404));
        let (bob, _) = s.user("bob").await;
        let bobs = bob.list_tokens().await.unwrap();
        assert_eq!(alice.revoke_token(&bobs[0].id.to_string()).await.unwrap_err().status(), Some(404));
        assert_eq!(bob.me().await.unwrap().user.name, "bob");

        let past = alice
            .create_token(&TokenCreate {
                description: None,
                expires_at: Some(Utc::now() - Duration::minutes(1)),
            })
            .await
            .unwrap_err();
        assert_eq!(past.status(), Some(400));
    }

    async fn a_token_never_outlives_the_token_that_minted_it(s: &TestServer) {
        let (alice, _) = s.user("alice").await;
        let short = alice
            // Whole seconds: PostgreSQL keeps microseconds, the clock has more.
            .create_token(&TokenCreate { description: Some("ci, a minute".into()), expires_at: Some((Utc::now() + Duration::seconds(60)).trunc_subsecs(0)) })
            .await
            .unwrap();
        let ci = s.client(Some(&short.token));
        // Asked to live forever, or for a year: it ends with its parent.
        let child = ci.create_token(&TokenCreate::default()).await.unwrap();
        assert_eq!(child.expires_at, short.expires_at);
        let year = ci
            .create_token(&TokenCreate { description: None, expires_at: Some(Utc::now() + Duration::days(365)) })
            .await
            .unwrap();
        assert_eq!(year.expires_at, short.expires_at);
        // A grandchild too; and revoking the parent revokes what it minted.
        let grandchild = s.client(Some(&child.token)).create_token(&TokenCreate::default()).await.unwrap();
        assert_eq!(grandchild.expires_at, short.expires_at);
        alice.revoke_token(&short.id.to_string()).await.unwrap();
        for t in [&child.token, &year.token, &grandchild.token] {
            assert_eq!(s.client(Some(t)).me().await.unwrap_err().status(), Some(401));
        }
        // Alice's own login token (no end) still works.
        assert_eq!(alice.me().await.unwrap().user.name, "alice");
    }

    async fn disabled_users_are_locked_out_at_once(s: &TestServer) {
        let (alice, _) = s.user("alice").await;
        let extra = alice.create_token(&TokenCreate::default()).await.unwrap();
        let laptop = s.client(Some(&extra.token));
        laptop.me().await.unwrap();
        let u = s.admin.set_user_disabled("alice", true).await.unwrap();
        assert!(u.disabled);
        assert_eq!(laptop.me().await.unwrap_err().status(), Some(401));
        assert_eq!(alice.me().await.unwrap_err().status(), Some(401));
        // Others are not: admins only, and not oneself.
        let (bob, _) = s.user("bob").await;
        assert_eq!(bob.set_user_disabled("alice", false).await.unwrap_err().status(), Some(403));
        assert_eq!(s.admin.set_user_disabled("admin", true).await.unwrap_err().status(), Some(409));
        assert_eq!(bob.end_sessions("alice").await.unwrap_err().status(), Some(403));
        bob.end_sessions("bob").await.unwrap();
        let u = s.admin.set_user_disabled("alice", false).await.unwrap();
        assert!(!u.disabled);
        assert_eq!(laptop.me().await.unwrap().user.name, "alice");
        let audit = s.admin.audit(None, 100).await.unwrap();
        assert!(audit.iter().any(|e| e.action == "user.disable" && e.target == "alice"));
    }

    async fn expired_tokens_stop_working(s: &TestServer) {
        let (_, token) = s.user("alice").await;
        let c = s.client(Some(&token));
        c.me().await.unwrap();
        let (id, _) = kumo_server::app::auth::parse(&token).unwrap();
        let row = api_tokens::Entity::find_by_id(id).one(s.db()).await.unwrap().unwrap();
        let mut row: api_tokens::ActiveModel = row.into();
        row.expires_at = Set(Some(Utc::now() - Duration::seconds(1)));
        row.update(s.db()).await.unwrap();
        let e = c.me().await.unwrap_err();
        assert_eq!(e.problem().unwrap().kind, "/problems/unauthenticated");
    }

    async fn quota_is_stored_and_validated(s: &TestServer) {
        s.bare_tenant("alpha").await;
        assert_eq!(s.admin.quota("alpha").await.unwrap(), Quota::default());
        let mut q = Quota {
            vcpus: 256,
            memory_gib: 2048,
            vms: 16,
            disk_gib: 800,
            segments: 4,
            roce_segments: 2,
            public_ips: 2,
            ..Quota::default()
        };
        q.gpus.insert("A100-SXM4-40GB".into(), 16);
        q.gpus.insert("H100-SXM5-80GB".into(), 8);
        assert_eq!(s.admin.set_quota("alpha", &q).await.unwrap(), q);
        assert_eq!(s.admin.quota("alpha").await.unwrap(), q);
        // PUT replaces: a model left out is gone.
        q.gpus.remove("A100-SXM4-40GB");
        assert_eq!(s.admin.set_quota("alpha", &q).await.unwrap(), q);
        let mut bad = q.clone();
        bad.gpus.insert("no spaces".into(), 1);
        let e = s.admin.set_quota("alpha", &bad).await.unwrap_err();
        assert_eq!(e.status(), Some(400));
        assert_eq!(e.problem().unwrap().errors[0].field, "gpus.no spaces");
        assert_eq!(s.admin.quota("alpha").await.unwrap(), q, "a refused PUT changes nothing");
    }

    async fn audit_records_who_did_what_from_where(s: &TestServer) {
        s.tenant("alpha").await;
        s.tenant("beta").await;
        let (owner, _) = s.user("olga").await;
        s.add("alpha", "olga", Role::Owner).await;
        owner
            .update_tenant("alpha", &TenantUpdate { display_name: Some("Alpha".into()), description: None })
            .await
            .unwrap();
        let all = s.admin.audit(None, 100).await.unwrap();
        let actions: Vec<_> = all.iter().map(|e| e.action.as_str()).collect();
        // Newest first.
        assert_eq!(actions[0], "tenant.update");
        assert!(actions.contains(&"tenant.create") && actions.contains(&"member.put") && actions.contains(&"user.create"));
        let update = &all[0];
        assert_eq!(update.actor, "olga");
        assert_eq!(update.tenant.as_deref(), Some("alpha"));
        assert_eq!(update.source_ip, "127.0.0.1");
        assert!(!update.request_id.is_empty());
        // An owner sees only their tenant's entries.
        let mine = owner.audit(None, 100).await.unwrap();
        assert!(!mine.is_empty());
        assert!(mine.iter().all(|e| e.tenant.as_deref() == Some("alpha")));
        assert_eq!(owner.audit(Some("beta"), 100).await.unwrap_err().status(), Some(404));
        // The request id in the log is the server's, the one the client
        // saw in the answer; the client's own id is kept beside it.
        let send = |id: &'static str| {
            s.http()
                .patch(format!("{}/api/v1/tenants/alpha", s.url))
                .bearer_auth(&s.admin_token)
                .header("x-request-id", id)
                .json(&TenantUpdate { display_name: None, description: Some("x".into()) })
                .send()
        };
        let resp = send("req-audit-1").await.unwrap();
        let server_id = resp.headers()["x-request-id"].to_str().unwrap().to_owned();
        assert_ne!(server_id, "req-audit-1", "a client must not name the server's request");
        assert!(uuid::Uuid::parse_str(&server_id).is_ok(), "{server_id}");
        assert_eq!(resp.headers()["x-client-request-id"], "req-audit-1");
        let newest = &s.admin.audit(Some("alpha"), 1).await.unwrap()[0];
        assert_eq!(newest.request_id, server_id);
        assert_eq!(newest.client_request_id.as_deref(), Some("req-audit-1"));
        assert_eq!(newest.actor, "admin");
        // Two requests with the same client id are still two requests; a
        // client id with a control character is not kept at all.
        let again = send("req-audit-1").await.unwrap();
        assert_ne!(again.headers()["x-request-id"].to_str().unwrap(), server_id);
        let dirty = send("req\tx").await.unwrap();
        assert_eq!(dirty.status(), 200);
        assert!(dirty.headers().get("x-client-request-id").is_none());
        let newest = &s.admin.audit(Some("alpha"), 1).await.unwrap()[0];
        assert_eq!(newest.client_request_id, None);
    }

    async fn lists_are_paginated(s: &TestServer) {
        for i in 0..7 {
            s.tenant(&format!("proj-{i}")).await;
        }
        let mut seen = Vec::new();
        let mut url = format!("{}/api/v1/tenants?limit=3", s.url);
        let mut pages = 0;
        loop {
            let page: Page<kumo_api_types::Tenant> = s
                .http()
                .get(&url)
                .bearer_auth(&s.admin_token)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            pages += 1;
            assert!(page.items.len() <= 3);
            seen.extend(page.items.into_iter().map(|t| t.name));
            match page.next_page_token {
                Some(t) => url = format!("{}/api/v1/tenants?limit=3&page_token={t}", s.url),
                None => break,
            }
        }
        assert_eq!(pages, 3);
        let expected: Vec<_> = (0..7).map(|i| format!("proj-{i}")).collect();
        assert_eq!(seen, expected);
        // The client follows pages by itself.
        assert_eq!(s.admin.list_tenants().await.unwrap().len(), 7);
    }

    async fn health_readiness_and_metrics(s: &TestServer) {
        let h = s.http();
        let r = h.get(format!("{}/healthz", s.url)).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let r = h.get(format!("{}/readyz", s.url)).send().await.unwrap();
        assert_eq!(r.status(), 200);
        s.admin.tenant("nope").await.unwrap_err();
        let text = h.get(format!("{}/metrics", s.url)).send().await.unwrap().text().await.unwrap();
        assert!(
            text.contains(r#"kumo_http_requests_total{method="GET",route="/api/v1/tenants/{tenant}",status="404"} 1"#),
            "{text}"
        );
        assert!(text.contains(r#"kumo_http_request_duration_seconds_count{method="GET",route="/readyz"} 1"#), "{text}");
        assert!(text.contains("kumo_db_pool_connections "), "{text}");
    }

    async fn readiness_fails_when_the_database_is_gone(s: &TestServer) {
        // Close the pool under the server: liveness stays, readiness goes.
        s.db().clone().close().await.unwrap();
        let h = s.http();
        assert_eq!(h.get(format!("{}/healthz", s.url)).send().await.unwrap().status(), 200);
        let r = h.get(format!("{}/readyz", s.url)).send().await.unwrap();
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()["content-type"], "application/problem+json");
    }
}

/// Two transactions locking two rows in opposite orders: PostgreSQL gives
/// one up (deadlock), and Kumo calls that contention (503, try again),
/// not an internal error.
#[tokio::test]
async fn a_deadlock_is_contention_not_an_internal_error() {
    use sea_orm::{ConnectionTrait, TransactionTrait};
    let s = crate::harness::TestServer::start(crate::harness::Backend::Postgres).await;
    for t in ["one", "two"] {
        s.tenant(t).await;
    }
    let touch = |name: &str| {
        sea_orm::Statement::from_string(
            sea_orm::DatabaseBackend::Postgres,
            format!("UPDATE tenants SET name = name WHERE name = '{name}'"),
        )
    };
    let (t1, t2) = (s.db().begin().await.unwrap(), s.db().begin().await.unwrap());
    t1.execute(touch("one")).await.unwrap();
    t2.execute(touch("two")).await.unwrap();
    let (r1, r2) = tokio::join!(t1.execute(touch("two")), t2.execute(touch("one")));
    let err = match (r1, r2) {
        (Err(e), Ok(_)) | (Ok(_), Err(e)) => e,
        other => panic!("exactly one gives way: {other:?}"),
    };
    assert!(kumo_server::error::is_contention(&err), "{err}");
    let e = kumo_server::error::ApiError::from(err);
    assert!(matches!(e, kumo_server::error::ApiError::Contention));
    assert_eq!(e.to_problem().status, 503);
}
