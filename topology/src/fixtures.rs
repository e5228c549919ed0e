//! Sysfs trees of real GPU server designs, generated rather than copied:
//! each machine is a plain description here, and [`write`] lays it out as
//! directories, files and (relative) symlinks the way Linux does, so that
//! discovery runs on it exactly as on `/sys`.
//!
//! Sources for each design are cited on its function and in
//! `../shared/reference/topology.md`.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use crate::sysfs::{format_cpulist, Hints, NvLinkHint, HINTS_FILE};
use crate::{
    Bdf, CpuIdentity, CLASS_3D_CONTROLLER, CLASS_BRIDGE_OTHER, CLASS_BRIDGE_PCI, CLASS_ETHERNET,
    CLASS_INFINIBAND, CLASS_VGA, VENDOR_MELLANOX, VENDOR_NVIDIA,
};

pub const MACHINES: &[&str] = &[
    "dgx-a100",
    "hgx-h100",
    "hgx-h100-2nic",
    "hgx-h100-roce",
    "hgx-h200",
    "l40s-pcie",
    "cpu-only",
];

#[derive(Debug, Clone)]
pub struct Machine {
    pub name: &'static str,
    pub cpu: CpuIdentity,
    pub numa: Vec<NumaSpec>,
    pub complexes: Vec<Complex>,
    pub nvlinks: BTreeMap<Bdf, Vec<NvLinkHint>>,
    /// `address sizes` of the CPU, in bits physical.
    pub phys_bits: u8,
}

#[derive(Debug, Clone)]
pub struct NumaSpec {
    pub id: u32,
    pub cpus: Vec<u32>,
    pub memory_kib: u64,
}

/// A host bridge (`pci0000:00`) and what hangs below it.
#[derive(Debug, Clone)]
pub struct Complex {
    pub domain: u16,
    pub bus: u8,
    pub numa: Option<u32>,
    pub children: Vec<Node>,
}

#[derive(Debug, Clone)]
pub enum Node {
    Bridge {
        function: Function,
        children: Vec<Node>,
    },
    Endpoint(Function),
}

#[derive(Debug, Clone)]
pub struct Function {
    pub bdf: Bdf,
    pub class: u32,
    pub vendor: u16,
    pub device: u16,
    pub subsystem: (u16, u16),
    pub link_speed: &'static str,
    pub link_width: u32,
    pub driver: &'static str,
    pub rdma: Option<Rdma>,
    /// Memory BARs as `resource` lists them: (index, size, Linux flags).
    pub bars: &'static [(u8, u64, u64)],
}

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// Linux resource flags of a 64-bit prefetchable, a 64-bit and a 32-bit
/// memory BAR (`IORESOURCE_MEM | _PREFETCH | _MEM_64 | _SIZEALIGN` …).
const PREF64: u64 = 0x0014_220c;
const MEM64: u64 = 0x0014_0204;
const MEM32: u64 = 0x0004_0200;
/// Ampere cards (A100 40 GB, L40S 48 GB): registers in a 32-bit BAR0, the
/// framebuffer BAR1 (memory rounded up to a power of two) and BAR3, both
/// 64-bit prefetchable (`lspci -vv` of A100 40GB PCIe and SXM4 in
/// kata-containers#4358 and triton-inference-server#4154; L40S alike).
const AMPERE_64G_BARS: &[(u8, u64, u64)] = &[
    (0, 16 * MIB, MEM32),
    (1, 64 * GIB, PREF64),
    (3, 32 * MIB, PREF64),
];
/// Hopper SXM5: three 64-bit prefetchable BARs at 0, 2 and 4; BAR2 is
/// 128 GiB on H100 80 GB (`lspci -vv` in NVIDIA/nvtrust#128 and
/// fastfetch#1658), 256 GiB on H200 141 GB.
const H100_BARS: &[(u8, u64, u64)] = &[
    (0, 16 * MIB, PREF64),
    (2, 128 * GIB, PREF64),
    (4, 32 * MIB, PREF64),
];
const H200_BARS: &[(u8, u64, u64)] = &[
    (0, 16 * MIB, PREF64),
    (2, 256 * GIB, PREF64),
    (4, 32 * MIB, PREF64),
];
/// ConnectX-6/7 physical functions: one 32 MiB 64-bit prefetchable BAR0;
/// their VFs a 1 MiB one.
const CONNECTX_BARS: &[(u8, u64, u64)] = &[(0, 32 * MIB, PREF64)];
const CONNECTX_VF_BARS: &[(u8, u64, u64)] = &[(0, MIB, PREF64)];
const NVSWITCH_BARS: &[(u8, u64, u64)] = &[(0, 32 * MIB, MEM32)];
const SMALL_BARS: &[(u8, u64, u64)] = &[(0, 16 << 10, MEM64)];

#[derive(Debug, Clone)]
pub struct Rdma {
    pub name: String,
    pub netdev: String,
    pub rate: &'static str,
    pub link_layer: &'static str,
    pub total_vfs: u32,
    /// VFs enabled (`sriov_numvfs`), at functions 2, 3, … of the PF's device.
    pub num_vfs: u32,
}

const GEN4: &str = "16.0 GT/s PCIe";
const GEN5: &str = "32.0 GT/s PCIe";

fn bdf(bus: u8, device: u8, function: u8) -> Bdf {
    Bdf::new(0, bus, device, function)
}

fn bridge(at: Bdf, vendor: u16, device: u16, speed: &'static str, children: Vec<Node>) -> Node {
    Node::Bridge {
        function: Function {
            bdf: at,
            class: CLASS_BRIDGE_PCI,
            vendor,
            device,
            subsystem: (vendor, 0xa096),
            link_speed: speed,
            link_width: 16,
            driver: "pcieport",
            rdma: None,
            bars: &[],
        },
        children,
    }
}

/// A root port (AMD `1022:1483` or Intel `8086:352a`) holding one child.
fn root_port(at: Bdf, intel: bool, speed: &'static str, child: Node) -> Node {
    let (v, d) = if intel {
        (0x8086, 0x352a)
    } else {
        (0x1022, 0x1483)
    };
    bridge(at, v, d, speed, vec![child])
}

/// A PCIe switch: an upstream port at `up` and one downstream port per
/// child on the next bus (`bus+1:NN.0`).
fn switch(up: Bdf, vendor: u16, device: u16, speed: &'static str, children: Vec<Node>) -> Node {
    let down_bus = up.bus.wrapping_add(1);
    let downs = children
        .into_iter()
        .enumerate()
        .map(|(i, c)| bridge(bdf(down_bus, i as u8, 0), vendor, device, speed, vec![c]))
        .collect();
    bridge(up, vendor, device, speed, downs)
}

fn gpu(at: Bdf, device: u16, class: u32, speed: &'static str) -> Node {
    let bars = match device {
        0x2330 => H100_BARS,
        0x2335 => H200_BARS,
        _ => AMPERE_64G_BARS,
    };
    Node::Endpoint(Function {
        bars,
        bdf: at,
        class,
        vendor: VENDOR_NVIDIA,
        device,
        subsystem: (VENDOR_NVIDIA, 0x1490),
        link_speed: speed,
        link_width: 16,
        driver: "nvidia",
        rdma: None,
    })
}

fn nvswitch(at: Bdf, device: u16) -> Node {
    Node::Endpoint(Function {
        bdf: at,
        class: CLASS_BRIDGE_OTHER,
        vendor: VENDOR_NVIDIA,
        device,
        subsystem: (VENDOR_NVIDIA, 0x1600),
        link_speed: "8.0 GT/s PCIe",
        link_width: 2,
        driver: "nvidia",
        rdma: None,
        bars: NVSWITCH_BARS,
    })
}

#[allow(clippy::too_many_arguments)]
fn mlx(
    at: Bdf,
    device: u16,
    class: u32,
    name: &str,
    netdev: &str,
    rate: &'static str,
    link_layer: &'static str,
    speed: &'static str,
) -> Node {
    Node::Endpoint(Function {
        bdf: at,
        class,
        vendor: VENDOR_MELLANOX,
        device,
        subsystem: (VENDOR_MELLANOX, 0x0007),
        link_speed: speed,
        link_width: 16,
        driver: "mlx5_core",
        bars: CONNECTX_BARS,
        rdma: Some(Rdma {
            name: name.to_owned(),
            netdev: netdev.to_owned(),
            rate,
            link_layer,
            total_vfs: 16,
            // Ethernet ports serve RoCE segments through VFs.
            num_vfs: if link_layer == "Ethernet" { 4 } else { 0 },
        }),
    })
}

/// A DGX A100 ConnectX-6 HDR HCA.
fn cx6(bus: u8, name: &str, netdev: &str) -> Node {
    mlx(
        bdf(bus, 0, 0),
        0x101b,
        CLASS_INFINIBAND,
        name,
        netdev,
        "200 Gb/sec (4X HDR)",
        "InfiniBand",
        GEN4,
    )
}

/// Every GPU linked to every NVSwitch with the given link counts.
fn nvlink_hints(gpu_buses: &[u8], switches: &[(u8, u32)]) -> BTreeMap<Bdf, Vec<NvLinkHint>> {
    gpu_buses
        .iter()
        .map(|g| {
            let links = switches
                .iter()
                .map(|(s, n)| NvLinkHint {
                    target: bdf(*s, 0, 0),
                    count: *n,
                })
                .collect();
            (bdf(*g, 0, 0), links)
        })
        .collect()
}

fn plain(at: Bdf, class: u32, vendor: u16, device: u16, driver: &'static str) -> Node {
    Node::Endpoint(Function {
        bdf: at,
        class,
        vendor,
        device,
        subsystem: (vendor, 0x0000),
        link_speed: "8.0 GT/s PCIe",
        link_width: 4,
        driver,
        rdma: None,
        bars: SMALL_BARS,
    })
}

/// `count` cores per node with SMT siblings `smt_offset` higher.
fn smt_nodes(nodes: u32, cores_per_node: u32, smt_offset: u32, memory_kib: u64) -> Vec<NumaSpec> {
    (0..nodes)
        .map(|n| {
            let first = n * cores_per_node;
            let mut cpus: Vec<u32> = (first..first + cores_per_node).collect();
            cpus.extend((first + smt_offset)..(first + smt_offset + cores_per_node));
            NumaSpec {
                id: n,
                cpus,
                memory_kib,
            }
        })
        .collect()
}

/// DGX A100: 8 × A100-SXM4-40GB (`10de:20b0`) at buses 07 0f 47 4e 87 90
/// b7 bd, each behind a lower Broadcom `1000:c010` switch under an upper
/// one shared with its pair and two ConnectX-6 (`15b3:101b`) HCAs (GPU↔NIC
/// PXB); 6 NVSwitches (`10de:1af1`) at c4…c9 with 2 links from every GPU
/// (NV12); GPU pairs on NUMA nodes 3, 1, 7, 5 of an AMD Rome (family 23,
/// model 49) in NPS4; two more HCAs for storage.
/// Sources: the NCCL topology dump in NVIDIA/nccl issue #1505; the DGX
/// A100 user guide's `nvidia-smi topo -m`.
pub fn dgx_a100() -> Machine {
    const SW: (u16, u16) = (0x1000, 0xc010);
    let pair = |rc: u8, numa: u32, gpus: [u8; 2], nics: [(u8, &str, &str); 2]| {
        let lower = |up: u8, child: Node| switch(bdf(up, 0, 0), SW.0, SW.1, GEN4, vec![child]);
        let gpu_a = lower(
            gpus[0] - 4,
            gpu(bdf(gpus[0], 0, 0), 0x20b0, CLASS_3D_CONTROLLER, GEN4),
        );
        let nic_a = lower(nics[0].0 - 2, cx6(nics[0].0, nics[0].1, nics[0].2));
        let gpu_b = lower(
            gpus[1] - 2,
            gpu(bdf(gpus[1], 0, 0), 0x20b0, CLASS_3D_CONTROLLER, GEN4),
        );
        let nic_b = lower(nics[1].0 - 2, cx6(nics[1].0, nics[1].1, nics[1].2));
        let upper = switch(
            bdf(rc + 1, 0, 0),
            SW.0,
            SW.1,
            GEN4,
            vec![gpu_a, nic_a, gpu_b, nic_b],
        );
        Complex {
            domain: 0,
            bus: rc,
            numa: Some(numa),
            children: vec![root_port(bdf(rc, 1, 1), false, GEN4, upper)],
        }
    };
    let nvswitch_buses = [0xc4u8, 0xc5, 0xc6, 0xc7, 0xc8, 0xc9];
    let gpu_buses = [0x07u8, 0x0f, 0x47, 0x4e, 0x87, 0x90, 0xb7, 0xbd];
    let nvlinks = nvlink_hints(&gpu_buses, &nvswitch_buses.map(|s| (s, 2)));
    let mut nvswitch_ports = Vec::new();
    for (i, s) in nvswitch_buses.iter().enumerate() {
        nvswitch_ports.push(root_port(
            bdf(0xc0, 1 + i as u8, 1),
            false,
            GEN4,
            nvswitch(bdf(*s, 0, 0), 0x1af1),
        ));
    }
    let storage = Complex {
        domain: 0,
        bus: 0xe0,
        numa: Some(2),
        children: vec![root_port(
            bdf(0xe0, 1, 1),
            false,
            GEN4,
            switch(
                bdf(0xe1, 0, 0),
                SW.0,
                SW.1,
                GEN4,
                vec![
                    cx6(0xe3, "mlx5_4", "ibp227s0"),
                    cx6(0xe4, "mlx5_5", "ibp228s0"),
                ],
            ),
        )],
    };
    Machine {
        name: "dgx-a100",
        cpu: CpuIdentity {
            arch: "x86_64".into(),
            vendor: "AuthenticAMD".into(),
            family_id: 23,
            model_id: 49,
        },
        numa: smt_nodes(8, 16, 128, 132_000_000),
        complexes: vec![
            pair(
                0x00,
                3,
                [0x07, 0x0f],
                [(0x0c, "mlx5_0", "ibp12s0"), (0x12, "mlx5_1", "ibp18s0")],
            ),
            pair(
                0x40,
                1,
                [0x47, 0x4e],
                [(0x4b, "mlx5_2", "ibp75s0"), (0x54, "mlx5_3", "ibp84s0")],
            ),
            pair(
                0x80,
                7,
                [0x87, 0x90],
                [(0x8d, "mlx5_6", "ibp141s0"), (0x94, "mlx5_7", "ibp148s0")],
            ),
            pair(
                0xb0,
                5,
                [0xb7, 0xbd],
                [(0xba, "mlx5_8", "ibp186s0"), (0xc1, "mlx5_9", "ibp193s0")],
            ),
            Complex {
                domain: 0,
                bus: 0xc0,
                numa: Some(6),
                children: nvswitch_ports,
            },
            storage,
        ],
        nvlinks,
        phys_bits: 43,
    }
}

/// HGX H100 8-GPU: 8 × H100-SXM5-80GB (`10de:2330`), each with one
/// ConnectX-7 (`15b3:1021`) under the same Broadcom `1000:c030` Gen5
/// switch (GPU↔NIC PIX), each switch on its own host bridge; GPUs 0–3 on
/// NUMA 0 and 4–7 on NUMA 1 of an Intel Sapphire Rapids (family 6,
/// model 143); 4 NVSwitches (`10de:22a3`) at 05…08 with 4/5/5/4 links from
/// every GPU (NV18). `nics` picks which GPUs' switches carry a NIC.
/// Sources: NVIDIA/nccl issues #1264 and #1182 (`nvidia-smi nvlink -R`),
/// aliyun/SimAI issue #128; the DGX H100 `nvidia-smi topo -m`.
fn hgx_h100(name: &'static str, nic_on: &[usize]) -> Machine {
    hgx_hopper(name, 0x2330, nic_on)
}

/// HGX H200 8-GPU: the HGX H100 board with H200-SXM5-141GB (`10de:2335`)
/// GPUs, whose framebuffer BAR is 256 GiB.
fn hgx_h200() -> Machine {
    hgx_hopper("hgx-h200", 0x2335, &[0, 1, 2, 3, 4, 5, 6, 7])
}

fn hgx_hopper(name: &'static str, gpu_device: u16, nic_on: &[usize]) -> Machine {
    const SW: (u16, u16) = (0x1000, 0xc030);
    let gpu_buses = [0x18u8, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];
    let mut complexes = Vec::new();
    let mut nic_index = 0;
    for (i, g) in gpu_buses.iter().enumerate() {
        let rc = g - 3;
        let mut below = vec![gpu(bdf(*g, 0, 0), gpu_device, CLASS_3D_CONTROLLER, GEN5)];
        if nic_on.contains(&i) {
            let bus = g + 1;
            // The RoCE variant: the same ConnectX-7s as 400GbE ports.
            let roce = name.ends_with("-roce");
            below.push(mlx(
                bdf(bus, 0, 0),
                0x1021,
                if roce {
                    CLASS_ETHERNET
                } else {
                    CLASS_INFINIBAND
                },
                &format!("mlx5_{nic_index}"),
                &if roce {
                    format!("ens{bus}np0")
                } else {
                    format!("ibp{bus}s0")
                },
                "400 Gb/sec (4X NDR)",
                if roce { "Ethernet" } else { "InfiniBand" },
                GEN5,
            ));
            nic_index += 1;
        }
        complexes.push(Complex {
            domain: 0,
            bus: rc,
            numa: Some(if i < 4 { 0 } else { 1 }),
            children: vec![root_port(
                bdf(rc, 1, 0),
                true,
                GEN5,
                switch(bdf(rc + 1, 0, 0), SW.0, SW.1, GEN5, below),
            )],
        });
    }
    let switches = [(0x05u8, 4u32), (0x06, 5), (0x07, 5), (0x08, 4)];
    complexes.push(Complex {
        domain: 0,
        bus: 0x00,
        numa: Some(0),
        children: switches
            .iter()
            .enumerate()
            .map(|(i, (b, _))| {
                root_port(
                    bdf(0x00, 1 + i as u8, 0),
                    true,
                    GEN4,
                    nvswitch(bdf(*b, 0, 0), 0x22a3),
                )
            })
            .collect(),
    });
    let nvlinks = nvlink_hints(&gpu_buses, &switches);
    Machine {
        name,
        cpu: CpuIdentity {
            arch: "x86_64".into(),
            vendor: "GenuineIntel".into(),
            family_id: 6,
            model_id: 143,
        },
        numa: smt_nodes(2, 56, 112, 1_056_000_000),
        complexes,
        nvlinks,
        phys_bits: 46,
    }
}

/// A PCIe-card server: 4 × L40S (`10de:26b9`, class VGA) on root ports of
/// two sockets, no NVLink, one ConnectX-6 Dx (`15b3:101d`, RoCE) on
/// socket 0, an NVMe drive.
fn l40s_pcie() -> Machine {
    let socket = |rc: u8, numa: u32, with_nic: bool| {
        let mut ports = vec![
            root_port(
                bdf(rc, 1, 0),
                true,
                GEN4,
                gpu(bdf(rc + 1, 0, 0), 0x26b9, CLASS_VGA, GEN4),
            ),
            root_port(
                bdf(rc, 3, 0),
                true,
                GEN4,
                gpu(bdf(rc + 2, 0, 0), 0x26b9, CLASS_VGA, GEN4),
            ),
            root_port(
                bdf(rc, 5, 0),
                true,
                GEN4,
                plain(bdf(rc + 4, 0, 0), 0x010802, 0x144d, 0xa80a, "nvme"),
            ),
        ];
        if with_nic {
            ports.push(root_port(
                bdf(rc, 7, 0),
                true,
                GEN4,
                mlx(
                    bdf(rc + 3, 0, 0),
                    0x101d,
                    CLASS_ETHERNET,
                    "mlx5_0",
                    "ens7f0np0",
                    "100 Gb/sec (4X EDR)",
                    "Ethernet",
                    GEN4,
                ),
            ));
        }
        Complex {
            domain: 0,
            bus: rc,
            numa: Some(numa),
            children: ports,
        }
    };
    Machine {
        name: "l40s-pcie",
        cpu: CpuIdentity {
            arch: "x86_64".into(),
            vendor: "GenuineIntel".into(),
            family_id: 6,
            model_id: 143,
        },
        numa: smt_nodes(2, 32, 64, 528_000_000),
        complexes: vec![socket(0x00, 0, true), socket(0x80, 1, false)],
        nvlinks: BTreeMap::new(),
        phys_bits: 46,
    }
}

/// A CPU-only host: two sockets, an Intel Ethernet NIC, an NVMe drive.
fn cpu_only() -> Machine {
    Machine {
        name: "cpu-only",
        cpu: CpuIdentity {
            arch: "x86_64".into(),
            vendor: "AuthenticAMD".into(),
            family_id: 25,
            model_id: 17,
        },
        numa: smt_nodes(2, 32, 64, 264_000_000),
        complexes: vec![Complex {
            domain: 0,
            bus: 0x00,
            numa: Some(0),
            children: vec![
                root_port(
                    bdf(0x00, 1, 1),
                    false,
                    GEN4,
                    plain(bdf(0x01, 0, 0), CLASS_ETHERNET, 0x8086, 0x1521, "igb"),
                ),
                root_port(
                    bdf(0x00, 3, 1),
                    false,
                    GEN4,
                    plain(bdf(0x02, 0, 0), 0x010802, 0x144d, 0xa80a, "nvme"),
                ),
            ],
        }],
        nvlinks: BTreeMap::new(),
        phys_bits: 52,
    }
}

pub fn machine(name: &str) -> Option<Machine> {
    Some(match name {
        "dgx-a100" => dgx_a100(),
        "hgx-h100" => hgx_h100("hgx-h100", &[0, 1, 2, 3, 4, 5, 6, 7]),
        "hgx-h100-2nic" => hgx_h100("hgx-h100-2nic", &[0, 4]),
        "hgx-h100-roce" => hgx_h100("hgx-h100-roce", &[0, 1, 2, 3, 4, 5, 6, 7]),
        "hgx-h200" => hgx_h200(),
        "l40s-pcie" => l40s_pcie(),
        "cpu-only" => cpu_only(),
        _ => return None,
    })
}

/// Hex words of a CPU set as in `nodeN/cpumap` (most significant first).
pub fn cpumap(cpus: &[u32], total: u32) -> String {
    let words = total.div_ceil(32).max(1) as usize;
    let mut w = vec![0u32; words];
    for c in cpus {
        if let Some(word) = w.get_mut((*c / 32) as usize) {
            *word |= 1 << (c % 32);
        }
    }
    w.iter()
        .rev()
        .map(|x| format!("{x:08x}"))
        .collect::<Vec<_>>()
        .join(",")
}

struct Writer<'a> {
    root: &'a Path,
    next_group: u32,
    /// Where the next BAR goes, above and below 4 GiB (any addresses
    /// will do: discovery reads sizes, not places).
    next_high: u64,
    next_low: u64,
}

fn up(depth: usize) -> String {
    "../".repeat(depth)
}

impl Writer<'_> {
    fn file(&self, rel: &Path, content: &str) -> io::Result<()> {
        self.bytes(rel, content.as_bytes())
    }

    fn bytes(&self, rel: &Path, content: &[u8]) -> io::Result<()> {
        let p = self.root.join(rel);
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d)?;
        }
        std::fs::write(p, content)
    }

    fn link(&self, rel: &Path, target: &str) -> io::Result<()> {
        let p = self.root.join(rel);
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d)?;
        }
        std::os::unix::fs::symlink(target, p)
    }

    /// A `resource` file as Linux writes it: 13 lines (six BARs, the ROM,
    /// six bridge or SR-IOV windows), `start end flags`, unused all zero.
    fn resource(&mut self, bars: &[(u8, u64, u64)]) -> String {
        let mut lines = vec![(0u64, 0u64, 0u64); 13];
        for (index, size, flags) in bars {
            let next = if flags & 0x10_0000 != 0 {
                &mut self.next_high
            } else {
                &mut self.next_low
            };
            let start = next.div_ceil(*size) * size;
            *next = start + size;
            lines[usize::from(*index)] = (start, start + size - 1, *flags);
        }
        lines
            .iter()
            .map(|(a, b, f)| format!("0x{a:016x} 0x{b:016x} 0x{f:016x}\n"))
            .collect()
    }

    fn node(&mut self, parent: &Path, numa: Option<u32>, node: &Node) -> io::Result<()> {
        let (f, children) = match node {
            Node::Bridge { function, children } => (function, children.as_slice()),
            Node::Endpoint(function) => (function, &[][..]),
        };
        let dir = parent.join(f.bdf.to_string());
        let depth = dir.components().count();
        self.file(&dir.join("class"), &format!("0x{:06x}\n", f.class))?;
        self.file(&dir.join("vendor"), &format!("0x{:04x}\n", f.vendor))?;
        self.file(&dir.join("device"), &format!("0x{:04x}\n", f.device))?;
        self.file(
            &dir.join("subsystem_vendor"),
            &format!("0x{:04x}\n", f.subsystem.0),
        )?;
        self.file(
            &dir.join("subsystem_device"),
            &format!("0x{:04x}\n", f.subsystem.1),
        )?;
        self.file(
            &dir.join("numa_node"),
            &format!("{}\n", numa.map(i64::from).unwrap_or(-1)),
        )?;
        for prefix in ["max", "current"] {
            self.file(
                &dir.join(format!("{prefix}_link_speed")),
                &format!("{}\n", f.link_speed),
            )?;
            self.file(
                &dir.join(format!("{prefix}_link_width")),
                &format!("{}\n", f.link_width),
            )?;
        }
        // AER statistics, as Linux prints them, all clean.
        for (file, names, total) in [
            (
                "aer_dev_correctable",
                &["RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout"][..],
                "TOTAL_ERR_COR",
            ),
            (
                "aer_dev_nonfatal",
                &["Undefined", "DLP", "SDES", "TLP", "FCP"][..],
                "TOTAL_ERR_NONFATAL",
            ),
            (
                "aer_dev_fatal",
                &["Undefined", "DLP", "SDES", "TLP", "FCP"][..],
                "TOTAL_ERR_FATAL",
            ),
        ] {
            let body: String = names.iter().map(|n| format!("{n} 0\n")).collect();
            self.file(&dir.join(file), &format!("{body}{total} 0\n"))?;
        }
        // The first bytes of config space (vendor, device), as the kernel
        // serves them live, and a reset method (the kernel's file takes a
        // write of `1`).
        let config = match node {
            // Under the root complex: root ports; below them switches,
            // upstream then downstream ports, alternating.
            Node::Bridge { .. } => {
                // `devices/pciDDDD:BB/<bdf>…`: 3 components for a root port.
                let port_type = match depth.saturating_sub(3) {
                    0 => crate::PORT_ROOT,
                    l if l % 2 == 1 => crate::PORT_UPSTREAM,
                    _ => crate::PORT_DOWNSTREAM,
                };
                bridge_config(f.vendor, f.device, port_type, Some(crate::ACS_REQUIRED))
            }
            Node::Endpoint(_) => {
                let mut c = vec![0u8; 64];
                c[..2].copy_from_slice(&f.vendor.to_le_bytes());
                c[2..4].copy_from_slice(&f.device.to_le_bytes());
                c
            }
        };
        self.bytes(&dir.join("config"), &config)?;
        self.file(&dir.join("reset"), "")?;
        let resource = self.resource(f.bars);
        self.file(&dir.join("resource"), &resource)?;
        let group = self.next_group;
        self.next_group += 1;
        std::fs::create_dir_all(
            self.root
                .join(format!("kernel/iommu_groups/{group}/devices")),
        )?;
        self.link(
            &dir.join("iommu_group"),
            &format!("{}kernel/iommu_groups/{group}", up(depth)),
        )?;
        std::fs::create_dir_all(self.root.join(format!("bus/pci/drivers/{}", f.driver)))?;
        self.link(
            &dir.join("driver"),
            &format!("{}bus/pci/drivers/{}", up(depth), f.driver),
        )?;
        self.link(
            &PathBuf::from(format!("bus/pci/devices/{}", f.bdf)),
            &format!("../../../{}", dir.display()),
        )?;
        if let Some(r) = &f.rdma {
            self.file(&dir.join("sriov_totalvfs"), &format!("{}\n", r.total_vfs))?;
            self.file(&dir.join("sriov_numvfs"), &format!("{}\n", r.num_vfs))?;
            for i in 0..r.num_vfs {
                let vf = Function {
                    bdf: Bdf::new(f.bdf.domain, f.bdf.bus, 0, 2 + i as u8),
                    device: f.device + 1,
                    rdma: None,
                    bars: CONNECTX_VF_BARS,
                    ..f.clone()
                };
                let vf_dir = parent.join(vf.bdf.to_string());
                self.node(parent, numa, &Node::Endpoint(vf.clone()))?;
                self.link(&dir.join(format!("virtfn{i}")), &format!("../{}", vf.bdf))?;
                self.link(&vf_dir.join("physfn"), &format!("../{}", f.bdf))?;
            }
            let ib = PathBuf::from(format!("class/infiniband/{}", r.name));
            self.link(&ib.join("device"), &format!("../../../{}", dir.display()))?;
            self.file(&ib.join("ports/1/rate"), &format!("{}\n", r.rate))?;
            self.file(
                &ib.join("ports/1/link_layer"),
                &format!("{}\n", r.link_layer),
            )?;
            self.file(&ib.join("ports/1/state"), "4: ACTIVE\n")?;
            for c in crate::health::PORT_COUNTERS {
                self.file(&ib.join("ports/1/hw_counters").join(c), "0\n")?;
            }
            let net = PathBuf::from(format!("class/net/{}", r.netdev));
            self.link(&net.join("device"), &format!("../../../{}", dir.display()))?;
            self.file(&net.join("carrier_changes"), "1\n")?;
        }
        for c in children {
            self.node(&dir, numa, c)?;
        }
        Ok(())
    }
}

/// A PCIe bridge's config space as root reads it (4096 bytes): its ids,
/// a PCIe capability of `port_type` at 0x40 and, with `acs_control`, an
/// ACS extended capability at 0x100 offering every control the
/// readiness check asks for, with `acs_control` on.
pub fn bridge_config(vendor: u16, device: u16, port_type: u8, acs_control: Option<u16>) -> Vec<u8> {
    let mut c = vec![0u8; 4096];
    c[..2].copy_from_slice(&vendor.to_le_bytes());
    c[2..4].copy_from_slice(&device.to_le_bytes());
    // Status: a capability list; header type 1 (a bridge).
    c[0x06] = 0x10;
    c[0x0e] = 0x01;
    c[0x34] = 0x40;
    c[0x40] = 0x10;
    c[0x41] = 0x00;
    c[0x42..0x44].copy_from_slice(&(2u16 | (u16::from(port_type) << 4)).to_le_bytes());
    if let Some(control) = acs_control {
        c[0x100..0x104].copy_from_slice(&(0x000du32 | (1 << 16)).to_le_bytes());
        c[0x104..0x106].copy_from_slice(&crate::ACS_REQUIRED.to_le_bytes());
        c[0x106..0x108].copy_from_slice(&control.to_le_bytes());
    }
    c
}

/// Lays the machine out under `root` (which must be empty or absent).
pub fn write(m: &Machine, root: &Path) -> io::Result<()> {
    std::fs::create_dir_all(root)?;
    let mut w = Writer {
        root,
        next_group: 0,
        next_high: 1 << 44,
        next_low: 0xc000_0000,
    };
    let total: u32 = m.numa.iter().map(|n| n.cpus.len() as u32).sum();
    for n in &m.numa {
        let dir = PathBuf::from(format!("devices/system/node/node{}", n.id));
        w.file(
            &dir.join("cpulist"),
            &format!("{}\n", format_cpulist(&n.cpus)),
        )?;
        w.file(
            &dir.join("cpumap"),
            &format!("{}\n", cpumap(&n.cpus, total)),
        )?;
        w.file(
            &dir.join("meminfo"),
            &format!(
                "Node {} MemTotal:       {} kB\nNode {} MemFree:        {} kB\n",
                n.id,
                n.memory_kib,
                n.id,
                n.memory_kib / 2
            ),
        )?;
    }
    // Hugepages reserved for guest memory: 1 GiB pages for nine tenths
    // of the host's memory, all free.
    let gib: u64 = m.numa.iter().map(|n| n.memory_kib).sum::<u64>() >> 20;
    let pages = gib * 9 / 10;
    for (file, n) in [("nr_hugepages", pages), ("free_hugepages", pages)] {
        w.file(
            &PathBuf::from("kernel/mm/hugepages/hugepages-1048576kB").join(file),
            &format!("{n}\n"),
        )?;
    }
    std::fs::create_dir_all(root.join("bus/pci/devices"))?;
    for c in &m.complexes {
        let rc = PathBuf::from(format!("devices/pci{:04x}:{:02x}", c.domain, c.bus));
        std::fs::create_dir_all(root.join(&rc))?;
        for child in &c.children {
            w.node(&rc, c.numa, child)?;
        }
    }
    let hints = Hints {
        cpu: Some(m.cpu.clone()),
        nvlinks: m.nvlinks.clone(),
        phys_bits: Some(m.phys_bits),
    };
    let json = serde_json::to_string_pretty(&hints).map_err(io::Error::other)?;
    std::fs::write(root.join(HINTS_FILE), json + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpumaps_are_most_significant_word_first() {
        assert_eq!(cpumap(&[0, 1, 2, 3], 64), "00000000,0000000f");
        assert_eq!(cpumap(&[32], 64), "00000001,00000000");
    }

    #[test]
    fn every_listed_machine_exists() {
        for name in MACHINES {
            assert_eq!(machine(name).unwrap().name, *name);
        }
        assert!(machine("nope").is_none());
    }
}
