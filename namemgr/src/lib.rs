//! NameManager (in progress).

pub mod matcher;
pub mod name;
pub mod pattern;

pub use matcher::{Matcher, SelectorId};
pub use name::{DnsName, NameError, canonicalize};
pub use pattern::{FqdnSelector, PatternError, SelectorKind};
