//! Device health end to end: a real agent reads a fixture host's sysfs,
//! which the test edits (AER counters, PCIe link width, a vanished NIC),
//! and reports it on its heartbeat; the server quarantines, suspects and
//! clears devices, keeps placements off the broken ones, tells and
//! reclaims the VMs on them, stops at the automatic quarantine limit, and
//! takes operators' repair and validation. The server's clock is the
//! test's, so "clean for a while" takes no waiting.

use std::path::{Path, PathBuf};

use kumo_agent::run::Agent;
use kumo_api_types::{
    Device, DeviceList, DeviceState, ServiceLevel, Vm, VmCreate, VmMetrics, VmState,
};
use kumo_server::clock::Clock;
use serde_json::json;

use crate::harness::{events_of, on_both_backends, scratch, TestServer};

fn t0() -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp(1_900_000_000, 0).unwrap()
}

/// A VM of `gpus` GPUs, 4 vCPUs, 8 GiB memory and 10 GiB disk.
pub(crate) fn vm(name: &str, gpus: u32, level: ServiceLevel) -> VmCreate {
    VmCreate {
        name: name.into(),
        gpus,
        gpu_model: None,
        vcpus: Some(4),
        memory_gib: Some(8),
        disk_gib: Some(10),
        template: None,
        service_level: level,
        ssh_keys: Vec::new(),
        networks: Vec::new(),
        volumes: Vec::new(),
        on_reclaim: None,
        on_host_loss: None,
        notice_seconds: None,
        shares: Vec::new(),
        public_ip: false,
        queue: false,
        reservation: None,
    }
}

/// A real agent `gpu-001` on an HGX H100 fixture under `dir` (its sysfs
/// root returned, for the test to edit).
pub(crate) async fn hgx_agent(s: &TestServer, dir: &Path) -> (Agent, PathBuf) {
    let sysfs = dir.join("sysfs");
    kumo_topology::fixtures::write(
        &kumo_topology::fixtures::machine("hgx-h100").unwrap(),
        &sysfs,
    )
    .unwrap();
    let config = crate::harness::agent_config(
        s,
        Some(s.join_token().await),
        &sysfs,
        &dir.join("state"),
        "gpu-001",
    );
    (Agent::start(config).await.unwrap(), sysfs)
}

/// A device's directory in the fixture's sysfs.
pub(crate) fn dev(sysfs: &Path, bdf: &str) -> PathBuf {
    std::fs::canonicalize(sysfs.join("bus/pci/devices").join(bdf)).unwrap()
}

/// Sets a device's AER total of one kind, as Linux prints it.
pub(crate) fn aer(sysfs: &Path, bdf: &str, file: &str, total_name: &str, n: u64) {
    std::fs::write(
        dev(sysfs, bdf).join(file),
        format!("RxErr 0\nBadTLP 0\n{total_name} {n}\n"),
    )
    .unwrap();
}

async fn devices(s: &TestServer) -> DeviceList {
    s.admin.get("/api/v1/devices?host=gpu-001").await.unwrap()
}

pub(crate) async fn device(s: &TestServer, bdf: &str) -> Device {
    devices(s)
        .await
        .items
        .into_iter()
        .find(|d| d.bdf == bdf)
        .unwrap_or_else(|| panic!("no device {bdf}"))
}

async fn act(s: &TestServer, bdf: &str, action: &str) -> Result<Device, u16> {
    s.admin
        .post::<_, Device>(
            &format!("/api/v1/hosts/gpu-001/devices/{bdf}/{action}"),
            &json!({"reason": format!("{action} (ticket 42)")}),
        )
        .await
        .map_err(|e| e.status().unwrap_or_default())
}

fn manual_clock(c: &mut kumo_server::config::Config) {
    c.clock = Clock::manual(t0());
    c.device_health.suspect_clears_after_secs = 600;
    // hgx-h100: 8 GPUs and 8 RDMA NICs; at most two quarantined by Kumo.
    c.device_health.max_quarantined_share = 0.13;
}

on_both_backends! {
    config = manual_clock;
    async fn devices_are_quarantined_suspected_repaired_and_kept_out_of_placements(s: &TestServer) {
        s.tenant("lab").await;
        let _libvirtd = virt::connect::Connect::open(Some("test:///default")).unwrap();
        let dir = scratch();
        let (agent, sysfs) = hgx_agent(s, dir.path()).await;
        let clock = s.server.state.config.clock.clone();

        // The first reading: every GPU and NIC, healthy, with its link and ports.
        agent.report_health().await.unwrap();
        let all = devices(s).await;
        assert_eq!(all.items.iter().filter(|d| d.kind == "gpu").count(), 8);
        assert_eq!(all.items.iter().filter(|d| d.kind == "nic").count(), 8);
        assert!(all.items.iter().all(|d| d.state == DeviceState::Healthy), "{:?}", all.items);
        assert_eq!(all.quarantine_cap, 2, "16 devices × 0.13");
        let nic = all.items.iter().find(|d| d.kind == "nic").unwrap();
        assert_eq!(nic.signals.as_ref().unwrap()["ports"][0]["state"], "ACTIVE", "{:?}", nic.signals);

        // A spot VM and a guaranteed one, a GPU each.
        let cheap: Vm = s.admin.post("/api/v1/tenants/lab/vms", &vm("cheap", 1, ServiceLevel::Spot)).await.unwrap();
        let keep: Vm = s.admin.post("/api/v1/tenants/lab/vms", &vm("keep", 1, ServiceLevel::Guaranteed)).await.unwrap();
        agent.sync_once(None).await.unwrap();
        let gpu_of = |v: &Vm| v.placement.as_ref().unwrap().gpus[0].host_bdf.clone();
        let (bad, kept) = (gpu_of(&cheap), gpu_of(&keep));

        // A fatal AER error on the spot VM's GPU quarantines it; the VM is
        // told and reclaimed.
        aer(&sysfs, &bad, "aer_dev_fatal", "TOTAL_ERR_FATAL", 1);
        agent.report_health().await.unwrap();
        let d = device(s, &bad).await;
        assert_eq!(d.state, DeviceState::Quarantined);
        assert!(d.reason.as_deref().unwrap().contains("fatal"), "{:?}", d.reason);
        assert_eq!(d.vms, vec![cheap.id]);
        let now: Vm = s.admin.get("/api/v1/tenants/lab/vms/cheap").await.unwrap();
        assert_eq!(now.state, VmState::Preempting, "a spot VM on a quarantined GPU is reclaimed");
        assert!(events_of(s, "lab", &cheap).await.contains(&"device.quarantined".to_string()));
        // Prometheus sees it: the device's state and its fatal error, the
        // host's GPUs out of service.
        let m = fleet_metrics(s).await;
        let of_bad = format!("host=\"gpu-001\",bdf=\"{bad}\",kind=\"gpu\"");
        assert_eq!(series(&m, &format!("kumo_device_state{{{of_bad},state=\"quarantined\"}}")), Some(1.0), "{m}");
        assert_eq!(series(&m, &format!("kumo_device_state{{{of_bad},state=\"healthy\"}}")), Some(0.0));
        assert_eq!(series(&m, &format!("kumo_device_aer_errors{{{of_bad},severity=\"fatal\"}}")), Some(1.0));
        assert_eq!(series(&m, "kumo_host_gpus_out_of_service{host=\"gpu-001\"}"), Some(1.0));
        assert_eq!(series(&m, "kumo_host_state{host=\"gpu-001\",state=\"ready\"}"), Some(1.0));
        let audit: serde_json::Value = s.admin.get("/api/v1/audit?limit=50").await.unwrap();
        assert!(audit["items"].as_array().unwrap().iter().any(|e| e["action"] == "device.quarantined"
            && e["target"].as_str().unwrap().contains(&bad)), "{audit}");
        // The same reading again changes nothing: old errors count once.
        agent.report_health().await.unwrap();
        assert_eq!(device(s, &bad).await.state, DeviceState::Quarantined);

        // The reclaimed VM gone, its GPU is not free again: 6 of 8 GPUs
        // take VMs (one held by `keep`, one quarantined).
        let r = s.http().delete(format!("{}/api/v1/tenants/lab/vms/cheap", s.url)).bearer_auth(&s.admin_token).send().await.unwrap();
        assert_eq!(r.status(), 202);
        agent.sync_once(None).await.unwrap();
        let host: serde_json::Value = s.admin.get("/api/v1/hosts/gpu-001").await.unwrap();
        assert_eq!(host["gpus_free"], 6, "{host}");
        let e = s.admin.post::<_, Vm>("/api/v1/tenants/lab/vms", &vm("seven", 7, ServiceLevel::Guaranteed)).await.unwrap_err();
        assert_eq!(e.status(), Some(409), "seven GPUs do not fit beside a quarantined one");
        let six: Vm = s.admin.post("/api/v1/tenants/lab/vms", &vm("six", 6, ServiceLevel::Guaranteed)).await.unwrap();
        assert_eq!(six.state, VmState::Scheduled, "{:?}", six.reason);
        let six_gpus: Vec<String> = six.placement.as_ref().unwrap().gpus.iter().map(|g| g.host_bdf.clone()).collect();
        assert!(!six_gpus.contains(&bad), "placed on the quarantined GPU: {six_gpus:?}");
        agent.sync_once(None).await.unwrap();

        // A narrowed link makes the kept VM's GPU suspect (still in
        // service); it clears only after the clean period, from the last
        // finding.
        let width = dev(&sysfs, &kept).join("current_link_width");
        std::fs::write(&width, "8\n").unwrap();
        agent.report_health().await.unwrap();
        let d = device(s, &kept).await;
        assert_eq!(d.state, DeviceState::Suspect);
        assert!(d.reason.as_deref().unwrap().contains("x8 of x16"), "{:?}", d.reason);
        assert!(events_of(s, "lab", &keep).await.contains(&"device.suspect".to_string()));
        clock.advance(chrono::Duration::seconds(500));
        agent.report_health().await.unwrap(); // still narrow: the period restarts
        std::fs::write(&width, "16\n").unwrap();
        clock.advance(chrono::Duration::seconds(500));
        agent.report_health().await.unwrap();
        assert_eq!(device(s, &kept).await.state, DeviceState::Suspect, "500 s clean of 600");
        clock.advance(chrono::Duration::seconds(101));
        agent.report_health().await.unwrap();
        let d = device(s, &kept).await;
        assert_eq!(d.state, DeviceState::Healthy, "{:?}", d.reason);

        // A NIC that left the bus is the second quarantine.
        let gone_nic = all.items.iter().rfind(|d| d.kind == "nic").unwrap().bdf.clone();
        std::fs::remove_file(dev(&sysfs, &gone_nic).join("vendor")).unwrap();
        agent.report_health().await.unwrap();
        let d = device(s, &gone_nic).await;
        assert_eq!(d.state, DeviceState::Quarantined);
        assert!(d.reason.as_deref().unwrap().contains("gone from the PCIe bus"), "{:?}", d.reason);

        // The limit: a third broken device is not quarantined by Kumo; it
        // turns suspect, says why, and waits for an operator.
        let third = six_gpus[0].clone();
        aer(&sysfs, &third, "aer_dev_fatal", "TOTAL_ERR_FATAL", 3);
        agent.report_health().await.unwrap();
        let d = device(s, &third).await;
        assert_eq!(d.state, DeviceState::Suspect);
        assert!(d.reason.as_deref().unwrap().contains("automatic quarantine limit"), "{:?}", d.reason);
        let list = devices(s).await;
        assert_eq!(list.counts.get("quarantined"), Some(&2), "{:?}", list.counts);
        // An operator may quarantine past the limit.
        assert_eq!(act(s, &third, "quarantine").await.unwrap().state, DeviceState::Quarantined);

        // Repair and validation: only in order; a clean reading brings the
        // GPU back into service, and placements may use it again.
        assert_eq!(act(s, &bad, "validate").await.map(|d| d.state), Ok(DeviceState::Validating), "validate straight from quarantine");
        assert_eq!(act(s, &kept, "validate").await.err(), Some(409), "a healthy device needs no validation");
        assert_eq!(act(s, &kept, "dance").await.err(), Some(404));
        assert_eq!(act(s, "0000:99:00.0", "repair").await.err(), Some(404), "not a device of the host");
        assert_eq!(act(s, &third, "repair").await.unwrap().state, DeviceState::Repairing);
        agent.report_health().await.unwrap();
        assert_eq!(device(s, &third).await.state, DeviceState::Repairing, "readings do not end a repair");
        assert_eq!(act(s, &third, "validate").await.unwrap().state, DeviceState::Validating);
        agent.report_health().await.unwrap();
        assert_eq!(device(s, &bad).await.state, DeviceState::Healthy, "validated by a clean reading");
        assert_eq!(device(s, &third).await.state, DeviceState::Healthy);
        let host: serde_json::Value = s.admin.get("/api/v1/hosts/gpu-001").await.unwrap();
        assert_eq!(host["gpus_free"], 1, "8 − keep − six: {host}");
        // A device that fails its validation goes back to quarantine.
        assert_eq!(act(s, &gone_nic, "validate").await.unwrap().state, DeviceState::Validating);
        agent.report_health().await.unwrap();
        let d = device(s, &gone_nic).await;
        assert_eq!(d.state, DeviceState::Quarantined);
        assert!(d.reason.as_deref().unwrap().starts_with("validation failed"), "{:?}", d.reason);

        // Tenants see none of it; the CLI lists and repairs.
        let (member, _) = s.user("someone").await;
        s.add("lab", "someone", kumo_api_types::Role::Member).await;
        let e = member.get::<DeviceList>("/api/v1/devices").await.unwrap_err();
        assert_eq!(e.status(), Some(403));
        let (url, token, nic) = (s.url.clone(), s.admin_token.clone(), gone_nic.clone());
        tokio::task::spawn_blocking(move || {
            let k = crate::cli::Kumo::new();
            let t = Some(token.as_str());
            let table = k.ok(&["--server", &url, "host", "device", "list", "--state", "quarantined"], t);
            assert!(table.contains(&nic) && table.contains("validation failed"), "{table}");
            assert!(table.contains("Fleet: 15 healthy, 1 quarantined"), "{table}");
            let d = k.json(&["--server", &url, "host", "device", "repair", "gpu-001", &nic, "--reason", "reseated"], t);
            assert_eq!(d["state"], "repairing");
            assert_eq!(d["reason"], "reseated");
        })
        .await
        .unwrap();
    }
}

/// The fleet's Prometheus series, as an administrator scrapes them.
pub(crate) async fn fleet_metrics(s: &TestServer) -> String {
    let r = reqwest::Client::new()
        .get(format!("{}/metrics/fleet", s.url))
        .bearer_auth(&s.admin_token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.text().await.unwrap()
}

/// The value of one series (its name and labels as written).
pub(crate) fn series(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(name_and_labels)?
            .strip_prefix(' ')?
            .parse()
            .ok()
    })
}

/// Posts a telemetry report as a host.
async fn telemetry(a: &crate::harness::SimAgent, body: &serde_json::Value) -> reqwest::StatusCode {
    reqwest::Client::new()
        .post(format!("{}/agent/v1/telemetry", a.url))
        .bearer_auth(&a.credential)
        .json(body)
        .send()
        .await
        .unwrap()
        .status()
}

fn reading(bdf: &str, util: serde_json::Value, mem: u64) -> serde_json::Value {
    json!({"host_bdf": bdf, "sample": {"bus_id": "0000:11:00.0", "utilization_pct": util,
        "memory_used_mib": mem, "memory_total_mib": 81559, "temperature_c": 51.0,
        "power_w": 300.0, "ecc_uncorrected": 0, "throttle_reasons": 4}})
}

on_both_backends! {
    config = manual_clock;
    async fn guests_gpu_figures_roll_up_by_minute_and_an_xid_only_makes_suspect(s: &TestServer) {
        s.tenant("lab").await;
        s.tenant("other").await;
        let mut a = s.sim_agent("gpu-001", "hgx-h100").await;
        let b = s.sim_agent("gpu-002", "hgx-h100").await;
        let clock = s.server.state.config.clock.clone();
        let v: Vm = s.admin.post("/api/v1/tenants/lab/vms", &vm("train", 2, ServiceLevel::Guaranteed)).await.unwrap();
        a.converge().await;
        let v: Vm = s.admin.get(&format!("/api/v1/tenants/lab/vms/{}", v.id)).await.unwrap();
        let gpus: Vec<String> = v.placement.as_ref().unwrap().gpus.iter().map(|g| g.host_bdf.clone()).collect();
        assert_eq!(gpus.len(), 2);

        // Nothing read yet: `none`, and a series per GPU, empty.
        let m: VmMetrics = s.admin.get("/api/v1/tenants/lab/vms/train/metrics").await.unwrap();
        assert_eq!(m.telemetry, "none");
        assert_eq!(m.gpus.len(), 2);
        assert!(m.gpus.iter().all(|g| g.points.is_empty()));

        // Three readings in one minute, one in the next; the second GPU
        // cannot say how busy it is (unknown, not idle).
        for (util, mem) in [(90.0, 1000), (30.0, 3000)] {
            let st = telemetry(&a, &json!({"vms": [{"vm": v.id, "gpus": [reading(&gpus[0], json!(util), mem), reading(&gpus[1], json!(null), 10)]}]})).await;
            assert_eq!(st, 204);
        }
        clock.advance(chrono::Duration::seconds(60));
        telemetry(&a, &json!({"vms": [{"vm": v.id, "gpus": [reading(&gpus[0], json!(10.0), 500)]}]})).await;
        let m: VmMetrics = s.admin.get("/api/v1/tenants/lab/vms/train/metrics").await.unwrap();
        assert_eq!(m.telemetry, "ok");
        assert_eq!(m.step_minutes, 1);
        let first = m.gpus.iter().find(|g| g.host_bdf == gpus[0]).unwrap();
        assert_eq!(first.points.len(), 2, "{:?}", first.points);
        assert_eq!(first.points[0].samples, 2);
        assert_eq!(first.points[0].utilization_pct, Some(60.0));
        assert_eq!(first.points[0].utilization_max_pct, Some(90.0));
        assert_eq!(first.points[0].memory_used_mib, Some(3000));
        assert_eq!(first.points[0].throttle_reasons, vec!["sw_power_cap".to_string()]);
        assert_eq!(first.points[1].utilization_pct, Some(10.0));
        let second = m.gpus.iter().find(|g| g.host_bdf == gpus[1]).unwrap();
        assert_eq!(second.points[0].utilization_pct, None, "unknown stays unknown");
        // Prometheus reads the last minute's figures by host and GPU; the
        // GPU that cannot say has no utilisation series.
        let fm = fleet_metrics(s).await;
        let gpu = |i: usize| format!("{{host=\"gpu-001\",bdf=\"{}\"}}", gpus[i]);
        assert_eq!(series(&fm, &format!("kumo_gpu_utilization_percent{}", gpu(0))), Some(10.0), "{fm}");
        assert_eq!(series(&fm, &format!("kumo_gpu_memory_used_mib{}", gpu(0))), Some(500.0));
        assert_eq!(series(&fm, &format!("kumo_gpu_utilization_percent{}", gpu(1))), None);
        // A coarser step folds the minutes.
        let m: VmMetrics = s.admin.get("/api/v1/tenants/lab/vms/train/metrics?step_minutes=60").await.unwrap();
        let first = m.gpus.iter().find(|g| g.host_bdf == gpus[0]).unwrap();
        assert_eq!(first.points.len(), 1);
        assert_eq!(first.points[0].samples, 3);
        let e = s.admin.get::<VmMetrics>("/api/v1/tenants/lab/vms/train/metrics?step_minutes=0").await.unwrap_err();
        assert_eq!(e.status(), Some(400));

        // A guest that cannot say: unknown, with why.
        telemetry(&a, &json!({"vms": [{"vm": v.id, "unknown": "nvidia-smi in the guest exited with 9: NVIDIA-SMI has failed"}]})).await;
        let m: VmMetrics = s.admin.get("/api/v1/tenants/lab/vms/train/metrics").await.unwrap();
        assert_eq!(m.telemetry, "unknown");
        assert!(m.telemetry_reason.unwrap().contains("exited with 9"));

        // A host speaks only for its own VMs and their GPUs: another
        // host's report of this VM, or of a GPU the VM does not hold, is
        // ignored; other tenants do not see the series.
        let mut other = gpus.clone();
        other.retain(|g| g != &gpus[0]);
        let not_held = v.placement.as_ref().map(|_| "0000:ff:00.0").unwrap();
        telemetry(&b, &json!({"vms": [{"vm": v.id, "gpus": [reading(&gpus[0], json!(100.0), 1)], "xids": [{"host_bdf": gpus[0], "code": 79}]}]})).await;
        telemetry(&a, &json!({"vms": [{"vm": v.id, "gpus": [reading(not_held, json!(100.0), 1)]}]})).await;
        let m: VmMetrics = s.admin.get("/api/v1/tenants/lab/vms/train/metrics").await.unwrap();
        assert_eq!(m.gpus.len(), 2);
        assert!(m.gpus.iter().all(|g| g.points.iter().all(|p| p.utilization_max_pct != Some(100.0))), "{:?}", m.gpus);
        let (outsider, _) = s.user("outsider").await;
        s.add("other", "outsider", kumo_api_types::Role::Member).await;
        let e = outsider.get::<VmMetrics>("/api/v1/tenants/lab/vms/train/metrics").await.unwrap_err();
        assert_eq!(e.status(), Some(404));
        // Oversized reports are refused whole.
        let many: Vec<_> = (0..65).map(|_| json!({"host_bdf": gpus[0], "code": 13})).collect();
        assert_eq!(telemetry(&a, &json!({"vms": [{"vm": v.id, "xids": many}]})).await, 400);

        // XIDs: an application fault (13) is told to the VM only; an ECC
        // one (48) makes the GPU suspect, on the guest's word; so does 79
        // (fallen off the bus): a guest never takes a GPU out of service.
        telemetry(&a, &json!({"vms": [{"vm": v.id, "gpus": [reading(&gpus[0], json!(1.0), 1)], "xids": [
            {"host_bdf": gpus[0], "code": 13}, {"host_bdf": gpus[1], "code": 48}]}]})).await;
        let events = events_of(s, "lab", &v).await;
        assert_eq!(events.iter().filter(|e| *e == "gpu.xid").count(), 2, "{events:?}");
        let list: DeviceList = s.admin.get("/api/v1/devices?host=gpu-001").await.unwrap();
        let state = |bdf: &str| list.items.iter().find(|d| d.bdf == bdf).map(|d| d.state);
        assert_eq!(state(&gpus[0]), None, "XID 13 says nothing of the GPU");
        assert_eq!(state(&gpus[1]), Some(DeviceState::Suspect));
        assert!(events_of(s, "lab", &v).await.contains(&"device.suspect".to_string()), "its holder is told");
        telemetry(&a, &json!({"vms": [{"vm": v.id, "gpus": [reading(&gpus[0], json!(1.0), 1)], "xids": [{"host_bdf": gpus[1], "code": 79}]}]})).await;
        let list: DeviceList = s.admin.get("/api/v1/devices?host=gpu-001").await.unwrap();
        let d = list.items.iter().find(|d| d.bdf == gpus[1]).unwrap();
        assert_eq!(d.state, DeviceState::Suspect, "a guest's XID 79 alone: {:?}", d.reason);
        assert!(d.reason.as_deref().unwrap().contains("said by its guest"), "{:?}", d.reason);

        // Any number of a project's guests printing XID 79 take nothing
        // out of service.
        let more: Vm = s.admin.post("/api/v1/tenants/lab/vms", &vm("more", 2, ServiceLevel::Guaranteed)).await.unwrap();
        a.converge().await;
        let more: Vm = s.admin.get(&format!("/api/v1/tenants/lab/vms/{}", more.id)).await.unwrap();
        let theirs: Vec<String> = more.placement.as_ref().unwrap().gpus.iter().map(|g| g.host_bdf.clone()).collect();
        for bdf in &theirs {
            telemetry(&a, &json!({"vms": [{"vm": more.id, "gpus": [reading(bdf, json!(1.0), 1)], "xids": [{"host_bdf": bdf, "code": 79}]}]})).await;
        }
        let list: DeviceList = s.admin.get("/api/v1/devices?host=gpu-001").await.unwrap();
        let of = |bdf: &str| list.items.iter().find(|d| d.bdf == bdf).unwrap().clone();
        assert!(theirs.iter().all(|b| of(b).state == DeviceState::Suspect), "{:?}", list.items);
        assert!(list.items.iter().all(|d| d.state.placeable()), "{:?}", list.items);

        // Its host agrees (a narrowed link on the GPU the guest spoke of):
        // quarantined, within the fleet's limit.
        let beat = async |agent: &crate::harness::SimAgent, device: serde_json::Value| {
            let r = reqwest::Client::new()
                .post(format!("{}/agent/v1/heartbeat", agent.url))
                .bearer_auth(&agent.credential)
                .json(&json!({"health": {"devices": [device], "ports": []}}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 204);
        };
        beat(&a, json!({"bdf": gpus[1], "kind": "gpu", "present": true,
            "link": {"speed": 32, "max_speed": 32, "width": 8, "max_width": 16}})).await;
        let d = device(s, &gpus[1]).await;
        assert_eq!(d.state, DeviceState::Quarantined, "{:?}", d.reason);
        assert!(d.reason.as_deref().unwrap().contains("agreeing with its guest"), "{:?}", d.reason);

        // The suspects whose VM leaves pass their host's check (no `unfit`
        // in the report): back in service by themselves.
        s.admin.delete(&format!("/api/v1/tenants/lab/vms/{}", more.id)).await.unwrap();
        a.converge().await;
        for bdf in &theirs {
            let d = device(s, bdf).await;
            assert_eq!(d.state, DeviceState::Healthy, "{bdf}: {:?}", d.reason);
        }

        // The fleet's limit was not spent by guests: a host's own finding
        // still quarantines.
        let gone_gpu = gpus[0].clone();
        beat(&b, json!({"bdf": gone_gpu, "kind": "gpu", "present": false})).await;
        let list: DeviceList = s.admin.get("/api/v1/devices?host=gpu-002").await.unwrap();
        let d = list.items.iter().find(|d| d.bdf == gone_gpu).unwrap();
        assert_eq!(d.state, DeviceState::Quarantined, "the fleet's limit was not spent by guests: {:?}", d.reason);

        // A guest's wild figures are bounded before they are stored or
        // exported: no infinity reaches Prometheus.
        clock.advance(chrono::Duration::seconds(60));
        let wild = json!({"bus_id": "0000:00:00.0", "utilization_pct": 1e308, "power_w": 1e308,
            "temperature_c": -1e308, "memory_used_mib": 5});
        for _ in 0..3 {
            telemetry(&a, &json!({"vms": [{"vm": v.id, "gpus": [{"host_bdf": gpus[0], "sample": wild}]}]})).await;
        }
        let fm = fleet_metrics(s).await;
        assert!(!fm.to_lowercase().contains("inf") && !fm.contains("NaN"), "{fm}");
        assert_eq!(series(&fm, &format!("kumo_gpu_memory_used_mib{}", gpu(0))), Some(5.0), "{fm}");
        assert_eq!(series(&fm, &format!("kumo_gpu_utilization_percent{}", gpu(0))), None, "{fm}");

        // Past the minutes' window (7 days) minutes fold into hours: the
        // series reads the same samples, hour by hour; past the retention
        // (30 days) the hours go.
        use sea_orm::{EntityTrait, PaginatorTrait};
        let z = |t: chrono::DateTime<chrono::Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let span = format!(
            "/api/v1/tenants/lab/vms/train/metrics?from={}&to={}&step_minutes=60",
            z(clock.now() - chrono::Duration::hours(3)),
            z(clock.now() + chrono::Duration::minutes(1))
        );
        let samples = |m: &VmMetrics| -> Vec<(String, u32)> {
            m.gpus.iter().map(|g| (g.host_bdf.clone(), g.points.iter().map(|p| p.samples).sum())).collect()
        };
        let by_minute = samples(&s.admin.get::<VmMetrics>(&span).await.unwrap());
        assert!(by_minute.iter().any(|(_, n)| *n >= 3), "{by_minute:?}");
        let db = &s.server.state.db;
        let minutes = kumo_server::entity::gpu_minutes::Entity::find().count(db).await.unwrap();
        clock.advance(chrono::Duration::days(8));
        let folded = kumo_server::app::gpu_telemetry::roll_up(&s.server.state).await.unwrap();
        assert_eq!(folded, minutes, "every minute was older than 7 days");
        assert_eq!(kumo_server::entity::gpu_minutes::Entity::find().count(db).await.unwrap(), 0);
        let hours = kumo_server::entity::gpu_hours::Entity::find().count(db).await.unwrap();
        assert!(hours > 0 && hours < minutes, "{hours} hours of {minutes} minutes");
        assert_eq!(samples(&s.admin.get::<VmMetrics>(&span).await.unwrap()), by_minute, "the same figures by the hour");
        assert_eq!(kumo_server::app::gpu_telemetry::roll_up(&s.server.state).await.unwrap(), 0, "nothing twice");
        clock.advance(chrono::Duration::days(23));
        kumo_server::app::gpu_telemetry::roll_up(&s.server.state).await.unwrap();
        assert_eq!(kumo_server::entity::gpu_hours::Entity::find().count(db).await.unwrap(), 0);
    }
}

/// Devices checked on release: the real agent on an HGX fixture stops a
/// 2-GPU VM, one of its GPUs then reads all ones from config space (as a
/// GPU that did not come back from its reset does), and deleting the VM
/// quarantines that GPU, not the other, before anyone else is placed on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_that_does_not_come_back_after_its_vm_lets_it_go_is_quarantined() {
    let s = TestServer::start(crate::harness::Backend::Sqlite).await;
    s.tenant("lab").await;
    let _libvirtd = virt::connect::Connect::open(Some("test:///default")).unwrap();
    let dir = scratch();
    let (agent, sysfs) = hgx_agent(&s, dir.path()).await;
    agent.report_health().await.unwrap();
    let pair: Vm = s
        .admin
        .post(
            "/api/v1/tenants/lab/vms",
            &vm("pair", 2, ServiceLevel::Guaranteed),
        )
        .await
        .unwrap();
    agent.sync_once(None).await.unwrap();
    let gpus = crate::harness::gpus_of(&pair);
    let (bad, good) = (gpus[0].clone(), gpus[1].clone());
    let action = |verb: reqwest::Method, path: String| {
        s.http()
            .request(verb, format!("{}{path}", s.url))
            .bearer_auth(&s.admin_token)
            .send()
    };
    let stop = action(
        reqwest::Method::POST,
        "/api/v1/tenants/lab/vms/pair/stop".into(),
    )
    .await
    .unwrap();
    assert_eq!(stop.status(), 202);
    agent.sync_once(None).await.unwrap();
    let stopped: Vm = s.admin.get("/api/v1/tenants/lab/vms/pair").await.unwrap();
    assert_eq!(stopped.state, VmState::Stopped);

    // The VM is stopped; its first GPU now answers config reads with ones.
    let config = dev(&sysfs, &bad).join("config");
    let mut bytes = std::fs::read(&config).unwrap();
    bytes[..2].copy_from_slice(&[0xff, 0xff]);
    std::fs::write(&config, &bytes).unwrap();
    let gone = action(
        reqwest::Method::DELETE,
        "/api/v1/tenants/lab/vms/pair".into(),
    )
    .await
    .unwrap();
    assert!(gone.status().is_success(), "{}", gone.status());
    agent.sync_once(None).await.unwrap();

    let q = device(&s, &bad).await;
    assert_eq!(q.state, DeviceState::Quarantined, "{q:?}");
    assert_eq!(
        q.reason.as_deref(),
        Some("did not come back after reset: config space reads 0xffff")
    );
    assert_eq!(device(&s, &good).await.state, DeviceState::Healthy);
    // Never handed on: the whole host is no longer free for 8 GPUs, and
    // each single-GPU VM gets another GPU.
    let whole = s
        .admin
        .post::<_, Vm>(
            "/api/v1/tenants/lab/vms",
            &vm("whole", 8, ServiceLevel::Guaranteed),
        )
        .await;
    assert!(whole.is_err(), "an 8-GPU VM placed over a quarantined GPU");
    for i in 0..7 {
        let one: Vm = s
            .admin
            .post(
                "/api/v1/tenants/lab/vms",
                &vm(&format!("one-{i}"), 1, ServiceLevel::Guaranteed),
            )
            .await
            .unwrap();
        assert_ne!(one.placement.unwrap().gpus[0].host_bdf, bad);
    }
    let audit: serde_json::Value = s.admin.get("/api/v1/audit?limit=50").await.unwrap();
    assert!(
        audit
            .to_string()
            .contains(&format!("gpu-001 {bad}: did not come back after reset")),
        "{audit}"
    );
}

/// Host readiness: a real agent on an HGX fixture whose kernel made no
/// IOMMU groups (the IOMMU off) registers a host that says why it is not
/// ready for passthrough, gives no GPU VM a place, and still takes a
/// CPU-only VM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_with_its_iommu_off_takes_cpu_only_vms_and_says_why() {
    let s = TestServer::start(crate::harness::Backend::Sqlite).await;
    s.tenant("lab").await;
    let _libvirtd = virt::connect::Connect::open(Some("test:///default")).unwrap();
    let dir = scratch();
    let sysfs = dir.path().join("sysfs");
    kumo_topology::fixtures::write(
        &kumo_topology::fixtures::machine("hgx-h100").unwrap(),
        &sysfs,
    )
    .unwrap();
    std::fs::remove_dir_all(sysfs.join("kernel/iommu_groups")).unwrap();
    std::fs::create_dir_all(sysfs.join("kernel/iommu_groups")).unwrap();
    let config = crate::harness::agent_config(
        &s,
        Some(s.join_token().await),
        &sysfs,
        &dir.path().join("state"),
        "gpu-001",
    );
    let agent = Agent::start(config).await.unwrap();
    let h: kumo_api_types::HostDetail = s.admin.get("/api/v1/hosts/gpu-001").await.unwrap();
    assert!(!h.host.passthrough_ready);
    assert_eq!(h.host.gpus_free, 0, "{:?}", h.host);
    assert!(
        h.host.passthrough_problems[0].starts_with("the IOMMU is off"),
        "{:?}",
        h.host.passthrough_problems
    );
    let gpu = s
        .admin
        .post::<_, Vm>(
            "/api/v1/tenants/lab/vms",
            &vm("gpu", 1, ServiceLevel::Guaranteed),
        )
        .await;
    assert!(gpu.is_err(), "a GPU VM placed on a host without an IOMMU");
    let cpu: Vm = s
        .admin
        .post(
            "/api/v1/tenants/lab/vms",
            &vm("cpu", 0, ServiceLevel::Guaranteed),
        )
        .await
        .unwrap();
    assert_eq!(cpu.host.as_deref(), Some("gpu-001"));
    agent.sync_once(None).await.unwrap();

    // The IOMMU on again (the host rebooted with it): the next
    // registration's topology makes it ready, GPUs free.
    kumo_topology::fixtures::write(
        &kumo_topology::fixtures::machine("hgx-h100").unwrap(),
        &dir.path().join("sysfs-fixed"),
    )
    .unwrap();
    std::fs::remove_dir_all(sysfs.join("kernel/iommu_groups")).unwrap();
    std::fs::rename(
        dir.path().join("sysfs-fixed/kernel/iommu_groups"),
        sysfs.join("kernel/iommu_groups"),
    )
    .unwrap();
    drop(agent);
    let config =
        crate::harness::agent_config(&s, None, &sysfs, &dir.path().join("state"), "gpu-001");
    let agent = Agent::start(config).await.unwrap();
    agent.report_inventory().await.unwrap();
    // The scheduler's index follows the stored inventory.
    s.refresh_capacity().await;
    let h: kumo_api_types::HostDetail = s.admin.get("/api/v1/hosts/gpu-001").await.unwrap();
    assert!(
        h.host.passthrough_ready,
        "{:?}",
        h.host.passthrough_problems
    );
    assert_eq!(h.host.gpus_free, 8);
    let _: Vm = s
        .admin
        .post(
            "/api/v1/tenants/lab/vms",
            &vm("gpu", 1, ServiceLevel::Guaranteed),
        )
        .await
        .unwrap();
}

/// A release report speaks only for devices its VM held on that host: one
/// naming a GPU the VM never had changes nothing (a buggy or hostile agent
/// cannot empty the pool through it); the held one is quarantined.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfit_report_counts_only_for_a_device_its_vm_held() {
    let s = TestServer::start(crate::harness::Backend::Sqlite).await;
    s.tenant("lab").await;
    let _libvirtd = virt::connect::Connect::open(Some("test:///default")).unwrap();
    let dir = scratch();
    let (agent, _sysfs) = hgx_agent(&s, dir.path()).await;
    agent.report_health().await.unwrap();
    let one: Vm = s
        .admin
        .post(
            "/api/v1/tenants/lab/vms",
            &vm("one", 1, ServiceLevel::Guaranteed),
        )
        .await
        .unwrap();
    let held = crate::harness::gpus_of(&one)[0].clone();
    let all: Vec<String> = devices(&s)
        .await
        .items
        .into_iter()
        .filter(|d| d.kind == "gpu")
        .map(|d| d.bdf)
        .collect();
    let other = all.iter().find(|b| **b != held).unwrap().clone();
    let report = |bdf: &str| kumo_api_types::StatusReport {
        unfit: vec![kumo_api_types::UnfitDevice {
            vm: one.id,
            bdf: bdf.into(),
            problem: "config space reads 0xffff".into(),
        }],
        ..Default::default()
    };
    agent.client.status(&report(&other)).await.unwrap();
    assert_eq!(device(&s, &other).await.state, DeviceState::Healthy);
    agent.client.status(&report(&held)).await.unwrap();
    assert_eq!(device(&s, &held).await.state, DeviceState::Quarantined);
}
