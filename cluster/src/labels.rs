//! Label sets as the cluster stores them: what one global identity stands for.
//!
//! A [`Labels`] value is sorted and free of duplicates, so one label set has one rendering
//! whatever order its labels were written in: two nodes that see the same workload labels
//! agree on the key the allocator creates ([`Labels::key`]).

use std::fmt;

use serde::{Deserialize, Serialize};

/// One endpoint label, `source:key=value` (`k8s:app=web`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Label {
    /// Where the label comes from (`k8s` unless written otherwise).
    pub source: String,
    /// Its key.
    pub key: String,
    /// Its value (may be empty; always written: the state file's encoding has no field
    /// names, so a field left out would shift the rest).
    #[serde(default)]
    pub value: String,
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.value.is_empty() {
            write!(f, "{}:{}", self.source, self.key)
        } else {
            write!(f, "{}:{}={}", self.source, self.key, self.value)
        }
    }
}

/// A set of endpoint labels: sorted, without duplicates. Written as a list of labels; read
/// from any list (sorted and deduplicated on the way in).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(from = "Vec<Label>")]
pub struct Labels(Vec<Label>);

impl Serialize for Labels {
    // By reference: a state file holds a label set per remote endpoint (no copy per write).
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl From<Vec<Label>> for Labels {
    fn from(mut labels: Vec<Label>) -> Self {
        labels.sort();
        labels.dedup();
        Self(labels)
    }
}

impl From<Labels> for Vec<Label> {
    fn from(labels: Labels) -> Self {
        labels.0
    }
}

impl FromIterator<Label> for Labels {
    fn from_iter<I: IntoIterator<Item = Label>>(iter: I) -> Self {
        Self::from(iter.into_iter().collect::<Vec<_>>())
    }
}

impl Labels {
    /// The labels, sorted.
    pub fn iter(&self) -> std::slice::Iter<'_, Label> {
        self.0.iter()
    }

    /// Number of labels.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The set as one etcd key segment: each part percent-encoded (everything but
    /// `A-Z a-z 0-9 . _ -`), `source:key=value` joined with `,`. Injective: two different
    /// sets never share a key, and the segment never holds a `/`.
    pub fn key(&self) -> String {
        let mut out = String::new();
        for (i, l) in self.0.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            encode(&l.source, &mut out);
            out.push(':');
            encode(&l.key, &mut out);
            out.push('=');
            encode(&l.value, &mut out);
        }
        out
    }

    /// Reads back a segment written by [`Labels::key`]; `None` if it is not one.
    pub fn from_key(segment: &str) -> Option<Self> {
        if segment.is_empty() {
            return Some(Self::default());
        }
        let mut labels = Vec::new();
        for part in segment.split(',') {
            let (source, rest) = part.split_once(':')?;
            let (key, value) = rest.split_once('=')?;
            labels.push(Label {
                source: decode(source)?,
                key: decode(key)?,
                value: decode(value)?,
            });
        }
        let set = Self::from(labels);
        (set.key() == segment).then_some(set)
    }
}

impl fmt::Display for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, l) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{l}")?;
        }
        Ok(())
    }
}

fn encode(text: &str, out: &mut String) {
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
}

fn decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn label(source: &str, key: &str, value: &str) -> Label {
        Label {
            source: source.into(),
            key: key.into(),
            value: value.into(),
        }
    }

    #[test]
    fn order_and_duplicates_do_not_change_the_set() {
        let a = Labels::from(vec![
            label("k8s", "app", "web"),
            label("k8s", "env", "prod"),
        ]);
        let b = Labels::from(vec![
            label("k8s", "env", "prod"),
            label("k8s", "app", "web"),
            label("k8s", "app", "web"),
        ]);
        assert_eq!(a, b);
        assert_eq!(a.key(), "k8s:app=web,k8s:env=prod");
        assert_eq!(a.to_string(), "k8s:app=web,k8s:env=prod");
    }

    #[test]
    fn separators_inside_parts_are_encoded() {
        let a = Labels::from(vec![label("k8s", "app.kubernetes.io/name", "a,b=c")]);
        assert_eq!(a.key(), "k8s:app.kubernetes.io%2Fname=a%2Cb%3Dc");
        assert!(!a.key().contains('/'));
        assert_eq!(Labels::from_key(&a.key()), Some(a));
        assert_eq!(Labels::from_key("k8s:app=%zz"), None);
        assert_eq!(Labels::from_key("no-colon"), None);
    }

    proptest! {
        /// The key segment is injective and reads back.
        #[test]
        fn keys_round_trip_and_never_collide(
            a in proptest::collection::vec(("[a-z:=,/%]{0,4}", "[a-z:=,/%]{1,4}", "[a-z:=,/% ]{0,4}"), 0..4),
            b in proptest::collection::vec(("[a-z:=,/%]{0,4}", "[a-z:=,/%]{1,4}", "[a-z:=,/% ]{0,4}"), 0..4),
        ) {
            let make = |v: &Vec<(String, String, String)>| -> Labels {
                v.iter().map(|(s, k, x)| label(s, k, x)).collect()
            };
            let (a, b) = (make(&a), make(&b));
            prop_assert_eq!(Labels::from_key(&a.key()), Some(a.clone()));
            prop_assert_eq!(a.key() == b.key(), a == b);
            prop_assert!(!a.key().contains('/'));
        }
    }
}
