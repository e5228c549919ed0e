//! Line charts of a VM's GPUs over a window (utilisation, memory): one
//! line per GPU, broken where the guest said nothing, with axes, units, a
//! legend and an empty state. Plain SVG, no script.

use std::fmt::Write;

use crate::diagram::esc;

/// One GPU's values: `(minutes from the window's start, value)`;
/// `None` or a missing step is a gap.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub label: String,
    pub points: Vec<(i64, Option<f64>)>,
}

/// What one chart shows.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart<'a> {
    pub title: &'a str,
    /// The value axis' unit (`%`, `GiB`).
    pub unit: &'a str,
    /// The value axis' top; 0: the largest value (at least 1).
    pub max: f64,
    /// The window's length and its time labels `(minutes from the start,
    /// text)`.
    pub minutes: i64,
    pub ticks: &'a [(i64, String)],
    /// Steps further apart than this are not joined.
    pub step_minutes: i64,
    /// What to say when no GPU has a value.
    pub empty: &'a str,
}

const COLOURS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2",
];

fn fmt_value(v: f64) -> String {
    if v >= 10.0 || v == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// The chart as SVG.
pub fn line_chart(c: &Chart<'_>, series: &[Series]) -> String {
    let (w, h, left, right, top, bottom) = (720i64, 220i64, 48i64, 12i64, 24i64, 36i64);
    let plot_w = (w - left - right) as f64;
    let plot_h = (h - top - bottom) as f64;
    let largest = series
        .iter()
        .flat_map(|s| s.points.iter().filter_map(|p| p.1))
        .fold(0.0_f64, f64::max);
    let max = if c.max > 0.0 { c.max } else { largest.max(1.0) };
    let minutes = c.minutes.max(1) as f64;
    let x = |m: i64| left as f64 + plot_w * (m as f64 / minutes).clamp(0.0, 1.0);
    let y = |v: f64| top as f64 + plot_h * (1.0 - (v / max).clamp(0.0, 1.0));
    let mut s = String::new();
    let _ = write!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" class="chart gpu-chart" role="img" aria-label="{t}" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="11"><text x="{left}" y="14" font-weight="bold">{t} ({u})</text>"##,
        t = esc(c.title),
        u = esc(c.unit),
    );
    // The value axis: 0, half and the top, with grid lines.
    for f in [0.0, 0.5, 1.0] {
        let v = max * f;
        let _ = write!(
            s,
            r##"<line x1="{left}" y1="{yy:.1}" x2="{x2}" y2="{yy:.1}" stroke="#ddd"/><text x="{tx}" y="{ty:.1}" text-anchor="end">{v} {u}</text>"##,
            yy = y(v),
            x2 = w - right,
            tx = left - 4,
            ty = y(v) + 4.0,
            v = fmt_value(v),
            u = esc(c.unit),
        );
    }
    // The time axis.
    let _ = write!(
        s,
        r##"<line x1="{left}" y1="{b}" x2="{x2}" y2="{b}" stroke="#555"/>"##,
        b = h - bottom,
        x2 = w - right,
    );
    for (m, label) in c.ticks {
        let _ = write!(
            s,
            r##"<line x1="{xx:.1}" y1="{b}" x2="{xx:.1}" y2="{b2}" stroke="#555"/><text x="{xx:.1}" y="{ty}" text-anchor="middle">{l}</text>"##,
            xx = x(*m),
            b = h - bottom,
            b2 = h - bottom + 4,
            ty = h - bottom + 16,
            l = esc(label),
        );
    }
    if largest == 0.0
        && series
            .iter()
            .all(|s| s.points.iter().all(|p| p.1.is_none()))
    {
        let _ = write!(
            s,
            r##"<text class="empty" x="{cx}" y="{cy}" text-anchor="middle" fill="#555">{e}</text></svg>"##,
            cx = left + (w - left - right) / 2,
            cy = top + (h - top - bottom) / 2,
            e = esc(c.empty),
        );
        return s;
    }
    for (i, se) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let mut runs: Vec<Vec<(i64, f64)>> = Vec::new();
        let mut last: Option<i64> = None;
        for &(m, v) in &se.points {
            let Some(v) = v else {
                last = None;
                continue;
            };
            let joined = last.is_some_and(|l| m - l <= c.step_minutes);
            if !joined {
                runs.push(Vec::new());
            }
            if let Some(r) = runs.last_mut() {
                r.push((m, v));
            }
            last = Some(m);
        }
        for run in runs {
            if run.len() == 1 {
                let (m, v) = run[0];
                let _ = write!(
                    s,
                    r##"<circle class="line" data-gpu="{l}" cx="{cx:.1}" cy="{cy:.1}" r="2" fill="{colour}"/>"##,
                    l = esc(&se.label),
                    cx = x(m),
                    cy = y(v),
                );
                continue;
            }
            let pts: Vec<String> = run
                .iter()
                .map(|&(m, v)| format!("{:.1},{:.1}", x(m), y(v)))
                .collect();
            let _ = write!(
                s,
                r##"<polyline class="line" data-gpu="{l}" fill="none" stroke="{colour}" stroke-width="1.5" points="{p}"/>"##,
                l = esc(&se.label),
                p = pts.join(" "),
            );
        }
    }
    s.push_str("</svg>");
    // The legend: a swatch and the GPU's name in text.
    s.push_str(r#"<ul class="legend">"#);
    for (i, se) in series.iter().enumerate() {
        let _ = write!(
            s,
            r##"<li><svg width="12" height="12" aria-hidden="true"><rect width="12" height="12" fill="{c}"/></svg> {l}</li>"##,
            c = COLOURS[i % COLOURS.len()],
            l = esc(&se.label),
        );
    }
    s.push_str("</ul>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart<'a>(ticks: &'a [(i64, String)]) -> Chart<'a> {
        Chart {
            title: "GPU utilisation",
            unit: "%",
            max: 100.0,
            minutes: 1440,
            ticks,
            step_minutes: 10,
            empty: "No figures yet",
        }
    }

    #[test]
    fn lines_break_where_the_guest_said_nothing() {
        let ticks = vec![(0, "00:00".to_string()), (720, "12:00".to_string())];
        let s = Series {
            label: "GPU 0000:18:00.0".into(),
            points: vec![
                (0, Some(50.0)),
                (10, Some(100.0)),
                (20, None),
                (30, Some(0.0)),
                (40, Some(0.0)),
                (200, Some(10.0)),
            ],
        };
        let svg = line_chart(&chart(&ticks), &[s]);
        assert_eq!(svg.matches("<polyline").count(), 2, "{svg}");
        assert_eq!(
            svg.matches("<circle").count(),
            1,
            "the lone point after the gap"
        );
        assert!(
            svg.contains(">12:00</text>") && svg.contains(">100 %</text>"),
            "{svg}"
        );
        assert!(svg.contains("0000:18:00.0</li>"), "a legend: {svg}");
        // 100 % sits at the top of the plot, 0 % at the bottom.
        assert!(svg.contains("48.0,24.0 ") || svg.contains(",24.0"), "{svg}");
    }

    #[test]
    fn no_figures_say_so() {
        let svg = line_chart(
            &chart(&[]),
            &[Series {
                label: "g".into(),
                points: vec![(0, None)],
            }],
        );
        assert!(svg.contains("No figures yet"), "{svg}");
        assert!(!svg.contains("<polyline"));
    }
}
