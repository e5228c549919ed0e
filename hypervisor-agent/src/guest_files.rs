//! Files the host agent keeps inside a running guest through the QEMU
//! guest agent: the VM's NCCL topology file, `/etc/nccl.conf` naming it,
//! and a cluster member's hostfile.
//!
//! Level-triggered like the rest: each pass reads what the guest has and
//! writes only what differs, so a guest that rebooted (and lost `/etc` on
//! a tmpfs, or was reinstalled) gets its files back on the next pass.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde_json::{json, Value};

pub const NCCL_TOPO_PATH: &str = "/etc/kumo/nccl-topo.xml";
pub const NCCL_CONF_PATH: &str = "/etc/nccl.conf";
/// A cluster member's MPI hostfile (`mpirun --hostfile`).
pub const HOSTFILE_PATH: &str = "/etc/kumo/hostfile";
/// Where a cluster member finds its siblings by name: a block of
/// `/etc/hosts` between these lines is Kumo's, the rest the guest's.
pub const ETC_HOSTS_PATH: &str = "/etc/hosts";
const HOSTS_BEGIN: &str = "# BEGIN kumo cluster members (kept by the host; edits are replaced)";
const HOSTS_END: &str = "# END kumo cluster members";
const NCCL_TOPO_KEY: &str = "NCCL_TOPO_FILE=";
const CHUNK: usize = 48 * 1024;

/// Talks to a guest's agent: sends one QMP command, returns its `return`.
pub trait GuestAgent {
    fn command(&self, cmd: &Value, timeout_secs: i32) -> Result<Value, String>;
}

impl GuestAgent for virt::domain::Domain {
    fn command(&self, cmd: &Value, timeout_secs: i32) -> Result<Value, String> {
        let out = self
            .qemu_agent_command(&cmd.to_string(), timeout_secs, 0)
            .map_err(|e| e.to_string())?;
        let v: Value =
            serde_json::from_str(&out).map_err(|e| format!("guest agent answered garbage: {e}"))?;
        Ok(v.get("return").cloned().unwrap_or(Value::Null))
    }
}

/// What a pass found or did, as reported on the VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Written,
    AlreadyThere,
    /// No agent answers (yet): the guest is booting, or has none.
    AgentMissing(String),
    /// The agent answers but refused (commands blocked, disk full, …).
    Failed(String),
}

impl Outcome {
    pub fn condition(&self) -> String {
        match self {
            Outcome::Written | Outcome::AlreadyThere => "nccl-topology written".into(),
            Outcome::AgentMissing(why) => {
                format!("nccl-topology pending: guest agent not available ({why})")
            }
            Outcome::Failed(why) => format!("nccl-topology failed: {why}"),
        }
    }
}

fn missing(e: &str) -> bool {
    e.contains("No such file or directory")
}

fn read(agent: &impl GuestAgent, path: &str) -> Result<Option<Vec<u8>>, String> {
    let handle = match agent.command(
        &json!({"execute": "guest-file-open", "arguments": {"path": path, "mode": "r"}}),
        5,
    ) {
        Ok(h) => h,
        Err(e) if missing(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut data = Vec::new();
    let result = (|| loop {
        let r = agent.command(
            &json!({"execute": "guest-file-read", "arguments": {"handle": handle, "count": CHUNK}}),
            5,
        )?;
        let chunk = r.get("buf-b64").and_then(Value::as_str).unwrap_or("");
        data.extend(
            B64.decode(chunk)
                .map_err(|e| format!("guest-file-read: {e}"))?,
        );
        if r.get("eof").and_then(Value::as_bool).unwrap_or(true) || data.len() > 16 << 20 {
            return Ok(());
        }
        // An agent that answers "more to come" with nothing would keep the
        // host's pass here for ever.
        if chunk.is_empty() {
            return Err(format!("guest-file-read of {path}: no data and no end"));
        }
    })();
    let _ = agent.command(
        &json!({"execute": "guest-file-close", "arguments": {"handle": handle}}),
        5,
    );
    result.map(|()| Some(data))
}

fn write(agent: &impl GuestAgent, path: &str, content: &[u8]) -> Result<(), String> {
    let handle = agent.command(
        &json!({"execute": "guest-file-open", "arguments": {"path": path, "mode": "w"}}),
        5,
    )?;
    let result = content.chunks(CHUNK).try_for_each(|c| {
        agent
            .command(&json!({"execute": "guest-file-write", "arguments": {"handle": handle, "buf-b64": B64.encode(c)}}), 5)
            .map(|_| ())
    });
    let closed = agent.command(
        &json!({"execute": "guest-file-close", "arguments": {"handle": handle}}),
        5,
    );
    result.and(closed.map(|_| ()))
}

/// What a program run in the guest left: its exit code and output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exited {
    pub code: Option<i64>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Runs `path args…` in the guest (`guest-exec`, output captured) and
/// waits up to `wait` for it to exit. qemu-ga keeps at most 16 MiB of a
/// program's output; callers bound what they read further.
pub fn exec(
    agent: &impl GuestAgent,
    path: &str,
    args: &[String],
    wait: std::time::Duration,
) -> Result<Exited, String> {
    let r = agent.command(
        &json!({"execute": "guest-exec", "arguments": {"path": path, "arg": args, "capture-output": true}}),
        5,
    )?;
    let pid = r.get("pid").cloned().ok_or("guest-exec answered no pid")?;
    let started = std::time::Instant::now();
    loop {
        let s = agent.command(
            &json!({"execute": "guest-exec-status", "arguments": {"pid": pid}}),
            5,
        )?;
        if s.get("exited").and_then(Value::as_bool) == Some(true) {
            let data = |key: &str| {
                s.get(key)
                    .and_then(Value::as_str)
                    .and_then(|b| B64.decode(b).ok())
                    .unwrap_or_default()
            };
            return Ok(Exited {
                code: s.get("exitcode").and_then(Value::as_i64),
                stdout: data("out-data"),
                stderr: data("err-data"),
            });
        }
        if started.elapsed() >= wait {
            return Err(format!("{path} in the guest did not finish in {wait:?}"));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// `mkdir -p` in the guest (`guest-file-open` does not create directories).
fn mkdir_p(agent: &impl GuestAgent, dir: &str) -> Result<(), String> {
    let done = exec(
        agent,
        "mkdir",
        &["-p".to_owned(), dir.to_owned()],
        std::time::Duration::from_secs(5),
    )?;
    match done.code {
        Some(0) => Ok(()),
        code => Err(format!("mkdir -p {dir} in the guest exited with {code:?}")),
    }
}

/// `/etc/nccl.conf` with its `NCCL_TOPO_FILE` line pointing at our file
/// and our `managed` settings, every other line kept (a tenant's own
/// `NCCL_DEBUG`, say; a line setting one of our keys is replaced).
pub fn nccl_conf(existing: Option<&[u8]>, managed: &[(String, String)]) -> Vec<u8> {
    let text = existing
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_default();
    let ours = |line: &str| {
        let line = line.trim_start();
        line.starts_with(NCCL_TOPO_KEY)
            || managed.iter().any(|(k, _)| {
                line.strip_prefix(k.as_str())
                    .is_some_and(|r| r.starts_with('='))
            })
    };
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| !ours(l))
        .map(str::to_owned)
        .collect();
    lines.push(format!("{NCCL_TOPO_KEY}{NCCL_TOPO_PATH}"));
    lines.extend(managed.iter().map(|(k, v)| format!("{k}={v}")));
    (lines.join("\n") + "\n").into_bytes()
}

/// `/etc/hosts` with Kumo's block of cluster members (`ADDRESS NAME`
/// lines) in place of the one it had, everything else as the guest has
/// it; a guest without the file gets localhost too. `None` for a file it
/// would not write back faithfully: larger than 1 MiB, not UTF-8.
pub fn etc_hosts(existing: Option<&[u8]>, block: &str) -> Option<Vec<u8>> {
    let text = match existing {
        Some(b) if b.len() > 1 << 20 => return None,
        Some(b) => std::str::from_utf8(b).ok()?.to_owned(),
        None => "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n".into(),
    };
    let all: Vec<&str> = text.lines().collect();
    // Only a whole block (the last begin line, then an end line) is ours:
    // a begin line without its end keeps everything after it.
    let begin = all.iter().rposition(|l| *l == HOSTS_BEGIN);
    let end = begin.and_then(|b| all[b..].iter().position(|l| *l == HOSTS_END).map(|e| b + e));
    let lines: Vec<&str> = match (begin, end) {
        (Some(b), Some(e)) => all[..b].iter().chain(&all[e + 1..]).copied().collect(),
        _ => all,
    };
    let mut out = lines.join("\n");
    if !out.is_empty() {
        out.push('\n');
    }
    out.push_str(HOSTS_BEGIN);
    out.push('\n');
    out.push_str(block);
    if !block.is_empty() && !block.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(HOSTS_END);
    out.push('\n');
    Some(out.into_bytes())
}

/// The RoCE settings for `plan`, from what the guest shows (see
/// [`crate::nccl_net`]), and what is still missing.
fn roce_settings(
    agent: &impl GuestAgent,
    plan: &crate::nccl_net::RocePlan,
) -> Result<(crate::nccl_net::Lines, Option<String>), String> {
    let shown = exec(
        agent,
        "/bin/sh",
        &["-c".to_owned(), crate::nccl_net::PROBE.to_owned()],
        // A guest whose shell stalls costs its host's pass this at most.
        std::time::Duration::from_secs(3),
    )?;
    // Bounded: the output is the guest's.
    let out = String::from_utf8_lossy(&shown.stdout[..shown.stdout.len().min(1 << 20)]);
    Ok(crate::nccl_net::settings(
        plan,
        &crate::nccl_net::parse(&out),
    ))
}

/// Where the guest finds the events scheduled for it: a JSON array of
/// `ScheduledEvent` (`[]` when none), rewritten when one is scheduled,
/// moved or called off.
pub const EVENTS_PATH: &str = "/run/kumo/events";

/// Keeps the NCCL topology file, `/etc/nccl.conf` (with the RoCE
/// settings for a VM on a RoCE segment), the scheduled events and, for a
/// cluster member, the cluster's hostfile in the guest. Also returns what
/// of the RoCE settings the guest could not show yet.
pub fn sync(
    agent: &impl GuestAgent,
    topology_xml: &str,
    hostfile: Option<&str>,
    members: Option<&str>,
    events_json: &str,
    roce: Option<&crate::nccl_net::RocePlan>,
) -> (Outcome, Option<String>) {
    if let Err(e) = agent.command(&json!({"execute": "guest-ping"}), 2) {
        return (Outcome::AgentMissing(e), None);
    }
    let mut pending = None;
    let mut run = || -> Result<Outcome, String> {
        let managed = match roce {
            Some(plan) => {
                let (lines, note) = roce_settings(agent, plan)?;
                pending = note;
                lines
            }
            None => Vec::new(),
        };
        let conf = read(agent, NCCL_CONF_PATH)?;
        let wanted_conf = nccl_conf(conf.as_deref(), &managed);
        let mut stale: Vec<(&str, &[u8])> = Vec::new();
        for (path, content) in [
            (NCCL_TOPO_PATH, Some(topology_xml)),
            (HOSTFILE_PATH, hostfile),
            (EVENTS_PATH, Some(events_json)),
        ] {
            let Some(content) = content else {
                continue;
            };
            if read(agent, path)?.as_deref() != Some(content.as_bytes()) {
                stale.push((path, content.as_bytes()));
            }
        }
        if conf.as_deref() != Some(&wanted_conf[..]) {
            stale.push((NCCL_CONF_PATH, &wanted_conf));
        }
        let wanted_hosts;
        if let Some(block) = members {
            let hosts = read(agent, ETC_HOSTS_PATH)?;
            // A file it cannot merge into faithfully is left alone.
            if let Some(w) = etc_hosts(hosts.as_deref(), block) {
                wanted_hosts = w;
                if hosts.as_deref() != Some(&wanted_hosts[..]) {
                    stale.push((ETC_HOSTS_PATH, &wanted_hosts));
                }
            }
        }
        if stale.is_empty() {
            return Ok(Outcome::AlreadyThere);
        }
        mkdir_p(agent, "/etc/kumo")?;
        mkdir_p(agent, "/run/kumo")?;
        for (path, content) in stale {
            write(agent, path, content)?;
        }
        Ok(Outcome::Written)
    };
    let outcome = run().unwrap_or_else(Outcome::Failed);
    (outcome, pending)
}

/// Where a reclaimed spot VM's guest finds its notice.
pub const PREEMPTION_PATH: &str = "/run/kumo/preemption";

/// Writes the preemption notice (JSON) into the guest; the outcome as
/// the VM's event reads it.
pub fn notify_preemption(agent: &impl GuestAgent, notice_json: &str) -> String {
    if let Err(e) = agent.command(&json!({"execute": "guest-ping"}), 2) {
        return format!("notice not delivered: guest agent not available ({e})");
    }
    let run = || -> Result<(), String> {
        mkdir_p(agent, "/run/kumo")?;
        write(agent, PREEMPTION_PATH, notice_json.as_bytes())
    };
    match run() {
        Ok(()) => format!("notice delivered to {PREEMPTION_PATH}"),
        Err(e) => format!("notice not delivered: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    /// An open guest file: path, contents, opened for writing, read offset.
    type OpenFile = (String, Vec<u8>, bool, usize);

    /// An in-memory guest that answers the guest-file-* and guest-exec
    /// commands the way qemu-ga does.
    #[derive(Default)]
    struct FakeGuest {
        files: RefCell<BTreeMap<String, Vec<u8>>>,
        dirs: RefCell<Vec<String>>,
        open: RefCell<BTreeMap<i64, OpenFile>>,
        blocked: bool,
        down: bool,
        /// What `sh -c` prints (the RoCE probe).
        shell: RefCell<String>,
        /// Reads answer "more to come" with nothing, for ever.
        stalling: bool,
    }

    impl GuestAgent for FakeGuest {
        fn command(&self, cmd: &Value, _t: i32) -> Result<Value, String> {
            if self.down {
                return Err("Guest agent is not responding".into());
            }
            let name = cmd["execute"].as_str().unwrap_or("");
            let a = &cmd["arguments"];
            if self.blocked && name.starts_with("guest-file") {
                return Err(format!("Command {name} has been disabled"));
            }
            match name {
                "guest-ping" => Ok(json!({})),
                "guest-exec" if a["arg"][0] == "-c" => Ok(json!({"pid": 8})),
                "guest-exec" => {
                    self.dirs
                        .borrow_mut()
                        .push(a["arg"][1].as_str().unwrap_or("").to_owned());
                    Ok(json!({"pid": 7}))
                }
                "guest-exec-status" if a["pid"] == 8 => Ok(
                    json!({"exited": true, "exitcode": 0, "out-data": B64.encode(self.shell.borrow().as_bytes())}),
                ),
                "guest-exec-status" => Ok(json!({"exited": true, "exitcode": 0})),
                "guest-file-open" => {
                    let path = a["path"].as_str().unwrap_or("").to_owned();
                    let write = a["mode"] == "w";
                    let dir = path
                        .rsplit_once('/')
                        .map(|(d, _)| d.to_owned())
                        .unwrap_or_default();
                    if write && dir != "/etc" && !self.dirs.borrow().contains(&dir) {
                        return Err(format!(
                            "failed to open file '{path}': No such file or directory"
                        ));
                    }
                    let data = if write {
                        Vec::new()
                    } else {
                        self.files.borrow().get(&path).cloned().ok_or(format!(
                            "failed to open file '{path}': No such file or directory"
                        ))?
                    };
                    let h = 1000 + self.open.borrow().len() as i64;
                    self.open.borrow_mut().insert(h, (path, data, write, 0));
                    Ok(json!(h))
                }
                "guest-file-read" if self.stalling => {
                    Ok(json!({"count": 0, "buf-b64": "", "eof": false}))
                }
                "guest-file-read" => {
                    let mut open = self.open.borrow_mut();
                    let f = open
                        .get_mut(&a["handle"].as_i64().unwrap_or(0))
                        .ok_or("bad handle")?;
                    let n = a["count"].as_u64().unwrap_or(0) as usize;
                    let end = (f.3 + n).min(f.1.len());
                    let chunk = f.1[f.3..end].to_vec();
                    f.3 = end;
                    Ok(
                        json!({"count": chunk.len(), "buf-b64": B64.encode(&chunk), "eof": end == f.1.len()}),
                    )
                }
                "guest-file-write" => {
                    let mut open = self.open.borrow_mut();
                    let f = open
                        .get_mut(&a["handle"].as_i64().unwrap_or(0))
                        .ok_or("bad handle")?;
                    f.1.extend(
                        B64.decode(a["buf-b64"].as_str().unwrap_or(""))
                            .map_err(|e| e.to_string())?,
                    );
                    Ok(json!({"count": 1}))
                }
                "guest-file-close" => {
                    let (path, data, write, _) = self
                        .open
                        .borrow_mut()
                        .remove(&a["handle"].as_i64().unwrap_or(0))
                        .ok_or("bad handle")?;
                    if write {
                        self.files.borrow_mut().insert(path, data);
                    }
                    Ok(json!({}))
                }
                other => Err(format!("unknown command {other}")),
            }
        }
    }

    #[test]
    fn the_preemption_notice_lands_in_run_kumo() {
        let g = FakeGuest::default();
        let said = notify_preemption(&g, "{\"deadline\":\"x\"}");
        assert_eq!(said, "notice delivered to /run/kumo/preemption");
        assert_eq!(
            g.files.borrow().get(PREEMPTION_PATH).map(Vec::as_slice),
            Some(&b"{\"deadline\":\"x\"}"[..])
        );
        assert!(g.dirs.borrow().iter().any(|d| d == "/run/kumo"));
        let down = FakeGuest {
            down: true,
            ..FakeGuest::default()
        };
        assert!(notify_preemption(&down, "{}").starts_with("notice not delivered"));
    }

    #[test]
    fn a_cluster_member_finds_its_siblings_in_etc_hosts_beside_the_guests_own_lines() {
        let g = FakeGuest::default();
        let mine = "127.0.0.1\tlocalhost\n10.0.0.9\tdb.lab\n";
        g.files
            .borrow_mut()
            .insert(ETC_HOSTS_PATH.into(), mine.as_bytes().to_vec());
        let block = "10.1.0.2\ttrain-0\n10.1.0.3\ttrain-1\n";
        let hostfile = Some("10.1.0.2 slots=8\n10.1.0.3 slots=8\n");
        assert_eq!(
            sync(&g, "<system/>\n", hostfile, Some(block), "[]", None).0,
            Outcome::Written
        );
        let now = String::from_utf8(g.files.borrow()[ETC_HOSTS_PATH].clone()).unwrap();
        assert!(now.starts_with(mine), "the guest's lines stay: {now}");
        assert!(now.contains("10.1.0.3\ttrain-1\n"), "{now}");
        assert_eq!(
            sync(&g, "<system/>\n", hostfile, Some(block), "[]", None).0,
            Outcome::AlreadyThere
        );
        // A member replaced at a new address: only Kumo's block changes,
        // once, and a line the guest added after it stays.
        let with_own = format!("{now}192.0.2.7\tlicence-server\n");
        g.files
            .borrow_mut()
            .insert(ETC_HOSTS_PATH.into(), with_own.into_bytes());
        let moved = "10.1.0.2\ttrain-0\n10.1.0.4\ttrain-1\n";
        sync(&g, "<system/>\n", hostfile, Some(moved), "[]", None);
        let after = String::from_utf8(g.files.borrow()[ETC_HOSTS_PATH].clone()).unwrap();
        assert!(
            after.contains("10.1.0.4\ttrain-1\n") && !after.contains("10.1.0.3"),
            "{after}"
        );
        assert!(
            after.contains("192.0.2.7\tlicence-server") && after.contains("db.lab"),
            "{after}"
        );
        assert_eq!(after.matches("# BEGIN kumo").count(), 1, "{after}");
        // A guest without the file gets localhost too.
        assert!(String::from_utf8(etc_hosts(None, block).unwrap())
            .unwrap()
            .starts_with("127.0.0.1\tlocalhost\n"));
        // A begin line without its end: nothing of the guest's is dropped.
        let torn = format!("{HOSTS_BEGIN}\n10.0.0.1\tmine\n");
        let merged = String::from_utf8(etc_hosts(Some(torn.as_bytes()), block).unwrap()).unwrap();
        assert!(merged.contains("10.0.0.1\tmine"), "{merged}");
        let again = String::from_utf8(etc_hosts(Some(merged.as_bytes()), block).unwrap()).unwrap();
        assert_eq!(again, merged, "and it stays so");
        // Not UTF-8, or huge: left alone.
        assert_eq!(etc_hosts(Some(b"\xff\xfe"), block), None);
        assert_eq!(etc_hosts(Some(&vec![b'#'; (1 << 20) + 1]), block), None);
    }

    #[test]
    fn a_cluster_member_gets_its_hostfile_and_keeps_it() {
        let g = FakeGuest::default();
        let hosts = "train-0 slots=8\ntrain-1 slots=8\n";
        assert_eq!(
            sync(&g, "<system/>\n", Some(hosts), None, "[]", None).0,
            Outcome::Written
        );
        assert_eq!(g.files.borrow()[HOSTFILE_PATH], hosts.as_bytes());
        assert_eq!(
            sync(&g, "<system/>\n", Some(hosts), None, "[]", None).0,
            Outcome::AlreadyThere
        );
        // Lost (reinstalled guest, edited by hand): written again.
        g.files
            .borrow_mut()
            .insert(HOSTFILE_PATH.into(), b"mine\n".to_vec());
        assert_eq!(
            sync(&g, "<system/>\n", Some(hosts), None, "[]", None).0,
            Outcome::Written
        );
        assert_eq!(g.files.borrow()[HOSTFILE_PATH], hosts.as_bytes());
        // A VM outside any cluster is not given one.
        let lone = FakeGuest::default();
        assert_eq!(
            sync(&lone, "<system/>\n", None, None, "[]", None).0,
            Outcome::Written
        );
        assert!(!lone.files.borrow().contains_key(HOSTFILE_PATH));
    }

    #[test]
    fn scheduled_events_are_kept_in_run_kumo_and_rewritten_when_they_move() {
        let g = FakeGuest::default();
        assert_eq!(
            sync(&g, "<system/>\n", None, None, "[]", None).0,
            Outcome::Written
        );
        assert_eq!(g.files.borrow()[EVENTS_PATH], b"[]");
        assert!(g.dirs.borrow().iter().any(|d| d == "/run/kumo"));
        let one = r#"[{"kind":"maintenance","at":"2026-12-01T09:00:00Z","action":"evacuate","host":"gpu-7"}]"#;
        assert_eq!(
            sync(&g, "<system/>\n", None, None, one, None).0,
            Outcome::Written
        );
        assert_eq!(g.files.borrow()[EVENTS_PATH], one.as_bytes());
        assert_eq!(
            sync(&g, "<system/>\n", None, None, one, None).0,
            Outcome::AlreadyThere
        );
        let moved = one.replace("09:00", "11:00");
        assert_eq!(
            sync(&g, "<system/>\n", None, None, &moved, None).0,
            Outcome::Written
        );
        assert_eq!(g.files.borrow()[EVENTS_PATH], moved.as_bytes());
    }

    #[test]
    fn writes_once_then_finds_it_there() {
        let g = FakeGuest::default();
        g.files.borrow_mut().insert(
            "/etc/nccl.conf".into(),
            b"NCCL_DEBUG=INFO\nNCCL_TOPO_FILE=/old.xml\n".to_vec(),
        );
        assert_eq!(
            sync(&g, "<system version=\"1\"/>\n", None, None, "[]", None).0,
            Outcome::Written
        );
        assert_eq!(
            g.files.borrow()[NCCL_TOPO_PATH],
            b"<system version=\"1\"/>\n"
        );
        assert_eq!(
            String::from_utf8(g.files.borrow()[NCCL_CONF_PATH].clone()).unwrap(),
            "NCCL_DEBUG=INFO\nNCCL_TOPO_FILE=/etc/kumo/nccl-topo.xml\n"
        );
        assert_eq!(
            sync(&g, "<system version=\"1\"/>\n", None, None, "[]", None).0,
            Outcome::AlreadyThere
        );
        // A changed topology is rewritten; a large one crosses chunk borders.
        let big = "x".repeat(3 * CHUNK + 5);
        assert_eq!(sync(&g, &big, None, None, "[]", None).0, Outcome::Written);
        assert_eq!(g.files.borrow()[NCCL_TOPO_PATH].len(), big.len());
        assert_eq!(
            sync(&g, &big, None, None, "[]", None).0,
            Outcome::AlreadyThere
        );
    }

    #[test]
    fn a_roce_vm_gets_nccl_ib_settings_once_its_vf_shows_up() {
        let g = FakeGuest::default();
        g.files
            .borrow_mut()
            .insert(NCCL_CONF_PATH.into(), b"NCCL_DEBUG=INFO\n".to_vec());
        let plan = crate::nccl_net::RocePlan {
            rails: vec![("02:6b:00:00:00:07".into(), "10.2.0.7".parse().unwrap())],
            traffic_class: 104,
            socket_mac: Some("02:6b:00:00:00:01".into()),
        };
        // Booting: the VF's driver is not up yet.
        *g.shell.borrow_mut() = "--\neth0/address:02:6b:00:00:00:01\n".into();
        let (o, pending) = sync(&g, "<system/>\n", None, None, "[]", Some(&plan));
        assert_eq!(o, Outcome::Written);
        assert_eq!(
            pending.as_deref(),
            Some("nccl-roce pending: no NIC with MAC 02:6b:00:00:00:07")
        );
        let conf = || String::from_utf8(g.files.borrow()[NCCL_CONF_PATH].clone()).unwrap();
        assert_eq!(
            conf(),
            "NCCL_DEBUG=INFO\nNCCL_TOPO_FILE=/etc/kumo/nccl-topo.xml\nNCCL_IB_TC=104\nNCCL_SOCKET_IFNAME==eth0\n"
        );
        // Up, with its address: the HCA and its RoCEv2 GID join.
        *g.shell.borrow_mut() = "mlx5_0/ports/1/gid_attrs/ndevs/3:ens6\nmlx5_0/ports/1/gid_attrs/types/3:RoCE v2\nmlx5_0/ports/1/gids/3:0000:0000:0000:0000:0000:ffff:0a02:0007\n--\neth0/address:02:6b:00:00:00:01\nens6/address:02:6b:00:00:00:07\n".into();
        assert_eq!(
            sync(&g, "<system/>\n", None, None, "[]", Some(&plan)),
            (Outcome::Written, None)
        );
        assert_eq!(
            conf(),
            "NCCL_DEBUG=INFO\nNCCL_TOPO_FILE=/etc/kumo/nccl-topo.xml\nNCCL_IB_TC=104\nNCCL_IB_HCA==mlx5_0:1\nNCCL_IB_GID_INDEX=3\nNCCL_SOCKET_IFNAME==eth0\n"
        );
        assert_eq!(
            sync(&g, "<system/>\n", None, None, "[]", Some(&plan)),
            (Outcome::AlreadyThere, None)
        );
    }

    #[test]
    fn a_guest_agent_that_never_ends_a_read_fails_the_pass_instead_of_holding_it() {
        let g = FakeGuest {
            stalling: true,
            ..FakeGuest::default()
        };
        g.files
            .borrow_mut()
            .insert(NCCL_CONF_PATH.into(), b"x".to_vec());
        let c = sync(&g, "<system/>\n", None, None, "[]", None)
            .0
            .condition();
        assert!(c.contains("no data and no end"), "{c}");
    }

    #[test]
    fn missing_and_blocked_agents_are_reported_clearly() {
        let down = FakeGuest {
            down: true,
            ..FakeGuest::default()
        };
        assert!(sync(&down, "x", None, None, "[]", None)
            .0
            .condition()
            .starts_with("nccl-topology pending: guest agent not available"));
        let blocked = FakeGuest {
            blocked: true,
            ..FakeGuest::default()
        };
        let c = sync(&blocked, "x", None, None, "[]", None).0.condition();
        assert!(
            c.starts_with("nccl-topology failed:") && c.contains("disabled"),
            "{c}"
        );
    }

    #[test]
    fn conf_keeps_other_settings() {
        assert_eq!(
            nccl_conf(None, &[]),
            b"NCCL_TOPO_FILE=/etc/kumo/nccl-topo.xml\n"
        );
        assert_eq!(
            nccl_conf(Some(b"A=1\n  NCCL_TOPO_FILE=/x\nB=2"), &[]),
            b"A=1\nB=2\nNCCL_TOPO_FILE=/etc/kumo/nccl-topo.xml\n"
        );
        // Our RoCE keys replace the tenant's; a key that merely starts
        // like one of ours (`NCCL_IB_TC_X`) is the tenant's.
        let managed = [("NCCL_IB_TC".to_owned(), "104".to_owned())];
        assert_eq!(
            String::from_utf8(nccl_conf(
                Some(b"NCCL_IB_TC=0\nNCCL_IB_TC_X=1\nNCCL_DEBUG=WARN\n"),
                &managed
            ))
            .unwrap(),
            "NCCL_IB_TC_X=1\nNCCL_DEBUG=WARN\nNCCL_TOPO_FILE=/etc/kumo/nccl-topo.xml\nNCCL_IB_TC=104\n"
        );
    }
}
