//! Glue to serde-saphyr: collecting located errors, and the small value types the document
//! shapes share (whole numbers, ports, ordered maps).

use std::fmt;
use std::marker::PhantomData;
use std::path::Path;

use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_saphyr::{Location, MessageFormatter, Spanned};

use crate::error::Error;

/// Collects the errors of one file, each located in it.
pub(crate) struct Diag<'a> {
    file: &'a Path,
    /// The file's text, when it is UTF-8: used to find the key of a value.
    text: Option<&'a str>,
    errors: Vec<Error>,
}

impl<'a> Diag<'a> {
    pub(crate) fn new(file: &'a Path, bytes: &'a [u8]) -> Self {
        Self {
            file,
            text: std::str::from_utf8(bytes).ok(),
            errors: Vec::new(),
        }
    }

    pub(crate) fn file(&self) -> &'a Path {
        self.file
    }

    /// How many errors so far: compare before and after a step to learn whether it failed.
    pub(crate) fn count(&self) -> usize {
        self.errors.len()
    }

    pub(crate) fn push(&mut self, error: Error) {
        self.errors.push(error);
    }

    /// A problem with a well-formed value at `at`.
    pub(crate) fn invalid(&mut self, at: Location, message: impl Into<String>) {
        let (line, column) = position(at);
        self.errors.push(Error::Invalid {
            file: self.file.to_path_buf(),
            line,
            column,
            message: message.into(),
        });
    }

    /// A problem with the field `key` whose value is at `value_at`: located at the key when
    /// it can be found in the text right before the value, else at the value.
    pub(crate) fn invalid_field(
        &mut self,
        value_at: Location,
        key: &str,
        message: impl Into<String>,
    ) {
        let (line, column) = self
            .text
            .and_then(|text| key_position(text, position(value_at), key))
            .unwrap_or_else(|| position(value_at));
        self.errors.push(Error::Invalid {
            file: self.file.to_path_buf(),
            line,
            column,
            message: message.into(),
        });
    }

    /// An error from serde-saphyr; `fallback` locates it when the parser gives no position.
    pub(crate) fn yaml(&mut self, error: &serde_saphyr::Error, fallback: Location) {
        let at = error
            .location()
            .filter(|l| l.line() > 0)
            .unwrap_or(fallback);
        let (line, column) = position(at);
        let file = self.file.to_path_buf();
        let message = yaml_message(error);
        self.errors.push(if is_syntax(error) {
            Error::Syntax {
                file,
                line,
                column,
                message,
            }
        } else {
            Error::Invalid {
                file,
                line,
                column,
                message,
            }
        });
    }

    pub(crate) fn into_errors(self) -> Vec<Error> {
        self.errors
    }
}

/// The position of the mapping key `key` whose value starts at `value`: the nearest `key`
/// before the value that is followed by `:` and then only blanks, comments and the `-` of a
/// block sequence. `None` when there is no such key (the caller then points at the value).
fn key_position(text: &str, value: (u64, u64), key: &str) -> Option<(u64, u64)> {
    let line_start = text
        .split_inclusive('\n')
        .take(usize::try_from(value.0).ok()?.checked_sub(1)?)
        .map(str::len)
        .sum::<usize>();
    let column = usize::try_from(value.1).ok()?.checked_sub(1)?;
    let value_byte = text
        .get(line_start..)?
        .char_indices()
        .nth(column)
        .map(|(i, _)| line_start + i)?;
    let before = text.get(..value_byte)?;
    let is_key_at = |key_byte: usize| {
        let starts_word = before[..key_byte]
            .chars()
            .next_back()
            .is_none_or(|c| c.is_whitespace() || matches!(c, '"' | '\'' | '{' | ',' | '-' | '?'));
        let gap = &before[key_byte + key.len()..];
        let gap = gap.strip_prefix(['"', '\'']).unwrap_or(gap);
        let Some(gap) = gap.trim_start_matches([' ', '\t']).strip_prefix(':') else {
            return false;
        };
        starts_word
            && gap.split('\n').all(|line| {
                let line = line.trim_matches([' ', '\t', '\r', '-']);
                line.is_empty() || line.starts_with('#')
            })
    };
    // The nearest candidates only: a key is never far from its value.
    let key_byte = before
        .rmatch_indices(key)
        .take(8)
        .map(|(i, _)| i)
        .find(|&i| is_key_at(i))?;
    let key_line_start = before[..key_byte].rfind('\n').map_or(0, |i| i + 1);
    let line = before[..key_byte].matches('\n').count() as u64 + 1;
    let mut column = before[key_line_start..key_byte].chars().count() as u64 + 1;
    // A quoted key starts at its opening quote.
    if before[..key_byte].ends_with(['"', '\'']) {
        column -= 1;
    }
    Some((line, column))
}

/// 1-based `(line, column)`; an unknown location becomes the start of the file.
pub(crate) fn position(at: Location) -> (u64, u64) {
    (at.line().max(1), at.column().max(1))
}

fn inner(error: &serde_saphyr::Error) -> &serde_saphyr::Error {
    let mut error = error.without_snippet();
    while let serde_saphyr::Error::AliasError { error: inner, .. } = error {
        error = inner.without_snippet();
    }
    error
}

/// Whether the text itself is malformed (as opposed to a well-formed document that does not
/// fit the schema).
fn is_syntax(error: &serde_saphyr::Error) -> bool {
    use serde_saphyr::Error as E;
    matches!(
        inner(error),
        E::ExternalMessage { .. }
            | E::Eof { .. }
            | E::IOError { .. }
            | E::Budget { .. }
            | E::UnknownAnchor { .. }
            | E::ContainerEndMismatch { .. }
            | E::UnexpectedContainerEndWhileReadingKeyNode { .. }
            | E::UnexpectedContainerEndWhileSkippingNode { .. }
    )
}

/// The message of a serde-saphyr error, without its location suffix.
///
/// An unknown-field error lists the accepted fields only: fields that fqdnd recognises in order
/// to reject them (see [`crate::cnp::is_rejected`]) are not offered as alternatives.
fn yaml_message(error: &serde_saphyr::Error) -> String {
    let error = inner(error);
    if let serde_saphyr::Error::SerdeUnknownField {
        field, expected, ..
    } = error
    {
        let expected: Vec<String> = expected
            .iter()
            .filter(|name| !crate::cnp::is_rejected(expected, name))
            .map(|name| format!("`{name}`"))
            .collect();
        return format!(
            "unknown field `{}`: expected one of {}",
            sanitize(field),
            expected.join(", ")
        );
    }
    if let serde_saphyr::Error::Unexpected { expected, .. } = error {
        let what = match *expected {
            "mapping start" => "a mapping (`key: value` entries)",
            "sequence start" => "a list (`- item` entries, or `[a, b]`)",
            "string scalar" => "a single value, not a list or a mapping",
            other => other,
        };
        return format!("expected {what}");
    }
    sanitize(&serde_saphyr::UserMessageFormatter.format_message(error))
}

/// Escapes control characters so a message stays on one line and cannot drive a terminal.
pub(crate) fn sanitize(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// A scalar read without a schema: an integer, a string, or a note of what else it was.
///
/// Numbers and ports are read through this so that every wrong value is reported by the
/// field's own check, at the value's position, with a message naming the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Scalar {
    /// A YAML integer (wide enough for any value written).
    Int(i128),
    /// A YAML string (quoted, or plain text that is not a number).
    Str(String),
    /// Anything else: what it was, for the message.
    Other(&'static str),
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Int(n) => write!(f, "{n}"),
            Self::Str(s) => write!(f, "{:?}", sanitize(s)),
            Self::Other(what) => f.write_str(what),
        }
    }
}

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ScalarVisitor;
        impl<'de> Visitor<'de> for ScalarVisitor {
            type Value = Scalar;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number or a string")
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Scalar, E> {
                Ok(Scalar::Other("a boolean"))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar::Int(v.into()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar::Int(v.into()))
            }
            fn visit_i128<E: de::Error>(self, v: i128) -> Result<Scalar, E> {
                Ok(Scalar::Int(v))
            }
            fn visit_u128<E: de::Error>(self, v: u128) -> Result<Scalar, E> {
                Ok(Scalar::Int(i128::try_from(v).unwrap_or(i128::MAX)))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Scalar, E> {
                // Integers too wide for 64 bits arrive as floats.
                let huge = v.is_finite() && v.fract() == 0.0 && v.abs() >= 9e18;
                Ok(Scalar::Other(if huge {
                    "a number out of range"
                } else {
                    "a fractional number"
                }))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar::Str(v.to_owned()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Scalar, E> {
                Ok(Scalar::Str(v))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Scalar, E> {
                Ok(Scalar::Other("null"))
            }
            fn visit_none<E: de::Error>(self) -> Result<Scalar, E> {
                Ok(Scalar::Other("null"))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Scalar, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Scalar::Other("a list"))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Scalar, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Scalar::Other("a mapping"))
            }
        }
        deserializer.deserialize_any(ScalarVisitor)
    }
}

/// A YAML mapping kept as its entries, in document order (duplicate keys are already an error
/// in serde-saphyr).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pairs<K, V>(pub(crate) Vec<(K, V)>);

impl<'de, K: Deserialize<'de>, V: Deserialize<'de>> Deserialize<'de> for Pairs<K, V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct PairsVisitor<K, V>(PhantomData<(K, V)>);
        impl<'de, K: Deserialize<'de>, V: Deserialize<'de>> Visitor<'de> for PairsVisitor<K, V> {
            type Value = Pairs<K, V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Pairs<K, V>, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(Pairs(entries))
            }
        }
        deserializer.deserialize_map(PairsVisitor(PhantomData))
    }
}

/// A located string.
pub(crate) type Text = Spanned<String>;

/// Where a located value was written (the use site, for an alias).
pub(crate) fn at<T>(value: &Spanned<T>) -> Location {
    value.referenced
}

/// Parses a humantime duration (`100ms`, `1m30s`, `2h 5m`), naming the field on error.
pub(crate) fn duration(
    field: &str,
    text: &Text,
    diag: &mut Diag<'_>,
) -> Option<std::time::Duration> {
    match humantime::parse_duration(text.value.trim()) {
        Ok(d) => Some(d),
        Err(e) => {
            diag.invalid(
                at(text),
                format!(
                    "`{field}`: {:?} is not a duration ({e}); write a number with a unit, \
                     such as \"100ms\", \"60s\" or \"1m30s\"",
                    sanitize(&text.value)
                ),
            );
            None
        }
    }
}

/// Checks that `value` is a whole number in `min..=max`, naming the field on error.
pub(crate) fn int_in_range(
    field: &str,
    value: &Spanned<Scalar>,
    min: i128,
    max: i128,
    diag: &mut Diag<'_>,
) -> Option<i128> {
    match &value.value {
        Scalar::Int(v) if (min..=max).contains(v) => Some(*v),
        other => {
            diag.invalid(
                at(value),
                format!("`{field}` must be a whole number from {min} to {max}, not {other}"),
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitize_escapes_control_characters_only() {
        assert_eq!(sanitize("a\u{1b}[31m\nb\té"), "a\\u{1b}[31m\\nb\\té");
    }

    #[test]
    fn scalars_read_whatever_is_written() {
        let read = |yaml: &str| serde_saphyr::from_str::<Scalar>(yaml).unwrap();
        assert_eq!(read("53"), Scalar::Int(53));
        assert_eq!(read("-1"), Scalar::Int(-1));
        assert_eq!(read("\"53\""), Scalar::Str("53".into()));
        assert_eq!(read("http"), Scalar::Str("http".into()));
        assert_eq!(read("1.5"), Scalar::Other("a fractional number"));
        assert_eq!(read("true"), Scalar::Other("a boolean"));
        assert_eq!(read("[1, 2]"), Scalar::Other("a list"));
        assert_eq!(read("{a: 1}"), Scalar::Other("a mapping"));
        assert_eq!(read("18446744073709551615"), Scalar::Int(u64::MAX.into()));
        assert_eq!(read("-9223372036854775808"), Scalar::Int(i64::MIN.into()));
        assert_eq!(
            read("99999999999999999999999"),
            Scalar::Other("a number out of range")
        );
    }

    #[test]
    fn key_position_finds_the_key_of_a_value() {
        let text = "a:\n  ingress: [x]\n  egress:\n  # egress: a comment\n  - y\n\"http\": 1\n";
        assert_eq!(key_position(text, (2, 12), "ingress"), Some((2, 3)));
        assert_eq!(key_position(text, (5, 5), "egress"), Some((3, 3)));
        assert_eq!(key_position(text, (6, 9), "http"), Some((6, 1)));
        // Not the key right before the value: no guess.
        assert_eq!(key_position(text, (5, 5), "ingress"), None);
        assert_eq!(key_position("xl7: 1\n", (1, 6), "l7"), None);
        assert_eq!(key_position("{l7: 1}\n", (1, 6), "l7"), Some((1, 2)));
        assert_eq!(key_position(text, (99, 1), "egress"), None);
        assert_eq!(key_position(text, (0, 0), "egress"), None);
    }

    #[test]
    fn pairs_keep_document_order() {
        let pairs: Pairs<String, String> = serde_saphyr::from_str("{b: 1, a: 2, c: 3}").unwrap();
        let keys: Vec<&str> = pairs.0.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["b", "a", "c"]);
    }
}
