//! Device health end to end: a real agent reads a fixture host's sysfs,
//! which the test edits (AER counters, PCIe link width, a vanished NIC),
//! and reports it on its heartbeat; the server quarantines, suspects and
//! clears devices, keeps placements off the broken ones, tells and
//! reclaims the VMs on them, stops at the automatic quarantine limit, and
//! takes operators' repair and validation. The server's clock is the
//! test's, so "clean for a while" takes no waiting.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kumo_agent::run::{Agent, AgentConfig};
use kumo_api_types::{Device, DeviceList, DeviceState, ServiceLevel, Vm, VmCreate, VmState};
use kumo_server::clock::Clock;
use serde_json::json;

use crate::harness::{events_of, on_both_backends, scratch, TestServer};

fn t0() -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp(1_900_000_000, 0).unwrap()
}

fn agent_config(s: &TestServer, join: String, sysfs: &Path, state: &Path) -> AgentConfig {
    AgentConfig {
        server: s.url.clone(),
        join_token: Some(join),
        libvirt_uri: "test:///default".into(),
        sysfs_root: sysfs.to_path_buf(),
        state_dir: state.to_path_buf(),
        name: "gpu-001".into(),
        virt_type: "qemu".into(),
        heartbeat: Duration::from_secs(1),
        scalable_unit: None,
        rails: Default::default(),
        underlay_ip: None,
        netns: None,
        edge_uplink: None,
        storage: None,
        resync: kumo_agent::run::RESYNC,
        transfer_listen: ([127, 0, 0, 1], 0).into(),
        transfer_url: None,
        telemetry: Duration::from_secs(1),
    }
}

fn vm(name: &str, gpus: u32, level: ServiceLevel) -> VmCreate {
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
    }
}

/// A device's directory in the fixture's sysfs.
fn dev(sysfs: &Path, bdf: &str) -> PathBuf {
    std::fs::canonicalize(sysfs.join("bus/pci/devices").join(bdf)).unwrap()
}

/// Sets a device's AER total of one kind, as Linux prints it.
fn aer(sysfs: &Path, bdf: &str, file: &str, total_name: &str, n: u64) {
    std::fs::write(
        dev(sysfs, bdf).join(file),
        format!("RxErr 0\nBadTLP 0\n{total_name} {n}\n"),
    )
    .unwrap();
}

async fn devices(s: &TestServer) -> DeviceList {
    s.admin.get("/api/v1/devices?host=gpu-001").await.unwrap()
}

async fn device(s: &TestServer, bdf: &str) -> Device {
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
        let sysfs = dir.path().join("sysfs");
        kumo_topology::fixtures::write(&kumo_topology::fixtures::machine("hgx-h100").unwrap(), &sysfs).unwrap();
        let agent = Agent::start(agent_config(s, s.join_token().await, &sysfs, &dir.path().join("state"))).await.unwrap();
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
