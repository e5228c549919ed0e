//! Project shares' rules: sizes, a mount's guest path and virtiofs tag,
//! whether a share is past its size, and which hosts may keep one.

use kumo_api_types::{ShareLimit, SharesStorage, MOUNTS_MAX};

use crate::error::ApiError;

/// The largest share: 1 PiB (mdx gives a project Lustre of that order).
pub const MAX_GIB: u32 = 1 << 20;

/// virtio-fs tags are at most 36 bytes.
pub const TAG_MAX: usize = 36;

/// Project ids of shares: above those an operator's own projects use by
/// hand, within the 32 bits the filesystems keep.
pub const PROJECT_MIN: u32 = 1 << 20;
pub const PROJECT_MAX: u32 = (1 << 31) - 1;

pub fn size(field: &str, gib: u32) -> Result<i64, ApiError> {
    if gib == 0 || gib > MAX_GIB {
        return Err(ApiError::field(
            field,
            format!("a share is 1 to {MAX_GIB} GiB"),
        ));
    }
    Ok(i64::from(gib))
}

/// The guest's mount point: absolute, plain (letters, digits, `._-/`),
/// without `.` or `..` parts, not `/` and not in the guest's system
/// directories. It goes into the guest's fstab through cloud-init, so
/// nothing in it may need quoting.
pub fn guest_path(field: &str, path: &str) -> Result<String, ApiError> {
    let bad = |why: &str| Err(ApiError::field(field, format!("{path:?}: {why}")));
    if !path.starts_with('/') || path.len() > 255 {
        return bad("an absolute path of at most 255 characters");
    }
    if !path
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/'))
    {
        return bad("letters, digits, '.', '_', '-' and '/' only");
    }
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    if parts.is_empty() || parts.iter().any(|p| *p == "." || *p == "..") {
        return bad("a directory below / without '.' or '..'");
    }
    const SYSTEM: [&str; 9] = [
        "bin", "boot", "dev", "etc", "lib", "proc", "run", "sbin", "sys",
    ];
    if SYSTEM.contains(&parts[0]) || (parts[0] == "usr" && parts.len() == 1) {
        return bad("not in the guest's system directories");
    }
    Ok(format!("/{}", parts.join("/")))
}

/// Where a share goes when the request names no path.
pub fn default_path(share: &str) -> String {
    format!("/mnt/{share}")
}

/// The virtiofs tag of a share in a VM: its name (unique among the
/// tenant's shares, and a VM mounts only its tenant's), cut to fit.
pub fn tag(share: &str) -> String {
    share.chars().take(TAG_MAX).collect()
}

/// The tags of one VM's shares must differ: a cut name could meet another.
pub fn distinct_tags(field: &str, names: &[String]) -> Result<(), ApiError> {
    if names.len() > MOUNTS_MAX {
        return Err(ApiError::field(
            field,
            format!("at most {MOUNTS_MAX} shares in a VM"),
        ));
    }
    for (i, a) in names.iter().enumerate() {
        if names[..i].iter().any(|b| tag(a) == tag(b)) {
            return Err(ApiError::field(
                field,
                format!(
                    "{a:?} is named twice (or shares its first {TAG_MAX} characters with another)"
                ),
            ));
        }
    }
    Ok(())
}

/// Past its size where only measuring holds it: the share turns read-only.
pub fn over_size(limit: ShareLimit, used_bytes: u64, size_gib: i64) -> bool {
    limit == ShareLimit::Measured && used_bytes > u64::try_from(size_gib).unwrap_or(0) << 30
}

/// Why a measured share is read-only.
pub fn read_only_reason(size_gib: i64, uncounted: bool) -> String {
    if uncounted {
        return format!(
            "more files than its keeper counts: taken as past its size ({size_gib} GiB); its mounts are read-only from each VM's next start"
        );
    }
    format!(
        "past its size ({size_gib} GiB): the filesystem has no project quotas to stop writes, so its mounts are read-only from each VM's next start"
    )
}

/// A host's words as a share keeps them: without control characters, at
/// most 1,000 characters.
pub fn bounded(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(1000)
        .collect()
}

/// Which host keeps a share, of `candidates` (the hosts that may keep
/// shares, fewest kept first): its keeper while that one may, else the
/// first (a lost keeper's work moves on); none when no host may.
pub fn keeper(candidates: &[uuid::Uuid], current: Option<uuid::Uuid>) -> Option<uuid::Uuid> {
    match current {
        Some(k) if candidates.contains(&k) => Some(k),
        _ => candidates.first().copied(),
    }
}

/// Whether a host's agent may keep shares: it has the filesystem, and
/// reported no problem with it.
pub fn keeps(storage: Option<&SharesStorage>) -> bool {
    storage.is_some_and(|s| s.problem.is_none())
}

/// A host's report of the shared filesystem as stored: its problem cut to
/// fit (said when the filesystem is in trouble: never refused for it), its
/// free space in steps of a hundredth of its size, so a filesystem every
/// host shares does not make every heartbeat a write.
pub fn stored_storage(s: &SharesStorage) -> Result<String, ApiError> {
    if s.root.len() > 4096 {
        return Err(ApiError::field("shares.root", "at most 4096 characters"));
    }
    let step = (s.capacity_gib / 100).max(1);
    let kept = SharesStorage {
        free_gib: s.free_gib / step * step,
        problem: s.problem.as_deref().map(bounded),
        ..s.clone()
    };
    serde_json::to_string(&kept).map_err(|e| ApiError::Internal(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_paths_are_plain_directories_outside_the_system() {
        assert_eq!(guest_path("p", "/data").unwrap(), "/data");
        assert_eq!(guest_path("p", "/data//sets/").unwrap(), "/data/sets");
        for bad in [
            "data",
            "/",
            "/data/../etc",
            "/./data",
            "/etc",
            "/proc/x",
            "/usr",
            "/data set",
            "/data\n/x",
            "/d\"x",
        ] {
            assert!(guest_path("p", bad).is_err(), "{bad:?}");
        }
        assert!(guest_path("p", "/usr/local/data").is_ok());
        assert!(guest_path("p", &format!("/{}", "a".repeat(300))).is_err());
    }

    #[test]
    fn tags_fit_virtiofs_and_clash_when_cut_alike() {
        assert_eq!(tag("datasets"), "datasets");
        let long = "a".repeat(40);
        assert_eq!(tag(&long).len(), TAG_MAX);
        let other = format!("{}b", "a".repeat(39));
        assert!(distinct_tags("s", &[long.clone(), other]).is_err());
        assert!(distinct_tags("s", &["a-1".into(), "a-2".into()]).is_ok());
        assert!(distinct_tags("s", &["x".into(), "x".into()]).is_err());
        let many: Vec<String> = (0..=MOUNTS_MAX).map(|i| format!("s{i}")).collect();
        assert!(distinct_tags("s", &many).is_err());
    }

    #[test]
    fn only_a_measured_share_turns_read_only_and_only_past_its_size() {
        let gib = 1u64 << 30;
        assert!(!over_size(ShareLimit::Measured, gib, 1));
        assert!(over_size(ShareLimit::Measured, gib + 1, 1));
        assert!(!over_size(ShareLimit::ProjectQuota, 10 * gib, 1));
    }

    #[test]
    fn a_shared_filesystems_report_is_kept_coarse_and_bounded() {
        let s = |free| SharesStorage {
            root: "/srv/shares".into(),
            capacity_gib: 10_000,
            free_gib: free,
            limit: ShareLimit::Measured,
            problem: Some("x\n".repeat(2000)),
        };
        assert_eq!(
            stored_storage(&s(5_010)).unwrap(),
            stored_storage(&s(5_099)).unwrap()
        );
        assert_ne!(
            stored_storage(&s(5_010)).unwrap(),
            stored_storage(&s(5_100)).unwrap()
        );
        let kept: SharesStorage = serde_json::from_str(&stored_storage(&s(1)).unwrap()).unwrap();
        assert_eq!(kept.problem.unwrap().chars().count(), 1000);
    }

    #[test]
    fn a_share_keeps_its_keeper_while_it_may() {
        let (a, b) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
        assert_eq!(keeper(&[a, b], Some(b)), Some(b));
        assert_eq!(
            keeper(&[a], Some(b)),
            Some(a),
            "a lost keeper's work moves on"
        );
        assert_eq!(keeper(&[a], None), Some(a));
        assert_eq!(keeper(&[], Some(b)), None);
    }

    #[test]
    fn sizes_are_bounded() {
        assert!(size("s", 0).is_err());
        assert!(size("s", MAX_GIB + 1).is_err());
        assert_eq!(size("s", 1000).unwrap(), 1000);
    }
}
