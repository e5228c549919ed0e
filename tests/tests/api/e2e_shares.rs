//! Project shares end to end on QEMU (TCG): two hosts under libvirt's
//! `qemu:///system` see one shares root (a directory, as in the dev fleet:
//! `--shares-root-local`). Two guests of one project on the two hosts mount
//! one share through virtiofs (cloud-init's `mounts`, read from the seed by
//! the test guest): one writes a file, the other reads it back with the
//! same SHA-256. A guest of another project has no such filesystem. A
//! read-only mount refuses writes ("Read-only file system") even after the
//! guest remounts it read-write. Links and `..` lead nowhere outside the
//! share. Past its size on a filesystem without project quotas (this
//! machine's kernel has none: ext4 says "not built with CONFIG_QUOTA"),
//! the share turns read-only from each VM's next start, and a restarted
//! guest's write fails. `cargo xtask test` installs QEMU and libvirtd and
//! starts them.

use std::time::{Duration, Instant};

use kumo_agent::run::Agent;
use kumo_api_types::{Share, ShareState, Vm, VmState};
use serde_json::json;

use crate::e2e_qemu::{guest_dir, guest_exec, qemu_host, qga, until, Cleanup};
use crate::harness::{Backend, TestServer};

/// `sh -c script` in the guest: what it printed (standard error too) and
/// its exit status, within 30 s.
async fn sh(dom: &virt::domain::Domain, script: &str) -> Option<(String, i32)> {
    let out = guest_exec(
        dom,
        "/bin/sh",
        &["-c", &format!("( {script} ) 2>&1; echo \"rc=$?\"")],
    )
    .await?;
    let (text, rc) = out.trim_end().rsplit_once("rc=")?;
    Some((text.to_owned(), rc.trim().parse().ok()?))
}

/// Unmounts whatever the agents mounted under these directories (their
/// read-only binds), so the directories can go.
struct Unbind(Vec<std::path::PathBuf>);

impl Drop for Unbind {
    fn drop(&mut self) {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        for m in kumo_agent::shares::parse_mountinfo(&info) {
            if self.0.iter().any(|d| m.mount_point.starts_with(d)) {
                let _ = std::process::Command::new("umount")
                    .arg("-l")
                    .arg(&m.mount_point)
                    .status();
            }
        }
    }
}

async fn passes(agents: &[&Agent]) {
    for a in agents {
        a.sync_once(None).await.unwrap();
    }
}

async fn vm(s: &TestServer, tenant: &str, name: &str) -> Vm {
    s.admin
        .get(&format!("/api/v1/tenants/{tenant}/vms/{name}"))
        .await
        .unwrap()
}

async fn share(s: &TestServer, name: &str) -> Share {
    s.admin
        .get(&format!("/api/v1/tenants/lab/shares/{name}"))
        .await
        .unwrap()
}

/// A VM's domain once its guest agent answers and its mounts are done.
async fn booted(
    s: &TestServer,
    agents: &[&Agent],
    conn: &virt::connect::Connect,
    tenant: &str,
    name: &str,
) -> virt::domain::Domain {
    let v = until(
        &format!("{name} running"),
        Duration::from_secs(60),
        async || {
            passes(agents).await;
            let v = vm(s, tenant, name).await;
            assert_ne!(v.state, VmState::Error, "{name}: {:?}", v.reason);
            (v.state == VmState::Running).then_some(v)
        },
    )
    .await;
    let dom = conn
        .lookup_domain_by_uuid_string(&v.id.to_string())
        .unwrap();
    until(
        &format!("{name}'s guest agent"),
        Duration::from_secs(120),
        async || qga(&dom, json!({"execute": "guest-ping"})).ok(),
    )
    .await;
    until(
        &format!("{name}'s mounts"),
        Duration::from_secs(60),
        async || {
            sh(&dom, "cat /run/kumo-mounts")
                .await
                .filter(|(_, rc)| *rc == 0)
        },
    )
    .await;
    dom
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_is_one_directory_for_a_projects_guests_on_two_hosts() {
    let guest = guest_dir();
    let conn = virt::connect::Connect::open(Some("qemu:///system")).unwrap_or_else(|e| {
        panic!("libvirtd with qemu:///system is required (`cargo xtask test` starts it): {e}")
    });
    let s = TestServer::start(Backend::Sqlite).await;
    for t in ["lab", "other"] {
        s.tenant(t).await;
    }
    let (work_a, mut config_a) = qemu_host(&s, &guest, "fs-a").await;
    let (_work_b, mut config_b) = qemu_host(&s, &guest, "fs-b").await;
    let root = work_a.path().join("shared-fs");
    std::fs::create_dir(&root).unwrap();
    for c in [&mut config_a, &mut config_b] {
        c.shares = Some(kumo_agent::shares::SharesConfig {
            root: root.clone(),
            require_mount: false,
        });
    }
    let a = Agent::start(config_a).await.unwrap();
    let b = Agent::start(config_b).await.unwrap();
    a.report_inventory().await.unwrap();
    b.report_inventory().await.unwrap();
    let agents = [&a, &b];
    // Driven by hand: their hosts stay reachable only by these.
    let beats = [
        crate::e2e_volumes::heartbeats(&a),
        crate::e2e_volumes::heartbeats(&b),
    ];
    let _binds = Unbind(vec![
        work_a.path().to_path_buf(),
        _work_b.path().to_path_buf(),
    ]);
    let mut cleanup = Cleanup(Vec::new());

    // Two shares of lab's: data (1 GiB) and a reference set mounted
    // read-only, with a file the operator put there.
    let data: Share = s
        .admin
        .post(
            "/api/v1/tenants/lab/shares",
            &json!({"name": "data", "size_gib": 1}),
        )
        .await
        .unwrap();
    let refs: Share = s
        .admin
        .post(
            "/api/v1/tenants/lab/shares",
            &json!({"name": "refs", "size_gib": 1}),
        )
        .await
        .unwrap();
    until("the shares made", Duration::from_secs(30), async || {
        passes(&agents).await;
        let ok = share(&s, "data").await.state == ShareState::Available
            && share(&s, "refs").await.state == ShareState::Available;
        ok.then_some(())
    })
    .await;
    let data_dir = root.join(data.id.to_string());
    std::fs::write(root.join(refs.id.to_string()).join("hello"), "reference\n").unwrap();
    // Things outside the share a guest must not reach: a secret beside
    // it, pointed at from inside by absolute and relative links.
    std::fs::write(root.join("secret"), "host-secret\n").unwrap();
    std::os::unix::fs::symlink(root.join("secret"), data_dir.join("abs-link")).unwrap();
    std::os::unix::fs::symlink("../secret", data_dir.join("rel-link")).unwrap();

    // lab-1 on fs-a with data and refs (read-only), lab-2 on fs-b with
    // data, other-1 (another project) on fs-a with nothing.
    let body = |name: &str, shares: serde_json::Value| {
        json!({"name": name, "vcpus": 1, "memory_gib": 1, "disk_gib": 1, "template": "tiny",
               "shares": shares})
    };
    let on = async |host: &str, tenant: &str, b: serde_json::Value| -> Vm {
        let other = if host == "fs-a" { "fs-b" } else { "fs-a" };
        let _: serde_json::Value = s
            .admin
            .post(&format!("/api/v1/hosts/{other}/drain"), &json!({}))
            .await
            .unwrap();
        let v: Vm = s
            .admin
            .post(&format!("/api/v1/tenants/{tenant}/vms"), &b)
            .await
            .unwrap();
        let _: serde_json::Value = s
            .admin
            .post(&format!("/api/v1/hosts/{other}/undrain"), &json!({}))
            .await
            .unwrap();
        assert_eq!(v.host.as_deref(), Some(host));
        v
    };
    let started = Instant::now();
    let l1 = on(
        "fs-a",
        "lab",
        body(
            "lab-1",
            json!([{"share": "data", "path": "/data"},
                   {"share": "refs", "path": "/refs", "read_only": true}]),
        ),
    )
    .await;
    let l2 = on(
        "fs-b",
        "lab",
        body("lab-2", json!([{"share": "data", "path": "/data"}])),
    )
    .await;
    let o1 = on("fs-a", "other", body("other-1", json!([]))).await;
    cleanup
        .0
        .extend([l1.id, l2.id, o1.id].map(|i| i.to_string()));
    let d1 = booted(&s, &agents, &conn, "lab", "lab-1").await;
    let d2 = booted(&s, &agents, &conn, "lab", "lab-2").await;
    let d3 = booted(&s, &agents, &conn, "other", "other-1").await;
    println!(
        "three guests up with their mounts in {:?}",
        started.elapsed()
    );
    let (mounts, _) = sh(&d1, "cat /run/kumo-mounts").await.unwrap();
    assert!(mounts.contains("data /data mounted"), "{mounts}");
    assert!(mounts.contains("refs /refs mounted"), "{mounts}");
    let l1v = vm(&s, "lab", "lab-1").await;
    assert_eq!(
        l1v.shares
            .iter()
            .map(|m| m.condition.as_deref())
            .collect::<Vec<_>>(),
        [Some("mounted"), Some("mounted read-only")],
        "{l1v:?}"
    );

    // One guest writes, the other (on the other host) reads the same bytes.
    let (sum1, rc) = sh(
        &d1,
        "dd if=/dev/urandom of=/data/blob bs=64k count=64 2>/dev/null && sync && sha256sum /data/blob",
    )
    .await
    .unwrap();
    assert_eq!(rc, 0, "{sum1}");
    let (sum2, rc) = sh(&d2, "sha256sum /data/blob").await.unwrap();
    assert_eq!(rc, 0, "{sum2}");
    let hash = |s: &str| s.split_whitespace().next().unwrap_or_default().to_owned();
    assert_eq!(hash(&sum1), hash(&sum2));
    assert_eq!(hash(&sum1).len(), 64);
    let on_host = std::fs::read(data_dir.join("blob")).unwrap();
    assert_eq!(on_host.len(), 64 * 65536, "the host's directory has it");

    // Sequential throughput through virtiofs (TCG: the guest's copies are
    // emulated), against the same file read on the host: BENCHMARKS.md.
    let timed = async |script: &str| -> f64 {
        let (out, rc) = sh(
            &d1,
            &format!("a=$(cut -d' ' -f1 /proc/uptime); {script} >/dev/null 2>&1; b=$(cut -d' ' -f1 /proc/uptime); echo \"$a $b\""),
        )
        .await
        .unwrap();
        assert_eq!(rc, 0, "{out}");
        let t: Vec<f64> = out
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        256.0 / (t[1] - t[0]).max(0.01)
    };
    let write = timed("dd if=/dev/zero of=/data/bench bs=1M count=256 conv=fsync").await;
    let read =
        timed("echo 3 > /proc/sys/vm/drop_caches; dd if=/data/bench of=/dev/null bs=1M").await;
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
    let t = Instant::now();
    let n = std::fs::read(data_dir.join("bench")).unwrap().len();
    let host_read = n as f64 / f64::from(1u32 << 20) / t.elapsed().as_secs_f64();
    println!(
        "virtiofs, 256 MiB sequential: guest write {write:.0} MiB/s, guest read {read:.0} MiB/s; the host reads the file at {host_read:.0} MiB/s (read ratio {:.2})",
        read / host_read
    );
    std::fs::remove_file(data_dir.join("bench")).unwrap();

    // The other project's guest has no such filesystem.
    let (m3, _) = sh(
        &d3,
        "cat /run/kumo-mounts; grep virtiofs /proc/mounts; true",
    )
    .await
    .unwrap();
    assert!(!m3.contains("virtiofs") && !m3.contains("data"), "{m3}");
    let (tried, rc) = sh(&d3, "mkdir -p /x && mount -t virtiofs data /x")
        .await
        .unwrap();
    assert_ne!(rc, 0, "other-1 mounted lab's share: {tried}");

    // Read-only: reads work, writes fail, and remounting read-write in
    // the guest changes nothing (the host's bind is read-only).
    let (hello, rc) = sh(&d1, "cat /refs/hello").await.unwrap();
    assert_eq!((hello.trim(), rc), ("reference", 0));
    for script in [
        "touch /refs/new",
        "mount -o remount,rw /refs && touch /refs/new",
    ] {
        let (out, rc) = sh(&d1, script).await.unwrap();
        assert_ne!(rc, 0, "{script}: {out}");
        assert!(out.contains("Read-only file system"), "{script}: {out}");
    }
    assert!(!root.join(refs.id.to_string()).join("new").exists());

    // Nothing above the share: `..` is the guest's own root, and links
    // to the host's files resolve inside the guest.
    let (up, _) = sh(&d2, "ls /data/.. && cd /data/../.. && pwd")
        .await
        .unwrap();
    assert!(up.contains("init") && up.trim_end().ends_with('/'), "{up}");
    for link in ["abs-link", "rel-link"] {
        let (out, rc) = sh(&d2, &format!("cat /data/{link}")).await.unwrap();
        assert_ne!(rc, 0, "{link}: {out}");
        assert!(!out.contains("host-secret"), "{link} escaped: {out}");
    }

    // Past its size (measured: no project quotas here): read-only from
    // the next start, said on the share; a restarted guest cannot write.
    let (out, rc) = sh(
        &d2,
        "dd if=/dev/zero of=/data/big bs=1M count=1100 2>&1 && sync",
    )
    .await
    .unwrap();
    assert_eq!(rc, 0, "a measured share does not stop writes: {out}");
    let over = until(
        "the share to turn read-only",
        Duration::from_secs(90),
        async || {
            tokio::time::sleep(Duration::from_secs(1)).await;
            passes(&agents).await;
            let d = share(&s, "data").await;
            d.read_only.then_some(d)
        },
    )
    .await;
    assert!(
        over.reason
            .as_deref()
            .unwrap_or_default()
            .contains("read-only"),
        "{over:?}"
    );
    assert!(over.used_bytes.unwrap_or(0) > 1 << 30, "{over:?}");
    let l2v = vm(&s, "lab", "lab-2").await;
    assert!(
        l2v.shares[0]
            .condition
            .as_deref()
            .unwrap_or_default()
            .starts_with("read-only from the next start"),
        "{l2v:?}"
    );
    for action in ["stop", "start"] {
        let _: serde_json::Value = s
            .admin
            .post(
                &format!("/api/v1/tenants/lab/vms/lab-2/{action}"),
                &json!({}),
            )
            .await
            .unwrap();
        passes(&agents).await;
    }
    let d2 = booted(&s, &agents, &conn, "lab", "lab-2").await;
    let (out, rc) = sh(&d2, "echo more > /data/more").await.unwrap();
    assert_ne!(rc, 0, "{out}");
    assert!(out.contains("Read-only file system"), "{out}");
    let (sum, rc) = sh(&d2, "sha256sum /data/blob").await.unwrap();
    assert_eq!((hash(&sum), rc), (hash(&sum1), 0), "still readable");
    assert_eq!(
        vm(&s, "lab", "lab-2").await.shares[0].condition.as_deref(),
        Some("mounted read-only")
    );
    for b in beats {
        b.abort();
    }
}
