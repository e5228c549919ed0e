use std::path::Path;

use kumo_topology::{fixtures, sysfs, HostTopology};

/// A scratch directory on tmpfs when there is one: a fixture is ~1,600
/// small files, which this machine's disk writes 50 times slower.
pub fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(d) = tempfile::Builder::new().prefix("kumo-topo").tempdir_in(shm) {
            return d;
        }
    }
    tempfile::tempdir().unwrap()
}

pub fn discover_fixture(name: &str) -> (tempfile::TempDir, HostTopology) {
    let dir = scratch();
    let root = dir.path().join(name);
    fixtures::write(&fixtures::machine(name).unwrap(), &root).unwrap();
    let topo = sysfs::discover(&root, None).unwrap();
    assert!(topo.warnings.is_empty(), "{name}: {:?}", topo.warnings);
    (dir, topo)
}
