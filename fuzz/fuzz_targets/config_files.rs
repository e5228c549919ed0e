//! The files an operator writes: the server's TOML configuration (parsed,
//! then resolved with its defaults and checks) and a host's topology hints
//! file (`kumo-hints.json`, read by discovery). Either is taken or refused
//! with an error; nothing panics, and a refusal says which file.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

fn scratch() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("kumo-fuzz-config-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("a scratch directory");
        d
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((kind, body)) = data.split_first() else {
        return;
    };
    let dir = scratch();
    if kind % 2 == 0 {
        let path = dir.join("kumo.toml");
        std::fs::write(&path, body).expect("writing the file");
        let args = kumo_server::config::ServeArgs {
            config: Some(path.clone()),
            ..Default::default()
        };
        if let Err(e) = kumo_server::config::Config::load(&args) {
            let said = e.to_string();
            assert!(!said.is_empty());
        }
    } else {
        let path = dir.join("kumo-hints.json");
        std::fs::write(&path, body).expect("writing the file");
        match kumo_topology::sysfs::discover(&kumo_fuzz::fixture_tree("hgx-h100-roce"), Some(&path))
        {
            Ok(topo) => kumo_fuzz::exercise_topology(&topo),
            Err(e) => assert!(e.to_string().contains("kumo-hints.json"), "{e}"),
        }
    }
});
