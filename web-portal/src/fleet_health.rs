//! The administrators' fleet-health page: passed-through devices by
//! state, the automatic quarantine limit, each device's state and why,
//! its AER totals and PCIe link, every RDMA port's RoCE congestion
//! counters, and the operator's forms (repair, validate, quarantine).
//! States and problems are words, never colour alone.

use askama::Template;

use crate::i18n::{t, word, Lang, Msg};
use crate::Viewer;

/// What the page shows, gathered by the server.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FleetHealth {
    /// Devices per state over the whole fleet, `(state, count)`, every
    /// state in order.
    pub counts: Vec<(String, u64)>,
    /// Quarantined, in repair or validating: what the automatic limit
    /// counts.
    pub out_of_service: u64,
    pub quarantine_cap: u64,
    /// The devices the filter matched, those needing attention first.
    pub devices: Vec<DeviceView>,
    /// How many the filter matched (more than `devices` when cut short).
    pub matched: usize,
    pub ports: Vec<PortView>,
    /// How many ports the devices have (more than `ports` when cut short).
    pub ports_matched: usize,
    /// The hosts to filter by.
    pub hosts: Vec<String>,
    /// The filter in force.
    pub host: Option<String>,
    pub state: Option<String>,
    /// Where the forms post (the page with its filter).
    pub action: String,
    pub notice: Option<String>,
    pub error: Option<String>,
}

/// One device as its host last reported it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceView {
    pub host: String,
    pub bdf: String,
    /// `gpu` or `nic`.
    pub kind: String,
    /// The API's word.
    pub state: String,
    pub reason: Option<String>,
    pub since: String,
    /// The VMs holding it, by name.
    pub vms: Vec<String>,
    /// `None` before the first reading.
    pub present: Option<bool>,
    /// Correctable, non-fatal, fatal.
    pub aer: Option<[u64; 3]>,
    pub link: Option<Link>,
    /// The operator's steps open to it (`repair`, `validate`,
    /// `quarantine`).
    pub actions: Vec<String>,
}

/// A PCIe link: widths in lanes, speeds in tenths of GT/s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Link {
    pub width: u32,
    pub max_width: u32,
    pub speed: u32,
    pub max_speed: u32,
}

/// One RDMA port's state and counters.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PortView {
    pub host: String,
    /// The NIC's PCI address.
    pub bdf: String,
    /// The RDMA device, e.g. `mlx5_0`.
    pub device: String,
    pub port: u32,
    pub state: String,
    pub carrier_changes: Option<u64>,
    pub ecn_marked: Option<u64>,
    pub cnp_sent: Option<u64>,
    pub cnp_handled: Option<u64>,
    pub out_of_sequence: Option<u64>,
}

/// A figure as a cell: a non-zero one worth a look is bold and
/// coloured, `warn` (congestion, correctable errors) or `bad` (errors).
struct Num {
    text: String,
    /// The highlight's class; empty for none.
    class: &'static str,
}

fn num(v: Option<u64>, class: &'static str) -> Num {
    match v {
        Some(n) => Num {
            text: n.to_string(),
            class: if n > 0 { class } else { "" },
        },
        None => Num {
            text: "-".into(),
            class: "",
        },
    }
}

fn fill(template: &str, pairs: &[(&str, &str)]) -> String {
    pairs.iter().fold(template.to_owned(), |s, (k, v)| {
        s.replace(&format!("{{{k}}}"), v)
    })
}

/// Tenths of GT/s as people write them: `16`, `2.5`.
fn gts(tenths: u32) -> String {
    if tenths % 10 == 0 {
        (tenths / 10).to_string()
    } else {
        format!("{}.{}", tenths / 10, tenths % 10)
    }
}

struct Row<'a> {
    d: &'a DeviceView,
    state_label: String,
    vms: String,
    since: String,
    /// Absent from the bus (`gone`), or no reading yet.
    presence: Option<String>,
    gone: bool,
    aer: Vec<Num>,
    width: Option<String>,
    narrowed: bool,
    speed: Option<String>,
    /// `(action, label)`.
    actions: Vec<(&'a str, &'static str)>,
}

struct Group<'a> {
    title: String,
    rows: Vec<Row<'a>>,
}

struct PortRow<'a> {
    p: &'a PortView,
    active: bool,
    counters: [Num; 5],
}

struct Labels {
    summary: &'static str,
    state: &'static str,
    devices: &'static str,
    warning: &'static str,
    limit_reached: &'static str,
    host: &'static str,
    any: &'static str,
    filter: &'static str,
    devices_title: &'static str,
    all_healthy: &'static str,
    no_devices: &'static str,
    pci: &'static str,
    kind: &'static str,
    since: &'static str,
    why: &'static str,
    held_by: &'static str,
    aer: &'static str,
    link: &'static str,
    actions: &'static str,
    reason: &'static str,
    roce: &'static str,
    roce_help: &'static str,
    no_ports: &'static str,
    rdma_port: &'static str,
    port_state: &'static str,
    ecn: &'static str,
    cnp_sent: &'static str,
    cnp_handled: &'static str,
    out_of_sequence: &'static str,
    carrier: &'static str,
}

#[derive(Template)]
#[template(path = "devices.html")]
struct Page<'a> {
    heading: &'static str,
    l: Labels,
    v: &'a FleetHealth,
    csrf: &'a str,
    /// `(word, label, count)`.
    counts: Vec<(&'a str, String, u64)>,
    limit: String,
    limit_reached: bool,
    /// `(value, selected)`.
    hosts: Vec<(&'a str, bool)>,
    /// `(word, label, selected)`.
    states: Vec<(&'a str, String, bool)>,
    groups: Vec<Group<'a>>,
    attention: usize,
    cut: Option<String>,
    ports: Vec<PortRow<'a>>,
    ports_cut: Option<String>,
}

fn row<'a>(lang: Lang, d: &'a DeviceView) -> Row<'a> {
    let presence = match d.present {
        Some(false) => Some(t(lang, Msg::NotOnBus).to_owned()),
        None => Some(t(lang, Msg::NotRead).to_owned()),
        Some(true) => None,
    };
    let narrowed = d
        .link
        .is_some_and(|k| k.max_width > 0 && k.width < k.max_width);
    let width = d.link.map(|k| {
        if narrowed {
            fill(
                t(lang, Msg::LinkNarrowed),
                &[
                    ("now", &k.width.to_string()),
                    ("max", &k.max_width.to_string()),
                ],
            )
        } else {
            format!("x{}", k.width)
        }
    });
    let speed = d.link.map(|k| {
        if k.max_speed > k.speed {
            fill(
                t(lang, Msg::SpeedOf),
                &[("now", &gts(k.speed)), ("max", &gts(k.max_speed))],
            )
        } else {
            format!("{} GT/s", gts(k.speed))
        }
    });
    Row {
        state_label: word(lang, &d.state),
        vms: d.vms.join(", "),
        since: d.since.clone(),
        presence,
        gone: d.present == Some(false),
        aer: d
            .aer
            .map(|[c, nf, f]| {
                vec![
                    num(Some(c), "warn"),
                    num(Some(nf), "bad"),
                    num(Some(f), "bad"),
                ]
            })
            .unwrap_or_default(),
        width,
        narrowed,
        speed,
        actions: d
            .actions
            .iter()
            .filter_map(|a| {
                let label = match a.as_str() {
                    "repair" => t(lang, Msg::SendToRepair),
                    "validate" => t(lang, Msg::ValidateRepaired),
                    "quarantine" => t(lang, Msg::QuarantineIt),
                    _ => return None,
                };
                Some((a.as_str(), label))
            })
            .collect(),
        d,
    }
}

/// The fleet-health page.
pub fn fleet_health_page(lang: Lang, viewer: &Viewer, v: &FleetHealth) -> String {
    let tx = |m| t(lang, m);
    let (attention, healthy): (Vec<&DeviceView>, Vec<&DeviceView>) =
        v.devices.iter().partition(|d| d.state != "healthy");
    let mut groups = Vec::new();
    let n_attention = attention.len();
    if !attention.is_empty() {
        groups.push(Group {
            title: format!("{} ({})", tx(Msg::NeedAttention), attention.len()),
            rows: attention.into_iter().map(|d| row(lang, d)).collect(),
        });
    }
    if !healthy.is_empty() {
        groups.push(Group {
            title: format!("{} ({})", tx(Msg::HealthyDevices), healthy.len()),
            rows: healthy.into_iter().map(|d| row(lang, d)).collect(),
        });
    }
    let cut = |shown: usize, total: usize| {
        (shown < total).then(|| {
            fill(
                tx(Msg::ShowingFirst),
                &[("shown", &shown.to_string()), ("total", &total.to_string())],
            )
        })
    };
    let mut hosts: Vec<(&str, bool)> = v
        .hosts
        .iter()
        .map(|h| (h.as_str(), v.host.as_deref() == Some(h.as_str())))
        .collect();
    if let Some(h) = v
        .host
        .as_deref()
        .filter(|h| !v.hosts.iter().any(|x| x == h))
    {
        hosts.push((h, true));
    }
    let body = Page {
        heading: tx(Msg::FleetHealth),
        l: Labels {
            summary: tx(Msg::Summary),
            state: tx(Msg::State),
            devices: tx(Msg::Devices),
            warning: tx(Msg::Warning),
            limit_reached: tx(Msg::LimitReached),
            host: tx(Msg::Host),
            any: tx(Msg::Any),
            filter: tx(Msg::Filter),
            devices_title: tx(Msg::DevicesTitle),
            all_healthy: tx(Msg::AllHealthy),
            no_devices: tx(Msg::NoDevices),
            pci: tx(Msg::PciAddress),
            kind: tx(Msg::Kind),
            since: tx(Msg::Since),
            why: tx(Msg::Why),
            held_by: tx(Msg::HeldBy),
            aer: tx(Msg::AerErrors),
            link: tx(Msg::PcieLink),
            actions: tx(Msg::Actions),
            reason: tx(Msg::ReasonOptional),
            roce: tx(Msg::RoceCongestion),
            roce_help: tx(Msg::RoceHelp),
            no_ports: tx(Msg::NoPorts),
            rdma_port: tx(Msg::RdmaPort),
            port_state: tx(Msg::PortState),
            ecn: tx(Msg::EcnMarked),
            cnp_sent: tx(Msg::CnpSent),
            cnp_handled: tx(Msg::CnpHandled),
            out_of_sequence: tx(Msg::OutOfSequence),
            carrier: tx(Msg::CarrierChanges),
        },
        v,
        csrf: &viewer.csrf,
        counts: v
            .counts
            .iter()
            .map(|(s, n)| (s.as_str(), word(lang, s), *n))
            .collect(),
        limit: fill(
            tx(Msg::QuarantineLimit),
            &[
                ("cap", &v.quarantine_cap.to_string()),
                ("out", &v.out_of_service.to_string()),
            ],
        ),
        limit_reached: v.quarantine_cap > 0 && v.out_of_service >= v.quarantine_cap,
        hosts,
        states: v
            .counts
            .iter()
            .map(|(s, _)| {
                (
                    s.as_str(),
                    word(lang, s),
                    v.state.as_deref() == Some(s.as_str()),
                )
            })
            .collect(),
        groups,
        attention: n_attention,
        cut: cut(v.devices.len(), v.matched),
        ports: v
            .ports
            .iter()
            .map(|p| PortRow {
                p,
                active: p.state == "ACTIVE",
                counters: [
                    num(p.ecn_marked, "warn"),
                    num(p.cnp_sent, "warn"),
                    num(p.cnp_handled, "warn"),
                    num(p.out_of_sequence, "bad"),
                    // Links come up at boot: a count is no finding by itself.
                    num(p.carrier_changes, ""),
                ],
            })
            .collect(),
        ports_cut: cut(v.ports.len(), v.ports_matched),
    }
    .render()
    .unwrap_or_else(|e| format!("template error: {e}"));
    crate::page(lang, tx(Msg::FleetHealth), Some(viewer), None, &body)
}

/// Announces an operator's step: the device's state now, if the page
/// lists it.
pub fn done_notice(lang: Lang, device: &str, state: Option<&str>) -> String {
    match state {
        Some(s) => fill(
            t(lang, Msg::DeviceNow),
            &[("device", device), ("state", &word(lang, s))],
        ),
        None => fill(t(lang, Msg::DeviceDone), &[("device", device)]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn viewer() -> Viewer {
        Viewer {
            display_name: "Admin".into(),
            csrf: "tok".into(),
            is_admin: true,
        }
    }

    fn gpu(bdf: &str, state: &str) -> DeviceView {
        DeviceView {
            host: "gpu-001".into(),
            bdf: bdf.into(),
            kind: "gpu".into(),
            state: state.into(),
            reason: None,
            since: "2030-01-01 00:00".into(),
            vms: vec![],
            present: Some(true),
            aer: Some([0, 0, 0]),
            link: Some(Link {
                width: 16,
                max_width: 16,
                speed: 320,
                max_speed: 320,
            }),
            actions: vec!["quarantine".into()],
        }
    }

    fn fleet(devices: Vec<DeviceView>, out: u64, cap: u64) -> FleetHealth {
        FleetHealth {
            counts: [
                "healthy",
                "suspect",
                "quarantined",
                "repairing",
                "validating",
            ]
            .iter()
            .map(|s| (s.to_string(), 1))
            .collect(),
            out_of_service: out,
            quarantine_cap: cap,
            matched: devices.len(),
            devices,
            hosts: vec!["gpu-001".into()],
            action: "/admin/devices".into(),
            ..Default::default()
        }
    }

    #[test]
    fn broken_devices_come_first_with_their_problems_in_words() {
        let mut bad = gpu("0000:18:00.0", "quarantined");
        bad.reason = Some("fatal <AER> error".into());
        bad.aer = Some([0, 0, 1]);
        bad.vms = vec!["train".into()];
        bad.actions = vec!["repair".into(), "validate".into()];
        let mut narrow = gpu("0000:19:00.0", "suspect");
        narrow.link = Some(Link {
            width: 8,
            max_width: 16,
            speed: 25,
            max_speed: 320,
        });
        let v = fleet(vec![bad, narrow, gpu("0000:17:00.0", "healthy")], 1, 2);
        let html = fleet_health_page(Lang::En, &viewer(), &v);
        let quarantined = html.find("0000:18:00.0").unwrap();
        let healthy = html.find("0000:17:00.0").unwrap();
        assert!(quarantined < healthy, "{html}");
        assert!(
            html.contains("fatal &#60;AER&#62; error"),
            "escaped: {html}"
        );
        assert!(html.contains(r#"<strong class="bad">1</strong>"#), "{html}");
        assert!(
            html.contains(r#"<strong class="bad">x8 of x16</strong>"#),
            "{html}"
        );
        assert!(html.contains("2.5 of 32 GT/s"), "{html}");
        assert!(html.contains(r#"data-state="quarantined">quarantined</span>"#));
        assert!(html.contains(r#"name="action" value="repair">Send to repair</button>"#));
        assert!(html.contains("<td>train</td>"), "{html}");
        assert!(html.contains(r#"name="csrf" value="tok""#));
        assert!(html.contains("Needing attention (2)") && html.contains("Healthy (1)"));
        assert!(!html.contains("limit is reached"), "1 of 2");
        let full = fleet_health_page(Lang::Ja, &viewer(), &fleet(vec![], 2, 2));
        assert!(full.contains("自動隔離の上限に達しています"), "{full}");
        assert!(full.contains("role=\"alert\""));
        assert!(full.contains("まだデバイスの報告がありません"));
    }

    #[test]
    fn ports_show_their_congestion_and_state() {
        let mut v = fleet(vec![gpu("0000:17:00.0", "healthy")], 0, 2);
        v.ports = vec![PortView {
            host: "gpu-001".into(),
            bdf: "0000:1a:00.0".into(),
            device: "mlx5_0".into(),
            port: 1,
            state: "DOWN".into(),
            carrier_changes: Some(4),
            ecn_marked: Some(0),
            cnp_sent: Some(77),
            cnp_handled: None,
            out_of_sequence: Some(0),
        }];
        v.ports_matched = 3;
        let html = fleet_health_page(Lang::En, &viewer(), &v);
        assert!(html.contains("mlx5_0/1"), "{html}");
        assert!(
            html.contains(r#"<strong class="bad">DOWN</strong>"#),
            "{html}"
        );
        assert!(html.contains(r#"<strong class="warn">77</strong>"#));
        assert!(
            html.contains(r#"<td class="num">4</td>"#),
            "carrier changes: {html}"
        );
        assert!(html.contains("Showing the first 1 of 3"));
    }
}
