//! Splitting a YAML stream into its documents *before* parsing, so that a syntax error in one
//! document cannot hide the errors of the next: each document is then parsed on its own.
//!
//! This is a small line-based splitter, not the parser's scanner: a scanner that met a syntax
//! error cannot be trusted to find the next document (saphyr's stops there), while document
//! markers are found line by line. It is exact for everything YAML 1.2 allows, because of
//! one rule of the spec (production 206, `c-forbidden`): a line that starts, at column 0, with
//! `---` or `...` followed by a blank or the end of the line is a document marker wherever it
//! is. It cannot be the content of a block scalar (whose lines are indented, except at the top
//! level where the marker ends the scalar), nor of a quoted scalar or a flow collection (where
//! it is an error). So `---` inside a block scalar or a quoted string is never at column 0, or
//! else the text is not YAML; saphyr agrees (a test checks it).
//!
//! What this module decides, and nothing more:
//!
//! - A `---` line starts a new document, unless the document being read has so far only blank
//!   lines, comments and directives (then the `---` is that document's own start marker).
//! - A `...` line ends the document it is in (it belongs to it); what follows starts the next.
//! - Directives (`%YAML`, `%TAG`) and comments before a `---` belong to the document that
//!   `---` starts. A directive after a document's content stays in that document, where the
//!   parser reports it (YAML 1.2 needs a `...` between a document and the next directives).
//! - Line breaks are `\n`, `\r\n` or a lone `\r`, as in YAML (and as saphyr counts lines).
//! - A byte order mark at the very start is kept in the first document's text.

/// One document of a YAML stream, as [`documents`] splits it.
///
/// Its `text` is whole lines of the input (with their line breaks): the comments and
/// directives before it, its `---` marker if it has one, its content and its `...` marker if it
/// has one. A parser given `text` alone reports line `n`; that is line `first_line + n - 1` of
/// the whole input (columns are unchanged: a document always starts at the start of a line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Document<'a> {
    /// The document's lines, line breaks included. Never empty.
    pub text: &'a str,
    /// The 1-based line of the input on which `text` starts.
    pub first_line: usize,
    /// The byte offset in the input at which `text` starts.
    pub offset: usize,
}

impl Document<'_> {
    /// Whether the document holds no node at all: only blank lines, comments, directives and
    /// `---` / `...` markers. (A document holding `~` or `null` is not blank, though a parser
    /// reads it as nothing too.)
    #[must_use]
    pub fn is_blank(&self) -> bool {
        lines(self.text, self.offset == 0).all(|(line, _)| match classify(line) {
            Line::Prefix => true,
            Line::Start(rest) | Line::End(rest) => is_blank_or_comment(rest),
            Line::Content => false,
        })
    }

    /// The 1-based line of the whole input that is line `line` (1-based) of `text`.
    #[must_use]
    pub fn input_line(&self, line: u64) -> u64 {
        (self.first_line as u64).saturating_add(line.saturating_sub(1))
    }
}

/// Splits `text` into its YAML documents, in order.
///
/// Nothing is lost or reordered: the documents' texts, joined, are `text`. Documents without
/// any node (see [`Document::is_blank`]) are yielded too; a caller usually skips them. See the
/// module documentation for what is a document boundary.
///
/// ```
/// let text = "a: 1\n---\nb: |\n  ---\n  not a marker\n...\n# end\n";
/// let docs: Vec<_> = fqdnd_config::documents(text).collect();
/// assert_eq!(docs.len(), 3);
/// assert_eq!((docs[0].text, docs[0].first_line), ("a: 1\n", 1));
/// assert_eq!(docs[1].text, "---\nb: |\n  ---\n  not a marker\n...\n");
/// assert_eq!(docs[1].first_line, 2);
/// assert!(docs[2].is_blank());
/// ```
#[must_use]
pub fn documents(text: &str) -> Documents<'_> {
    Documents {
        text,
        offset: 0,
        line: 1,
    }
}

/// The iterator of [`documents`].
#[derive(Debug, Clone)]
pub struct Documents<'a> {
    text: &'a str,
    /// Where the next document starts.
    offset: usize,
    /// Its 1-based line.
    line: usize,
}

impl<'a> Iterator for Documents<'a> {
    type Item = Document<'a>;

    fn next(&mut self) -> Option<Document<'a>> {
        let start = self.offset;
        let rest = self.text.get(start..).filter(|rest| !rest.is_empty())?;
        let first_line = self.line;
        // Whether the document has content or its own `---` yet.
        let mut has_body = false;
        let mut end = start;
        for (line, next) in lines(rest, start == 0) {
            match classify(line) {
                Line::Start(_) if has_body => break,
                Line::Start(_) | Line::Content => has_body = true,
                Line::Prefix => {}
                Line::End(_) => {
                    end = start + next;
                    self.line += 1;
                    break;
                }
            }
            end = start + next;
            self.line += 1;
        }
        self.offset = end;
        Some(Document {
            text: &self.text[start..end],
            first_line,
            offset: start,
        })
    }
}

impl std::iter::FusedIterator for Documents<'_> {}

/// What a line is, to the splitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line<'a> {
    /// `---` at column 0, then a blank or nothing; with what follows it on the line.
    Start(&'a str),
    /// `...` at column 0, then a blank or nothing; with what follows it on the line.
    End(&'a str),
    /// A blank line, a comment, or a directive (`%` at column 0).
    Prefix,
    /// Anything else.
    Content,
}

fn classify(line: &str) -> Line<'_> {
    let marker = |marker: &str| {
        line.strip_prefix(marker)
            .filter(|rest| rest.is_empty() || rest.starts_with([' ', '\t']))
    };
    if let Some(rest) = marker("---") {
        Line::Start(rest)
    } else if let Some(rest) = marker("...") {
        Line::End(rest)
    } else if is_blank_or_comment(line) || line.starts_with('%') {
        Line::Prefix
    } else {
        Line::Content
    }
}

fn is_blank_or_comment(text: &str) -> bool {
    let text = text.trim_start_matches([' ', '\t']);
    text.is_empty() || text.starts_with('#')
}

/// The lines of `text`, each without its line break, with the offset just past its break.
/// `bom`: strip a leading byte order mark from the first line (only at the input's start).
fn lines(text: &str, bom: bool) -> impl Iterator<Item = (&str, usize)> {
    let mut at = 0;
    std::iter::from_fn(move || {
        let rest = text.get(at..).filter(|rest| !rest.is_empty())?;
        let (len, brk) = match rest.find(['\n', '\r']) {
            Some(i) if rest[i..].starts_with("\r\n") => (i, 2),
            Some(i) => (i, 1),
            None => (rest.len(), 0),
        };
        let mut line = &rest[..len];
        if bom && at == 0 {
            line = line.strip_prefix('\u{feff}').unwrap_or(line);
        }
        at += len + brk;
        Some((line, at))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn split(text: &str) -> Vec<(&str, usize)> {
        documents(text).map(|d| (d.text, d.first_line)).collect()
    }

    #[test]
    fn markers_split_at_column_zero_only() {
        assert_eq!(
            split("a: 1\n---\nb: 2\n--- \nc: 3\n"),
            [("a: 1\n", 1), ("---\nb: 2\n", 2), ("--- \nc: 3\n", 4)]
        );
        // Not markers: indented, or followed by something other than a blank.
        let one = "a: |\n  ---\n  x\nb: ---\n---x: 1\n----\n...x: 2\n";
        assert_eq!(split(one), [(one, 1)]);
    }

    #[test]
    fn a_leading_marker_and_leading_comments_belong_to_the_first_document() {
        assert_eq!(split("---\na: 1\n"), [("---\na: 1\n", 1)]);
        assert_eq!(
            split("# header\n\n%YAML 1.2\n---\na: 1\n---\nb: 2"),
            [("# header\n\n%YAML 1.2\n---\na: 1\n", 1), ("---\nb: 2", 6)]
        );
        // Two markers in a row: an empty document, then the next one.
        assert_eq!(
            split("---\n---\na: 1\n"),
            [("---\n", 1), ("---\na: 1\n", 2)]
        );
    }

    #[test]
    fn an_end_marker_ends_its_document() {
        assert_eq!(
            split("a: 1\n...\n%YAML 1.2\n---\nb: 2\n...\n# trailing\n"),
            [
                ("a: 1\n...\n", 1),
                ("%YAML 1.2\n---\nb: 2\n...\n", 3),
                ("# trailing\n", 7)
            ]
        );
        // Content right after `...` is a new (bare) document.
        assert_eq!(
            split("a: 1\n... # end\nb: 2\n"),
            [("a: 1\n... # end\n", 1), ("b: 2\n", 3)]
        );
    }

    #[test]
    fn a_directive_after_content_stays_in_its_document() {
        assert_eq!(
            split("a: 1\n%YAML 1.2\n---\nb: 2\n"),
            [("a: 1\n%YAML 1.2\n", 1), ("---\nb: 2\n", 3)]
        );
    }

    #[test]
    fn crlf_and_lone_cr_are_line_breaks() {
        assert_eq!(
            split("a: 1\r\n---\r\nb: 2\r\n...\r\nc: 3"),
            [("a: 1\r\n", 1), ("---\r\nb: 2\r\n...\r\n", 2), ("c: 3", 5)]
        );
        assert_eq!(
            split("a: 1\r---\rb: 2\r"),
            [("a: 1\r", 1), ("---\rb: 2\r", 2)]
        );
    }

    #[test]
    fn a_byte_order_mark_does_not_hide_the_first_marker() {
        assert_eq!(
            split("\u{feff}---\na: 1\n---\nb: 2\n"),
            [("\u{feff}---\na: 1\n", 1), ("---\nb: 2\n", 3)]
        );
        // Only at the very start.
        assert_eq!(split("a: 1\n\u{feff}---\n").len(), 1);
    }

    #[test]
    fn blank_documents() {
        let blank = |text: &str| documents(text).map(|d| d.is_blank()).collect::<Vec<_>>();
        assert_eq!(blank(""), Vec::<bool>::new());
        assert_eq!(blank("\n# c\n%YAML 1.2\n--- # c\n...\n"), [true]);
        assert_eq!(blank("--- |\n  x\n"), [false]);
        assert_eq!(blank("--- {a: 1}\n"), [false]);
        assert_eq!(blank("~\n"), [false]);
        assert_eq!(blank("a: 1\n---\n---\n"), [false, true, true]);
        assert_eq!(blank("\u{feff}# c\n"), [true]);
    }

    #[test]
    fn input_lines() {
        let docs: Vec<_> = documents("a: 1\n\n---\nb: 2\n").collect();
        assert_eq!(docs[1].input_line(1), 3);
        assert_eq!(docs[1].input_line(2), 4);
        assert_eq!(docs[1].input_line(0), 3);
    }

    /// saphyr reads the stream as the splitter does: the same documents, the same values,
    /// a column-0 marker inside a block scalar ends it, and inside a quoted scalar is an error.
    #[test]
    fn saphyr_agrees_on_markers() {
        type Values = Vec<std::collections::BTreeMap<String, String>>;
        let text = "a: |\n  x\n  ---\n---\nb: y\n...\nc: 'z\n  --- w'\n";
        let whole: Values = serde_saphyr::from_multiple(text).unwrap();
        let split: Values = documents(text)
            .filter(|d| !d.is_blank())
            .map(|d| serde_saphyr::from_str(d.text).unwrap())
            .collect();
        assert_eq!(whole, split);
        assert_eq!(whole.len(), 3);
        assert_eq!(whole[2]["c"], "z --- w");
        let whole: Vec<String> = serde_saphyr::from_multiple("--- |\nabc\n---\n|\n def\n").unwrap();
        assert_eq!(whole, ["abc\n", "def\n"]);
        assert!(serde_saphyr::from_str::<String>("\"abc\n---\ndef\"\n").is_err());
    }

    /// Lines drawn from what a YAML stream holds, markers and near-markers included.
    fn line_strategy() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            "---",
            "--- ",
            "--- # c",
            "--- |",
            "---x",
            "...",
            "... # c",
            "....",
            "%YAML 1.2",
            "%TAG ! tag:x,2000:",
            "# comment",
            "",
            "  ",
            "\t",
            "a: 1",
            "b: |",
            "  ---",
            "  ...",
            "- x",
            "'q ---",
            "\"q",
            "  %x",
            "\u{feff}---",
        ])
    }

    proptest! {
        #[test]
        fn splitting_loses_nothing_and_counts_lines(
            drawn in prop::collection::vec(
                (line_strategy(), prop::sample::select(vec!["\n", "\r\n", "\r"])),
                0..24,
            ),
            last_break in any::<bool>(),
        ) {
            let mut text = String::new();
            for (i, (line, brk)) in drawn.iter().enumerate() {
                text.push_str(line);
                if i + 1 < drawn.len() || last_break {
                    text.push_str(brk);
                }
            }
            let docs: Vec<_> = documents(&text).collect();
            let joined: String = docs.iter().map(|d| d.text).collect();
            prop_assert_eq!(&joined, &text);
            let mut offset = 0;
            for (i, doc) in docs.iter().enumerate() {
                prop_assert!(!doc.text.is_empty());
                prop_assert_eq!(doc.offset, offset);
                let before = &text[..offset];
                let breaks = before.matches('\n').count() + before.matches('\r').count()
                    - before.matches("\r\n").count();
                prop_assert_eq!(doc.first_line, breaks + 1);
                // Every document but the first starts with a `---` line or follows a `...` line.
                if i > 0 {
                    let previous = docs[i - 1];
                    let (first, _) = lines(doc.text, false).next().unwrap_or(("", 0));
                    let (last, _) = lines(previous.text, previous.offset == 0)
                        .last()
                        .unwrap_or(("", 0));
                    prop_assert!(
                        matches!(classify(first), Line::Start(_))
                            || matches!(classify(last), Line::End(_)),
                        "{:?} after {:?}", doc.text, docs[i - 1].text
                    );
                }
                // Inside a document, a `---` line only ever comes before any content.
                let mut body = false;
                for (line, _) in lines(doc.text, doc.offset == 0) {
                    let kind = classify(line);
                    if let Line::Start(_) = kind {
                        prop_assert!(!body, "{:?}", doc.text);
                    }
                    body |= matches!(kind, Line::Start(_) | Line::Content);
                }
                offset += doc.text.len();
            }
        }
    }
}
