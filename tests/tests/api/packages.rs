//! Debian packages (`ops/debian/build-debs.sh`), built from this build's
//! binaries and installed with their dependencies into a fresh Debian 12
//! made by `mmdebstrap`: the binaries run, the units verify, the files have
//! their modes, and the server starts on the packaged defaults as its own
//! user.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::harness::bin;

fn sh(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn in_root(root: &Path, args: &[&str]) -> String {
    sh(Command::new("chroot")
        .arg(root)
        .args(args)
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"))
}

/// `/proc` inside the chroot while the checks run (systemd-analyze and the
/// server read it), unmounted however the test ends.
struct ProcMount(PathBuf);

impl ProcMount {
    fn new(root: &Path) -> ProcMount {
        let p = root.join("proc");
        sh(Command::new("mount").args(["-t", "proc", "proc"]).arg(&p));
        ProcMount(p)
    }
}

impl Drop for ProcMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Downloaded Debian packages, kept between runs (the agent's dependencies,
/// QEMU and libvirt, are a few hundred MB).
fn apt_cache() -> PathBuf {
    let target = bin("kumo-server")
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let dir = target.join("debian-apt-cache");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test]
async fn debian_packages_install_into_a_fresh_debian_and_their_units_verify() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let work = tempfile::tempdir_in("/var/tmp").unwrap();
    let debs = work.path().join("debs");
    let built = sh(Command::new("bash")
        .arg(repo.join("ops/debian/build-debs.sh"))
        .arg(bin("kumo-server").parent().unwrap())
        .arg(&debs));
    let debs: Vec<String> = built.lines().map(str::to_owned).collect();
    assert_eq!(debs.len(), 3, "{built}");
    for name in ["kumo-server_", "kumo-agent_", "kumo_"] {
        assert!(
            debs.iter()
                .any(|d| d.rsplit('/').next().unwrap().starts_with(name)),
            "{name}: {debs:?}"
        );
    }
    // What each declares: the agent needs what it drives.
    let agent = debs.iter().find(|d| d.contains("/kumo-agent_")).unwrap();
    let depends = sh(Command::new("dpkg-deb").args(["--field", agent, "Depends"]));
    for dep in [
        "libvirt0",
        "libvirt-daemon-system",
        "qemu-system-x86",
        "qemu-utils",
        // GPU VMs boot UEFI.
        "ovmf",
        "nftables",
        "iproute2",
        "dnsmasq-base",
        "genisoimage",
        "libc6",
    ] {
        assert!(
            depends.contains(dep),
            "kumo-agent depends on {dep}: {depends}"
        );
    }

    // A fresh Debian 12 with systemd, then the three packages installed
    // there by apt, with what they depend on.
    let root = work.path().join("root");
    let cache = apt_cache();
    sh(Command::new("mmdebstrap")
        .args(["--quiet", "--variant=minbase", "--include=systemd", "--skip=download/empty", "--skip=essential/unlink"])
        .arg(format!("--setup-hook=mkdir -p \"$1\"/var/cache/apt/archives && cp -a {}/. \"$1\"/var/cache/apt/archives/", cache.display()))
        .arg(format!("--customize-hook=copy-in {} /tmp", debs.join(" ")))
        .arg(format!(
            "--customize-hook=chroot \"$1\" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q {}",
            debs.iter().map(|d| format!("/tmp/{}", d.rsplit('/').next().unwrap())).collect::<Vec<_>>().join(" ")
        ))
        .arg(format!("--customize-hook=sync-out /var/cache/apt/archives {}", cache.display()))
        .args(["bookworm"])
        .arg(&root)
        .arg("http://deb.debian.org/debian"));
    let _proc = ProcMount::new(&root);
    let installed = in_root(
        &root,
        &[
            "dpkg-query",
            "-W",
            "-f",
            "${Package} ${Status}\\n",
            "kumo-server",
            "kumo-agent",
            "kumo",
        ],
    );
    assert_eq!(
        installed.matches("install ok installed").count(),
        3,
        "{installed}"
    );
    in_root(
        &root,
        &["dpkg", "--verify", "kumo-server", "kumo-agent", "kumo"],
    );

    // The binaries run there, with the libraries Debian gave them.
    let version = env!("CARGO_PKG_VERSION");
    for b in ["kumo-server", "kumo-agent", "kumo"] {
        let v = in_root(&root, &[b, "--version"]);
        assert!(v.contains(version), "{b}: {v}");
    }
    assert!(in_root(&root, &["kumo", "--help"]).contains("Usage"));

    // The units verify, and the server's sandbox is tight.
    let verify = Command::new("chroot")
        .arg(&root)
        .args([
            "systemd-analyze",
            "verify",
            "/lib/systemd/system/kumo-server.service",
            "/lib/systemd/system/kumo-agent.service",
        ])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&verify.stderr).into_owned()
        + &String::from_utf8_lossy(&verify.stdout);
    assert!(
        verify.status.success() && !said.contains("kumo"),
        "systemd-analyze verify: {said}"
    );
    let security = in_root(
        &root,
        &[
            "systemd-analyze",
            "security",
            "--offline=true",
            "--no-pager",
            "/lib/systemd/system/kumo-server.service",
        ],
    );
    let exposure: f64 = security
        .lines()
        .find_map(|l| l.split("exposure level for kumo-server.service:").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in: {security}"));
    println!("kumo-server.service exposure: {exposure}");
    assert!(
        exposure <= 2.0,
        "kumo-server.service exposure {exposure} (2.0 or less is 'OK'): {security}"
    );

    // Files, owners and modes.
    let stat = |p: &str| {
        in_root(&root, &["stat", "-c", "%a %U %G", p])
            .trim()
            .to_owned()
    };
    assert_eq!(stat("/etc/kumo/server.toml"), "640 root kumo");
    assert_eq!(stat("/etc/kumo/agent.env"), "600 root root");
    assert_eq!(stat("/var/lib/kumo"), "700 kumo kumo");
    assert_eq!(stat("/var/lib/kumo-agent"), "700 root root");
    for b in [
        "/usr/bin/kumo-server",
        "/usr/bin/kumo-agent",
        "/usr/bin/kumo",
    ] {
        assert_eq!(stat(b), "755 root root", "{b}");
    }
    assert_eq!(
        stat("/lib/systemd/system/kumo-server.service"),
        "644 root root"
    );
    let user = in_root(&root, &["getent", "passwd", "kumo"]);
    let fields: Vec<&str> = user.trim().split(':').collect();
    assert!(
        fields[2].parse::<u32>().unwrap() < 1000,
        "a system user: {user}"
    );
    assert_eq!(
        (fields[5], fields[6]),
        ("/var/lib/kumo", "/usr/sbin/nologin"),
        "{user}"
    );
    assert!(in_root(
        &root,
        &["dpkg-query", "-W", "-f", "${Conffiles}", "kumo-server"]
    )
    .contains("/etc/kumo/server.toml"));
    assert!(in_root(
        &root,
        &[
            "bash",
            "-c",
            "test -s /usr/share/bash-completion/completions/kumo && echo yes"
        ]
    )
    .contains("yes"));

    // The server starts on the packaged configuration as its user, as the
    // unit would run it (the port aside), and makes its database there.
    let mut server = Command::new("chroot")
        .arg(&root)
        .args([
            "setpriv",
            "--reuid=kumo",
            "--regid=kumo",
            "--clear-groups",
            "--",
            "/usr/bin/kumo-server",
            "serve",
            "--config",
            "/etc/kumo/server.toml",
            "--listen",
            "127.0.0.1:0",
        ])
        .env("PATH", "/usr/sbin:/usr/bin")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let (url, _) =
        crate::harness::announced_url(&mut std::io::BufReader::new(server.stdout.take().unwrap()));
    let health = match &url {
        Some(u) => reqwest::get(format!("{u}/healthz"))
            .await
            .ok()
            .map(|r| r.status().as_u16()),
        None => None,
    };
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(health, Some(200), "the packaged server answers ({url:?})");
    assert_eq!(stat("/var/lib/kumo/kumo.db"), "600 kumo kumo");
    assert_eq!(stat("/var/lib/kumo/admin-token"), "600 kumo kumo");

    // Removing the server keeps its database (the cloud's record).
    in_root(&root, &["apt-get", "remove", "-y", "-qq", "kumo-server"]);
    assert_eq!(stat("/var/lib/kumo/kumo.db"), "600 kumo kumo");
}
