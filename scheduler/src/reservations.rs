//! Which whole hosts a reservation holds, and what on them must go.
//!
//! A reservation of N GPUs of a model holds whole hosts of that model: no
//! VM outside it starts there while it is held. A host's GPUs count
//! towards N unless a VM that cannot be reclaimed holds them (a guaranteed
//! VM within its tenant's share, outside the reservation); spot and
//! borrowed VMs there count as room, since they are reclaimed with
//! notice. Hosts held once are kept while they are in service, so the
//! choice is stable from one pass to the next.

use std::collections::BTreeSet;

use uuid::Uuid;

use crate::index::{HostCap, HostUse, Index};
use crate::Hold;

/// What one pass decides for a reservation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Holding {
    /// Hosts held after this pass (those kept, then those added).
    pub hosts: Vec<Uuid>,
    /// Hosts held before and let go (out of service, or not needed).
    pub dropped: Vec<Uuid>,
    /// GPUs the held hosts give it.
    pub usable: u32,
    /// VMs on the held hosts to reclaim: spot and borrowed ones outside
    /// the reservation, not already being reclaimed.
    pub victims: Vec<Uuid>,
}

/// A hold that stays whatever the reservation needs: a guaranteed VM not
/// borrowed, outside the reservation.
fn stays(x: &Hold, mine: &BTreeSet<Uuid>) -> bool {
    !mine.contains(&x.vm) && !x.spot && !x.borrowed
}

/// GPUs of `model` on `h` the reservation could use.
fn usable(h: &HostCap, model: u16, mine: &BTreeSet<Uuid>) -> u32 {
    if h.state != HostUse::Ready {
        return 0;
    }
    let staying = h
        .holds
        .iter()
        .filter(|x| stays(x, mine))
        .fold(0u64, |m, x| m | x.gpus);
    h.profile
        .model_masks
        .iter()
        .filter(|(m, _)| *m == model)
        .map(|(_, mask)| (mask & !h.gpu_blocked & !staying).count_ones())
        .sum()
}

/// The hosts reservation `id` holds for `gpus` GPUs of `model` after this
/// pass: those in `held` still in service, then more (the host giving the
/// most GPUs first, then the one with the fewest VMs to move off it) until
/// they give `gpus`, from hosts no other reservation holds; held hosts it
/// no longer needs (none of its VMs on them) are let go. Fewer when the
/// fleet has no more (`usable` says how many).
pub fn hold(
    index: &Index,
    id: Uuid,
    model: u16,
    gpus: u32,
    held: &[Uuid],
    mine: &BTreeSet<Uuid>,
) -> Holding {
    let mut out = Holding::default();
    for h in held {
        match index.host(*h) {
            Some(cap) if cap.state == HostUse::Ready => {
                out.usable += usable(cap, model, mine);
                out.hosts.push(*h);
            }
            _ => out.dropped.push(*h),
        }
    }
    if out.usable < gpus {
        let mut candidates: Vec<(u32, usize, &HostCap)> = index
            .hosts
            .iter()
            .filter(|h| h.reserved_for.is_none_or(|r| r == id) && !out.hosts.contains(&h.id))
            .map(|h| (usable(h, model, mine), h.holds.len(), h))
            .filter(|(n, _, _)| *n > 0)
            .collect();
        // The host giving the most GPUs first, then the one with the
        // fewest VMs to move off it.
        candidates.sort_by_key(|(n, vms, h)| (std::cmp::Reverse(*n), *vms, h.name.clone()));
        for (n, _, h) in candidates {
            if out.usable >= gpus {
                break;
            }
            out.usable += n;
            out.hosts.push(h.id);
        }
    } else {
        // More than it needs (a VM that stayed has left a held host, or a
        // host came back): let go of held hosts none of its VMs are on,
        // those giving least first, while the rest still give enough.
        let mut spare: Vec<(u32, Uuid)> = out
            .hosts
            .iter()
            .filter_map(|h| index.host(*h))
            .filter(|cap| !cap.holds.iter().any(|x| mine.contains(&x.vm)))
            .map(|cap| (usable(cap, model, mine), cap.id))
            .collect();
        spare.sort();
        for (n, h) in spare {
            if out.usable - n < gpus {
                break;
            }
            out.usable -= n;
            out.hosts.retain(|x| *x != h);
            out.dropped.push(h);
        }
    }
    for h in &out.hosts {
        let Some(cap) = index.host(*h) else { continue };
        out.victims.extend(
            cap.holds
                .iter()
                .filter(|x| !mine.contains(&x.vm) && (x.spot || x.borrowed) && !x.reclaiming)
                .map(|x| x.vm),
        );
    }
    out
}
