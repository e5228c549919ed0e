//! The README is tested: its quick start's command blocks, in order, as a
//! newcomer would paste them, against `kumo-server dev` (what `./x start`
//! runs), with the real `kumo`.

use std::process::Command;

use crate::harness::{bin, scratch};

/// The commands of the README's "Quick start" section: every line of its
/// `sh` blocks but `./x` itself (this is its test), comments cut off.
pub fn quick_start_commands(readme: &str) -> Vec<String> {
    section_commands(readme, "## Quick start")
}

/// The commands of the `sh` blocks of the section under `heading` (a
/// level-2 heading's start) of a Markdown page, as
/// [`quick_start_commands`] reads them.
pub fn section_commands(md: &str, heading: &str) -> Vec<String> {
    let start = md
        .find(&format!("\n{heading}"))
        .unwrap_or_else(|| panic!("a section {heading:?}"));
    let rest = &md[start + 1..];
    let section = &rest[..rest[3..].find("\n## ").map_or(rest.len(), |i| i + 3)];
    let mut out = Vec::new();
    let mut in_sh = false;
    for line in section.lines() {
        if line.trim_start().starts_with("```") {
            in_sh = !in_sh && line.trim() == "```sh";
            continue;
        }
        if !in_sh {
            continue;
        }
        // A comment starts at "  #" (the README aligns them) or a line's "#".
        let cmd = line.split("  #").next().unwrap_or("").trim();
        if cmd.is_empty() || cmd.starts_with('#') || cmd.starts_with("./x") {
            continue;
        }
        out.push(cmd.to_owned());
    }
    out
}

/// What the test cannot do as a newcomer would, and why.
fn adapted(cmd: &str) -> Option<String> {
    // An interactive terminal session (the console tests drive it).
    if cmd.starts_with("kumo vm console") {
        return None;
    }
    // The README says the edge follows within a second: a person typing
    // the next command gives it that.
    if cmd.starts_with("kumo public-ip attach") || cmd.starts_with("kumo port-forward create") {
        return Some(format!("{cmd}; sleep 2"));
    }
    // Not into the test machine's /etc.
    Some(cmd.replace("/etc/bash_completion.d/kumo", "\"$WORK/kumo.bash\""))
}

#[test]
fn the_readme_quick_start_runs_against_a_dev_fleet() {
    let readme = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"),
    )
    .unwrap();
    let commands = quick_start_commands(&readme);
    assert!(commands.len() > 40, "{commands:?}");
    let work = scratch();
    // The README's paths are relative to the checkout, where `./x start`
    // keeps its data in `.kumo`; its address is 127.0.0.1:8080.
    let data = work.path().join(".kumo");
    std::fs::create_dir_all(&data).unwrap();
    let (mut server, url) = crate::dev::start_dev_with(&data, 4);
    let mut script = String::from(
        "set -eE -o pipefail\ntrap 'echo \"README command failed: $BASH_COMMAND\" >&2' ERR\n",
    );
    for c in commands.iter().filter_map(|c| adapted(c)) {
        script.push_str(&format!("echo {} >&2\n", shell_quote(&format!("$ {c}"))));
        script.push_str(&c.replace("http://127.0.0.1:8080", &url));
        script.push('\n');
    }
    let kumo_dir = bin("kumo").parent().unwrap().to_path_buf();
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(work.path())
        .env("HOME", work.path().join("home"))
        .env("WORK", work.path())
        .env(
            "PATH",
            format!(
                "{}:{}",
                kumo_dir.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .output()
        .unwrap();
    server.stop();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the README's quick start:\n{}",
        tail(&said, 60)
    );
    assert!(
        said.contains("$ kumo tenant list -o json"),
        "every command ran: {}",
        tail(&said, 20)
    );
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

fn tail(s: &str, lines: usize) -> String {
    let v: Vec<&str> = s.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

#[test]
fn quick_start_commands_are_read_from_sh_blocks_only() {
    let md = "# K\n## Quick start\ntext\n```sh\n./x start\nkumo a  # note\n# only a comment\nX=$(kumo b -o json | jq -r .x); kumo c \"$X\"\n```\n```toml\nk = 1\n```\n## Next\n```sh\nkumo z\n```\n";
    assert_eq!(
        quick_start_commands(md),
        ["kumo a", "X=$(kumo b -o json | jq -r .x); kumo c \"$X\""]
    );
}
