//! Glue to serde-saphyr: collecting located errors, reading a document's mappings so that an
//! unknown field does not stop the rest of the document from being checked, and the small
//! value types the document shapes share (whole numbers, ports, ordered maps).

use std::cell::RefCell;
use std::fmt;
use std::marker::PhantomData;
use std::path::Path;

use serde::Deserialize;
use serde::de::{
    self, DeserializeSeed, Deserializer, IgnoredAny, IntoDeserializer, MapAccess, SeqAccess,
    Visitor,
};
use serde_saphyr::{Location, MessageFormatter, Spanned};

use crate::documents::Document;
use crate::error::Error;

/// Collects the errors of one file, each located in it.
///
/// The file is parsed one document at a time ([`crate::documents`]), so the locations the
/// parser gives are relative to the current document ([`Diag::enter`]); every error Diag builds
/// is located in the whole file.
pub(crate) struct Diag<'a> {
    file: &'a Path,
    /// The current document's text: used to find the key of a value.
    text: Option<&'a str>,
    /// Lines of the file before the current document.
    line_offset: u64,
    /// The unknown fields of the current document (reported already), to leave out a missing
    /// field that is one of them misspelt.
    unknown: Vec<UnknownField>,
    errors: Vec<Error>,
}

impl<'a> Diag<'a> {
    pub(crate) fn new(file: &'a Path) -> Self {
        Self {
            file,
            text: None,
            line_offset: 0,
            unknown: Vec::new(),
            errors: Vec::new(),
        }
    }

    /// From now on, locations are those of a parser given `document.text` alone.
    pub(crate) fn enter(&mut self, document: &Document<'a>) {
        self.text = Some(document.text);
        self.line_offset = document.input_line(1) - 1;
        self.unknown.clear();
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

    /// The 1-based `(line, column)` in the file of `at`, a location in the current document;
    /// an unknown location becomes the start of the document.
    pub(crate) fn position(&self, at: Location) -> (u64, u64) {
        self.shift(position(at))
    }

    fn shift(&self, (line, column): (u64, u64)) -> (u64, u64) {
        (line.saturating_add(self.line_offset), column)
    }

    /// A problem with a well-formed value at `at`.
    pub(crate) fn invalid(&mut self, at: Location, message: impl Into<String>) {
        let (line, column) = self.position(at);
        self.errors.push(Error::Invalid {
            file: self.file.to_path_buf(),
            line,
            column,
            message: message.into(),
        });
    }

    /// A required field is missing from the mapping at `at`: `fields` are the names that would
    /// have satisfied it. Not reported when that mapping has an unknown field within two edits
    /// of one of them (`adresses`, `endpointSelectr`): the unknown-field error already says
    /// what is wrong, and the missing field is most likely that one, misspelt.
    pub(crate) fn missing(&mut self, at: Location, fields: &[&str], message: impl Into<String>) {
        let misspelt = self.unknown.iter().any(|u| {
            u.mapping == Some(position(at))
                && fields.iter().any(|f| edit_distance(&u.field, f) <= 2)
        });
        if !misspelt {
            self.invalid(at, message);
        }
    }

    /// A refused field `key` whose value is at `value_at` (located as [`Diag::invalid_field`]).
    pub(crate) fn unsupported(
        &mut self,
        value_at: Location,
        key: &str,
        field: impl Into<String>,
        why: crate::error::Unsupported,
    ) {
        let (line, column) = self.shift(
            self.text
                .and_then(|text| key_position(text, position(value_at), key))
                .unwrap_or_else(|| position(value_at)),
        );
        self.errors.push(Error::Unsupported {
            file: self.file.to_path_buf(),
            line,
            column,
            field: field.into(),
            why,
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
        let (line, column) = self.shift(
            self.text
                .and_then(|text| key_position(text, position(value_at), key))
                .unwrap_or_else(|| position(value_at)),
        );
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
        let (line, column) = self.position(at);
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

    /// Reports the unknown fields found while reading the current document (each once, though
    /// a mapping read again through an alias meets them again).
    pub(crate) fn unknown_fields(&mut self, found: Vec<UnknownField>) {
        for field in found {
            if self
                .unknown
                .iter()
                .any(|u| u.field == field.field && u.at == field.at)
            {
                continue;
            }
            let (line, column) = self.shift(field.at);
            self.errors.push(Error::Invalid {
                file: self.file.to_path_buf(),
                line,
                column,
                message: unknown_field_message(&field.field, field.expected),
            });
            self.unknown.push(field);
        }
    }

    pub(crate) fn into_errors(self) -> Vec<Error> {
        self.errors
    }
}

/// Levenshtein distance between two field names (short: quadratic is fine).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitute = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}

/// A field a document shape does not have, met while reading a document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UnknownField {
    /// The key as written (sanitised).
    field: String,
    /// Where the key is written, in the document.
    at: (u64, u64),
    /// Where the mapping holding it starts, in the document, once known.
    mapping: Option<(u64, u64)>,
    /// The fields of the shape.
    expected: &'static [&'static str],
}

thread_local! {
    /// The unknown fields met by the read in progress on this thread, when it collects them
    /// ([`collect_unknown_fields`]). serde's `Deserialize` takes no context argument, so this
    /// is the only way out of a derived implementation; serde-saphyr locates serde's own
    /// errors the same way.
    static UNKNOWN_FIELDS: RefCell<Option<Vec<UnknownField>>> = const { RefCell::new(None) };
}

/// Runs `read` (a serde-saphyr read of document shapes) collecting, instead of failing on, the
/// unknown fields it meets, and returns them beside its result. Outside of it, an unknown field
/// is an error, as with `#[serde(deny_unknown_fields)]`.
pub(crate) fn collect_unknown_fields<R>(read: impl FnOnce() -> R) -> (R, Vec<UnknownField>) {
    /// Puts back what was collecting before, even if `read` unwinds.
    struct Restore(Option<Vec<UnknownField>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            UNKNOWN_FIELDS.with(|u| *u.borrow_mut() = previous);
        }
    }
    let restore = Restore(UNKNOWN_FIELDS.with(|u| u.borrow_mut().replace(Vec::new())));
    let result = read();
    let found = UNKNOWN_FIELDS
        .with(|u| u.borrow_mut().take())
        .unwrap_or_default();
    drop(restore);
    (result, found)
}

/// Records an unknown field; `false` when nothing is collecting.
fn record_unknown_field(key: &Spanned<String>, expected: &'static [&'static str]) -> bool {
    UNKNOWN_FIELDS.with(|u| match u.borrow_mut().as_mut() {
        Some(found) => {
            found.push(UnknownField {
                field: sanitize(&key.value),
                at: position(key.defined),
                mapping: None,
                expected,
            });
            true
        }
        None => false,
    })
}

/// How many unknown fields are collected so far (0 when nothing is collecting).
fn unknown_field_count() -> usize {
    UNKNOWN_FIELDS.with(|u| u.borrow().as_ref().map_or(0, Vec::len))
}

/// Notes that the unknown fields collected from `from` on and not yet placed are in the
/// mapping at `mapping` (inner mappings are read, and place theirs, first).
fn place_unknown_fields(from: usize, mapping: Location) {
    UNKNOWN_FIELDS.with(|u| {
        if let Some(found) = u.borrow_mut().as_mut() {
            for field in found.iter_mut().skip(from) {
                field.mapping.get_or_insert(position(mapping));
            }
        }
    });
}

/// A document shape: a struct whose `Deserialize` is derived with `#[serde(remote = "Self")]`
/// (an inherent `deserialize`) and implemented by [`shape!`] around it, so that an unknown
/// field is collected and skipped ([`collect_unknown_fields`]) instead of ending the read of
/// the whole document.
pub(crate) trait Shape: Sized {
    /// The derived implementation.
    fn derived<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error>;
}

/// Implements [`Shape`] and `Deserialize` for structs deriving `Deserialize` with
/// `#[serde(remote = "Self")]`.
macro_rules! shape {
    ($($shape:ty),+ $(,)?) => {$(
        impl $crate::yaml::Shape for $shape {
            fn derived<'de, D: serde::Deserializer<'de>>(
                deserializer: D,
            ) -> Result<Self, D::Error> {
                <$shape>::deserialize(deserializer)
            }
        }

        impl<'de> serde::Deserialize<'de> for $shape {
            fn deserialize<D: serde::Deserializer<'de>>(
                deserializer: D,
            ) -> Result<Self, D::Error> {
                $crate::yaml::read_shape(deserializer)
            }
        }
    )+};
}
pub(crate) use shape;

/// `Deserialize` of a [`Shape`]: reads a mapping, handing the derived implementation only
/// the keys it knows.
pub(crate) fn read_shape<'de, T: Shape, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<T, D::Error> {
    /// The mapping itself, read inside `Spanned` to learn where it starts.
    struct Mapping<T>(T);
    impl<'de, T: Shape> Deserialize<'de> for Mapping<T> {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            deserializer
                .deserialize_map(MappingVisitor(PhantomData))
                .map(Mapping)
        }
    }
    struct MappingVisitor<T>(PhantomData<T>);
    impl<'de, T: Shape> Visitor<'de> for MappingVisitor<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a mapping")
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            T::derived(KnownFields { map })
        }
    }
    let from = unknown_field_count();
    let mapping = Spanned::<Mapping<T>>::deserialize(deserializer)?;
    place_unknown_fields(from, mapping.referenced);
    Ok(mapping.value.0)
}

/// A mapping handed to a derived `Deserialize`, as a deserializer.
struct KnownFields<A> {
    map: A,
}

impl<'de, A: MapAccess<'de>> Deserializer<'de> for KnownFields<A> {
    type Error = A::Error;

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        visitor.visit_map(KnownFieldsAccess {
            map: self.map,
            fields,
        })
    }

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, A::Error> {
        self.deserialize_struct("", &[], visitor)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

/// The entries of a mapping whose keys are among `fields`; the others are recorded as unknown
/// (or are an error, when nothing collects them) and skipped.
struct KnownFieldsAccess<A> {
    map: A,
    fields: &'static [&'static str],
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for KnownFieldsAccess<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        loop {
            let Some(key) = self.map.next_key::<Spanned<String>>()? else {
                return Ok(None);
            };
            if self.fields.contains(&key.value.as_str()) {
                return seed.deserialize(key.value.into_deserializer()).map(Some);
            }
            if !record_unknown_field(&key, self.fields) {
                return Err(de::Error::unknown_field(&key.value, self.fields));
            }
            self.map.next_value::<IgnoredAny>()?;
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.map.next_value_seed(seed)
    }

    fn size_hint(&self) -> Option<usize> {
        self.map.size_hint()
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

/// 1-based `(line, column)` in the text parsed; an unknown location becomes its start.
fn position(at: Location) -> (u64, u64) {
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
fn yaml_message(error: &serde_saphyr::Error) -> String {
    let error = inner(error);
    if let serde_saphyr::Error::SerdeUnknownField {
        field, expected, ..
    } = error
    {
        return unknown_field_message(&sanitize(field), expected);
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

/// The message for the unknown field `field` (sanitised) of a shape whose fields are
/// `expected`: fields that fqdnd recognises in order to reject them (see
/// [`crate::cnp::is_rejected`]) are not offered as alternatives.
fn unknown_field_message(field: &str, expected: &[&str]) -> String {
    let alternatives: Vec<String> = expected
        .iter()
        .filter(|name| !crate::cnp::is_rejected(expected, name))
        .map(|name| format!("`{name}`"))
        .collect();
    format!(
        "unknown field `{field}`: expected one of {}",
        alternatives.join(", ")
    )
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
