//! The pages that show one kind of resource (clusters, segments, members,
//! tokens, and the admin's hosts, tenants, rates, join tokens): sections of
//! tables, row buttons and forms, described as plain data and drawn by one
//! template, so every such page has the same shape, escaping and CSRF
//! fields.

use std::collections::HashMap;

use askama::Template;

use crate::i18n::Lang;

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
    /// A whole number from `min`, up to `max` when there is one.
    Number {
        min: u32,
        max: Option<u32>,
    },
    /// `(value, label)`; the first is chosen unless the field's value
    /// names another.
    Select(Vec<(String, String)>),
    Checkbox,
    TextArea,
}

impl Input {
    /// A whole number from 0.
    pub const NUMBER: Input = Input::Number { min: 0, max: None };

    /// A choice of `items`, after `none` (the empty value: no choice).
    pub fn choices(none: &str, items: Vec<String>) -> Input {
        Input::Select(
            std::iter::once((String::new(), none.to_owned()))
                .chain(items.into_iter().map(|i| (i.clone(), i)))
                .collect(),
        )
    }
}

/// A name field: the rule for names, said beside it.
pub fn name_field(lang: Lang) -> Field {
    Field::new(
        "name",
        crate::i18n::t(lang, crate::i18n::Msg::Name),
        Input::Text,
    )
    .required()
    .pattern("[a-z][a-z0-9-]{2,62}")
    .help(crate::i18n::help(lang, "name"))
}

/// One row of a form: its label, the field, what to enter (help) and,
/// when the form came back refused, what was wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub label: String,
    pub input: Input,
    pub required: bool,
    pub placeholder: String,
    /// The rule as a `pattern` attribute, for assistive technology and
    /// as a hint: the form is `novalidate`, the server checks and says
    /// what is wrong in the field's row.
    pub pattern: String,
    pub help: String,
    /// What was entered, kept when the form comes back refused.
    pub value: String,
    pub error: Option<String>,
    /// The API's names for what this field sets, when they differ from
    /// the field's (`ssh_keys` for `ssh_key`): its refusals land here.
    pub answers: Vec<String>,
}

impl Field {
    pub fn new(name: &str, label: &str, input: Input) -> Field {
        Field {
            name: name.into(),
            label: label.into(),
            input,
            required: false,
            placeholder: String::new(),
            pattern: String::new(),
            help: String::new(),
            value: String::new(),
            error: None,
            answers: Vec::new(),
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

    pub fn pattern(mut self, p: &str) -> Field {
        self.pattern = p.into();
        self
    }

    pub fn help(mut self, h: &str) -> Field {
        self.help = h.into();
        self
    }

    pub fn answers(mut self, api_fields: &[&str]) -> Field {
        self.answers = api_fields.iter().map(|f| (*f).to_owned()).collect();
        self
    }

    fn answers_to(&self, name: &str) -> bool {
        self.name == name || self.answers.iter().any(|a| a == name)
    }

    fn checked(&self) -> bool {
        !self.value.is_empty()
    }

    fn selected(&self, option: &str) -> bool {
        self.value == option
    }
}

/// A form posting to `action` (with the CSRF token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Form {
    pub action: String,
    pub submit: String,
    pub fields: Vec<Field>,
}

/// What a form's post came back with: the API's refusal, its field errors
/// by the API's field names, and what was entered (so nothing typed is
/// lost).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Refusal {
    pub message: String,
    pub fields: Vec<(String, String)>,
    pub submitted: HashMap<String, String>,
}

/// The top of a refused page: the message, and a link to each field that
/// holds an error (the fields show them in their own rows).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ErrorSummary {
    pub message: String,
    /// `(field id, label, error)`.
    pub fields: Vec<(String, String, String)>,
}

impl Form {
    /// Whether `submitted` came from this form: posted to its action, and
    /// every name in it is one of its fields (two forms on a page may post
    /// to one address).
    pub fn posted(&self, action: &str, submitted: &HashMap<String, String>) -> bool {
        self.action == action
            && submitted
                .keys()
                .filter(|k| k.as_str() != "csrf")
                .all(|k| self.fields.iter().any(|f| &f.name == k))
    }

    /// The required fields left empty, as `(field, "required")` refusals:
    /// all of them at once, before the API says the first.
    pub fn missing(&self, submitted: &HashMap<String, String>) -> Vec<(String, String)> {
        self.fields
            .iter()
            .filter(|f| f.required)
            .filter(|f| submitted.get(&f.name).is_none_or(|v| v.trim().is_empty()))
            .map(|f| (f.name.clone(), "required".to_owned()))
            .collect()
    }

    /// Back with what was entered and each error beside its field (in the
    /// page's language where the portal knows the message); returns the
    /// errors that name none of its fields.
    pub fn refused(&mut self, lang: Lang, r: &Refusal) -> Vec<(String, String)> {
        for f in &mut self.fields {
            f.value = r.submitted.get(&f.name).cloned().unwrap_or_default();
            f.error = None;
            // A choice that is no longer offered (a VM deleted meanwhile)
            // comes back as sent, not as another option preselected.
            if let Input::Select(opts) = &mut f.input {
                if !f.value.is_empty() && !opts.iter().any(|(v, _)| *v == f.value) {
                    opts.push((f.value.clone(), f.value.clone()));
                }
            }
        }
        let mut unplaced = Vec::new();
        for (api_field, message) in &r.fields {
            match self.field_for(api_field) {
                Some(f) => {
                    let m = crate::i18n::field_message(lang, message);
                    f.error = Some(match f.error.take() {
                        Some(e) => format!("{e}; {m}"),
                        None => m,
                    });
                }
                None => unplaced.push((api_field.clone(), message.clone())),
            }
        }
        unplaced
    }

    /// The field a refusal of the API's field `api_field` belongs to: the
    /// one of that name, else of its first part (`networks[0].ip`,
    /// `ingress.source`), else of its last (`prices.gpu:H100.spot`).
    fn field_for(&mut self, api_field: &str) -> Option<&mut Field> {
        let parts: Vec<&str> = api_field
            .split('.')
            .map(|p| p.split('[').next().unwrap_or(p))
            .collect();
        let tail = parts.last().copied().unwrap_or(api_field);
        let head = parts.first().copied().unwrap_or(api_field);
        let i = [api_field, head, tail]
            .iter()
            .find_map(|n| self.fields.iter().position(|f| f.answers_to(n)))?;
        self.fields.get_mut(i)
    }

    /// The summary's links to this form's fields in error; `key` makes
    /// the ids unique on the page.
    fn summary(&self, key: &str) -> Vec<(String, String, String)> {
        self.fields
            .iter()
            .filter_map(|f| {
                let e = f.error.as_ref()?;
                Some((field_id(key, &f.name), f.label.clone(), e.clone()))
            })
            .collect()
    }
}

fn field_id(key: &str, name: &str) -> String {
    format!("{key}-{name}")
}

/// The summary for a refused form: the API's message when no field holds
/// it, else a line saying which fields to look at.
pub fn error_summary(
    lang: Lang,
    form: &Form,
    key: &str,
    r: &Refusal,
    unplaced: &[(String, String)],
) -> ErrorSummary {
    let fields = form.summary(key);
    let message = if fields.is_empty() || !unplaced.is_empty() {
        r.message.clone()
    } else {
        crate::i18n::t(lang, crate::i18n::Msg::CheckFields).to_owned()
    };
    ErrorSummary { message, fields }
}

#[derive(Template)]
#[template(path = "form.html")]
struct FormHtml<'a> {
    f: &'a Form,
    key: &'a str,
    csrf: &'a str,
}

impl FormHtml<'_> {
    fn id(&self, name: &str) -> String {
        field_id(self.key, name)
    }

    /// `aria-describedby`: the help and the error, those that are there.
    fn described_by(&self, f: &Field) -> String {
        let id = self.id(&f.name);
        let mut ids = Vec::new();
        if !f.help.is_empty() {
            ids.push(format!("{id}-help"));
        }
        if f.error.is_some() {
            ids.push(format!("{id}-error"));
        }
        ids.join(" ")
    }
}

/// A form in the portal's one layout: a row per field of label, field,
/// help and error (one column on phones).
pub fn form_html(f: &Form, key: &str, csrf: &str) -> String {
    FormHtml { f, key, csrf }
        .render()
        .unwrap_or_else(|e| format!("template error: {e}"))
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
    pub error: Option<ErrorSummary>,
    /// Shown once and prominently (a new token's secret).
    pub notice: Option<String>,
    pub sections: Vec<Section>,
}

impl Listing {
    /// The page again after a form was refused: the form that was posted
    /// (found by `action` and the names it sent) keeps what was entered
    /// and shows each error in its field's row; the top says what to look
    /// at. A post that matches no form (a row's button) gets the message
    /// at the top only.
    pub fn refused(&mut self, lang: Lang, action: &str, r: &Refusal) {
        let posted = self.sections.iter_mut().enumerate().find_map(|(i, s)| {
            s.form
                .as_mut()
                .filter(|f| f.posted(action, &r.submitted))
                .map(|f| (i, f))
        });
        self.error = Some(match posted {
            Some((i, f)) => {
                let unplaced = f.refused(lang, r);
                error_summary(lang, f, &section_key(i), r, &unplaced)
            }
            None => ErrorSummary {
                message: r.message.clone(),
                fields: Vec::new(),
            },
        });
    }

    /// The form posted to `action` with `submitted`, if this page has it.
    pub fn form_posted(&self, action: &str, submitted: &HashMap<String, String>) -> Option<&Form> {
        self.sections
            .iter()
            .filter_map(|s| s.form.as_ref())
            .find(|f| f.posted(action, submitted))
    }
}

fn section_key(i: usize) -> String {
    format!("f{i}")
}

#[derive(Template)]
#[template(path = "listing.html")]
struct ListingHtml<'a> {
    l: &'a Listing,
    csrf: &'a str,
}

impl ListingHtml<'_> {
    fn form(&self, i: usize, f: &Form) -> String {
        form_html(f, &section_key(i), self.csrf)
    }

    /// A sentence with `commands` in backquotes set as code (escaped).
    fn with_code(&self, text: &str) -> String {
        crate::diagram::esc(text)
            .split('`')
            .enumerate()
            .map(|(i, part)| {
                if i % 2 == 1 {
                    format!("<code>{part}</code>")
                } else {
                    part.to_owned()
                }
            })
            .collect()
    }
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
            error: Some(ErrorSummary {
                message: "bad <cidr>".into(),
                fields: Vec::new(),
            }),
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
        assert!(
            html.contains(r#"<input id="f0-name" name="name" value="" required"#),
            "{html}"
        );
        assert!(html.contains(r#"<label for="f0-name">Name"#));
        assert!(
            html.contains(r#"<h3 class="form-heading">Create</h3>"#),
            "a form under a table has its heading: {html}"
        );
        assert!(html.contains(r#"<option value="ethernet">Ethernet</option>"#));
    }

    fn segments_form() -> Listing {
        Listing {
            heading: "Segments".into(),
            sections: vec![
                Section {
                    form: Some(Form {
                        action: "/t/lab/segments".into(),
                        submit: "Create".into(),
                        fields: vec![
                            Field::new("name", "Name", Input::Text)
                                .required()
                                .help("3–63 lowercase letters"),
                            Field::new("cidr", "CIDR", Input::Text).required(),
                            Field::new("mtu", "MTU", Input::NUMBER),
                            Field::new("ingress", "Ingress", Input::TextArea),
                            Field::new("spot", "Spot", Input::Checkbox),
                            Field::new(
                                "kind",
                                "Kind",
                                Input::Select(vec![
                                    ("ethernet".into(), "Ethernet".into()),
                                    ("roce".into(), "RoCE".into()),
                                ]),
                            ),
                            Field::new("ssh_key", "SSH", Input::Text).answers(&["ssh_keys"]),
                        ],
                    }),
                    ..Default::default()
                },
                Section {
                    form: Some(Form {
                        action: "/t/lab/segments".into(),
                        submit: "Attach".into(),
                        fields: vec![Field::new("attach", "Volume", Input::Text)],
                    }),
                    ..Default::default()
                },
            ],
            ..Default::default()
        }
    }

    fn sent(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_refused_form_keeps_what_was_entered_and_shows_each_error_in_its_row() {
        let mut l = segments_form();
        let r = Refusal {
            message: "cidr: the prefix must be 8 to 29".into(),
            fields: vec![
                ("cidr".into(), "the prefix must be 8 to 29".into()),
                (
                    "ingress[1].source".into(),
                    "\"x\" is not an IPv4 address".into(),
                ),
                ("ssh_keys[0]".into(), "not an OpenSSH public key".into()),
                ("name".into(), "required".into()),
            ],
            submitted: sent(&[
                ("name", ""),
                ("cidr", "10.0.0.0/33"),
                ("mtu", "1400"),
                ("ingress", "tcp:22:<x>"),
                ("spot", "on"),
                ("kind", "roce"),
                ("ssh_key", "ssh-rsa nope"),
            ]),
        };
        l.refused(Lang::Ja, "/t/lab/segments", &r);
        let html = render(&l, "tok");
        // Each error in its own row, tied to its field for screen readers.
        assert!(
            html.contains(r#"aria-describedby="f0-cidr-error" aria-invalid="true""#)
                && html.contains(r#"<span class="field-error" id="f0-cidr-error"><strong>the prefix must be 8 to 29</strong>"#),
            "{html}"
        );
        assert!(
            html.contains(r#"id="f0-ingress-error"><strong>&#34;x&#34; is not an IPv4 address"#),
            "{html}"
        );
        assert!(
            html.contains(r#"id="f0-ssh_key-error"><strong>not an OpenSSH public key"#),
            "{html}"
        );
        assert!(
            html.contains(r#"aria-describedby="f0-name-help f0-name-error""#)
                && html.contains("入力してください"),
            "the portal's own message in the page's language: {html}"
        );
        // What was entered comes back (escaped), the choices as chosen.
        assert!(html.contains(r#"value="10.0.0.0/33""#) && html.contains(r#"value="1400""#));
        assert!(html.contains(">tcp:22:&#60;x&#62;</textarea>"), "{html}");
        assert!(html.contains(r#"type="checkbox" value="on" checked"#));
        assert!(html.contains(r#"<option value="roce" selected>RoCE</option>"#));
        assert!(!html.contains(r#"<option value="ethernet" selected>"#));
        // The top says what to look at and links each field.
        assert!(
            html.contains(r##"<a href="#f0-cidr">CIDR: the prefix must be 8 to 29</a>"##),
            "{html}"
        );
        assert!(html.contains("下の項目を直して"), "{html}");
        // The other form on the page is left as it was.
        assert!(
            html.contains(r#"<input id="f1-attach" name="attach" value="""#),
            "{html}"
        );
    }

    #[test]
    fn a_refusal_no_field_holds_stays_at_the_top() {
        let mut l = segments_form();
        l.refused(
            Lang::En,
            "/t/lab/segments",
            &Refusal {
                message: "quota exceeded: segments".into(),
                fields: Vec::new(),
                submitted: sent(&[("name", "lan"), ("cidr", "10.0.0.0/24")]),
            },
        );
        let html = render(&l, "tok");
        assert!(html.contains("<p>quota exceeded: segments</p>") && !html.contains("aria-invalid"));
        assert!(html.contains(r#"value="lan""#), "kept: {html}");
        // The second form posts to the same address: told apart by its names.
        let mut l = segments_form();
        l.refused(
            Lang::En,
            "/t/lab/segments",
            &Refusal {
                message: "attach: no such volume".into(),
                fields: vec![("attach".into(), "no such volume".into())],
                submitted: sent(&[("attach", "data")]),
            },
        );
        let html = render(&l, "tok");
        assert!(
            html.contains(r#"id="f1-attach-error""#)
                && html.contains(r#"id="f1-attach" name="attach" value="data""#),
            "{html}"
        );
        assert!(html.contains(r#"id="f0-name" name="name" value="""#));
        assert_eq!(
            segments_form().form_posted(
                "/t/lab/segments",
                &sent(&[("csrf", "t"), ("name", "x"), ("other", "y")])
            ),
            None,
            "a name no form has"
        );
        assert_eq!(
            segments_form().sections[0]
                .form
                .as_ref()
                .map(|f| f.missing(&sent(&[("name", " "), ("mtu", "")]))),
            Some(vec![
                ("name".into(), "required".into()),
                ("cidr".into(), "required".into())
            ]),
            "every empty required field at once"
        );
    }

    #[test]
    fn empty_states_set_commands_as_code() {
        let l = Listing {
            heading: "Volumes".into(),
            sections: vec![Section {
                columns: vec!["Name".into()],
                empty: "None yet: `kumo volume create <NAME>` or below.".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let html = render(&l, "tok");
        assert!(
            html.contains("None yet: <code>kumo volume create &lt;NAME&gt;</code> or below."),
            "{html}"
        );
    }

    #[test]
    fn the_heatmap_has_a_square_per_gpu() {
        let svg = heatmap_svg(&[("gpu-001".into(), 3, 8), ("gpu-<2>".into(), 0, 4)]);
        assert_eq!(svg.matches("class=\"gpu used\"").count(), 3);
        assert_eq!(svg.matches("class=\"gpu free\"").count(), 9);
        assert!(svg.contains("37 %") && svg.contains("gpu-&lt;2&gt;"));
    }
}
