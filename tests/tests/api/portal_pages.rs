//! Every portal page in a real browser (Debian's Chromium through
//! `playwright-core`, `tests/oidc/pages.mjs`), in Japanese and English, at
//! desktop width and at 390 px: axe-core finds no serious or critical
//! violation, no page is wider than a phone's window, the first Tab stop
//! shows where the focus is, and a screenshot of each is kept in
//! `target/portal-screenshots/pages/` to be looked at.

use std::process::Command;

use kumo_api_types::ServiceLevel;
use serde_json::Value;

use crate::harness::{Backend, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_passes_axe_in_both_languages_and_at_phone_width() {
    assert!(
        std::path::Path::new("/usr/bin/chromium").exists(),
        "Debian's chromium is required (the README's test command installs it)"
    );
    let s = TestServer::start(Backend::Sqlite).await;
    s.tenant("lab").await;
    let mut agent = s.sim_agent("gpu-001", "hgx-h100").await;
    let _: Value = s
        .admin
        .post(
            "/api/v1/tenants/lab/segments",
            &serde_json::json!({"name": "lab-net", "kind": "ethernet", "cidr": "10.1.0.0/24"}),
        )
        .await
        .unwrap();
    for (name, gpus) in [("train", 2), ("notebook", 0)] {
        let _: Value = s
            .admin
            .post(
                "/api/v1/tenants/lab/vms",
                &crate::device_health::vm(name, gpus, ServiceLevel::Guaranteed),
            )
            .await
            .unwrap();
    }
    for _ in 0..3 {
        agent.converge().await;
    }
    let _: Value = s
        .admin
        .post(
            "/api/v1/tenants/lab/vms/notebook/stop",
            &serde_json::json!({}),
        )
        .await
        .unwrap();
    for _ in 0..3 {
        agent.converge().await;
    }
    // A project share, made by the host and mounted in a VM (the shares
    // page's table and grow form, the VM page's shares).
    assert!(agent.heartbeat_with_shares().await.is_success());
    let _: Value = s
        .admin
        .post(
            "/api/v1/tenants/lab/shares",
            &serde_json::json!({"name": "datasets", "size_gib": 10}),
        )
        .await
        .unwrap();
    agent.converge().await;
    let _: Value = s
        .admin
        .post(
            "/api/v1/tenants/lab/vms/train/shares",
            &serde_json::json!({"share": "datasets", "path": "/data", "read_only": true}),
        )
        .await
        .unwrap();
    let pages = serde_json::json!([
        ["dashboard", "/"],
        ["vms", "/t/lab/vms"],
        ["vm", "/t/lab/vms/train"],
        ["vm-stopped", "/t/lab/vms/notebook"],
        ["billing", "/t/lab/billing"],
        ["clusters", "/t/lab/clusters"],
        ["segments", "/t/lab/segments"],
        ["volumes", "/t/lab/volumes"],
        ["shares", "/t/lab/shares"],
        ["members", "/t/lab/members"],
        ["tokens", "/tokens"],
        ["admin-hosts", "/admin/hosts"],
        ["admin-host", "/admin/hosts/gpu-001"],
        ["admin-tenants", "/admin/tenants"],
        ["admin-rates", "/admin/rates"],
        ["admin-join-tokens", "/admin/join-tokens"],
        ["admin-devices", "/admin/devices"],
        // Refused forms: the API's field error beside its field, and every
        // empty required field at once (the portal's own check).
        ["vms-refused", "/t/lab/vms", {"name": "Bad_Name"}],
        ["segments-refused", "/t/lab/segments", {"name": "", "cidr": "", "mtu": "1400"}],
    ]);
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("oidc");
    crate::sso::install_node_modules(&dir);
    let out =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/portal-screenshots/pages");
    std::fs::create_dir_all(&out).unwrap();
    let (url, token, out2, pages2) = (
        s.url.clone(),
        s.admin_token.clone(),
        out.clone(),
        pages.to_string(),
    );
    // The agent keeps reporting while the browser looks.
    let keep = tokio::spawn(async move {
        loop {
            agent.converge().await;
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
    });
    let ran = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .arg(dir.join("pages.mjs"))
            .args([&url, &token])
            .arg(&out2)
            .arg(&pages2)
            .env("KUMO_KEYBOARD_VMS", "/t/lab/vms")
            .current_dir(&dir)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    keep.abort();
    let text = String::from_utf8_lossy(&ran.stdout);
    let report: Value = serde_json::from_str(text.trim())
        .unwrap_or_else(|_| panic!("browser: {text} {}", String::from_utf8_lossy(&ran.stderr)));
    assert_eq!(report["error"], Value::Null, "{report}");
    let seen = report["pages"].as_array().unwrap();
    assert_eq!(
        seen.len(),
        pages.as_array().unwrap().len() * 4,
        "every page, 2 languages, 2 widths"
    );
    let mut problems = Vec::new();
    for p in seen {
        let at = format!("{} ({}, {} px)", p["path"], p["lang"], p["width"]);
        // A refused form is answered with the API's status (checked below).
        if p["status"] != 200 && p["filled"] != true {
            problems.push(format!("{at}: HTTP {}", p["status"]));
        }
        if p["html_lang"] != p["lang"] {
            problems.push(format!("{at}: <html lang={}>", p["html_lang"]));
        }
        for v in p["axe"].as_array().unwrap() {
            if matches!(v["impact"].as_str(), Some("serious" | "critical")) {
                problems.push(format!(
                    "{at}: axe {} ({}): {} at {}",
                    v["id"], v["impact"], v["help"], v["nodes"]
                ));
            }
        }
        problems.extend(form_rows(&at, p));
        if p["overflow"].as_f64().unwrap_or(0.0) > 1.0 {
            problems.push(format!("{at}: {} px wider than the window", p["overflow"]));
        }
        if p["focus"]["visible"] != true {
            problems.push(format!(
                "{at}: the first Tab stop ({}) shows no focus",
                p["focus"]["tag"]
            ));
        }
        assert!(
            out.join(p["shot"].as_str().unwrap()).is_file(),
            "{at}: screenshot"
        );
    }
    // The refused forms came back refused, each error in its field's row,
    // flagged for screen readers and linked from the top.
    for p in seen.iter().filter(|p| p["filled"] == true) {
        let at = format!("{} ({}, {} px)", p["path"], p["lang"], p["width"]);
        let errors: Vec<(&str, &str)> = p["rows"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["error"].is_string())
            .map(|r| (r["name"].as_str().unwrap(), r["error"].as_str().unwrap()))
            .collect();
        let names: Vec<&str> = errors.iter().map(|e| e.0).collect();
        let value = |name: &str| {
            p["rows"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["name"] == name)
                .map(|r| r["value"].clone())
        };
        let summary: Vec<&str> = p["summary"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(p["status"], 400, "{at}");
        if p["path"] == "/t/lab/vms" {
            assert_eq!(names, ["name"], "{at}: {errors:?}");
            assert!(
                errors[0].1.contains("[a-z]") || errors[0].1.contains("英小文字"),
                "{at}: {errors:?}"
            );
            assert_eq!(summary, ["#vm-name"], "{at}");
            assert_eq!(value("name"), Some(Value::from("Bad_Name")), "{at}: kept");
        } else {
            assert_eq!(names, ["name", "cidr"], "{at}: {errors:?}");
            let required = if p["lang"] == "ja" {
                "入力してください"
            } else {
                "Enter a value"
            };
            assert!(errors.iter().all(|e| e.1 == required), "{at}: {errors:?}");
            assert_eq!(summary, ["#f0-name", "#f0-cidr"], "{at}");
            assert_eq!(value("mtu"), Some(Value::from("1400")), "{at}: kept");
        }
    }
    assert!(
        problems.is_empty(),
        "{} problems:\n{}",
        problems.len(),
        problems.join("\n")
    );
    s.stop().await;
}

/// A page's form rows: on a wide window label, field and help/error start
/// on one line; on a phone they stack in that order; help and error are
/// tied to the field (`aria-describedby` names elements that exist, and an
/// error marks it invalid); only a refused form shows errors; the VM form
/// says what to enter in every row.
fn form_rows(at: &str, p: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let wide = p["width"].as_u64().unwrap_or(0) > 600;
    for r in p["rows"].as_array().into_iter().flatten() {
        let name = &r["name"];
        let top = |k: &str| r[k]["top"].as_f64().unwrap_or(f64::NAN);
        let bottom = |k: &str| r[k]["bottom"].as_f64().unwrap_or(f64::NAN);
        let lined_up = if wide {
            (top("label") - top("field")).abs() < 1.0 && (top("label") - top("aside")).abs() < 1.0
        } else {
            bottom("label") <= top("field") + 1.0 && bottom("field") <= top("aside") + 1.0
        };
        if !lined_up {
            problems.push(format!("{at}: form row {name} is out of line: {r}"));
        }
        let has_error = r["error"].is_string();
        let expected = usize::from(r["has_help"] == true) + usize::from(has_error);
        if r["described"].as_u64() != Some(expected as u64) || r["invalid"] != has_error {
            problems.push(format!(
                "{at}: form row {name}: help/error not tied to the field: {r}"
            ));
        }
        if has_error && p["filled"] != true {
            problems.push(format!("{at}: form row {name} shows an error unasked"));
        }
        if p["path"] == "/t/lab/vms" && r["has_help"] != true {
            problems.push(format!("{at}: the VM form's {name} has no help"));
        }
    }
    problems
}
