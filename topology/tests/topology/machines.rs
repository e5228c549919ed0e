//! Discovery on generated sysfs trees of real machine designs, checked
//! against the topology matrices published for those machines.

use std::path::{Path, PathBuf};

use kumo_topology::{fixtures, matrix, pairing, sysfs, Bdf, HostTopology, TopologyReport};
use proptest::prelude::*;

use crate::common::{discover_fixture, scratch};

/// The GPU rows of the matrix, cells separated by whitespace.
fn gpu_rows(topo: &HostTopology) -> Vec<String> {
    matrix::render(topo)
        .lines()
        .filter(|l| l.starts_with("GPU"))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

fn rows(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

/// DGX A100, `nvidia-smi topo -m` as published in the DGX A100 User Guide
/// (NUMA 3/1/7/5 per GPU pair, NV12 everywhere, PXB to the pair's two
/// compute HCAs) with the PCIe tree of the NCCL dump in NVIDIA/nccl#1505.
/// The storage HCAs mlx5_4/5 sit on a NUMA node without GPUs here (SYS).
#[test]
fn dgx_a100_matches_the_published_matrix() {
    let (_d, topo) = discover_fixture("dgx-a100");
    assert_eq!(topo.gpus.len(), 8);
    assert_eq!(topo.nics.len(), 10);
    assert_eq!(topo.nvswitches.len(), 6);
    assert_eq!(topo.numa_nodes.len(), 8);
    assert!(topo.gpus.iter().all(|g| g.model == "A100-SXM4-40GB"));
    let expected = rows(
        "
        GPU0 X NV12 NV12 NV12 NV12 NV12 NV12 NV12 PXB PXB SYS SYS SYS SYS SYS SYS SYS SYS 48-63,176-191 3
        GPU1 NV12 X NV12 NV12 NV12 NV12 NV12 NV12 PXB PXB SYS SYS SYS SYS SYS SYS SYS SYS 48-63,176-191 3
        GPU2 NV12 NV12 X NV12 NV12 NV12 NV12 NV12 SYS SYS PXB PXB SYS SYS SYS SYS SYS SYS 16-31,144-159 1
        GPU3 NV12 NV12 NV12 X NV12 NV12 NV12 NV12 SYS SYS PXB PXB SYS SYS SYS SYS SYS SYS 16-31,144-159 1
        GPU4 NV12 NV12 NV12 NV12 X NV12 NV12 NV12 SYS SYS SYS SYS SYS SYS PXB PXB SYS SYS 112-127,240-255 7
        GPU5 NV12 NV12 NV12 NV12 NV12 X NV12 NV12 SYS SYS SYS SYS SYS SYS PXB PXB SYS SYS 112-127,240-255 7
        GPU6 NV12 NV12 NV12 NV12 NV12 NV12 X NV12 SYS SYS SYS SYS SYS SYS SYS SYS PXB PXB 80-95,208-223 5
        GPU7 NV12 NV12 NV12 NV12 NV12 NV12 NV12 X SYS SYS SYS SYS SYS SYS SYS SYS PXB PXB 80-95,208-223 5
        ",
    );
    assert_eq!(gpu_rows(&topo), expected);
    // GPU0 is 0000:07:00.0 behind two switch levels, as in the NCCL dump.
    let gpu0 = &topo.gpus[0];
    assert_eq!(gpu0.location.bdf.to_string(), "0000:07:00.0");
    assert_eq!(
        gpu0.location.pcie_path.len(),
        5,
        "root port, upper switch (2 ports), lower switch (2 ports)"
    );
    assert_eq!(gpu0.nvlinks.len(), 6);
    assert_eq!(
        topo.nic("mlx5_0").unwrap().location.bdf.to_string(),
        "0000:0c:00.0"
    );
    assert_eq!(topo.nic("mlx5_0").unwrap().port_speed_mbps, Some(200_000));
}

/// HGX H100 as published in NVIDIA/nccl#1264 and the DGX H100
/// `nvidia-smi topo -m`: NV18 between all GPUs, each GPU PIX to its own
/// ConnectX-7, NODE to the other NICs of its socket, SYS across sockets.
#[test]
fn hgx_h100_matches_the_published_matrix() {
    let (_d, topo) = discover_fixture("hgx-h100");
    assert_eq!(
        (topo.gpus.len(), topo.nics.len(), topo.nvswitches.len()),
        (8, 8, 4)
    );
    let expected = rows(
        "
        GPU0 X NV18 NV18 NV18 NV18 NV18 NV18 NV18 PIX NODE NODE NODE SYS SYS SYS SYS 0-55,112-167 0
        GPU1 NV18 X NV18 NV18 NV18 NV18 NV18 NV18 NODE PIX NODE NODE SYS SYS SYS SYS 0-55,112-167 0
        GPU2 NV18 NV18 X NV18 NV18 NV18 NV18 NV18 NODE NODE PIX NODE SYS SYS SYS SYS 0-55,112-167 0
        GPU3 NV18 NV18 NV18 X NV18 NV18 NV18 NV18 NODE NODE NODE PIX SYS SYS SYS SYS 0-55,112-167 0
        GPU4 NV18 NV18 NV18 NV18 X NV18 NV18 NV18 SYS SYS SYS SYS PIX NODE NODE NODE 56-111,168-223 1
        GPU5 NV18 NV18 NV18 NV18 NV18 X NV18 NV18 SYS SYS SYS SYS NODE PIX NODE NODE 56-111,168-223 1
        GPU6 NV18 NV18 NV18 NV18 NV18 NV18 X NV18 SYS SYS SYS SYS NODE NODE PIX NODE 56-111,168-223 1
        GPU7 NV18 NV18 NV18 NV18 NV18 NV18 NV18 X SYS SYS SYS SYS NODE NODE NODE PIX 56-111,168-223 1
        ",
    );
    assert_eq!(gpu_rows(&topo), expected);
    // 4/5/5/4 links to the four NVSwitches (nvidia-smi nvlink -R in NVIDIA/nccl#1182).
    let counts: Vec<u32> = topo.gpus[0].nvlinks.iter().map(|l| l.count).collect();
    assert_eq!(counts, vec![4, 5, 5, 4]);
    let p = pairing(&topo);
    for (i, g) in topo.gpus.iter().enumerate() {
        assert_eq!(
            p[&g.location.bdf].as_deref(),
            Some(format!("mlx5_{i}").as_str())
        );
    }
}

/// Two NICs for eight GPUs: each NIC serves the four GPUs of its socket,
/// never more than its share.
#[test]
fn reduced_nic_h100_shares_nics_fairly() {
    let (_d, topo) = discover_fixture("hgx-h100-2nic");
    assert_eq!(topo.nics.len(), 2);
    let p = pairing(&topo);
    let names: Vec<_> = topo
        .gpus
        .iter()
        .map(|g| p[&g.location.bdf].clone().unwrap())
        .collect();
    assert_eq!(
        names,
        ["mlx5_0", "mlx5_0", "mlx5_0", "mlx5_0", "mlx5_1", "mlx5_1", "mlx5_1", "mlx5_1"]
    );
    let rows = gpu_rows(&topo);
    assert!(
        rows[0].contains("PIX SYS") && rows[1].contains("NODE SYS") && rows[5].contains("SYS NODE"),
        "{rows:?}"
    );
}

/// PCIe cards on root ports: PHB within a socket, SYS across, no NVLink.
#[test]
fn ethernet_ports_bring_their_vfs_and_infiniband_ones_serve_no_roce() {
    let (_d, roce) = discover_fixture("hgx-h100-roce");
    assert_eq!(roce.nics.len(), 8);
    for n in &roce.nics {
        assert_eq!(n.link_layer.as_deref(), Some("Ethernet"));
        assert_eq!(
            (n.sriov_total_vfs, n.sriov_num_vfs, n.vfs.len()),
            (16, 4, 4)
        );
        let pf = n.location.bdf;
        let vf = n.roce_vf().unwrap();
        assert_eq!((vf.bus, vf.function), (pf.bus, 2), "{}", n.rdma_device);
        assert_eq!(n.vf_index(n.vfs[3]), Some(3));
        // A VF sits under the same switch as its PF, in a group of its own.
        let d = roce.pci(vf).unwrap();
        assert_eq!(d.location.pcie_path, n.location.pcie_path);
        assert_ne!(d.iommu_group, n.iommu_group);
    }
    // The relations and pairing are those of the InfiniBand design.
    let (_d, ib) = discover_fixture("hgx-h100");
    assert_eq!(matrix::render(&roce), matrix::render(&ib));
    assert!(ib
        .nics
        .iter()
        .all(|n| n.vfs.is_empty() && n.roce_vf().is_none()));
}

#[test]
fn pcie_card_server() {
    let (_d, topo) = discover_fixture("l40s-pcie");
    assert!(topo
        .gpus
        .iter()
        .all(|g| g.model == "L40S" && g.nvlinks.is_empty()));
    let expected = rows(
        "
        GPU0 X PHB SYS SYS PHB 0-31,64-95 0
        GPU1 PHB X SYS SYS PHB 0-31,64-95 0
        GPU2 SYS SYS X PHB SYS 32-63,96-127 1
        GPU3 SYS SYS PHB X SYS 32-63,96-127 1
        ",
    );
    assert_eq!(gpu_rows(&topo), expected);
    let nic = topo.nic("mlx5_0").unwrap();
    assert_eq!(nic.link_layer.as_deref(), Some("Ethernet"));
    assert_eq!(nic.netdev.as_deref(), Some("ens7f0np0"));
    assert_eq!(nic.sriov_total_vfs, 16);
    assert!(pairing(&topo)
        .values()
        .all(|n| n.as_deref() == Some("mlx5_0")));
}

#[test]
fn cpu_only_host_has_no_gpus_and_no_rdma() {
    let (_d, topo) = discover_fixture("cpu-only");
    assert!(topo.gpus.is_empty() && topo.nics.is_empty() && topo.nvswitches.is_empty());
    assert_eq!(topo.numa_nodes.len(), 2);
    assert_eq!(topo.numa_nodes[1].cpus.len(), 64);
    assert!(topo
        .pci_devices
        .iter()
        .any(|d| d.driver.as_deref() == Some("igb")));
    assert!(pairing(&topo).is_empty());
}

fn golden_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.json"))
}

/// The full report per machine, checked in. `KUMO_UPDATE_GOLDEN=1` rewrites.
#[test]
fn reports_match_golden_files() {
    for name in fixtures::MACHINES {
        let (_d, topo) = discover_fixture(name);
        let json = serde_json::to_string_pretty(&TopologyReport::new(&topo)).unwrap() + "\n";
        let path = golden_path(name);
        if std::env::var_os("KUMO_UPDATE_GOLDEN").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &json).unwrap();
        }
        let golden = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            golden == json,
            "{name}: report differs from {} (KUMO_UPDATE_GOLDEN=1 to accept)",
            path.display()
        );
    }
}

#[test]
fn report_has_the_documented_shape() {
    let (_d, topo) = discover_fixture("hgx-h100");
    let v = serde_json::to_value(TopologyReport::new(&topo)).unwrap();
    for key in [
        "numa_nodes",
        "gpus",
        "nics",
        "nvswitches",
        "relations",
        "pairing",
    ] {
        assert!(v.get(key).is_some(), "{key}");
    }
    let g = &v["gpus"][0];
    assert_eq!(g["bdf"], "0000:18:00.0");
    assert_eq!(g["numa_node"], 0);
    assert_eq!(g["model"], "H100-SXM5-80GB");
    assert!(g["pcie_path"].is_array());
    assert_eq!(v["nics"][0]["rdma_device"], "mlx5_0");
    assert_eq!(v["relations"]["0000:18:00.0"]["mlx5_0"], "PIX");
    assert_eq!(v["pairing"]["0000:18:00.0"], "mlx5_0");
}

fn all_paths(root: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(root).unwrap().flatten() {
        out.push(e.path());
        if e.file_type().unwrap().is_dir() {
            all_paths(&e.path(), out);
        }
    }
}

#[derive(Debug, Clone)]
enum Damage {
    Delete,
    Garbage(Vec<u8>),
    Dangle,
    Loop,
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        Just(Damage::Delete),
        proptest::collection::vec(any::<u8>(), 0..64).prop_map(Damage::Garbage),
        Just(Damage::Dangle),
        Just(Damage::Loop),
    ]
}

/// The undamaged tree's GPUs, found once per test process (the tree
/// itself is written again for each case: a tree kept in a static would
/// never be removed).
fn pristine_gpus() -> &'static Vec<Bdf> {
    static GPUS: std::sync::OnceLock<Vec<Bdf>> = std::sync::OnceLock::new();
    GPUS.get_or_init(|| {
        let dir = scratch();
        fixtures::write(&fixtures::machine("dgx-a100").unwrap(), dir.path()).unwrap();
        sysfs::discover(dir.path(), None)
            .unwrap()
            .gpus
            .iter()
            .map(|g| g.location.bdf)
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Garbled sysfs: deleted files, garbage contents, dangling and looping
    /// links. Discovery answers (with warnings) or errors; it never panics
    /// and never invents a GPU.
    #[test]
    fn garbled_trees_never_panic(picks in proptest::collection::vec((any::<prop::sample::Index>(), damage()), 1..12)) {
        let good = pristine_gpus();
        let dir = scratch();
        let root = dir.path().join("garbled");
        fixtures::write(&fixtures::machine("dgx-a100").unwrap(), &root).unwrap();
        let mut paths = Vec::new();
        all_paths(&root, &mut paths);
        for (idx, dmg) in picks {
            let p = idx.get(&paths).clone();
            let _ = if p.is_dir() && !p.is_symlink() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
            match dmg {
                Damage::Delete => {}
                Damage::Garbage(bytes) => { let _ = std::fs::write(&p, bytes); }
                Damage::Dangle => { let _ = std::os::unix::fs::symlink("../../nowhere/0000:99:00.0", &p); }
                Damage::Loop => { let _ = std::os::unix::fs::symlink(p.file_name().unwrap(), &p); }
            }
        }
        if let Ok(topo) = sysfs::discover(&root, None) {
            prop_assert!(topo.gpus.len() <= 8);
            prop_assert!(topo.gpus.iter().all(|g| good.contains(&g.location.bdf)));
            let _ = matrix::render(&topo);
            let _ = pairing(&topo);
        }
    }
}
