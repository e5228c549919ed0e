//! Volumes as qcow2 files in one directory (default
//! `<state-dir>/volumes`, 0711 so that QEMU's own user can pass through
//! it to the file libvirt hands it; files 0600).
//!
//! - a volume is `vol-<uuid>.qcow2`;
//! - a snapshot is `vol-<uuid>-snap-<uuid>.qcow2`, an *external*
//!   snapshot: the image as it was, frozen, with the volume a new overlay
//!   on top of it. Taking one copies nothing (a `qemu-img convert` copy
//!   would cost the whole volume's size and time), and a volume made from
//!   a snapshot is an overlay on the snapshot's file too. The price is
//!   backing chains: deleting a snapshot merges it into the image above
//!   it (`qemu-img rebase`), and a snapshot that another volume was made
//!   from cannot be deleted while that volume exists;
//! - anything being made is `.partial-…` until renamed into place.
//!
//! Backing files are recorded by name, relative to the directory, so the
//! pool can move. Every tool runs with the directory as its working
//! directory. A snapshot is consistent only while the volume is detached
//! (or its VM paused); the server snapshots detached volumes only, and
//! deleting a snapshot rewrites the image above it, which must not be
//! attached either.
//!
//! Sizes and backing files are read from the qcow2 header itself (a
//! stable format), which also works for an image whose backing file is
//! gone.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use uuid::Uuid;

use super::{
    check_import_size, in_flight, run, Backend, Claim, DiskSource, Incoming, Observed, Space,
    StorageError, GIB,
};

const QEMU_PKG: &str = "qemu-utils";
const PARTIAL: &str = ".partial-";

/// A pool of qcow2 volumes in a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Qcow2Dir {
    pub dir: PathBuf,
}

/// A file name in the pool, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Name {
    Volume(Uuid),
    Snapshot(Uuid, Uuid),
}

fn parse_uuid(s: &str) -> Option<Uuid> {
    let id = Uuid::parse_str(s).ok()?;
    (id.hyphenated().to_string() == s).then_some(id)
}

fn parse_name(name: &str) -> Option<Name> {
    let rest = name.strip_prefix("vol-")?.strip_suffix(".qcow2")?;
    if rest.len() == 36 {
        return parse_uuid(rest).map(Name::Volume);
    }
    let (vol, snap) = rest.split_once("-snap-")?;
    Some(Name::Snapshot(parse_uuid(vol)?, parse_uuid(snap)?))
}

fn volume_name(id: Uuid) -> String {
    format!("vol-{id}.qcow2")
}

fn snapshot_name(id: Uuid, snap: Uuid) -> String {
    format!("vol-{id}-snap-{snap}.qcow2")
}

/// What a qcow2 header says.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Header {
    size: u64,
    backing: Option<String>,
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

/// Reads a qcow2 header (QEMU's `docs/interop/qcow2.txt`): magic, the
/// backing file's offset and length, the virtual size.
fn read_header(path: &Path) -> Result<Header, StorageError> {
    let mut f =
        File::open(path).map_err(StorageError::io(format!("opening {}", path.display())))?;
    let mut h = [0u8; 32];
    f.read_exact(&mut h)
        .map_err(StorageError::io(format!("reading {}", path.display())))?;
    if h[..4] != *b"QFI\xfb" {
        return Err(StorageError::Invalid(format!(
            "{} is not a qcow2 image",
            path.display()
        )));
    }
    let backing_offset = be64(&h, 8);
    let mut l = [0u8; 4];
    l.copy_from_slice(&h[16..20]);
    let backing_len = u32::from_be_bytes(l) as usize;
    let size = be64(&h, 24);
    let backing = if backing_offset == 0 || backing_len == 0 {
        None
    } else if backing_len > 1023 {
        return Err(StorageError::Invalid(format!(
            "{}: backing file name too long",
            path.display()
        )));
    } else {
        use std::io::{Seek, SeekFrom};
        let mut name = vec![0u8; backing_len];
        f.seek(SeekFrom::Start(backing_offset))
            .and_then(|_| f.read_exact(&mut name))
            .map_err(StorageError::io(format!("reading {}", path.display())))?;
        Some(String::from_utf8_lossy(&name).into_owned())
    };
    Ok(Header { size, backing })
}

fn set_mode(path: &Path, mode: u32) -> Result<(), StorageError> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(StorageError::io(format!("chmod {}", path.display())))
}

fn remove_if_there(path: &Path) -> Result<bool, StorageError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(StorageError::Io {
            what: format!("removing {}", path.display()),
            source: e,
        }),
    }
}

/// Removes a temporary file when dropped.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl Qcow2Dir {
    /// A pool in `dir`, made absolute: `qemu-img` runs inside it, and
    /// libvirt needs absolute paths.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        let dir = dir.into();
        Qcow2Dir {
            dir: std::path::absolute(&dir).unwrap_or(dir),
        }
    }

    pub fn volume_path(&self, id: Uuid) -> PathBuf {
        self.dir.join(volume_name(id))
    }

    pub fn snapshot_path(&self, id: Uuid, snap: Uuid) -> PathBuf {
        self.dir.join(snapshot_name(id, snap))
    }

    /// Where a volume is made before it is renamed into place. Holding
    /// its claim also serialises changes to the volume.
    pub fn partial_path(&self, id: Uuid) -> PathBuf {
        self.dir.join(format!("{PARTIAL}vol-{id}.qcow2"))
    }

    fn import_path(&self, id: Uuid) -> PathBuf {
        self.dir.join(format!("{PARTIAL}vol-{id}.raw"))
    }

    /// Makes the directory (0711: no listing; QEMU passes through) if need be.
    pub fn ensure_dir(&self) -> Result<(), StorageError> {
        std::fs::create_dir_all(&self.dir)
            .map_err(StorageError::io(format!("creating {}", self.dir.display())))?;
        set_mode(&self.dir, 0o711)
    }

    fn claim(&self, id: Uuid) -> Result<Claim, StorageError> {
        Claim::take(self.partial_path(id).display().to_string())
    }

    fn qemu_img(&self) -> Command {
        let mut cmd = Command::new("qemu-img");
        cmd.current_dir(&self.dir);
        cmd
    }

    fn sync_dir(&self) -> Result<(), StorageError> {
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(StorageError::io(format!("syncing {}", self.dir.display())))
    }

    /// Makes the partial file private and renames it into place.
    fn commit(&self, partial: &Path, to: &Path) -> Result<(), StorageError> {
        set_mode(partial, 0o600)?;
        std::fs::rename(partial, to).map_err(StorageError::io(format!(
            "renaming {} to {}",
            partial.display(),
            to.display()
        )))?;
        self.sync_dir()
    }

    /// Every file name in the pool (none if the directory is missing).
    fn names(&self) -> Result<Vec<String>, StorageError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => {
                return Err(StorageError::Io {
                    what: format!("listing {}", self.dir.display()),
                    source: e,
                })
            }
        };
        let mut names = Vec::new();
        for e in entries {
            let e = e.map_err(StorageError::io(format!("listing {}", self.dir.display())))?;
            if let Some(n) = e.file_name().to_str() {
                names.push(n.to_owned());
            }
        }
        names.sort();
        Ok(names)
    }

    fn inode(path: &Path) -> Option<(u64, u64)> {
        std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
    }

    /// A snapshot file that is still the volume's own file (a snapshot
    /// cut short between its two steps) is not a snapshot.
    fn snapshot_complete(&self, id: Uuid, snap: Uuid) -> bool {
        let s = Self::inode(&self.snapshot_path(id, snap));
        s.is_some() && s != Self::inode(&self.volume_path(id))
    }

    /// Images (final or partial) whose backing file is `name`, by name.
    fn dependents(&self, name: &str) -> Result<Vec<String>, StorageError> {
        let mut out = Vec::new();
        for n in self.names()? {
            if !n.ends_with(".qcow2") || n == name {
                continue;
            }
            let h = match read_header(&self.dir.join(&n)) {
                Ok(h) => h,
                // A partial still being written may have no header yet.
                Err(_) if n.starts_with(PARTIAL) => continue,
                Err(e) => return Err(e),
            };
            if h.backing.as_deref() == Some(name) {
                out.push(n);
            }
        }
        Ok(out)
    }

    /// Refuses when an image other than volume `id`'s own depends on
    /// `name` (a snapshot of `id`).
    fn foreign_dependents(&self, id: Uuid, name: &str) -> Result<Vec<String>, StorageError> {
        let deps = self.dependents(name)?;
        let foreign: Vec<String> = deps
            .iter()
            .filter(|d| match parse_name(d) {
                Some(Name::Volume(v)) | Some(Name::Snapshot(v, _)) => v != id,
                None => true,
            })
            .cloned()
            .collect();
        if !foreign.is_empty() {
            let users: Vec<String> = foreign
                .iter()
                .map(|d| match parse_name(d) {
                    Some(Name::Volume(v)) | Some(Name::Snapshot(v, _)) => format!("volume {v}"),
                    None => format!("{d} (being made)"),
                })
                .collect();
            return Err(StorageError::Refused(format!(
                "{name} is the backing file of {}, made from it; delete {} first",
                users.join(", "),
                if users.len() == 1 { "it" } else { "them" }
            )));
        }
        Ok(deps)
    }

    /// Converts the volume to raw in a temporary file in the pool and
    /// hands it over to `f`.
    fn with_raw<T>(
        &self,
        id: Uuid,
        f: impl FnOnce(&mut File) -> Result<T, StorageError>,
    ) -> Result<T, StorageError> {
        let vol = self.volume_path(id);
        if !vol.exists() {
            return Err(StorageError::NoVolume(id));
        }
        let tmp = self
            .dir
            .join(format!("{PARTIAL}read-{id}-{}.raw", Uuid::new_v4()));
        let _claim = Claim::take(tmp.display().to_string())?;
        read_as_raw(&vol, &tmp, f)
    }
}

/// The guest-visible contents of the qcow2 image `image` (its backing
/// chain flattened), converted into the raw file `tmp`, which is removed
/// afterwards.
pub(crate) fn read_as_raw<T>(
    image: &Path,
    tmp: &Path,
    f: impl FnOnce(&mut File) -> Result<T, StorageError>,
) -> Result<T, StorageError> {
    let _tmp = TempFile(tmp.to_path_buf());
    run(
        Command::new("qemu-img")
            .args(["convert", "-q", "-U", "-f", "qcow2", "-O", "raw"])
            .arg(image)
            .arg(tmp),
        "qemu-img",
        QEMU_PKG,
    )?;
    let mut file =
        File::open(tmp).map_err(StorageError::io(format!("opening {}", tmp.display())))?;
    f(&mut file)
}

/// Receives the contents (`size_bytes` of them, checked as `incoming`
/// says) into the sparse file `raw`, converts them into a flat qcow2
/// image at `partial` and renames that to `dest` (0600) only when all of
/// it matched; leaves neither `raw` nor `partial` behind.
pub(crate) fn receive_as_qcow2(
    raw: &Path,
    partial: &Path,
    dest: &Path,
    size_bytes: u64,
    incoming: Incoming<'_>,
) -> Result<(), StorageError> {
    remove_if_there(partial)?;
    let _raw_tmp = TempFile(raw.to_path_buf());
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(raw)
        .map_err(StorageError::io(format!("creating {}", raw.display())))?;
    incoming.write_into(&mut file, size_bytes)?;
    file.set_len(size_bytes)
        .map_err(StorageError::io(format!("receiving {}", dest.display())))?;
    drop(file);
    run(
        Command::new("qemu-img")
            .args(["convert", "-q", "-f", "raw", "-O", "qcow2"])
            .arg(raw)
            .arg(partial),
        "qemu-img",
        QEMU_PKG,
    )
    .inspect_err(|_| {
        let _ = std::fs::remove_file(partial);
    })?;
    set_mode(partial, 0o600)?;
    std::fs::rename(partial, dest).map_err(StorageError::io(format!(
        "renaming {} to {}",
        partial.display(),
        dest.display()
    )))?;
    if let Some(dir) = dest.parent() {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(StorageError::io(format!("syncing {}", dir.display())))?;
    }
    Ok(())
}

impl Backend for Qcow2Dir {
    fn kind(&self) -> &'static str {
        "qcow2"
    }

    fn observe(&self) -> Result<Vec<Observed>, StorageError> {
        let names = self.names()?;
        let mut out = Vec::new();
        for n in &names {
            let Some(Name::Volume(id)) = parse_name(n) else {
                continue;
            };
            // One unreadable volume must not hide the others: it is not
            // reported, and making it again is refused (it exists).
            let header = match read_header(&self.dir.join(n)) {
                Ok(h) => h,
                Err(e) => {
                    tracing::warn!(volume = %id, error = %e, "unreadable volume");
                    continue;
                }
            };
            let mut snapshots: Vec<Uuid> = names
                .iter()
                .filter_map(|s| match parse_name(s) {
                    Some(Name::Snapshot(v, snap)) if v == id => Some(snap),
                    _ => None,
                })
                .filter(|&snap| self.snapshot_complete(id, snap))
                .collect();
            snapshots.sort();
            out.push(Observed {
                id,
                size_bytes: header.size,
                snapshots,
            });
        }
        out.sort_by_key(|o| o.id);
        Ok(out)
    }

    fn create(&self, id: Uuid, size_gib: u64) -> Result<(), StorageError> {
        self.ensure_dir()?;
        let _claim = self.claim(id)?;
        let vol = self.volume_path(id);
        if vol.exists() {
            return Err(StorageError::Refused(format!("volume {id} already exists")));
        }
        let partial = self.partial_path(id);
        remove_if_there(&partial)?;
        run(
            self.qemu_img()
                .args(["create", "-q", "-f", "qcow2"])
                .arg(&partial)
                .arg(size_gib.saturating_mul(GIB).to_string()),
            "qemu-img",
            QEMU_PKG,
        )?;
        self.commit(&partial, &vol)
    }

    fn create_from_snapshot(
        &self,
        id: Uuid,
        source: Uuid,
        snapshot: Uuid,
        size_gib: u64,
    ) -> Result<(), StorageError> {
        self.ensure_dir()?;
        let _claim = self.claim(id)?;
        let vol = self.volume_path(id);
        if vol.exists() {
            return Err(StorageError::Refused(format!("volume {id} already exists")));
        }
        if !self.snapshot_complete(source, snapshot) {
            return Err(StorageError::NoSnapshot {
                volume: source,
                snapshot,
            });
        }
        let base = snapshot_name(source, snapshot);
        let base_size = read_header(&self.dir.join(&base))?.size;
        let size = size_gib.saturating_mul(GIB);
        if size < base_size {
            return Err(StorageError::Refused(format!(
                "volume {id} of {size} bytes cannot hold snapshot {snapshot} of {base_size} bytes"
            )));
        }
        let partial = self.partial_path(id);
        remove_if_there(&partial)?;
        run(
            self.qemu_img()
                .args(["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b"])
                .arg(&base)
                .arg(&partial)
                .arg(size.to_string()),
            "qemu-img",
            QEMU_PKG,
        )?;
        self.commit(&partial, &vol)
    }

    fn grow(&self, id: Uuid, size_gib: u64) -> Result<(), StorageError> {
        let _claim = self.claim(id)?;
        let vol = self.volume_path(id);
        if !vol.exists() {
            return Err(StorageError::NoVolume(id));
        }
        let have = read_header(&vol)?.size;
        let size = size_gib.saturating_mul(GIB);
        if size < have {
            return Err(StorageError::Refused(format!(
                "volume {id} is {have} bytes; volumes never shrink (asked for {size})"
            )));
        }
        if size == have {
            return Ok(());
        }
        run(
            self.qemu_img()
                .args(["resize", "-q", "-f", "qcow2"])
                .arg(volume_name(id))
                .arg(size.to_string()),
            "qemu-img",
            QEMU_PKG,
        )?;
        Ok(())
    }

    fn delete(&self, id: Uuid) -> Result<(), StorageError> {
        let _claim = self.claim(id)?;
        let snaps: Vec<String> = self
            .names()?
            .into_iter()
            .filter(|n| matches!(parse_name(n), Some(Name::Snapshot(v, _)) if v == id))
            .collect();
        for s in &snaps {
            self.foreign_dependents(id, s)?;
        }
        // Snapshots first, the volume last: a delete cut short leaves the
        // volume observed, and the next pass deletes the rest.
        for s in &snaps {
            remove_if_there(&self.dir.join(s))?;
        }
        remove_if_there(&self.volume_path(id))?;
        self.sync_dir()
    }

    fn snapshot(&self, id: Uuid, snap: Uuid) -> Result<(), StorageError> {
        let _claim = self.claim(id)?;
        let vol = self.volume_path(id);
        if !vol.exists() {
            return Err(StorageError::NoVolume(id));
        }
        let snap_path = self.snapshot_path(id, snap);
        if self.snapshot_complete(id, snap) {
            return Err(StorageError::Refused(format!(
                "snapshot {snap} of volume {id} already exists"
            )));
        }
        // A snapshot cut short: the snapshot's name is still a link to
        // the volume's file.
        remove_if_there(&snap_path)?;
        let size = read_header(&vol)?.size;
        let partial = self.partial_path(id);
        remove_if_there(&partial)?;
        // 1. The new overlay, on the snapshot's name (not there yet).
        run(
            self.qemu_img()
                .args(["create", "-q", "-f", "qcow2", "-u", "-F", "qcow2", "-b"])
                .arg(snapshot_name(id, snap))
                .arg(&partial)
                .arg(size.to_string()),
            "qemu-img",
            QEMU_PKG,
        )?;
        // 2. The snapshot's name for the image as it is now: a second
        //    link, so the volume is never missing.
        std::fs::hard_link(&vol, &snap_path).map_err(StorageError::io(format!(
            "linking {} to {}",
            vol.display(),
            snap_path.display()
        )))?;
        // 3. The overlay replaces the volume's name, atomically.
        self.commit(&partial, &vol)
    }

    fn delete_snapshot(&self, id: Uuid, snap: Uuid) -> Result<(), StorageError> {
        let _claim = self.claim(id)?;
        let name = snapshot_name(id, snap);
        let path = self.dir.join(&name);
        if !path.exists() {
            return Ok(());
        }
        if !self.snapshot_complete(id, snap) {
            // Only a second name of the volume's own file.
            remove_if_there(&path)?;
            return self.sync_dir();
        }
        let own = self.foreign_dependents(id, &name)?;
        let parent = read_header(&path)?.backing;
        // Merge the snapshot into the image(s) above it. `qemu-img
        // rebase` copies first and changes the backing file last, so one
        // cut short is still correct, and is redone.
        for child in &own {
            let mut cmd = self.qemu_img();
            cmd.args(["rebase", "-q", "-f", "qcow2"]);
            match &parent {
                Some(p) => cmd.args(["-F", "qcow2", "-b", p]),
                None => cmd.args(["-b", ""]),
            };
            run(cmd.arg(child), "qemu-img", QEMU_PKG)?;
        }
        remove_if_there(&path)?;
        self.sync_dir()
    }

    fn disk(&self, id: Uuid) -> DiskSource {
        DiskSource::File {
            path: self.volume_path(id),
            format: "qcow2".into(),
        }
    }

    fn with_contents(
        &self,
        id: Uuid,
        read: &mut dyn FnMut(&mut File) -> Result<(), StorageError>,
    ) -> Result<(), StorageError> {
        self.with_raw(id, read)
    }

    fn capacity(&self) -> Result<Space, StorageError> {
        super::filesystem_space(&self.dir)
    }

    fn receive(
        &self,
        id: Uuid,
        size_bytes: u64,
        incoming: Incoming<'_>,
    ) -> Result<(), StorageError> {
        check_import_size(size_bytes)?;
        self.ensure_dir()?;
        let _claim = self.claim(id)?;
        let raw = self.import_path(id);
        let _raw_claim = Claim::take(raw.display().to_string())?;
        let vol = self.volume_path(id);
        if vol.exists() {
            return Err(StorageError::Refused(format!("volume {id} already exists")));
        }
        receive_as_qcow2(&raw, &self.partial_path(id), &vol, size_bytes, incoming)
    }

    fn remove_stale_partials(&self) -> Result<usize, StorageError> {
        let mut removed = 0;
        let names = self.names()?;
        for n in &names {
            if n.starts_with(PARTIAL) {
                let path = self.dir.join(n);
                if !in_flight(&path.display().to_string()) && remove_if_there(&path)? {
                    tracing::info!(file = %path.display(), "removed a partial volume left behind");
                    removed += 1;
                }
            } else if let Some(Name::Snapshot(id, snap)) = parse_name(n) {
                let busy = in_flight(&self.partial_path(id).display().to_string());
                if !busy && !self.snapshot_complete(id, snap) {
                    remove_if_there(&self.dir.join(n))?;
                    tracing::info!(volume = %id, snapshot = %snap, "removed a snapshot cut short");
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_nothing_else_parses() {
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        assert_eq!(parse_name(&volume_name(a)), Some(Name::Volume(a)));
        assert_eq!(parse_name(&snapshot_name(a, b)), Some(Name::Snapshot(a, b)));
        for n in [
            format!("{PARTIAL}vol-{a}.qcow2"),
            format!("vol-{}.qcow2", a.simple()),
            format!("vol-{}.qcow2", a.to_string().to_uppercase()),
            format!("vol-{a}.raw"),
            format!("vol-{a}-snap-{b}x.qcow2"),
            "vol-.qcow2".into(),
        ] {
            assert_eq!(parse_name(&n), None, "{n}");
        }
    }
}
