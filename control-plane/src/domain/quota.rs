//! What a tenant's VMs hold against its quota, and whether a request fits.

use std::collections::BTreeMap;

use kumo_api_types::{Quota, VmSpec, VmState};

use crate::domain::names;
use crate::error::ApiError;

/// A tenant's use of its quota. Every VM row counts as a VM and holds its
/// disk (a preempted VM's disk stays until it is deleted); all but
/// preempted ones (which hold nothing else and will not again) hold their
/// vCPUs, memory and GPUs. The portal's "GPUs in use" is this too.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Usage {
    pub vms: u64,
    pub vcpus: u64,
    pub memory_gib: u64,
    pub disk_gib: u64,
    /// GPUs per model (`""` for requests that name none).
    pub gpus: BTreeMap<String, u64>,
}

impl Usage {
    /// The use of VMs in these states with these specs.
    pub fn of<'a>(vms: impl IntoIterator<Item = (VmState, &'a VmSpec)>) -> Usage {
        let mut u = Usage::default();
        for (state, spec) in vms {
            // A VM whose host is lost holds nothing anyone can use.
            if state == VmState::Lost {
                continue;
            }
            u.vms += 1;
            u.disk_gib += u64::from(spec.disk_gib);
            if state != VmState::Preempted {
                u.hold(spec);
            }
        }
        u
    }

    /// Adds a new VM's spec.
    pub fn add(&mut self, spec: &VmSpec) {
        self.vms += 1;
        self.disk_gib += u64::from(spec.disk_gib);
        self.hold(spec);
    }

    /// A cluster's spare member: compute kept for it (no VM, no disk).
    pub fn keep(&mut self, spec: &VmSpec) {
        self.hold(spec);
    }

    fn hold(&mut self, s: &VmSpec) {
        self.vcpus += u64::from(s.vcpus);
        self.memory_gib += u64::from(s.memory_gib);
        if s.gpus > 0 {
            let model = s.gpu_model.clone().unwrap_or_default();
            *self.gpus.entry(model).or_default() += u64::from(s.gpus);
        }
    }

    /// GPUs of every model together.
    pub fn gpus_total(&self) -> u64 {
        self.gpus.values().sum()
    }

    /// The first limit this use goes over, as the API reports it.
    pub fn check(&self, quota: &Quota, tenant: &str) -> Result<(), ApiError> {
        let over = |resource: &str, used: u64, limit: u32| {
            (used > u64::from(limit)).then(|| ApiError::QuotaExceeded {
                resource: resource.to_owned(),
                detail: format!(
                    "tenant {tenant:?} would use {used} with this request; its quota is {limit}"
                ),
            })
        };
        if let Some(e) = over("vms", self.vms, quota.vms)
            .or_else(|| over("vcpus", self.vcpus, quota.vcpus))
            .or_else(|| over("memory_gib", self.memory_gib, quota.memory_gib))
            .or_else(|| over("disk_gib", self.disk_gib, quota.disk_gib))
        {
            return Err(e);
        }
        for (model, used) in &self.gpus {
            let limit = quota.gpus.get(model).copied().unwrap_or(0);
            if let Some(e) = over(&format!("gpus.{model}"), *used, limit) {
                return Err(e);
            }
        }
        Ok(())
    }
}

/// No single limit may exceed this: larger numbers are typos, and they must
/// fit every database's integer.
pub const MAX_LIMIT: u32 = 1_000_000;
pub const MAX_GPU_MODELS: usize = 64;

pub fn validate(q: &Quota) -> Result<(), ApiError> {
    if q.gpus.len() > MAX_GPU_MODELS {
        return Err(ApiError::field(
            "gpus",
            format!("at most {MAX_GPU_MODELS} GPU models"),
        ));
    }
    for (model, n) in &q.gpus {
        names::gpu_model(&format!("gpus.{model}"), model)?;
        if *n > MAX_LIMIT {
            return Err(ApiError::field(
                &format!("gpus.{model}"),
                format!("at most {MAX_LIMIT}"),
            ));
        }
    }
    for (field, v) in [
        ("vcpus", q.vcpus),
        ("memory_gib", q.memory_gib),
        ("vms", q.vms),
        ("disk_gib", q.disk_gib),
        ("segments", q.segments),
        ("roce_segments", q.roce_segments),
        ("public_ips", q.public_ips),
        ("volume_gib", q.volume_gib),
        ("share_gib", q.share_gib),
    ] {
        if v > MAX_LIMIT {
            return Err(ApiError::field(field, format!("at most {MAX_LIMIT}")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(gpus: u32, model: Option<&str>) -> VmSpec {
        serde_json::from_value(serde_json::json!({
            "gpus": gpus, "gpu_model": model, "vcpus": 4, "memory_gib": 16,
            "disk_gib": 50, "service_level": "guaranteed", "ssh_keys": []
        }))
        .unwrap()
    }

    #[test]
    fn preempted_vms_count_but_hold_nothing() {
        let a = spec(8, Some("H100"));
        let b = spec(2, Some("H100"));
        let u = Usage::of([(VmState::Running, &a), (VmState::Preempted, &b)]);
        assert_eq!(u.vms, 2);
        assert_eq!(u.vcpus, 4);
        assert_eq!(u.gpus_total(), 8);
        // A preempted VM's disk is still there.
        assert_eq!(u.disk_gib, 100);
    }

    #[test]
    fn lost_vms_count_for_nothing() {
        let a = spec(8, Some("H100"));
        let u = Usage::of([(VmState::Lost, &a), (VmState::Running, &a)]);
        assert_eq!((u.vms, u.gpus.get("H100").copied()), (1, Some(8)));
        assert_eq!(u.disk_gib, u64::from(a.disk_gib));
    }

    #[test]
    fn disk_counts_against_the_quota() {
        let a = spec(0, None);
        let mut u = Usage::of([(VmState::Running, &a)]);
        let quota: Quota = serde_json::from_value(serde_json::json!({
            "vcpus": 100, "memory_gib": 100, "vms": 10, "disk_gib": 100
        }))
        .unwrap();
        u.add(&spec(0, None));
        assert!(u.check(&quota, "t").is_ok());
        u.add(&spec(0, None));
        match u.check(&quota, "t") {
            Err(ApiError::QuotaExceeded { resource, .. }) => assert_eq!(resource, "disk_gib"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_first_limit_passed_is_named() {
        let a = spec(8, Some("H100"));
        let mut u = Usage::of([(VmState::Running, &a)]);
        u.add(&spec(1, Some("H100")));
        let quota: Quota = serde_json::from_value(serde_json::json!({
            "gpus": {"H100": 8}, "vcpus": 100, "memory_gib": 100, "vms": 10, "disk_gib": 1000
        }))
        .unwrap();
        match u.check(&quota, "t") {
            Err(ApiError::QuotaExceeded { resource, .. }) => assert_eq!(resource, "gpus.H100"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn limits_are_bounded_and_models_named() {
        let mut q = Quota::default();
        q.gpus.insert("H100-SXM5-80GB".into(), 16);
        assert!(validate(&q).is_ok());
        q.vcpus = MAX_LIMIT + 1;
        assert!(validate(&q).is_err());
        let mut q = Quota::default();
        q.gpus.insert("bad model".into(), 1);
        assert!(validate(&q).is_err());
    }
}
