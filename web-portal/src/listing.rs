//! The pages that show one kind of resource (clusters, segments, members,
//! tokens, and the admin's hosts, tenants, rates, join tokens): sections of
//! tables, row buttons and forms, described as plain data and drawn by one
//! template, so every such page has the same shape, escaping and CSRF
//! fields.

use askama::Template;

/// A table cell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cell {
    Text(String),
    /// Monospace: addresses, ids, matrices.
    Code(String),
    Link {
        href: String,
        text: String,
    },
    /// A VM or host state: the attribute keeps the API's word, live
    /// updates find it by `data-state`.
    State {
        word: String,
        label: String,
    },
    /// A button that posts the page's CSRF token to `action`.
    Button {
        action: String,
        label: String,
    },
}

impl Cell {
    pub fn text(s: impl Into<String>) -> Cell {
        Cell::Text(s.into())
    }
}

/// How a form field is entered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    Text,
    Number,
    /// `(value, label)`; the first is chosen.
    Select(Vec<(String, String)>),
    Checkbox,
    TextArea,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub label: String,
    pub input: Input,
    pub required: bool,
    pub placeholder: String,
}

impl Field {
    pub fn new(name: &str, label: &str, input: Input) -> Field {
        Field {
            name: name.into(),
            label: label.into(),
            input,
            required: false,
            placeholder: String::new(),
        }
    }

    pub fn required(mut self) -> Field {
        self.required = true;
        self
    }

    pub fn placeholder(mut self, p: &str) -> Field {
        self.placeholder = p.into();
        self
    }
}

/// A form posting to `action` (with the CSRF token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Form {
    pub action: String,
    pub submit: String,
    pub fields: Vec<Field>,
}

/// A part of the page under its own heading.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Section {
    pub heading: String,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Cell>>,
    /// What a table without rows says instead.
    pub empty: String,
    /// Server-drawn SVG (charts, heatmaps): trusted, not escaped.
    pub svg: Option<String>,
    /// Preformatted text (a topology matrix).
    pub pre: Option<String>,
    pub form: Option<Form>,
}

/// A whole page's content (the layout adds the header and navigation).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Listing {
    pub heading: String,
    /// A refusal from the last form, shown at the top.
    pub error: Option<String>,
    /// Shown once and prominently (a new token's secret).
    pub notice: Option<String>,
    pub sections: Vec<Section>,
}

#[derive(Template)]
#[template(path = "listing.html")]
struct ListingHtml<'a> {
    l: &'a Listing,
    csrf: &'a str,
}

pub(crate) fn render(l: &Listing, csrf: &str) -> String {
    ListingHtml { l, csrf }
        .render()
        .unwrap_or_else(|e| format!("template error: {e}"))
}

/// A grid of squares, one per GPU, a row per host: filled when in use.
/// `rows` are `(host, used, total)`.
pub fn heatmap_svg(rows: &[(String, u32, u32)]) -> String {
    use std::fmt::Write;
    const SQ: usize = 16;
    const LABEL: usize = 130;
    let widest = rows.iter().map(|r| r.2 as usize).max().unwrap_or(0).max(1);
    let width = LABEL + widest * (SQ + 2) + 70;
    let height = rows.len().max(1) * (SQ + 4) + 4;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" class="heatmap" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">"#
    );
    for (i, (host, used, total)) in rows.iter().enumerate() {
        let y = 2 + i * (SQ + 4);
        let _ = write!(
            s,
            r#"<text x="0" y="{}">{}</text>"#,
            y + SQ - 4,
            crate::diagram::esc(host)
        );
        for g in 0..*total {
            let fill = if g < *used { "#c0392b" } else { "#dde3ea" };
            let class = if g < *used { "gpu used" } else { "gpu free" };
            let _ = write!(
                s,
                r#"<rect class="{class}" x="{}" y="{y}" width="{SQ}" height="{SQ}" fill="{fill}"/>"#,
                LABEL + g as usize * (SQ + 2)
            );
        }
        let pct = if *total == 0 { 0 } else { used * 100 / total };
        let _ = write!(
            s,
            r#"<text x="{}" y="{}">{pct} %</text>"#,
            LABEL + widest * (SQ + 2) + 6,
            y + SQ - 4
        );
    }
    s.push_str("</svg>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_buttons_and_forms_escape_and_carry_csrf() {
        let l = Listing {
            heading: "Segments <x>".into(),
            error: Some("bad <cidr>".into()),
            notice: None,
            sections: vec![Section {
                heading: "All".into(),
                columns: vec!["Name".into(), "".into()],
                rows: vec![vec![
                    Cell::text("<b>lan</b>"),
                    Cell::Button {
                        action: "/t/lab/segments/lan/delete".into(),
                        label: "Delete".into(),
                    },
                ]],
                form: Some(Form {
                    action: "/t/lab/segments".into(),
                    submit: "Create".into(),
                    fields: vec![
                        Field::new("name", "Name", Input::Text).required(),
                        Field::new(
                            "kind",
                            "Kind",
                            Input::Select(vec![("ethernet".into(), "Ethernet".into())]),
                        ),
                    ],
                }),
                ..Default::default()
            }],
        };
        let html = render(&l, "tok");
        assert!(html.contains("Segments &#60;x&#62;"), "{html}");
        assert!(html.contains("&#60;b&#62;lan&#60;/b&#62;"));
        assert!(html.contains("bad &#60;cidr&#62;"));
        assert_eq!(html.matches(r#"name="csrf" value="tok""#).count(), 2);
        assert!(html.contains(r#"action="/t/lab/segments/lan/delete""#));
        assert!(html.contains(r#"<input name="name" required"#));
        assert!(html.contains(r#"<option value="ethernet">Ethernet</option>"#));
    }

    #[test]
    fn the_heatmap_has_a_square_per_gpu() {
        let svg = heatmap_svg(&[("gpu-001".into(), 3, 8), ("gpu-<2>".into(), 0, 4)]);
        assert_eq!(svg.matches("class=\"gpu used\"").count(), 3);
        assert_eq!(svg.matches("class=\"gpu free\"").count(), 9);
        assert!(svg.contains("37 %") && svg.contains("gpu-&lt;2&gt;"));
    }
}
