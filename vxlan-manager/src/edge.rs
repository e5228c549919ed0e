//! The IO edge of segment edges, on an edge host: per edge a network
//! namespace (`kedge<VNI>`, prefixed with a simulated host's own
//! namespace) with a veth leg `lan` on the segment's bridge (the gateway's
//! address and MAC), a macvlan leg `wan` on the uplink (the public
//! addresses, the default route) and the table of `edge_rules`, strict
//! reverse-path filtering on both legs, and a `dnsmasq` answering the
//! segment at the gateway for its VM names and forwarding the rest to the
//! edge host's resolvers (the table keeps the outside from it).
//! Level-triggered: each pass reads what is there and changes only what
//! differs; namespaces of edges no longer wanted are removed. One edge's
//! failure is reported for it alone.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use serde_json::Value;

use crate::kernel::{tool, within, NetError};
use crate::state::{bridge_name, gateway_mac, Edge};

/// The namespace of an edge: per VNI, and per simulated host (whose own
/// namespace name prefixes it), since all share one `/run/netns`.
pub fn namespace(host: Option<&str>, vni: u32) -> String {
    match host {
        Some(h) => format!("{h}-kedge{vni}"),
        None => format!("kedge{vni}"),
    }
}

/// The VNI of one of this host's edge namespaces.
fn vni_of(host: Option<&str>, name: &str) -> Option<u32> {
    let rest = match host {
        Some(h) => name.strip_prefix(h)?.strip_prefix("-")?,
        None => name,
    };
    crate::state::edge_vni(rest)
}

fn ip(ns: Option<&str>, args: &[&str]) -> Result<String, NetError> {
    let (ok, out, err) = tool(ns, "ip", "iproute2", args, None)?;
    if ok {
        Ok(out)
    } else {
        Err(NetError::Tool(format!(
            "ip {}: {}",
            args.join(" "),
            err.trim()
        )))
    }
}

fn link_exists(ns: &str, dev: &str) -> Result<bool, NetError> {
    let (ok, _, _) = tool(
        Some(ns),
        "ip",
        "iproute2",
        &["link", "show", "dev", dev],
        None,
    )?;
    Ok(ok)
}

/// Makes `dev`'s IPv4 addresses exactly `want`; answers the changes.
fn sync_addrs(ns: &str, dev: &str, want: &[(Ipv4Addr, u8)]) -> Result<usize, NetError> {
    let out = ip(Some(ns), &["-j", "-4", "addr", "show", "dev", dev])?;
    let v: Value = serde_json::from_str(&out)
        .map_err(|e| NetError::Tool(format!("unreadable ip -j output: {e}")))?;
    let have: Vec<(Ipv4Addr, u8)> = v
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|l| l["addr_info"].as_array().cloned().unwrap_or_default())
        .filter_map(|a| {
            let ip = a["local"].as_str()?.parse().ok()?;
            let len = u8::try_from(a["prefixlen"].as_u64()?).ok()?;
            Some((ip, len))
        })
        .collect();
    let mut n = 0;
    for (a, len) in have.iter().filter(|h| !want.contains(h)) {
        ip(
            Some(ns),
            &["addr", "del", &format!("{a}/{len}"), "dev", dev],
        )?;
        n += 1;
    }
    for (a, len) in want.iter().filter(|w| !have.contains(w)) {
        ip(
            Some(ns),
            &["addr", "add", &format!("{a}/{len}"), "dev", dev],
        )?;
        n += 1;
    }
    Ok(n)
}

/// The default route's gateway in the namespace.
fn default_via(ns: &str) -> Result<Option<Ipv4Addr>, NetError> {
    let out = ip(Some(ns), &["-j", "-4", "route", "show", "default"])?;
    let v: Value = serde_json::from_str(&out)
        .map_err(|e| NetError::Tool(format!("unreadable ip -j output: {e}")))?;
    Ok(v.as_array()
        .and_then(|r| r.first())
        .and_then(|r| r["gateway"].as_str())
        .and_then(|g| g.parse().ok()))
}

/// The edge table as the kernel has it: its comment, and its `spoofed`
/// counter (packets, bytes). Read from nft's text listing: its JSON
/// leaves table comments out (nft 1.0.6).
fn table_state(ns: &str) -> Result<(Option<String>, (u64, u64)), NetError> {
    let (ok, out, _) = tool(
        Some(ns),
        "nft",
        "nftables",
        &["list", "table", "ip", crate::edge_rules::TABLE],
        None,
    )?;
    if !ok {
        return Ok((None, (0, 0)));
    }
    let comment = out.lines().find_map(|l| {
        l.trim()
            .strip_prefix("comment \"")
            .and_then(|c| c.strip_suffix('"'))
            .map(str::to_owned)
    });
    Ok((
        comment,
        crate::edge_rules::listed_spoofed(&out).unwrap_or((0, 0)),
    ))
}

/// What the edge's guard has dropped so far: packets from the segment
/// with an address not its own (`None`: no such edge table).
pub fn spoofed(ns: &str) -> Result<Option<u64>, NetError> {
    let (ok, out, _) = tool(
        Some(ns),
        "nft",
        "nftables",
        &["list", "counter", "ip", crate::edge_rules::TABLE, "spoofed"],
        None,
    )?;
    Ok(ok
        .then(|| crate::edge_rules::listed_spoofed(&out).map(|c| c.0))
        .flatten())
}

/// Where an edge's DNS keeps its names and pid (tmpfs; readable by the
/// unprivileged user dnsmasq runs as).
pub const DNS_RUN: &str = "/run/kumo/edges";

fn dns_dir(ns: &str) -> std::path::PathBuf {
    std::path::Path::new(DNS_RUN).join(ns)
}

/// The running dnsmasq of an edge, by its pid file (and only if that pid
/// is a dnsmasq: pids are reused).
pub fn dns_pid(ns: &str) -> Option<nix::unistd::Pid> {
    let pid: i32 = std::fs::read_to_string(dns_dir(ns).join("pid"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    (comm.trim() == "dnsmasq").then(|| nix::unistd::Pid::from_raw(pid))
}

/// Stops an edge's DNS and forgets its files. Waits for it to be gone
/// (killing it after a second): a process inside keeps the namespace, and
/// with it the edge's addresses, alive.
pub fn stop_dns(ns: &str) {
    use nix::sys::signal::{kill, Signal};
    if let Some(pid) = dns_pid(ns) {
        let _ = kill(pid, Signal::SIGTERM);
        let gone = || !std::path::Path::new(&format!("/proc/{pid}")).exists();
        for i in 0..100 {
            if gone() {
                break;
            }
            if i == 50 {
                let _ = kill(pid, Signal::SIGKILL);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    let _ = std::fs::remove_dir_all(dns_dir(ns));
}

/// The edge's DNS serves the segment's VM names: the names file is
/// rewritten when they change (and dnsmasq told to read it again), and
/// dnsmasq started when it is not running. Answers the changes made.
fn converge_dns(ns: &str, e: &Edge) -> Result<usize, NetError> {
    use std::os::unix::fs::PermissionsExt;
    let io = |what: &str, err: std::io::Error| NetError::Tool(format!("edge DNS {what}: {err}"));
    let dir = dns_dir(ns);
    std::fs::create_dir_all(&dir).map_err(|err| io("directory", err))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
        .map_err(|err| io("directory", err))?;
    let hosts = dir.join("hosts");
    let want: String = e
        .hosts
        .iter()
        .map(|h| format!("{} {}\n", h.addr, h.name))
        .collect();
    let changed = std::fs::read_to_string(&hosts).ok().as_deref() != Some(want.as_str());
    if changed {
        std::fs::write(&hosts, &want).map_err(|err| io("names", err))?;
        std::fs::set_permissions(&hosts, std::fs::Permissions::from_mode(0o644))
            .map_err(|err| io("names", err))?;
    }
    match dns_pid(ns) {
        Some(pid) if changed => {
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP)
                .map_err(|err| NetError::Tool(format!("edge DNS reload: {err}")))?;
            Ok(1)
        }
        Some(_) => Ok(0),
        None => {
            let args = [
                "--conf-file=/dev/null".to_owned(),
                "--no-hosts".to_owned(),
                format!("--addn-hosts={}", hosts.display()),
                format!("--pid-file={}", dir.join("pid").display()),
                format!("--listen-address={}", e.gateway),
                "--bind-interfaces".to_owned(),
                "--domain-needed".to_owned(),
                "--user=nobody".to_owned(),
                "--group=nogroup".to_owned(),
            ];
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            // It daemonises: the call returns once it serves.
            let (ok, _, err) = tool(Some(ns), "dnsmasq", "dnsmasq-base", &args, None)?;
            if !ok {
                return Err(NetError::Tool(format!("edge DNS: {}", err.trim())));
            }
            Ok(1)
        }
    }
}

/// Brings one edge to what it should be; answers the changes made.
fn converge_one(host: Option<&str>, uplink: &str, e: &Edge) -> Result<usize, NetError> {
    let ns = namespace(host, e.vni);
    let mut n = 0;
    if !std::path::Path::new("/run/netns").join(&ns).exists() {
        crate::netns::create(&ns).map_err(|source| NetError::Namespace {
            name: ns.clone(),
            source,
        })?;
        n += 1;
    }
    let mtu = e.mtu.to_string();
    // The host's end is named as the host's bridge filter knows it.
    let (lan_host, lan_peer) = (crate::filter::edge_leg(e.vni), format!("kgp{}", e.vni));
    if !link_exists(&ns, "lan")? {
        // A half-made leg of an earlier pass goes first.
        let _ = tool(host, "ip", "iproute2", &["link", "del", &lan_host], None);
        ip(
            host,
            &[
                "link", "add", &lan_host, "type", "veth", "peer", "name", &lan_peer, "netns", &ns,
            ],
        )?;
        ip(Some(&ns), &["link", "set", &lan_peer, "name", "lan"])?;
        n += 1;
    }
    ip(
        host,
        &[
            "link",
            "set",
            &lan_host,
            "master",
            &bridge_name(e.vni),
            "mtu",
            &mtu,
            "up",
        ],
    )?;
    let mac = gateway_mac(e.vni).to_string();
    ip(
        Some(&ns),
        &["link", "set", "lan", "address", &mac, "mtu", &mtu, "up"],
    )?;
    if !link_exists(&ns, "wan")? {
        let wan = format!("kgw{}", e.vni);
        let _ = tool(host, "ip", "iproute2", &["link", "del", &wan], None);
        ip(
            host,
            &[
                "link", "add", &wan, "link", uplink, "type", "macvlan", "mode", "bridge",
            ],
        )?;
        ip(host, &["link", "set", &wan, "netns", &ns])?;
        ip(Some(&ns), &["link", "set", &wan, "name", "wan"])?;
        n += 1;
    }
    ip(Some(&ns), &["link", "set", "wan", "up"])?;
    ip(Some(&ns), &["link", "set", "lo", "up"])?;
    n += sync_addrs(&ns, "lan", &[(e.gateway, e.cidr.len)])?;
    let public: Vec<(Ipv4Addr, u8)> = e.public.iter().map(|p| (p.addr, p.prefix)).collect();
    let added = sync_addrs(&ns, "wan", &public)?;
    if added > 0 {
        // Tell the provider network where the addresses are now (an edge
        // that moved here carries addresses its router knows elsewhere):
        // with arp_notify, bringing the leg up announces every address.
        within(Some(&ns), || {
            std::fs::write("/proc/sys/net/ipv4/conf/wan/arp_notify", "1")
                .map_err(|e| NetError::Tool(format!("setting arp_notify: {e}")))
        })?;
        ip(Some(&ns), &["link", "set", "wan", "down"])?;
        ip(Some(&ns), &["link", "set", "wan", "up"])?;
        n += added;
    }
    if let Some(g) = e.uplink_gateway.filter(|_| !public.is_empty()) {
        if default_via(&ns)? != Some(g) {
            ip(
                Some(&ns),
                &[
                    "route",
                    "replace",
                    "default",
                    "via",
                    &g.to_string(),
                    "dev",
                    "wan",
                ],
            )?;
            n += 1;
        }
    }
    // A router that forwards, and that never tells a VM to go around it:
    // a redirect for hairpinned traffic would send the VM to its
    // neighbour's private address with the public one as destination.
    // Strict reverse-path filtering on both legs: a packet is taken only
    // on the leg its source is routed through, so the outside cannot pass
    // for the segment either. (The table's guard is what holds the
    // segment to its own addresses, and counts: exact on the CIDR
    // whatever the routes, and before routing, where rp_filter's drops
    // would go uncounted.)
    within(Some(&ns), || {
        for (knob, value) in [
            ("/proc/sys/net/ipv4/ip_forward", "1"),
            ("/proc/sys/net/ipv4/conf/all/send_redirects", "0"),
            ("/proc/sys/net/ipv4/conf/lan/send_redirects", "0"),
            ("/proc/sys/net/ipv4/conf/all/rp_filter", "1"),
            ("/proc/sys/net/ipv4/conf/lan/rp_filter", "1"),
            ("/proc/sys/net/ipv4/conf/wan/rp_filter", "1"),
        ] {
            std::fs::write(knob, value)
                .map_err(|e| NetError::Tool(format!("setting {knob}: {e}")))?;
        }
        Ok(())
    })?;
    let (comment, spoofed) = table_state(&ns)?;
    if comment.as_deref() != Some(crate::edge_rules::comment(e).as_str()) {
        let script = crate::edge_rules::script(e, spoofed);
        let (ok, _, err) = tool(Some(&ns), "nft", "nftables", &["-f", "-"], Some(&script))?;
        if !ok {
            return Err(NetError::Tool(format!("edge rules: {}", err.trim())));
        }
        n += 1;
    }
    n += converge_dns(&ns, e)?;
    Ok(n)
}

/// What a pass over the edges did.
#[derive(Debug, Default)]
pub struct EdgesConverged {
    pub changes: usize,
    /// Edges that could not be set up, by VNI, with why.
    pub failed: BTreeMap<u32, String>,
}

/// Converges every edge of `want` (each on its own) and removes this
/// host's edge namespaces that are not wanted. `host` is a simulated
/// host's namespace (the agent's `--netns`), `uplink` the interface
/// towards the provider network.
pub fn converge(host: Option<&str>, uplink: &str, want: &[Edge]) -> EdgesConverged {
    let mut done = EdgesConverged::default();
    for e in want {
        match converge_one(host, uplink, e) {
            Ok(n) => done.changes += n,
            Err(err) => {
                done.failed.insert(e.vni, format!("edge: {err}"));
            }
        }
    }
    let names = std::fs::read_dir("/run/netns")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    for name in names {
        let Some(vni) = vni_of(host, &name) else {
            continue;
        };
        if want.iter().any(|e| e.vni == vni) {
            continue;
        }
        // The veth's and macvlan's ends inside go with the namespace,
        // and the veth's other end with them; its DNS goes first (a
        // process inside would keep the namespace alive).
        stop_dns(&name);
        match crate::netns::delete(&name) {
            Ok(()) => done.changes += 1,
            Err(err) => {
                done.failed
                    .insert(vni, format!("removing edge {name}: {err}"));
            }
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edge_namespaces_are_per_host_and_vni() {
        assert_eq!(namespace(None, 5000), "kedge5000");
        assert_eq!(namespace(Some("net-0"), 5000), "net-0-kedge5000");
        assert_eq!(vni_of(Some("net-0"), "net-0-kedge5000"), Some(5000));
        assert_eq!(vni_of(Some("net-0"), "net-1-kedge5000"), None);
        assert_eq!(vni_of(None, "kedge5000"), Some(5000));
        assert_eq!(vni_of(None, "kedge05"), None);
        assert_eq!(vni_of(None, "net-0-kedge5000"), None);
    }
}
