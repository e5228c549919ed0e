//! RoCE segments on a host. A VM's RoCE NICs are SR-IOV VFs of the NICs
//! paired with its GPUs, passed through whole, so the host's software
//! VXLAN never sees their traffic: the segment must be carried by the
//! fabric. Two ways exist, behind one interface ([`RoceFabric`]):
//!
//! - **Leaf VTEP (built):** each VF is pinned to the segment's VLAN (and
//!   its MAC, with spoof checking on and trust off, so the guest can change
//!   neither); the leaf switch maps that VLAN to the segment's VNI. Works
//!   with any SR-IOV NIC and an EVPN leaf; nothing runs on the host's data
//!   path. The VLAN space (4094) bounds the number of RoCE segments.
//! - **OVS hardware offload (possible):** the NIC's eSwitch in switchdev
//!   mode, VF representors in an OVS bridge with VXLAN flows offloaded to
//!   the NIC; no switch configuration, but OVS and switchdev on every
//!   host. A second implementation of [`RoceFabric`] would plan the flows.
//!
//! Either way the port needs lossless Ethernet for RoCE: [`Qos`] is the
//! plan (trust DSCP, RoCE on DSCP 26 / priority 3 with PFC there, CNPs on
//! DSCP 48 / priority 6), applied through DCB where the NIC has it and
//! reported where it does not.

use serde::{Deserialize, Serialize};

use crate::state::Mac;

/// One VF as a VM on a RoCE segment needs it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct VfConfig {
    /// The physical function's netdev (`ens25np0`).
    pub pf: String,
    /// The VF's index on it (`virtfnN`).
    pub vf: u32,
    pub vlan: u16,
    pub mac: Mac,
}

/// What the kernel reports of a VF.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VfState {
    pub vf: u32,
    pub vlan: u16,
    pub mac: Mac,
}

/// Lossless RoCE on a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Qos {
    pub roce_dscp: u8,
    pub roce_priority: u8,
    pub cnp_dscp: u8,
    pub cnp_priority: u8,
}

/// The vendors' defaults (RoCE on 26/3 with PFC, CNP on 48).
pub const LOSSLESS: Qos = Qos {
    roce_dscp: 26,
    roce_priority: 3,
    cnp_dscp: 48,
    cnp_priority: 6,
};

impl Qos {
    /// The IP traffic class a RoCE sender puts on its packets (what
    /// `NCCL_IB_TC` takes): the RoCE DSCP in its upper six bits, ECN bits
    /// clear (the NIC marks ECN itself).
    pub fn roce_traffic_class(&self) -> u8 {
        self.roce_dscp << 2
    }
}

/// The `dcb(8)` invocations that apply `qos` to a port: PFC on the RoCE
/// priority only, and DSCP → priority entries (mlx5 switches a port to
/// trust DSCP with its first DSCP entry). `replace` makes them idempotent.
pub fn dcb_commands(netdev: &str, qos: &Qos) -> Vec<Vec<String>> {
    let s = |v: &str| v.to_owned();
    vec![
        vec![
            s("pfc"),
            s("set"),
            s("dev"),
            s(netdev),
            s("prio-pfc"),
            s("all:off"),
            format!("{}:on", qos.roce_priority),
        ],
        vec![
            s("app"),
            s("replace"),
            s("dev"),
            s(netdev),
            s("dscp-prio"),
            format!("{}:{}", qos.roce_dscp, qos.roce_priority),
            format!("{}:{}", qos.cnp_dscp, qos.cnp_priority),
        ],
    ]
}

/// The VFs whose kernel state differs from what is wanted (the rest are
/// left alone, so a second pass changes nothing).
pub fn vf_changes(want: &[VfConfig], have: &[(String, VfState)]) -> Vec<VfConfig> {
    want.iter()
        .filter(|w| {
            !have
                .iter()
                .any(|(pf, s)| *pf == w.pf && s.vf == w.vf && s.vlan == w.vlan && s.mac == w.mac)
        })
        .cloned()
        .collect()
}

/// How one step went on this host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", content = "detail", rename_all = "snake_case")]
pub enum Outcome {
    Applied,
    Unchanged,
    /// The NIC or kernel cannot do it (no DCB, no SR-IOV): reported, not retried harder.
    Unsupported(String),
    Failed(String),
}

/// A port's report: its QoS and its VFs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortReport {
    pub netdev: String,
    pub qos: Outcome,
    pub vfs: Vec<(u32, Outcome)>,
}

/// How RoCE segments reach the fabric from this host's NICs.
#[allow(async_fn_in_trait)]
pub trait RoceFabric {
    /// Configures the ports' VFs for their segments and the ports' QoS.
    async fn configure(&self, ports: &[String], vfs: &[VfConfig], qos: &Qos) -> Vec<PortReport>;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_lossless_plan_as_dcb_commands() {
        // DSCP 26 (AF31) is traffic class 104 (0x68), as NVIDIA's RoCE
        // guides configure it.
        assert_eq!(LOSSLESS.roce_traffic_class(), 104);
        let c = dcb_commands("ens25np0", &LOSSLESS);
        assert_eq!(c[0].join(" "), "pfc set dev ens25np0 prio-pfc all:off 3:on");
        assert_eq!(
            c[1].join(" "),
            "app replace dev ens25np0 dscp-prio 26:3 48:6"
        );
    }

    #[test]
    fn only_differing_vfs_are_changed() {
        let mac: Mac = "02:6b:00:00:00:01".parse().unwrap();
        let want = vec![
            VfConfig {
                pf: "p0".into(),
                vf: 0,
                vlan: 100,
                mac,
            },
            VfConfig {
                pf: "p1".into(),
                vf: 0,
                vlan: 100,
                mac,
            },
        ];
        let have = vec![
            (
                "p0".to_owned(),
                VfState {
                    vf: 0,
                    vlan: 100,
                    mac,
                },
            ),
            (
                "p1".to_owned(),
                VfState {
                    vf: 0,
                    vlan: 7,
                    mac,
                },
            ),
        ];
        assert_eq!(vf_changes(&want, &have), vec![want[1].clone()]);
        assert!(vf_changes(&want[..1], &have).is_empty());
    }
}
