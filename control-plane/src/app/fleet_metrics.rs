//! The fleet's series for Prometheus (`GET /metrics/fleet`, administrators'
//! tokens): per host its state and GPUs; per passed-through device its
//! health state, AER totals and link; per RDMA port its state, carrier
//! changes and RoCE congestion counters; per GPU in use the guest's last
//! figures; idle GPU VMs fleet-wide. Labels are hosts, device addresses and
//! fixed words only (no tenant, VM or user names): the series are
//! bounded by the fleet's size, about 10 per device.
//!
//! `/metrics` (the server's own requests and pool) stays open to scrapers
//! as usual; these name the fleet's machines and their faults, so they
//! need an administrator's token (docs/src/operator/monitoring.md).

use std::collections::BTreeMap;

use kumo_api_types::{HostState, PageParams};
use kumo_topology::health::{DeviceSignals, PortSignals};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use std::sync::atomic::AtomicU64;

use crate::app::access::require_admin;
use crate::context::{Actor, AppState};
use crate::entity::{gpu_minutes, vms};
use crate::error::ApiError;

type Labels = Vec<(String, String)>;
type Floats = Family<Labels, Gauge<f64, AtomicU64>>;

/// A reading as device health stores it.
#[derive(serde::Deserialize)]
struct Reading {
    device: DeviceSignals,
    #[serde(default)]
    ports: Vec<PortSignals>,
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Every series, with its help text (names without the `kumo_` prefix).
/// The Grafana dashboard in `ops/grafana/` uses only these (a test checks).
pub const SERIES: &[(&str, &str)] = &[
    ("host_state", "1 for the host's state, 0 for the others"),
    ("host_gpus", "GPUs the host has"),
    ("host_gpus_free", "GPUs free for new VMs"),
    (
        "host_gpus_out_of_service",
        "GPUs quarantined or under repair",
    ),
    (
        "device_state",
        "1 for the device's health state, 0 for the others",
    ),
    ("device_present", "1 while the device is on the bus"),
    ("device_aer_errors", "PCIe AER errors since the host booted"),
    (
        "device_link_width_ratio",
        "The PCIe link's width over its maximum (1: full)",
    ),
    (
        "device_link_speed_ratio",
        "The PCIe link's speed over its maximum (1: full)",
    ),
    ("rdma_port_active", "1 while the RDMA port is ACTIVE"),
    (
        "rdma_port_carrier_changes",
        "Carrier changes of the port's netdev since boot",
    ),
    (
        "rdma_port_congestion",
        "RoCE congestion counters (hw_counters) since boot",
    ),
    (
        "gpu_utilization_percent",
        "GPU utilisation reported by the guest (last minute's mean)",
    ),
    (
        "gpu_memory_used_mib",
        "GPU memory in use reported by the guest",
    ),
    (
        "gpu_temperature_celsius",
        "GPU temperature reported by the guest",
    ),
    ("gpu_power_watts", "GPU board power reported by the guest"),
    (
        "idle_gpu_vms",
        "Running GPU VMs whose projects were told they are idle",
    ),
];

struct Series {
    registry: Registry,
    families: BTreeMap<&'static str, Floats>,
}

impl Series {
    fn new() -> Series {
        Series {
            registry: Registry::with_prefix("kumo"),
            families: BTreeMap::new(),
        }
    }

    fn set(&mut self, name: &'static str, l: Labels, v: f64) {
        let family = self.families.entry(name).or_insert_with(|| {
            let f = Floats::default();
            let help = SERIES
                .iter()
                .find(|(n, _)| *n == name)
                .map_or("", |(_, h)| h);
            self.registry.register(name, help, f.clone());
            f
        });
        family.get_or_create(&l).set(v);
    }
}

/// The exposition text.
pub async fn render(st: &AppState, actor: &Actor) -> Result<String, ApiError> {
    require_admin(&actor.caller, "reading the fleet's metrics")?;
    let mut s = Series::new();
    // Hosts, every page of them.
    let mut token = None;
    let mut names = BTreeMap::new();
    loop {
        let page = crate::app::fleet::list(
            st,
            actor,
            &PageParams {
                limit: Some(500),
                page_token: token,
            },
        )
        .await?;
        for h in &page.items {
            names.insert(h.id, h.name.clone());
            for state in HostState::ALL {
                s.set(
                    "host_state",
                    labels(&[("host", &h.name), ("state", state.as_str())]),
                    f64::from(u8::from(h.state == state)),
                );
            }
            let host = labels(&[("host", &h.name)]);
            s.set("host_gpus", host.clone(), f64::from(h.gpus));
            s.set("host_gpus_free", host.clone(), f64::from(h.gpus_free));
            s.set(
                "host_gpus_out_of_service",
                host,
                f64::from(h.gpus_out_of_service),
            );
        }
        match page.next_page_token {
            Some(t) => token = Some(t),
            None => break,
        }
    }
    // Devices: health state, AER totals, link, RDMA ports.
    for d in crate::store::device_health::list(&st.db, None, None).await? {
        let Some(host) = names.get(&d.host_id) else {
            continue;
        };
        let dev = labels(&[("host", host), ("bdf", &d.bdf), ("kind", &d.kind)]);
        let with = |k: &str, v: &str| {
            let mut l = dev.clone();
            l.push((k.to_owned(), v.to_owned()));
            l
        };
        for state in kumo_api_types::DeviceState::ALL {
            s.set(
                "device_state",
                with("state", state.as_str()),
                f64::from(u8::from(d.state == state.as_str())),
            );
        }
        let Some(r) = d
            .signals
            .as_deref()
            .and_then(|j| serde_json::from_str::<Reading>(j).ok())
        else {
            continue;
        };
        s.set(
            "device_present",
            dev.clone(),
            f64::from(u8::from(r.device.present)),
        );
        if let Some(a) = r.device.aer {
            for (severity, n) in [
                ("correctable", a.correctable),
                ("nonfatal", a.nonfatal),
                ("fatal", a.fatal),
            ] {
                s.set("device_aer_errors", with("severity", severity), n as f64);
            }
        }
        if let Some(l) = r.device.link {
            s.set(
                "device_link_width_ratio",
                dev.clone(),
                f64::from(l.width) / f64::from(l.max_width.max(1)),
            );
            s.set(
                "device_link_speed_ratio",
                dev.clone(),
                f64::from(l.speed) / f64::from(l.max_speed.max(1)),
            );
        }
        for p in &r.ports {
            let port_no = p.port.to_string();
            let port = labels(&[("host", host), ("device", &p.device), ("port", &port_no)]);
            s.set(
                "rdma_port_active",
                port.clone(),
                f64::from(u8::from(p.state == "ACTIVE")),
            );
            if let Some(c) = p.carrier_changes {
                s.set("rdma_port_carrier_changes", port.clone(), c as f64);
            }
            for (counter, n) in &p.counters {
                let mut l = port.clone();
                l.push(("counter".into(), counter.clone()));
                s.set("rdma_port_congestion", l, *n as f64);
            }
        }
    }
    // GPUs in use: the guests' figures of the last complete minutes.
    let since = crate::domain::gpu_telemetry::minute_of(st.config.clock.now())
        - chrono::Duration::minutes(3);
    let rows = gpu_minutes::Entity::find()
        .filter(gpu_minutes::Column::Minute.gte(since))
        .all(&st.db)
        .await?;
    let vm_ids: Vec<_> = rows.iter().map(|r| r.vm_id).collect();
    let hosts_of: BTreeMap<_, _> = vms::Entity::find()
        .filter(vms::Column::Id.is_in(vm_ids))
        .all(&st.db)
        .await?
        .into_iter()
        .filter_map(|v| v.host_id.map(|h| (v.id, h)))
        .collect();
    let mut latest: BTreeMap<(uuid::Uuid, String), &gpu_minutes::Model> = BTreeMap::new();
    for r in &rows {
        let e = latest.entry((r.vm_id, r.host_bdf.clone())).or_insert(r);
        if r.minute > e.minute {
            *e = r;
        }
    }
    for ((vm, bdf), r) in latest {
        let Some(host) = hosts_of.get(&vm).and_then(|h| names.get(h)) else {
            continue;
        };
        let gpu = labels(&[("host", host), ("bdf", &bdf)]);
        if let (Some(sum), n) = (r.util_sum, r.util_n) {
            if n > 0 {
                s.set("gpu_utilization_percent", gpu.clone(), sum / f64::from(n));
            }
        }
        if let Some(m) = r.mem_used_max {
            s.set("gpu_memory_used_mib", gpu.clone(), m as f64);
        }
        if let Some(t) = r.temp_max {
            s.set("gpu_temperature_celsius", gpu.clone(), t);
        }
        if let (Some(p), n) = (r.power_sum, r.power_n) {
            if n > 0 {
                s.set("gpu_power_watts", gpu, p / f64::from(n));
            }
        }
    }
    let idle = crate::store::idle_gpus::noticed(&st.db).await?;
    s.set("idle_gpu_vms", Vec::new(), idle as f64);
    let mut out = String::new();
    encode(&mut out, &s.registry)
        .map_err(|e| ApiError::Internal(format!("encoding metrics: {e}")))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::SERIES;

    /// The operators' dashboard asks only for series that exist.
    #[test]
    fn the_grafana_dashboard_uses_only_our_series() {
        let text = include_str!("../../../ops/grafana/kumo-fleet.json");
        let board: serde_json::Value = serde_json::from_str(text).expect("valid JSON");
        let panels = board["panels"].as_array().expect("panels");
        assert!(panels.len() >= 8);
        let mut used = std::collections::BTreeSet::new();
        for p in panels {
            for t in p["targets"].as_array().into_iter().flatten() {
                let expr = t["expr"].as_str().expect("a PromQL expression");
                let names: Vec<&str> = expr
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .filter_map(|w| w.strip_prefix("kumo_"))
                    .collect();
                assert!(!names.is_empty(), "{expr}");
                for n in names {
                    assert!(
                        SERIES.iter().any(|(s, _)| *s == n)
                            || n.starts_with("http_request")
                            || n.starts_with("db_pool"),
                        "{n} in {expr}"
                    );
                    used.insert(n.to_owned());
                }
            }
        }
        for (n, _) in SERIES {
            assert!(used.contains(*n), "{n} is on no panel");
        }
    }
}
