//! NVSwitch partitions (pure): NVIDIA Fabric Manager's shared NVSwitch
//! virtualization model, as its user guide and its `fmpm` client
//! (NVIDIA/Fabric-Manager-Client) describe it.
//!
//! On an NVSwitch baseboard a VM's GPUs talk over NVLink only when Fabric
//! Manager has activated a partition holding exactly those GPUs. It
//! supports a fixed table of partitions; `fmpm -l` lists them as JSON:
//!
//! ```text
//! {"maxNumPartitions": 31, "numPartitions": 15, "version": …,
//!  "partitionInfo": [{"partitionId": 0, "isActive": 0, "numGpus": 8,
//!    "gpuInfo": [{"physicalId": 1, "pciBusId": "00000000:00:00.0",
//!                 "uuid": "", "numNvLinksAvailable": 18,
//!                 "maxNumNvLinks": 18, "nvlinkLineRateMBps": 26562}, …]}, …]}
//! ```
//!
//! On H100 and later the PCI bus id and UUID are empty: a GPU is known by
//! its physical id, the baseboard's module id (1–8), which the host maps
//! to its PCI address ([`module_order`], or the operator's own map).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::{Bdf, FabricManager, HostTopology, Partition};

/// The default partitions of an 8-GPU HGX H100/H200 baseboard (Fabric
/// Manager user guide, "GPU Partitions"), by partition id, as physical
/// (module) ids: all eight, two halves, four pairs (1+3, 2+4, 5+7, 6+8,
/// as the guide has them since its October 2023 revision), eight singles.
pub fn hgx_8gpu_table() -> Vec<(u32, Vec<u32>)> {
    let mut t = vec![
        (0, (1..=8).collect()),
        (1, (1..=4).collect()),
        (2, (5..=8).collect()),
        (3, vec![1, 3]),
        (4, vec![2, 4]),
        (5, vec![5, 7]),
        (6, vec![6, 8]),
    ];
    t.extend((1..=8).map(|m| (6 + m, vec![m])));
    t
}

/// The host's GPUs by module id, module 1 first: PCI address order, the
/// order an HGX baseboard's modules take on the platforms Kumo knows.
/// Where a platform numbers them otherwise the agent is told the map.
pub fn module_order(topo: &HostTopology) -> Vec<Bdf> {
    let mut gpus: Vec<Bdf> = topo.gpus.iter().map(|g| g.location.bdf).collect();
    gpus.sort();
    gpus
}

/// The default partitions of this host's baseboard, by PCI address: the
/// 8-GPU HGX table over [`module_order`] for a host with eight GPUs and
/// NVSwitches, else `None`. (For HGX A100 the guide documents only the
/// 16-GPU table; an 8-GPU baseboard's entries of it have the same shape.)
pub fn default_partitions(topo: &HostTopology) -> Option<Vec<Partition>> {
    let modules = module_order(topo);
    if topo.nvswitches.is_empty() || modules.len() != 8 {
        return None;
    }
    Some(
        hgx_8gpu_table()
            .into_iter()
            .map(|(id, ms)| Partition {
                id,
                gpus: ms.iter().map(|m| modules[*m as usize - 1]).collect(),
            })
            .collect(),
    )
}

/// `fmpm -l`'s JSON, as far as Kumo reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FmList {
    #[serde(default)]
    pub partition_info: Vec<FmPartition>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FmPartition {
    pub partition_id: u32,
    pub is_active: u32,
    #[serde(default)]
    pub num_gpus: u32,
    #[serde(default)]
    pub gpu_info: Vec<FmGpu>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FmGpu {
    pub physical_id: u32,
    #[serde(default)]
    pub pci_bus_id: String,
    #[serde(default)]
    pub uuid: String,
    #[serde(default)]
    pub num_nv_links_available: u32,
    #[serde(default)]
    pub max_num_nv_links: u32,
    #[serde(default)]
    pub nvlink_line_rate_m_bps: u32,
}

/// `00000000:07:00.0` (Fabric Manager's 32-bit domain) → a PCI address;
/// `None` for the all-zero address H100 and later report.
fn fm_bus_id(s: &str) -> Option<Bdf> {
    let (domain, rest) = s.split_once(':')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let bdf: Bdf = format!("{:04x}:{rest}", u16::try_from(domain).ok()?)
        .parse()
        .ok()?;
    (bdf != Bdf::new(0, 0, 0, 0)).then_some(bdf)
}

/// The supported partitions and which are active, from `fmpm -l`'s
/// output, each GPU by its PCI address (reported, or its module id through
/// `modules`). A partition naming a GPU this host does not have is an
/// error: placements on it could not be made true.
pub fn parse_list(json: &str, modules: &[Bdf]) -> Result<Vec<(Partition, bool)>, String> {
    let list: FmList = serde_json::from_str(json)
        .map_err(|e| format!("fmpm -l printed no partition list: {e}"))?;
    if list.partition_info.len() > 64 {
        return Err(format!(
            "fmpm -l listed {} partitions; Fabric Manager supports at most 64",
            list.partition_info.len()
        ));
    }
    list.partition_info
        .iter()
        .map(|p| {
            let gpus = p
                .gpu_info
                .iter()
                .map(|g| {
                    fm_bus_id(&g.pci_bus_id)
                        .or_else(|| {
                            let i = usize::try_from(g.physical_id).ok()?.checked_sub(1)?;
                            modules.get(i).copied()
                        })
                        .ok_or_else(|| {
                            format!(
                                "partition {} names GPU module {}, which this host does not have",
                                p.partition_id, g.physical_id
                            )
                        })
                })
                .collect::<Result<Vec<Bdf>, String>>()?;
            Ok((
                Partition {
                    id: p.partition_id,
                    gpus,
                },
                p.is_active != 0,
            ))
        })
        .collect()
}

/// The partition that is exactly these GPUs, if any.
pub fn partition_of<'a>(partitions: &'a [Partition], gpus: &[Bdf]) -> Option<&'a Partition> {
    let want: BTreeSet<&Bdf> = gpus.iter().collect();
    partitions
        .iter()
        .find(|p| p.gpus.len() == want.len() && p.gpus.iter().all(|g| want.contains(g)))
}

/// Whether a VM on these GPUs has NVLink between them: always on a host
/// without Fabric Manager (NVLinks as discovered), on a partitioned host
/// only when its GPUs are one partition (which the agent activates before
/// the VM starts), never while Fabric Manager does not answer.
pub fn nvlinks_hold(topo: &HostTopology, gpus: &[Bdf]) -> bool {
    match &topo.fabric_manager {
        None => true,
        Some(FabricManager::Partitions(ps)) => partition_of(ps, gpus).is_some(),
        Some(FabricManager::Unreachable(_)) => false,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn modules() -> Vec<Bdf> {
        [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb]
            .iter()
            .map(|b| Bdf::new(0, *b, 0, 0))
            .collect()
    }

    #[test]
    fn the_h100_table_has_fifteen_partitions_covering_each_gpu_four_times() {
        let t = hgx_8gpu_table();
        assert_eq!(t.len(), 15);
        assert_eq!(t[3], (3, vec![1, 3]), "pairs as the guide has them");
        for m in 1..=8 {
            assert_eq!(t.iter().filter(|(_, g)| g.contains(&m)).count(), 4);
        }
    }

    #[test]
    fn an_h100_list_maps_module_ids_and_an_a100_list_its_bus_ids() {
        // As fmpm prints it (jsoncpp, keys sorted), two partitions.
        let json = r#"{
   "maxNumPartitions" : 31,
   "numPartitions" : 2,
   "partitionInfo" : [
      {
         "gpuInfo" : [
            { "maxNumNvLinks" : 18, "numNvLinksAvailable" : 18, "nvlinkLineRateMBps" : 26562,
              "pciBusId" : "00000000:00:00.0", "physicalId" : 1, "uuid" : "" },
            { "maxNumNvLinks" : 18, "numNvLinksAvailable" : 18, "nvlinkLineRateMBps" : 26562,
              "pciBusId" : "00000000:00:00.0", "physicalId" : 3, "uuid" : "" }
         ],
         "isActive" : 1,
         "numGpus" : 2,
         "partitionId" : 3
      },
      {
         "gpuInfo" : [
            { "maxNumNvLinks" : 12, "numNvLinksAvailable" : 12, "nvlinkLineRateMBps" : 25781,
              "pciBusId" : "00000000:07:00.0", "physicalId" : 9, "uuid" : "GPU-1" }
         ],
         "isActive" : 0,
         "numGpus" : 1,
         "partitionId" : 19
      }
   ],
   "version" : 16777240
}"#;
        let got = parse_list(json, &modules()).unwrap();
        assert_eq!(
            got[0],
            (
                Partition {
                    id: 3,
                    gpus: vec![modules()[0], modules()[2]]
                },
                true
            )
        );
        assert_eq!(got[1].0.gpus, vec![Bdf::new(0, 7, 0, 0)]);
        assert!(!got[1].1);
        // A module this host does not have, and garbage: errors, in words.
        let bad = json.replace("\"physicalId\" : 3", "\"physicalId\" : 12");
        assert!(parse_list(&bad, &modules())
            .unwrap_err()
            .contains("module 12"));
        assert!(parse_list("Failed to connect", &modules()).is_err());
    }

    #[test]
    fn only_a_partition_holds_nvlinks() {
        let m = modules();
        let parts: Vec<Partition> = hgx_8gpu_table()
            .into_iter()
            .map(|(id, g)| Partition {
                id,
                gpus: g.iter().map(|x| m[*x as usize - 1]).collect(),
            })
            .collect();
        let mut topo = HostTopology {
            fabric_manager: Some(FabricManager::Partitions(parts.clone())),
            ..HostTopology::default()
        };
        assert_eq!(partition_of(&parts, &[m[2], m[0]]).map(|p| p.id), Some(3));
        assert!(nvlinks_hold(&topo, &[m[0], m[2]]));
        assert!(!nvlinks_hold(&topo, &[m[0], m[1]]), "1+2 is no partition");
        topo.fabric_manager = Some(FabricManager::Unreachable("down".into()));
        assert!(!nvlinks_hold(&topo, &[m[0], m[2]]));
        topo.fabric_manager = None;
        assert!(nvlinks_hold(&topo, &[m[0], m[1]]));
    }
}
