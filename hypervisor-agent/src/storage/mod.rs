//! Volumes: block storage that outlives a VM, on one host's storage pool.
//!
//! Two backends behind one [`Backend`] interface:
//!
//! - [`qcow2::Qcow2Dir`]: qcow2 files in a directory (`vol-<uuid>.qcow2`),
//!   snapshots as external backing chains (`vol-<uuid>-snap-<uuid>.qcow2`);
//! - [`lvm::LvmThin`]: thin LVs in an LVM thin pool (`kumo-vol-<uuid>`),
//!   snapshots as thin snapshots (`kumo-vol-<uuid>-snap-<uuid>`).
//!
//! Every call blocks (it runs `qemu-img` or LVM's tools): the agent runs
//! them in `spawn_blocking`.
//!
//! Crash safety: whatever takes time is made under a *partial* name
//! (`.partial-…` files, `kumo-partial-<uuid>` LVs) and renamed to its
//! final name only when complete, so an agent killed halfway leaves
//! nothing that [`Backend::observe`] reports as a volume. [`converge`]
//! first removes partials that no operation of this process is working
//! on ([`Backend::remove_stale_partials`]): one agent owns a pool, so a
//! partial nobody here is writing is a leftover of a killed agent.
//!
//! [`converge`] is level-triggered and idempotent: it makes what is
//! missing and deletes only what it is told to delete by id; a volume
//! that is neither wanted nor listed for deletion is left alone (and
//! reported), so a server that forgot a volume never costs its data.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Seek, SeekFrom, Write};
use std::process::Command;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use uuid::Uuid;

pub mod extents;
pub mod jobs;
pub mod lvm;
pub mod qcow2;
pub mod root_disks;

pub const GIB: u64 = 1 << 30;

/// A complete volume found in a pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observed {
    pub id: Uuid,
    /// The size the guest sees, in bytes.
    pub size_bytes: u64,
    /// Its complete snapshots, sorted.
    pub snapshots: Vec<Uuid>,
}

/// What libvirt attaches for a volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DiskSource {
    /// `<disk type='file'>` with `<driver type='{format}'/>` (`qcow2`).
    File {
        path: std::path::PathBuf,
        format: String,
    },
    /// `<disk type='block'>` with `<driver type='raw'/>`.
    Block { path: std::path::PathBuf },
}

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("{tool} is not installed (Debian package {package})")]
    MissingTool {
        tool: &'static str,
        package: &'static str,
    },
    #[error("{command} failed: {stderr}")]
    Tool { command: String, stderr: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("volume {0} does not exist")]
    NoVolume(Uuid),
    #[error("snapshot {snapshot} of volume {volume} does not exist")]
    NoSnapshot { volume: Uuid, snapshot: Uuid },
    /// The operation would lose data or break another volume, or the
    /// volume is busy with another operation.
    #[error("{0}")]
    Refused(String),
    #[error("checksum mismatch: expected sha256 {expected}, got {actual}")]
    Checksum { expected: String, actual: String },
    #[error("{0}")]
    Invalid(String),
}

impl StorageError {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> StorageError {
        let what = what.into();
        move |source| StorageError::Io { what, source }
    }
}

/// A pool's space, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    pub total_bytes: u64,
    pub free_bytes: u64,
    /// The filesystem it is on (`st_dev`), when it is a directory: root
    /// disks on the same one share its space.
    pub device: Option<u64>,
}

/// The space of the filesystem holding `path` (or, while `path` does not
/// exist yet, its nearest ancestor that does).
pub fn filesystem_space(path: &std::path::Path) -> Result<Space, StorageError> {
    use std::os::unix::fs::MetadataExt;
    let mut at = path;
    let meta = loop {
        match std::fs::metadata(at) {
            Ok(m) => break m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => match at.parent() {
                Some(p) => at = p,
                None => return Err(StorageError::io(format!("reading {}", path.display()))(e)),
            },
            Err(e) => return Err(StorageError::io(format!("reading {}", path.display()))(e)),
        }
    };
    let v = nix::sys::statvfs::statvfs(at).map_err(|e| StorageError::Io {
        what: format!("statvfs {}", at.display()),
        source: e.into(),
    })?;
    let frag = v.fragment_size() as u64;
    Ok(Space {
        total_bytes: (v.blocks() as u64).saturating_mul(frag),
        free_bytes: (v.blocks_available() as u64).saturating_mul(frag),
        device: Some(meta.dev()),
    })
}

/// What an import receives.
pub enum Incoming<'a> {
    /// The raw contents, exactly the size announced, whose SHA-256 is
    /// `sha256` (hex).
    Raw {
        reader: &'a mut dyn Read,
        sha256: &'a str,
    },
    /// An extent stream ([`extents`]): only the data, checked by its own
    /// trailer.
    Extents(&'a mut dyn Read),
}

impl Incoming<'_> {
    /// Writes the contents into `out` (fresh: it reads as zeros) and
    /// checks them. A regular file's length is the caller's to set.
    pub(crate) fn write_into(self, out: &mut std::fs::File, size: u64) -> Result<(), StorageError> {
        match self {
            Incoming::Raw { reader, sha256 } => {
                let (got, sum) = write_sparse_hashing(reader, out, size)
                    .map_err(StorageError::io("receiving the volume"))?;
                check_import(size, got, sha256, sum)
            }
            Incoming::Extents(reader) => extents::receive(reader, out, size).map(|_| ()),
        }
    }
}

/// One host's storage pool. Object-safe; every function blocks.
pub trait Backend: Send + Sync {
    /// `"qcow2"` or `"lvm-thin"`.
    fn kind(&self) -> &'static str;
    /// Every complete volume Kumo made in this pool, sorted by id.
    fn observe(&self) -> Result<Vec<Observed>, StorageError>;
    /// An empty volume of `size_gib` GiB.
    fn create(&self, id: Uuid, size_gib: u64) -> Result<(), StorageError>;
    /// A new volume with the contents of `source`'s snapshot `snapshot`,
    /// of `size_gib` GiB (at least the snapshot's size).
    fn create_from_snapshot(
        &self,
        id: Uuid,
        source: Uuid,
        snapshot: Uuid,
        size_gib: u64,
    ) -> Result<(), StorageError>;
    /// Grows the volume to `size_gib` GiB; refuses to shrink it.
    fn grow(&self, id: Uuid, size_gib: u64) -> Result<(), StorageError>;
    /// Deletes the volume and its snapshots (nothing if it is gone).
    /// Refused where another volume depends on one of its snapshots.
    fn delete(&self, id: Uuid) -> Result<(), StorageError>;
    /// A snapshot of the volume's current contents. Consistent only while
    /// the volume is detached or its VM paused: the server snapshots
    /// detached volumes only (for now).
    fn snapshot(&self, id: Uuid, snap: Uuid) -> Result<(), StorageError>;
    /// Deletes a snapshot (nothing if it is gone). Refused where another
    /// volume was made from it and still depends on it (qcow2).
    fn delete_snapshot(&self, id: Uuid, snap: Uuid) -> Result<(), StorageError>;
    /// What libvirt attaches.
    fn disk(&self, id: Uuid) -> DiskSource;
    /// Makes the volume ready to attach (LVM: activates it). Whether it
    /// changed anything.
    fn prepare(&self, _id: Uuid) -> Result<bool, StorageError> {
        Ok(false)
    }
    /// Hands `read` the guest-visible contents, raw and `size_bytes` long,
    /// as a file it may read and rewind (qcow2: a raw copy made for the
    /// call; LVM: the block device), so a caller that needs them twice
    /// (hash, then send) pays for one conversion.
    fn with_contents(
        &self,
        id: Uuid,
        read: &mut dyn FnMut(&mut std::fs::File) -> Result<(), StorageError>,
    ) -> Result<(), StorageError>;
    /// SHA-256 (lowercase hex) of the guest-visible contents, all
    /// `size_bytes` of them.
    fn checksum(&self, id: Uuid) -> Result<String, StorageError> {
        let mut sum = String::new();
        self.with_contents(id, &mut |f| {
            sum = copy_hashing(f, &mut std::io::sink())
                .map_err(StorageError::io("hashing the volume"))?
                .1;
            Ok(())
        })?;
        Ok(sum)
    }
    /// Streams the guest-visible contents (raw, `size_bytes` long).
    fn export(&self, id: Uuid, writer: &mut dyn Write) -> Result<(), StorageError> {
        self.with_contents(id, &mut |f| {
            std::io::copy(f, writer)
                .map(|_| ())
                .map_err(StorageError::io(format!("exporting volume {id}")))
        })
    }
    /// A new volume from raw contents: exactly `size_bytes` (a multiple
    /// of 512) read from `reader`, whose SHA-256 must be
    /// `expected_sha256`. Written under a partial name, in place only if
    /// the checksum matches; otherwise nothing is left.
    fn import(
        &self,
        id: Uuid,
        size_bytes: u64,
        reader: &mut dyn Read,
        expected_sha256: &str,
    ) -> Result<(), StorageError> {
        self.receive(
            id,
            size_bytes,
            Incoming::Raw {
                reader,
                sha256: expected_sha256,
            },
        )
    }
    /// A new volume of `size_bytes` (a multiple of 512) from what
    /// `incoming` carries; kept only when all of it arrived and checked
    /// (see [`Backend::import`]).
    fn receive(
        &self,
        id: Uuid,
        size_bytes: u64,
        incoming: Incoming<'_>,
    ) -> Result<(), StorageError>;
    /// The pool's size and what is free in it.
    fn capacity(&self) -> Result<Space, StorageError>;
    /// Removes partials no operation of this process is working on;
    /// how many.
    fn remove_stale_partials(&self) -> Result<usize, StorageError>;
}

/// A volume the server wants on this host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WantedVolume {
    pub id: Uuid,
    pub size_gib: u64,
    /// Whose it is: its long work counts against that tenant's share of
    /// the host ([`jobs`]).
    #[serde(default)]
    pub tenant: Option<Uuid>,
    /// `(volume, snapshot)` it is made from, if not empty.
    pub source: Option<(Uuid, Uuid)>,
    /// The snapshots it should have; others are deleted.
    pub snapshots: Vec<Uuid>,
}

/// What a [`converge`] pass did and found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Converged {
    /// Volumes and snapshots made, grown, deleted; partials removed.
    pub changes: usize,
    /// Why a volume (wanted or to delete) is not as wanted.
    pub failed: BTreeMap<Uuid, String>,
    /// Every complete volume in the pool after the pass, wanted or not.
    pub volumes: Vec<Observed>,
    /// A failure of the pool itself (unreadable, tool missing), if any.
    pub error: Option<String>,
    /// Volumes with long work waiting or running ([`converge_in_background`]):
    /// neither made nor failed yet, so not to be reported.
    pub busy: BTreeSet<Uuid>,
}

/// Where [`converge`]'s long work runs.
#[derive(Clone, Copy)]
enum Long<'a> {
    /// In the call itself.
    Inline,
    /// As jobs, outside the call ([`jobs`]).
    Jobs(&'a jobs::Jobs, &'a std::sync::Arc<dyn Backend>),
}

/// Drives the pool towards `want`, deleting the volumes in `delete`.
/// Volumes in neither list are left alone. One volume's failure is
/// recorded in `failed` and does not stop the others. A second call with
/// the same input changes nothing. Everything is done before it returns,
/// long work too: the agent's pass uses [`converge_in_background`].
pub fn converge(backend: &dyn Backend, want: &[WantedVolume], delete: &[Uuid]) -> Converged {
    converge_with(backend, want, delete, Long::Inline)
}

/// [`converge`] as the agent's pass runs it: what is quick is done here;
/// long work (merging deleted snapshots into their volume, making a
/// volume from a snapshot) is started as a job of `jobs` and goes on
/// after the call, bounded per tenant and per host. A volume with a job
/// waiting or running is left alone and listed in `busy`; one whose job
/// failed is in `failed`, with the job's reason, until it is tried again.
pub fn converge_in_background(
    backend: &std::sync::Arc<dyn Backend>,
    want: &[WantedVolume],
    delete: &[Uuid],
    jobs: &jobs::Jobs,
) -> Converged {
    jobs.begin_pass();
    let out = converge_with(&**backend, want, delete, Long::Jobs(jobs, backend));
    jobs.end_pass();
    out
}

fn converge_with(
    backend: &dyn Backend,
    want: &[WantedVolume],
    delete: &[Uuid],
    long: Long<'_>,
) -> Converged {
    let mut out = Converged::default();
    match backend.remove_stale_partials() {
        Ok(n) => out.changes += n,
        Err(e) => tracing::warn!(error = %e, "removing stale partial volumes"),
    }
    let observed = match backend.observe() {
        Ok(v) => v,
        Err(e) => {
            let e = e.to_string();
            for id in want.iter().map(|w| w.id).chain(delete.iter().copied()) {
                out.failed.insert(id, e.clone());
            }
            out.error = Some(e);
            return out;
        }
    };
    let mut have: BTreeMap<Uuid, Observed> = observed.into_iter().map(|o| (o.id, o)).collect();
    let wanted: BTreeSet<Uuid> = want.iter().map(|w| w.id).collect();

    // Deleted before anything is made, to free space. A volume made from
    // another's snapshot must go before that one (qcow2): retried while
    // others go. One whose job is running waits for it; one whose job is
    // still waiting for its turn calls it off.
    let mut pending: Vec<Uuid> = Vec::new();
    for &id in delete {
        if wanted.contains(&id) {
            out.failed.insert(
                id,
                "volume is both wanted and to be deleted; left alone".into(),
            );
        } else if let Long::Jobs(jobs, _) = long {
            if jobs.progress(id) == jobs::Progress::Busy && !jobs.call_off(id) {
                out.busy.insert(id);
            } else if have.contains_key(&id) && !pending.contains(&id) {
                pending.push(id);
            }
        } else if have.contains_key(&id) && !pending.contains(&id) {
            pending.push(id);
        }
    }
    while !pending.is_empty() {
        let before = pending.len();
        pending.retain(|&id| match backend.delete(id) {
            Ok(()) => {
                out.changes += 1;
                out.failed.remove(&id);
                have.remove(&id);
                false
            }
            Err(e) => {
                out.failed.insert(id, e.to_string());
                true
            }
        });
        if pending.len() == before {
            break;
        }
    }

    // Volumes made from snapshots after the others, so that a snapshot
    // made in this pass can be a source in the same pass.
    let mut order: Vec<&WantedVolume> = want.iter().collect();
    order.sort_by_key(|w| w.source.is_some());
    for w in order {
        if let Long::Jobs(jobs, _) = long {
            match jobs.progress(w.id) {
                jobs::Progress::Idle => {}
                jobs::Progress::Busy => {
                    out.busy.insert(w.id);
                    continue;
                }
                jobs::Progress::Failed(why) => {
                    out.failed.insert(w.id, why);
                    continue;
                }
            }
        }
        let mut errors = Vec::new();
        let started = converge_one(
            backend,
            w,
            have.get(&w.id),
            long,
            &mut out.changes,
            &mut errors,
        );
        if started {
            out.busy.insert(w.id);
        }
        if !errors.is_empty() {
            out.failed.insert(w.id, errors.join("; "));
        }
    }

    match backend.observe() {
        Ok(v) => out.volumes = v,
        Err(e) => out.error = Some(e.to_string()),
    }
    out
}

/// Brings one volume to what is wanted; whether it started a job.
fn converge_one(
    backend: &dyn Backend,
    w: &WantedVolume,
    have: Option<&Observed>,
    long: Long<'_>,
    changes: &mut usize,
    errors: &mut Vec<String>,
) -> bool {
    let want_bytes = w.size_gib.saturating_mul(GIB);
    let existing: Vec<Uuid> = match have {
        Some(o) => {
            if o.size_bytes < want_bytes {
                match backend.grow(w.id, w.size_gib) {
                    Ok(()) => *changes += 1,
                    Err(e) => errors.push(format!("growing: {e}")),
                }
            }
            o.snapshots.clone()
        }
        None => {
            let made = match (w.source, long) {
                (None, _) => backend.create(w.id, w.size_gib),
                (Some((vol, snap)), Long::Inline) => {
                    backend.create_from_snapshot(w.id, vol, snap, w.size_gib)
                }
                (Some((vol, snap)), Long::Jobs(jobs, b)) => {
                    let (b, id, size) = (b.clone(), w.id, w.size_gib);
                    return jobs.start(
                        w.id,
                        w.tenant,
                        "making it from a snapshot",
                        Box::new(move || b.create_from_snapshot(id, vol, snap, size)),
                    );
                }
            };
            match made {
                Ok(()) => *changes += 1,
                Err(e) => {
                    errors.push(format!("creating: {e}"));
                    return false;
                }
            }
            Vec::new()
        }
    };
    for &snap in w.snapshots.iter().filter(|s| !existing.contains(s)) {
        match backend.snapshot(w.id, snap) {
            Ok(()) => *changes += 1,
            Err(e) => errors.push(format!("snapshot {snap}: {e}")),
        }
    }
    let gone: Vec<Uuid> = existing
        .iter()
        .filter(|s| !w.snapshots.contains(s))
        .copied()
        .collect();
    if !gone.is_empty() {
        match long {
            Long::Inline => {
                for snap in gone {
                    match backend.delete_snapshot(w.id, snap) {
                        Ok(()) => *changes += 1,
                        Err(e) => errors.push(format!("deleting snapshot {snap}: {e}")),
                    }
                }
            }
            // Merging a snapshot into its volume copies its data: a job.
            Long::Jobs(jobs, b) => {
                let (b, id) = (b.clone(), w.id);
                return jobs.start(
                    w.id,
                    w.tenant,
                    "deleting snapshots",
                    Box::new(move || {
                        for snap in gone {
                            b.delete_snapshot(id, snap).map_err(|e| {
                                StorageError::Refused(format!("snapshot {snap}: {e}"))
                            })?;
                        }
                        Ok(())
                    }),
                );
            }
        }
    }
    match backend.prepare(w.id) {
        Ok(true) => *changes += 1,
        Ok(false) => {}
        Err(e) => errors.push(format!("preparing: {e}")),
    }
    false
}

// ---- shared helpers -------------------------------------------------------

/// Keys (partial paths or LV names) that an operation of this process is
/// working on; partials under these keys are not stale.
static IN_FLIGHT: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Holds a key in [`IN_FLIGHT`] until dropped. Also serialises work on
/// one volume: a second claim of the same key is refused.
pub(crate) struct Claim(String);

impl Claim {
    pub(crate) fn take(key: String) -> Result<Claim, StorageError> {
        let mut set = IN_FLIGHT.lock().unwrap_or_else(|e| e.into_inner());
        if !set.insert(key.clone()) {
            return Err(StorageError::Refused(format!(
                "{key} is busy with another operation"
            )));
        }
        Ok(Claim(key))
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        IN_FLIGHT
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.0);
    }
}

pub(crate) fn in_flight(key: &str) -> bool {
    IN_FLIGHT
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(key)
}

thread_local! {
    /// Set while this thread does long work ([`in_background`]).
    static BACKGROUND: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` (long storage work: a merge, a copy, a conversion) with the
/// tools it starts at the lowest CPU priority (`nice -n 19`): it yields
/// to the host's passes, consoles and guests instead of competing with
/// them.
pub fn in_background<T>(f: impl FnOnce() -> T) -> T {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            BACKGROUND.with(|b| b.set(self.0));
        }
    }
    let _reset = Reset(BACKGROUND.with(|b| b.replace(true)));
    f()
}

/// `cmd` run through `nice -n 19`, as [`in_background`] wants.
fn niced(cmd: &Command) -> Command {
    let mut low = Command::new("nice");
    low.args(["-n", "19"])
        .arg(cmd.get_program())
        .args(cmd.get_args());
    if let Some(dir) = cmd.get_current_dir() {
        low.current_dir(dir);
    }
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => low.env(k, v),
            None => low.env_remove(k),
        };
    }
    low
}

/// Runs a tool, returns its stdout; errors name the tool, its arguments
/// and its stderr, or the Debian package that brings a missing tool.
pub(crate) fn run(
    cmd: &mut Command,
    tool: &'static str,
    package: &'static str,
) -> Result<Vec<u8>, StorageError> {
    let background = BACKGROUND.with(|b| b.get());
    let out = if background {
        niced(cmd).output()
    } else {
        cmd.output()
    };
    let out = out.map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            StorageError::MissingTool { tool, package }
        } else {
            StorageError::Io {
                what: format!("running {tool}"),
                source: e,
            }
        }
    })?;
    // `nice` says 127 for a tool it cannot find.
    if background && out.status.code() == Some(127) {
        return Err(StorageError::MissingTool { tool, package });
    }
    if !out.status.success() {
        let args: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        return Err(StorageError::Tool {
            command: format!("{tool} {}", args.join(" ")),
            stderr: if stderr.is_empty() {
                format!("exited with {}", out.status)
            } else {
                stderr
            },
        });
    }
    Ok(out.stdout)
}

const CHUNK: usize = 1 << 20;

/// Copies all of `reader` into `writer`, hashing it; the byte count and
/// the SHA-256 in hex.
pub(crate) fn copy_hashing(
    reader: &mut dyn Read,
    writer: &mut dyn Write,
) -> std::io::Result<(u64, String)> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        writer.write_all(&buf[..n])?;
        total += n as u64;
    }
    writer.flush()?;
    Ok((total, hex::encode(hasher.finalize())))
}

/// Writes `reader` into `out` (a fresh file or a fresh thin LV, which
/// read as zeros) without writing chunks that are all zeros, so the copy
/// stays sparse; the byte count and the SHA-256 in hex. At most `limit`
/// bytes are written: a longer stream is an error.
pub(crate) fn write_sparse_hashing(
    reader: &mut dyn Read,
    out: &mut std::fs::File,
    limit: u64,
) -> std::io::Result<(u64, String)> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let zeros = vec![0u8; CHUNK];
    let mut total = 0u64;
    loop {
        // Fill the buffer (a reader may return short reads).
        let mut n = 0;
        while n < buf.len() {
            match reader.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        if n == 0 {
            break;
        }
        if total + n as u64 > limit {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("the stream is longer than the {limit} bytes announced"),
            ));
        }
        hasher.update(&buf[..n]);
        if buf[..n] == zeros[..n] {
            out.seek(SeekFrom::Current(n as i64))?;
        } else {
            out.write_all(&buf[..n])?;
        }
        total += n as u64;
        if n < buf.len() {
            break;
        }
    }
    out.sync_all()?;
    Ok((total, hex::encode(hasher.finalize())))
}

/// Checks an import's announced size.
pub(crate) fn check_import_size(size_bytes: u64) -> Result<(), StorageError> {
    if size_bytes == 0 || size_bytes % 512 != 0 {
        return Err(StorageError::Invalid(format!(
            "an imported volume's size must be a positive multiple of 512 bytes, not {size_bytes}"
        )));
    }
    Ok(())
}

/// Checks the bytes an import got against what was announced.
pub(crate) fn check_import(
    size_bytes: u64,
    got: u64,
    expected_sha256: &str,
    actual: String,
) -> Result<(), StorageError> {
    if got != size_bytes {
        return Err(StorageError::Invalid(format!(
            "the stream ended after {got} of the {size_bytes} bytes announced"
        )));
    }
    if !actual.eq_ignore_ascii_case(expected_sha256.trim()) {
        return Err(StorageError::Checksum {
            expected: expected_sha256.trim().to_owned(),
            actual,
        });
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_is_exclusive_and_released_on_drop() {
        let key = format!("test-{}", Uuid::new_v4());
        let c = Claim::take(key.clone());
        assert!(c.is_ok());
        assert!(in_flight(&key));
        assert!(matches!(
            Claim::take(key.clone()),
            Err(StorageError::Refused(_))
        ));
        drop(c);
        assert!(!in_flight(&key));
    }

    /// Tools started by long work run at the lowest CPU priority; others
    /// as the agent does; a missing tool is named either way.
    #[test]
    fn long_work_runs_its_tools_niced() {
        let niceness = || {
            let out = run(Command::new("nice").env("LC_ALL", "C"), "nice", "coreutils").unwrap();
            String::from_utf8_lossy(&out).trim().parse::<i32>().unwrap()
        };
        let base = niceness();
        assert_eq!(in_background(niceness), 19.max(base));
        assert_eq!(niceness(), base, "only inside");
        let mut missing = Command::new("no-such-kumo-tool");
        for r in [
            in_background(|| run(&mut missing, "no-such-kumo-tool", "x")),
            run(&mut missing, "no-such-kumo-tool", "x"),
        ] {
            assert!(matches!(r, Err(StorageError::MissingTool { .. })), "{r:?}");
        }
    }

    #[test]
    fn sparse_copy_hashes_everything_and_stops_at_the_limit() {
        let dir = std::env::temp_dir().join(format!("kumo-storage-{}", Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("x");
        let mut data = vec![0u8; 3 * CHUNK + 512];
        data[CHUNK + 7] = 1;
        let mut f = std::fs::File::create(&path).unwrap();
        let (n, sum) = write_sparse_hashing(&mut &data[..], &mut f, data.len() as u64).unwrap();
        f.set_len(n).unwrap();
        assert_eq!(n, data.len() as u64);
        assert_eq!(sum, hex::encode(Sha256::digest(&data)));
        assert_eq!(std::fs::read(&path).unwrap(), data);
        let mut f = std::fs::File::create(&path).unwrap();
        assert!(write_sparse_hashing(&mut &data[..], &mut f, 1024).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
