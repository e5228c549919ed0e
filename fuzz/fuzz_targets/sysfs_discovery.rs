//! `sysfs::discover` over a garbled copy of a real machine's sysfs tree:
//! files rewritten, removed or turned into links, links pointed elsewhere
//! (loops included). Discovery must answer — a topology with warnings, or
//! an error — and whatever it answers must survive everything done with a
//! topology afterwards.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
enum Change {
    Write(Vec<u8>),
    Remove,
    /// The entry becomes a link to this (relative) target.
    Link(String),
    /// The entry becomes a link to one of the tree's own entries.
    LinkTo(u16),
}

#[derive(Debug, Arbitrary)]
struct Input {
    machine: u8,
    changes: Vec<(u16, Change)>,
}

enum Original {
    File(Vec<u8>),
    Link(PathBuf),
}

struct Tree {
    root: PathBuf,
    /// Every file and link in the tree, with what it held.
    entries: Vec<(PathBuf, Original)>,
}

fn walk(dir: &Path, out: &mut Vec<(PathBuf, Original)>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
    paths.sort();
    for p in paths {
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            if let Ok(t) = std::fs::read_link(&p) {
                out.push((p, Original::Link(t)));
            }
        } else if meta.is_dir() {
            walk(&p, out);
        } else if let Ok(bytes) = std::fs::read(&p) {
            out.push((p, Original::File(bytes)));
        }
    }
}

fn trees() -> &'static Vec<Tree> {
    static TREES: OnceLock<Vec<Tree>> = OnceLock::new();
    TREES.get_or_init(|| {
        kumo_fuzz::MACHINES
            .iter()
            .map(|name| {
                let root = kumo_fuzz::fixture_tree(name);
                let mut entries = Vec::new();
                walk(&root, &mut entries);
                Tree { root, entries }
            })
            .collect()
    })
}

/// Whatever is at `p` now (file, link or directory) goes.
fn clear(p: &Path) {
    if std::fs::remove_file(p).is_err() {
        let _ = std::fs::remove_dir_all(p);
    }
}

fn restore(p: &Path, o: &Original) {
    clear(p);
    match o {
        Original::File(b) => std::fs::write(p, b).expect("restoring a file"),
        Original::Link(t) => std::os::unix::fs::symlink(t, p).expect("restoring a link"),
    }
}

fuzz_target!(|input: Input| {
    let trees = trees();
    let tree = &trees[usize::from(input.machine) % trees.len()];
    if tree.entries.is_empty() {
        return;
    }
    let mut touched = Vec::new();
    for (i, change) in input.changes.iter().take(16) {
        let idx = usize::from(*i) % tree.entries.len();
        let path = &tree.entries[idx].0;
        clear(path);
        let _ = match change {
            Change::Write(b) => std::fs::write(path, b),
            Change::Remove => Ok(()),
            Change::Link(t) => std::os::unix::fs::symlink(t, path),
            Change::LinkTo(j) => {
                let target = &tree.entries[usize::from(*j) % tree.entries.len()].0;
                std::os::unix::fs::symlink(target, path)
            }
        };
        touched.push(idx);
    }
    if let Ok(topo) = kumo_topology::sysfs::discover(&tree.root, None) {
        kumo_fuzz::exercise_topology(&topo);
    }
    touched.sort_unstable();
    touched.dedup();
    for idx in touched {
        let (p, o) = &tree.entries[idx];
        restore(p, o);
    }
});
