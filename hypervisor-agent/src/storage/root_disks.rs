//! VMs' root disks (`<state dir>/vms/<vm>/disk.qcow2`) as moves see them:
//! a shelved VM unshelved on another host (`kumo vm unshelve --anywhere`)
//! takes its root disk along. The source sends the disk's guest-visible
//! contents (its template's backing chain flattened); the destination
//! keeps them as a flat qcow2 image, and only when whole and matching.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use uuid::Uuid;

use super::qcow2::{read_as_raw, receive_as_qcow2};
use super::{check_import_size, Claim, Incoming, StorageError};

/// The root disks under an agent's state directory.
#[derive(Debug, Clone)]
pub struct RootDisks {
    vms_dir: PathBuf,
}

impl RootDisks {
    pub fn new(state_dir: &std::path::Path) -> RootDisks {
        RootDisks {
            vms_dir: state_dir.join("vms"),
        }
    }

    fn dir(&self, vm: Uuid) -> PathBuf {
        self.vms_dir.join(vm.to_string())
    }

    /// Where the VM's disk is (whole: it is made and imported under
    /// another name).
    pub fn path(&self, vm: Uuid) -> PathBuf {
        self.dir(vm).join("disk.qcow2")
    }

    /// Whether the VM's root disk is here, whole.
    pub fn present(&self, vm: Uuid) -> bool {
        self.path(vm).exists()
    }

    /// Calls `read` with the disk's raw contents.
    pub fn with_contents(
        &self,
        vm: Uuid,
        read: &mut dyn FnMut(&mut File) -> Result<(), StorageError>,
    ) -> Result<(), StorageError> {
        let disk = self.path(vm);
        if !disk.exists() {
            return Err(StorageError::NoVolume(vm));
        }
        let tmp = self
            .dir(vm)
            .join(format!("disk.read-{}.raw", Uuid::new_v4()));
        let _claim = Claim::take(tmp.display().to_string())?;
        read_as_raw(&disk, &tmp, read)
    }

    /// A root disk from raw contents (see [`super::Backend::import`]).
    pub fn import(
        &self,
        vm: Uuid,
        size_bytes: u64,
        reader: &mut dyn Read,
        expected_sha256: &str,
    ) -> Result<(), StorageError> {
        self.receive(
            vm,
            size_bytes,
            Incoming::Raw {
                reader,
                sha256: expected_sha256,
            },
        )
    }

    /// Where root disks live (for the space they have).
    pub fn dir_path(&self) -> &std::path::Path {
        &self.vms_dir
    }

    /// A root disk from what `incoming` carries (see
    /// [`super::Backend::receive`]).
    pub fn receive(
        &self,
        vm: Uuid,
        size_bytes: u64,
        incoming: Incoming<'_>,
    ) -> Result<(), StorageError> {
        check_import_size(size_bytes)?;
        let dir = self.dir(vm);
        std::fs::create_dir_all(&dir)
            .map_err(StorageError::io(format!("creating {}", dir.display())))?;
        // As the agent makes it: QEMU's user passes through, nobody lists.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711))
            .map_err(StorageError::io(format!("chmod {}", dir.display())))?;
        let raw = dir.join("disk.import.raw");
        let _claim = Claim::take(raw.display().to_string())?;
        let disk = self.path(vm);
        if disk.exists() {
            return Err(StorageError::Refused(format!(
                "the root disk of VM {vm} exists already"
            )));
        }
        receive_as_qcow2(
            &raw,
            &dir.join("disk.import.qcow2"),
            &disk,
            size_bytes,
            incoming,
        )
    }

    /// Removes what the host keeps of a VM that now runs elsewhere (or
    /// is gone): its directory. Answers whether there was one.
    pub fn remove(&self, vm: Uuid) -> Result<bool, StorageError> {
        let dir = self.dir(vm);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(StorageError::io(format!("removing {}", dir.display()))(e)),
        }
    }
}
