//! Which `kumo-server dev` owns a data directory: its process, its
//! namespaces' prefix and its agents (`fleet/owner.json`). A new `dev` on
//! the directory refuses while the owner runs, and removes what a killed
//! one left (agents that outlived it, namespaces) before it starts.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Owner {
    pub server_pid: u32,
    pub prefix: String,
    pub agents: Vec<u32>,
    /// The real host's leftovers, where the fleet has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qemu: Option<super::qemu::Leftovers>,
}

fn path(data_dir: &Path) -> PathBuf {
    data_dir.join("fleet").join("owner.json")
}

pub fn record(data_dir: &Path, o: &Owner) -> anyhow::Result<()> {
    let p = path(data_dir);
    if let Some(dir) = p.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&p, serde_json::to_vec_pretty(o)?)
        .with_context(|| format!("writing {}", p.display()))
}

/// Whether `pid` runs (not a zombie) a program named `program`: a
/// recorded pid reused by another program is not ours.
fn runs(pid: u32, program: &str) -> bool {
    let proc = PathBuf::from(format!("/proc/{pid}"));
    let zombie = std::fs::read_to_string(proc.join("stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()
                .map(|r| r.trim_start().starts_with('Z'))
        })
        .unwrap_or(true);
    let cmdline = std::fs::read(proc.join("cmdline")).unwrap_or_default();
    let first = cmdline.split(|b| *b == 0).next().unwrap_or_default();
    !zombie && String::from_utf8_lossy(first).ends_with(program)
}

/// Before a `dev` starts on `data_dir`: refuse if another runs there;
/// otherwise remove what the last one left.
pub fn take_over(data_dir: &Path) -> anyhow::Result<()> {
    let p = path(data_dir);
    let Ok(text) = std::fs::read_to_string(&p) else {
        return Ok(());
    };
    let Ok(old) = serde_json::from_str::<Owner>(&text) else {
        tracing::warn!(file = %p.display(), "unreadable dev fleet owner file; ignored");
        return Ok(());
    };
    if old.server_pid != std::process::id() && runs(old.server_pid, "kumo-server") {
        anyhow::bail!(
            "another kumo-server dev (pid {}) runs on {}: stop it first",
            old.server_pid,
            data_dir.display()
        );
    }
    let mut killed = 0;
    for pid in old.agents.iter().filter(|pid| runs(**pid, "kumo-agent")) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(*pid).unwrap_or(i32::MAX));
        if nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).is_ok() {
            killed += 1;
        }
    }
    if let Some(q) = &old.qemu {
        super::qemu::remove(q);
    }
    super::network::remove_all(&old.prefix);
    tracing::info!(
        old = old.server_pid,
        agents_killed = killed,
        prefix = %old.prefix,
        "removed what the last dev fleet on this data directory left"
    );
    let _ = std::fs::remove_file(&p);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pid_counts_only_for_its_own_program() {
        let me = std::process::id();
        let exe = std::env::current_exe().unwrap();
        let name = exe.file_name().unwrap().to_string_lossy().into_owned();
        assert!(runs(me, &name));
        assert!(!runs(me, "kumo-agent"));
        assert!(!runs(u32::MAX - 1, "kumo-agent"));
    }
}
