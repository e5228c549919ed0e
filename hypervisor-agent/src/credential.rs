//! The host's identity in the agent's state directory: `credential`
//! (mode 0600) holds the host id and its secret credential.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credential {
    pub host_id: Uuid,
    pub server: String,
    pub credential: String,
}

pub fn path(state_dir: &Path) -> PathBuf {
    state_dir.join("credential")
}

/// `None` when there is none yet; a file that does not parse is an error,
/// not a reason to register again silently.
pub fn load(state_dir: &Path) -> anyhow::Result<Option<Credential>> {
    let p = path(state_dir);
    match std::fs::read_to_string(&p) {
        Ok(text) => {
            Ok(Some(serde_json::from_str(&text).map_err(|e| {
                anyhow::anyhow!("{} is corrupt: {e}", p.display())
            })?))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(anyhow::anyhow!("cannot read {}: {e}", p.display())),
    }
}

pub fn save(state_dir: &Path, c: &Credential) -> anyhow::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    std::fs::create_dir_all(state_dir)?;
    let p = path(state_dir);
    let tmp = p.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(serde_json::to_string_pretty(c)?.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, &p)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn round_trip_private() {
        let d = tempfile::tempdir().unwrap();
        assert!(load(d.path()).unwrap().is_none());
        let c = Credential {
            host_id: Uuid::now_v7(),
            server: "http://127.0.0.1:1".into(),
            credential: "kumoh_x_y".into(),
        };
        save(d.path(), &c).unwrap();
        assert_eq!(load(d.path()).unwrap(), Some(c));
        assert_eq!(
            std::fs::metadata(path(d.path()))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o600
        );
        std::fs::write(path(d.path()), "{garbage").unwrap();
        assert!(load(d.path()).is_err());
    }
}
