//! NVIDIA Fabric Manager in shared NVSwitch mode, through its `fmpm`
//! client (NVIDIA/Fabric-Manager-Client): the partitions a host's
//! baseboard supports, and activating a VM's before it starts.
//!
//! `fmpm` speaks to Fabric Manager (`--hostname`, port 6666 by default)
//! and prints `-l` as JSON, nothing on a successful `-a`/`-d`/
//! `--set-activated-list`, and `Failed to … fmReturn: N` otherwise, with
//! `N` a Fabric Manager status (`FM_ST_*`). The agent runs it with the
//! arguments an operator configures (`--fabric-manager "fmpm --hostname
//! 10.0.0.5"`).
//!
//! [`standin`] answers the same way for hosts with no NVSwitch hardware
//! (tests, the dev fleet): the one stand-in of this project, named as such.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kumo_topology::partitions::parse_list;
use kumo_topology::{Bdf, Partition};

/// How long one `fmpm` call may take (it connects over TCP).
const CALL_TIMEOUT: Duration = Duration::from_secs(20);

/// Fabric Manager's statuses (`nv_fm_types.h`), in words.
pub fn status_words(code: i64) -> &'static str {
    match code {
        -1 => "bad parameter or unsupported partition (FM_ST_BADPARAM)",
        -2 => "generic error (FM_ST_GENERIC_ERROR)",
        -3 => "not supported (FM_ST_NOT_SUPPORTED)",
        -4 => "the partition is not active (FM_ST_UNINITIALIZED)",
        -5 => "timed out (FM_ST_TIMEOUT)",
        -6 => "version mismatch (FM_ST_VERSION_MISMATCH)",
        -7 => "the partition is already active or its GPUs are in another active partition (FM_ST_IN_USE)",
        -8 => "Fabric Manager is initialising or waits for the activated-partition list (FM_ST_NOT_CONFIGURED)",
        -9 => "no connection to Fabric Manager (FM_ST_CONNECTION_NOT_VALID)",
        _ => "unknown Fabric Manager status",
    }
}

/// Why a call failed: Fabric Manager's status when it gave one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FmError {
    pub status: Option<i64>,
    pub message: String,
}

impl std::fmt::Display for FmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// `… fmReturn: -7` → -7.
fn fm_return(text: &str) -> Option<i64> {
    let at = text.rfind("fmReturn:")?;
    text[at + "fmReturn:".len()..]
        .split_whitespace()
        .next()?
        .trim_end_matches(['.', ','])
        .parse()
        .ok()
}

/// A host's Fabric Manager, through `fmpm`.
#[derive(Debug, Clone)]
pub struct Fmpm {
    /// The program and its fixed arguments.
    argv: Vec<String>,
    /// The host's GPUs by module id (module 1 first).
    modules: Vec<Bdf>,
}

impl Fmpm {
    pub fn new(argv: Vec<String>, modules: Vec<Bdf>) -> Fmpm {
        Fmpm { argv, modules }
    }

    fn call(&self, args: &[String]) -> Result<String, FmError> {
        let fail = |message: String| FmError {
            status: fm_return(&message),
            message,
        };
        let (program, fixed) = self
            .argv
            .split_first()
            .ok_or_else(|| fail("no Fabric Manager client configured".into()))?;
        let mut child = Command::new(program)
            .args(fixed)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| fail(format!("cannot run {program}: {e}")))?;
        // Read as it comes: a client that prints more than a pipe holds
        // would otherwise block until the timeout.
        let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                if let Some(p) = pipe {
                    use std::io::Read;
                    // Bounded: a misbehaving client must not fill the
                    // agent's memory.
                    let _ = p.take(1 << 20).read_to_end(&mut buf);
                }
                buf
            })
        };
        let stdout = drain(
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
        );
        let stderr = drain(
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
        );
        let started = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) if started.elapsed() < CALL_TIMEOUT => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(fail(format!(
                        "{program} {} did not answer in {CALL_TIMEOUT:?}",
                        args.join(" ")
                    )));
                }
                Err(e) => return Err(fail(format!("waiting for {program}: {e}"))),
            }
        };
        let text = |t: std::thread::JoinHandle<Vec<u8>>| {
            String::from_utf8_lossy(&t.join().unwrap_or_default()).into_owned()
        };
        let stdout = text(stdout);
        let said = format!("{}{}", stdout.trim(), text(stderr).trim());
        // fmpm exits with the status it got; it also prints failures on
        // stdout with a zero exit in some versions.
        match (status.success(), fm_return(&said)) {
            (true, None) => Ok(stdout),
            (_, Some(code)) => Err(FmError {
                status: Some(code),
                message: format!("{} ({})", said.trim(), status_words(code)),
            }),
            (false, None) => Err(fail(format!(
                "{program} {} failed ({status}): {}",
                args.join(" "),
                said.trim()
            ))),
        }
    }

    /// The supported partitions, each with whether it is active.
    pub fn list(&self) -> Result<Vec<(Partition, bool)>, FmError> {
        let out = self.call(&["-l".to_owned()])?;
        parse_list(&out, &self.modules).map_err(|message| FmError {
            status: None,
            message,
        })
    }

    pub fn activate(&self, id: u32) -> Result<(), FmError> {
        self.call(&["-a".to_owned(), id.to_string()]).map(drop)
    }

    pub fn deactivate(&self, id: u32) -> Result<(), FmError> {
        self.call(&["-d".to_owned(), id.to_string()]).map(drop)
    }

    /// Tells a (re)started Fabric Manager which partitions are active (it
    /// rejects partition calls until it hears, and exits after 60 s
    /// without).
    pub fn set_activated(&self, ids: &[u32]) -> Result<(), FmError> {
        let list = ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        self.call(&["--set-activated-list".to_owned(), list])
            .map(drop)
    }
}

/// Splits `--fabric-manager`'s value into the program and its arguments.
pub fn argv(command: &str) -> Vec<String> {
    command.split_whitespace().map(str::to_owned).collect()
}

/// A stand-in for Fabric Manager and `fmpm` on hosts without NVSwitch
/// hardware (named as such wherever it is used): `kumo-agent
/// fabric-manager-standin --state FILE <fmpm arguments>` keeps a partition
/// table and the active set in FILE, answers `-l`, `-a`, `-d` and
/// `--set-activated-list` in `fmpm`'s format with Fabric Manager's rules
/// (a partition's GPUs in one active partition at a time; after a restart
/// nothing but the activated list is taken), and records every call.
pub mod standin {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;

    use kumo_topology::partitions::{FmGpu, FmList, FmPartition};
    use serde::{Deserialize, Serialize};

    /// What the stand-in keeps (a test may edit it).
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
    pub struct State {
        /// Partition id → physical (module) ids.
        pub partitions: BTreeMap<u32, Vec<u32>>,
        pub active: BTreeSet<u32>,
        /// Every call, as its arguments.
        #[serde(default)]
        pub calls: Vec<String>,
        /// Fabric Manager is down: every call fails to connect.
        #[serde(default)]
        pub down: bool,
        /// Fabric Manager restarted: it takes only the activated list.
        #[serde(default)]
        pub restarted: bool,
        /// Partitions whose activation fails, with the status it fails with.
        #[serde(default)]
        pub failing: BTreeMap<u32, i64>,
    }

    impl State {
        /// An 8-GPU HGX baseboard's default table, nothing active.
        pub fn hgx() -> State {
            State {
                partitions: kumo_topology::partitions::hgx_8gpu_table()
                    .into_iter()
                    .collect(),
                ..State::default()
            }
        }

        pub fn load(path: &Path) -> Result<State, String> {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("reading {}: {e}", path.display()))?;
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
        }

        pub fn save(&self, path: &Path) -> Result<(), String> {
            let tmp = path.with_extension("tmp");
            let text = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
            std::fs::write(&tmp, text).map_err(|e| format!("writing {}: {e}", tmp.display()))?;
            std::fs::rename(&tmp, path).map_err(|e| format!("writing {}: {e}", path.display()))
        }

        fn list(&self) -> String {
            let list = FmList {
                partition_info: self
                    .partitions
                    .iter()
                    .map(|(id, gpus)| FmPartition {
                        partition_id: *id,
                        is_active: u32::from(self.active.contains(id)),
                        num_gpus: gpus.len() as u32,
                        gpu_info: gpus
                            .iter()
                            .map(|m| FmGpu {
                                physical_id: *m,
                                // As H100 and later report them: empty.
                                pci_bus_id: "00000000:00:00.0".into(),
                                uuid: String::new(),
                                num_nv_links_available: if gpus.len() > 1 { 18 } else { 0 },
                                max_num_nv_links: 18,
                                nvlink_line_rate_m_bps: 26562,
                            })
                            .collect(),
                    })
                    .collect(),
            };
            serde_json::to_string_pretty(&list).unwrap_or_default()
        }

        /// One `fmpm` invocation: what it prints and its exit status.
        pub fn call(&mut self, args: &[String]) -> (String, i32) {
            self.calls.push(args.join(" "));
            let failed = |what: &str, code: i64| {
                (
                    format!("Failed to {what}. fmReturn: {code}\n"),
                    (code as i32) & 0xff,
                )
            };
            if self.down {
                return failed("connect to Fabric Manager instance", -9);
            }
            let id = |i: usize| args.get(i).and_then(|a| a.parse::<u32>().ok());
            match args.first().map(String::as_str) {
                Some("--set-activated-list") => {
                    let ids: Option<BTreeSet<u32>> = args
                        .get(1)
                        .map(|l| {
                            l.split(',')
                                .filter(|s| !s.is_empty())
                                .map(|s| s.parse().ok())
                                .collect()
                        })
                        .unwrap_or(Some(BTreeSet::new()));
                    match ids {
                        Some(ids) if ids.iter().all(|i| self.partitions.contains_key(i)) => {
                            self.active = ids;
                            self.restarted = false;
                            (String::new(), 0)
                        }
                        _ => failed("set activated partition list", -1),
                    }
                }
                _ if self.restarted => failed("query or change partitions", -8),
                Some("-l") => (self.list(), 0),
                Some("-a") => match id(1) {
                    Some(p) if !self.partitions.contains_key(&p) => {
                        failed("activate partition", -1)
                    }
                    Some(p) if self.failing.contains_key(&p) => {
                        failed("activate partition", self.failing[&p])
                    }
                    Some(p) => {
                        let gpus: BTreeSet<u32> = self.partitions[&p].iter().copied().collect();
                        let busy = self
                            .active
                            .iter()
                            .any(|a| self.partitions[a].iter().any(|g| gpus.contains(g)));
                        if busy {
                            failed("activate partition", -7)
                        } else {
                            self.active.insert(p);
                            (String::new(), 0)
                        }
                    }
                    None => failed("activate partition", -1),
                },
                Some("-d") => match id(1) {
                    Some(p) if self.active.remove(&p) => (String::new(), 0),
                    _ => failed("deactivate partition", -4),
                },
                _ => (
                    format!("fabric-manager stand-in: unsupported arguments {args:?}\n"),
                    2,
                ),
            }
        }
    }

    /// Runs one call against the state in `path` (locked, so that
    /// concurrent calls see each other's changes).
    pub fn run(path: &Path, args: &[String]) -> (String, i32) {
        use nix::fcntl::{Flock, FlockArg};
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path.with_extension("lock"));
        let _held = match lock.map(|f| Flock::lock(f, FlockArg::LockExclusive)) {
            Ok(Ok(held)) => held,
            Ok(Err((_, e))) => return (format!("fabric-manager stand-in: lock: {e}\n"), 1),
            Err(e) => return (format!("fabric-manager stand-in: {e}\n"), 1),
        };
        let mut state = match State::load(path) {
            Ok(s) => s,
            Err(e) => return (format!("fabric-manager stand-in: {e}\n"), 1),
        };
        let out = state.call(args);
        if let Err(e) = state.save(path) {
            return (format!("fabric-manager stand-in: {e}\n"), 1);
        }
        out
    }
}

/// Where the dev fleet and tests keep a host's stand-in state.
pub fn standin_state(state_dir: &std::path::Path) -> PathBuf {
    state_dir.join("fabric-manager-standin.json")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::standin::State;
    use super::*;

    fn a(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_standin_keeps_fabric_managers_rules() {
        let mut s = State::hgx();
        assert_eq!(s.call(&a(&["-a", "3"])).1, 0);
        // GPU 1 is in partition 3: neither 0 nor 7 (GPU 1 alone) may start.
        let (said, code) = s.call(&a(&["-a", "7"]));
        assert_eq!(
            (said.trim(), code),
            ("Failed to activate partition. fmReturn: -7", 249)
        );
        assert_eq!(fm_return(&said), Some(-7));
        assert_eq!(
            s.call(&a(&["-a", "99"])).0.trim(),
            "Failed to activate partition. fmReturn: -1"
        );
        assert_eq!(s.call(&a(&["-a", "8"])).1, 0, "GPU 2 alone is free");
        assert_eq!(s.call(&a(&["-d", "3"])).1, 0);
        assert_eq!(s.call(&a(&["-d", "3"])).1, (-4i32) & 0xff);
        // A restart: only the activated list is taken, then all again.
        s.restarted = true;
        assert_eq!(s.call(&a(&["-l"])).1, (-8i32) & 0xff);
        assert_eq!(s.call(&a(&["--set-activated-list", "8,5"])).1, 0);
        let listed = parse_list(&s.call(&a(&["-l"])).0, &modules()).unwrap();
        let active: Vec<u32> = listed
            .iter()
            .filter(|(_, on)| *on)
            .map(|(p, _)| p.id)
            .collect();
        assert_eq!(active, vec![5, 8]);
        assert_eq!(listed[0].0.gpus.len(), 8);
        assert_eq!(s.calls.len(), 9, "every call recorded");
    }

    fn modules() -> Vec<Bdf> {
        (1..=8).map(|i| Bdf::new(0, i * 16, 0, 0)).collect()
    }

    #[test]
    fn fmpm_failures_carry_fabric_managers_status_in_words() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("fmpm");
        std::fs::write(
            &script,
            "#!/bin/sh\ncase \"$1\" in -a) echo 'Failed to activate partition. fmReturn: -7'; exit 249;; -l) echo '{\"partitionInfo\":[]}';; esac\n",
        )
        .unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let fm = Fmpm::new(vec![script.display().to_string()], modules());
        let e = fm.activate(3).unwrap_err();
        assert_eq!(e.status, Some(-7));
        assert!(e.message.contains("FM_ST_IN_USE"), "{e}");
        assert_eq!(fm.list().unwrap(), vec![]);
        let missing = Fmpm::new(vec!["/nonexistent/fmpm".into()], modules());
        assert!(missing
            .list()
            .unwrap_err()
            .message
            .starts_with("cannot run"));
    }
}
