//! Spare capacity a training cluster keeps free in its scalable unit: N
//! members' worth of its shape that no other guaranteed VM may take, so
//! that a repair finds room beside the surviving members. Spot VMs may run
//! on it (they are reclaimed, with notice, when a repair needs the room),
//! so room is counted as if every spot VM were gone.

use uuid::Uuid;

use crate::index::{HostCap, HostUse, Index};
use crate::place::Request;
use crate::Hold;

/// One cluster's spares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spare {
    pub cluster: Uuid,
    /// The scalable unit they are kept in (`None`: the hosts without one).
    pub unit: Option<u32>,
    /// The member shape (GPUs of one model, vCPUs, memory).
    pub member: Request,
    pub count: u32,
}

impl Spare {
    /// `count` spares of the member shape of `req` (GPUs of its model,
    /// vCPUs, memory; nothing else of the request matters).
    pub fn of(cluster: Uuid, unit: Option<u32>, req: &Request, count: u32) -> Spare {
        Spare {
            cluster,
            unit,
            member: Request {
                gpus: req.gpus,
                model: req.model,
                vcpus: req.vcpus,
                memory_mib: req.memory_mib,
                ..Request::default()
            },
            count,
        }
    }
}

fn cpus_of(h: &Hold) -> u64 {
    h.cpus.iter().map(|(_, c)| c.len() as u64).sum()
}

fn memory_of(h: &Hold) -> u64 {
    h.memory.iter().map(|(_, m)| *m).sum()
}

/// Members of `member`'s shape host `h` could take with its spot VMs gone
/// and `taken` (a placement about to be made there) applied; judged by
/// GPUs of the model, CPUs and memory alone, as the cluster placement
/// judges a unit's room.
pub fn host_room(h: &HostCap, member: &Request, taken: Option<&Hold>) -> u32 {
    if h.state != HostUse::Ready {
        return 0;
    }
    let (mut gpus, mut cpus, mut mem) =
        (h.gpu_free, u64::from(h.cpus_free_total), h.mem_free_total);
    for x in h.holds.iter().filter(|x| x.spot) {
        gpus |= x.gpus;
        cpus += cpus_of(x);
        mem += memory_of(x);
    }
    gpus &= !h.gpu_blocked;
    if let Some(t) = taken {
        gpus &= !t.gpus;
        cpus = cpus.saturating_sub(cpus_of(t));
        mem = mem.saturating_sub(memory_of(t));
    }
    let by_gpus = if member.gpus == 0 {
        u64::MAX
    } else {
        h.profile
            .model_masks
            .iter()
            .filter(|(m, _)| member.model.is_none_or(|x| x == *m))
            .map(|(_, mask)| u64::from((gpus & mask).count_ones() / member.gpus))
            .max()
            .unwrap_or(0)
    };
    let by_cpus = cpus / u64::from(member.vcpus.max(1));
    let unknown_memory = h.profile.nodes.iter().all(|n| n.memory_mib == 0);
    let by_mem = if member.memory_mib == 0 || unknown_memory {
        u64::MAX
    } else {
        mem / member.memory_mib
    };
    u32::try_from(by_gpus.min(by_cpus).min(by_mem)).unwrap_or(u32::MAX)
}

/// Members of the spare's shape its unit could take, with `taken` applied
/// on host position `at`.
pub fn unit_room(index: &Index, s: &Spare, taken: Option<(usize, &Hold)>) -> u32 {
    index
        .hosts
        .iter()
        .enumerate()
        .filter(|(_, h)| h.scalable_unit == s.unit)
        .map(|(i, h)| {
            let t = taken.and_then(|(at, hold)| (at == i).then_some(hold));
            host_room(h, &s.member, t)
        })
        .fold(0, u32::saturating_add)
}

/// Whether placing `hold` on host position `at` for `req` keeps the spares
/// of every other cluster in that host's unit. Spot requests may always
/// use spare room, and a cluster's own members (its repairs) may use its
/// spares. Spares of one shape in one unit add up; a placement that takes
/// no room of a spare's shape is never refused (a unit already short of
/// its spares, after a host was lost, still takes small VMs).
pub fn kept(index: &Index, at: usize, hold: &Hold, req: &Request) -> bool {
    if req.spot {
        return true;
    }
    let Some(h) = index.hosts.get(at) else {
        return true;
    };
    let others = |s: &&Spare| s.unit == h.scalable_unit && Some(s.cluster) != req.cluster;
    for s in index.spares.iter().filter(others) {
        let needed: u32 = index
            .spares
            .iter()
            .filter(others)
            .filter(|t| t.member.gpus == s.member.gpus && t.member.model == s.member.model)
            .map(|t| t.count)
            .sum();
        let before = host_room(h, &s.member, None);
        let after = host_room(h, &s.member, Some(hold));
        if after >= before {
            continue;
        }
        let room = unit_room(index, s, None).saturating_sub(before) + after;
        if room < needed {
            return false;
        }
    }
    true
}
