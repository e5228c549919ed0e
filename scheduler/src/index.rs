//! The capacity index: every host with what is free on it (GPUs, NICs,
//! CPUs per NUMA node, memory per node) and the VMs holding the rest.
//! Its owner keeps it in step with the database; nothing here does IO.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use kumo_topology::guest_layout::{PlacedNic, Placement};
use kumo_topology::{Bdf, HostTopology};
use uuid::Uuid;

use crate::profile::{bits, mask_of, HostProfile, ProfileError};

/// Whether a host takes new VMs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostUse {
    Ready,
    /// No new placements; its spot VMs are being reclaimed.
    Draining,
    /// Silent, retired or otherwise out of service.
    Unavailable,
}

/// A VM's share of a host, as bit positions of the host's profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub vm: Uuid,
    pub tenant: Uuid,
    pub spot: bool,
    /// A guaranteed VM above its tenant's guaranteed share: reclaimable
    /// for a tenant within its own share (see [`crate::reclaim::Lenders`]).
    pub borrowed: bool,
    /// Already being reclaimed (preempting): its capacity is spoken for.
    pub reclaiming: bool,
    /// When it started holding, in seconds (for the run time a
    /// preemption loses).
    pub since: i64,
    /// The VM has no GPUs: it is suspended rather than shut down.
    pub cpu_only: bool,
    pub gpus: u64,
    pub nics: u64,
    /// `(node index, CPU positions within the node)`.
    pub cpus: Vec<(usize, Vec<usize>)>,
    /// `(node index, MiB)`.
    pub memory: Vec<(usize, u64)>,
    /// Its root disk, provisioned GiB, on the host's storage.
    pub disk_gib: u64,
}

/// What the scheduler is told of a host.
pub struct HostInput {
    pub id: Uuid,
    pub name: String,
    pub scalable_unit: Option<String>,
    pub state: HostUse,
    /// The host's revision when this was read: the capacity version the
    /// database checks at commit.
    pub revision: i64,
    pub profile: Arc<HostProfile>,
    /// The host has a VXLAN tunnel endpoint: it can take VMs with networks.
    pub networked: bool,
    /// The host mounts the shared filesystem of project shares (without a
    /// problem): it can take VMs with shares.
    pub shares: bool,
    /// Its GPUs and NICs (physical functions) out of service (quarantined,
    /// in repair): they take no new VMs, and a VM leaving one does not
    /// free it.
    pub blocked: Vec<Bdf>,
    /// GiB left for root disks on its storage before its VMs' own (see
    /// [`crate::disk`]): what its volumes, snapshots and the disks of VMs
    /// holding nothing (shelved, suspended, moving) leave of what it may
    /// provision. `None`: its agent does not say (not counted).
    pub disk_free_gib: Option<i64>,
}

/// A VM as the database knows it, to be turned into a [`Hold`].
pub struct VmInput<'a> {
    pub vm: Uuid,
    pub tenant: Uuid,
    pub spot: bool,
    pub borrowed: bool,
    pub reclaiming: bool,
    pub since: i64,
    pub placement: &'a Placement,
    /// Its root disk, GiB (0 where [`HostInput::disk_free_gib`] counts it
    /// already).
    pub disk_gib: u64,
}

#[derive(Debug, Clone)]
pub struct HostCap {
    pub id: Uuid,
    pub name: String,
    pub scalable_unit: Option<u32>,
    pub state: HostUse,
    pub revision: i64,
    pub profile: Arc<HostProfile>,
    pub networked: bool,
    pub shares: bool,
    pub gpu_free: u64,
    pub nic_free: u64,
    /// Out of service: never free (see [`HostInput::blocked`]).
    pub gpu_blocked: u64,
    pub nic_blocked: u64,
    /// Per node, a bit per CPU position.
    pub cpu_free: Vec<Vec<u64>>,
    pub cpu_free_n: Vec<u32>,
    pub mem_free: Vec<u64>,
    pub cpus_free_total: u32,
    pub mem_free_total: u64,
    /// GiB of root disk it may still take (negative: over); `None`: not
    /// counted.
    pub disk_free: Option<i64>,
    pub holds: Vec<Hold>,
    /// The reservation holding the whole host: only its VMs may start here
    /// ([`Index::set_reserved`]).
    pub reserved_for: Option<Uuid>,
}

impl HostCap {
    fn new(h: HostInput, su: Option<u32>) -> HostCap {
        let p = h.profile;
        let cpu_free: Vec<Vec<u64>> = p
            .nodes
            .iter()
            .map(|n| {
                let words = n.cpus.len().div_ceil(64);
                (0..words)
                    .map(|w| mask_of(n.cpus.len().saturating_sub(w * 64)))
                    .collect()
            })
            .collect();
        let cpu_free_n: Vec<u32> = p.nodes.iter().map(|n| n.cpus.len() as u32).collect();
        let mem_free: Vec<u64> = p.nodes.iter().map(|n| n.memory_mib).collect();
        let mask = |i: Option<usize>| i.map_or(0, |i| 1u64 << i);
        let gpu_blocked = h.blocked.iter().fold(0, |m, b| m | mask(p.gpu_index(b)));
        let nic_blocked = h.blocked.iter().fold(0, |m, b| m | mask(p.nic_index(b)));
        HostCap {
            id: h.id,
            name: h.name,
            scalable_unit: su,
            state: h.state,
            revision: h.revision,
            networked: h.networked,
            shares: h.shares,
            gpu_free: p.all_gpus() & !gpu_blocked,
            nic_free: mask_of(p.nics.len()) & !nic_blocked,
            gpu_blocked,
            nic_blocked,
            cpus_free_total: cpu_free_n.iter().sum(),
            mem_free_total: mem_free.iter().sum(),
            cpu_free,
            cpu_free_n,
            mem_free,
            disk_free: h.disk_free_gib,
            profile: p,
            holds: Vec::new(),
            reserved_for: None,
        }
    }

    pub fn is_cpu_free(&self, node: usize, pos: usize) -> bool {
        self.cpu_free[node]
            .get(pos / 64)
            .is_some_and(|w| w & (1 << (pos % 64)) != 0)
    }

    /// Marks a hold's share as used (`take`) or free again.
    fn account(&mut self, h: &Hold, take: bool) {
        let disk = i64::try_from(h.disk_gib).unwrap_or(i64::MAX);
        if take {
            self.gpu_free &= !h.gpus;
            self.nic_free &= !h.nics;
            self.disk_free = self.disk_free.map(|f| f.saturating_sub(disk));
        } else {
            self.gpu_free |= h.gpus & !self.gpu_blocked;
            self.nic_free |= h.nics & !self.nic_blocked;
            self.disk_free = self.disk_free.map(|f| f.saturating_add(disk));
        }
        for (node, positions) in &h.cpus {
            for p in positions {
                let Some(word) = self.cpu_free[*node].get_mut(p / 64) else {
                    continue;
                };
                let bit = 1u64 << (p % 64);
                let was_free = *word & bit != 0;
                if take && was_free {
                    *word &= !bit;
                    self.cpu_free_n[*node] -= 1;
                    self.cpus_free_total -= 1;
                } else if !take && !was_free {
                    *word |= bit;
                    self.cpu_free_n[*node] += 1;
                    self.cpus_free_total += 1;
                }
            }
        }
        for (node, mib) in &h.memory {
            if take {
                let m = (*mib).min(self.mem_free[*node]);
                self.mem_free[*node] -= m;
                self.mem_free_total -= m;
            } else {
                let cap = self.profile.nodes[*node].memory_mib;
                let m = (*mib).min(cap - self.mem_free[*node]);
                self.mem_free[*node] += m;
                self.mem_free_total += m;
            }
        }
    }

    /// Whether the hold's NUMA nodes are this host's (a host whose
    /// topology changed under a reservation does not take it).
    fn fits_nodes(&self, h: &Hold) -> bool {
        h.cpus.iter().all(|(n, _)| *n < self.cpu_free.len())
            && h.memory.iter().all(|(n, _)| *n < self.mem_free.len())
    }

    /// Frees a VM's share; returns what it held.
    pub fn release(&mut self, vm: Uuid) -> Option<Hold> {
        let i = self.holds.iter().position(|x| x.vm == vm)?;
        let hold = self.holds.swap_remove(i);
        self.account(&hold, false);
        Some(hold)
    }

    /// The hold as the `Placement` the agents and the API use: each NIC it
    /// holds passed through as its RoCE VF, never as the physical function
    /// (holds take NICs only for RoCE VMs, and only NICs with a VF).
    pub fn placement(&self, h: &Hold) -> Placement {
        let p = &self.profile;
        let gpus: Vec<_> = bits(h.gpus).map(|i| p.gpus[i].bdf).collect();
        let nics = bits(h.nics)
            .filter_map(|j| {
                Some(PlacedNic {
                    host_bdf: p.nics[j].roce_vf?,
                    pf: Some(p.nics[j].bdf),
                    rdma_device: p.nics[j].rdma_device.clone(),
                    for_gpus: bits(h.gpus)
                        .filter(|i| p.gpus[*i].nic == Some(j))
                        .map(|i| p.gpus[i].bdf)
                        .collect(),
                })
            })
            .collect();
        let cpus: BTreeMap<u32, Vec<u32>> = h
            .cpus
            .iter()
            .map(|(n, pos)| {
                let node = &p.nodes[*n];
                (node.id, pos.iter().map(|i| node.cpus[*i]).collect())
            })
            .collect();
        let memory_mib = h.memory.iter().map(|(n, m)| (p.nodes[*n].id, *m)).collect();
        Placement {
            gpus,
            nics,
            cpus,
            memory_mib,
        }
    }

    /// A stored placement as a hold. Devices this host does not have (its
    /// inventory changed) are left out: what no longer exists holds nothing.
    pub fn hold_of(&self, v: &VmInput) -> Hold {
        let p = &self.profile;
        let gpus = v
            .placement
            .gpus
            .iter()
            .filter_map(|b| p.gpu_index(b))
            .fold(0u64, |m, i| m | (1 << i));
        let nics = v
            .placement
            .nics
            .iter()
            .filter_map(|n| p.nic_index(&n.physical()))
            .fold(0u64, |m, i| m | (1 << i));
        let mut cpus: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for c in v.placement.cpus.values().flatten() {
            if let Some((node, pos)) = p.cpu_position(*c) {
                cpus.entry(node).or_default().push(pos);
            }
        }
        let memory = v
            .placement
            .memory_mib
            .iter()
            .filter_map(|(id, m)| p.nodes.iter().position(|n| n.id == *id).map(|i| (i, *m)))
            .collect();
        Hold {
            vm: v.vm,
            tenant: v.tenant,
            spot: v.spot,
            borrowed: v.borrowed,
            reclaiming: v.reclaiming,
            since: v.since,
            cpu_only: v.placement.gpus.is_empty(),
            gpus,
            nics,
            cpus: cpus.into_iter().collect(),
            memory,
            disk_gib: v.disk_gib,
        }
    }

    /// Whether a root disk of `gib` fits on the host's storage (nothing
    /// always does: a disk that is there already).
    pub fn disk_fits(&self, gib: u64) -> bool {
        gib == 0
            || self
                .disk_free
                .is_none_or(|f| i64::try_from(gib).is_ok_and(|g| g <= f))
    }
}

/// Where best fit looks: a GPU model's free count on a host, under the
/// whole fleet (`None`) and under the host's scalable unit.
pub type ShapeKey = (Option<u32>, u16, u32);

/// Every host's capacity. Host positions are stable until a host is
/// removed.
#[derive(Debug, Clone, Default)]
pub struct Index {
    pub hosts: Vec<HostCap>,
    by_id: HashMap<Uuid, usize>,
    models: Vec<String>,
    units: Vec<String>,
    /// Host positions by how many GPUs of a model they have free (those
    /// with none are not filed), fleet-wide and per scalable unit: best
    /// fit reads the hosts that would be left fullest first without
    /// walking the fleet. Kept by every change below.
    shapes: HashMap<ShapeKey, BTreeSet<usize>>,
    /// Training clusters' spare capacity, kept free of other guaranteed
    /// VMs ([`crate::spares`]).
    pub spares: Vec<crate::Spare>,
    /// Holds reserved and not yet committed, by host: a reading of the
    /// host taken before their commit does not show them, and must not
    /// give their room to the next request.
    in_flight: HashMap<Uuid, Vec<Hold>>,
    /// Hosts held by reservations: host → reservation.
    reserved: HashMap<Uuid, Uuid>,
}

impl Index {
    pub fn new() -> Index {
        Index::default()
    }

    /// The id of a GPU model, interning it.
    pub fn intern(&mut self, model: &str) -> u16 {
        match self.models.iter().position(|m| m == model) {
            Some(i) => i as u16,
            None => {
                self.models.push(model.to_owned());
                (self.models.len() - 1) as u16
            }
        }
    }

    /// GPUs per model on hosts not unavailable, less those out of service:
    /// what guaranteed shares may promise.
    pub fn gpus_in_service(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for h in self
            .hosts
            .iter()
            .filter(|h| h.state != HostUse::Unavailable)
        {
            for (m, mask) in &h.profile.model_masks {
                if let Some(name) = self.model_name(*m) {
                    *out.entry(name.to_owned()).or_default() +=
                        u64::from((mask & !h.gpu_blocked).count_ones());
                }
            }
        }
        out
    }

    pub fn model_id(&self, model: &str) -> Option<u16> {
        self.models
            .iter()
            .position(|m| m == model)
            .map(|i| i as u16)
    }

    pub fn model_name(&self, id: u16) -> Option<&str> {
        self.models.get(id as usize).map(String::as_str)
    }

    pub fn unit_id(&self, name: &str) -> Option<u32> {
        self.units.iter().position(|u| u == name).map(|i| i as u32)
    }

    pub fn unit_name(&self, id: u32) -> Option<&str> {
        self.units.get(id as usize).map(String::as_str)
    }

    pub fn profile(
        &mut self,
        topo: &HostTopology,
        rails: &BTreeMap<String, u32>,
    ) -> Result<Arc<HostProfile>, ProfileError> {
        let mut models = std::mem::take(&mut self.models);
        let p = HostProfile::new(topo, rails, |m| match models.iter().position(|x| x == m) {
            Some(i) => i as u16,
            None => {
                models.push(m.to_owned());
                (models.len() - 1) as u16
            }
        });
        self.models = models;
        Ok(Arc::new(p?))
    }

    /// The keys host `i` is filed under now.
    fn shape_keys(&self, i: usize) -> Vec<ShapeKey> {
        let Some(h) = self.hosts.get(i) else {
            return Vec::new();
        };
        let mut keys = Vec::new();
        for (m, mask) in &h.profile.model_masks {
            let free = (h.gpu_free & mask).count_ones();
            if free > 0 {
                keys.push((None, *m, free));
                if h.scalable_unit.is_some() {
                    keys.push((h.scalable_unit, *m, free));
                }
            }
        }
        keys
    }

    fn file(&mut self, i: usize) {
        for k in self.shape_keys(i) {
            self.shapes.entry(k).or_default().insert(i);
        }
    }

    fn unfile(&mut self, i: usize) {
        for k in self.shape_keys(i) {
            if let Some(set) = self.shapes.get_mut(&k) {
                set.remove(&i);
                if set.is_empty() {
                    self.shapes.remove(&k);
                }
            }
        }
    }

    /// Host positions with exactly `free` GPUs of `model` free, in
    /// position order: fleet-wide, or within one scalable unit.
    pub fn with_free(
        &self,
        unit: Option<u32>,
        model: u16,
        free: u32,
    ) -> impl Iterator<Item = usize> + '_ {
        self.shapes
            .get(&(unit, model, free))
            .into_iter()
            .flatten()
            .copied()
    }

    /// Every interned model id.
    pub fn model_ids(&self) -> impl Iterator<Item = u16> {
        0..self.models.len() as u16
    }

    pub fn position(&self, id: Uuid) -> Option<usize> {
        self.by_id.get(&id).copied()
    }

    pub fn host(&self, id: Uuid) -> Option<&HostCap> {
        self.position(id).map(|i| &self.hosts[i])
    }

    /// Replaces what the index knows of a host with a fresh reading, and
    /// says whether it did. A reading older than the revision held is
    /// dropped: it was taken before a commit this index has settled since
    /// (a refresh racing an admission), and would give the commit's room
    /// away. Holds in flight on the host stay taken.
    pub fn upsert(&mut self, h: HostInput, vms: &[VmInput]) -> bool {
        if self
            .host(h.id)
            .is_some_and(|known| known.revision > h.revision)
        {
            return false;
        }
        let su = h
            .scalable_unit
            .as_deref()
            .map(|s| match self.units.iter().position(|u| u == s) {
                Some(i) => i as u32,
                None => {
                    self.units.push(s.to_owned());
                    (self.units.len() - 1) as u32
                }
            });
        let mut cap = HostCap::new(h, su);
        cap.reserved_for = self.reserved.get(&cap.id).copied();
        for v in vms {
            let hold = cap.hold_of(v);
            cap.account(&hold, true);
            cap.holds.push(hold);
        }
        for hold in self.in_flight.get(&cap.id).into_iter().flatten() {
            let shown = cap.holds.iter().any(|x| x.vm == hold.vm);
            if !shown && cap.fits_nodes(hold) {
                cap.account(hold, true);
                cap.holds.push(hold.clone());
            }
        }
        let i = match self.by_id.get(&cap.id).copied() {
            Some(i) => {
                self.unfile(i);
                self.hosts[i] = cap;
                i
            }
            None => {
                self.by_id.insert(cap.id, self.hosts.len());
                self.hosts.push(cap);
                self.hosts.len() - 1
            }
        };
        self.file(i);
        true
    }

    /// Which hosts reservations hold (host → reservation), replacing what
    /// was held before: a reserved host takes only its reservation's VMs,
    /// and its reservation's VMs go only to its hosts.
    pub fn set_reserved(&mut self, reserved: HashMap<Uuid, Uuid>) {
        for h in &mut self.hosts {
            h.reserved_for = reserved.get(&h.id).copied();
        }
        self.reserved = reserved;
    }

    /// The hosts reservations hold: host → reservation.
    pub fn reserved(&self) -> &HashMap<Uuid, Uuid> {
        &self.reserved
    }

    /// Keeps `vm`'s hold on `host` (applied already) against readings
    /// that predate its commit, until [`Index::landed`].
    pub fn in_flight(&mut self, host: usize, vm: Uuid) {
        let Some(h) = self.hosts.get(host) else {
            return;
        };
        if let Some(hold) = h.holds.iter().find(|x| x.vm == vm) {
            self.in_flight.entry(h.id).or_default().push(hold.clone());
        }
    }

    /// `vm`'s reservation is committed or given up: readings decide its
    /// hold from now on.
    pub fn landed(&mut self, vm: Uuid) {
        self.in_flight.retain(|_, holds| {
            holds.retain(|x| x.vm != vm);
            !holds.is_empty()
        });
    }

    pub fn remove(&mut self, id: Uuid) {
        if let Some(i) = self.by_id.remove(&id) {
            let last = self.hosts.len() - 1;
            self.unfile(i);
            if i != last {
                self.unfile(last);
            }
            self.hosts.swap_remove(i);
            if let Some(moved) = self.hosts.get(i) {
                self.by_id.insert(moved.id, i);
                self.file(i);
            }
        }
    }

    pub fn set_state(&mut self, id: Uuid, state: HostUse) {
        if let Some(i) = self.position(id) {
            self.hosts[i].state = state;
        }
    }

    pub fn set_revision(&mut self, host: usize, revision: i64) {
        if let Some(h) = self.hosts.get_mut(host) {
            h.revision = revision;
        }
    }

    /// Takes a hold's share on a host.
    pub fn apply(&mut self, host: usize, hold: Hold) {
        self.unfile(host);
        if let Some(h) = self.hosts.get_mut(host) {
            h.account(&hold, true);
            h.holds.push(hold);
        }
        self.file(host);
    }

    /// Frees a VM's share; returns what it held.
    pub fn release(&mut self, host: usize, vm: Uuid) -> Option<Hold> {
        self.unfile(host);
        let out = self.hosts.get_mut(host).and_then(|h| h.release(vm));
        self.file(host);
        out
    }

    /// Whether every device, CPU and MiB of `hold` is free on the host
    /// (a suspended VM resumes only on exactly what it had; its disk
    /// never left).
    pub fn is_free(&self, host: usize, hold: &Hold) -> bool {
        let Some(h) = self.hosts.get(host) else {
            return false;
        };
        h.state == HostUse::Ready
            && h.gpu_free & hold.gpus == hold.gpus
            && h.nic_free & hold.nics == hold.nics
            && hold
                .cpus
                .iter()
                .all(|(n, pos)| pos.iter().all(|p| h.is_cpu_free(*n, *p)))
            && hold
                .memory
                .iter()
                .all(|(n, m)| h.profile.nodes[*n].memory_mib == 0 || h.mem_free[*n] >= *m)
    }

    /// Where a VM is held, by host position.
    pub fn find_vm(&self, vm: Uuid) -> Option<usize> {
        self.hosts
            .iter()
            .position(|h| h.holds.iter().any(|x| x.vm == vm))
    }

    pub fn mark_reclaiming(&mut self, host: usize, vm: Uuid) {
        if let Some(h) = self.hosts.get_mut(host) {
            for x in h.holds.iter_mut().filter(|x| x.vm == vm) {
                x.reclaiming = true;
            }
        }
    }

    /// GPUs free in the whole index, and in all.
    pub fn gpu_totals(&self) -> (u32, u32) {
        self.hosts.iter().fold((0, 0), |(f, t), h| {
            (f + h.gpu_free.count_ones(), t + h.profile.gpus.len() as u32)
        })
    }

    /// Free GPUs on hosts that are partly used: a whole-host (all-GPU) VM
    /// cannot use them. The fragmentation that best-fit packing keeps low.
    pub fn stranded_gpus(&self) -> u32 {
        self.hosts
            .iter()
            .filter(|h| h.gpu_free != h.profile.all_gpus())
            .map(|h| h.gpu_free.count_ones())
            .sum()
    }

    /// Hosts with every GPU free.
    pub fn whole_free_hosts(&self) -> u32 {
        self.hosts
            .iter()
            .filter(|h| !h.profile.gpus.is_empty() && h.gpu_free == h.profile.all_gpus())
            .count() as u32
    }
}
