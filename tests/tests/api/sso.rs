//! Federated login against two real OpenID Providers (`oidc-provider`
//! from npm, started on loopback by the test): the authorization code
//! flow with PKCE through the providers' own login and consent pages,
//! users provisioned once per (issuer, subject), sessions, logout, and
//! the refusals — a forged state, a replayed code, a wrong nonce, an
//! e-mail domain outside the provider's rule.

use std::net::TcpListener;
use std::process::{Command, Stdio};

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

/// The two OpenID Providers' process.
type Providers = crate::harness::KillOnDrop;

/// Installs the npm packages (`oidc-provider`, `playwright-core`) once:
/// into a private directory, then renamed into place, so that an SSO test
/// starting beside the one installing never finds a half-written
/// `node_modules` (one did: "Cannot find package …/oidc-provider/index.js").
pub(crate) fn install_node_modules(dir: &std::path::Path) {
    let target = dir.join("node_modules");
    if target.exists() {
        return;
    }
    let staging = dir.join(format!(".install-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).unwrap();
    for f in ["package.json", "package-lock.json"] {
        std::fs::copy(dir.join(f), staging.join(f)).unwrap();
    }
    let out = Command::new("npm")
        .args(["install", "--no-audit", "--no-fund", "--silent"])
        .current_dir(&staging)
        .output()
        .unwrap_or_else(|e| panic!("npm (Node 20) is required for the SSO tests: {e}"));
    assert!(
        out.status.success(),
        "npm install: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Another test may have got there first: its copy is as good.
    let moved = std::fs::rename(staging.join("node_modules"), &target);
    assert!(
        moved.is_ok() || target.exists(),
        "installing node_modules: {moved:?}"
    );
    let _ = std::fs::remove_dir_all(&staging);
}

/// Installs the npm packages once, then starts both providers.
fn providers(a: u16, b: u16, redirect: &str) -> Providers {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("oidc");
    install_node_modules(&dir);
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
    crate::harness::KillOnDrop(child)
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

/// `kumo tenant list` with the profile `kumo login` saved under `home`:
/// its output and its errors.
async fn tenants_as(home: &std::path::Path) -> (String, String) {
    let home = home.to_path_buf();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(crate::harness::bin("kumo"))
            .args(["tenant", "list"])
            .env("HOME", home)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn session(c: &reqwest::Client, kumo: &str) -> (u16, Value) {
    let r = c.get(format!("{kumo}/auth/session")).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or_default())
}

/// Two providers (A: `u-kumo.ac.jp` accounts, only `ac.jp` allowed; B:
/// `example.com`) and a server configured with both.
struct World {
    providers: Providers,
    pa: u16,
    pb: u16,
    s: TestServer,
    kumo: String,
    ia: String,
    ib: String,
}

async fn world() -> World {
    world_with(|_| {}).await
}

async fn world_with(more: impl FnOnce(&mut kumo_server::config::Config)) -> World {
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
        more(c);
    })
    .await;
    World {
        providers,
        pa,
        pb,
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
    // What a provider says is outside data: a display name with terminal
    // escapes is stored without them; an address with one is no address.
    let m = browser();
    let back = through_provider(&m, &kumo, "uni-a", &ia, "mallory#Mal\u{1b}[2Jlory\u{7}").await;
    assert_eq!(m.get(&back).send().await.unwrap().status(), 302);
    let (_, me) = session(&m, &kumo).await;
    assert_eq!(me["display_name"], "Mal [2Jlory", "{me}");
    let e = browser();
    let back = through_provider(&e, &kumo, "uni-a", &ia, "eve\u{1b}x").await;
    assert_eq!(e.get(&back).send().await.unwrap().status(), 403);
    let users: Vec<kumo_api_types::User> = s.admin.list_users().await.unwrap();
    assert!(
        users
            .iter()
            .all(|u| !u.display_name.contains(char::is_control)
                && !u.email.as_deref().unwrap_or("").contains(char::is_control)),
        "{users:?}"
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
    let csrf_a = csrf_of(&a, &kumo).await;
    let form = |csrf: &str| {
        vec![
            ("csrf", csrf.to_owned()),
            ("name", "train".to_owned()),
            ("gpus", "8".to_owned()),
            ("gpu_model", "H100-SXM5-80GB".to_owned()),
            ("template", String::new()),
            ("network", String::new()),
        ]
    };
    let form_page = get(&a, &format!("{kumo}/t/vision/vms")).await.1;
    assert!(
        form_page.contains("<option value=\"H100-SXM5-80GB\">"),
        "priced GPU models are offered: {form_page}"
    );
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
    let vm_page = get(&a, &format!("{kumo}/t/vision/vms/train")).await.1;
    assert!(vm_page.contains("data-state=\"running\""), "{vm_page}");
    assert_eq!(vm_page.matches("class=\"gpu\"").count(), 8, "a box per GPU");
    // On no RoCE segment, no NIC: a tenant never gets a physical function.
    assert_eq!(
        vm_page.matches("class=\"nic\"").count(),
        0,
        "no NIC off RoCE"
    );
    assert!(
        vm_page.contains("class=\"boot\""),
        "how it boots: {vm_page}"
    );
    assert_eq!(
        vm_page.matches("class=\"switch\"").count(),
        8,
        "each pair in its PCIe switch"
    );
    assert_eq!(
        vm_page.matches("NVLink ×18").count(),
        8,
        "each H100 with its 18 links"
    );
    assert!(
        vm_page.contains("<pre class=\"nccl\" tabindex=\"0\">&#60;system version=&#34;1&#34;&#62;"),
        "the NCCL file"
    );
    let list = get(&a, &format!("{kumo}/t/vision/vms")).await.1;
    assert!(list.contains("data-vm=\"train\""));
    // Points and usage: the VM's first minute is charged at once.
    kumo_server::app::metering::post_due(&s.server.state)
        .await
        .unwrap();
    let billing = get(&a, &format!("{kumo}/t/vision/billing")).await.1;
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
    // The VM page's cost this month is that VM's charges: all 480 of them.
    let vm_page = get(&a, &format!("{kumo}/t/vision/vms/train")).await.1;
    assert!(
        vm_page.contains("<strong class=\"cost\">480 JPY</strong>"),
        "{vm_page}"
    );
    let dash = get(&a, &format!("{kumo}/")).await.1;
    assert_eq!(
        dash.matches("class=\"bar\"").count(),
        30,
        "the dashboard's usage chart"
    );
    // Each bar's label and height; today's is the tallest (on an axis
    // rounded up, so not necessarily the full height).
    let bars: Vec<(String, i64)> = dash
        .split("class=\"bar\" data-label=\"")
        .skip(1)
        .map(|b| {
            let label = b.split('"').next().unwrap().to_owned();
            let h = b
                .split("height=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap();
            (label, h.parse().unwrap())
        })
        .collect();
    let today = chrono::Utc::now().format("%m-%d").to_string();
    let tallest = bars.iter().map(|b| b.1).max().unwrap();
    assert!(
        tallest > 0 && bars.iter().any(|(l, h)| *l == today && *h == tallest),
        "today's bar is the tallest: {bars:?}"
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
    assert_eq!(get(&b, &format!("{kumo}/t/vision/billing")).await.0, 404);
    // Another institution's user gets nothing of it, page or form.
    assert_eq!(get(&b, &format!("{kumo}/t/vision/vms")).await.0, 404);
    assert_eq!(get(&b, &format!("{kumo}/t/vision/vms/train")).await.0, 404);
    let csrf_b = csrf_of(&b, &kumo).await;
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
    let list = get(&a, &format!("{kumo}/t/vision/vms")).await.1;
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
    let csrf = csrf_of(&again, &kumo).await;
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
    // The token comes back in a form that posts it to the loopback
    // port: never in a URL (a redirect would leave it in the history).
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("location").is_none());
    assert_eq!(r.headers()["cache-control"], "no-store");
    let page = r.text().await.unwrap();
    let field = |name: &str| {
        page.split(&format!("name=\"{name}\" value=\""))
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap_or_else(|| panic!("no {name} in {page}"))
            .to_owned()
    };
    let loopback = format!("http://127.0.0.1:{}/", query["port"]);
    assert!(
        page.contains(&format!(
            "method=\"post\" action=\"{loopback}\" data-autosubmit"
        )),
        "{page}"
    );
    assert_eq!(field("state"), query["state"]);
    let token = field("token");
    assert!(token.starts_with("kumo_"));
    // The listener takes no token from a URL.
    let r = reqwest::get(format!("{loopback}?state={}&token={token}", query["state"]))
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = reqwest::Client::new()
        .post(&loopback)
        .form(&[
            ("state", query["state"].as_str()),
            ("token", token.as_str()),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let done = tokio::task::spawn_blocking(move || {
        let said: Vec<String> = lines.map_while(Result::ok).collect();
        (cli.wait().unwrap(), said)
    })
    .await
    .unwrap();
    assert!(done.0.success());
    assert!(done.1.iter().any(|l| l.contains("as aiko")), "{:?}", done.1);
    let (listed, err) = tenants_as(home.path()).await;
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
    // The host starts the browser's VM 3 s after it appears, so the page
    // first shows it not running and its script must catch up.
    let admin = s.admin.clone();
    let converging = tokio::spawn(async move {
        loop {
            let vms: kumo_api_types::Page<kumo_api_types::Vm> =
                admin.get("/api/v1/tenants/vision/vms").await.unwrap();
            if !vms.items.is_empty() {
                tokio::time::sleep(std::time::Duration::from_secs(3)).await;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        loop {
            agent.converge().await;
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    });
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/portal-screenshots");
    std::fs::create_dir_all(&out).unwrap();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("oidc");
    let (kumo2, out2, admin_token) = (kumo.clone(), out.clone(), s.admin_token.clone());
    let seen = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .arg(dir.join("browser.mjs"))
            .args([&kumo2, "University uni-a", "aiko", "vision", "ja-JP"])
            .arg(&out2)
            .arg(&admin_token)
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
    assert_eq!(
        seen["filter_visible"], 1,
        "the chooser's script ran: {seen}"
    );
    assert_eq!(seen["dashboard_lang"], "ja", "{seen}");
    assert_eq!(seen["dashboard_has_tenant"], true, "{seen}");
    assert_ne!(seen["state_at_load"], "running", "{seen}");
    assert_eq!(seen["vm_state"], "running", "{seen}");
    assert_eq!(
        (seen["gpu_boxes"].as_u64(), seen["nic_boxes"].as_u64()),
        (Some(8), Some(0)),
        "no NIC off RoCE"
    );
    assert_eq!(seen["billing_bars"], 30, "{seen}");
    assert_eq!(seen["segment_listed"], true, "{seen}");
    assert_eq!(seen["heatmap_gpus"], 8, "{seen}");
    assert_eq!(seen["matrix"], true, "{seen}");
    assert_eq!(
        seen["host_vm"], true,
        "the host's allocations by VM: {seen}"
    );
    for shot in [
        "login.png",
        "dashboard.png",
        "vm.png",
        "vms.png",
        "billing.png",
        "segments.png",
        "tokens.png",
        "admin-hosts.png",
        "admin-host.png",
    ] {
        let len = std::fs::metadata(out.join(shot))
            .map(|m| m.len())
            .unwrap_or(0);
        assert!(len > 10_000, "{shot}: {len} bytes");
    }
}

/// Signs `login` in at `provider` in a fresh browser.
async fn signed_in(w: &World, provider: &str, issuer: &str, login: &str) -> reqwest::Client {
    let c = browser();
    let back = through_provider(&c, &w.kumo, provider, issuer, login).await;
    let r = c.get(&back).send().await.unwrap();
    assert_eq!(r.status(), 302, "{:?}", r.text().await);
    c
}

async fn csrf_of(c: &reqwest::Client, kumo: &str) -> String {
    session(c, kumo).await.1["csrf"]
        .as_str()
        .expect("a session")
        .to_owned()
}

async fn get(c: &reqwest::Client, url: &str) -> (u16, String) {
    let r = c.get(url).send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn post(c: &reqwest::Client, url: &str, form: &[(&str, &str)]) -> (u16, String, String) {
    let r = c.post(url).form(form).send().await.unwrap();
    let loc = r
        .headers()
        .get(LOCATION)
        .map(|l| l.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (r.status().as_u16(), loc, r.text().await.unwrap())
}

/// The listing pages (segments, clusters, members, tokens, and the
/// admin's hosts, projects, rates, join tokens) do what the API does for
/// the session's user: forms create and delete, refusals come back with
/// the API's reason, a foreign project is a 404 in every page and form,
/// admin pages are for administrators (who sign in with an API token),
/// and the live-state feed follows the VMs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portal_pages_act_through_the_api() {
    let w = world().await;
    let (s, kumo) = (&w.s, w.kumo.clone());
    let u = |p: &str| format!("{kumo}{p}");
    let a = signed_in(&w, "uni-a", &w.ia, "aiko").await;
    let b = signed_in(&w, "uni-b", &w.ib, "bob").await;
    s.tenant("vision").await;
    s.add("vision", "aiko", kumo_api_types::Role::Owner).await;
    let (ca, cb) = (csrf_of(&a, &kumo).await, csrf_of(&b, &kumo).await);

    // Segments from the form, with ingress rules in the CLI's short form.
    let (status, to, _) = post(
        &a,
        &u("/t/vision/segments"),
        &[
            ("csrf", &ca),
            ("name", "lan"),
            ("kind", "ethernet"),
            ("cidr", "10.5.0.0/24"),
            ("mtu", ""),
            ("ingress", "tcp:22:0.0.0.0/0\r\nicmp:10.0.0.0/8"),
        ],
    )
    .await;
    assert_eq!((status, to.as_str()), (303, "/t/vision/segments"));
    let seg: kumo_api_types::Segment = s
        .admin
        .get("/api/v1/tenants/vision/segments/lan")
        .await
        .unwrap();
    assert_eq!(seg.ingress.len(), 2);
    // The audit log records the browser's address and a request id the
    // server made, not a placeholder.
    let entry = &s.admin.audit(Some("vision"), 1).await.unwrap()[0];
    assert_eq!(
        (entry.action.as_str(), entry.actor.as_str()),
        ("segment.create", "aiko")
    );
    assert_eq!(entry.source_ip, "127.0.0.1");
    assert!(
        uuid::Uuid::parse_str(&entry.request_id).is_ok(),
        "{entry:?}"
    );
    let (status, page) = get(&a, &u("/t/vision/segments")).await;
    assert_eq!(status, 200);
    assert!(
        page.contains("10.5.0.0/24") && page.contains("tcp:22:0.0.0.0/0 icmp:10.0.0.0/8"),
        "{page}"
    );
    assert!(
        page.contains("href=\"/t/vision/clusters\""),
        "project navigation"
    );
    assert!(!page.contains("/admin/hosts"), "no admin pages for aiko");
    let (status, _, page) = post(
        &a,
        &u("/t/vision/segments"),
        &[("csrf", &ca), ("name", "bad"), ("cidr", "10.5.0.0/33")],
    )
    .await;
    assert_eq!(status, 400, "{page}");
    assert!(
        page.contains("class=\"error\"") && page.contains(r#"id="f0-cidr-error""#),
        "the refusal in the CIDR row: {page}"
    );
    assert!(
        page.contains(r#"name="cidr" value="10.5.0.0/33""#)
            && page.contains(r#"name="name" value="bad""#),
        "what was entered is kept: {page}"
    );
    let (status, _, page) = post(
        &a,
        &u("/t/vision/segments"),
        &[
            ("csrf", &ca),
            ("name", "bad"),
            ("cidr", "10.6.0.0/24"),
            ("ingress", "ssh:22:0.0.0.0/0"),
        ],
    )
    .await;
    assert_eq!(status, 400);
    assert!(page.contains("PROTO[:PORTS]:SOURCE"), "{page}");
    let (status, ..) = post(
        &a,
        &u("/t/vision/segments"),
        &[("csrf", "forged"), ("name", "x")],
    )
    .await;
    assert_eq!(status, 403, "a forged CSRF token");

    // Clusters: one 8-GPU member on the one host, then deleted.
    let mut agent = s.sim_agent("gpu-001", "hgx-h100").await;
    let (status, to, page) = post(
        &a,
        &u("/t/vision/clusters"),
        &[
            ("csrf", &ca),
            ("name", "train"),
            ("size", "1"),
            ("gpus", "8"),
        ],
    )
    .await;
    assert_eq!((status, to.as_str()), (303, "/t/vision/clusters"), "{page}");
    agent.converge().await;
    let (_, page) = get(&a, &u("/t/vision/clusters")).await;
    assert!(page.contains("train-0 running gpu-001"), "{page}");
    // The live feed, in the page's language; nothing without a session.
    let live: Value = a
        .get(u("/t/vision/vms/live"))
        .header("accept-language", "ja")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(live[0]["name"], "train-0");
    assert_eq!(live[0]["state"], "running");
    assert_eq!(live[0]["label"], "実行中");
    assert_eq!(get(&browser(), &u("/t/vision/vms/live")).await.0, 401);
    let (status, js) = get(&a, &u("/static/portal.js")).await;
    assert!(status == 200 && js.contains("dataset.state"), "{js}");

    // Another institution's user: every page and form of the project is a 404.
    for p in ["segments", "clusters", "members", "vms/live"] {
        assert_eq!(get(&b, &u(&format!("/t/vision/{p}"))).await.0, 404, "{p}");
    }
    for (p, form) in [
        (
            "/t/vision/segments",
            vec![
                ("csrf", cb.as_str()),
                ("name", "x"),
                ("cidr", "10.9.0.0/24"),
            ],
        ),
        // An empty required field is judged only after the project is
        // found to be hers: still a 404, not a 400 naming the field.
        (
            "/t/vision/segments",
            vec![("csrf", cb.as_str()), ("name", "")],
        ),
        ("/t/vision/vms", vec![("csrf", cb.as_str()), ("name", "")]),
        ("/t/vision/segments/lan/delete", vec![("csrf", cb.as_str())]),
        (
            "/t/vision/clusters/train/delete",
            vec![("csrf", cb.as_str())],
        ),
        (
            "/t/vision/members",
            vec![("csrf", cb.as_str()), ("user", "bob"), ("role", "owner")],
        ),
    ] {
        assert_eq!(post(&b, &u(p), &form).await.0, 404, "{p}");
    }
    // Members: bob joins as a viewer; he sees, and may not change.
    let (status, ..) = post(
        &a,
        &u("/t/vision/members"),
        &[("csrf", &ca), ("user", "bob"), ("role", "viewer")],
    )
    .await;
    assert_eq!(status, 303);
    let (status, page) = get(&b, &u("/t/vision/members")).await;
    assert_eq!(status, 200);
    assert!(page.contains("<td>bob</td><td>viewer</td>"), "{page}");
    let (status, _, page) = post(&b, &u("/t/vision/segments/lan/delete"), &[("csrf", &cb)]).await;
    assert_eq!(status, 403, "{page}");
    assert!(page.contains("class=\"error\""));
    let (status, ..) = post(&a, &u("/t/vision/clusters/train/delete"), &[("csrf", &ca)]).await;
    assert_eq!(status, 303);
    agent.converge().await;
    let gone = s
        .admin
        .get::<kumo_api_types::Cluster>("/api/v1/tenants/vision/clusters/train")
        .await;
    assert!(
        gone.as_ref().map_or(true, |c| c
            .members
            .iter()
            .all(|m| m.state != kumo_api_types::VmState::Running)),
        "{gone:?}"
    );

    // API tokens: the secret shown once, usable, then revoked.
    let (status, _, page) = post(
        &a,
        &u("/tokens"),
        &[("csrf", &ca), ("description", "laptop"), ("days", "30")],
    )
    .await;
    assert_eq!(status, 200);
    let token = page
        .split("<code>")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .unwrap()
        .to_owned();
    assert!(token.starts_with("kumo_"), "{page}");
    let me = |t: String| {
        let url = u("/api/v1/users/me");
        async move {
            reqwest::Client::new()
                .get(url)
                .bearer_auth(t)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(me(token.clone()).await, 200);
    let (_, page) = get(&a, &u("/tokens")).await;
    assert!(page.contains("<td>laptop</td>"));
    let id = page
        .split("action=\"/tokens/")
        .nth(1)
        .and_then(|t| t.split('/').next())
        .unwrap()
        .to_owned();
    let (status, ..) = post(&a, &u(&format!("/tokens/{id}/revoke")), &[("csrf", &ca)]).await;
    assert_eq!(status, 303);
    assert_eq!(me(token).await, 401);
    assert_eq!(
        post(&b, &u(&format!("/tokens/{id}/revoke")), &[("csrf", &cb)])
            .await
            .0,
        404,
        "someone else's token"
    );

    // Admin pages: refused to aiko; an administrator signs in with a token.
    for p in [
        "/admin/hosts",
        "/admin/tenants",
        "/admin/rates",
        "/admin/join-tokens",
    ] {
        assert_eq!(get(&a, &u(p)).await.0, 403, "{p}");
    }
    let adm = browser();
    // The token form carries the login page's CSRF token (double-submitted).
    let (_, login) = get(&adm, &u("/login")).await;
    let lcsrf = crate::harness::csrf_of(&login);
    let (status, ..) = post(
        &browser(),
        &u("/auth/token"),
        &[("token", &s.admin_token), ("csrf", &lcsrf)],
    )
    .await;
    assert_eq!(status, 403, "a form posted from elsewhere: no CSRF cookie");
    let (status, ..) = post(
        &adm,
        &u("/auth/token"),
        &[("token", &s.admin_token), ("csrf", "forged")],
    )
    .await;
    assert_eq!(status, 403, "a forged CSRF token");
    let (status, ..) = post(
        &adm,
        &u("/auth/token"),
        &[("token", "kumo_not-a-token"), ("csrf", &lcsrf)],
    )
    .await;
    assert_eq!(status, 401);
    // A tab is dropped by browsers, so `/\t/evil.example/x` would read as
    // `//evil.example/x`, another site: sign-in ends at `/` instead.
    let (status, to, _) = post(
        &adm,
        &u("/auth/token"),
        &[
            ("token", &s.admin_token),
            ("csrf", &lcsrf),
            ("next", "/\t/evil.example/x"),
        ],
    )
    .await;
    assert_eq!((status, to.as_str()), (302, "/"), "a tab-smuggled next");
    let (status, to, _) = post(
        &adm,
        &u("/auth/token"),
        &[
            ("token", &s.admin_token),
            ("csrf", &lcsrf),
            ("next", "/admin/hosts"),
        ],
    )
    .await;
    assert_eq!((status, to.as_str()), (302, "/admin/hosts"));
    // A session opened with a token ends with it: revoked, the browser is
    // signed out at its next page.
    let minted: kumo_api_types::TokenCreated = s
        .admin
        .post(
            "/api/v1/tokens",
            &serde_json::json!({"description": "for one browser"}),
        )
        .await
        .unwrap();
    let tb = browser();
    let (_, login) = get(&tb, &u("/login")).await;
    let tcsrf = crate::harness::csrf_of(&login);
    let (status, ..) = post(
        &tb,
        &u("/auth/token"),
        &[("token", &minted.token), ("csrf", &tcsrf)],
    )
    .await;
    assert_eq!(status, 302);
    assert_eq!(get(&tb, &u("/admin/hosts")).await.0, 200);
    s.admin.revoke_token(&minted.id.to_string()).await.unwrap();
    let r = tb.get(u("/admin/hosts")).send().await.unwrap();
    assert_ne!(r.status().as_u16(), 200, "the session outlived its token");
    assert!(location(&r).starts_with("/login"), "{}", location(&r));
    // Every page forbids framing and inline script; pages are not cached.
    let r = adm.get(u("/tokens")).send().await.unwrap();
    let csp = r.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        csp.contains("frame-ancestors 'none'") && csp.contains("script-src 'self'"),
        "{csp}"
    );
    assert!(
        csp.contains("script-src 'self';"),
        "no inline script allowed: {csp}"
    );
    assert_eq!(r.headers()["x-frame-options"], "DENY");
    assert_eq!(r.headers()["cache-control"], "no-store");
    assert_eq!(r.headers()["referrer-policy"], "same-origin");
    let login = browser()
        .get(u("/login"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        !login.contains("<script>"),
        "no inline script on the chooser"
    );
    let cadm = csrf_of(&adm, &kumo).await;
    let (status, page) = get(&adm, &u("/admin/hosts")).await;
    assert_eq!(status, 200);
    assert_eq!(page.matches("class=\"gpu free\"").count(), 8, "{page}");
    assert!(page.contains("href=\"/admin/hosts/gpu-001\""));
    let (_, page) = get(&adm, &u("/admin/hosts/gpu-001")).await;
    assert!(
        page.contains("<pre tabindex=\"0\">") && page.contains("GPU7"),
        "the matrix: {page}"
    );
    let (status, ..) = post(
        &adm,
        &u("/admin/tenants"),
        &[
            ("csrf", &cadm),
            ("name", "newlab"),
            ("display_name", "New Lab"),
        ],
    )
    .await;
    assert_eq!(status, 303);
    assert!(get(&adm, &u("/admin/tenants")).await.1.contains("New Lab"));
    let (status, ..) = post(
        &adm,
        &u("/admin/rates"),
        &[
            ("csrf", &cadm),
            ("class", "vcpu"),
            ("guaranteed", "10"),
            ("spot", "3"),
        ],
    )
    .await;
    assert_eq!(status, 303);
    let rates: kumo_api_types::Rates = s.admin.get("/api/v1/rates").await.unwrap();
    assert_eq!(rates.current.unwrap().prices["vcpu"].spot, "3");
    let (status, _, page) = post(
        &adm,
        &u("/admin/join-tokens"),
        &[("csrf", &cadm), ("description", "rack 7"), ("ttl", "600")],
    )
    .await;
    assert_eq!(status, 200);
    assert!(page.contains("<code>kumoj_"), "{page}");
    drop(agent);
}

/// A provider's answer to the browser: where its pages lead, followed
/// until it either sends the browser back to Kumo or shows a login form.
async fn provider_asks_to_log_in(c: &reqwest::Client, kumo: &str, issuer: &str) -> bool {
    let r = c
        .get(format!("{kumo}/auth/login/uni-a"))
        .send()
        .await
        .unwrap();
    let mut url = location(&r);
    for _ in 0..10 {
        let r = c.get(&url).send().await.unwrap();
        if !r.status().is_redirection() {
            return r.text().await.unwrap().contains("name=\"login\"");
        }
        url = absolute(issuer, &location(&r));
        if url.starts_with(kumo) {
            return false;
        }
    }
    panic!("the provider kept redirecting")
}

/// Sessions end after 8 idle hours and 7 days in all (on an injected
/// clock); logout ends the provider's session too (RP-initiated logout);
/// and a provider that rotates its signing key still logs users in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_end_and_providers_rotate_keys() {
    use chrono::Duration;
    let clock = kumo_server::clock::Clock::manual(chrono::Utc::now());
    let mut w = world_with(|c| c.clock = clock.clone()).await;
    let kumo = w.kumo.clone();
    let ia = w.ia.clone();

    // Idle: seven hours apart keeps a session alive; eight idle end it.
    let a = signed_in(&w, "uni-a", &ia, "aiko").await;
    for _ in 0..3 {
        clock.advance(Duration::hours(7));
        assert_eq!(session(&a, &kumo).await.0, 200);
    }
    clock.advance(Duration::hours(8) + Duration::seconds(1));
    assert_eq!(session(&a, &kumo).await.0, 401);
    assert_eq!(
        get(&a, &format!("{kumo}/")).await.0,
        303,
        "back to the chooser"
    );
    // Absolute: in use every 7 hours, it still ends after 7 days.
    let a = signed_in(&w, "uni-a", &ia, "aiko").await;
    for _ in 0..24 {
        clock.advance(Duration::hours(7));
        assert_eq!(session(&a, &kumo).await.0, 200);
    }
    clock.advance(Duration::hours(1));
    assert_eq!(session(&a, &kumo).await.0, 401);

    // RP-initiated logout: Kumo's session ends, then the provider's.
    let a = signed_in(&w, "uni-a", &ia, "aiko").await;
    assert!(
        !provider_asks_to_log_in(&a, &kumo, &ia).await,
        "signed in at the provider"
    );
    let csrf = csrf_of(&a, &kumo).await;
    let (status, to, _) = post(&a, &format!("{kumo}/auth/logout"), &[("csrf", &csrf)]).await;
    assert_eq!(status, 302);
    assert!(to.starts_with(&format!("{ia}/session/end?")), "{to}");
    let back = format!("{kumo}/login");
    let encoded = back.replace(':', "%3A").replace('/', "%2F");
    assert!(
        to.contains("id_token_hint=")
            && to.contains(&format!("post_logout_redirect_uri={encoded}")),
        "{to}"
    );
    assert_eq!(session(&a, &kumo).await.0, 401);
    let (status, confirm) = get(&a, &to).await;
    assert_eq!(status, 200);
    let xsrf = confirm
        .split("name=\"xsrf\" value=\"")
        .nth(1)
        .and_then(|v| v.split('"').next())
        .unwrap_or_else(|| panic!("{confirm}"))
        .to_owned();
    let (status, to, _) = post(
        &a,
        &format!("{ia}/session/end/confirm"),
        &[("xsrf", &xsrf), ("logout", "yes")],
    )
    .await;
    assert!((300..400).contains(&status), "{status}");
    assert_eq!(to, back);
    assert!(
        provider_asks_to_log_in(&a, &kumo, &ia).await,
        "signed out at the provider too"
    );

    // Key rotation: the provider restarts with a new signing key; the
    // server's cached keys fail, are fetched again, and login works.
    let kid = |jwks: Value| jwks["keys"][0]["kid"].as_str().unwrap().to_owned();
    let before = kid(reqwest::get(format!("{ia}/jwks"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap());
    let _ = w.providers.0.kill();
    let _ = w.providers.0.wait();
    w.providers = providers(w.pa, w.pb, &format!("{kumo}/auth/callback"));
    let after = kid(reqwest::get(format!("{ia}/jwks"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap());
    assert_ne!(before, after, "a new key");
    let c = signed_in(&w, "uni-a", &ia, "aiko").await;
    assert_eq!(session(&c, &kumo).await.1["user"], "aiko");
}

/// `kumo login --device`: the command shows a code, the user enters it at
/// the provider (on "another device": a separate HTTP client), logs in
/// and consents; the command gets a token of its own. Aborting at the
/// provider fails the command with the provider's word; a provider
/// without the grant is refused with a clear message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_login_from_the_cli() {
    let w = world().await;
    let (s, kumo, ia) = (&w.s, w.kumo.clone(), w.ia.clone());
    s.tenant("vision").await;
    // The user exists after a first login; then an owner adds them.
    signed_in(&w, "uni-a", &ia, "aiko").await;
    s.add("vision", "aiko", kumo_api_types::Role::Member).await;

    let start = |provider: &str| {
        let home = tempfile::tempdir().unwrap();
        let mut cli = Command::new(crate::harness::bin("kumo"))
            .args([
                "login",
                "--server",
                &kumo,
                "--device",
                "--provider",
                provider,
            ])
            .env("HOME", home.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines =
            std::io::BufRead::lines(std::io::BufReader::new(cli.stdout.take().unwrap()));
        let mut said = Vec::new();
        let mut code = None;
        while code.is_none() {
            let Some(Ok(l)) = lines.next() else { break };
            code = l
                .split_once("enter the code")
                .map(|(_, c)| c.trim().to_owned());
            said.push(l);
        }
        (home, cli, lines, code, said)
    };

    // At the provider, on another device: enter the code, confirm, log
    // in, consent (or abort at the confirmation).
    let enter = |code: String, abort: bool| {
        let ia = ia.clone();
        async move {
            let dev = browser();
            let page = dev.get(format!("{ia}/device")).send().await.unwrap();
            let page = page.text().await.unwrap();
            let xsrf = page
                .split("name=\"xsrf\" value=\"")
                .nth(1)
                .and_then(|v| v.split('"').next())
                .unwrap_or_else(|| panic!("{page}"))
                .to_owned();
            let confirm = dev
                .post(format!("{ia}/device"))
                .form(&[("xsrf", xsrf.as_str()), ("user_code", &code)])
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            assert!(confirm.contains("Confirm Device"), "{confirm}");
            let answer = if abort {
                ("abort", "yes")
            } else {
                ("confirm", "yes")
            };
            let mut r = dev
                .post(format!("{ia}/device"))
                .form(&[("xsrf", xsrf.as_str()), ("user_code", &code), answer])
                .send()
                .await
                .unwrap();
            for _ in 0..10 {
                if r.status().is_redirection() {
                    let next = absolute(&ia, &location(&r));
                    r = dev.get(&next).send().await.unwrap();
                    continue;
                }
                let url = r.url().to_string();
                let page = r.text().await.unwrap();
                if !page.contains("name=\"prompt\"") {
                    return page;
                }
                let prompt = if page.contains("name=\"login\"") {
                    "login"
                } else {
                    "consent"
                };
                r = dev
                    .post(&url)
                    .form(&[("prompt", prompt), ("login", "aiko"), ("password", "any")])
                    .send()
                    .await
                    .unwrap();
            }
            panic!("the provider's device pages never finished")
        }
    };

    let (home, cli, lines, code, said) = start("uni-a");
    let code = code.unwrap_or_else(|| panic!("no code shown: {said:?}"));
    let done = enter(code, false).await;
    assert!(done.contains("Sign-in Success"), "{done}");
    let (status, rest) = tokio::task::spawn_blocking(move || {
        let mut cli = cli;
        let rest: Vec<String> = lines.map_while(Result::ok).collect();
        (cli.wait().unwrap(), rest)
    })
    .await
    .unwrap();
    assert!(status.success(), "{rest:?}");
    assert!(
        rest.iter().any(|l| l.contains("Signed in as aiko")),
        "{rest:?}"
    );
    // The stored token works, as aiko, for aiko's projects only.
    let (listed, err) = tenants_as(home.path()).await;
    assert!(listed.contains("vision"), "{err}");

    // Aborted at the provider: the command fails with its word.
    let (_home, cli, _lines, code, said) = start("uni-a");
    let code = code.unwrap_or_else(|| panic!("no code shown: {said:?}"));
    enter(code, true).await;
    let out = tokio::task::spawn_blocking(move || cli.wait_with_output().unwrap())
        .await
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("access_denied"), "{err}");

    // Institution B offers no device grant.
    let (_home, cli, _lines, code, _) = start("uni-b");
    assert!(code.is_none());
    let out = tokio::task::spawn_blocking(move || cli.wait_with_output().unwrap())
        .await
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("does not offer the device authorization grant"),
        "{err}"
    );
}
