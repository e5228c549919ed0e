//! Project shares on the host: the shared filesystem every host mounts at
//! the same place (`--shares-root`), the directories of the shares this
//! host keeps (made, limited, measured, deleted), and what a VM's
//! `virtiofsd` is given for each of its shares.
//!
//! A share's limit holds by the filesystem's project quota where it has
//! one (ext4 or XFS mounted with `prjquota`, and `setquota` at hand:
//! `chattr +P -p ID DIR`, `setquota -P ID 0 KIB 0 0 MOUNT`, usage from
//! `repquota -P`). Elsewhere usage is measured by walking the directory
//! and the server turns the share read-only past its size.
//!
//! Lustre is both: the agent sets the project's hard limit (`lfs project
//! -p ID -s DIR`, `lfs setquota -p ID -B KIB MOUNT`) and reads its
//! usage from Lustre's own accounting (`lfs quota -q -p ID MOUNT`, no
//! walk), but reports the share as measured, so the server still turns
//! it read-only past its size: Lustre's quotas never bind root, and a
//! guest's root writes through virtiofsd as root; whether the servers
//! enforce at all (`quota_slave_dt.enabled`) a client cannot see.
//!
//! Read-only mounts are a read-only bind of the share's directory under
//! the agent's state directory: Debian 12's virtiofsd has no read-only
//! mode and libvirt 9 refuses `<readonly/>` for virtiofs. The bind is
//! decided at the VM's start: virtiofsd keeps its own mount namespace,
//! so remounting a bind later changes nothing for a running guest.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kumo_api_types::{
    DesiredMount, DesiredShare, ShareLimit, ShareStatus, SharesStorage, VolumeActual,
};
use uuid::Uuid;

/// Walks measuring shares at once on a keeper.
const WALKS: usize = 2;

/// A share's usage as last measured.
#[derive(Debug, Default, Clone, Copy)]
struct Measured {
    at: Option<Instant>,
    bytes: Option<u64>,
    /// The walk stopped at [`WALK_MAX`] files.
    uncounted: bool,
    walking: bool,
}

/// How often a share's usage is read again.
const MEASURE_EVERY: Duration = Duration::from_secs(20);
/// Files a measuring walk reads at most (then it says "at least").
const WALK_MAX: u64 = 2_000_000;
/// Where a deleted share's directory waits for its data to go.
const DELETING: &str = ".deleting-";

/// One line of `/proc/self/mountinfo`, the parts that matter here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub mount_point: PathBuf,
    pub fstype: String,
    pub source: String,
    /// Per-mount and superblock options together.
    pub options: Vec<String>,
}

/// `/proc/self/mountinfo` parsed; lines that do not fit are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let left: Vec<&str> = left.split(' ').collect();
            let right: Vec<&str> = right.split(' ').collect();
            let mount_point = unescape(left.get(4)?);
            let mut options: Vec<String> = left.get(5)?.split(',').map(str::to_owned).collect();
            options.extend(right.get(2).unwrap_or(&"").split(',').map(str::to_owned));
            Some(MountEntry {
                mount_point: PathBuf::from(mount_point),
                fstype: (*right.first()?).to_owned(),
                source: (*right.get(1)?).to_owned(),
                options,
            })
        })
        .collect()
}

/// mountinfo writes space, tab, newline and backslash as octal escapes.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let code = std::str::from_utf8(&b[i + 1..i + 4])
                .ok()
                .and_then(|o| u8::from_str_radix(o, 8).ok());
            if let Some(v) = code {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount a path is on: the deepest mount point above it (the last
/// listed wins, as later mounts cover earlier ones).
pub fn mount_of<'a>(mounts: &'a [MountEntry], path: &Path) -> Option<&'a MountEntry> {
    mounts
        .iter()
        .filter(|m| path.starts_with(&m.mount_point))
        .max_by_key(|m| m.mount_point.components().count())
}

/// Whether a mount enforces project quotas.
pub fn has_project_quota(m: &MountEntry) -> bool {
    matches!(m.fstype.as_str(), "ext4" | "xfs")
        && m.options.iter().any(|o| o == "prjquota" || o == "pquota")
}

/// The tools that set a share's project limit and read its usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaTools {
    /// ext4 or XFS with `prjquota`: `chattr`, `setquota`, `repquota`.
    Linux,
    /// Lustre: `lfs project`, `lfs setquota`, `lfs quota`.
    Lustre,
}

impl QuotaTools {
    /// What the filesystem of `m` takes, given which tools are installed.
    pub fn of(m: &MountEntry, have: &dyn Fn(&str) -> bool) -> Option<QuotaTools> {
        if has_project_quota(m) && have("setquota") && have("chattr") {
            Some(QuotaTools::Linux)
        } else if m.fstype == "lustre" && have("lfs") {
            Some(QuotaTools::Lustre)
        } else {
            None
        }
    }

    /// How a share's size holds: by the filesystem, or measured (and
    /// read-only past it) where its quota does not bind every writer.
    pub fn limit(tools: Option<QuotaTools>) -> ShareLimit {
        match tools {
            Some(QuotaTools::Linux) => ShareLimit::ProjectQuota,
            Some(QuotaTools::Lustre) | None => ShareLimit::Measured,
        }
    }

    /// The command lines that put `dir` in `project` and limit the
    /// project to `kib` on the filesystem mounted at `mount`.
    pub fn set_limit(self, project: u32, dir: &Path, kib: u64, mount: &Path) -> Vec<Vec<String>> {
        let (project, kib) = (project.to_string(), kib.to_string());
        let (dir, mount) = (dir.display().to_string(), mount.display().to_string());
        let line = |args: &[&str]| args.iter().map(|a| (*a).to_owned()).collect();
        match self {
            QuotaTools::Linux => vec![
                line(&["chattr", "+P", "-p", &project, &dir]),
                line(&["setquota", "-P", &project, "0", &kib, "0", "0", &mount]),
            ],
            // -s: what is made in it inherits the project. Not -r: a
            // walk of a tenant's tree, as root, on every resize and
            // restart; a share is tagged when made, before it holds files.
            QuotaTools::Lustre => vec![
                line(&["lfs", "project", "-p", &project, "-s", &dir]),
                line(&["lfs", "setquota", "-p", &project, "-B", &kib, &mount]),
            ],
        }
    }
}

/// `lfs quota -q -p ID MOUNT` output: the bytes the project uses on the
/// filesystem mounted at `mount` (the figure after the mount point, in
/// KiB, `*` when past a limit; a long mount point sits on a line of its
/// own, its figures on the next).
pub fn parse_lfs_quota(text: &str, mount: &Path) -> Option<u64> {
    let mount = mount.display().to_string();
    let mut words = text.split_whitespace();
    words.find(|w| *w == mount)?;
    let kib: u64 = words.next()?.trim_end_matches('*').parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// `repquota -P -n` output: project id → bytes used (its block figure is
/// in KiB; a `+` in the flags marks a project past a limit).
pub fn parse_repquota(text: &str) -> HashMap<u32, u64> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let id: u32 = f.next()?.strip_prefix('#')?.parse().ok()?;
            let _flags = f.next()?;
            let kib: u64 = f.next()?.trim_end_matches('*').parse().ok()?;
            Some((id, kib.saturating_mul(1024)))
        })
        .collect()
}

/// A Lustre project's usage, from Lustre's accounting (always whole).
fn lfs_usage(project: u32, mount: &Path) -> std::io::Result<(u64, bool)> {
    let text = run(Command::new("lfs")
        .args(["quota", "-q", "-p", &project.to_string()])
        .arg(mount))
    .map_err(std::io::Error::other)?;
    parse_lfs_quota(&text, mount)
        .map(|bytes| (bytes, true))
        .ok_or_else(|| std::io::Error::other(format!("lfs quota said nothing readable: {text}")))
}

/// Bytes a directory tree takes (allocated blocks, as `du`), staying on
/// its filesystem and never following links; `false` when the walk
/// stopped at [`WALK_MAX`] files (the figure is then a lower bound).
pub fn measure(dir: &Path) -> std::io::Result<(u64, bool)> {
    use std::os::unix::fs::MetadataExt;
    let top = std::fs::symlink_metadata(dir)?;
    let dev = top.dev();
    let mut bytes = top.blocks() * 512;
    let mut files = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue; // gone meanwhile, or unreadable: not counted
        };
        for e in entries.flatten() {
            files += 1;
            if files > WALK_MAX {
                return Ok((bytes, false));
            }
            let Ok(m) = e.path().symlink_metadata() else {
                continue;
            };
            if m.dev() != dev {
                continue;
            }
            bytes += m.blocks() * 512;
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    Ok((bytes, true))
}

/// The host's shared filesystem, as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharesConfig {
    pub root: PathBuf,
    /// The root must be a mount point (production). The dev fleet's
    /// simulated hosts share a plain directory instead.
    pub require_mount: bool,
}

/// The shares side of an agent: the root, and what it keeps.
pub struct Shares {
    config: SharesConfig,
    /// Read-only binds live here, one per share.
    binds: PathBuf,
    /// The limit each kept share's quota was last set to.
    limits: HashMap<Uuid, u32>,
    /// Each share's usage as last measured (walks run on threads of their
    /// own, at most [`WALKS`] at once: a tenant's million files never hold
    /// up the host's pass).
    usage: Arc<Mutex<HashMap<Uuid, Measured>>>,
}

fn mounts() -> Vec<MountEntry> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| parse_mountinfo(&t))
        .unwrap_or_default()
}

fn run(cmd: &mut Command) -> Result<String, String> {
    let what = format!("{cmd:?}");
    let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn have(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

/// Why shares cannot be used here now, if they cannot.
fn problem(config: &SharesConfig, mounts: &[MountEntry]) -> Option<String> {
    let root = &config.root;
    match std::fs::metadata(root) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Some(format!(
                "the shares root {} is not a directory",
                root.display()
            ))
        }
        Err(e) => return Some(format!("the shares root {}: {e}", root.display())),
    }
    if config.require_mount && !mounts.iter().any(|m| m.mount_point == *root) {
        return Some(format!(
            "the shared filesystem is not mounted at {}",
            root.display()
        ));
    }
    None
}

/// The quota tools of the shares' filesystem, if it has any.
fn quota_tools(config: &SharesConfig, mounts: &[MountEntry]) -> Option<QuotaTools> {
    mount_of(mounts, &config.root).and_then(|m| QuotaTools::of(m, &have))
}

/// The shared filesystem as the heartbeat reports it.
pub fn survey(config: &SharesConfig) -> SharesStorage {
    let mounts = mounts();
    let problem = problem(config, &mounts);
    let (capacity_gib, free_gib) = match nix::sys::statvfs::statvfs(&config.root) {
        Ok(v) => {
            let frag = v.fragment_size();
            (
                (v.blocks() * frag) >> 30,
                (v.blocks_available() * frag) >> 30,
            )
        }
        Err(_) => (0, 0),
    };
    SharesStorage {
        root: config.root.display().to_string(),
        capacity_gib,
        free_gib,
        limit: QuotaTools::limit(quota_tools(config, &mounts)),
        problem,
    }
}

/// [`survey`], given at most `within`: a filesystem that does not answer
/// (a hung NFS or Lustre mount) is the host's problem with shares.
/// One survey at a time: while one still waits on a hung filesystem, the
/// next beats say so without starting another (each would hold a thread).
pub async fn survey_within(
    config: SharesConfig,
    within: Duration,
    waiting: &Arc<std::sync::atomic::AtomicBool>,
) -> SharesStorage {
    use std::sync::atomic::Ordering;
    let root = config.root.display().to_string();
    let hung = |problem: String| SharesStorage {
        root: root.clone(),
        capacity_gib: 0,
        free_gib: 0,
        limit: ShareLimit::Measured,
        problem: Some(problem),
    };
    if waiting.swap(true, Ordering::SeqCst) {
        return hung("the shared filesystem has not answered the last survey yet".into());
    }
    let done = waiting.clone();
    let task = tokio::task::spawn_blocking(move || {
        let s = survey(&config);
        done.store(false, Ordering::SeqCst);
        s
    });
    match tokio::time::timeout(within, task).await {
        Ok(Ok(s)) => s,
        _ => hung(format!(
            "the shared filesystem did not answer within {} s",
            within.as_secs()
        )),
    }
}

impl Shares {
    pub fn new(config: SharesConfig, state_dir: &Path) -> Shares {
        Shares {
            config,
            binds: state_dir.join("shares"),
            limits: HashMap::new(),
            usage: Arc::default(),
        }
    }

    fn problem(&self, mounts: &[MountEntry]) -> Option<String> {
        problem(&self.config, mounts)
    }

    fn quota_tools(&self, mounts: &[MountEntry]) -> Option<QuotaTools> {
        quota_tools(&self.config, mounts)
    }

    pub fn dir(&self, id: Uuid) -> PathBuf {
        self.config.root.join(id.to_string())
    }

    fn bind(&self, id: Uuid) -> PathBuf {
        self.binds.join(format!("{id}.ro"))
    }

    /// What a VM's virtiofsd is given for one of its shares: the share's
    /// directory, or its read-only bind (made here when missing). An error
    /// says why the share cannot be mounted.
    pub fn source(&self, m: &DesiredMount) -> Result<PathBuf, String> {
        let mounts = mounts();
        if let Some(p) = self.problem(&mounts) {
            return Err(format!("share {}: {p}", m.tag));
        }
        let dir = self.dir(m.share);
        if !dir.is_dir() {
            return Err(format!(
                "share {}: its directory {} is missing",
                m.tag,
                dir.display()
            ));
        }
        if !m.read_only {
            return Ok(dir);
        }
        let bind = self.bind(m.share);
        match mounts.iter().rev().find(|e| e.mount_point == bind) {
            Some(e) if e.options.iter().any(|o| o == "ro") => return Ok(bind),
            Some(_) => {
                let _ = run(Command::new("umount").arg("-l").arg(&bind));
            }
            None => {}
        }
        let fail = |e: String| format!("share {}: a read-only bind: {e}", m.tag);
        let view = self.read_only_view(&mounts).map_err(fail)?;
        std::fs::create_dir_all(&bind).map_err(|e| format!("creating {}: {e}", bind.display()))?;
        // Bound from the read-only view, the bind is read-only from its
        // first moment, and so is every copy of it that mount propagation
        // makes (a copy takes the flags the mount had when it was made; a
        // later `remount,ro` would not reach a libvirtd in a mount
        // namespace of its own).
        let shared = view.join(m.share.to_string());
        run(Command::new("mount").arg("--bind").arg(&shared).arg(&bind)).map_err(fail)?;
        let read_only = self::mounts()
            .iter()
            .rev()
            .find(|e| e.mount_point == bind)
            .is_some_and(|e| e.options.iter().any(|o| o == "ro"));
        if !read_only {
            // Never leave a writable bind where a read-only one is wanted.
            let _ = run(Command::new("umount").arg(&bind));
            return Err(fail("it came out writable".into()));
        }
        Ok(bind)
    }

    /// The whole shares root, bound read-only under the state directory
    /// (made once; again when the filesystem under the root changed).
    fn read_only_view(&self, mounts: &[MountEntry]) -> Result<PathBuf, String> {
        use std::os::unix::fs::MetadataExt;
        let view = self.binds.join(".root");
        let same_fs = || -> Option<bool> {
            Some(
                std::fs::metadata(&view).ok()?.dev()
                    == std::fs::metadata(&self.config.root).ok()?.dev(),
            )
        };
        // Reused only while read-only and over the root's filesystem (an
        // agent killed between its bind and its remount left it writable).
        let ro = |e: &MountEntry| e.options.iter().any(|o| o == "ro");
        if let Some(e) = mounts.iter().rev().find(|e| e.mount_point == view) {
            if ro(e) && same_fs() == Some(true) {
                return Ok(view);
            }
            let _ = run(Command::new("umount").arg("-l").arg(&view));
        }
        std::fs::create_dir_all(&view).map_err(|e| format!("creating {}: {e}", view.display()))?;
        run(Command::new("mount")
            .arg("--bind")
            .arg(&self.config.root)
            .arg(&view))?;
        if let Err(e) = run(Command::new("mount")
            .args(["-o", "remount,bind,ro"])
            .arg(&view))
        {
            let _ = run(Command::new("umount").arg(&view));
            return Err(e);
        }
        Ok(view)
    }

    /// Read-only binds no VM of this host needs any more are unmounted
    /// (a running guest keeps what its virtiofsd was given at start).
    pub fn release_binds(&self, wanted: &BTreeSet<Uuid>) {
        let Ok(entries) = std::fs::read_dir(&self.binds) else {
            return;
        };
        let mounts = mounts();
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(id) = name
                .strip_suffix(".ro")
                .and_then(|i| i.parse::<Uuid>().ok())
            else {
                continue;
            };
            if wanted.contains(&id) {
                continue;
            }
            let path = e.path();
            if mounts.iter().any(|m| m.mount_point == path) {
                if let Err(e) = run(Command::new("umount").arg(&path)) {
                    tracing::warn!(share = %id, error = %e, "read-only bind not unmounted");
                    continue;
                }
            }
            let _ = std::fs::remove_dir(&path);
        }
    }

    /// The kept shares' directories brought in line: made (when never
    /// made before), limited, measured; deleted ones renamed away at once
    /// and their data removed after. One share's failure is its own.
    pub fn converge(&mut self, kept: &[DesiredShare], delete: &[Uuid]) -> Vec<ShareStatus> {
        let mounts = mounts();
        let status = |id, state, reason: Option<String>| ShareStatus {
            id,
            state,
            reason,
            used_bytes: None,
            limit: None,
            uncounted: false,
        };
        if let Some(p) = self.problem(&mounts) {
            return kept
                .iter()
                .map(|s| s.id)
                .chain(delete.iter().copied())
                .map(|id| status(id, VolumeActual::Failed, Some(p.clone())))
                .collect();
        }
        let tools = self.quota_tools(&mounts);
        let limit = QuotaTools::limit(tools);
        let mount_point = mount_of(&mounts, &self.config.root).map(|m| m.mount_point.clone());
        let mut report = Vec::new();
        let quota_use = if tools == Some(QuotaTools::Linux) && !kept.is_empty() {
            mount_point.as_ref().and_then(|mp| {
                run(Command::new("repquota").args(["-P", "-n"]).arg(mp))
                    .map(|t| parse_repquota(&t))
                    .map_err(|e| tracing::warn!(error = %e, "project quota usage not read"))
                    .ok()
            })
        } else {
            None
        };
        for s in kept {
            match self.keep(s, tools, mount_point.as_deref(), quota_use.as_ref()) {
                Ok((used, uncounted)) => report.push(ShareStatus {
                    used_bytes: used,
                    uncounted,
                    limit: Some(limit),
                    ..status(s.id, VolumeActual::Ready, None)
                }),
                Err(why) => report.push(status(s.id, VolumeActual::Failed, Some(why))),
            }
        }
        for id in delete {
            report.push(match self.remove(*id) {
                Ok(()) => status(*id, VolumeActual::Absent, None),
                Err(why) => status(*id, VolumeActual::Failed, Some(why)),
            });
        }
        report
    }

    fn keep(
        &mut self,
        s: &DesiredShare,
        tools: Option<QuotaTools>,
        mount_point: Option<&Path>,
        quota_use: Option<&HashMap<u32, u64>>,
    ) -> Result<(Option<u64>, bool), String> {
        let dir = self.dir(s.id);
        if !dir.is_dir() {
            if s.made {
                return Err(format!(
                    "its directory {} is missing (the shared filesystem not mounted, or the data removed)",
                    dir.display()
                ));
            }
            std::fs::create_dir(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
            tracing::info!(share = %s.id, "share directory made");
        }
        if let Some(tools) = tools.filter(|_| self.limits.get(&s.id) != Some(&s.size_gib)) {
            let mp = mount_point.ok_or("the shares root's mount is unknown")?;
            let kib = u64::from(s.size_gib) << 20;
            for line in tools.set_limit(s.project, &dir, kib, mp) {
                let (tool, args) = line.split_first().ok_or("an empty command")?;
                run(Command::new(tool).args(args))?;
            }
            self.limits.insert(s.id, s.size_gib);
            tracing::info!(share = %s.id, gib = s.size_gib, "share's project quota set");
        }
        if let Some(q) = quota_use {
            return Ok((Some(q.get(&s.project).copied().unwrap_or(0)), false));
        }
        let mut usage = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        let walking = usage.values().filter(|m| m.walking).count();
        let m = usage.entry(s.id).or_default();
        let stale = m.at.is_none_or(|t| t.elapsed() >= MEASURE_EVERY);
        if stale && !m.walking && walking < WALKS {
            m.walking = true;
            let (all, id) = (self.usage.clone(), s.id);
            // Lustre keeps the project's usage itself: no walk.
            let lustre = match (tools, mount_point) {
                (Some(QuotaTools::Lustre), Some(mp)) => Some((s.project, mp.to_path_buf())),
                _ => None,
            };
            std::thread::spawn(move || {
                let r = match lustre {
                    Some((project, mp)) => lfs_usage(project, &mp),
                    None => measure(&dir),
                };
                let mut all = all.lock().unwrap_or_else(|e| e.into_inner());
                let Some(m) = all.get_mut(&id) else {
                    return; // deleted meanwhile
                };
                m.walking = false;
                m.at = Some(Instant::now());
                match r {
                    Ok((bytes, whole)) => {
                        if !whole {
                            tracing::warn!(share = %id, "share has more than {WALK_MAX} files: usage is a lower bound");
                        }
                        m.bytes = Some(bytes);
                        m.uncounted = !whole;
                    }
                    Err(e) => tracing::warn!(share = %id, error = %e, "share not measured"),
                }
            });
        }
        Ok((m.bytes, m.uncounted))
    }

    /// A deleted share's directory leaves its name at once (renamed), so
    /// it is gone for every host; its data goes in the background.
    fn remove(&mut self, id: Uuid) -> Result<(), String> {
        self.limits.remove(&id);
        self.usage
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        let dir = self.dir(id);
        if !dir.exists() {
            return Ok(());
        }
        let away = self.config.root.join(format!("{DELETING}{id}"));
        std::fs::rename(&dir, &away).map_err(|e| format!("renaming {}: {e}", dir.display()))?;
        tracing::info!(share = %id, "share directory deleted");
        // Its data goes off the pass, on one thread: only the keeper that
        // renamed it removes it, once.
        std::thread::spawn(move || {
            if let Err(err) = std::fs::remove_dir_all(&away) {
                tracing::warn!(path = %away.display(), error = %err, "deleted share's data not removed");
            }
        });
        Ok(())
    }
}

/// What the guest's cloud-init mounts: `mounts:` entries for NoCloud
/// user-data (tag, path, virtiofs, options), in the VM's order.
pub fn cloud_init_mounts(mounts: &[DesiredMount]) -> String {
    if mounts.is_empty() {
        return String::new();
    }
    let mut out = String::from("mounts:\n");
    for m in mounts {
        let opts = if m.read_only {
            "defaults,nofail,ro"
        } else {
            "defaults,nofail"
        };
        out.push_str(&format!(
            "  - [\"{}\", \"{}\", \"virtiofs\", \"{opts}\", \"0\", \"0\"]\n",
            m.tag, m.path
        ));
    }
    out
}

/// A VM's shares as the domain's filesystems, each with its source; the
/// first share that cannot be mounted is the VM's failure.
pub fn filesystems(
    shares: Option<&Shares>,
    mounts: &[DesiredMount],
) -> Result<Vec<kumo_topology::domain_xml::SharedDir>, String> {
    if mounts.is_empty() {
        return Ok(Vec::new());
    }
    let Some(shares) = shares else {
        return Err("this host has no shared filesystem (--shares-root)".into());
    };
    mounts
        .iter()
        .map(|m| {
            Ok(kumo_topology::domain_xml::SharedDir {
                source: shares.source(m)?.display().to_string(),
                tag: m.tag.clone(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
90 22 7:0 / /srv/kumo\\040shares rw,relatime shared:40 - ext4 /dev/loop0 rw,prjquota
91 22 7:1 / /srv/lustre rw - lustre 10.0.0.1@o2ib:/fs rw,flock
92 22 7:2 / /srv/xfs rw - xfs /dev/loop2 rw,attr2,inode64,prjquota
garbage line
";

    #[test]
    fn mountinfo_says_where_a_path_is_mounted_and_whether_it_has_project_quotas() {
        let m = parse_mountinfo(MOUNTINFO);
        assert_eq!(m.len(), 4);
        let shares = mount_of(&m, Path::new("/srv/kumo shares/abc")).unwrap();
        assert_eq!(shares.mount_point, Path::new("/srv/kumo shares"));
        assert_eq!(shares.source, "/dev/loop0");
        assert!(has_project_quota(shares));
        assert!(has_project_quota(
            mount_of(&m, Path::new("/srv/xfs/x")).unwrap()
        ));
        let lustre = mount_of(&m, Path::new("/srv/lustre/p")).unwrap();
        assert!(
            !has_project_quota(lustre),
            "Lustre's quotas are not set through setquota"
        );
        assert_eq!(
            mount_of(&m, Path::new("/var/tmp")).unwrap().mount_point,
            Path::new("/")
        );
        assert!(!has_project_quota(mount_of(&m, Path::new("/x")).unwrap()));
    }

    #[test]
    fn each_filesystem_gets_its_own_quota_tools_and_lustre_stays_measured() {
        let m = parse_mountinfo(MOUNTINFO);
        let at = |p: &str| mount_of(&m, Path::new(p)).unwrap();
        let all = |_: &str| true;
        let no_lfs = |t: &str| t != "lfs";
        assert_eq!(
            QuotaTools::of(at("/srv/xfs/x"), &all),
            Some(QuotaTools::Linux)
        );
        assert_eq!(
            QuotaTools::of(at("/srv/lustre/p"), &all),
            Some(QuotaTools::Lustre)
        );
        assert_eq!(QuotaTools::of(at("/srv/lustre/p"), &no_lfs), None);
        assert_eq!(
            QuotaTools::of(at("/srv/xfs/x"), &|t: &str| t != "setquota"),
            None
        );
        assert_eq!(
            QuotaTools::of(at("/x"), &all),
            None,
            "ext4 without prjquota"
        );
        assert_eq!(
            QuotaTools::limit(Some(QuotaTools::Linux)),
            ShareLimit::ProjectQuota
        );
        // Lustre's quotas let root past them: the server watches the size.
        assert_eq!(
            QuotaTools::limit(Some(QuotaTools::Lustre)),
            ShareLimit::Measured
        );
        assert_eq!(QuotaTools::limit(None), ShareLimit::Measured);

        let dir = Path::new("/srv/lustre/s1");
        let words = |lines: Vec<Vec<String>>| -> Vec<String> {
            lines.into_iter().map(|l| l.join(" ")).collect()
        };
        assert_eq!(
            words(QuotaTools::Lustre.set_limit(7, dir, 1 << 20, Path::new("/srv/lustre"))),
            [
                "lfs project -p 7 -s /srv/lustre/s1",
                "lfs setquota -p 7 -B 1048576 /srv/lustre",
            ]
        );
        assert_eq!(
            words(QuotaTools::Linux.set_limit(
                7,
                Path::new("/srv/xfs/s1"),
                2048,
                Path::new("/srv/xfs")
            )),
            [
                "chattr +P -p 7 /srv/xfs/s1",
                "setquota -P 7 0 2048 0 0 /srv/xfs"
            ]
        );
    }

    #[test]
    fn lfs_quota_reads_a_projects_bytes() {
        let mount = Path::new("/mnt/lustre");
        let plain =
            "     /mnt/lustre     4360       0 1048576       -     265       0       0       -\n";
        assert_eq!(parse_lfs_quota(plain, mount), Some(4360 * 1024));
        let past = "/mnt/lustre 1048580* 0 1048576 6d 12 0 0 -";
        assert_eq!(parse_lfs_quota(past, mount), Some(1_048_580 * 1024));
        let long = "/mnt/a/very/long/lustre/mount/point/name\n        512       0    2048       -       1       0       0       -\n";
        assert_eq!(
            parse_lfs_quota(long, Path::new("/mnt/a/very/long/lustre/mount/point/name")),
            Some(512 * 1024)
        );
        assert_eq!(parse_lfs_quota(plain, Path::new("/mnt/other")), None);
        assert_eq!(parse_lfs_quota("/mnt/lustre", mount), None);
        assert_eq!(parse_lfs_quota("/mnt/lustre -", mount), None);
    }

    #[test]
    fn repquota_reads_bytes_per_project() {
        let text = "\
*** Report for project quotas on device /dev/loop0
Block grace time: 7days; Inode grace time: 7days
                        Block limits                File limits
Project         used    soft    hard  grace    used  soft  hard  grace
----------------------------------------------------------------------
#0        --      20       0       0              2     0     0
#1048577  +-  1048580*       0 1048576  6days      1     0     0
#1048578  --       4       0 2097152              1     0     0
";
        let u = parse_repquota(text);
        assert_eq!(u.get(&1_048_577), Some(&(1_048_580 * 1024)));
        assert_eq!(u.get(&1_048_578), Some(&4096));
        assert_eq!(u.len(), 3);
    }

    #[test]
    fn cloud_init_mounts_each_share_at_its_path() {
        let m = |tag: &str, path: &str, ro| DesiredMount {
            share: Uuid::nil(),
            tag: tag.into(),
            path: path.into(),
            read_only: ro,
        };
        assert_eq!(cloud_init_mounts(&[]), "");
        assert_eq!(
            cloud_init_mounts(&[m("datasets", "/data", false), m("ckpt", "/ckpt", true)]),
            "mounts:\n  - [\"datasets\", \"/data\", \"virtiofs\", \"defaults,nofail\", \"0\", \"0\"]\n  - [\"ckpt\", \"/ckpt\", \"virtiofs\", \"defaults,nofail,ro\", \"0\", \"0\"]\n"
        );
    }

    #[test]
    fn a_walk_counts_what_is_written_and_not_what_links_point_at() {
        let d = tempfile::tempdir().unwrap();
        let share = d.path().join("s");
        std::fs::create_dir_all(share.join("a/b")).unwrap();
        std::fs::write(share.join("a/b/f"), vec![7u8; 1 << 20]).unwrap();
        std::fs::write(d.path().join("outside"), vec![7u8; 8 << 20]).unwrap();
        std::os::unix::fs::symlink(d.path().join("outside"), share.join("link")).unwrap();
        let (bytes, whole) = measure(&share).unwrap();
        assert!(whole);
        assert!((1 << 20..4 << 20).contains(&bytes), "{bytes}");
    }

    #[test]
    fn a_keeper_makes_a_share_once_and_reports_a_lost_directory_as_its_fault() {
        let root = tempfile::tempdir().unwrap();
        let state = tempfile::tempdir().unwrap();
        let mut shares = Shares::new(
            SharesConfig {
                root: root.path().to_path_buf(),
                require_mount: false,
            },
            state.path(),
        );
        let id = Uuid::now_v7();
        let mut want = DesiredShare {
            id,
            size_gib: 1,
            project: 1 << 20,
            made: false,
        };
        let r = shares.converge(std::slice::from_ref(&want), &[]);
        assert_eq!(r[0].state, VolumeActual::Ready, "{r:?}");
        assert!(shares.dir(id).is_dir());
        // Made: a missing directory is the share's fault, not made again.
        want.made = true;
        std::fs::remove_dir(shares.dir(id)).unwrap();
        let other = DesiredShare {
            id: Uuid::now_v7(),
            ..want.clone()
        };
        let mut other_new = other.clone();
        other_new.made = false;
        let r = shares.converge(&[want.clone(), other_new], &[]);
        assert_eq!(r[0].state, VolumeActual::Failed);
        assert!(r[0].reason.as_deref().unwrap().contains("missing"), "{r:?}");
        assert!(
            !shares.dir(id).exists(),
            "a lost share is never made again empty"
        );
        assert_eq!(r[1].state, VolumeActual::Ready, "the other share goes on");
        // Deleted: its name goes at once.
        let r = shares.converge(&[], &[other.id]);
        assert_eq!(r[0].state, VolumeActual::Absent);
        assert!(!shares.dir(other.id).exists());
        // A root that must be a mount point and is not fails every share.
        let mut strict = Shares::new(
            SharesConfig {
                root: root.path().to_path_buf(),
                require_mount: true,
            },
            state.path(),
        );
        let r = strict.converge(&[want], &[]);
        assert!(
            r[0].reason.as_deref().unwrap().contains("not mounted"),
            "{r:?}"
        );
        assert!(survey(&strict.config).problem.is_some());
    }
}
