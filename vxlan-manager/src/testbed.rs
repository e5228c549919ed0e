//! Test scaffolding on real kernel networking: hosts as network namespaces
//! on an underlay bridge, and VMs as namespaces whose veth sits on a
//! segment's bridge in a host (as a VM's tap would). Shared by this
//! crate's tests and the end-to-end tests. Needs root, iproute2 and ping;
//! it shells out to `ip` (the product speaks only netlink) and panics on
//! failure, as test set-up does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::Duration;

use nix::sched::CloneFlags;

pub fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap_or_else(|e| {
        panic!("`ip` (iproute2) is required; the README's test command installs it: {e}")
    });
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn ping(from: &str, to: Ipv4Addr) -> bool {
    Command::new("ip")
        .args(["netns", "exec", from, "ping", "-c1", "-W1", "-q"])
        .arg(to.to_string())
        .output()
        .unwrap_or_else(|e| panic!("ping (iputils-ping) is required: {e}"))
        .status
        .success()
}

/// Runs `f` on a thread inside namespace `ns`.
pub fn in_ns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let file = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
    std::thread::spawn(move || {
        nix::sched::setns(&file, CloneFlags::CLONE_NEWNET).unwrap();
        f()
    })
}

pub const PORT: u16 = 7000;

/// What a VM answers on TCP: its own name, so a client can tell which of
/// two VMs with one address it reached.
pub fn serve(ns: &str, name: &str) {
    let name = name.to_owned();
    let (tx, rx) = std::sync::mpsc::channel();
    in_ns(ns, move || {
        let l = TcpListener::bind(("0.0.0.0", PORT)).unwrap();
        tx.send(()).unwrap();
        for mut s in l.incoming().flatten() {
            let _ = s.write_all(name.as_bytes());
        }
    });
    rx.recv().unwrap();
}

pub fn tcp_hello(from: &str, to: Ipv4Addr) -> Option<String> {
    hello(from, SocketAddr::from((to, PORT)), Duration::from_secs(2))
}

/// What `to` says to a TCP connection from namespace `from`, if it
/// answers within `wait`.
pub fn hello(from: &str, to: SocketAddr, wait: Duration) -> Option<String> {
    in_ns(from, move || {
        let mut s = TcpStream::connect_timeout(&to, wait).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out)
    })
    .join()
    .unwrap()
}

/// Namespaces named `<prefix>-…`, all removed on drop: `fab` holds the
/// underlay bridge, `h<i>` are hosts with `ul0` at 10.99.0.<i+1>/24.
pub struct Fabric {
    pub prefix: String,
    pub hosts: usize,
}

impl Fabric {
    pub fn new(hosts: usize) -> Fabric {
        assert!(
            nix::unistd::geteuid().is_root(),
            "the namespace tests need root (CAP_NET_ADMIN)"
        );
        let f = Fabric {
            prefix: {
                static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
                let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                format!("kt{}x{n}", std::process::id())
            },
            hosts,
        };
        let fab = f.ns("fab");
        ip(&["netns", "add", &fab]);
        ip(&["-n", &fab, "link", "add", "ul", "type", "bridge"]);
        ip(&["-n", &fab, "link", "set", "ul", "up"]);
        for h in 0..hosts {
            let ns = f.host_ns(h);
            ip(&["netns", "add", &ns]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
            let peer = format!("p{h}");
            ip(&[
                "link", "add", "ul0", "netns", &ns, "type", "veth", "peer", "name", &peer, "netns",
                &fab,
            ]);
            ip(&["-n", &fab, "link", "set", &peer, "master", "ul", "up"]);
            let addr = format!("{}/24", Fabric::underlay(h));
            ip(&["-n", &ns, "addr", "add", &addr, "dev", "ul0"]);
            ip(&["-n", &ns, "link", "set", "ul0", "up"]);
        }
        f
    }

    pub fn ns(&self, what: &str) -> String {
        format!("{}-{what}", self.prefix)
    }

    pub fn host_ns(&self, h: usize) -> String {
        self.ns(&format!("h{h}"))
    }

    pub fn underlay(h: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 99, 0, h as u8 + 1)
    }

    /// A VM's namespace `name` with `eth0` (MAC, `address` as `a.b.c.d/len`,
    /// MTU), its peer in host `h` on `bridge`; it answers TCP on [`PORT`]
    /// with its name.
    pub fn add_vm(&self, name: &str, h: usize, mac: &str, address: &str, mtu: u32, bridge: &str) {
        let ns = self.ns(name);
        let host = self.host_ns(h);
        let tap = format!("t-{name}");
        let mtu = mtu.to_string();
        ip(&["netns", "add", &ns]);
        ip(&["-n", &ns, "link", "set", "lo", "up"]);
        ip(&[
            "link", "add", "eth0", "netns", &ns, "type", "veth", "peer", "name", &tap, "netns",
            &host,
        ]);
        ip(&[
            "-n", &ns, "link", "set", "eth0", "address", mac, "mtu", &mtu,
        ]);
        ip(&["-n", &ns, "addr", "add", address, "dev", "eth0"]);
        ip(&["-n", &ns, "link", "set", "eth0", "up"]);
        ip(&[
            "-n", &host, "link", "set", &tap, "mtu", &mtu, "master", bridge, "up",
        ]);
        serve(&ns, name);
    }

    pub fn remove_vm(&self, name: &str) {
        ip(&["netns", "del", &self.ns(name)]);
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        // Edge DNS daemons of this fabric's hosts (an agent killed by a
        // test leaves them), and the VMs' resolver files.
        if let Ok(dirs) = std::fs::read_dir(crate::edge::DNS_RUN) {
            for d in dirs.flatten() {
                let name = d.file_name().to_string_lossy().into_owned();
                if name.starts_with(&format!("{}-", self.prefix)) {
                    crate::edge::stop_dns(&name);
                }
            }
        }
        if let Ok(dirs) = std::fs::read_dir("/etc/netns") {
            for d in dirs.flatten() {
                if d.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("{}-", self.prefix))
                {
                    let _ = std::fs::remove_dir_all(d.path());
                }
            }
        }
        let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
            return;
        };
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            if name.starts_with(&format!("{}-", self.prefix)) {
                let _ = Command::new("ip").args(["netns", "del", name]).status();
            }
        }
    }
}
