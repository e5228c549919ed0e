//! The API under schemathesis (from PyPI, installed into a virtual
//! environment under `target/` by the first run): every operation of
//! `/api/v1/openapi.json`, generated from the schema (fuzzing and stateful
//! phases, links inferred from it), once with an administrator's token and
//! once with the token of a user of another tenant. Zero server errors,
//! zero answers outside the document (status, content type, schema,
//! headers), authentication enforced where the document asks for it, and
//! — our own check, `tests/schemathesis/kumo_checks.py` — not one answer to
//! the outsider naming the tenant it does not belong to.

use std::path::{Path, PathBuf};
use std::process::Command;

use kumo_api_types::Role;
use serde_json::json;

use crate::harness::{Backend, TestServer};

/// The checks every answer must pass.
const CHECKS: &str = "not_a_server_error,status_code_conformance,content_type_conformance,\
response_schema_conformance,response_headers_conformance,missing_required_header,\
no_foreign_data";

/// schemathesis in a virtual environment of its own, made once.
fn schemathesis() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/schemathesis-venv");
    let st = root.join("bin/schemathesis");
    if !st.exists() {
        let out = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&root)
            .output()
            .unwrap_or_else(|e| panic!("python3 is required for the API fuzz test: {e}"));
        assert!(
            out.status.success(),
            "python3 -m venv: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = Command::new(root.join("bin/pip"))
            .args(["install", "-q", "schemathesis==4.32.5"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pip install schemathesis: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    st
}

fn run(st: &Path, url: &str, token: &str, markers: &str) -> (bool, String) {
    let hooks = Path::new(env!("CARGO_MANIFEST_DIR")).join("schemathesis");
    let out = Command::new(st)
        .args(["run", &format!("{url}/api/v1/openapi.json")])
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .args(["--checks", CHECKS])
        // One worker: hypothesis describing strategies from several threads
        // at once trips over CPython 3.11's AST recursion counter (a tool
        // error, "AST constructor recursion depth mismatch", not an API one).
        .args(["--max-examples", "15", "--workers", "1", "--seed", "1"])
        // Health checks judge the generator, not the API.
        .args(["--suppress-health-check", "all"])
        .current_dir(&hooks)
        .env("SCHEMATHESIS_HOOKS", "kumo_checks")
        .env("PYTHONPATH", &hooks)
        .env("KUMO_FOREIGN_MARKERS", markers)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_no_errors_and_no_foreign_data() {
    let st = tokio::task::spawn_blocking(schemathesis).await.unwrap();
    let s = TestServer::start(Backend::Sqlite).await;
    // The secret tenant, with a VM, a segment and points.
    s.tenant("secret-lab").await;
    let mut agent = s.sim_agent("gpu-001", "hgx-h100").await;
    let vm: kumo_api_types::Vm = s
        .admin
        .post(
            "/api/v1/tenants/secret-lab/vms",
            &json!({"name": "secret-vm", "gpus": 8}),
        )
        .await
        .unwrap();
    agent.converge().await;
    let seg: kumo_api_types::Segment = s
        .admin
        .post(
            "/api/v1/tenants/secret-lab/segments",
            &json!({"name": "secret-net", "kind": "ethernet", "cidr": "10.42.0.0/24"}),
        )
        .await
        .unwrap();
    // The outsider: owner of another tenant.
    s.tenant("other").await;
    let (_, outsider) = s.user("outsider").await;
    s.add("other", "outsider", Role::Owner).await;
    let markers = format!("secret-lab,secret-vm,secret-net,{},{}", vm.id, seg.id);

    let (url, admin) = (s.url.clone(), s.admin_token.clone());
    let (st2, url2, markers2) = (st.clone(), url.clone(), markers.clone());
    let (ok, report) = tokio::task::spawn_blocking(move || run(&st2, &url2, &outsider, &markers2))
        .await
        .unwrap();
    assert!(ok, "as an outsider:\n{report}");
    // The administrator sees everything; the foreign-data check is moot.
    let (ok, report) = tokio::task::spawn_blocking(move || run(&st, &url, &admin, ""))
        .await
        .unwrap();
    assert!(ok, "as the administrator:\n{report}");
    let generated: u64 = report
        .lines()
        .find(|l| l.contains(" generated, "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(generated > 500, "schemathesis hardly ran:\n{report}");
    drop(agent);
    s.stop().await;
}
