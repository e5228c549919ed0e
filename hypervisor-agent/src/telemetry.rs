//! GPU telemetry from inside the guests: a passed-through GPU is its
//! guest's, so the host asks each running GPU VM's guest agent to run
//! `nvidia-smi` (figures) and `dmesg` (XIDs), maps the guest's PCI
//! addresses back to the host's through the VM's layout, and reports what
//! it read. A guest without its agent or `nvidia-smi` reads as unknown,
//! with why, never as idle.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use kumo_api_types::{DesiredVm, GpuReading, Power, TelemetryReport, VmTelemetry, XidReading};
use kumo_topology::gpu_telemetry::{
    nvidia_smi_args, parse_query, parse_xids, to_host, xids_to_host,
};
use kumo_topology::guest_layout::guest_layout;
use kumo_topology::HostTopology;
use uuid::Uuid;
use virt::connect::Connect;

use crate::guest_files::exec;

/// How long a guest's `nvidia-smi` may take (it is slow when the driver
/// wakes idle GPUs).
const SMI_WAIT: Duration = Duration::from_secs(10);
const DMESG_WAIT: Duration = Duration::from_secs(5);
/// XIDs remembered per VM, so the kernel log (read whole each time) tells
/// each once.
const SEEN_PER_VM: usize = 1024;

/// The server takes at most this many XIDs per VM and report.
const MAX_XIDS_PER_REPORT: usize = 64;

type XidKey = (String, u32, Option<u64>);

pub struct Telemetry {
    uri: String,
    topology: HostTopology,
    conn: Mutex<Option<Connect>>,
    seen: Mutex<BTreeMap<Uuid, BTreeSet<XidKey>>>,
}

/// The first line of a program's words, bounded.
fn first_line(b: &[u8]) -> String {
    String::from_utf8_lossy(b)
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
        .chars()
        .take(200)
        .collect()
}

impl Telemetry {
    pub fn new(uri: &str, topology: HostTopology) -> Telemetry {
        Telemetry {
            uri: uri.to_owned(),
            topology,
            conn: Mutex::new(None),
            seen: Mutex::default(),
        }
    }

    /// Reads every running GPU VM of `vms` once. Blocks (guest-exec waits).
    pub fn read(&self, vms: &[DesiredVm]) -> TelemetryReport {
        let gpu_vms: Vec<&DesiredVm> = vms
            .iter()
            .filter(|v| v.power == Power::Running && !v.placement.gpus.is_empty())
            .collect();
        {
            let keep: BTreeSet<Uuid> = gpu_vms.iter().map(|v| v.id).collect();
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            seen.retain(|id, _| keep.contains(id));
        }
        let mut conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        if conn.as_ref().is_none_or(|c| !c.is_alive().unwrap_or(false)) {
            *conn = Connect::open(Some(&self.uri)).ok();
        }
        let Some(c) = conn.as_ref() else {
            return TelemetryReport::default();
        };
        let vms = gpu_vms
            .into_iter()
            .filter_map(|v| {
                let dom = c.lookup_domain_by_uuid_string(&v.id.to_string()).ok()?;
                dom.is_active().ok().filter(|a| *a)?;
                Some(self.read_vm(v, &dom))
            })
            .collect();
        TelemetryReport { vms }
    }

    fn read_vm(&self, v: &DesiredVm, dom: &virt::domain::Domain) -> VmTelemetry {
        let mut out = VmTelemetry {
            vm: v.id,
            ..Default::default()
        };
        let layout = match guest_layout(&self.topology, &v.placement) {
            Ok(l) => l,
            Err(e) => {
                out.unknown = Some(format!("the VM's layout: {e}"));
                return out;
            }
        };
        let gpus = &v.placement.gpus;
        match exec(dom, "nvidia-smi", &nvidia_smi_args(), SMI_WAIT) {
            Err(e) => out.unknown = Some(format!("no answer from the guest agent: {e}")),
            Ok(done) if done.code != Some(0) => {
                let said = first_line(&done.stderr);
                let said = if said.is_empty() {
                    first_line(&done.stdout)
                } else {
                    said
                };
                out.unknown = Some(format!(
                    "nvidia-smi in the guest exited with {}: {said}",
                    done.code.map_or("no code".into(), |c| c.to_string())
                ));
            }
            Ok(done) => match parse_query(&String::from_utf8_lossy(&done.stdout)) {
                Ok(samples) => {
                    out.gpus = to_host(&layout, gpus, samples)
                        .into_iter()
                        .map(|(bdf, sample)| GpuReading {
                            host_bdf: bdf.to_string(),
                            sample,
                        })
                        .collect();
                    if out.gpus.is_empty() {
                        out.unknown =
                            Some("nvidia-smi in the guest lists none of the VM's GPUs".into());
                    }
                }
                Err(e) => out.unknown = Some(format!("nvidia-smi's output: {e}")),
            },
        }
        // The kernel log may be unreadable (restricted dmesg, no agent):
        // then there are no XIDs to tell, which is not a finding.
        if let Ok(done) = exec(dom, "dmesg", &[], DMESG_WAIT) {
            let xids = xids_to_host(
                &layout,
                gpus,
                parse_xids(&String::from_utf8_lossy(&done.stdout)),
            );
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            let seen = seen.entry(v.id).or_default();
            for (bdf, x) in xids {
                let key = (bdf.to_string(), x.code, x.since_boot_us);
                // What does not fit in this report goes in the next.
                if out.xids.len() < MAX_XIDS_PER_REPORT
                    && seen.len() < SEEN_PER_VM
                    && seen.insert(key)
                {
                    out.xids.push(XidReading {
                        host_bdf: bdf.to_string(),
                        code: x.code,
                    });
                }
            }
        }
        out
    }
}
