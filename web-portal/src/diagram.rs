//! A VM's topology as an SVG drawn on the server: a column per guest NUMA
//! cell (with the host node it is pinned to), and in it each GPU beside
//! the NIC paired with it inside the PCIe switch they share, with host and
//! guest bus addresses and the GPU's NVLink count.

use std::fmt::Write;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cell {
    pub guest_node: u32,
    pub host_node: u32,
    pub vcpus: String,
    pub memory_mib: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nic {
    pub name: String,
    /// The host function passed through (a PF, or a VF for RoCE).
    pub host_bdf: String,
    pub guest_bdf: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    pub model: String,
    pub host_bdf: String,
    pub guest_bdf: String,
    pub guest_node: u32,
    pub nic: Option<Nic>,
    /// The PCIe switch above the GPU (and its NIC) on the host.
    pub switch: Option<String>,
    /// NVLink links from the GPU (to NVSwitches or peers); 0: none.
    pub nvlinks: u32,
}

pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const COL: i64 = 330;
const ROW: i64 = 86;
const HEAD: i64 = 56;

pub fn topology_svg(cells: &[Cell], gpus: &[Gpu]) -> String {
    let rows = cells
        .iter()
        .map(|c| gpus.iter().filter(|g| g.guest_node == c.guest_node).count() as i64)
        .max()
        .unwrap_or(0)
        .max(1);
    let width = COL * cells.len().max(1) as i64 + 20;
    let height = HEAD + rows * ROW + 30;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" class="topology" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">"#
    );
    for (i, c) in cells.iter().enumerate() {
        let x = 10 + COL * i as i64;
        let _ = write!(
            s,
            r##"<g class="cell" data-guest-node="{gn}"><rect x="{x}" y="10" width="{w}" height="{h}" rx="6" fill="#f3f6fa" stroke="#12355b"/><text x="{tx}" y="28" font-weight="bold">NUMA {gn} (host node {hn})</text><text x="{tx}" y="44">vCPUs {v} · {m} MiB</text>"##,
            gn = c.guest_node,
            hn = c.host_node,
            w = COL - 20,
            h = height - 20,
            tx = x + 10,
            v = esc(&c.vcpus),
            m = c.memory_mib,
        );
        for (r, g) in gpus
            .iter()
            .filter(|g| g.guest_node == c.guest_node)
            .enumerate()
        {
            let top = HEAD + ROW * r as i64;
            if let Some(sw) = &g.switch {
                let _ = write!(
                    s,
                    r##"<g class="switch"><rect x="{rx}" y="{top}" width="{rw}" height="{rh}" rx="4" fill="none" stroke="#8a97a8" stroke-dasharray="4 3"/><text x="{tx}" y="{ty}" font-size="9" fill="#5a6778">PCIe switch {sw}</text></g>"##,
                    rx = x + 5,
                    rw = COL - 30,
                    rh = ROW - 6,
                    tx = x + 10,
                    ty = top + 11,
                    sw = esc(sw),
                );
            }
            let y = top + 15;
            let nvlink = if g.nvlinks > 0 {
                format!("NVLink ×{}", g.nvlinks)
            } else {
                String::new()
            };
            let _ = write!(
                s,
                r##"<g class="gpu" data-host="{hb}"><rect x="{gx}" y="{y}" width="140" height="64" rx="4" fill="#76b900" fill-opacity="0.18" stroke="#3f6b00"/><text x="{tx}" y="{t1}" font-weight="bold">{model}</text><text x="{tx}" y="{t2}">host {hb}</text><text x="{tx}" y="{t3}">guest {gb}</text><text class="nvlink" x="{tx}" y="{t4}">{nvlink}</text></g>"##,
                gx = x + 10,
                tx = x + 16,
                t1 = y + 15,
                t2 = y + 29,
                t3 = y + 43,
                t4 = y + 57,
                model = esc(&g.model),
                hb = esc(&g.host_bdf),
                gb = esc(&g.guest_bdf),
            );
            if let Some(n) = &g.nic {
                let _ = write!(
                    s,
                    r##"<line x1="{lx1}" y1="{ly}" x2="{lx2}" y2="{ly}" stroke="#12355b" stroke-width="2"/><g class="nic" data-host="{hb}"><rect x="{nx}" y="{y}" width="140" height="64" rx="4" fill="#0a6ebd" fill-opacity="0.15" stroke="#0a4f86"/><text x="{tx}" y="{t1}" font-weight="bold">{name}</text><text x="{tx}" y="{t2}">host {hb}</text><text x="{tx}" y="{t3}">guest {gb}</text></g>"##,
                    lx1 = x + 150,
                    lx2 = x + 165,
                    ly = y + 32,
                    nx = x + 165,
                    tx = x + 171,
                    t1 = y + 15,
                    t2 = y + 29,
                    t3 = y + 43,
                    name = esc(&n.name),
                    hb = esc(&n.host_bdf),
                    gb = esc(n.guest_bdf.as_deref().unwrap_or("—")),
                );
            }
        }
        s.push_str("</g>");
    }
    s.push_str("</svg>");
    s
}

/// The words of a bar chart: its unit, what it shows (for screen
/// readers) and what an empty one says.
pub struct BarWords<'a> {
    pub unit: &'a str,
    pub title: &'a str,
    pub empty: &'a str,
}

/// A bar per `(label, value)` (e.g. points per day) on a y-axis from 0 to
/// the largest value (rounded up to a readable one) in `unit`; labels
/// every few bars so they stay readable; `empty` across it when every
/// value is 0.
pub fn bar_chart(bars: &[(String, f64)], words: &BarWords<'_>) -> String {
    let (w, h, left, pad) = (720i64, 200i64, 64i64, 30i64);
    let max = nice_ceiling(bars.iter().map(|b| b.1).fold(0.0_f64, f64::max));
    let n = bars.len().max(1) as i64;
    let step = (w - left - pad) / n;
    let base = h - pad;
    let mut s = String::new();
    let _ = write!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" aria-label="{title}" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="10"><line x1="{left}" y1="{base}" x2="{x2}" y2="{base}" stroke="#888"/><line x1="{left}" y1="{pad}" x2="{left}" y2="{base}" stroke="#888"/><text class="unit" x="4" y="{uy}">{unit}</text>"##,
        title = esc(words.title),
        x2 = w - pad,
        uy = pad - 12,
        unit = esc(words.unit),
    );
    // The y-axis: 0, half and the top, with light grid lines.
    for frac in [0.0, 0.5, 1.0] {
        let y = base - ((h - 2 * pad) as f64 * frac).round() as i64;
        let _ = write!(
            s,
            r##"<line x1="{left}" y1="{y}" x2="{x2}" y2="{y}" stroke="#e2e8f0"/><text class="tick" x="{tx}" y="{ty}" text-anchor="end">{v}</text>"##,
            x2 = w - pad,
            tx = left - 4,
            ty = y + 3,
            v = format_tick(max * frac),
        );
    }
    let every = (bars.len() / 8).max(1);
    for (i, (label, v)) in bars.iter().enumerate() {
        let bh = if max > 0.0 {
            ((v / max) * (h - 2 * pad) as f64).round() as i64
        } else {
            0
        };
        let x = left + step * i as i64;
        let _ = write!(
            s,
            r##"<rect class="bar" data-label="{l}" x="{x}" y="{y}" width="{bw}" height="{bh}" fill="#12355b"><title>{l}: {v}</title></rect>"##,
            l = esc(label),
            y = base - bh,
            bw = (step - 2).max(1),
        );
        if i % every == 0 {
            let _ = write!(
                s,
                r#"<text x="{x}" y="{ty}">{l}</text>"#,
                ty = base + 14,
                l = esc(label),
            );
        }
    }
    if bars.iter().all(|b| b.1 <= 0.0) {
        let _ = write!(
            s,
            r##"<text class="empty" x="{x}" y="{y}" text-anchor="middle" font-size="12" fill="#4a5568">{e}</text>"##,
            x = (left + w - pad) / 2,
            y = h / 2,
            e = esc(words.empty),
        );
    }
    s.push_str("</svg>");
    s
}

/// The smallest 1, 2 or 5 × 10ⁿ at or above `v` (1 for nothing), so the
/// axis reads in round numbers.
fn nice_ceiling(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let mag = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|c| *c >= v)
        .unwrap_or(10.0 * mag)
}

fn format_tick(v: f64) -> String {
    if v >= 10.0 || v == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WORDS: BarWords<'static> = BarWords {
        unit: "JPY",
        title: "Usage",
        empty: "Nothing charged",
    };

    #[test]
    fn bars_scale_to_a_round_top_with_an_axis_and_unit() {
        let svg = bar_chart(&[("11-01".into(), 10.0), ("11-02".into(), 5.0)], &WORDS);
        assert_eq!(svg.matches("class=\"bar\"").count(), 2);
        assert!(
            svg.contains("height=\"140\"") && svg.contains("height=\"70\""),
            "{svg}"
        );
        assert!(
            svg.contains(">JPY</text>")
                && svg.contains(">10</text>")
                && svg.contains(">5.0</text>"),
            "{svg}"
        );
        assert!(
            svg.contains(r#"role="img" aria-label="Usage""#) && !svg.contains("Nothing charged")
        );
        // 7 reads on an axis up to 10, 130 on one up to 200.
        let svg = bar_chart(&[("a".into(), 7.0), ("b".into(), 130.0)], &WORDS);
        assert!(
            svg.contains(">200</text>") && svg.contains(">100</text>"),
            "{svg}"
        );
        let empty = bar_chart(&[("11-01".into(), 0.0)], &WORDS);
        assert!(
            empty.contains("Nothing charged") && empty.ends_with("</svg>"),
            "{empty}"
        );
        assert!(bar_chart(&[], &WORDS).contains("Nothing charged"));
    }

    #[test]
    fn gpus_sit_in_their_cells_beside_their_nics() {
        let cells = [
            Cell {
                guest_node: 0,
                host_node: 3,
                vcpus: "0-7".into(),
                memory_mib: 1024,
            },
            Cell {
                guest_node: 1,
                host_node: 5,
                vcpus: "8-15".into(),
                memory_mib: 1024,
            },
        ];
        let gpu = |n: u32, host: &str| Gpu {
            model: "H100 <SXM>".into(),
            host_bdf: host.into(),
            guest_bdf: "0000:21:00.0".into(),
            guest_node: n,
            nic: Some(Nic {
                name: "mlx5_0".into(),
                host_bdf: "0000:19:00.2".into(),
                guest_bdf: Some("0000:22:00.0".into()),
            }),
            switch: Some("0000:15:00.0".into()),
            nvlinks: 18,
        };
        let svg = topology_svg(&cells, &[gpu(0, "0000:18:00.0"), gpu(1, "0000:9a:00.0")]);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert_eq!(svg.matches("class=\"cell\"").count(), 2);
        assert_eq!(svg.matches("class=\"gpu\"").count(), 2);
        assert_eq!(svg.matches("class=\"nic\"").count(), 2);
        assert!(svg.contains("NUMA 1 (host node 5)"));
        assert!(svg.contains("H100 &lt;SXM&gt;"), "escaped");
        assert_eq!(svg.matches("class=\"switch\"").count(), 2);
        assert!(svg.contains("PCIe switch 0000:15:00.0") && svg.contains("NVLink ×18"));
        // The second GPU is drawn in the second column.
        let second = svg.find("data-guest-node=\"1\"").unwrap();
        assert!(svg[second..].contains("0000:9a:00.0"));
        assert!(!svg[..second].contains("0000:9a:00.0"));
    }
}
