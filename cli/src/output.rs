//! Output: aligned tables for people, JSON for scripts.

use std::io::Write;

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
}

/// A table with a header row; columns are padded to their widest cell.
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|h| h.to_uppercase()).collect(),
            rows: Vec::new(),
        }
    }

    /// A row; control characters in a cell (what another person typed
    /// may hold terminal escapes) are shown as `�`, never sent to the
    /// terminal.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows
            .push(cells.into_iter().map(|c| printable(&c)).collect());
    }

    pub fn render(&self) -> String {
        let cols = self.header.len();
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate().take(cols) {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
        let mut out = String::new();
        for r in std::iter::once(&self.header).chain(self.rows.iter()) {
            let mut line = String::new();
            for (i, c) in r.iter().enumerate().take(cols) {
                if i + 1 < cols {
                    let pad = widths[i] - c.chars().count();
                    line.push_str(c);
                    line.push_str(&" ".repeat(pad + 2));
                } else {
                    line.push_str(c);
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `s` with every control character replaced by `�`.
pub fn printable(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '\u{fffd}' } else { c })
        .collect()
}

pub fn json<T: Serialize>(value: &T) -> String {
    let mut s = serde_json::to_string_pretty(value).unwrap_or_default();
    s.push('\n');
    s
}

/// `-` for absent values, so columns never collapse.
pub fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref()
        .map(ToString::to_string)
        .unwrap_or_else(|| "-".into())
}

/// `value` as JSON, or as the table `table` makes, as `fmt` says: every
/// command but `kumo audit` prints this way.
pub(crate) fn print_one<T: serde::Serialize>(
    out: &mut dyn Write,
    fmt: Format,
    value: &T,
    table: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    match fmt {
        Format::Json => write!(out, "{}", json(value))?,
        Format::Table => write!(out, "{}", table())?,
    }
    Ok(())
}

/// A queued VM's or cluster's place in the fair queue, for `show`.
pub fn queue_lines(q: &kumo_api_types::QueueStanding) -> String {
    format!(
        "Queue:   #{} since {}, {}\nEstimate: {}\nExpires: {} (delete it to cancel)\n",
        q.position,
        q.queued_at.to_rfc3339(),
        printable(&q.reason),
        q.estimate
            .map(|t| t.to_rfc3339())
            .unwrap_or_else(|| "none".into()),
        q.expires_at.to_rfc3339(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align() {
        let mut t = Table::new(&["name", "role"]);
        t.row(vec!["alice".into(), "owner".into()]);
        t.row(vec!["bo".into(), "viewer".into()]);
        assert_eq!(t.render(), "NAME   ROLE\nalice  owner\nbo     viewer\n");
    }

    #[test]
    fn wide_characters_count_once() {
        let mut t = Table::new(&["n", "x"]);
        t.row(vec!["雲".into(), "1".into()]);
        assert_eq!(t.render(), "N  X\n雲  1\n");
    }

    #[test]
    fn a_cell_never_sends_a_terminal_escape() {
        let mut t = Table::new(&["who", "why"]);
        t.row(vec!["alice".into(), "\u{1b}[2Jgone\r".into()]);
        let out = t.render();
        assert!(!out.contains('\u{1b}') && !out.contains('\r'), "{out:?}");
        assert!(out.contains("\u{fffd}[2Jgone\u{fffd}"), "{out:?}");
    }
}
