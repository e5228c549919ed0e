//! The `kumo-agent` binary on every fixture machine and on this machine's
//! own `/sys`; rendered domains checked by libvirt's schema and accepted
//! by its `test:///default` driver.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

fn agent(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kumo-agent"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(args: &[&str]) -> String {
    let out = agent(args);
    assert!(
        out.status.success(),
        "kumo-agent {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A host tool the test needs; `cargo xtask test` installs it.
fn tool(name: &str) -> &str {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false);
    assert!(found, "{name} is required (Debian: libvirt-clients, libxml2-utils); `cargo xtask test` installs it");
    name
}

fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("kumo-agent")
        .tempdir_in(if Path::new("/dev/shm").is_dir() {
            "/dev/shm"
        } else {
            "/tmp"
        })
        .unwrap()
}

#[test]
fn every_fixture_discovers_and_renders_a_domain_libvirt_accepts() {
    let dir = scratch();
    for name in [
        "dgx-a100",
        "hgx-h100",
        "hgx-h100-2nic",
        "l40s-pcie",
        "cpu-only",
    ] {
        let root = dir.path().join(name);
        let root_s = root.to_str().unwrap();
        ok(&["fixture", name, "--out", root_s]);
        let report: Value =
            serde_json::from_str(&ok(&["topology", "--sysfs-root", root_s])).unwrap();
        for key in [
            "numa_nodes",
            "gpus",
            "nics",
            "nvswitches",
            "relations",
            "pairing",
        ] {
            assert!(report.get(key).is_some(), "{name}: {key}");
        }
        let matrix = ok(&["topology", "--sysfs-root", root_s, "--format", "matrix"]);
        assert!(
            matrix.lines().next().unwrap().contains("CPU Affinity"),
            "{name}"
        );

        let gpus: Vec<String> = report["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["bdf"].as_str().unwrap().to_owned())
            .collect();
        let out = dir.path().join(format!("{name}-vm"));
        let mut args = vec![
            "render",
            "--sysfs-root",
            root_s,
            "--out",
            out.to_str().unwrap(),
            "--name",
            name,
            "--vcpus",
            "16",
            "--memory-gib",
            "64",
        ];
        let joined = gpus.join(",");
        if !gpus.is_empty() {
            args.extend(["--gpus", joined.as_str()]);
        }
        ok(&args);
        let domain = out.join("domain.xml");
        let v = Command::new(tool("virt-xml-validate"))
            .arg(&domain)
            .arg("domain")
            .output()
            .unwrap();
        assert!(
            v.status.success(),
            "{name}: {}{}",
            String::from_utf8_lossy(&v.stdout),
            String::from_utf8_lossy(&v.stderr)
        );
        let virsh = Command::new(tool("virsh"))
            .args([
                "-c",
                "test:///default",
                &format!("define {}; start {name}; domstate {name}", domain.display()),
            ])
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&virsh.stdout);
        assert!(
            virsh.status.success() && said.contains("running"),
            "{name}: {said}{}",
            String::from_utf8_lossy(&virsh.stderr)
        );
        let layout: Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("layout.json")).unwrap())
                .unwrap();
        let map = layout["bdf_map"].as_object().unwrap();
        assert!(
            gpus.iter().all(|g| map.contains_key(g)),
            "{name}: every GPU has a guest address"
        );
        let nccl = std::fs::read_to_string(out.join("nccl-topo.xml")).unwrap();
        assert!(nccl.starts_with("<system version=\"1\">"), "{name}");
    }
}

/// This machine's real sysfs, which the code was not written against:
/// every PCI function is read, nothing panics, warnings are only words.
#[test]
fn this_machines_sysfs() {
    let report: Value = serde_json::from_str(&ok(&["topology", "--sysfs-root", "/sys"])).unwrap();
    let listed = std::fs::read_dir("/sys/bus/pci/devices")
        .map(|d| d.count())
        .unwrap_or(0);
    let read = report["pci_devices"].as_array().unwrap().len();
    let skipped = report
        .get("warnings")
        .and_then(|w| w.as_array())
        .map(|w| {
            w.iter()
                .filter(|m| m.as_str().is_some_and(|m| m.contains("skipped")))
                .count()
        })
        .unwrap_or(0);
    assert!(listed > 0, "this machine has PCI devices");
    assert_eq!(
        read + skipped,
        listed,
        "every function is read or skipped with a warning"
    );
    assert!(!report["numa_nodes"].as_array().unwrap().is_empty());
    let matrix = ok(&["topology", "--sysfs-root", "/sys", "--format", "matrix"]);
    assert!(matrix.contains("CPU Affinity"));
}

#[test]
fn bad_input_is_a_clear_error() {
    let dir = scratch();
    let out = agent(&["topology", "--sysfs-root", dir.path().to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a sysfs tree"));
    let root = dir.path().join("h");
    ok(&["fixture", "hgx-h100", "--out", root.to_str().unwrap()]);
    let out = agent(&[
        "render",
        "--sysfs-root",
        root.to_str().unwrap(),
        "--gpus",
        "0000:77:00.0",
        "--out",
        dir.path().join("o").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("0000:77:00.0 is not a GPU of this host"));
    let out = agent(&[
        "render",
        "--sysfs-root",
        root.to_str().unwrap(),
        "--gpus",
        "garbage",
        "--out",
        "/tmp/x",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a PCI address"));
    let out = agent(&[
        "fixture",
        "no-such-machine",
        "--out",
        dir.path().join("n").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("known: dgx-a100"));
    // Hints that are not JSON: an error naming the file, not a panic.
    std::fs::write(root.join("kumo-hints.json"), "{nope").unwrap();
    let out = agent(&["topology", "--sysfs-root", root.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("kumo-hints.json"));
}
