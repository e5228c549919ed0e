//! Volumes on real storage: qcow2 files written by `qemu-img`/`qemu-io`
//! (Debian: qemu-utils), and an LVM thin pool on a loop device (lvm2,
//! thin-provisioning-tools; the kernel's dm-thin-pool). Both backends run
//! the same body.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kumo_agent::storage::lvm::LvmThin;
use kumo_agent::storage::qcow2::Qcow2Dir;
use kumo_agent::storage::{
    converge, Backend, DiskSource, Observed, StorageError, WantedVolume, GIB,
};
use uuid::Uuid;

const ZEROS_1G: &str = "49bc20df15e412a64472421e13fe86ff1c5165e18b2afccf160d4dc19fe68a14";
const ZEROS_2G: &str = "a7c744c13cc101ed66c29f672f92455547889cc586ce6d44fe76ae824958ea51";
const MIB: u64 = 1 << 20;

/// A pool under test: its backend, and what the test does behind it.
trait Pool {
    fn backend(&self) -> &dyn Backend;
    /// Writes `len` bytes of `pattern` at `offset`, as a guest would.
    fn write(&self, id: Uuid, pattern: u8, offset: u64, len: u64);
    /// Leaves a partial volume behind, as a killed agent would.
    fn make_partial(&self, id: Uuid);
    fn partial_exists(&self, id: Uuid) -> bool;
    /// Whether a volume made from a snapshot depends on it (qcow2's
    /// backing chains) rather than standing alone (thin snapshots).
    fn clones_depend_on_snapshots(&self) -> bool;
    fn scratch(&self) -> &Path;
}

fn sh(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn scratch_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("kumo-storage")
        .tempdir_in("/var/tmp")
        .unwrap()
}

fn find(b: &dyn Backend, id: Uuid) -> Option<Observed> {
    b.observe().unwrap().into_iter().find(|o| o.id == id)
}

fn timed<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let r = f();
    eprintln!("{what}: {:.2}s", t.elapsed().as_secs_f64());
    r
}

/// The body both backends run.
fn exercise<P: Pool>(pool: &P) {
    let b = pool.backend();
    let vol = Uuid::new_v4();

    // Create, write, checksum.
    b.create(vol, 1).unwrap();
    assert_eq!(
        find(b, vol),
        Some(Observed {
            id: vol,
            size_bytes: GIB,
            snapshots: vec![]
        })
    );
    assert!(matches!(b.create(vol, 1), Err(StorageError::Refused(_))));
    let empty = timed("checksum 1 GiB", || b.checksum(vol).unwrap());
    assert_eq!(empty, ZEROS_1G);
    pool.write(vol, 0x5a, 0, MIB);
    let written = b.checksum(vol).unwrap();
    assert_ne!(written, empty);

    // Snapshot, write more: the snapshot keeps what was.
    let s1 = Uuid::new_v4();
    b.snapshot(vol, s1).unwrap();
    assert!(matches!(b.snapshot(vol, s1), Err(StorageError::Refused(_))));
    assert_eq!(find(b, vol).unwrap().snapshots, vec![s1]);
    assert_eq!(b.checksum(vol).unwrap(), written);
    pool.write(vol, 0xa5, MIB, MIB);
    let after = b.checksum(vol).unwrap();
    assert_ne!(after, written);

    // A clone from the snapshot has the snapshot's contents.
    let clone = Uuid::new_v4();
    b.create_from_snapshot(clone, vol, s1, 1).unwrap();
    assert_eq!(find(b, clone).unwrap().size_bytes, GIB);
    assert_eq!(b.checksum(clone).unwrap(), written);
    assert!(matches!(
        b.create_from_snapshot(Uuid::new_v4(), vol, Uuid::new_v4(), 1),
        Err(StorageError::NoSnapshot { .. })
    ));
    assert!(matches!(
        b.create_from_snapshot(Uuid::new_v4(), vol, s1, 0),
        Err(StorageError::Refused(_))
    ));
    // A bigger one, too.
    let big = Uuid::new_v4();
    b.create_from_snapshot(big, vol, s1, 2).unwrap();
    assert_eq!(find(b, big).unwrap().size_bytes, 2 * GIB);
    b.delete(big).unwrap();
    assert_eq!(find(b, big), None);

    // A second snapshot on top of the first; writes go on.
    let s2 = Uuid::new_v4();
    b.snapshot(vol, s2).unwrap();
    pool.write(vol, 0x33, 4 * MIB, MIB);
    let latest = b.checksum(vol).unwrap();

    if pool.clones_depend_on_snapshots() {
        // The clone's backing file cannot go, nor its volume.
        let e = b.delete_snapshot(vol, s1).unwrap_err();
        assert!(e.to_string().contains(&clone.to_string()), "{e}");
        let e = b.delete(vol).unwrap_err();
        assert!(e.to_string().contains(&clone.to_string()), "{e}");
        assert_eq!(find(b, vol).unwrap().snapshots.len(), 2);
        b.delete(clone).unwrap();
    }
    // Deleting the older snapshot (merged into the newer one for qcow2)
    // changes neither the volume nor what the newer one holds.
    b.delete_snapshot(vol, s1).unwrap();
    b.delete_snapshot(vol, s1).unwrap();
    assert_eq!(find(b, vol).unwrap().snapshots, vec![s2]);
    assert_eq!(b.checksum(vol).unwrap(), latest);
    let clone2 = Uuid::new_v4();
    b.create_from_snapshot(clone2, vol, s2, 1).unwrap();
    assert_eq!(b.checksum(clone2).unwrap(), after);
    if !pool.clones_depend_on_snapshots() {
        // A thin clone stands alone.
        assert_eq!(b.checksum(clone).unwrap(), written);
        b.delete(clone).unwrap();
    }

    // Export, import under a new id: the same contents.
    let file = pool.scratch().join(format!("export-{vol}.raw"));
    timed("export 1 GiB", || {
        let mut f = std::fs::File::create(&file).unwrap();
        b.export(vol, &mut f).unwrap();
        f.sync_all().unwrap();
    });
    assert_eq!(std::fs::metadata(&file).unwrap().len(), GIB);
    let moved = Uuid::new_v4();
    timed("import 1 GiB", || {
        let mut f = std::fs::File::open(&file).unwrap();
        b.import(moved, GIB, &mut f, &latest.to_uppercase())
            .unwrap();
    });
    assert_eq!(find(b, moved).unwrap().size_bytes, GIB);
    assert_eq!(b.checksum(moved).unwrap(), latest);
    // A wrong checksum, or a short stream, leaves nothing.
    let wrong = Uuid::new_v4();
    let mut f = std::fs::File::open(&file).unwrap();
    let e = b.import(wrong, GIB, &mut f, ZEROS_1G).unwrap_err();
    assert!(matches!(e, StorageError::Checksum { .. }), "{e}");
    let mut short = &[0u8; 4096][..];
    let e = b.import(wrong, 8192, &mut short, ZEROS_1G).unwrap_err();
    assert!(matches!(e, StorageError::Invalid(_)), "{e}");
    let mut long = &[0u8; 8192][..];
    assert!(b.import(wrong, 4096, &mut long, ZEROS_1G).is_err());
    assert_eq!(find(b, wrong), None);
    assert!(!pool.partial_exists(wrong));
    assert!(matches!(
        b.import(moved, 4096, &mut &[0u8; 4096][..], ZEROS_1G),
        Err(StorageError::Refused(_))
    ));
    std::fs::remove_file(&file).unwrap();

    // Grow (the new space reads as zeros), never shrink.
    b.grow(vol, 2).unwrap();
    b.grow(vol, 2).unwrap();
    assert_eq!(find(b, vol).unwrap().size_bytes, 2 * GIB);
    let e = b.grow(vol, 1).unwrap_err();
    assert!(e.to_string().contains("never shrink"), "{e}");
    let grown = b.checksum(vol).unwrap();
    assert_ne!(grown, latest);
    let empty2 = Uuid::new_v4();
    b.create(empty2, 1).unwrap();
    b.grow(empty2, 2).unwrap();
    assert_eq!(b.checksum(empty2).unwrap(), ZEROS_2G);
    b.delete(empty2).unwrap();

    // A crash halfway: the partial is no volume, and converge removes it.
    let crashed = Uuid::new_v4();
    pool.make_partial(crashed);
    assert!(pool.partial_exists(crashed));
    assert_eq!(find(b, crashed), None);

    // Converge: make, grow, snapshot, delete; twice is once.
    let fresh = Uuid::new_v4();
    let (sf, s3) = (Uuid::new_v4(), Uuid::new_v4());
    let from = Uuid::new_v4();
    let want = vec![
        WantedVolume {
            id: vol,
            size_gib: 3,
            tenant: None,
            source: None,
            snapshots: vec![s3],
        },
        WantedVolume {
            id: fresh,
            size_gib: 1,
            tenant: None,
            source: None,
            snapshots: vec![sf],
        },
        // Made from a snapshot that this same pass makes.
        WantedVolume {
            id: from,
            size_gib: 1,
            tenant: None,
            source: Some((fresh, sf)),
            snapshots: vec![],
        },
    ];
    let delete = vec![moved, Uuid::new_v4()];
    let c = timed("converge", || converge(b, &want, &delete));
    assert!(c.changes >= 7, "{c:?}");
    assert!(c.error.is_none(), "{:?}", c.error);
    assert!(!pool.partial_exists(crashed));
    assert!(c.volumes.iter().all(|o| o.id != moved));
    // clone2 is in neither list: left alone, and reported.
    assert!(c.volumes.iter().any(|o| o.id == clone2));
    if pool.clones_depend_on_snapshots() {
        // s2 backs clone2, so it stays, and the volume says why.
        let why = c.failed.get(&vol).unwrap();
        assert!(why.contains(&clone2.to_string()), "{why}");
        assert_eq!(c.failed.len(), 1, "{:?}", c.failed);
    } else {
        assert!(c.failed.is_empty(), "{:?}", c.failed);
    }
    b.delete(clone2).unwrap();
    let first = converge(b, &want, &delete);
    assert!(first.failed.is_empty(), "{:?}", first.failed);
    let got: Vec<(Uuid, u64, Vec<Uuid>)> = first
        .volumes
        .iter()
        .map(|o| (o.id, o.size_bytes, o.snapshots.clone()))
        .collect();
    let mut expected = vec![
        (vol, 3 * GIB, vec![s3]),
        (fresh, GIB, vec![sf]),
        (from, GIB, vec![]),
    ];
    expected.sort();
    assert_eq!(got, expected);
    let second = converge(b, &want, &delete);
    assert_eq!(second.changes, 0, "{second:?}");
    assert!(second.failed.is_empty(), "{:?}", second.failed);
    assert_eq!(second.volumes, first.volumes);

    // Neither wanted nor to delete: left alone.
    let orphan = Uuid::new_v4();
    b.create(orphan, 1).unwrap();
    let third = converge(b, &want, &delete);
    assert_eq!(third.changes, 0);
    assert!(third.volumes.iter().any(|o| o.id == orphan));

    // Deleting everything leaves an empty pool.
    // `fresh` first: for qcow2, `from` depends on its snapshot.
    let gone = converge(b, &[], &[fresh, vol, from, orphan]);
    assert!(gone.failed.is_empty(), "{:?}", gone.failed);
    assert!(gone.volumes.is_empty(), "{:?}", gone.volumes);
    b.delete(vol).unwrap();
}

// ---- qcow2 -----------------------------------------------------------------

struct Qcow2Pool {
    scratch: tempfile::TempDir,
    backend: Qcow2Dir,
}

impl Qcow2Pool {
    fn new() -> Self {
        let scratch = scratch_dir();
        let backend = Qcow2Dir::new(scratch.path().join("volumes"));
        Qcow2Pool { scratch, backend }
    }
}

impl Pool for Qcow2Pool {
    fn backend(&self) -> &dyn Backend {
        &self.backend
    }

    fn write(&self, id: Uuid, pattern: u8, offset: u64, len: u64) {
        sh(Command::new("qemu-io")
            .args(["-f", "qcow2", "-c"])
            .arg(format!("write -P {pattern:#x} {offset} {len}"))
            .arg(self.backend.volume_path(id)));
    }

    fn make_partial(&self, id: Uuid) {
        sh(Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2"])
            .arg(self.backend.partial_path(id))
            .arg("1G"));
    }

    fn partial_exists(&self, id: Uuid) -> bool {
        std::fs::read_dir(&self.backend.dir).unwrap().any(|e| {
            e.unwrap()
                .file_name()
                .to_string_lossy()
                .contains(&id.to_string())
        })
    }

    fn clones_depend_on_snapshots(&self) -> bool {
        true
    }

    fn scratch(&self) -> &Path {
        self.scratch.path()
    }
}

#[test]
fn qcow2_volumes() {
    let pool = Qcow2Pool::new();
    let t = Instant::now();
    exercise(&pool);
    eprintln!("qcow2 body: {:.1}s", t.elapsed().as_secs_f64());
    let mode = std::fs::metadata(&pool.backend.dir)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o711, "no listing; QEMU passes through");
    assert_eq!(std::fs::read_dir(&pool.backend.dir).unwrap().count(), 0);
}

#[test]
fn qcow2_files_are_private_and_a_snapshot_cut_short_is_undone() {
    let pool = Qcow2Pool::new();
    let b = &pool.backend;
    let vol = Uuid::new_v4();
    b.create(vol, 1).unwrap();
    let path = b.volume_path(vol);
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(
        b.disk(vol),
        DiskSource::File {
            path: path.clone(),
            format: "qcow2".into()
        }
    );
    pool.write(vol, 0x11, 0, MIB);
    let sum = b.checksum(vol).unwrap();
    // Killed between linking the snapshot's name and renaming the new
    // overlay into place: the "snapshot" is the volume's own file.
    let snap = Uuid::new_v4();
    std::fs::hard_link(&path, b.snapshot_path(vol, snap)).unwrap();
    assert_eq!(find(b, vol).unwrap().snapshots, Vec::<Uuid>::new());
    assert_eq!(b.remove_stale_partials().unwrap(), 1);
    assert!(!b.snapshot_path(vol, snap).exists());
    assert_eq!(b.checksum(vol).unwrap(), sum);
    // Done properly, the snapshot holds the volume's contents and the
    // volume is an overlay on it, by relative name.
    b.snapshot(vol, snap).unwrap();
    let info = sh(Command::new("qemu-img")
        .args(["info", "-U", "--output=json"])
        .arg(&path));
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(
        info["backing-filename"],
        format!("vol-{vol}-snap-{snap}.qcow2")
    );
    assert_eq!(b.checksum(vol).unwrap(), sum);
    // Not a qcow2 image, and not ours: ignored.
    std::fs::write(b.dir.join("notes.txt"), "hello").unwrap();
    assert_eq!(b.observe().unwrap().len(), 1);
    b.delete(vol).unwrap();
    assert_eq!(std::fs::read_dir(&b.dir).unwrap().count(), 1);
}

/// Long work is a job, off the pass: the pass that asks for a snapshot's
/// deletion (a merge, which copies the snapshot's data into the volume)
/// starts it and comes back, leaving the volume out while it runs
/// (`busy`: not made, not failed); a later pass finds it done. A merge
/// that cannot be done is that volume's failure, not the pass's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_merge_runs_off_the_pass_and_fails_as_its_volume() {
    use kumo_agent::storage::converge_in_background;
    use kumo_agent::storage::jobs::{Jobs, Limits, Slots};
    use std::sync::Arc;
    let pool = Qcow2Pool::new();
    let b: Arc<dyn Backend> = Arc::new(Qcow2Dir::new(&pool.backend.dir));
    let jobs = Jobs::new(
        Slots::new(Limits::default()),
        tokio::runtime::Handle::current(),
    );
    let (vol, snap, tenant) = (Uuid::new_v4(), Uuid::new_v4(), Some(Uuid::new_v4()));
    b.create(vol, 1).unwrap();
    pool.write(vol, 0x5a, 0, 256 * MIB);
    b.snapshot(vol, snap).unwrap();
    pool.write(vol, 0xa5, 0, MIB);
    let sum = b.checksum(vol).unwrap();
    let want = |snapshots: Vec<Uuid>| {
        vec![WantedVolume {
            id: vol,
            size_gib: 1,
            tenant,
            source: None,
            snapshots,
        }]
    };
    let pass = |want: Vec<WantedVolume>| {
        let (b, jobs) = (b.clone(), jobs.clone());
        tokio::task::spawn_blocking(move || {
            let t = Instant::now();
            let c = converge_in_background(&b, &want, &[], &jobs);
            (c, t.elapsed())
        })
    };
    let (c, took) = pass(want(vec![])).await.unwrap();
    assert!(c.busy.contains(&vol), "the merge is a job: {c:?}");
    assert!(c.failed.is_empty(), "{:?}", c.failed);
    let t = Instant::now();
    while jobs.busy(vol) {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "the merge never ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "pass {took:?}; the merge went on {:?} after it",
        t.elapsed()
    );
    let (c, _) = pass(want(vec![])).await.unwrap();
    assert!(c.busy.is_empty() && c.failed.is_empty(), "{c:?}");
    assert_eq!(find(&*b, vol).unwrap().snapshots, Vec::<Uuid>::new());
    assert_eq!(b.checksum(vol).unwrap(), sum, "merged, not lost");

    // A snapshot another volume was made from cannot be merged away: the
    // job fails, and that is the volume's failure.
    let (s2, clone) = (Uuid::new_v4(), Uuid::new_v4());
    b.snapshot(vol, s2).unwrap();
    b.create_from_snapshot(clone, vol, s2, 1).unwrap();
    let (c, _) = pass(want(vec![])).await.unwrap();
    assert!(c.busy.contains(&vol), "{c:?}");
    let t = Instant::now();
    let why = loop {
        let (c, _) = pass(want(vec![])).await.unwrap();
        if let Some(why) = c.failed.get(&vol) {
            break why.clone();
        }
        assert!(t.elapsed() < Duration::from_secs(60), "no failure: {c:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        why.contains("deleting snapshots") && why.contains(&clone.to_string()),
        "{why}"
    );
    assert_eq!(find(&*b, vol).unwrap().snapshots, vec![s2], "nothing lost");
}

// ---- LVM thin ---------------------------------------------------------------

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A VG with a thin pool on a loop device, removed on drop.
struct LvmPool {
    scratch: tempfile::TempDir,
    loop_dev: Option<String>,
    vg: String,
    vg_made: bool,
    backend: LvmThin,
}

fn lvm(tool: &str, args: &[&str]) -> String {
    sh(LvmThin::command(tool).args(args))
}

/// Whether the kernel has dm-thin (loading the module if it can).
fn dm_thin() -> bool {
    let loaded = || Path::new("/sys/module/dm_thin_pool").exists();
    if loaded() {
        return true;
    }
    let _ = Command::new("modprobe").arg("dm-thin-pool").output();
    if loaded() {
        return true;
    }
    Command::new("dmsetup")
        .arg("targets")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("thin-pool"))
        .unwrap_or(false)
}

impl LvmPool {
    fn new() -> Self {
        let scratch = scratch_dir();
        let vg = format!(
            "kumotest{}x{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        );
        let mut pool = LvmPool {
            loop_dev: None,
            vg_made: false,
            backend: LvmThin::new(vg.clone(), "pool"),
            vg,
            scratch,
        };
        let img = pool.scratch.path().join("pv.img");
        std::fs::File::create(&img)
            .unwrap()
            .set_len(2 * GIB + 256 * MIB)
            .unwrap();
        let dev = sh(Command::new("losetup").args(["-f", "--show"]).arg(&img))
            .trim()
            .to_owned();
        pool.loop_dev = Some(dev.clone());
        lvm("pvcreate", &["-q", "-y", &dev]);
        lvm("vgcreate", &["-q", &pool.vg, &dev]);
        pool.vg_made = true;
        lvm(
            "lvcreate",
            &["-q", "-y", "-L", "2G", "-T", &format!("{}/pool", pool.vg)],
        );
        pool
    }
}

impl Drop for LvmPool {
    fn drop(&mut self) {
        let quiet = |tool: &str, args: &[&str]| {
            let _ = LvmThin::command(tool).args(args).output();
        };
        if self.vg_made {
            quiet("vgremove", &["-q", "-f", &self.vg]);
        }
        if let Some(dev) = &self.loop_dev {
            quiet("pvremove", &["-q", "-ff", "-y", dev]);
            let _ = Command::new("losetup").args(["-d", dev]).output();
        }
    }
}

impl Pool for LvmPool {
    fn backend(&self) -> &dyn Backend {
        &self.backend
    }

    fn write(&self, id: Uuid, pattern: u8, offset: u64, len: u64) {
        let DiskSource::Block { path } = self.backend.disk(id) else {
            panic!("an LVM volume is a block device");
        };
        let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.seek(SeekFrom::Start(offset)).unwrap();
        f.write_all(&vec![pattern; len as usize]).unwrap();
        f.sync_all().unwrap();
    }

    fn make_partial(&self, id: Uuid) {
        lvm(
            "lvcreate",
            &[
                "-q",
                "-y",
                "-V",
                "1G",
                "-T",
                &format!("{}/pool", self.vg),
                "-n",
                &LvmThin::partial_lv(id),
            ],
        );
    }

    fn partial_exists(&self, id: Uuid) -> bool {
        self.backend
            .list()
            .unwrap()
            .iter()
            .any(|lv| lv.name == LvmThin::partial_lv(id))
    }

    fn clones_depend_on_snapshots(&self) -> bool {
        false
    }

    fn scratch(&self) -> &Path {
        self.scratch.path()
    }
}

#[test]
fn lvm_thin_volumes() {
    if !dm_thin() {
        eprintln!(
            "SKIPPED lvm_thin_volumes: this kernel has no dm-thin-pool \
             (no /sys/module/dm_thin_pool, `modprobe dm-thin-pool` failed, \
             `dmsetup targets` lists no thin-pool)"
        );
        return;
    }
    let pool = LvmPool::new();
    let t = Instant::now();
    exercise(&pool);
    eprintln!("lvm body: {:.1}s", t.elapsed().as_secs_f64());
    assert_eq!(
        pool.backend.disk(Uuid::nil()),
        DiskSource::Block {
            path: PathBuf::from(format!("/dev/{}/kumo-vol-{}", pool.vg, Uuid::nil()))
        }
    );
}

/// A pool named by a relative path works from any directory the tools
/// run in (the dev fleet names its state directories relatively).
#[test]
fn a_relative_pool_directory_is_made_absolute() {
    let here = std::env::current_dir().unwrap();
    let pool = kumo_agent::storage::qcow2::Qcow2Dir::new("some/pool");
    assert_eq!(pool.dir, here.join("some/pool"));
}

// ---- moving volumes between hosts' pools ------------------------------

mod transfer {
    use std::sync::Arc;
    use std::time::Duration;

    use kumo_agent::storage::root_disks::RootDisks;
    use kumo_agent::transfer::{Transfers, SHA256_HEADER};
    use kumo_api_types::{DesiredExport, DesiredImport, TransferKind, VolumeActual, VolumeStatus};

    use super::*;

    async fn serve(t: Arc<Transfers>) -> String {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        kumo_agent::transfer::serve(l, t);
        url
    }

    fn backend(pool: &Qcow2Pool) -> Arc<dyn Backend> {
        Arc::new(Qcow2Dir::new(&pool.backend.dir))
    }

    /// A 1 GiB import of `id` from `from`.
    fn wanted(volume: Uuid, from: String, kind: TransferKind) -> DesiredImport {
        DesiredImport {
            volume,
            size_gib: 1,
            from,
            kind,
            tenant: None,
        }
    }

    /// Transfers over a pool, with root disks beside it.
    fn transfers(pool: &Arc<dyn Backend>, state: &Path) -> Arc<Transfers> {
        Transfers::new(pool.clone(), RootDisks::new(state))
    }

    /// What a pass of the agent takes as whole: the pool's volumes.
    fn in_pool(pool: &dyn Backend) -> impl Fn(Uuid) -> Option<Option<u32>> {
        let seen = pool.observe().unwrap();
        move |id| {
            let o = seen.iter().find(|o| o.id == id)?;
            Some(Some((o.size_bytes / GIB) as u32))
        }
    }

    /// Passes of the destination until the import's report is `until`
    /// (or 120 s went by); the last report.
    async fn converge_until(
        t: &Arc<Transfers>,
        pool: &dyn Backend,
        want: &DesiredImport,
        until: VolumeActual,
    ) -> VolumeStatus {
        let present = |id| in_pool(pool)(id);
        converge_until_with(t, want, &present, until).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_volume_moves_whole_only_to_the_holder_of_its_token() {
        let (a, b) = (Qcow2Pool::new(), Qcow2Pool::new());
        let (src, dst) = (backend(&a), backend(&b));
        let id = Uuid::new_v4();
        src.create(id, 1).unwrap();
        a.write(id, 0x5a, 3 * MIB, MIB);
        a.write(id, 0xa5, GIB - MIB, MIB);
        let sum = src.checksum(id).unwrap();
        let source = transfers(&src, a.scratch.path());
        let url = serve(source.clone()).await;
        let dest = transfers(&dst, b.scratch.path());
        let want = wanted(id, url.clone(), TransferKind::Volume);

        // The destination's token: only its hash is reported. Until the
        // source is told that hash, the fetch is refused (not found).
        let r = dest.converge_imports(want.kind, std::slice::from_ref(&want), &|_| None);
        assert_eq!(r[0].state, VolumeActual::Importing);
        let hash = r[0].token_sha256.clone().unwrap();
        assert_eq!(hash.len(), 64);
        let r = converge_until(&dest, &*dst, &want, VolumeActual::Failed).await;
        assert!(r.reason.as_deref().unwrap().contains("404"), "{r:?}");
        assert_eq!(
            r.token_sha256.as_deref(),
            Some(hash.as_str()),
            "one token per move"
        );

        // Others are refused: no token, a wrong one, a volume not moving.
        let http = reqwest::Client::new();
        let get = |path: String, token: Option<&str>| {
            let mut req = http.get(format!("{url}{path}"));
            if let Some(t) = token {
                req = req.bearer_auth(t);
            }
            req.send()
        };
        source.set_exports(&[DesiredExport {
            volume: id,
            token_sha256: hash.clone(),
            kind: TransferKind::Volume,
            tenant: None,
        }]);
        let path = format!("/v1/volumes/{id}");
        assert_eq!(get(path.clone(), None).await.unwrap().status(), 401);
        assert_eq!(get(path.clone(), Some(&hash)).await.unwrap().status(), 401);
        let other = format!("/v1/volumes/{}", Uuid::new_v4());
        assert_eq!(get(other, Some("x")).await.unwrap().status(), 404);

        // Told, the source serves it: the copy is whole, checksummed.
        let t = Instant::now();
        let r = converge_until(&dest, &*dst, &want, VolumeActual::Ready).await;
        assert_eq!(r.state, VolumeActual::Ready, "{r:?}");
        assert_eq!(r.size_gib, Some(1));
        eprintln!("1 GiB moved (checksum, send, import) in {:?}", t.elapsed());
        assert_eq!(dst.checksum(id).unwrap(), sum, "the same contents");
        assert_eq!(src.checksum(id).unwrap(), sum, "the source keeps its copy");
        assert!(!dest.importing(TransferKind::Volume, id));

        // Once the move is over the source serves nobody, token or not.
        source.set_exports(&[]);
        assert_eq!(get(path, Some("anything")).await.unwrap().status(), 404);
    }

    /// A TCP relay to `upstream` that counts the bytes coming back.
    async fn counting_relay(upstream: &str) -> (String, Arc<std::sync::atomic::AtomicU64>) {
        let target = upstream.trim_start_matches("http://").to_owned();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let count = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let c = count.clone();
        tokio::spawn(async move {
            while let Ok((mut down, _)) = l.accept().await {
                let (target, c) = (target.clone(), c.clone());
                tokio::spawn(async move {
                    let mut up = tokio::net::TcpStream::connect(&target).await.unwrap();
                    let (mut dr, mut dw) = down.split();
                    let (mut ur, mut uw) = up.split();
                    let back = async {
                        let mut buf = vec![0u8; 1 << 16];
                        loop {
                            use tokio::io::{AsyncReadExt, AsyncWriteExt};
                            let n = match ur.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            c.fetch_add(n as u64, std::sync::atomic::Ordering::SeqCst);
                            if dw.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                        let _ = tokio::io::AsyncWriteExt::shutdown(&mut dw).await;
                    };
                    let _ = tokio::join!(tokio::io::copy(&mut dr, &mut uw), back);
                });
            }
        });
        (url, count)
    }

    /// A thin volume moves as the data it holds: 4 GiB provisioned with
    /// 10 MiB written sends about 10 MiB, not 4 GiB, and arrives the same
    /// (and sparse).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_sparse_volume_moves_as_its_data_only() {
        let (a, b) = (Qcow2Pool::new(), Qcow2Pool::new());
        let (src, dst) = (backend(&a), backend(&b));
        let id = Uuid::new_v4();
        src.create(id, 4).unwrap();
        a.write(id, 0x5a, 0, 4 * MIB);
        a.write(id, 0xa5, 2 * GIB + 512, 3 * MIB);
        a.write(id, 0x33, 4 * GIB - 3 * MIB, 3 * MIB);
        let source = transfers(&src, a.scratch.path());
        let (url, wire) = counting_relay(&serve(source.clone()).await).await;
        let dest = transfers(&dst, b.scratch.path());
        let want = DesiredImport {
            volume: id,
            size_gib: 4,
            from: url,
            kind: TransferKind::Volume,
            tenant: None,
        };
        let r = dest.converge_imports(want.kind, std::slice::from_ref(&want), &|_| None);
        source.set_exports(&[DesiredExport {
            volume: id,
            token_sha256: r[0].token_sha256.clone().unwrap(),
            kind: TransferKind::Volume,
            tenant: None,
        }]);
        let t = Instant::now();
        let r = converge_until(&dest, &*dst, &want, VolumeActual::Ready).await;
        assert_eq!(r.state, VolumeActual::Ready, "{r:?}");
        let sent = wire.load(std::sync::atomic::Ordering::SeqCst);
        eprintln!(
            "4 GiB volume, 10 MiB written: {sent} bytes on the wire, {:?}",
            t.elapsed()
        );
        assert!(
            (10 * MIB..12 * MIB).contains(&sent),
            "{sent} bytes sent for 10 MiB of data"
        );
        assert_eq!(find(&*dst, id).unwrap().size_bytes, 4 * GIB);
        sh(Command::new("qemu-img")
            .args(["compare", "-q", "-f", "qcow2", "-F", "qcow2"])
            .arg(a.backend.volume_path(id))
            .arg(b.backend.volume_path(id)));
        let on_disk = std::fs::metadata(b.backend.volume_path(id)).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert!(
            on_disk.blocks() * 512 < 64 * MIB,
            "kept sparse: {} bytes",
            on_disk.blocks() * 512
        );
    }

    /// A root disk as the agent makes one: a qcow2 overlay on a template
    /// image, with data in both layers.
    fn root_disk(state: &Path, vm: Uuid) -> PathBuf {
        let dir = state.join("vms").join(vm.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        let base = state.join("template.qcow2");
        sh(Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2"])
            .arg(&base)
            .arg("1G"));
        sh(Command::new("qemu-io")
            .args(["-f", "qcow2", "-c", "write -P 0x11 0 1M"])
            .arg(&base));
        let disk = dir.join("disk.qcow2");
        sh(Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b"])
            .arg(&base)
            .arg(&disk)
            .arg("1G"));
        sh(Command::new("qemu-io")
            .args(["-f", "qcow2", "-c", "write -P 0x22 512M 1M"])
            .arg(&disk));
        disk
    }

    /// SHA-256 of an image's guest-visible contents.
    fn contents_sha256(image: &Path) -> String {
        use sha2::Digest;
        let raw = image.with_extension("check.raw");
        sh(Command::new("qemu-img")
            .args(["convert", "-q", "-U", "-O", "raw"])
            .arg(image)
            .arg(&raw));
        let mut h = sha2::Sha256::new();
        std::io::copy(&mut std::fs::File::open(&raw).unwrap(), &mut h).unwrap();
        let sum = hex::encode(h.finalize());
        std::fs::remove_file(raw).unwrap();
        sum
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_root_disk_moves_flattened_and_only_as_a_root_disk() {
        let (a, b) = (Qcow2Pool::new(), Qcow2Pool::new());
        let (src, dst) = (backend(&a), backend(&b));
        let vm = Uuid::new_v4();
        let disk = root_disk(a.scratch.path(), vm);
        let sum = contents_sha256(&disk);
        // A UEFI VM's variable store (OVMF_VARS_4M's size) goes along.
        let store: Vec<u8> = (0..540_672u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(disk.with_file_name("nvram.fd"), &store).unwrap();
        let source = transfers(&src, a.scratch.path());
        let url = serve(source.clone()).await;
        let dest = transfers(&dst, b.scratch.path());
        let here = RootDisks::new(b.scratch.path());
        let want = wanted(vm, url.clone(), TransferKind::RootDisk);
        let r = dest.converge_imports(want.kind, std::slice::from_ref(&want), &|_| None);
        assert_eq!(r[0].state, VolumeActual::Importing);
        let hash = r[0].token_sha256.clone().unwrap();
        // Told as a volume, the source does not serve the root disk: a
        // token opens one thing of one kind.
        source.set_exports(&[DesiredExport {
            volume: vm,
            token_sha256: hash.clone(),
            kind: TransferKind::Volume,
            tenant: None,
        }]);
        let r = converge_until_with(&dest, &want, &|_| None, VolumeActual::Failed).await;
        assert!(r.reason.as_deref().unwrap().contains("404"), "{r:?}");
        assert!(!here.present(vm));
        assert!(!here.nvram_path(vm).exists(), "nor its variable store");
        // Nor does another token open the store.
        source.set_exports(&[DesiredExport {
            volume: vm,
            token_sha256: hash.clone(),
            kind: TransferKind::RootDisk,
            tenant: None,
        }]);
        let stranger = reqwest::Client::new()
            .get(format!("{url}/v1/root-disks/{vm}/nvram"))
            .bearer_auth("0".repeat(64))
            .send()
            .await
            .unwrap();
        assert_eq!(stranger.status(), 401);

        source.set_exports(&[DesiredExport {
            volume: vm,
            token_sha256: hash.clone(),
            kind: TransferKind::RootDisk,
            tenant: None,
        }]);
        let present = |id| here.present(id).then_some(None);
        let r = converge_until_with(&dest, &want, &present, VolumeActual::Ready).await;
        assert_eq!(r.state, VolumeActual::Ready, "{r:?}");
        let moved = here.path(vm);
        assert_eq!(contents_sha256(&moved), sum, "the same contents");
        let info = sh(Command::new("qemu-img")
            .args(["info", "--output=json", "-U"])
            .arg(&moved));
        assert!(
            !info.contains("backing-filename"),
            "flattened: no template needed on the new host: {info}"
        );
        assert_eq!(
            std::fs::read(here.nvram_path(vm)).unwrap(),
            store,
            "the variable store came along, byte for byte"
        );
        let mut files: Vec<String> = std::fs::read_dir(moved.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        assert_eq!(files, ["disk.qcow2", "nvram.fd"], "no partial left");
        // The source's copy stays until it is told to drop it.
        let there = RootDisks::new(a.scratch.path());
        assert!(there.present(vm));
        assert!(there.remove(vm).unwrap());
        assert!(!there.present(vm));
        assert!(!there.remove(vm).unwrap(), "dropping twice is a no-op");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_root_disk_without_a_variable_store_moves_and_a_huge_one_stops_the_move() {
        let (a, b) = (Qcow2Pool::new(), Qcow2Pool::new());
        let (src, dst) = (backend(&a), backend(&b));
        let source = transfers(&src, a.scratch.path());
        let url = serve(source.clone()).await;
        let dest = transfers(&dst, b.scratch.path());
        let here = RootDisks::new(b.scratch.path());
        let present = |id| here.present(id).then_some(None);
        let (bios, huge) = (Uuid::new_v4(), Uuid::new_v4());
        root_disk(a.scratch.path(), bios);
        let disk = root_disk(a.scratch.path(), huge);
        // Past any variable store: the source sends none of it.
        std::fs::File::create(disk.with_file_name("nvram.fd"))
            .unwrap()
            .set_len(kumo_agent::storage::root_disks::NVRAM_MAX_BYTES + 1)
            .unwrap();
        let wants = [
            wanted(bios, url.clone(), TransferKind::RootDisk),
            wanted(huge, url.clone(), TransferKind::RootDisk),
        ];
        let r = dest.converge_imports(TransferKind::RootDisk, &wants, &present);
        source.set_exports(
            &r.iter()
                .map(|v| DesiredExport {
                    volume: v.id,
                    token_sha256: v.token_sha256.clone().unwrap(),
                    kind: TransferKind::RootDisk,
                    tenant: None,
                })
                .collect::<Vec<_>>(),
        );
        // Both at once (a pass that wants one only drops the other's
        // import, and its token); a first try may go before the source
        // was told.
        let started = Instant::now();
        let (bios_state, why) = loop {
            let r = dest.converge_imports(TransferKind::RootDisk, &wants, &present);
            let why = r[1].reason.clone().unwrap_or_default();
            if (r[0].state == VolumeActual::Ready && why.contains("500"))
                || started.elapsed() > Duration::from_secs(60)
            {
                break (r[0].state, why);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(bios_state, VolumeActual::Ready);
        assert!(
            !here.nvram_path(bios).exists(),
            "a BIOS VM has no store to bring"
        );
        assert!(
            why.contains("variable store") && why.contains("500"),
            "{why}"
        );
        assert!(!here.present(huge), "the disk waits for its store");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_root_disk_from_a_source_before_stores_moved_comes_without_one() {
        use axum::body::Bytes;
        // A source that knows root disks (raw) but no variable stores: its
        // router answers their path with a bare 404.
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let data = vec![7u8; MIB as usize];
        let sum = {
            use sha2::Digest;
            hex::encode(sha2::Sha256::digest(&data))
        };
        let app = axum::Router::new().route(
            "/v1/root-disks/{id}",
            axum::routing::get(move || {
                let (data, sum) = (data.clone(), sum.clone());
                async move {
                    (
                        [
                            ("content-length", data.len().to_string()),
                            (SHA256_HEADER, sum),
                        ],
                        Bytes::from(data),
                    )
                }
            }),
        );
        tokio::spawn(async move { axum::serve(l, app).await });
        let b = Qcow2Pool::new();
        let dest = transfers(&backend(&b), b.scratch.path());
        let here = RootDisks::new(b.scratch.path());
        let vm = Uuid::new_v4();
        // A store an earlier try left: not this VM's any more.
        std::fs::create_dir_all(here.nvram_path(vm).parent().unwrap()).unwrap();
        std::fs::write(here.nvram_path(vm), b"stale").unwrap();
        let want = wanted(vm, url, TransferKind::RootDisk);
        let present = |id| here.present(id).then_some(None);
        let r = converge_until_with(&dest, &want, &present, VolumeActual::Ready).await;
        assert_eq!(r.state, VolumeActual::Ready, "{r:?}");
        assert!(here.present(vm));
        assert!(!here.nvram_path(vm).exists(), "the stale store is gone");
    }

    /// [`converge_until`] with what the pass takes as whole.
    async fn converge_until_with(
        t: &Arc<Transfers>,
        want: &DesiredImport,
        present: &dyn Fn(Uuid) -> Option<Option<u32>>,
        until: VolumeActual,
    ) -> VolumeStatus {
        let start = Instant::now();
        loop {
            let r = t.converge_imports(want.kind, std::slice::from_ref(want), present);
            assert_eq!(r.len(), 1);
            if r[0].state == until || start.elapsed() > Duration::from_secs(120) {
                return r[0].clone();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A source that announces `announced` as the checksum and sends
    /// `send` of the `len` bytes of `pattern` before failing (or, with
    /// `stall`, before sending nothing more).
    async fn fake_source(len: u64, send: u64, announced: String) -> String {
        fake_source_with(len, send, announced, false).await
    }

    async fn fake_source_with(len: u64, send: u64, announced: String, stall: bool) -> String {
        use axum::body::{Body, Bytes};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let app = axum::Router::new().route(
            "/v1/volumes/{id}",
            axum::routing::get(move || {
                let announced = announced.clone();
                async move {
                    let chunks = (0..send / MIB)
                        .map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![7u8; MIB as usize])));
                    let cut = (send < len && !stall).then(|| Err(std::io::Error::other("cut")));
                    let sent = tokio_stream::iter(chunks.chain(cut));
                    let body = if stall {
                        Body::from_stream(tokio_stream::StreamExt::chain(
                            sent,
                            tokio_stream::pending(),
                        ))
                    } else {
                        Body::from_stream(sent)
                    };
                    (
                        [
                            ("content-length", len.to_string()),
                            (SHA256_HEADER, announced),
                        ],
                        body,
                    )
                }
            }),
        );
        tokio::spawn(async move { axum::serve(l, app).await });
        url
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_copy_cut_short_or_with_another_checksum_leaves_nothing() {
        let len = 64 * MIB;
        let right = {
            use sha2::Digest;
            hex::encode(sha2::Sha256::digest(vec![7u8; len as usize]))
        };
        for (send, announced, why) in [
            (len / 2, right.clone(), "receiving"),
            (len, "0".repeat(64), "checksum mismatch"),
        ] {
            let b = Qcow2Pool::new();
            let dst = backend(&b);
            let dest = transfers(&dst, b.scratch.path());
            let want = wanted(
                Uuid::new_v4(),
                fake_source(len, send, announced).await,
                TransferKind::Volume,
            );
            let r = converge_until(&dest, &*dst, &want, VolumeActual::Failed).await;
            assert_eq!(r.state, VolumeActual::Failed);
            let reason = r.reason.unwrap();
            assert!(reason.contains(why), "{why}: {reason}");
            assert!(dst.observe().unwrap().is_empty(), "nothing kept");
            assert!(!b.partial_exists(want.volume), "no partial left: {reason}");
        }
        // And a copy that is right is kept (the fake is a fair source).
        let b = Qcow2Pool::new();
        let dst = backend(&b);
        let dest = transfers(&dst, b.scratch.path());
        let want = wanted(
            Uuid::new_v4(),
            fake_source(len, len, right.clone()).await,
            TransferKind::Volume,
        );
        let r = converge_until(&dest, &*dst, &want, VolumeActual::Ready).await;
        assert_eq!(r.state, VolumeActual::Ready, "{r:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_import_called_off_stops_and_leaves_nothing() {
        let len = 64 * MIB;
        let b = Qcow2Pool::new();
        let dst = backend(&b);
        let dest = transfers(&dst, b.scratch.path());
        let want = wanted(
            Uuid::new_v4(),
            fake_source_with(len, len / 2, "0".repeat(64), true).await,
            TransferKind::Volume,
        );
        // Any file of it in the pool (which the import makes).
        let partial = |id: Uuid| {
            std::fs::read_dir(&b.backend.dir).is_ok_and(|d| {
                d.flatten()
                    .any(|e| e.file_name().to_string_lossy().contains(&id.to_string()))
            })
        };
        dest.converge_imports(want.kind, std::slice::from_ref(&want), &|_| None);
        let start = Instant::now();
        while !partial(want.volume) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the import never began"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            dest.importing(want.kind, want.volume),
            "half sent, then the source stalls"
        );
        // The move is called off: the desired state lists no import.
        assert!(dest.converge_imports(want.kind, &[], &|_| None).is_empty());
        assert!(!dest.importing(want.kind, want.volume));
        while partial(want.volume) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the partial stayed"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(dst.observe().unwrap().is_empty());
    }
}
