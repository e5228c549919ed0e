//! `cargo xtask start | test | docs | openapi`: the project's tasks, in
//! Rust so they run wherever cargo does.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

mod layers;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let shown = format!("{cmd:?}");
    eprintln!("xtask: {shown}");
    let status = cmd
        .current_dir(root())
        .status()
        .map_err(|e| format!("cannot run {shown}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{shown} failed with {status}"))
    }
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

fn succeeds(cmd: &mut Command) -> bool {
    cmd.output().is_ok_and(|o| o.status.success())
}

/// A tool on PATH, or (for entries starting with `/`) a file.
fn present(what: &str) -> bool {
    if what.starts_with('/') {
        return std::path::Path::new(what).exists();
    }
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(what).is_file()))
        .unwrap_or(false)
}

/// What building and testing need from Debian: libvirt's headers for the
/// agent's `virt` crate, qemu-img for VM disks, and the libvirt tools the
/// rendering tests check domains with.
const PACKAGES: &[(&str, &str)] = &[
    ("pkg-config", "pkg-config"),
    ("/usr/include/libvirt/libvirt.h", "libvirt-dev"),
    ("qemu-img", "qemu-utils"),
    ("virsh", "libvirt-clients"),
    ("virt-xml-validate", "libvirt-clients"),
    ("xmllint", "libxml2-utils"),
    // The QEMU end-to-end test: QEMU, libvirtd, and what its tiny guest is built from.
    ("qemu-system-x86_64", "qemu-system-x86"),
    ("/usr/sbin/libvirtd", "libvirt-daemon-system"),
    (
        "/usr/lib/x86_64-linux-gnu/libvirt/connection-driver/libvirt_driver_qemu.so",
        "libvirt-daemon-driver-qemu",
    ),
    ("busybox", "busybox-static"),
    // GPU VMs boot UEFI: the firmware test boots OVMF.
    ("/usr/share/OVMF/OVMF_CODE_4M.fd", "ovmf"),
    // The README's dev walk-through reads network.json with jq.
    ("jq", "jq"),
    ("cpio", "cpio"),
    ("rdma", "iproute2"),
    // cloud-init seeds, and the tests that look inside them.
    ("genisoimage", "genisoimage"),
    ("isoinfo", "genisoimage"),
    // Tenant networks: hosts and VMs as network namespaces, and the
    // traffic between them (the product itself speaks netlink).
    ("ip", "iproute2"),
    ("bridge", "iproute2"),
    ("ping", "iputils-ping"),
    // Segment ingress filters and edges: the agent drives nft.
    ("/usr/sbin/nft", "nftables"),
    // Segment edges answer DNS at the gateway.
    ("/usr/sbin/dnsmasq", "dnsmasq-base"),
    // The QEMU test logs in to its guest with OpenSSH's client.
    ("ssh", "openssh-client"),
    ("ssh-keygen", "openssh-client"),
    // The SSO tests run a real OpenID Provider (oidc-provider, from npm),
    // the portal tests a real browser (with Japanese fonts for the
    // screenshots).
    ("node", "nodejs"),
    ("npm", "npm"),
    ("/usr/bin/chromium", "chromium"),
    (
        "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc",
        "fonts-noto-cjk",
    ),
    // The API fuzz test installs schemathesis (PyPI) into a virtual
    // environment under target/.
    ("python3", "python3"),
    ("/usr/share/doc/python3-venv", "python3-venv"),
    // The upgrade tests restore PostgreSQL dumps; the packaging test builds
    // Debian packages (dpkg-shlibdeps) and installs them into a fresh
    // Debian made by mmdebstrap.
    ("psql", "postgresql-client"),
    // Consoles across replicas: two servers behind a real load balancer.
    ("haproxy", "haproxy"),
    ("dpkg-shlibdeps", "dpkg-dev"),
    ("mmdebstrap", "mmdebstrap"),
];

/// Debian's QEMU replaces a newer backported qemu-utils: check qemu-img
/// again after installing it.
const AFTER: &[(&str, &str)] = &[("qemu-img", "qemu-utils")];

/// Installs Debian packages for the tools the tests run, when missing.
fn ensure_tools(tools: &[(&str, &str)]) -> Result<(), String> {
    let mut missing: Vec<&str> = tools
        .iter()
        .filter(|(t, _)| !present(t))
        .map(|(_, p)| *p)
        .collect();
    missing.dedup();
    if missing.is_empty() {
        return Ok(());
    }
    let apt = |args: &[&str]| {
        let mut c = if is_root() {
            Command::new("apt-get")
        } else {
            let mut c = Command::new("sudo");
            c.arg("apt-get");
            c
        };
        c.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        run(&mut c)
    };
    apt(&["update", "-qq"])?;
    let mut args = vec!["install", "-y", "-qq"];
    args.extend(missing);
    apt(&args)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// Everything CI checks: formatting, lints, and every test on SQLite and
/// PostgreSQL (started or installed here when missing), with the Debian
/// packages in [`PACKAGES`]. `--extended` also runs the long harnesses:
/// five times the crash rounds, and every fuzz target for a bounded time.
fn test(args: &[String]) -> Result<(), String> {
    let extended = args.iter().any(|a| a == "--extended");
    let extra: Vec<&String> = args.iter().filter(|a| *a != "--extended").collect();
    if std::env::var_os("KUMO_TEST_DATABASE_URL").is_none() {
        run(Command::new("bash").arg("scripts/ensure-postgres.sh"))?;
    }
    ensure_tools(PACKAGES)?;
    ensure_tools(AFTER)?;
    run(Command::new("bash").arg("scripts/ensure-libvirtd.sh"))?;
    portal_assets()?;
    check_layers()?;
    // The manual builds (and the docs test reads its pages).
    docs()?;
    run(cargo().args(["fmt", "--all", "--check"]))?;
    run(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    // The CLI tests run the real `kumo` binary: build every binary first.
    run(cargo().args(["build", "--workspace", "--bins"]))?;
    let mut tests = cargo();
    if succeeds(cargo().args(["nextest", "--version"])) {
        tests.args(["nextest", "run", "--workspace", "--no-fail-fast"]);
    } else {
        tests.args(["test", "--workspace", "--no-fail-fast"]);
    }
    if extended {
        tests.env("KUMO_EXTENDED", "1");
    }
    tests.env("KUMO_PREVIOUS_RELEASE_BIN", previous_release()?);
    // Simulated fleets the tests start must be gone when they end, passed
    // or failed (a `./x start` already running is left alone: only what
    // appeared during the tests counts).
    let before = dev_fleet_remains();
    let ran = run(tests.args(extra));
    let left: Vec<String> = dev_fleet_remains()
        .into_iter()
        .filter(|r| !before.contains(r))
        .collect();
    ran?;
    if !left.is_empty() {
        return Err(format!(
            "the tests left simulated fleets behind (every test that starts one must stop it, passed or failed):\n  {}",
            left.join("\n  ")
        ));
    }
    if extended {
        fuzz()?;
    }
    Ok(())
}

/// What simulated fleets (`kumo-server dev`) leave when not stopped:
/// network namespaces named `kumo-dev-*`, and processes (agents, edges'
/// `dnsmasq`) whose command line names them.
fn dev_fleet_remains() -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/run/netns") {
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("kumo-dev-") {
                out.push(format!("network namespace {name}"));
            }
        }
    }
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let pid = e.file_name().to_string_lossy().into_owned();
            if pid.parse::<u32>().is_err() || pid == std::process::id().to_string() {
                continue;
            }
            let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
                continue;
            };
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains("kumo-dev-") || cmd.contains("kumo-server dev ") {
                out.push(format!("process {pid}: {}", cmd.trim()));
            }
        }
    }
    out.sort();
    out
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

/// `"key": "value"` in a small JSON file written by our own script.
fn json_string(text: &str, key: &str) -> Option<String> {
    let at = text.find(&format!("\"{key}\""))?;
    let rest = &text[at + key.len() + 2..];
    let rest = &rest[rest.find('"')? + 1..];
    Some(rest[..rest.find('"')?].to_owned())
}

fn version_key(v: &str) -> Vec<u64> {
    v.split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

/// Builds the previous release's binaries (the newest upgrade fixture older
/// than this version, from the commit its fixture names) for the
/// rolling-upgrade test, and returns their directory. The source comes
/// from this clone's history (`git archive`); it builds in a target
/// directory of its own, since two checkouts of one workspace confuse
/// cargo's fingerprints in a shared one.
fn previous_release() -> Result<PathBuf, String> {
    let this = env!("CARGO_PKG_VERSION");
    let fixtures = root().join("tests/fixtures/upgrade");
    let mut older: Vec<(String, String)> = std::fs::read_dir(&fixtures)
        .map_err(|e| format!("cannot read {}: {e}", fixtures.display()))?
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("expect.json")).ok())
        .filter_map(|t| Some((json_string(&t, "version")?, json_string(&t, "commit")?)))
        .filter(|(v, _)| version_key(v) < version_key(this))
        .collect();
    older.sort_by_key(|(v, _)| version_key(v));
    let (version, commit) = older.pop().ok_or_else(|| {
        format!(
            "no upgrade fixture older than {this} in {}",
            fixtures.display()
        )
    })?;
    let dir = target_dir().join("releases").join(&version);
    let src = dir.join("src");
    if !src.join("Cargo.toml").exists() {
        let _ = std::fs::remove_dir_all(&src);
        std::fs::create_dir_all(&src)
            .map_err(|e| format!("cannot create {}: {e}", src.display()))?;
        run(Command::new("bash").arg("-c").arg(format!(
            "git archive --format=tar {commit} | tar -x -C '{}'",
            src.display()
        )))
        .map_err(|e| {
            format!(
                "{e} (the previous release {version} is commit {commit}: a shallow clone lacks it)"
            )
        })?;
    }
    let target = dir.join("target");
    run(cargo()
        .arg("build")
        .args(SHIPPED)
        .arg("--manifest-path")
        .arg(src.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target))?;
    Ok(target.join("debug"))
}

/// The browser libraries the portal serves (xterm.js for consoles), from
/// npm into `web-portal/assets/node_modules` as its lock file pins them;
/// the portal's build embeds them. Not committed.
fn portal_assets() -> Result<(), String> {
    let dir = root().join("web-portal/assets");
    let lock = dir.join("package-lock.json");
    let installed = dir.join("node_modules/.package-lock.json");
    let fresh = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if fresh(&installed).is_some() && fresh(&installed) >= fresh(&lock) {
        return Ok(());
    }
    // `run` works in the repository's root.
    run(Command::new("npm").args([
        "ci",
        "--prefix",
        "web-portal/assets",
        "--no-audit",
        "--no-fund",
        "--loglevel=error",
    ]))
}

/// The control plane's architecture invariants (see [`layers`]).
fn check_layers() -> Result<(), String> {
    let v = layers::check(&root());
    if v.is_empty() {
        eprintln!("xtask: layers: every import goes downward");
        return Ok(());
    }
    for x in &v {
        eprintln!("{x}");
    }
    Err(format!("{} imports break the one-way layers", v.len()))
}

/// The fuzz targets in `fuzz/`, from the nightly toolchain `cargo fuzz`
/// needs.
const FUZZ_TARGETS: &[&str] = &[
    "sysfs_discovery",
    "agent_messages",
    "config_files",
    "xml_round_trip",
];

/// Seconds each fuzz target runs in the extended run, unless
/// `KUMO_FUZZ_SECONDS` says otherwise.
const FUZZ_SECONDS: u32 = 120;

/// Installs a nightly toolchain and cargo-fuzz when missing, then runs each
/// target over its kept corpus (`fuzz/corpus/<target>`, where new finds are
/// added) and on for a bounded time. A panic, a hang (10 s on one input) or
/// running out of memory fails the run, with the input in `fuzz/artifacts/`.
fn fuzz() -> Result<(), String> {
    if !succeeds(Command::new("rustup").args(["run", "nightly", "rustc", "--version"])) {
        run(Command::new("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
        ]))?;
    }
    if !succeeds(cargo().args(["fuzz", "--version"])) {
        run(cargo().args(["install", "cargo-fuzz", "--locked"]))?;
    }
    let seconds = std::env::var("KUMO_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse::<u32>().ok())
        .unwrap_or(FUZZ_SECONDS);
    let target_dir = target_dir().join("fuzz");
    for t in FUZZ_TARGETS {
        let corpus = root().join("fuzz/corpus").join(t);
        std::fs::create_dir_all(&corpus)
            .map_err(|e| format!("cannot create {}: {e}", corpus.display()))?;
        run(Command::new("cargo")
            .args([
                "+nightly",
                "fuzz",
                "run",
                "--sanitizer",
                "none",
                "--debug-assertions",
            ])
            .arg("--target-dir")
            .arg(&target_dir)
            .arg(t)
            .arg(&corpus)
            .arg("--")
            .arg(format!("-max_total_time={seconds}"))
            .args(["-timeout=10", "-rss_limit_mb=4096", "-print_final_stats=1"])
            // cargo fuzz is run through rustup's proxy: the workspace's
            // CARGO would pin the stable toolchain.
            .env_remove("CARGO")
            .env_remove("RUSTC")
            .env_remove("RUSTUP_TOOLCHAIN"))?;
    }
    Ok(())
}

/// What the packages ship and users run: the server, the agent, the CLI.
const SHIPPED: &[&str] = &[
    "--bins",
    "-p",
    "kumo-server",
    "-p",
    "kumo-agent",
    "-p",
    "kumo-cli",
];

/// The three binaries a user runs, optimised (with the portal's assets).
fn release_build() -> Result<(), String> {
    portal_assets()?;
    run(cargo().args(["build", "--release"]).args(SHIPPED))
}

/// Starts the whole system on its embedded default: the server on SQLite
/// under `./.kumo`, a simulated fleet of GPU hosts, a demo tenant.
fn start(extra: &[String]) -> Result<(), String> {
    ensure_tools(PACKAGES)?;
    ensure_tools(AFTER)?;
    // `--qemu`: one real host beside the simulated ones, booting the tiny
    // guest (busybox, Dropbear) under libvirtd, for an SSH session in a
    // real VM. libvirtd is started as for the tests (TCG unless
    // KUMO_TEST_USE_KVM=1 says KVM works here).
    let qemu = extra.iter().any(|a| a == "--qemu");
    let extra: Vec<&String> = extra.iter().filter(|a| *a != "--qemu").collect();
    let mut dev = Command::new(target_dir().join("release/kumo-server"));
    dev.arg("dev");
    if qemu {
        if !is_root() {
            return Err("./x start --qemu runs a real host: run it as root".into());
        }
        run(Command::new("bash").arg("scripts/ensure-libvirtd.sh"))?;
        let guest = target_dir().join("dev-guest");
        run(Command::new("bash")
            .arg("scripts/build-test-guest.sh")
            .arg(&guest))?;
        dev.arg("--qemu-guest").arg(guest);
    }
    release_build()?;
    run(dev.args(extra))
}

/// Debian packages of the release build (kumo-server, kumo-agent, kumo)
/// into `<target>/debian/`.
fn deb() -> Result<(), String> {
    ensure_tools(&[("dpkg-shlibdeps", "dpkg-dev")])?;
    release_build()?;
    run(Command::new("bash")
        .arg("ops/debian/build-debs.sh")
        .arg(target_dir().join("release"))
        .arg(target_dir().join("debian")))
}

/// The mdBook release the manual is built with.
const MDBOOK_VERSION: &str = "0.4.52";

/// Builds the manual, `docs/` (mdBook), into `docs/book/`, with a copy of
/// the OpenAPI document beside its pages. Installs mdBook from crates.io
/// (into `~/.cargo/bin`) when it is not on PATH.
fn docs() -> Result<(), String> {
    let cargo_bin = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .map(|d| d.join("bin/mdbook"));
    let mdbook = if present("mdbook") {
        PathBuf::from("mdbook")
    } else {
        match cargo_bin {
            Some(p) if p.is_file() => p,
            p => {
                run(cargo().args([
                    "install",
                    "mdbook",
                    "--locked",
                    "--version",
                    MDBOOK_VERSION,
                    "--no-default-features",
                    "--features",
                    "search",
                ]))?;
                p.filter(|p| p.is_file())
                    .unwrap_or_else(|| PathBuf::from("mdbook"))
            }
        }
    };
    let book = root().join("docs/book");
    // mdBook warns (and goes on) about a missing include: refuse that.
    let out = Command::new(&mdbook)
        .args(["build", "docs"])
        .current_dir(root())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", mdbook.display()))?;
    let said = String::from_utf8_lossy(&out.stderr);
    eprint!("{said}");
    if !out.status.success() {
        return Err(format!("mdbook build docs failed with {}", out.status));
    }
    if let Some(w) = said
        .lines()
        .find(|l| l.contains("WARN") || l.contains("ERROR"))
    {
        return Err(format!("mdbook build docs warned: {w}"));
    }
    std::fs::copy(
        root().join("api-spec/openapi.json"),
        book.join("openapi.json"),
    )
    .map_err(|e| format!("cannot copy the OpenAPI document into the book: {e}"))?;
    eprintln!(
        "xtask: the manual is in {}",
        book.join("index.html").display()
    );
    Ok(())
}

/// Rewrites `api-spec/openapi.json` from the code.
fn openapi() -> Result<(), String> {
    let out = cargo()
        .args([
            "run",
            "--quiet",
            "--package",
            "kumo-server",
            "--bin",
            "kumo-server",
            "--",
            "openapi",
        ])
        .current_dir(root())
        .output()
        .map_err(|e| format!("cannot run kumo-server openapi: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "kumo-server openapi failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let path = root().join("api-spec/openapi.json");
    std::fs::write(&path, &out.stdout)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    eprintln!("xtask: wrote {}", path.display());
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (task, extra) = match args.split_first() {
        Some((t, rest)) => (t.as_str(), rest),
        None => ("help", &[][..]),
    };
    let result = match task {
        "test" => test(extra),
        "fuzz" => fuzz(),
        "start" => start(extra),
        "openapi" => openapi(),
        "deb" => deb(),
        "docs" => docs(),
        "layers" => check_layers(),
        "previous-release" => previous_release().map(|d| println!("{}", d.display())),
        _ => {
            eprintln!("usage: cargo xtask <start|test|docs|openapi|deb|…> [args…]\n  start    run kumo-server on SQLite under ./.kumo (--qemu: and a real host)\n  layers   check the control plane's one-way layers\n  previous-release  build the previous release (for the upgrade tests)\n  test     fmt, clippy and every test (starts PostgreSQL if needed);\n           --extended adds the long runs: 5x crash rounds, fuzzing\n  fuzz     only the fuzz targets (KUMO_FUZZ_SECONDS each, default 120)\n  docs     build the manual (mdBook) into docs/book\n  openapi  regenerate api-spec/openapi.json\n  deb      Debian packages of the release build, into <target>/debian");
            return if task == "help" {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            };
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}
