//! The leaf-VTEP RoCE fabric on a host: VFs pinned to their segment's
//! VLAN and MAC over netlink, port QoS through `dcb(8)`. What the NIC or
//! kernel cannot do is reported as [`Outcome::Unsupported`], never hidden.

use futures_util::stream::TryStreamExt;
use rtnetlink::packet_route::link::{
    LinkAttribute, LinkExtentMask, LinkMessage, LinkVfInfo, VfInfo, VfInfoMac, VfInfoSpoofCheck,
    VfInfoTrust, VfInfoVlan,
};
use rtnetlink::packet_route::AddressFamily;

use crate::kernel::{tool, Kernel};
use crate::roce::{
    dcb_commands, vf_changes, Outcome, PortReport, Qos, RoceFabric, VfConfig, VfState,
};
use crate::state::Mac;

/// `EOPNOTSUPP`, and `ENODEV`/`ENOENT` for a port that is not there.
fn unsupported(e: &rtnetlink::Error) -> bool {
    matches!(e, rtnetlink::Error::NetlinkError(m)
        if matches!(m.raw_code().abs(), 95 | 19 | 2))
}

pub struct LeafVlan<'a> {
    pub kernel: &'a Kernel,
    pub netns: Option<&'a str>,
}

impl LeafVlan<'_> {
    /// The PF's link message with its VF list.
    async fn pf(&self, netdev: &str) -> Result<Option<LinkMessage>, rtnetlink::Error> {
        let req = self
            .kernel
            .handle()
            .link()
            .get()
            .match_name(netdev.to_owned())
            .set_filter_mask(AddressFamily::Unspec, vec![LinkExtentMask::Vf]);
        match req.execute().try_next().await {
            Ok(m) => Ok(m),
            Err(e) if unsupported(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn configure_vf(&self, index: u32, v: &VfConfig) -> Result<(), rtnetlink::Error> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        m.attributes
            .push(LinkAttribute::VfInfoList(vec![LinkVfInfo(vec![
                VfInfo::Mac(VfInfoMac::new(v.vf, &v.mac.0)),
                VfInfo::Vlan(VfInfoVlan::new(v.vf, u32::from(v.vlan), 0)),
                VfInfo::SpoofCheck(VfInfoSpoofCheck::new(v.vf, true)),
                VfInfo::Trust(VfInfoTrust::new(v.vf, false)),
            ])]));
        self.kernel.handle().link().set(m).execute().await
    }

    async fn vfs_of(&self, port: &str, want: &[VfConfig]) -> Vec<(u32, Outcome)> {
        let mine: Vec<&VfConfig> = want.iter().filter(|v| v.pf == port).collect();
        if mine.is_empty() {
            return Vec::new();
        }
        let all = |o: Outcome| mine.iter().map(|v| (v.vf, o.clone())).collect();
        let pf = match self.pf(port).await {
            Ok(Some(m)) => m,
            Ok(None) => return all(Outcome::Unsupported(format!("no netdev {port} here"))),
            Err(e) => return all(Outcome::Failed(e.to_string())),
        };
        let have: Vec<(String, VfState)> = vf_states(&pf)
            .into_iter()
            .map(|s| (port.to_owned(), s))
            .collect();
        let owned: Vec<VfConfig> = mine.iter().map(|v| (*v).clone()).collect();
        let changes = vf_changes(&owned, &have);
        let mut out = Vec::new();
        for v in &owned {
            let outcome = if !changes.contains(v) {
                Outcome::Unchanged
            } else {
                match self.configure_vf(pf.header.index, v).await {
                    Ok(()) => Outcome::Applied,
                    Err(e) if unsupported(&e) => {
                        Outcome::Unsupported(format!("{port} has no VF {}: {e}", v.vf))
                    }
                    Err(e) => Outcome::Failed(e.to_string()),
                }
            };
            out.push((v.vf, outcome));
        }
        out
    }

    fn qos_of(&self, port: &str, qos: &Qos) -> Outcome {
        for cmd in dcb_commands(port, qos) {
            let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
            match tool(self.netns, "dcb", "iproute2", &args, None) {
                Ok((true, _, _)) => {}
                Ok((false, _, err))
                    if err.contains("not supported") || err.contains("No such device") =>
                {
                    return Outcome::Unsupported(format!("{port}: {err}"));
                }
                Ok((false, _, err)) => {
                    return Outcome::Failed(format!("dcb {}: {err}", cmd.join(" ")))
                }
                Err(e) => return Outcome::Failed(e.to_string()),
            }
        }
        Outcome::Applied
    }
}

/// The VFs' VLAN and MAC as the PF reports them.
fn vf_states(pf: &LinkMessage) -> Vec<VfState> {
    let mut out = Vec::new();
    for a in &pf.attributes {
        let LinkAttribute::VfInfoList(list) = a else {
            continue;
        };
        for LinkVfInfo(infos) in list {
            let mut vf = None;
            let (mut vlan, mut mac) = (0u16, Mac::ZERO);
            for i in infos {
                match i {
                    VfInfo::Mac(m) => {
                        vf = Some(m.vf_id);
                        let mut b = [0u8; 6];
                        b.copy_from_slice(&m.mac[..6]);
                        mac = Mac(b);
                    }
                    VfInfo::Vlan(v) => vlan = u16::try_from(v.vlan_id).unwrap_or(0),
                    _ => {}
                }
            }
            if let Some(vf) = vf {
                out.push(VfState { vf, vlan, mac });
            }
        }
    }
    out
}

impl RoceFabric for LeafVlan<'_> {
    async fn configure(&self, ports: &[String], vfs: &[VfConfig], qos: &Qos) -> Vec<PortReport> {
        let mut out = Vec::new();
        for port in ports {
            let vf_outcomes = self.vfs_of(port, vfs).await;
            out.push(PortReport {
                netdev: port.clone(),
                qos: self.qos_of(port, qos),
                vfs: vf_outcomes,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn vf_states_are_read_from_the_pf_vf_list() {
        let mac: Mac = "02:6b:00:00:00:07".parse().unwrap();
        let mut pf = LinkMessage::default();
        pf.attributes.push(LinkAttribute::VfInfoList(vec![
            LinkVfInfo(vec![
                VfInfo::Mac(VfInfoMac::new(0, &mac.0)),
                VfInfo::Vlan(VfInfoVlan::new(0, 100, 0)),
            ]),
            LinkVfInfo(vec![
                VfInfo::Mac(VfInfoMac::new(1, &[0; 6])),
                VfInfo::Vlan(VfInfoVlan::new(1, 0, 0)),
            ]),
        ]));
        let states = vf_states(&pf);
        assert_eq!(
            states,
            vec![
                VfState {
                    vf: 0,
                    vlan: 100,
                    mac
                },
                VfState {
                    vf: 1,
                    vlan: 0,
                    mac: Mac::ZERO
                },
            ]
        );
        // What the kernel reports is what the plan compares: VF 0 is in
        // place, VF 1 needs its VLAN and MAC.
        let want = vec![
            VfConfig {
                pf: "p0".into(),
                vf: 0,
                vlan: 100,
                mac,
            },
            VfConfig {
                pf: "p0".into(),
                vf: 1,
                vlan: 100,
                mac,
            },
        ];
        let have: Vec<(String, VfState)> = states.into_iter().map(|s| ("p0".into(), s)).collect();
        assert_eq!(vf_changes(&want, &have), vec![want[1].clone()]);
    }
}
