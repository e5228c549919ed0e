//! VMs' root disks (`<state dir>/vms/<vm>/disk.qcow2`) as moves see them:
//! a shelved VM unshelved on another host (`kumo vm unshelve --anywhere`)
//! takes its root disk along. The source sends the disk's guest-visible
//! contents (its template's backing chain flattened); the destination
//! keeps them as a flat qcow2 image, and only when whole and matching.
//! A UEFI guest's variable store (`nvram.fd`: boot entries, Secure Boot
//! keys the guest enrolled) goes along with it, before the disk, so a
//! moved VM boots as it was set up rather than from a fresh store.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;

use uuid::Uuid;

use sha2::{Digest, Sha256};

use super::qcow2::{read_as_raw, receive_as_qcow2};
use super::{check_import_size, Claim, Incoming, StorageError};

/// A UEFI VM's variable store, beside its disk.
pub const NVRAM_FILE: &str = "nvram.fd";

/// The largest variable store that moves: OVMF's are 528 KiB (4 MiB
/// builds) or 128 KiB; a file far past that is not a store, and is
/// neither sent nor taken.
pub const NVRAM_MAX_BYTES: u64 = 16 << 20;

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

    /// Where the VM's UEFI variable store is.
    pub fn nvram_path(&self, vm: Uuid) -> PathBuf {
        self.dir(vm).join(NVRAM_FILE)
    }

    /// The VM's variable store, when it has one (a BIOS VM has none).
    pub fn read_nvram(&self, vm: Uuid) -> Result<Option<Vec<u8>>, StorageError> {
        let path = self.nvram_path(vm);
        // The agent's own file, never what a link points at.
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(StorageError::io(format!(
                    "opening VM {vm}'s variable store"
                ))(e))
            }
        };
        let mut bytes = Vec::new();
        file.take(NVRAM_MAX_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(StorageError::io(format!(
                "reading VM {vm}'s variable store"
            )))?;
        if bytes.len() as u64 > NVRAM_MAX_BYTES {
            return Err(StorageError::Refused(format!(
                "VM {vm}'s variable store is over {NVRAM_MAX_BYTES} bytes: not one"
            )));
        }
        // An empty file is no store (QEMU would refuse it).
        Ok(Some(bytes).filter(|b| !b.is_empty()))
    }

    /// Keeps `bytes` as the VM's variable store when their SHA-256 is
    /// `expected_sha256`: written under another name and renamed, so a
    /// torn copy is never booted from. Refused once the disk is here
    /// (the VM may be running from the store it has).
    pub fn receive_nvram(
        &self,
        vm: Uuid,
        bytes: &[u8],
        expected_sha256: &str,
    ) -> Result<(), StorageError> {
        if bytes.len() as u64 > NVRAM_MAX_BYTES {
            return Err(StorageError::Refused(format!(
                "a variable store of {} bytes (at most {NVRAM_MAX_BYTES})",
                bytes.len()
            )));
        }
        let actual = hex::encode(Sha256::digest(bytes));
        if !actual.eq_ignore_ascii_case(expected_sha256) {
            return Err(StorageError::Checksum {
                expected: expected_sha256.to_owned(),
                actual,
            });
        }
        if self.present(vm) {
            return Err(StorageError::Refused(format!(
                "the root disk of VM {vm} exists already"
            )));
        }
        let dir = self.ensure_dir(vm)?;
        let partial = dir.join("nvram.import");
        let _claim = Claim::take(partial.display().to_string())?;
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&partial)?;
            f.write_all(bytes)?;
            f.sync_all()?;
            std::fs::rename(&partial, self.nvram_path(vm))
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&partial);
            StorageError::io(format!("keeping VM {vm}'s variable store"))(e)
        })
    }

    /// Drops a variable store an earlier move left here, for a VM whose
    /// disk is not here yet (its source now sends none).
    pub fn forget_nvram(&self, vm: Uuid) -> Result<(), StorageError> {
        if self.present(vm) {
            return Ok(());
        }
        match std::fs::remove_file(self.nvram_path(vm)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(StorageError::io(format!(
                "removing VM {vm}'s variable store"
            ))(e)),
            _ => Ok(()),
        }
    }

    /// The VM's directory, made if need be, as the agent makes it: QEMU's
    /// user passes through, nobody lists.
    fn ensure_dir(&self, vm: Uuid) -> Result<PathBuf, StorageError> {
        let dir = self.dir(vm);
        std::fs::create_dir_all(&dir)
            .map_err(StorageError::io(format!("creating {}", dir.display())))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711))
            .map_err(StorageError::io(format!("chmod {}", dir.display())))?;
        Ok(dir)
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
        let dir = self.ensure_dir(vm)?;
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
