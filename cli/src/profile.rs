//! The CLI's profile file (`~/.config/kumo/config.toml`): named server and
//! token pairs, written by `kumo login`, readable only by its owner.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileFile {
    /// The profile used when none is named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<String>,
    #[serde(default)]
    pub profiles: BTreeMap<String, Profile>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub server: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a valid kumo profile file: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// `$KUMO_CLI_CONFIG`, else `$XDG_CONFIG_HOME/kumo/config.toml`, else
/// `$HOME/.config/kumo/config.toml`.
pub fn default_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KUMO_CLI_CONFIG") {
        return Some(PathBuf::from(p));
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("kumo").join("config.toml"))
}

impl ProfileFile {
    /// A missing file is an empty one.
    pub fn load(path: &Path) -> Result<ProfileFile, ProfileError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ProfileFile::default()),
            Err(source) => {
                return Err(ProfileError::Read {
                    path: path.to_path_buf(),
                    source,
                })
            }
        };
        toml::from_str(&text).map_err(|e| ProfileError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
    }

    /// Writes atomically (temp file and rename), mode 0600: the file holds tokens.
    pub fn save(&self, path: &Path) -> Result<(), ProfileError> {
        use std::os::unix::fs::OpenOptionsExt;
        let werr = |source| ProfileError::Write {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(werr)?;
        }
        let text = toml::to_string_pretty(self).unwrap_or_default();
        let tmp = path.with_extension("toml.tmp");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(werr)?;
        f.write_all(text.as_bytes()).map_err(werr)?;
        f.sync_all().map_err(werr)?;
        std::fs::rename(&tmp, path).map_err(werr)
    }

    pub fn get(&self, name: Option<&str>) -> Option<&Profile> {
        let name = name.or(self.current.as_deref()).unwrap_or("default");
        self.profiles.get(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn round_trip_with_private_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kumo/config.toml");
        let mut f = ProfileFile {
            current: Some("lab".into()),
            ..ProfileFile::default()
        };
        f.profiles.insert(
            "lab".into(),
            Profile {
                server: "http://127.0.0.1:8080".into(),
                token: Some("kumo_x_y".into()),
            },
        );
        f.save(&path).unwrap();
        assert_eq!(ProfileFile::load(&path).unwrap(), f);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(f.get(None).unwrap().server, "http://127.0.0.1:8080");
        assert!(f.get(Some("other")).is_none());
    }

    #[test]
    fn missing_file_is_empty_and_garbage_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            ProfileFile::load(&dir.path().join("none.toml")).unwrap(),
            ProfileFile::default()
        );
        let bad = dir.path().join("bad.toml");
        std::fs::write(&bad, "profiles = 3").unwrap();
        let err = ProfileFile::load(&bad).unwrap_err().to_string();
        assert!(err.contains("bad.toml"), "{err}");
    }
}
