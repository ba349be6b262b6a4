//! Allow and deny lists, in the formats DNS firewalls share:
//!
//! | line | means |
//! |---|---|
//! | `example.com` | the name and every name below it (Blocky, AdGuard Home) |
//! | `*.example.com` | every name below it, not the name itself |
//! | `0.0.0.0 ads.example.com` (hosts file) | exactly that name (each name on the line) |
//! | `\|\|example.com^` (AdBlock) | the name and every name below it |
//!
//! `#` and `!` start comments; AdBlock exceptions (`@@`), modifiers (`$…`) and cosmetic rules
//! are not DNS rules and are reported, not guessed at. Entries compile into one
//! [`Matcher`], so a list of 100k names costs a trie walk per query.

use std::net::IpAddr;
use std::path::Path;

use fqdnd_namemgr::{FqdnSelector, Matcher, NameLabels, SelectorId};

use crate::Error;

/// A compiled allow or deny list.
#[derive(Debug, Default)]
pub struct NameList {
    matcher: Matcher,
    entries: usize,
}

/// A line that is not a DNS rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Line number (1-based) in the list, or entry number for inline entries.
    pub line: usize,
    /// Why it is not a DNS rule.
    pub reason: &'static str,
}

impl NameList {
    /// Adds the lines of one list; returns the lines skipped, with why.
    pub fn add_text(&mut self, text: &str) -> Vec<Skipped> {
        let mut skipped = Vec::new();
        for (n, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or_default().trim();
            if line.is_empty() || line.starts_with('!') || line.starts_with('[') {
                continue;
            }
            match self.add_line(line) {
                Ok(()) => {}
                Err(reason) => skipped.push(Skipped {
                    line: n + 1,
                    reason,
                }),
            }
        }
        skipped
    }

    /// Adds one list file.
    ///
    /// # Errors
    /// The file cannot be read.
    pub fn add_file(&mut self, path: &Path) -> Result<Vec<Skipped>, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::List {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(self.add_text(&text))
    }

    fn add_line(&mut self, line: &str) -> Result<(), &'static str> {
        if line.starts_with("@@") {
            return Err("AdBlock exception rules (@@) are not supported; use an allow list");
        }
        if let Some(rest) = line.strip_prefix("||") {
            let name = rest
                .strip_suffix('^')
                .ok_or("an AdBlock rule must end with ^")?;
            if name.contains(['$', '/', '*']) {
                return Err("AdBlock modifiers, paths and wildcards are not DNS rules");
            }
            return self.add_subtree(name);
        }
        let mut fields = line.split_whitespace();
        let first = fields.next().unwrap_or_default();
        if first.parse::<IpAddr>().is_ok() {
            let mut any = false;
            for name in fields {
                self.add_selector(
                    FqdnSelector::match_name(name).map_err(|_| "invalid name in a hosts line")?,
                );
                any = true;
            }
            return if any {
                Ok(())
            } else {
                Err("a hosts line needs a name after the address")
            };
        }
        if fields.next().is_some() {
            return Err("expected one name per line");
        }
        if let Some(suffix) = first.strip_prefix("*.") {
            let below = FqdnSelector::match_pattern(&format!("**.{suffix}"))
                .map_err(|_| "invalid wildcard")?;
            self.add_selector(below);
            return Ok(());
        }
        self.add_subtree(first)
    }

    fn add_subtree(&mut self, name: &str) -> Result<(), &'static str> {
        let exact = FqdnSelector::match_name(name).map_err(|_| "invalid name")?;
        let below =
            FqdnSelector::match_pattern(&format!("**.{name}")).map_err(|_| "invalid name")?;
        self.add_selector(exact);
        self.add_selector(below);
        Ok(())
    }

    fn add_selector(&mut self, selector: FqdnSelector) {
        self.matcher.insert(&selector, SelectorId(0));
        self.entries += 1;
    }

    /// Whether the canonical `name` is on the list.
    pub fn contains(&self, name: &str) -> bool {
        self.contains_labels(NameLabels::new(name).as_ref())
    }

    /// [`NameList::contains`] for a name already split (`None`, a name without its final
    /// dot, never is on a list).
    pub fn contains_labels(&self, name: Option<&NameLabels<'_>>) -> bool {
        name.is_some_and(|name| self.matcher.is_match_labels(name))
    }

    /// Patterns compiled (a subtree entry counts twice).
    pub fn len(&self) -> usize {
        self.entries
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_format_means_what_firewalls_mean() {
        let mut list = NameList::default();
        let skipped = list.add_text(
            "# comment\nads.example.com\n*.track.example\n0.0.0.0 one.example two.example\n||adblock.example^\n! adblock comment\n@@||ok.example^\n||x.example^$third-party\nbad name here\n",
        );
        assert!(list.contains("ads.example.com.") && list.contains("a.b.ads.example.com."));
        assert!(!list.contains("example.com."));
        assert!(list.contains("x.track.example.") && !list.contains("track.example."));
        assert!(
            list.contains("one.example.")
                && list.contains("two.example.")
                && !list.contains("a.one.example.")
        );
        assert!(list.contains("adblock.example.") && list.contains("sub.adblock.example."));
        assert_eq!(
            skipped.iter().map(|s| s.line).collect::<Vec<_>>(),
            vec![7, 8, 9]
        );
    }
}
