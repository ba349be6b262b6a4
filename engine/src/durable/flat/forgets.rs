//! Journaled forgets ([`Record::Forgotten`](crate::durable::Record::Forgotten)) applied to the
//! answers restored before them, so that a restart does not bring back what was forgotten —
//! while an answer journaled after a forget (the name asked again) is learned as usual.

use std::collections::HashMap;
use std::net::IpAddr;

use super::{Answers, TooLarge, append, range};

/// One journaled forget, and where in the journal it came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Forgot {
    /// How many answers were pushed before it: it applies to those.
    pub(crate) before: usize,
    /// The canonical name.
    pub(crate) name: String,
    /// The mappings forgotten for every endpoint (`None`: all of the name's).
    pub(crate) addrs: Option<Vec<IpAddr>>,
    /// The endpoint whose record of the name was forgotten.
    pub(crate) endpoint: Option<u16>,
}

impl Answers {
    /// Applies `forgets` (in journal order) to the answers before each: the addresses
    /// forgotten leave those answers (an answer left without any is dropped), and the answers
    /// of an endpoint whose record was forgotten are counted for another endpoint that asked
    /// the name before (the cache is shared: the mappings stayed, the record did not; with
    /// no other endpoint they stay the endpoint's). One pass over the answers, and work only
    /// for the names forgotten.
    ///
    /// # Errors
    /// The rewritten addresses outgrow the flat vectors.
    pub(crate) fn forget(&mut self, forgets: &[Forgot]) -> Result<(), TooLarge> {
        if forgets.is_empty() {
            return Ok(());
        }
        let mut hits: HashMap<&str, Vec<usize>> = forgets
            .iter()
            .map(|f| (f.name.as_str(), Vec::new()))
            .collect();
        for (at, item) in self.items.iter().enumerate() {
            let name = self.names.get(range(item.name)).unwrap_or_default();
            if let Some(list) = hits.get_mut(name) {
                list.push(at);
            }
        }
        let mut emptied = false;
        for f in forgets {
            let Some(list) = hits.get(f.name.as_str()) else {
                continue;
            };
            let before = list.partition_point(|&at| at < f.before);
            let earlier = list.get(..before).unwrap_or_default();
            if let Some(ep) = f.endpoint {
                let other = earlier
                    .iter()
                    .filter_map(|&at| self.items.get(at))
                    .filter(|item| item.endpoint != ep && item.addrs.0 != item.addrs.1)
                    .map(|item| item.endpoint)
                    .min();
                if let Some(other) = other {
                    for &at in earlier {
                        if let Some(item) = self.items.get_mut(at)
                            && item.endpoint == ep
                        {
                            item.endpoint = other;
                        }
                    }
                }
            }
            for &at in earlier {
                let Some(item) = self.items.get(at).copied() else {
                    continue;
                };
                let held = self.addrs.get(range(item.addrs)).unwrap_or_default();
                let kept: Vec<IpAddr> = match &f.addrs {
                    None => Vec::new(),
                    Some(gone) => held.iter().copied().filter(|a| !gone.contains(a)).collect(),
                };
                if kept.len() == held.len() {
                    continue;
                }
                emptied |= kept.is_empty();
                let addrs = append(&mut self.addrs, kept.into_iter())?;
                if let Some(item) = self.items.get_mut(at) {
                    item.addrs = addrs;
                }
            }
        }
        if emptied {
            let mut unnumbered = 0;
            self.items.retain(|item| {
                let keep = item.addrs.0 != item.addrs.1;
                if !keep && item.number == super::NO_NUMBER {
                    unnumbered += 1;
                }
                keep
            });
            self.unnumbered -= unnumbered;
            self.out_of_order = self
                .items
                .windows(2)
                .any(|w| w[1].expires_unix_ms > w[0].expires_unix_ms);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fqdnd_ipcache::EndpointId;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([192, 0, 2, last])
    }

    fn forgot(before: usize, name: &str, addrs: Option<&[IpAddr]>, ep: Option<u16>) -> Forgot {
        Forgot {
            before,
            name: name.into(),
            addrs: addrs.map(<[IpAddr]>::to_vec),
            endpoint: ep,
        }
    }

    fn listed(answers: &Answers) -> Vec<(u16, &str, Vec<IpAddr>)> {
        answers
            .iter()
            .map(|a| (a.endpoint.0, a.name, a.addrs.to_vec()))
            .collect()
    }

    #[test]
    fn a_forget_applies_to_the_answers_before_it_only() {
        let mut answers = Answers::default();
        answers
            .push(EndpointId(1), "a.test.", &[ip(1), ip(2)], 30)
            .unwrap();
        answers
            .push(EndpointId(2), "a.test.", &[ip(3)], 20)
            .unwrap();
        answers
            .push(EndpointId(1), "b.test.", &[ip(9)], 10)
            .unwrap();
        // ip(1) forgotten after the first three; asked again afterwards (the fourth).
        answers
            .push(EndpointId(1), "a.test.", &[ip(1)], 40)
            .unwrap();
        // Endpoint 1's record of a.test. forgotten: its answers count for endpoint 2.
        // Then every mapping of b.test.
        answers
            .forget(&[
                forgot(3, "a.test.", Some(&[ip(1)]), None),
                forgot(4, "a.test.", Some(&[]), Some(1)),
                forgot(4, "b.test.", None, None),
            ])
            .unwrap();
        assert_eq!(
            listed(&answers),
            [
                (2, "a.test.", vec![ip(2)]),
                (2, "a.test.", vec![ip(3)]),
                (2, "a.test.", vec![ip(1)]),
            ]
        );
        assert_eq!(answers.unnumbered, 3);
        assert!(answers.out_of_order);
    }
}
