//! DNS 0x20 (draft-vixie-dnsext-dns0x20): the case of each letter of a forwarded query's name
//! is chosen at random, and the answer must echo it exactly. Resolvers compare names
//! case-insensitively but copy the question byte for byte, so a real answer passes and a
//! spoofer has one more bit to guess per letter.
//!
//! Only bytes are rewritten, in place: the message is never re-serialised. Label length bytes
//! are below 64 and never letters (`A` is 65), so flipping every ASCII letter of the name's
//! wire form leaves its structure alone.

use crate::ids::IdSource;
use crate::question::Question;

/// Sets the case of every ASCII letter of the name of `question`, the question of `raw`, from
/// random bits; writes the name as it now is into `sent` (emptied first), to compare the
/// answer with.
pub(crate) fn randomize(
    raw: &mut [u8],
    question: Question,
    ids: &mut IdSource,
    sent: &mut Vec<u8>,
) {
    let name = question.name_mut(raw);
    let mut bits = 0u16;
    let mut left = 0;
    for b in name.iter_mut().filter(|b| b.is_ascii_alphabetic()) {
        if left == 0 {
            bits = ids.next_id();
            left = 16;
        }
        *b = if bits & 1 == 1 {
            b.to_ascii_uppercase()
        } else {
            b.to_ascii_lowercase()
        };
        bits >>= 1;
        left -= 1;
    }
    sent.clear();
    sent.extend_from_slice(name);
}

/// Writes the client's spelling of the question name (`asked`, the question of `query`) over
/// the answer's (`answered`, the question of `answer`), which must be the same name in another
/// case (checked before, with [`Question::same`]); names of different lengths are left alone.
pub(crate) fn restore(answer: &mut [u8], answered: Question, query: &[u8], asked: Question) {
    let (dst, src) = (answered.name_mut(answer), asked.name(query));
    if dst.len() == src.len() {
        dst.copy_from_slice(src);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::HEADER_LEN;

    fn query(name: &[u8]) -> Vec<u8> {
        let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        q.extend_from_slice(name);
        q.extend_from_slice(&[0, 1, 0, 1]);
        q
    }

    #[test]
    fn only_letters_change_case_and_the_choice_is_random() {
        let original = query(b"\x03www\x0bexample-123\x03com\x00");
        let question = Question::parse(&original).unwrap();
        let end = question.end();
        let mut ids = IdSource::new();
        let mut spellings = std::collections::HashSet::new();
        for _ in 0..64 {
            let mut q = original.clone();
            let mut sent = vec![0xff; 3];
            randomize(&mut q, question, &mut ids, &mut sent);
            assert_eq!(&sent[..], &q[HEADER_LEN..end - 4]);
            assert!(question.same(&q, question, &original), "same name");
            assert_eq!(q[..HEADER_LEN], original[..HEADER_LEN]);
            assert_eq!(q[end - 4..], original[end - 4..], "type and class kept");
            for (a, b) in q.iter().zip(&original) {
                assert!(a == b || (a.is_ascii_alphabetic() && a.eq_ignore_ascii_case(b)));
            }
            spellings.insert(q);
        }
        // 16 letters: 64 draws of 2^16 spellings are almost surely distinct.
        assert!(spellings.len() > 60, "{}", spellings.len());
    }

    #[test]
    fn restore_gives_the_client_its_spelling_back() {
        let client = query(b"\x03WwW\x07ExAmPlE\x00");
        let question = Question::parse(&client).unwrap();
        let end = question.end();
        let mut sent = client.clone();
        randomize(&mut sent, question, &mut IdSource::new(), &mut Vec::new());
        let mut answer = sent.clone();
        answer[2] |= 0x80;
        let answered = Question::parse(&answer).unwrap();
        restore(&mut answer, answered, &client, question);
        assert_eq!(answer[HEADER_LEN..end], client[HEADER_LEN..end]);
        assert_eq!(answer[2], client[2] | 0x80, "only the name is rewritten");
    }
}
