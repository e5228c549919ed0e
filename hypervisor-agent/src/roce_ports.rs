//! What this host's RoCE ports should be (pure): every Ethernet RDMA port
//! with VFs gets the lossless QoS plan, and every VF a VM on a RoCE
//! segment was given gets the segment's VLAN and the NIC's MAC.

use kumo_api_types::{DesiredState, SegmentKind};
use kumo_topology::{Bdf, HostTopology};
use vxlan_manager::roce::VfConfig;

/// `(ports, VFs)`; a VF the topology does not know is left out (and
/// logged by the caller): the server placed it from the same topology.
pub fn wanted(topo: &HostTopology, desired: &DesiredState) -> (Vec<String>, Vec<VfConfig>) {
    let ports: Vec<String> = topo
        .nics
        .iter()
        .filter(|n| n.roce_vf().is_some())
        .filter_map(|n| n.netdev.clone())
        .collect();
    let mut vfs = Vec::new();
    for vm in &desired.vms {
        for nic in vm.nics.iter().filter(|n| n.kind == SegmentKind::Roce) {
            let (Some(vf), Some(vlan), Ok(mac)) = (
                nic.vf.as_deref().and_then(|v| v.parse::<Bdf>().ok()),
                nic.vlan,
                nic.mac.parse(),
            ) else {
                continue;
            };
            let Some((pf, index)) = topo
                .nics
                .iter()
                .find_map(|n| Some((n.netdev.clone()?, n.vf_index(vf)?)))
            else {
                continue;
            };
            vfs.push(VfConfig {
                pf,
                vf: index,
                vlan,
                mac,
            });
        }
    }
    vfs.sort();
    (ports, vfs)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use kumo_api_types::DesiredNic;

    #[test]
    fn roce_ports_get_qos_and_vms_vfs_their_vlan() {
        let dir = tempfile::tempdir().unwrap();
        let m = kumo_topology::fixtures::machine("hgx-h100-roce").unwrap();
        kumo_topology::fixtures::write(&m, dir.path()).unwrap();
        let topo = kumo_topology::sysfs::discover(dir.path(), None).unwrap();
        let vf = topo.nics[2].vfs[0];
        let nic = |kind, vf: Option<String>| DesiredNic {
            segment: "fast".into(),
            kind,
            vni: 5000,
            mac: "02:6b:00:00:00:07".into(),
            address: "10.2.0.7/24".into(),
            gateway: "10.2.0.1".into(),
            mtu: 8950,
            vlan: Some(100),
            vf,
        };
        let mut vm = crate::reconcile::tests::vm();
        vm.nics = vec![
            nic(SegmentKind::Ethernet, None),
            nic(SegmentKind::Roce, Some(vf.to_string())),
            // A VF this host does not have: left out.
            nic(SegmentKind::Roce, Some("0000:77:00.2".into())),
        ];
        let desired = DesiredState {
            revision: 1,
            vms: vec![vm],
            remove: vec![],
            shelve: vec![],
            network: None,
            volumes: vec![],
            delete_volumes: vec![],
            exports: vec![],
            imports: vec![],
            drop_disks: vec![],
            consoles: vec![],
            shares: vec![],
            delete_shares: vec![],
        };
        let (ports, vfs) = wanted(&topo, &desired);
        assert_eq!(ports.len(), 8, "every Ethernet port with VFs");
        assert_eq!(vfs.len(), 1);
        assert_eq!(
            (vfs[0].pf.as_str(), vfs[0].vf, vfs[0].vlan),
            (topo.nics[2].netdev.as_deref().unwrap(), 0, 100)
        );
        assert_eq!(vfs[0].mac.to_string(), "02:6b:00:00:00:07");
        // An InfiniBand host has no RoCE ports.
        let ib = kumo_topology::fixtures::machine("hgx-h100").unwrap();
        let dir = tempfile::tempdir().unwrap();
        kumo_topology::fixtures::write(&ib, dir.path()).unwrap();
        let ib = kumo_topology::sysfs::discover(dir.path(), None).unwrap();
        assert!(wanted(&ib, &desired).0.is_empty());
    }
}
