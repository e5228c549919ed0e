//! The manual (`docs/`, an mdBook) is tested where it can go stale without
//! a fleet: every command line of ours in its `sh` blocks (and in the files
//! it includes: the README, ARCHITECTURE, BENCHMARKS, RELIABILITY) is read
//! by the real binary, and every link between its pages names a page and a
//! heading that exist. The README's quick start is also run (`readme::`).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::harness::bin;

/// The binaries whose command lines the manual shows.
const OURS: &[&str] = &["kumo", "kumo-server", "kumo-agent", "kumo-vxlan"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Every Markdown page under `dir`.
fn pages(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            pages(&p, out);
        } else if p.extension().is_some_and(|x| x == "md") {
            out.push(p);
        }
    }
}

/// The book's pages, and the files outside `docs/src` they include (whole:
/// a command outside an included part is checked too).
fn book_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    pages(&repo().join("docs/src"), &mut files);
    let mut included = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for (i, _) in text.match_indices("{{#include ") {
            let rest = &text[i + "{{#include ".len()..];
            let target = rest[..rest.find("}}").unwrap()].trim();
            let target = target.split(':').next().unwrap();
            let p = f.parent().unwrap().join(target);
            assert!(
                p.is_file(),
                "{} includes {target}, which is missing",
                f.display()
            );
            included.push(p.canonicalize().unwrap());
        }
    }
    included.sort();
    included.dedup();
    files.extend(included);
    files
}

/// The text of the `sh`/`bash` fenced blocks of a Markdown file.
pub fn sh_blocks(md: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur: Option<String> = None;
    for line in md.lines() {
        let t = line.trim();
        if t.starts_with("```") {
            match cur.take() {
                Some(block) => out.push(block),
                None if t == "```sh" || t == "```bash" => cur = Some(String::new()),
                None => cur = Some(String::from("\u{0}")), // another language: skipped
            }
            continue;
        }
        if let Some(b) = cur.as_mut() {
            b.push_str(line);
            b.push('\n');
        }
    }
    out.retain(|b| !b.starts_with('\u{0}'));
    out
}

/// The simple commands of a shell script, as words: quotes removed, a
/// command substitution's commands listed on their own (its word is
/// `SUBST`), comments, redirections and their targets dropped, and `;`,
/// `|`, `&`, `&&`, `||` and newlines ending a command. Enough shell for
/// the manual's lines, not all of it.
pub fn shell_commands(script: &str) -> Vec<Vec<String>> {
    let script = script.replace("\\\n", " ");
    let chars: Vec<char> = script.chars().collect();
    let mut out = Vec::new();
    let mut words: Vec<String> = Vec::new();
    let mut word: Option<String> = None;
    let mut skip_next_word = false;
    let mut i = 0;
    let end_word = |word: &mut Option<String>, words: &mut Vec<String>, skip: &mut bool| {
        if let Some(w) = word.take() {
            if *skip {
                *skip = false;
            } else {
                words.push(w);
            }
        }
    };
    while i < chars.len() {
        let c = chars[i];
        match c {
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                i += 1;
                while i < chars.len() && chars[i] != '\'' {
                    w.push(chars[i]);
                    i += 1;
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    if chars[i] == '\\' && i + 1 < chars.len() {
                        i += 1;
                        w.push(chars[i]);
                    } else if chars[i] == '$' && chars.get(i + 1) == Some(&'(') {
                        let (inner, next) = substitution(&chars, i + 2);
                        out.extend(shell_commands(&inner));
                        w.push_str("SUBST");
                        i = next;
                        continue;
                    } else {
                        w.push(chars[i]);
                    }
                    i += 1;
                }
            }
            '\\' => {
                if let Some(n) = chars.get(i + 1) {
                    word.get_or_insert_with(String::new).push(*n);
                    i += 1;
                }
            }
            '$' if chars.get(i + 1) == Some(&'(') => {
                let (inner, next) = substitution(&chars, i + 2);
                out.extend(shell_commands(&inner));
                word.get_or_insert_with(String::new).push_str("SUBST");
                i = next;
                continue;
            }
            '#' if word.is_none() => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
                continue;
            }
            '<' | '>' => {
                // `2>` and the like: the digits were the redirection's.
                if word
                    .as_deref()
                    .is_some_and(|w| w.chars().all(|d| d.is_ascii_digit()))
                {
                    word = None;
                }
                end_word(&mut word, &mut words, &mut skip_next_word);
                while i < chars.len() && matches!(chars[i], '<' | '>' | '&') {
                    i += 1;
                }
                skip_next_word = true;
                continue;
            }
            ';' | '|' | '&' | '\n' => {
                end_word(&mut word, &mut words, &mut skip_next_word);
                if !words.is_empty() {
                    out.push(std::mem::take(&mut words));
                }
            }
            c if c.is_whitespace() => end_word(&mut word, &mut words, &mut skip_next_word),
            c => word.get_or_insert_with(String::new).push(c),
        }
        i += 1;
    }
    end_word(&mut word, &mut words, &mut skip_next_word);
    if !words.is_empty() {
        out.push(words);
    }
    out
}

/// The text of a `$(…)` whose body starts at `start`, and the index after
/// its `)`.
fn substitution(chars: &[char], start: usize) -> (String, usize) {
    let (mut depth, mut i) = (1, start);
    let mut quote: Option<char> = None;
    while i < chars.len() {
        match (quote, chars[i]) {
            (None, '\'' | '"') => quote = Some(chars[i]),
            (Some(q), c) if c == q => quote = None,
            (None, '(') => depth += 1,
            (None, ')') => {
                depth -= 1;
                if depth == 0 {
                    return (chars[start..i].iter().collect(), i + 1);
                }
            }
            _ => {}
        }
        i += 1;
    }
    panic!("unclosed $( in {:?}", chars.iter().collect::<String>());
}

/// A command of ours: the binary's name and its arguments, with variable
/// assignments, `sudo -u USER` and the directory of a path such as
/// `target/debug/kumo-agent` taken off.
pub fn ours(words: &[String]) -> Option<(String, Vec<String>)> {
    let mut w = words;
    while let Some(first) = w.first() {
        let is_assignment = first.split_once('=').is_some_and(|(k, _)| {
            !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        });
        if is_assignment {
            w = &w[1..];
        } else if first == "sudo" {
            w = &w[1..];
            if w.first().is_some_and(|f| f == "-u") {
                w = &w[2.min(w.len())..];
            }
        } else {
            break;
        }
    }
    let prog = w.first()?.rsplit('/').next()?.to_owned();
    OURS.contains(&prog.as_str())
        .then(|| (prog, w[1..].to_vec()))
}

#[test]
fn every_command_line_in_the_book_parses_with_the_real_binaries() {
    let mut checked = 0;
    let mut failures = Vec::new();
    for file in book_files() {
        let md = std::fs::read_to_string(&file).unwrap();
        for block in sh_blocks(&md) {
            for words in shell_commands(&block) {
                let Some((prog, mut args)) = ours(&words) else {
                    continue;
                };
                // What follows `--` is the remote command (`kumo vm ssh`).
                if let Some(i) = args.iter().position(|a| a == "--") {
                    args.truncate(i);
                }
                // `[--netns NAME]`: usage's notation for what may be left out.
                let mut optional = false;
                args.retain(|a| {
                    let keep = !optional && !a.starts_with('[');
                    optional = (optional || a.starts_with('[')) && !a.ends_with(']');
                    keep
                });
                // Clap reads every subcommand, flag and value up to
                // `--help`, then prints the help of the deepest subcommand:
                // an unknown subcommand or flag, or a bad value, fails.
                args.push("--help".into());
                let out = Command::new(bin(&prog)).args(&args).output().unwrap();
                checked += 1;
                if !out.status.success() {
                    failures.push(format!(
                        "{}: {prog} {}\n{}",
                        file.display(),
                        args.join(" "),
                        String::from_utf8_lossy(&out.stderr).trim()
                    ));
                }
            }
        }
    }
    assert!(checked > 80, "only {checked} command lines found");
    assert!(
        failures.is_empty(),
        "{} of {checked} command lines in the book do not parse:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// A heading's anchor as mdBook (and GitHub) make it.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '-' || c == '_' {
                Some(c.to_lowercase().next().unwrap_or(c))
            } else if c.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

fn anchors(md: &str) -> Vec<String> {
    let mut fence = false;
    let mut out = Vec::new();
    for line in md.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
        } else if !fence && line.starts_with('#') {
            out.push(slug(line.trim_start_matches('#')));
        }
    }
    out
}

/// The text of a page as mdBook renders it: `{{#include FILE}}` and
/// `{{#include FILE:ANCHOR}}` (the lines between `ANCHOR: name` and
/// `ANCHOR_END: name`) expanded.
fn rendered(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = String::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("{{#include ") {
        out.push_str(&rest[..i]);
        let after = &rest[i + "{{#include ".len()..];
        let end = after.find("}}").unwrap();
        let (file, anchor) = after[..end]
            .trim()
            .split_once(':')
            .unwrap_or((after[..end].trim(), ""));
        let included = std::fs::read_to_string(path.parent().unwrap().join(file)).unwrap();
        if anchor.is_empty() {
            out.push_str(&included);
        } else {
            let mut inside = false;
            for line in included.lines() {
                if line.contains(&format!("ANCHOR: {anchor}")) {
                    inside = true;
                } else if line.contains(&format!("ANCHOR_END: {anchor}")) {
                    inside = false;
                } else if inside && !line.contains("ANCHOR") {
                    out.push_str(line);
                    out.push('\n');
                }
            }
            assert!(
                !out.is_empty(),
                "{}: no anchor {anchor} in {file}",
                path.display()
            );
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    out
}

/// Relative links of a Markdown text, outside code.
fn links(md: &str) -> Vec<String> {
    let mut fence = false;
    let mut out = Vec::new();
    for line in md.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        if fence {
            continue;
        }
        for (i, _) in line.match_indices("](") {
            let rest = &line[i + 2..];
            let Some(end) = rest.find(')') else { continue };
            let target = &rest[..end];
            if !target.contains("://") && !target.starts_with("mailto:") {
                out.push(target.to_owned());
            }
        }
    }
    out
}

#[test]
fn links_between_the_books_pages_and_from_the_readme_reach_their_page_and_heading() {
    let mut files = Vec::new();
    pages(&repo().join("docs/src"), &mut files);
    files.push(repo().join("README.md"));
    let mut broken = Vec::new();
    let mut seen = 0;
    for file in &files {
        for link in links(&rendered(file)) {
            seen += 1;
            let (path, anchor) = link.split_once('#').unwrap_or((&link, ""));
            let target = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            // The book's build copies the OpenAPI document beside its pages.
            if path == "openapi.json" && file.starts_with(repo().join("docs/src")) {
                continue;
            }
            if !target.exists() {
                broken.push(format!("{}: {link} (no such file)", file.display()));
            } else if !anchor.is_empty() && !anchors(&rendered(&target)).iter().any(|a| a == anchor)
            {
                broken.push(format!("{}: {link} (no such heading)", file.display()));
            }
        }
    }
    assert!(seen > 50, "only {seen} links found");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn shell_lines_are_read_as_the_shell_reads_them() {
    let cmds = shell_commands(
        "X=$(kumo b list -o json | jq -r '.[0].id'); kumo c \"$X\"  # note\n\
         kumo d --x \"a b\" > /etc/f 2>&1\nsudo -u kumo kumo-server admin \\\n  recover\n",
    );
    let words: Vec<String> = cmds.iter().map(|c| c.join(" ")).collect();
    assert_eq!(
        words,
        [
            "kumo b list -o json",
            "jq -r .[0].id",
            "X=SUBST",
            "kumo c $X",
            "kumo d --x a b",
            "sudo -u kumo kumo-server admin recover",
        ]
    );
    let w = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
    assert_eq!(
        ours(&w("sudo -u kumo kumo-server admin recover")),
        Some(("kumo-server".into(), w("admin recover")))
    );
    assert_eq!(
        ours(&w("target/debug/kumo-agent topology")),
        Some(("kumo-agent".into(), w("topology")))
    );
    assert_eq!(ours(&w("jq -r .x")), None);
    assert_eq!(ours(&w("X=SUBST")), None);
    assert_eq!(slug("How a GPU VM is shaped"), "how-a-gpu-vm-is-shaped");
    assert_eq!(slug("Quick start (Debian 12)"), "quick-start-debian-12");
}
