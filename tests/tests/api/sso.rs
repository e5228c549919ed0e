//! Federated login against two real OpenID Providers (`oidc-provider`
//! from npm, started on loopback by the test): the authorization code
//! flow with PKCE through the providers' own login and consent pages,
//! users provisioned once per (issuer, subject), sessions, logout, and
//! the refusals — a forged state, a replayed code, a wrong nonce, an
//! e-mail domain outside the provider's rule.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};

use kumo_server::config::OidcProvider;
use reqwest::header::{LOCATION, SET_COOKIE};
use reqwest::redirect::Policy;
use serde_json::Value;

use crate::harness::{Backend, TestServer};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Providers(Child);

impl Drop for Providers {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Installs `oidc-provider` (npm) once, then starts both providers.
fn providers(a: u16, b: u16, redirect: &str) -> Providers {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("oidc");
    if !dir.join("node_modules/oidc-provider").exists() {
        let out = Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--silent"])
            .current_dir(&dir)
            .output()
            .unwrap_or_else(|e| panic!("npm (Node 20) is required for the SSO tests: {e}"));
        assert!(
            out.status.success(),
            "npm install: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut child = Command::new("node")
        .arg(dir.join("provider.mjs"))
        .args([
            &a.to_string(),
            "u-kumo.ac.jp",
            &b.to_string(),
            "example.com",
            redirect,
        ])
        .current_dir(&dir)
        .env("NODE_ENV", "test")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("node is required for the SSO tests: {e}"));
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "ready", "the providers did not start");
    // The providers log to stdout: keep draining it, or they die of EPIPE.
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    Providers(child)
}

fn browser() -> reqwest::Client {
    reqwest::Client::builder()
        .cookie_store(true)
        .redirect(Policy::none())
        .build()
        .unwrap()
}

fn location(r: &reqwest::Response) -> String {
    r.headers()
        .get(LOCATION)
        .unwrap_or_else(|| panic!("no redirect from {} ({})", r.url(), r.status()))
        .to_str()
        .unwrap()
        .to_owned()
}

fn absolute(base: &str, loc: &str) -> String {
    if loc.starts_with("http") {
        loc.to_owned()
    } else {
        format!("{}{loc}", base.trim_end_matches('/'))
    }
}

/// Logs in at `provider` as `login` through the provider's pages; answers
/// the callback URL the provider sends the browser back to.
async fn through_provider(
    c: &reqwest::Client,
    kumo: &str,
    provider: &str,
    issuer: &str,
    login: &str,
) -> String {
    let r = c
        .get(format!("{kumo}/auth/login/{provider}?next=/vms"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 302, "{:?}", r.text().await);
    let mut url = location(&r);
    assert!(url.starts_with(issuer), "{url}");
    assert!(
        url.contains("code_challenge_method=S256") && url.contains("nonce="),
        "{url}"
    );
    for _ in 0..10 {
        let r = c.get(&url).send().await.unwrap();
        if r.status().is_redirection() {
            let next = absolute(issuer, &location(&r));
            if next.starts_with(kumo) {
                return next;
            }
            url = next;
            continue;
        }
        assert_eq!(r.status(), 200, "{url}");
        let page = r.text().await.unwrap();
        let prompt = if page.contains("name=\"login\"") {
            "login"
        } else {
            "consent"
        };
        let r = c
            .post(&url)
            .form(&[("prompt", prompt), ("login", login), ("password", "any")])
            .send()
            .await
            .unwrap();
        assert!(r.status().is_redirection(), "{prompt}: {}", r.status());
        url = absolute(issuer, &location(&r));
    }
    panic!("the provider never sent the browser back")
}

async fn session(c: &reqwest::Client, kumo: &str) -> (u16, Value) {
    let r = c.get(format!("{kumo}/auth/session")).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or_default())
}

/// Two providers (A: `u-kumo.ac.jp` accounts, only `ac.jp` allowed; B:
/// `example.com`) and a server configured with both.
struct World {
    _providers: Providers,
    s: TestServer,
    kumo: String,
    ia: String,
    ib: String,
}

async fn world() -> World {
    let (pa, pb, pk) = (free_port(), free_port(), free_port());
    let kumo = format!("http://127.0.0.1:{pk}");
    let providers = providers(pa, pb, &format!("{kumo}/auth/callback"));
    let (ia, ib) = (
        format!("http://127.0.0.1:{pa}"),
        format!("http://127.0.0.1:{pb}"),
    );
    let provider = |name: &str, issuer: &str, domains: &[&str]| OidcProvider {
        name: name.into(),
        display_name: format!("University {name}"),
        issuer: issuer.into(),
        client_id: "kumo".into(),
        client_secret: "kumo-test-secret".into(),
        scopes: vec!["openid".into(), "email".into(), "profile".into()],
        allowed_email_domains: domains.iter().map(|d| (*d).to_owned()).collect(),
    };
    let s = TestServer::start_with(Backend::Sqlite, |c| {
        c.listen = format!("127.0.0.1:{pk}").parse().unwrap();
        c.auth.oidc = vec![
            provider("uni-a", &ia, &["ac.jp"]),
            provider("uni-b", &ib, &["example.com"]),
        ];
    })
    .await;
    World {
        _providers: providers,
        s,
        kumo,
        ia,
        ib,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn federated_login_with_two_institutions() {
    let w = world().await;
    let (s, kumo, ia, ib) = (&w.s, w.kumo.clone(), w.ia.clone(), w.ib.clone());
    assert_eq!(s.url, kumo);
    let listed: Value = s
        .http()
        .get(format!("{kumo}/auth/providers"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed[1]["display_name"], "University uni-b");

    // Institution A: a first login provisions the user; a second finds it.
    let a = browser();
    let back = through_provider(&a, &kumo, "uni-a", &ia, "aiko").await;
    let r = a.get(&back).send().await.unwrap();
    assert_eq!(r.status(), 302, "{:?}", r.text().await);
    assert_eq!(location(&r), "/vms");
    let cookie = r.headers()[SET_COOKIE].to_str().unwrap().to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Lax"),
        "{cookie}"
    );
    let (status, me) = session(&a, &kumo).await;
    assert_eq!(status, 200);
    assert_eq!(
        (me["user"].as_str(), me["kind"].as_str()),
        (Some("aiko"), Some("federated"))
    );
    assert_eq!(me["email"], "aiko@u-kumo.ac.jp");
    // The callback replayed (its code and state spent): refused.
    let r = a.get(&back).send().await.unwrap();
    assert_eq!(r.status(), 403);
    // A forged state: refused.
    let forged = back.replace("state=", "state=x");
    assert_eq!(a.get(&forged).send().await.unwrap().status(), 403);
    // Logging in again at A: the same user, not a second one.
    let again = browser();
    let back = through_provider(&again, &kumo, "uni-a", &ia, "aiko").await;
    assert_eq!(again.get(&back).send().await.unwrap().status(), 302);
    assert_eq!(session(&again, &kumo).await.1["user"], "aiko");
    let users: Vec<kumo_api_types::User> = s.admin.list_users().await.unwrap();
    assert_eq!(
        users.iter().filter(|u| u.name.starts_with("aiko")).count(),
        1
    );

    // A code whose flow carries another nonce: the ID token is refused.
    let n = browser();
    let back = through_provider(&n, &kumo, "uni-a", &ia, "nonce-test").await;
    use sea_orm::{ConnectionTrait, Statement};
    s.db()
        .execute(Statement::from_string(
            s.db().get_database_backend(),
            "UPDATE login_flows SET nonce = 'not-the-one-sent'".to_owned(),
        ))
        .await
        .unwrap();
    let r = n.get(&back).send().await.unwrap();
    assert_eq!(r.status(), 403);
    let why = r.text().await.unwrap().to_lowercase();
    assert!(why.contains("nonce"), "{why}");
    assert_eq!(session(&n, &kumo).await.0, 401);

    // Institution B: its own user; an address outside its rule is refused.
    let b = browser();
    let back = through_provider(&b, &kumo, "uni-b", &ib, "bob").await;
    assert_eq!(b.get(&back).send().await.unwrap().status(), 302);
    assert_eq!(session(&b, &kumo).await.1["email"], "bob@example.com");
    let eve = browser();
    let back = through_provider(&eve, &kumo, "uni-b", &ib, "eve@evil.example").await;
    let r = eve.get(&back).send().await.unwrap();
    assert_eq!(r.status(), 403);
    assert!(r.text().await.unwrap().contains("example.com only"));

    // The portal: each sees the tenants they belong to, and no other;
    // in the language they ask for.
    s.tenant("vision").await;
    s.add("vision", "aiko", kumo_api_types::Role::Owner).await;
    s.tenant("beta-lab").await;
    s.add("beta-lab", "bob", kumo_api_types::Role::Member).await;
    let page = |c: reqwest::Client, lang: &'static str| {
        let url = format!("{kumo}/");
        async move {
            let r = c
                .get(url)
                .header("accept-language", lang)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let (status, html) = page(a.clone(), "en").await;
    assert_eq!(status, 200);
    assert!(
        html.contains("data-tenant=\"vision\"") && !html.contains("beta-lab"),
        "{html}"
    );
    assert!(html.contains("My projects"));
    let (_, html) = page(b.clone(), "ja-JP,ja;q=0.9").await;
    assert!(
        html.contains("data-tenant=\"beta-lab\"") && !html.contains("vision"),
        "{html}"
    );
    assert!(html.contains("参加プロジェクト"), "{html}");
    let (status, _) = page(browser(), "en").await;
    assert_eq!(status, 303, "no session: to the chooser");
    let chooser = s
        .http()
        .get(format!("{kumo}/login?next=/vms"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        chooser.contains("University uni-a") && chooser.contains("/auth/login/uni-b?next=%2Fvms"),
        "{chooser}"
    );
    let r = a
        .get(format!("{kumo}/lang/ja"))
        .header("referer", format!("{kumo}/"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    assert!(r.headers()[SET_COOKIE]
        .to_str()
        .unwrap()
        .starts_with("kumo_lang=ja"));
    let (_, html) = page(a.clone(), "en").await;
    assert!(
        html.contains("lang=\"ja\""),
        "the switch beats Accept-Language"
    );

    // From the portal to a running 8-GPU VM and its topology diagram.
    let _: kumo_api_types::Rates = s
        .admin
        .put(
            "/api/v1/rates",
            &serde_json::json!({"prices": {"gpu:H100-SXM5-80GB": {"guaranteed": "3600", "spot": "1200"}}}),
        )
        .await
        .unwrap();
    let _: kumo_api_types::PointGrant = s
        .admin
        .post(
            "/api/v1/tenants/vision/points/grants",
            &serde_json::json!({"amount": "100000", "expires_at": chrono::Utc::now() + chrono::Duration::days(30)}),
        )
        .await
        .unwrap();
    let mut agent = s.sim_agent("gpu-001", "hgx-h100").await;
    let csrf_a = session(&a, &kumo).await.1["csrf"]
        .as_str()
        .unwrap()
        .to_owned();
    let form = |csrf: &str| {
        vec![
            ("csrf", csrf.to_owned()),
            ("name", "train".to_owned()),
            ("gpus", "8".to_owned()),
            ("network", String::new()),
        ]
    };
    let r = a
        .post(format!("{kumo}/t/vision/vms"))
        .form(&form("forged"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "a forged CSRF token creates nothing");
    let r = a
        .post(format!("{kumo}/t/vision/vms"))
        .form(&form(&csrf_a))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303, "{:?}", r.text().await);
    assert_eq!(location(&r), "/t/vision/vms/train");
    agent.converge().await;
    let vm_page = a
        .get(format!("{kumo}/t/vision/vms/train"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(vm_page.contains("data-state=\"running\""), "{vm_page}");
    assert_eq!(vm_page.matches("class=\"gpu\"").count(), 8, "a box per GPU");
    assert_eq!(
        vm_page.matches("class=\"nic\"").count(),
        8,
        "each beside its NIC"
    );
    assert!(
        vm_page.contains("<pre class=\"nccl\">&#60;system version=&#34;1&#34;&#62;"),
        "the NCCL file"
    );
    let list = a
        .get(format!("{kumo}/t/vision/vms"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(list.contains("data-vm=\"train\""));
    // Points and usage: the VM's first minute is charged at once.
    kumo_server::metering::post_due(&s.server.state)
        .await
        .unwrap();
    let billing = a
        .get(format!("{kumo}/t/vision/billing"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        billing.contains("data-balance=\"99520\""),
        "8 GPUs × 60 s: {billing}"
    );
    assert_eq!(
        billing.matches("class=\"bar\"").count(),
        30,
        "a bar per day"
    );
    assert!(billing.contains("class=\"charge\""));
    let dash = a
        .get(format!("{kumo}/"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        dash.matches("class=\"bar\"").count(),
        30,
        "the dashboard's usage chart"
    );
    assert!(
        dash.contains("height=\"140\""),
        "today's bar is the tallest: {dash}"
    );
    let month = chrono::Utc::now().format("%Y-%m").to_string();
    let csv = a
        .get(format!("{kumo}/t/vision/billing/statements/{month}.csv"))
        .send()
        .await
        .unwrap();
    assert!(csv.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/csv"));
    assert!(csv.headers()["content-disposition"]
        .to_str()
        .unwrap()
        .contains("attachment"));
    assert!(csv
        .text()
        .await
        .unwrap()
        .contains("train,gpu:H100-SXM5-80GB,guaranteed,60,3600,480"));
    assert_eq!(
        b.get(format!("{kumo}/t/vision/billing"))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    // Another institution's user gets nothing of it, page or form.
    assert_eq!(
        b.get(format!("{kumo}/t/vision/vms"))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    assert_eq!(
        b.get(format!("{kumo}/t/vision/vms/train"))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    let csrf_b = session(&b, &kumo).await.1["csrf"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = b
        .post(format!("{kumo}/t/vision/vms/train/delete"))
        .form(&[("csrf", csrf_b.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    // Actions are forms too.
    let r = a
        .post(format!("{kumo}/t/vision/vms/train/stop"))
        .form(&[("csrf", csrf_a.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    agent.converge().await;
    let list = a
        .get(format!("{kumo}/t/vision/vms"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(list.contains("data-state=\"stopped\""), "{list}");

    // `kumo login` through the portal: the signed-in user allows it, and
    // the command gets a token of its own on its loopback port.
    let home = tempfile::tempdir().unwrap();
    let mut cli = Command::new(crate::harness::bin("kumo"))
        .args(["login", "--server", &kumo, "--no-browser"])
        .env("HOME", home.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(cli.stdout.take().unwrap()));
    let _ = lines.next();
    let url = lines.next().unwrap().unwrap().trim().to_owned();
    assert!(url.starts_with(&format!("{kumo}/login/cli?port=")), "{url}");
    let r = again.get(&url).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r
        .text()
        .await
        .unwrap()
        .contains("method=\"post\" action=\"/login/cli\""));
    let query: std::collections::HashMap<String, String> = url
        .split_once('?')
        .unwrap()
        .1
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let csrf = session(&again, &kumo).await.1["csrf"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = again
        .post(format!("{kumo}/login/cli"))
        .form(&[
            ("csrf", "forged"),
            ("port", &query["port"]),
            ("state", &query["state"]),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "a forged CSRF token");
    let r = again
        .post(format!("{kumo}/login/cli"))
        .form(&[
            ("csrf", csrf.as_str()),
            ("port", &query["port"]),
            ("state", &query["state"]),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let to = location(&r);
    assert!(
        to.starts_with(&format!("http://127.0.0.1:{}/?state=", query["port"])),
        "{to}"
    );
    let r = again.get(&to).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let done = tokio::task::spawn_blocking(move || {
        let said: Vec<String> = lines.map_while(Result::ok).collect();
        (cli.wait().unwrap(), said)
    })
    .await
    .unwrap();
    assert!(done.0.success());
    assert!(done.1.iter().any(|l| l.contains("as aiko")), "{:?}", done.1);
    let home_dir = home.path().to_path_buf();
    let listed = tokio::task::spawn_blocking(move || {
        Command::new(crate::harness::bin("kumo"))
            .args(["tenant", "list"])
            .env("HOME", home_dir)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let err = String::from_utf8_lossy(&listed.stderr).into_owned();
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.contains("vision") && !listed.contains("beta-lab"),
        "{listed} {err}"
    );

    // Logout needs the session's CSRF token; then the session is gone.
    let (_, me) = session(&a, &kumo).await;
    let r = a
        .post(format!("{kumo}/auth/logout"))
        .form(&[("csrf", "wrong")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = a
        .post(format!("{kumo}/auth/logout"))
        .form(&[("csrf", me["csrf"].as_str().unwrap())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 302);
    assert_eq!(session(&a, &kumo).await.0, 401);
    drop(agent);
}

/// The portal in a real browser (Debian's Chromium, driven by
/// `playwright-core`): from the institution chooser through the
/// provider's login to the dashboard, then a new 8-GPU VM until it runs,
/// and its topology diagram — in Japanese. Screenshots of each page are
/// kept in `target/portal-screenshots/`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_portal_in_a_browser() {
    assert!(
        std::path::Path::new("/usr/bin/chromium").exists(),
        "Debian's chromium is required (the README's test command installs it)"
    );
    let w = world().await;
    let (s, kumo, ia) = (&w.s, w.kumo.clone(), w.ia.clone());
    // The user exists once they have logged in; then an owner adds them.
    let pre = browser();
    let back = through_provider(&pre, &kumo, "uni-a", &ia, "aiko").await;
    assert_eq!(pre.get(&back).send().await.unwrap().status(), 302);
    s.tenant("vision").await;
    s.add("vision", "aiko", kumo_api_types::Role::Owner).await;
    let mut agent = s.sim_agent("gpu-001", "hgx-h100").await;
    let converging = tokio::spawn(async move {
        loop {
            agent.converge().await;
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    });
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/portal-screenshots");
    std::fs::create_dir_all(&out).unwrap();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("oidc");
    let (kumo2, out2) = (kumo.clone(), out.clone());
    let seen = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .arg(dir.join("browser.mjs"))
            .args([&kumo2, "University uni-a", "aiko", "vision", "ja-JP"])
            .arg(&out2)
            .current_dir(&dir)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    converging.abort();
    let text = String::from_utf8_lossy(&seen.stdout);
    let seen: Value = serde_json::from_str(text.trim())
        .unwrap_or_else(|_| panic!("browser: {text} {}", String::from_utf8_lossy(&seen.stderr)));
    assert_eq!(seen["error"], Value::Null, "{seen}");
    assert_eq!(seen["chooser"], true, "{seen}");
    assert_eq!(seen["dashboard_lang"], "ja", "{seen}");
    assert_eq!(seen["dashboard_has_tenant"], true, "{seen}");
    assert_eq!(seen["vm_state"], "running", "{seen}");
    assert_eq!(
        (seen["gpu_boxes"].as_u64(), seen["nic_boxes"].as_u64()),
        (Some(8), Some(8))
    );
    assert_eq!(seen["billing_bars"], 30, "{seen}");
    for shot in [
        "login.png",
        "dashboard.png",
        "vm.png",
        "vms.png",
        "billing.png",
    ] {
        let len = std::fs::metadata(out.join(shot))
            .map(|m| m.len())
            .unwrap_or(0);
        assert!(len > 10_000, "{shot}: {len} bytes");
    }
}
