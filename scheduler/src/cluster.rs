//! Training clusters (placement groups): N identical VMs placed all or
//! nothing, inside one scalable unit when one has room (the fullest such,
//! best fit), otherwise over the fewest units, and rail-aligned: GPU *i*
//! of every member uses a NIC on the same rail.

use uuid::Uuid;

use crate::index::{HostUse, Index};
use crate::place::{place, rails_of, Choice, Request, Strategy};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterRequest {
    pub size: u32,
    pub member: Request,
    /// Every member in one scalable unit, or no placement at all
    /// (`--single-su required`); otherwise units are only preferred.
    pub one_unit: bool,
}

/// How many members each unit could take, judging by free GPUs, CPUs and
/// memory alone (the placement itself checks the rest). `None` is the
/// unit of hosts that have none.
fn unit_room(index: &Index, req: &Request) -> Vec<(Option<u32>, u32)> {
    let mut room: Vec<(Option<u32>, u32)> = Vec::new();
    for h in index.hosts.iter().filter(|h| h.state == HostUse::Ready) {
        let by_gpus = if req.gpus == 0 {
            u32::MAX
        } else {
            h.profile
                .model_masks
                .iter()
                .filter(|(m, _)| req.model.is_none_or(|x| x == *m))
                .map(|(_, mask)| (h.gpu_free & mask).count_ones() / req.gpus)
                .max()
                .unwrap_or(0)
        };
        let by_cpus = h.cpus_free_total / req.vcpus.max(1);
        let fits = by_gpus.min(by_cpus);
        if fits == 0 {
            continue;
        }
        match room.iter_mut().find(|(u, _)| *u == h.scalable_unit) {
            Some((_, n)) => *n += fits,
            None => room.push((h.scalable_unit, fits)),
        }
    }
    room
}

/// Places members one by one, each applied to the index so the next sees
/// it; on failure everything applied is taken back.
fn place_members(
    index: &mut Index,
    req: &ClusterRequest,
    ids: &[Uuid],
    units: &[Option<u32>],
    strategy: Strategy,
) -> Option<Vec<Choice>> {
    let mut placed: Vec<Choice> = Vec::new();
    // Rails asked for (members beside placed ones), or those of the first.
    let mut rails: Option<Vec<Option<u32>>> = req.member.rails.clone();
    let mut unit_iter = units.iter().peekable();
    for id in ids.iter().take(req.size as usize) {
        let mut found = None;
        while let Some(unit) = unit_iter.peek() {
            let member = Request {
                unit: **unit,
                rails: rails.clone(),
                ..req.member.clone()
            };
            // Hosts without a unit only when no unit was asked for.
            let c = place(index, &member, strategy)
                .filter(|c| index.hosts[c.host].scalable_unit == **unit);
            if c.is_some() {
                found = c;
                break;
            }
            unit_iter.next();
        }
        let Some(mut c) = found else {
            for c in &placed {
                index.release(c.host, c.hold.vm);
            }
            return None;
        };
        if rails.is_none() && strategy == Strategy::BestFit && req.member.gpus > 0 {
            rails = Some(rails_of(&index.hosts[c.host], c.hold.gpus));
        }
        c.hold.vm = *id;
        index.apply(c.host, c.hold.clone());
        placed.push(c);
    }
    Some(placed)
}

/// Places a cluster; on success the members are applied to the index
/// under `ids` (one per member) and returned in order.
pub fn place_cluster(
    index: &mut Index,
    req: &ClusterRequest,
    ids: &[Uuid],
    strategy: Strategy,
) -> Option<Vec<Choice>> {
    if ids.len() < req.size as usize {
        return None;
    }
    if strategy == Strategy::FirstFit && !req.one_unit {
        let mut units: Vec<Option<u32>> = index.hosts.iter().map(|h| h.scalable_unit).collect();
        units.sort();
        units.dedup();
        return place_members(index, req, ids, &units, strategy);
    }
    if req.member.unit.is_some() {
        // Asked for one unit (members beside placed ones): only there.
        return place_members(index, req, ids, &[req.member.unit], strategy);
    }
    let mut room = unit_room(index, &req.member);
    // One unit with room: the fullest that fits (best fit), trying the
    // next when rails or NUMA room make the estimate too hopeful.
    // Required to share a unit: hosts without one are no unit.
    let mut single: Vec<(Option<u32>, u32)> = room
        .iter()
        .copied()
        .filter(|(u, n)| *n >= req.size && (u.is_some() || !req.one_unit))
        .collect();
    single.sort_by_key(|(u, n)| (*n, *u));
    for (unit, _) in single {
        if let Some(p) = place_members(index, req, ids, &[unit], strategy) {
            return Some(p);
        }
    }
    if req.one_unit {
        return None;
    }
    // Otherwise the fewest units: the roomiest first.
    room.sort_by_key(|(u, n)| (std::cmp::Reverse(*n), *u));
    let units: Vec<Option<u32>> = room.into_iter().map(|(u, _)| u).collect();
    place_members(index, req, ids, &units, strategy)
}
