//! GPU telemetry a guest reports, mapped back to the host GPUs through the
//! guest layout of a fixture machine: what the host agent does with the
//! output of `nvidia-smi` and `dmesg` run in a VM.

use kumo_topology::gpu_telemetry::{
    guest_gpu_map, parse_query, parse_xids, to_host, xids_to_host, GpuSample,
};
use kumo_topology::guest_layout::{guest_layout, place, GuestLayout};
use kumo_topology::{Bdf, HostTopology};

use crate::common::discover_fixture;

/// The layout a VM with `gpus` gets: the placement and guest layout
/// `render` makes (see guest.rs), without the XML.
fn layout(topo: &HostTopology, gpus: &[Bdf]) -> GuestLayout {
    let placement = place(topo, gpus, 8 * gpus.len() as u32, 64 * gpus.len() as u32).unwrap();
    guest_layout(topo, &placement).unwrap()
}

/// A guest address as `nvidia-smi` prints it: 8-digit domain, uppercase.
fn smi_bus_id(b: Bdf) -> String {
    format!(
        "{:08X}:{:02X}:{:02X}.{:X}",
        b.domain, b.bus, b.device, b.function
    )
}

/// One `nvidia-smi` row per guest GPU, in the field order the query asks,
/// the values of a recorded H100 under load (see the module's tests) with
/// the index folded into memory used and power so rows tell apart.
fn smi_rows(guest: &[Bdf]) -> String {
    guest
        .iter()
        .enumerate()
        .map(|(i, b)| {
            format!(
                "{}, 100, {}, 81559, 59, 54, 63{i}.95, 0, 0x0000000000000000\n",
                smi_bus_id(*b),
                19818 + i
            )
        })
        .collect()
}

#[test]
fn samples_and_xids_map_back_to_the_host_gpus() {
    let (_dir, topo) = discover_fixture("hgx-h100");
    let gpus: Vec<Bdf> = topo.gpus.iter().map(|g| g.location.bdf).collect();
    assert_eq!(gpus.len(), 8);
    let layout = layout(&topo, &gpus);
    let map = guest_gpu_map(&layout, &gpus);
    assert_eq!(map.len(), 8, "every GPU has a guest address");
    // The guest numbers its buses from the expanders, not like the host.
    assert!(map
        .iter()
        .all(|(guest, _)| guest.domain == 0 && guest.bus >= 0x11));
    assert!(map.iter().any(|(guest, host)| guest != host));

    // The guest lists its GPUs in its own bus order, plus one the layout
    // never gave it (a guest that lies, or a device it emulates).
    let mut guest: Vec<Bdf> = map.keys().copied().collect();
    guest.push(Bdf::new(0, 0x05, 0, 0));
    let samples = parse_query(&smi_rows(&guest)).unwrap();
    assert_eq!(samples.len(), 9);
    let mapped = to_host(&layout, &gpus, samples.clone());
    assert_eq!(mapped.len(), 8, "the unknown GPU is dropped");
    let hosts: Vec<Bdf> = mapped.iter().map(|(h, _)| *h).collect();
    assert_eq!(hosts, gpus, "in the order of the host's GPUs");
    for (host, sample) in &mapped {
        let g = layout.guest_bdf(*host).unwrap();
        assert_eq!(sample.bus_id, g.to_string());
        let i = guest.iter().position(|b| *b == g).unwrap();
        assert_eq!(sample.memory_used_mib, Some(19818 + i as u64));
        assert_eq!(sample, &samples[i]);
    }

    // Xids: GPU 2's guest address has fallen off the bus, GPU 5's took an
    // ECC error; an Xid for an address that is no GPU of this VM is dropped.
    let g2 = layout.guest_bdf(gpus[2]).unwrap();
    let g5 = layout.guest_bdf(gpus[5]).unwrap();
    let xid_addr = |b: Bdf| format!("PCI:{:04x}:{:02x}:{:02x}", b.domain, b.bus, b.device);
    let log = format!(
        "[  100.000001] NVRM: Xid ({}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n\
         [  100.500000] NVRM: Xid (PCI:0000:05:00): 13, pid=1, name=x, Graphics Exception\n\
         6,900,101000000,-;NVRM: Xid ({}): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x7fffa8860 partition 7, subpartition 1.\n",
        xid_addr(g2),
        xid_addr(g5),
    );
    let xids = parse_xids(&log);
    assert_eq!(xids.len(), 3);
    let mapped = xids_to_host(&layout, &gpus, xids);
    let got: Vec<(Bdf, u32, Option<u64>)> = mapped
        .iter()
        .map(|(h, x)| (*h, x.code, x.since_boot_us))
        .collect();
    assert_eq!(
        got,
        vec![
            (gpus[2], 79, Some(100_000_001)),
            (gpus[5], 48, Some(101_000_000))
        ]
    );
}

#[test]
fn a_vm_with_some_gpus_maps_only_its_own() {
    let (_dir, topo) = discover_fixture("dgx-a100");
    let all: Vec<Bdf> = topo.gpus.iter().map(|g| g.location.bdf).collect();
    // GPUs from both ends of the machine: different NUMA nodes, expanders.
    let gpus = vec![all[0], all[7]];
    let layout = layout(&topo, &gpus);
    let g0 = layout.guest_bdf(gpus[0]).unwrap();
    let g7 = layout.guest_bdf(gpus[1]).unwrap();
    assert_ne!(
        layout.expander_of(gpus[0]).unwrap().index,
        layout.expander_of(gpus[1]).unwrap().index
    );
    // The other host GPUs are not in this layout: a sample that claims a
    // guest address equal to one of their host addresses maps to nothing.
    let samples = parse_query(&smi_rows(&[g7, g0, all[3]])).unwrap();
    let mapped = to_host(&layout, &all, samples);
    let hosts: Vec<Bdf> = mapped.iter().map(|(h, _)| *h).collect();
    assert_eq!(hosts, vec![all[0], all[7]]);
    assert_eq!(mapped[0].1.bus_id, g0.to_string());
    assert_eq!(mapped[1].1.bus_id, g7.to_string());

    // With no GPUs of the host named, nothing maps.
    assert!(to_host(&layout, &[], parse_query(&smi_rows(&[g0])).unwrap()).is_empty());
    // A sample repeated (not through parse_query, which refuses it) maps once.
    let s: Vec<GpuSample> = parse_query(&smi_rows(&[g0])).unwrap();
    let twice = vec![s[0].clone(), s[0].clone()];
    assert_eq!(to_host(&layout, &gpus, twice).len(), 1);
}
