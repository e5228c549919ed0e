//! From `./x start --qemu` to an SSH session in a real VM, as the
//! researcher's guide says (`docs/src/researcher/vms.md`, "On one
//! machine"): `kumo-server dev` with its real host (libvirtd's
//! `qemu:///system`, the test guest under TCG), the guide's commands run
//! in order with the real `kumo` and OpenSSH's `ssh`, and the fleet's end
//! removing the host's domains and links.

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::{bin, scratch};

/// The guide's section.
const SECTION: &str = "## On one machine: SSH into a real VM";

fn links() -> String {
    let out = Command::new("ip").args(["-br", "link"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn domains_naming(dir: &std::path::Path) -> Vec<String> {
    let out = Command::new("virsh")
        .args(["-q", "-c", "qemu:///system", "list", "--all", "--name"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .filter(|n| {
            Command::new("virsh")
                .args(["-c", "qemu:///system", "dumpxml", n])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(&*dir.to_string_lossy()))
        })
        .map(str::to_owned)
        .collect()
}

/// The real host's work directory goes when the test ends, passed or
/// failed (its disks are the test's).
struct Removed(std::path::PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_guide_goes_from_x_start_to_an_ssh_session_in_a_real_vm() {
    if !crate::dev::is_root() {
        eprintln!("skipped: the real host needs root (libvirtd, links)");
        return;
    }
    // The real host refuses to start beside another agent's segments in
    // this namespace: say plainly what is in the way (a person's `./x
    // start --qemu` left running, or a test that left its segment).
    let foreign: Vec<String> = links()
        .lines()
        .filter(|l| l.starts_with("kbr") || l.starts_with("kvx"))
        .map(str::to_owned)
        .collect();
    assert!(
        foreign.is_empty(),
        "another Kumo agent's segment devices are in this namespace (stop that fleet, or remove them): {foreign:?}"
    );
    let page = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/src/researcher/vms.md"),
    )
    .unwrap();
    let commands = crate::readme::section_commands(&page, SECTION);
    assert!(
        commands.iter().any(|c| c.starts_with("kumo vm ssh")),
        "{commands:?}"
    );
    let guest = crate::e2e_qemu::guest_dir();
    let work = scratch();
    let data = work.path().join(".kumo");
    std::fs::create_dir_all(&data).unwrap();
    let home = work.path().join("home");
    std::fs::create_dir_all(home.join(".ssh")).unwrap();
    let (mut server, url) = crate::dev::start_dev_args(
        &data,
        &[
            "--hosts".as_ref(),
            "1".as_ref(),
            "--qemu-guest".as_ref(),
            guest.as_os_str(),
        ],
    );
    let pid = server.id();
    let log = work.path().join("dev.log");
    let log_tail = || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    };
    let qemu_work = kumo_server::dev::qemu::work_dir(&data);
    let _removed = Removed(qemu_work.clone());
    assert!(
        links().contains(&format!("kdu{pid}")) && links().contains(&format!("kdw{pid}")),
        "the real host joined the underlay and the provider network:\n{}",
        links()
    );
    let guard = Command::new("nft")
        .args(["list", "table", "inet", &format!("kumo_dev_{pid}")])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&guard.stdout).contains(&format!("iifname \"kdw{pid}\" drop")),
        "only answers come in from the provider network: {}",
        String::from_utf8_lossy(&guard.stdout)
    );

    // Stand-ins for the person only: `kumo vm ssh` runs the `ssh` first on
    // PATH, and this one is OpenSSH with the answers a person types — yes
    // to the new VM's host key — and with the key under the test's HOME
    // (OpenSSH finds ~ from the password file, not from $HOME).
    let tools = work.path().join("bin");
    std::fs::create_dir_all(&tools).unwrap();
    let ssh = which("ssh");
    std::fs::write(
        tools.join("ssh"),
        format!(
            "#!/bin/sh\nexec {} -i \"$HOME/.ssh/id_ed25519\" -o IdentitiesOnly=yes -o BatchMode=yes -o StrictHostKeyChecking=accept-new -o UserKnownHostsFile=\"$HOME/.ssh/known_hosts\" -o ConnectTimeout=5 \"$@\"\n",
            ssh.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(tools.join("ssh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}:{}",
        tools.display(),
        bin("kumo").parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let run = |c: &str| {
        Command::new("bash")
            .args(["-c", &c.replace("http://127.0.0.1:8080", &url)])
            .current_dir(work.path())
            .env("HOME", &home)
            .env("PATH", &path)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let started = Instant::now();
    let mut said = String::new();
    for c in commands.iter().filter(|c| !c.starts_with("./x")) {
        // The guide says the first ssh may find the guest still booting:
        // a person tries again, and so does this test, for a minute.
        let retries = if c.starts_with("kumo vm ssh") { 60 } else { 1 };
        let mut out = run(c);
        for _ in 1..retries {
            if out.status.success() {
                break;
            }
            std::thread::sleep(Duration::from_secs(1));
            out = run(c);
        }
        said = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "$ {c}\n{said}\n{}\nkumo-server dev said:\n{}",
            String::from_utf8_lossy(&out.stderr),
            log_tail()
        );
        if c.starts_with("kumo vm show") {
            assert!(said.contains("qemu-001"), "on the real host: {said}");
            assert!(said.contains("ssh root@203.0.113."), "{said}");
        }
    }
    // The last line ran `hostname` in the guest, over SSH from here.
    assert_eq!(said.trim(), "shell", "the session's answer");
    eprintln!(
        "guide's walk, login to an SSH answer: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(
        domains_naming(&qemu_work).len(),
        1,
        "one real domain runs the VM"
    );

    // The fleet's end takes the real host's domain and links along.
    assert!(server.stop().success());
    let deadline = Instant::now() + Duration::from_secs(20);
    while !domains_naming(&qemu_work).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(domains_naming(&qemu_work), Vec::<String>::new());
    let left = links();
    assert!(
        !left.contains(&format!("kdu{pid}")) && !left.contains(&format!("kdw{pid}")),
        "{left}"
    );
    let vxlans = Command::new("ip")
        .args(["-d", "link", "show", "type", "vxlan"])
        .output()
        .unwrap();
    let local = format!("local {}", kumo_server::dev::qemu::UNDERLAY_IP);
    assert!(
        !String::from_utf8_lossy(&vxlans.stdout).contains(&local),
        "the real host's VXLAN devices are gone: {}",
        String::from_utf8_lossy(&vxlans.stdout)
    );
    let tables = Command::new("nft")
        .args(["list", "tables"])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&tables.stdout).contains(&format!("kumo_dev_{pid}")),
        "its table is gone: {}",
        String::from_utf8_lossy(&tables.stdout)
    );
}

fn which(tool: &str) -> std::path::PathBuf {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|d| std::path::Path::new(d).join(tool))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{tool} on PATH (openssh-client; ./x test installs it)"))
}
