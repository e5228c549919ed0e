//! Guaranteed shares of GPUs (issue 42): per tenant and model, GPUs the
//! platform promises beside the cap. A tenant's guaranteed VMs are within
//! its share oldest first; those beyond it are *borrowed* — they run on
//! room others are promised, and are reclaimed (with notice) when a tenant
//! within its own share needs it, the borrower furthest above its share
//! first. A model nobody is promised has no borrowed VMs: there is no one
//! to lend to.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use kumo_api_types::{Quota, ScheduledAction, ScheduledEvent, ServiceLevel, VmSpec, VmState};
use uuid::Uuid;

use crate::error::ApiError;

/// A guaranteed VM holding GPUs, as the shares count it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    pub vm: Uuid,
    pub tenant: Uuid,
    pub model: String,
    pub gpus: u64,
}

/// Whether a VM in `state` with `spec` counts against its tenant's share:
/// guaranteed, with GPUs, holding them (not waiting, not being reclaimed,
/// not shelved or gone).
pub fn counts(state: VmState, spec: &VmSpec) -> bool {
    spec.service_level == ServiceLevel::Guaranteed
        && spec.gpus > 0
        && !matches!(
            state,
            VmState::Queued
                | VmState::Pending
                | VmState::Preempting
                | VmState::Preempted
                | VmState::Suspended
                | VmState::Shelving
                | VmState::Shelved
                | VmState::Deleting
                | VmState::Deleted
                | VmState::Lost
        )
}

/// Tenants' guarantees per model: `tenant → model → GPUs`.
pub type Guarantees = HashMap<Uuid, BTreeMap<String, u64>>;

/// The borrowed VMs among `held` (oldest first): per tenant and model,
/// those whose GPUs, counted in that order, go past the tenant's
/// guarantee — only for models someone is promised.
pub fn borrowed(held: &[Holding], guarantees: &Guarantees) -> HashSet<Uuid> {
    let promised: HashSet<&str> = guarantees
        .values()
        .flat_map(|g| g.iter().filter(|(_, n)| **n > 0).map(|(m, _)| m.as_str()))
        .collect();
    let mut running: HashMap<(Uuid, &str), u64> = HashMap::new();
    let mut out = HashSet::new();
    for h in held {
        if !promised.contains(h.model.as_str()) {
            continue;
        }
        let sum = running.entry((h.tenant, h.model.as_str())).or_default();
        *sum += h.gpus;
        let share = guarantees
            .get(&h.tenant)
            .and_then(|g| g.get(&h.model))
            .copied()
            .unwrap_or(0);
        if *sum > share {
            out.insert(h.vm);
        }
    }
    out
}

/// GPUs of `model` each tenant holds above its guarantee (those above it
/// only).
pub fn above(held: &[Holding], guarantees: &Guarantees, model: &str) -> HashMap<Uuid, u64> {
    let mut used: HashMap<Uuid, u64> = HashMap::new();
    for h in held.iter().filter(|h| h.model == model) {
        *used.entry(h.tenant).or_default() += h.gpus;
    }
    used.into_iter()
        .filter_map(|(t, n)| {
            let share = guarantees
                .get(&t)
                .and_then(|g| g.get(model))
                .copied()
                .unwrap_or(0);
            (n > share).then(|| (t, n - share))
        })
        .collect()
}

/// Whether `tenant` asking for `gpus` more of `model` stays within its
/// guarantee.
pub fn within(
    held: &[Holding],
    guarantees: &Guarantees,
    tenant: Uuid,
    model: &str,
    gpus: u64,
) -> bool {
    let share = guarantees
        .get(&tenant)
        .and_then(|g| g.get(model))
        .copied()
        .unwrap_or(0);
    let used: u64 = held
        .iter()
        .filter(|h| h.tenant == tenant && h.model == model)
        .map(|h| h.gpus)
        .sum();
    share > 0 && used + gpus <= share
}

/// A quota's guarantees: each at most the cap of its model.
pub fn validate(q: &Quota) -> Result<(), ApiError> {
    for (model, n) in &q.guarantee {
        let field = format!("guarantee.{model}");
        crate::domain::names::gpu_model(&field, model)?;
        let cap = q.gpus.get(model).copied().unwrap_or(0);
        if *n > cap {
            return Err(ApiError::field(
                &field,
                format!("{n} GPUs guaranteed is more than the quota's cap of {cap} for {model}"),
            ));
        }
    }
    Ok(())
}

/// A model whose guarantees together exceed its GPUs in service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overpromised {
    pub model: String,
    pub promised: u64,
    pub in_service: u64,
}

/// The models promised beyond what the fleet has in service.
pub fn overpromised(
    promised: &BTreeMap<String, u64>,
    in_service: &BTreeMap<String, u64>,
) -> Vec<Overpromised> {
    promised
        .iter()
        .filter_map(|(model, p)| {
            let have = in_service.get(model).copied().unwrap_or(0);
            (*p > have).then(|| Overpromised {
                model: model.clone(),
                promised: *p,
                in_service: have,
            })
        })
        .collect()
}

/// A borrowed VM's standing event (API, portal, `/run/kumo/events`).
pub fn borrowed_event(since: DateTime<Utc>, host: &str, model: Option<&str>) -> ScheduledEvent {
    ScheduledEvent {
        kind: "borrowed".into(),
        at: since,
        action: ScheduledAction::Reclaimable,
        host: host.to_owned(),
        reason: Some(format!(
            "runs above its project's guaranteed share of {}: it may be reclaimed, with notice, for a project within its own",
            model.unwrap_or("its GPU model")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(vm: u128, tenant: u128, model: &str, gpus: u64) -> Holding {
        Holding {
            vm: Uuid::from_u128(vm),
            tenant: Uuid::from_u128(tenant),
            model: model.into(),
            gpus,
        }
    }

    fn g(entries: &[(u128, &str, u64)]) -> Guarantees {
        let mut out = Guarantees::new();
        for (t, m, n) in entries {
            out.entry(Uuid::from_u128(*t))
                .or_default()
                .insert((*m).into(), *n);
        }
        out
    }

    #[test]
    fn vms_past_the_share_oldest_first_are_borrowed() {
        let held = [
            h(1, 10, "H100", 8),
            h(2, 10, "H100", 8),
            h(3, 10, "H100", 4),
            h(4, 20, "H100", 8),
            h(5, 10, "A100", 8),
        ];
        let guarantees = g(&[(10, "H100", 8), (20, "H100", 8)]);
        let b = borrowed(&held, &guarantees);
        // Tenant 10: the first 8 within; the next two beyond. Tenant 20
        // within. A100 is promised to nobody: nothing borrowed.
        assert_eq!(
            b,
            [2, 3]
                .into_iter()
                .map(Uuid::from_u128)
                .collect::<HashSet<_>>()
        );
        // A tenant with no guarantee of a promised model borrows all of it.
        let b = borrowed(&held, &g(&[(20, "H100", 8)]));
        assert!(b.contains(&Uuid::from_u128(1)) && !b.contains(&Uuid::from_u128(4)));
        // Nobody promised anything: nothing is borrowed.
        assert!(borrowed(&held, &Guarantees::new()).is_empty());
    }

    #[test]
    fn above_and_within_count_the_model_asked_for() {
        let held = [
            h(1, 10, "H100", 16),
            h(2, 20, "H100", 4),
            h(3, 30, "H100", 12),
        ];
        let guarantees = g(&[(10, "H100", 8), (20, "H100", 8)]);
        let a = above(&held, &guarantees, "H100");
        assert_eq!(a.get(&Uuid::from_u128(10)), Some(&8));
        assert_eq!(a.get(&Uuid::from_u128(30)), Some(&12));
        assert!(!a.contains_key(&Uuid::from_u128(20)));
        assert!(within(&held, &guarantees, Uuid::from_u128(20), "H100", 4));
        assert!(!within(&held, &guarantees, Uuid::from_u128(20), "H100", 5));
        // No guarantee: never within.
        assert!(!within(&held, &guarantees, Uuid::from_u128(30), "H100", 0));
        assert!(!within(&held, &guarantees, Uuid::from_u128(20), "A100", 1));
    }

    #[test]
    fn a_guarantee_over_its_cap_is_refused() {
        let mut q = Quota::default();
        q.gpus.insert("H100-SXM5-80GB".into(), 8);
        q.guarantee.insert("H100-SXM5-80GB".into(), 8);
        assert!(validate(&q).is_ok());
        q.guarantee.insert("H100-SXM5-80GB".into(), 9);
        let e = validate(&q).unwrap_err().to_string();
        assert!(e.contains("cap of 8"), "{e}");
        q.guarantee.clear();
        q.guarantee.insert("A100".into(), 1);
        assert!(validate(&q).is_err());
    }

    #[test]
    fn overpromised_models_are_named() {
        let promised = BTreeMap::from([("H100".to_string(), 24), ("A100".to_string(), 8)]);
        let have = BTreeMap::from([("H100".to_string(), 16), ("A100".to_string(), 8)]);
        assert_eq!(
            overpromised(&promised, &have),
            vec![Overpromised {
                model: "H100".into(),
                promised: 24,
                in_service: 16
            }]
        );
    }
}
