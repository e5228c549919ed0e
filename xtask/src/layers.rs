//! The control plane's architecture invariants, checked over its source
//! text: every `crate::…` path (and every `super::` that climbs out of a
//! layer's folder) in a file names a module its layer may use, and crates
//! outside `control-plane` reach into it only where allowed.
//!
//! The layers, lowest first (see ARCHITECTURE.md, "Architecture
//! invariants"): the foundation (`error`, `clock`, `config`, `entity`,
//! `db`, `metrics`, `signals`, `leases`, `oidc`, `consoles`), `domain/`, `store/`, `context`,
//! `app/`, `http/`, and the composition root (`server`, `dev`, `lib`,
//! `main`), which may use everything.

use std::path::{Path, PathBuf};

/// Where a file of `control-plane/src` sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layer {
    Foundation,
    Domain,
    Store,
    Context,
    App,
    Http,
    Root,
}

const FOUNDATION: &[&str] = &[
    "error", "clock", "config", "entity", "db", "backup", "metrics", "signals", "leases", "oidc",
    "consoles",
];

impl Layer {
    /// The layer of a top-level module name (`crate::<name>`).
    fn of_module(name: &str) -> Option<Layer> {
        Some(match name {
            "domain" => Layer::Domain,
            "store" => Layer::Store,
            "context" => Layer::Context,
            "app" => Layer::App,
            "http" => Layer::Http,
            "server" | "dev" | "main" | "lib" | "bench" => Layer::Root,
            n if FOUNDATION.contains(&n) => Layer::Foundation,
            _ => return None,
        })
    }

    /// The layer of a file, from its path relative to `src/`.
    pub fn of_file(rel: &Path) -> Option<Layer> {
        let first = rel.components().next()?.as_os_str().to_str()?;
        Layer::of_module(first.strip_suffix(".rs").unwrap_or(first))
    }

    /// Which layers a file of this layer may import from.
    fn may_use(self, other: Layer) -> bool {
        use Layer::*;
        match self {
            Foundation => matches!(other, Foundation | Domain),
            Domain => matches!(other, Domain) || other == Foundation,
            Store => matches!(other, Store | Domain | Foundation),
            Context => matches!(other, Context | Store | Domain | Foundation),
            App => matches!(other, App | Context | Store | Domain | Foundation),
            Http => other != Root,
            Root => true,
        }
    }
}

/// The domain may use only `error` of the foundation: it has no database,
/// configuration or clock of its own.
fn domain_may_use_module(name: &str) -> bool {
    matches!(name, "domain" | "error")
}

/// One import that goes the wrong way.
#[derive(Debug, PartialEq, Eq)]
pub struct Violation {
    pub file: PathBuf,
    pub line: usize,
    pub text: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {}", self.file.display(), self.line, self.text)
    }
}

/// The top-level module names a line's `crate::` paths start with,
/// including those inside a grouped `use crate::{a, b::c}`.
fn crate_modules(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("crate::") {
        // `kumo_crate::` or `some_crate::` are not ours.
        let before = rest[..at].chars().next_back();
        let after = &rest[at + "crate::".len()..];
        rest = after;
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(group) = after.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.push(name);
                }
            }
        } else {
            let name: String = after
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.push(name);
            }
        }
    }
    out
}

/// How many folders a `super::super::…` path climbs.
fn super_depth(line: &str) -> usize {
    line.split_whitespace()
        .filter_map(|w| {
            w.trim_start_matches(['(', '&', '!'])
                .strip_prefix("super::")
        })
        .map(|rest| 1 + rest.matches("super::").count())
        .max()
        .unwrap_or(0)
}

/// Checks one file's text; `rel` is its path under `src/`.
pub fn check_file(rel: &Path, text: &str) -> Vec<Violation> {
    let Some(layer) = Layer::of_file(rel) else {
        return vec![Violation {
            file: rel.to_owned(),
            line: 0,
            text: "a module outside the known layers: add it to one".into(),
        }];
    };
    // A file nested n folders deep may climb n-1 `super::` and stay in
    // its layer (`store/x.rs` → `super::` is `store`).
    let depth = rel.components().count().saturating_sub(1);
    let mut out = Vec::new();
    let mut in_tests = false;
    for (i, line) in text.lines().enumerate() {
        in_tests |= line.trim() == "#[cfg(test)]";
        let code = line.split("//").next().unwrap_or("");
        // One clock: below the HTTP edge, time comes from the state's
        // clock (or the caller), so tests can move it. The one exception
        // says why on its line.
        if matches!(layer, Layer::Domain | Layer::Store | Layer::App)
            && !in_tests
            && code.contains("Utc::now()")
            && !line.contains("// wall clock:")
        {
            out.push(Violation {
                file: rel.to_owned(),
                line: i + 1,
                text: format!(
                    "{layer:?} reads the system clock; take the state's clock: {}",
                    line.trim()
                ),
            });
        }
        for m in crate_modules(code) {
            let Some(target) = Layer::of_module(&m) else {
                continue; // a macro or a re-export of lib.rs
            };
            let ok = if layer == Layer::Domain {
                domain_may_use_module(&m)
            } else {
                layer.may_use(target)
            };
            if !ok {
                out.push(Violation {
                    file: rel.to_owned(),
                    line: i + 1,
                    text: format!(
                        "{layer:?} may not use crate::{m} ({target:?}): {}",
                        line.trim()
                    ),
                });
            }
        }
        // `use super::*;` is the inline test module's look at its own file.
        let own_tests = code.trim() == "use super::*;";
        if !own_tests && super_depth(code) > depth && layer != Layer::Root {
            out.push(Violation {
                file: rel.to_owned(),
                line: i + 1,
                text: format!("`super::` climbs out of {layer:?}: {}", line.trim()),
            });
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Which crates outside the control plane may name `kumo_server`, and
/// which of its modules: the integration tests drive the whole server;
/// the fuzz targets parse configuration files.
const OUTSIDE: &[(&str, &[&str])] = &[("tests", &["*"]), ("fuzz", &["config"])];

/// Checks the control plane's layers and the crates that use it.
pub fn check(root: &Path) -> Vec<Violation> {
    let src = root.join("control-plane/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut out = Vec::new();
    for f in &files {
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        let rel = f.strip_prefix(&src).unwrap_or(f);
        out.extend(check_file(rel, &text));
    }
    let Ok(entries) = std::fs::read_dir(root) else {
        return out;
    };
    let mut crates: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    crates.sort();
    for dir in crates {
        let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name == "control-plane" || name == "xtask" || name == "target" || name.starts_with('.') {
            continue;
        }
        let allowed = OUTSIDE
            .iter()
            .find(|(c, _)| *c == name)
            .map(|(_, m)| *m)
            .unwrap_or(&[]);
        let mut files = Vec::new();
        rust_files(&dir, &mut files);
        for f in files {
            let Ok(text) = std::fs::read_to_string(&f) else {
                continue;
            };
            for (i, line) in text.lines().enumerate() {
                let mut rest = line;
                while let Some(at) = rest.find("kumo_server::") {
                    let after = &rest[at + "kumo_server::".len()..];
                    rest = after;
                    let m: String = after
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !(allowed.contains(&"*") || allowed.contains(&m.as_str())) {
                        out.push(Violation {
                            file: f.strip_prefix(root).unwrap_or(&f).to_owned(),
                            line: i + 1,
                            text: format!("{name} may not use kumo_server::{m}"),
                        });
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bad(rel: &str, text: &str) -> bool {
        !check_file(Path::new(rel), text).is_empty()
    }

    #[test]
    fn upward_imports_are_caught() {
        assert!(bad("store/vms.rs", "use crate::app::audit;"));
        assert!(bad("store/vms.rs", "use crate::http::api::vms::to_api;"));
        assert!(bad("store/vms.rs", "use crate::context::AppState;"));
        assert!(bad("domain/ipam.rs", "use crate::store::segments;"));
        assert!(bad("domain/ipam.rs", "use crate::config::Config;"));
        assert!(bad(
            "app/vms.rs",
            "    crate::http::api::vms::list(st).await"
        ));
        assert!(bad("app/vms.rs", "use crate::{store, http};"));
        assert!(bad(
            "app/jobs/reclaimer.rs",
            "use crate::server::RunningServer;"
        ));
        assert!(bad("error.rs", "use crate::app::auth;"));
        assert!(bad("store/vms.rs", "use super::super::app::vms;"));
        assert!(bad("brand_new.rs", ""));
        assert!(bad("app/vms.rs", "    let now = Utc::now();"));
        assert!(bad("store/vms.rs", "        at: Set(chrono::Utc::now()),"));
    }

    #[test]
    fn downward_imports_pass() {
        assert!(!bad("http/api/vms.rs", "use crate::app::vms::act;"));
        assert!(!bad(
            "app/vms.rs",
            "use crate::store::vms::{event, stored_spec};"
        ));
        assert!(!bad("store/vms.rs", "use crate::entity::{tenants, vms};"));
        assert!(!bad(
            "store/clusters.rs",
            "use super::segments::networks_of;"
        ));
        assert!(!bad(
            "domain/ipam.rs",
            "use crate::error::ApiError; // crate::app in a comment"
        ));
        assert!(!bad("server.rs", "use crate::http::router::router;"));
        assert!(!bad("app/vms.rs", "let x = kumo_crate::store::thing;"));
        assert!(!bad("http/api/vms.rs", "let now = Utc::now();"));
        assert!(!bad(
            "domain/ipam.rs",
            "#[cfg(test)]\nmod tests {\n    let now = Utc::now();"
        ));
    }

    /// The tree as it is holds every invariant.
    #[test]
    fn the_tree_holds_its_layers() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let v = check(&root);
        assert!(
            v.is_empty(),
            "{}",
            v.iter()
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}
