//! A minimal XML writer: elements, quoted and escaped attributes, nesting.
//! Enough for libvirt domain XML and NCCL topology files, whose parser
//! accepts no prolog and only quoted attribute values.

use std::fmt::Write;

#[derive(Debug, Clone, PartialEq)]
pub struct Element {
    pub name: &'static str,
    pub attrs: Vec<(&'static str, String)>,
    pub children: Vec<Element>,
    pub text: Option<String>,
}

pub fn el(name: &'static str) -> Element {
    Element {
        name,
        attrs: Vec::new(),
        children: Vec::new(),
        text: None,
    }
}

impl Element {
    pub fn attr(mut self, key: &'static str, value: impl ToString) -> Element {
        self.attrs.push((key, value.to_string()));
        self
    }

    pub fn opt_attr(self, key: &'static str, value: Option<impl ToString>) -> Element {
        match value {
            Some(v) => self.attr(key, v),
            None => self,
        }
    }

    pub fn child(mut self, c: Element) -> Element {
        self.children.push(c);
        self
    }

    pub fn children(mut self, cs: impl IntoIterator<Item = Element>) -> Element {
        self.children.extend(cs);
        self
    }

    pub fn text(mut self, t: impl ToString) -> Element {
        self.text = Some(t.to_string());
        self
    }

    /// Elements in this subtree, itself included.
    pub fn count(&self) -> usize {
        1 + self.children.iter().map(Element::count).sum::<usize>()
    }

    /// The largest number of attributes on one element of the subtree.
    pub fn max_attrs(&self) -> usize {
        self.children
            .iter()
            .map(Element::max_attrs)
            .max()
            .unwrap_or(0)
            .max(self.attrs.len())
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        self.write(&mut out, 0);
        out
    }

    fn write(&self, out: &mut String, depth: usize) {
        let pad = "  ".repeat(depth);
        let _ = write!(out, "{pad}<{}", self.name);
        for (k, v) in &self.attrs {
            let _ = write!(out, " {k}=\"{}\"", escape(v));
        }
        match (&self.text, self.children.is_empty()) {
            (None, true) => out.push_str("/>\n"),
            (Some(t), true) => {
                let _ = writeln!(out, ">{}</{}>", escape(t), self.name);
            }
            (_, false) => {
                out.push_str(">\n");
                for c in &self.children {
                    c.write(out, depth + 1);
                }
                let _ = writeln!(out, "{pad}</{}>", self.name);
            }
        }
    }
}

/// Text or an attribute value that any XML parser reads back as `s`.
/// Tabs and line ends are written as character references: parsers turn
/// them into spaces in attributes and `\r` into `\n` in text. Characters
/// XML 1.0 cannot carry at all (other C0 controls, U+FFFE, U+FFFF) become
/// U+FFFD, so the document stays well-formed whatever it is given.
pub fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            '\t' => o.push_str("&#9;"),
            '\n' => o.push_str("&#10;"),
            '\r' => o.push_str("&#13;"),
            c if xml_char(c) => o.push(c),
            _ => o.push(char::REPLACEMENT_CHARACTER),
        }
    }
    o
}

/// XML 1.0's `Char` production (surrogates cannot occur in a `char`).
pub fn xml_char(c: char) -> bool {
    !matches!(c, '\0'..='\u{8}' | '\u{b}' | '\u{c}' | '\u{e}'..='\u{1f}' | '\u{fffe}' | '\u{ffff}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_what_parsers_would_change_or_refuse() {
        assert_eq!(escape("a\tb\nc\rd"), "a&#9;b&#10;c&#13;d");
        assert_eq!(escape("x\u{1}y\u{ffff}"), "x\u{fffd}y\u{fffd}");
        assert_eq!(escape("グラフ"), "グラフ");
    }

    #[test]
    fn renders_nested_and_escaped() {
        let x = el("a")
            .attr("k", "x\"<y>&")
            .child(el("b"))
            .child(el("c").text("t&t"));
        assert_eq!(
            x.render(),
            "<a k=\"x&quot;&lt;y&gt;&amp;\">\n  <b/>\n  <c>t&amp;t</c>\n</a>\n"
        );
        assert_eq!(x.count(), 3);
        assert_eq!(x.max_attrs(), 1);
    }
}
