//! A host's disk as placement counts it: provisioned GiB against what its
//! storage may hold.
//!
//! Each host's agent reports its pool's size less its reserve (and the
//! root disks' filesystem when that is another one). Volumes, snapshots,
//! copies on their way in or out and VMs' root disks are thin, but they
//! count at their provisioned size: a host that said yes to more than it
//! holds fails its tenants' writes later, all of them at once. An
//! operator who accepts that risk sets an overcommit ratio (the server's
//! `[storage] overcommit`), which multiplies what a host may provision.

/// What a host's storage may hold, as its agent said (GiB, the reserve
/// taken off).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostDisk {
    /// The volume pool.
    pub capacity_gib: u64,
    /// The root disks' filesystem when it is not the pool's; `None`: they
    /// share the pool.
    pub root_capacity_gib: Option<u64>,
}

/// What is provisioned on a host, GiB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskUse {
    /// Volumes (at both ends of a move), their snapshots, old copies not
    /// yet removed.
    pub volumes_gib: u64,
    /// VMs' root disks (of VMs placed there, shelved there, or moving
    /// away).
    pub root_gib: u64,
}

/// Which of a host's storage a request goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pool {
    Volumes,
    RootDisks,
}

impl HostDisk {
    /// GiB still free for `pool` on this host with `used` provisioned,
    /// what it may hold multiplied by `overcommit`; negative when over.
    pub fn free_gib(&self, used: &DiskUse, pool: Pool, overcommit: f64) -> i64 {
        let budget = |gib: u64| -> i64 {
            let b = (gib as f64 * overcommit).floor();
            if b.is_finite() && b < i64::MAX as f64 {
                b.max(0.0) as i64
            } else {
                i64::MAX
            }
        };
        let n = |g: u64| i64::try_from(g).unwrap_or(i64::MAX);
        match (pool, self.root_capacity_gib) {
            (_, None) => budget(self.capacity_gib)
                .saturating_sub(n(used.volumes_gib))
                .saturating_sub(n(used.root_gib)),
            (Pool::Volumes, Some(_)) => {
                budget(self.capacity_gib).saturating_sub(n(used.volumes_gib))
            }
            (Pool::RootDisks, Some(root)) => budget(root).saturating_sub(n(used.root_gib)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provisioned_sizes_count_against_the_pool_they_go_to() {
        let shared = HostDisk {
            capacity_gib: 65,
            root_capacity_gib: None,
        };
        let used = DiskUse {
            volumes_gib: 20,
            root_gib: 30,
        };
        // One pool: volumes and root disks take from the same 65 GiB.
        assert_eq!(shared.free_gib(&used, Pool::Volumes, 1.0), 15);
        assert_eq!(shared.free_gib(&used, Pool::RootDisks, 1.0), 15);
        // An 8,000 GiB volume does not fit, unless overcommitted so far.
        assert!(shared.free_gib(&DiskUse::default(), Pool::Volumes, 1.0) < 8000);
        assert!(shared.free_gib(&DiskUse::default(), Pool::Volumes, 200.0) >= 8000);
        // Two pools: each its own.
        let split = HostDisk {
            capacity_gib: 65,
            root_capacity_gib: Some(100),
        };
        assert_eq!(split.free_gib(&used, Pool::Volumes, 1.0), 45);
        assert_eq!(split.free_gib(&used, Pool::RootDisks, 1.0), 70);
        assert_eq!(split.free_gib(&used, Pool::RootDisks, 1.5), 120);
        // Over is negative, never wraps; absurd ratios saturate.
        let full = DiskUse {
            volumes_gib: 100,
            root_gib: 0,
        };
        assert_eq!(shared.free_gib(&full, Pool::Volumes, 1.0), -35);
        assert_eq!(
            shared.free_gib(&full, Pool::Volumes, f64::INFINITY),
            i64::MAX - 100
        );
    }
}
