//! NVSwitch partitions end to end: a real agent on an HGX H100 fixture
//! (libvirt's test driver) talks to Fabric Manager through `kumo-agent
//! fabric-manager-standin`, the stand-in for NVIDIA Fabric Manager and
//! its `fmpm` client (no NVSwitch hardware here), which keeps its
//! partition table and the calls it got in a state file the test reads
//! and edits.

use std::path::{Path, PathBuf};

use kumo_agent::fabric_manager::standin::State;
use kumo_agent::run::Agent;
use kumo_api_types::{HostDetail, ServiceLevel, Vm, VmState};

use crate::device_health::vm;
use crate::harness::{bin, gpus_of, scratch, Backend, TestServer};

struct Host {
    agent: Agent,
    fm: PathBuf,
}

fn standin(state: &Path) -> String {
    format!(
        "{} fabric-manager-standin --state {}",
        bin("kumo-agent").display(),
        state.display()
    )
}

fn fm(path: &Path) -> State {
    State::load(path).unwrap()
}

fn edit(path: &Path, f: impl FnOnce(&mut State)) {
    let mut s = fm(path);
    f(&mut s);
    s.save(path).unwrap();
}

async fn host(s: &TestServer, dir: &Path, fm_state: State) -> Host {
    let sysfs = dir.join("sysfs");
    if !sysfs.exists() {
        kumo_topology::fixtures::write(
            &kumo_topology::fixtures::machine("hgx-h100").unwrap(),
            &sysfs,
        )
        .unwrap();
    }
    let fm = dir.join("fm.json");
    fm_state.save(&fm).unwrap();
    let mut config = crate::harness::agent_config(
        s,
        Some(s.join_token().await),
        &sysfs,
        &dir.join("state"),
        "gpu-001",
    );
    config.fabric_manager = Some(standin(&fm));
    let agent = Agent::start(config).await.unwrap();
    Host { agent, fm }
}

async fn nccl(s: &TestServer, name: &str) -> String {
    s.nccl_topology("lab", name).await
}

async fn get(s: &TestServer, name: &str) -> Vm {
    s.admin
        .get(&format!("/api/v1/tenants/lab/vms/{name}"))
        .await
        .unwrap()
}

async fn create(s: &TestServer, name: &str, gpus: u32) -> Result<Vm, kumo_cli::ClientError> {
    s.admin
        .post(
            "/api/v1/tenants/lab/vms",
            &vm(name, gpus, ServiceLevel::Guaranteed),
        )
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_gpu_vms_get_an_activated_partition_and_give_it_back() {
    let s = TestServer::start(Backend::Sqlite).await;
    s.tenant("lab").await;
    let _libvirtd = virt::connect::Connect::open(Some("test:///default")).unwrap();
    let dir = scratch();
    let h = host(&s, dir.path(), State::hgx()).await;

    // The host lists Fabric Manager's partitions, by PCI address.
    let d: HostDetail = s.admin.get("/api/v1/hosts/gpu-001").await.unwrap();
    assert_eq!(d.host.partitions.len(), 15, "{:?}", d.host.partitions);
    assert_eq!(d.host.partitions[0].gpus.len(), 8);
    assert_eq!(d.host.fabric_manager_problem, None);

    // A 2-GPU VM: placed on a pair partition, activated before it starts.
    let pair = create(&s, "pair", 2).await.unwrap();
    let gpus = gpus_of(&pair);
    let id = d
        .host
        .partitions
        .iter()
        .find(|p| p.gpus.len() == 2 && p.gpus.iter().all(|g| gpus.contains(g)))
        .map(|p| p.id)
        .expect("the VM's GPUs are one partition");
    h.agent.sync_once(None).await.unwrap();
    assert_eq!(get(&s, "pair").await.state, VmState::Running);
    let state = fm(&h.fm);
    assert!(state.active.contains(&id), "{state:?}");
    assert!(
        state.calls.contains(&format!("-a {id}")),
        "{:?}",
        state.calls
    );
    assert!(
        nccl(&s, "pair").await.contains("<nvlink"),
        "NVLinks inside a partition"
    );

    // Another VM whose partition Fabric Manager refuses: that VM fails, with
    // Fabric Manager's reason; the first runs on.
    let other = create(&s, "other", 2).await.unwrap();
    let other_gpus = gpus_of(&other);
    let other_id = d
        .host
        .partitions
        .iter()
        .find(|p| p.gpus.len() == 2 && p.gpus.iter().all(|g| other_gpus.contains(g)))
        .unwrap()
        .id;
    edit(&h.fm, |s| {
        s.failing.insert(other_id, -2);
    });
    h.agent.sync_once(None).await.unwrap();
    let failed = get(&s, "other").await;
    assert_eq!(failed.state, VmState::Error, "{failed:?}");
    let reason = failed.reason.unwrap_or_default();
    assert!(
        reason.contains(&format!("did not activate NVSwitch partition {other_id}"))
            && reason.contains("FM_ST_GENERIC_ERROR"),
        "{reason}"
    );
    assert_eq!(get(&s, "pair").await.state, VmState::Running);

    // Fabric Manager restarts (it forgets what is active and takes nothing
    // but the activated list): the agent tells it the running VM's.
    edit(&h.fm, |s| {
        s.failing.clear();
        s.active.clear();
        s.restarted = true;
    });
    h.agent.resync().await.unwrap();
    let state = fm(&h.fm);
    assert!(!state.restarted);
    assert!(state.active.contains(&id), "{state:?}");
    assert!(
        state
            .calls
            .iter()
            .any(|c| c.starts_with("--set-activated-list") && c.contains(&id.to_string())),
        "{:?}",
        state.calls
    );

    // Stopped, the VM's partition goes.
    let stop = s
        .http()
        .post(format!("{}/api/v1/tenants/lab/vms/pair/stop", s.url))
        .bearer_auth(&s.admin_token)
        .send()
        .await
        .unwrap();
    assert_eq!(stop.status(), 202);
    h.agent.sync_once(None).await.unwrap();
    assert_eq!(get(&s, "pair").await.state, VmState::Stopped);
    let state = fm(&h.fm);
    assert!(!state.active.contains(&id), "{state:?}");
    assert!(
        state.calls.contains(&format!("-d {id}")),
        "{:?}",
        state.calls
    );

    // Its partition free again (Fabric Manager's refusal cleared above), the
    // other VM started meanwhile; a restarted agent re-sets the activated
    // list at once to what runs: that VM's partition.
    assert_eq!(get(&s, "other").await.state, VmState::Running);
    drop(h.agent);
    let mut config = crate::harness::agent_config(
        &s,
        None,
        &dir.path().join("sysfs"),
        &dir.path().join("state"),
        "gpu-001",
    );
    config.fabric_manager = Some(standin(&h.fm));
    let again = Agent::start(config).await.unwrap();
    again.sync_once(None).await.unwrap();
    let state = fm(&h.fm);
    assert_eq!(
        state
            .calls
            .iter()
            .rev()
            .find(|c| c.starts_with("--set"))
            .map(String::as_str),
        Some(format!("--set-activated-list {other_id}").as_str()),
        "{:?}",
        state.calls
    );
}

/// Fabric Manager down when the agent starts: the host takes 1-GPU VMs
/// only and says why; once it answers, multi-GPU VMs are placed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_its_fabric_manager_a_host_takes_single_gpu_vms_only() {
    let s = TestServer::start(Backend::Sqlite).await;
    s.tenant("lab").await;
    let _libvirtd = virt::connect::Connect::open(Some("test:///default")).unwrap();
    let dir = scratch();
    let down = State {
        down: true,
        ..State::hgx()
    };
    let h = host(&s, dir.path(), down).await;
    let d: HostDetail = s.admin.get("/api/v1/hosts/gpu-001").await.unwrap();
    let problem = d.host.fabric_manager_problem.unwrap_or_default();
    assert!(
        problem.contains("Fabric Manager does not answer") && problem.contains("1-GPU VMs only"),
        "{problem}"
    );
    assert!(
        create(&s, "pair", 2).await.is_err(),
        "a 2-GPU VM without NVLink"
    );
    let one = create(&s, "one", 1).await.unwrap();
    h.agent.sync_once(None).await.unwrap();
    assert_eq!(get(&s, "one").await.state, VmState::Running);
    assert!(!nccl(&s, "one").await.contains("<nvlink"));
    assert_eq!(one.placement.unwrap().gpus.len(), 1);

    // Back: the next pass reads its partitions and the heartbeat tells
    // the server, which places multi-GPU VMs again.
    edit(&h.fm, |s| s.down = false);
    h.agent.resync().await.unwrap();
    h.agent.report_inventory().await.unwrap();
    s.refresh_capacity().await;
    let d: HostDetail = s.admin.get("/api/v1/hosts/gpu-001").await.unwrap();
    assert_eq!(d.host.fabric_manager_problem, None);
    assert_eq!(d.host.partitions.len(), 15);
    create(&s, "pair", 2).await.unwrap();
}
