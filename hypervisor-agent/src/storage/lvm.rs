//! Volumes as thin LVs in an LVM thin pool (`vg/pool`), attached to
//! guests as raw block devices.
//!
//! - a volume is `kumo-vol-<uuid>`, activated;
//! - a snapshot is the thin snapshot `kumo-vol-<uuid>-snap-<uuid>`
//!   (activation skipped: nothing reads it but a clone). Thin snapshots
//!   share blocks but do not depend on each other, so any of them, or the
//!   volume, can go first;
//! - a volume made from a snapshot is a thin snapshot of that snapshot,
//!   activated, extended if asked for more;
//! - what takes more than one step is made as `kumo-partial-<uuid>` and
//!   renamed (`lvrename`) when complete.
//!
//! The pool must zero newly provisioned blocks (`lvcreate -Zy`, LVM's
//! default), or a guest could read another tenant's deleted data:
//! [`LvmThin::observe`] refuses a pool that does not.
//!
//! Without udev (a container), LVM is told not to wait for it and to make
//! the device nodes itself (`activation{udev_sync=0 udev_rules=0}`); with
//! udev running (`/run/udev/control`), LVM's defaults apply.
//!
//! Sizes are rounded up by LVM to the VG's extent size (4 MiB by
//! default); whole-GiB volumes are not affected.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use uuid::Uuid;

use super::{
    check_import_size, in_flight, run, Backend, Claim, DiskSource, Incoming, Observed, Space,
    StorageError, GIB,
};

const LVM_PKG: &str = "lvm2 (and thin-provisioning-tools)";
const VOL: &str = "kumo-vol-";
const PARTIAL: &str = "kumo-partial-";

/// A pool of thin volumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LvmThin {
    pub vg: String,
    pub thin_pool: String,
}

/// One row of `lvs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lv {
    pub name: String,
    pub size: u64,
    pub origin: String,
    pub attr: String,
    pub pool: String,
}

impl Lv {
    fn active(&self) -> bool {
        self.attr.chars().nth(4) == Some('a')
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Name {
    Volume(Uuid),
    Snapshot(Uuid, Uuid),
    Partial(Uuid),
}

fn parse_uuid(s: &str) -> Option<Uuid> {
    let id = Uuid::parse_str(s).ok()?;
    (id.hyphenated().to_string() == s).then_some(id)
}

fn parse_name(name: &str) -> Option<Name> {
    if let Some(rest) = name.strip_prefix(PARTIAL) {
        return parse_uuid(rest).map(Name::Partial);
    }
    let rest = name.strip_prefix(VOL)?;
    if rest.len() == 36 {
        return parse_uuid(rest).map(Name::Volume);
    }
    let (vol, snap) = rest.split_once("-snap-")?;
    Some(Name::Snapshot(parse_uuid(vol)?, parse_uuid(snap)?))
}

/// Parses `lvs --reportformat json --units b --nosuffix -o
/// lv_name,lv_size,origin,lv_attr,pool_lv`.
pub fn parse_lvs(json: &[u8]) -> Result<Vec<Lv>, StorageError> {
    let bad = |why: &str| StorageError::Invalid(format!("lvs answered {why}"));
    let v: Value = serde_json::from_slice(json).map_err(|e| bad(&format!("garbage: {e}")))?;
    let field = |lv: &Value, k: &str| lv.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    let mut out = Vec::new();
    for report in v
        .get("report")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("no report"))?
    {
        for lv in report
            .get("lv")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            let size = field(lv, "lv_size");
            let size = size.trim_end_matches(['B', 'b']);
            out.push(Lv {
                name: field(lv, "lv_name"),
                size: size
                    .parse()
                    .map_err(|_| bad(&format!("the size {size:?}")))?,
                origin: field(lv, "origin"),
                attr: field(lv, "lv_attr"),
                pool: field(lv, "pool_lv"),
            });
        }
    }
    Ok(out)
}

/// Parses `lvs -o lv_size,data_percent` of a thin pool: its size and
/// what its data leaves free.
pub fn parse_pool_space(json: &[u8]) -> Result<Space, StorageError> {
    let bad = |why: &str| StorageError::Invalid(format!("lvs answered {why}"));
    let v: Value = serde_json::from_slice(json).map_err(|e| bad(&format!("garbage: {e}")))?;
    let lv = v
        .get("report")
        .and_then(|r| r.get(0))
        .and_then(|r| r.get("lv"))
        .and_then(|l| l.get(0))
        .ok_or_else(|| bad("no thin pool"))?;
    let field = |k: &str| lv.get(k).and_then(Value::as_str).unwrap_or("").trim();
    let size = field("lv_size").trim_end_matches(['B', 'b']);
    let total: u64 = size
        .parse()
        .map_err(|_| bad(&format!("the size {size:?}")))?;
    let pct: f64 = match field("data_percent") {
        "" => 0.0,
        p => p
            .parse()
            .map_err(|_| bad(&format!("the data percentage {p:?}")))?,
    };
    let used = ((total as f64) * pct.clamp(0.0, 100.0) / 100.0) as u64;
    Ok(Space {
        total_bytes: total,
        free_bytes: total.saturating_sub(used),
        device: None,
    })
}

impl LvmThin {
    pub fn new(vg: impl Into<String>, thin_pool: impl Into<String>) -> Self {
        LvmThin {
            vg: vg.into(),
            thin_pool: thin_pool.into(),
        }
    }

    pub fn volume_lv(id: Uuid) -> String {
        format!("{VOL}{id}")
    }

    pub fn snapshot_lv(id: Uuid, snap: Uuid) -> String {
        format!("{VOL}{id}-snap-{snap}")
    }

    /// What a volume is made as before it is renamed into place.
    pub fn partial_lv(id: Uuid) -> String {
        format!("{PARTIAL}{id}")
    }

    pub fn device_path(&self, lv: &str) -> PathBuf {
        Path::new("/dev").join(&self.vg).join(lv)
    }

    fn full(&self, lv: &str) -> String {
        format!("{}/{lv}", self.vg)
    }

    /// An LVM tool (`lvcreate`, `lvs`, `vgcreate`, …) set up for this
    /// host: told not to wait for udev where none runs.
    pub fn command(tool: &str) -> Command {
        let mut cmd = Command::new(tool);
        cmd.env("LVM_SUPPRESS_FD_WARNINGS", "1");
        if !Path::new("/run/udev/control").exists() {
            cmd.arg("--config")
                .arg("activation { udev_sync = 0 udev_rules = 0 monitoring = 0 }");
        }
        cmd
    }

    fn lvm(&self, tool: &'static str, args: &[&str]) -> Result<Vec<u8>, StorageError> {
        run(Self::command(tool).args(args), tool, LVM_PKG)
    }

    fn claim(&self, id: Uuid) -> Result<Claim, StorageError> {
        Claim::take(self.claim_key(id))
    }

    fn claim_key(&self, id: Uuid) -> String {
        format!("lvm:{}/{}", self.vg, Self::partial_lv(id))
    }

    /// Every LV in the VG.
    pub fn list(&self) -> Result<Vec<Lv>, StorageError> {
        let out = self.lvm(
            "lvs",
            &[
                "--reportformat",
                "json",
                "--units",
                "b",
                "--nosuffix",
                "-o",
                "lv_name,lv_size,origin,lv_attr,pool_lv",
                &self.vg,
            ],
        )?;
        parse_lvs(&out)
    }

    /// The LVs in our thin pool; refuses a missing pool or one that does
    /// not zero new blocks.
    fn ours(&self) -> Result<Vec<Lv>, StorageError> {
        let all = self.list()?;
        let pool = all
            .iter()
            .find(|lv| lv.name == self.thin_pool)
            .ok_or_else(|| {
                StorageError::Invalid(format!(
                    "thin pool {} not found",
                    self.full(&self.thin_pool)
                ))
            })?;
        if !pool.attr.starts_with('t') {
            return Err(StorageError::Invalid(format!(
                "{} is not a thin pool (lv_attr {})",
                self.full(&self.thin_pool),
                pool.attr
            )));
        }
        if pool.attr.chars().nth(7) != Some('z') {
            return Err(StorageError::Invalid(format!(
                "thin pool {} does not zero new blocks, so volumes could show other tenants' \
                 deleted data: `lvchange --zero y {}`",
                self.full(&self.thin_pool),
                self.full(&self.thin_pool)
            )));
        }
        Ok(all
            .into_iter()
            .filter(|lv| lv.pool == self.thin_pool)
            .collect())
    }

    fn find(&self, lv: &str) -> Result<Option<Lv>, StorageError> {
        Ok(self.ours()?.into_iter().find(|l| l.name == lv))
    }

    fn remove(&self, lvs: &[String]) -> Result<(), StorageError> {
        if lvs.is_empty() {
            return Ok(());
        }
        let full: Vec<String> = lvs.iter().map(|lv| self.full(lv)).collect();
        let mut args = vec!["-q", "-y"];
        args.extend(full.iter().map(String::as_str));
        self.lvm("lvremove", &args).map(|_| ())
    }

    fn rename_into_place(&self, id: Uuid) -> Result<(), StorageError> {
        self.lvm(
            "lvrename",
            &["-q", &self.vg, &Self::partial_lv(id), &Self::volume_lv(id)],
        )
        .map(|_| ())
    }

    /// Removes the partial (ours: the caller holds its claim) if there.
    fn clear_partial(&self, id: Uuid) -> Result<(), StorageError> {
        let partial = Self::partial_lv(id);
        if self.find(&partial)?.is_some() {
            self.remove(&[partial])?;
        }
        Ok(())
    }

    fn size_arg(bytes: u64) -> String {
        format!("{bytes}b")
    }

    /// The active volume's device.
    fn active_volume(&self, id: Uuid) -> Result<PathBuf, StorageError> {
        self.prepare(id)?;
        Ok(self.device_path(&Self::volume_lv(id)))
    }
}

impl Backend for LvmThin {
    fn kind(&self) -> &'static str {
        "lvm-thin"
    }

    fn observe(&self) -> Result<Vec<Observed>, StorageError> {
        let lvs = self.ours()?;
        let mut out: Vec<Observed> = lvs
            .iter()
            .filter_map(|lv| match parse_name(&lv.name) {
                Some(Name::Volume(id)) => Some(Observed {
                    id,
                    size_bytes: lv.size,
                    snapshots: Vec::new(),
                }),
                _ => None,
            })
            .collect();
        for lv in &lvs {
            if let Some(Name::Snapshot(id, snap)) = parse_name(&lv.name) {
                if let Some(o) = out.iter_mut().find(|o| o.id == id) {
                    o.snapshots.push(snap);
                }
            }
        }
        for o in &mut out {
            o.snapshots.sort();
        }
        out.sort_by_key(|o| o.id);
        Ok(out)
    }

    fn create(&self, id: Uuid, size_gib: u64) -> Result<(), StorageError> {
        let _claim = self.claim(id)?;
        if self.find(&Self::volume_lv(id))?.is_some() {
            return Err(StorageError::Refused(format!("volume {id} already exists")));
        }
        self.clear_partial(id)?;
        let pool = self.full(&self.thin_pool);
        let size = Self::size_arg(size_gib.saturating_mul(GIB));
        let partial = Self::partial_lv(id);
        self.lvm(
            "lvcreate",
            &["-q", "-y", "-ay", "-V", &size, "-T", &pool, "-n", &partial],
        )?;
        self.rename_into_place(id)
    }

    fn create_from_snapshot(
        &self,
        id: Uuid,
        source: Uuid,
        snapshot: Uuid,
        size_gib: u64,
    ) -> Result<(), StorageError> {
        let _claim = self.claim(id)?;
        let lvs = self.ours()?;
        if lvs.iter().any(|l| l.name == Self::volume_lv(id)) {
            return Err(StorageError::Refused(format!("volume {id} already exists")));
        }
        let snap_lv = Self::snapshot_lv(source, snapshot);
        let base = lvs
            .iter()
            .find(|l| l.name == snap_lv)
            .ok_or(StorageError::NoSnapshot {
                volume: source,
                snapshot,
            })?;
        let size = size_gib.saturating_mul(GIB);
        if size < base.size {
            return Err(StorageError::Refused(format!(
                "volume {id} of {size} bytes cannot hold snapshot {snapshot} of {} bytes",
                base.size
            )));
        }
        let base_size = base.size;
        self.clear_partial(id)?;
        let partial = Self::partial_lv(id);
        // `-kn`: unlike snapshots, the new volume is activated normally.
        self.lvm(
            "lvcreate",
            &[
                "-q",
                "-y",
                "-s",
                "-kn",
                "-ay",
                "-n",
                &partial,
                &self.full(&snap_lv),
            ],
        )?;
        if size > base_size {
            self.lvm(
                "lvextend",
                &["-q", "-L", &Self::size_arg(size), &self.full(&partial)],
            )?;
        }
        self.rename_into_place(id)
    }

    fn grow(&self, id: Uuid, size_gib: u64) -> Result<(), StorageError> {
        let _claim = self.claim(id)?;
        let lv = Self::volume_lv(id);
        let have = self.find(&lv)?.ok_or(StorageError::NoVolume(id))?.size;
        let size = size_gib.saturating_mul(GIB);
        if size < have {
            return Err(StorageError::Refused(format!(
                "volume {id} is {have} bytes; volumes never shrink (asked for {size})"
            )));
        }
        if size == have {
            return Ok(());
        }
        self.lvm(
            "lvextend",
            &["-q", "-L", &Self::size_arg(size), &self.full(&lv)],
        )
        .map(|_| ())
    }

    fn delete(&self, id: Uuid) -> Result<(), StorageError> {
        let _claim = self.claim(id)?;
        let lvs = self.ours()?;
        // Snapshots first, the volume last: a delete cut short leaves the
        // volume observed, and the next pass deletes the rest.
        let snaps: Vec<String> = lvs
            .iter()
            .filter(|l| matches!(parse_name(&l.name), Some(Name::Snapshot(v, _)) if v == id))
            .map(|l| l.name.clone())
            .collect();
        self.remove(&snaps)?;
        let vol = Self::volume_lv(id);
        if lvs.iter().any(|l| l.name == vol) {
            self.remove(&[vol])?;
        }
        Ok(())
    }

    fn snapshot(&self, id: Uuid, snap: Uuid) -> Result<(), StorageError> {
        let _claim = self.claim(id)?;
        let lvs = self.ours()?;
        let vol = Self::volume_lv(id);
        if !lvs.iter().any(|l| l.name == vol) {
            return Err(StorageError::NoVolume(id));
        }
        let name = Self::snapshot_lv(id, snap);
        if lvs.iter().any(|l| l.name == name) {
            return Err(StorageError::Refused(format!(
                "snapshot {snap} of volume {id} already exists"
            )));
        }
        // One LVM transaction: there is nothing partial to see.
        self.lvm(
            "lvcreate",
            &["-q", "-y", "-s", "-n", &name, &self.full(&vol)],
        )
        .map(|_| ())
    }

    fn delete_snapshot(&self, id: Uuid, snap: Uuid) -> Result<(), StorageError> {
        let _claim = self.claim(id)?;
        let name = Self::snapshot_lv(id, snap);
        if self.find(&name)?.is_some() {
            self.remove(&[name])?;
        }
        Ok(())
    }

    fn disk(&self, id: Uuid) -> DiskSource {
        DiskSource::Block {
            path: self.device_path(&Self::volume_lv(id)),
        }
    }

    fn prepare(&self, id: Uuid) -> Result<bool, StorageError> {
        let lv = Self::volume_lv(id);
        let found = self.find(&lv)?.ok_or(StorageError::NoVolume(id))?;
        if found.active() {
            return Ok(false);
        }
        self.lvm("lvchange", &["-q", "-ay", "-K", &self.full(&lv)])?;
        Ok(true)
    }

    fn with_contents(
        &self,
        id: Uuid,
        read: &mut dyn FnMut(&mut std::fs::File) -> Result<(), StorageError>,
    ) -> Result<(), StorageError> {
        let dev = self.active_volume(id)?;
        let mut f = std::fs::File::open(&dev)
            .map_err(StorageError::io(format!("opening {}", dev.display())))?;
        read(&mut f)
    }

    fn capacity(&self) -> Result<Space, StorageError> {
        let out = self.lvm(
            "lvs",
            &[
                "--reportformat",
                "json",
                "--units",
                "b",
                "--nosuffix",
                "-o",
                "lv_size,data_percent",
                &self.full(&self.thin_pool),
            ],
        )?;
        parse_pool_space(&out)
    }

    fn receive(
        &self,
        id: Uuid,
        size_bytes: u64,
        incoming: Incoming<'_>,
    ) -> Result<(), StorageError> {
        check_import_size(size_bytes)?;
        let _claim = self.claim(id)?;
        if self.find(&Self::volume_lv(id))?.is_some() {
            return Err(StorageError::Refused(format!("volume {id} already exists")));
        }
        self.clear_partial(id)?;
        let partial = Self::partial_lv(id);
        let pool = self.full(&self.thin_pool);
        self.lvm(
            "lvcreate",
            &[
                "-q",
                "-y",
                "-ay",
                "-V",
                &Self::size_arg(size_bytes),
                "-T",
                &pool,
                "-n",
                &partial,
            ],
        )?;
        let written = (|| {
            let dev = self.device_path(&partial);
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .open(&dev)
                .map_err(StorageError::io(format!("opening {}", dev.display())))?;
            // A new thin LV reads as zeros: zero chunks need no writing.
            incoming.write_into(&mut f, size_bytes)
        })();
        if let Err(e) = written {
            if let Err(e2) = self.remove(&[partial]) {
                tracing::warn!(error = %e2, volume = %id, "removing a failed import");
            }
            return Err(e);
        }
        self.rename_into_place(id)
    }

    fn remove_stale_partials(&self) -> Result<usize, StorageError> {
        let stale: Vec<String> = self
            .ours()?
            .into_iter()
            .filter_map(|lv| match parse_name(&lv.name) {
                Some(Name::Partial(id)) if !in_flight(&self.claim_key(id)) => Some(lv.name),
                _ => None,
            })
            .collect();
        for lv in &stale {
            tracing::info!(lv = %self.full(lv), "removing a partial volume left behind");
        }
        self.remove(&stale)?;
        Ok(stale.len())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        assert_eq!(parse_name(&LvmThin::volume_lv(a)), Some(Name::Volume(a)));
        assert_eq!(
            parse_name(&LvmThin::snapshot_lv(a, b)),
            Some(Name::Snapshot(a, b))
        );
        assert_eq!(parse_name(&LvmThin::partial_lv(a)), Some(Name::Partial(a)));
        assert_eq!(parse_name("pool"), None);
        assert_eq!(parse_name(&format!("kumo-vol-{}", a.simple())), None);
        assert!(LvmThin::snapshot_lv(a, b).len() <= 127);
    }

    #[test]
    fn parses_a_thin_pools_space() {
        let json = br#"{"report":[{"lv":[{"lv_size":"10737418240", "data_percent":"25.00"}]}]}"#;
        let s = parse_pool_space(json).unwrap();
        assert_eq!((s.total_bytes, s.free_bytes), (10 << 30, 30 << 28));
        assert!(parse_pool_space(br#"{"report":[{"lv":[]}]}"#).is_err());
    }

    #[test]
    fn parses_lvs_json() {
        let json = br#"  {
      "report": [
          {
              "lv": [
                  {"lv_name":"pool", "lv_size":"1610612736", "origin":"", "lv_attr":"twi-aotz--", "pool_lv":""},
                  {"lv_name":"kumo-vol-6f1c2a4e-0b7d-4c1e-9a51-3b1f0c2d4e5f", "lv_size":"1073741824B", "origin":"", "lv_attr":"Vwi-a-tz--", "pool_lv":"pool"}
              ]
          }
      ]
  }"#;
        let lvs = parse_lvs(json).unwrap();
        assert_eq!(lvs.len(), 2);
        assert_eq!(lvs[0].size, 1610612736);
        assert_eq!(lvs[1].size, 1 << 30);
        assert_eq!(lvs[1].pool, "pool");
        assert!(lvs[1].active());
        assert!(parse_lvs(br#"{"report":[{"lv":[]}]}"#).unwrap().is_empty());
        assert!(parse_lvs(b"nope").is_err());
    }
}
