//! What `rivet selftest` checks, with no I/O: the byte pattern, the checks of one received
//! buffer, and the A/B comparison of two data paths' completion sequences.

use std::fmt;

/// Byte written into receive buffers before each receive, and expected to survive past the
/// bytes the message covers.
pub(crate) const POISON: u8 = 0xA5;

/// Eight pattern bytes for word `word` of message `msg` (splitmix64 of both): a byte from another
/// message, another offset or a stale earlier receive differs with overwhelming likelihood.
fn pattern_word(msg: u64, word: u64) -> [u8; 8] {
    let mut z = (msg << 32 ^ word).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)).to_le_bytes()
}

/// Fill `buf` with message `msg`'s pattern.
pub(crate) fn fill(buf: &mut [u8], msg: u64) {
    for (word, chunk) in buf.chunks_mut(8).enumerate() {
        let bytes = pattern_word(msg, word as u64);
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
}

/// The first byte where `buf` differs from message `msg`'s pattern: (offset, found, expected).
fn first_pattern_mismatch(buf: &[u8], msg: u64) -> Option<(usize, u8, u8)> {
    for (word, chunk) in buf.chunks(8).enumerate() {
        let bytes = pattern_word(msg, word as u64);
        if chunk != &bytes[..chunk.len()] {
            let i = chunk.iter().zip(bytes).position(|(a, b)| *a != b)?;
            return Some((word * 8 + i, chunk[i], bytes[i]));
        }
    }
    None
}

/// Why a receive is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Mismatch {
    /// `test` reported another size than the sender sent.
    Size {
        /// Reported.
        got: usize,
        /// Sent.
        sent: usize,
    },
    /// A byte inside the message is not what was sent.
    Byte {
        /// Offset in the message.
        offset: usize,
        /// Found.
        got: u8,
        /// Sent.
        want: u8,
    },
    /// A byte of the posted buffer past the message's end was overwritten.
    PastEnd {
        /// Offset in the buffer.
        offset: usize,
        /// Found (instead of [`POISON`]).
        got: u8,
    },
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Size { got, sent } => write!(f, "completion says {got} B, {sent} B were sent"),
            Self::Byte { offset, got, want } => {
                write!(f, "byte {offset} is {got:#04x}, {want:#04x} was sent")
            }
            Self::PastEnd { offset, got } => write!(
                f,
                "byte {offset} past the message's end was overwritten ({got:#04x})"
            ),
        }
    }
}

/// Check one receive buffer (poisoned with [`POISON`] before the receive was posted): `reported`
/// is the size `test` gave, `sent` what the sender sent as message `msg`.
pub(crate) fn check_receive(
    buf: &[u8],
    msg: u64,
    sent: usize,
    reported: usize,
) -> Result<(), Mismatch> {
    if reported != sent {
        return Err(Mismatch::Size {
            got: reported,
            sent,
        });
    }
    let (message, rest) = buf.split_at(sent.min(buf.len()));
    if let Some((offset, got, want)) = first_pattern_mismatch(message, msg) {
        return Err(Mismatch::Byte { offset, got, want });
    }
    if let Some(i) = rest.iter().position(|b| *b != POISON) {
        return Err(Mismatch::PastEnd {
            offset: sent + i,
            got: rest[i],
        });
    }
    Ok(())
}

/// One completion as the test saw it: which phase, which message, which buffer of a grouped
/// receive, the size `test` reported and the tag. Two correct data paths produce equal sequences.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Completion {
    /// Phase name (`sizes`, `grouped`, `stream`).
    pub(crate) phase: &'static str,
    /// Message (or group) index within the phase.
    pub(crate) index: u64,
    /// Buffer within a grouped receive (0 otherwise).
    pub(crate) buffer: u8,
    /// Size `test` reported.
    pub(crate) size: usize,
    /// Tag of the receive.
    pub(crate) tag: i32,
}

impl fmt::Display for Completion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {} {} {}",
            self.phase, self.index, self.buffer, self.size, self.tag
        )
    }
}

impl Completion {
    /// Parse the [`Display`](fmt::Display) form back (the child process prints it).
    pub(crate) fn parse(line: &str) -> Option<Self> {
        let mut w = line.split(' ');
        let phase = match w.next()? {
            "sizes" => "sizes",
            "grouped" => "grouped",
            "stream" => "stream",
            _ => return None,
        };
        let c = Self {
            phase,
            index: w.next()?.parse().ok()?,
            buffer: w.next()?.parse().ok()?,
            size: w.next()?.parse().ok()?,
            tag: w.next()?.parse().ok()?,
        };
        w.next().is_none().then_some(c)
    }
}

/// Compare the completion sequences of two data paths: `Err` names the first difference.
pub(crate) fn compare_paths(
    (a_name, a): (&str, &[Completion]),
    (b_name, b): (&str, &[Completion]),
) -> Result<usize, String> {
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        if x != y {
            return Err(format!(
                "completion {i} differs: {a_name} [{x}], {b_name} [{y}] (phase index buffer size tag)"
            ));
        }
    }
    if a.len() != b.len() {
        return Err(format!(
            "{a_name} saw {} completions, {b_name} {}",
            a.len(),
            b.len()
        ));
    }
    Ok(a.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn received(msg: u64, sent: usize, posted: usize) -> Vec<u8> {
        let mut buf = vec![POISON; posted];
        fill(&mut buf[..sent], msg);
        buf
    }

    #[test]
    fn an_intact_receive_passes() {
        for sent in [0, 1, 7, 8, 9, 4097] {
            let buf = received(3, sent, sent + 64);
            assert_eq!(check_receive(&buf, 3, sent, sent), Ok(()));
        }
    }

    #[test]
    fn a_corrupted_byte_fails_at_its_offset() {
        let mut buf = received(5, 4097, 4200);
        buf[4093] ^= 0x10;
        let Err(Mismatch::Byte { offset, .. }) = check_receive(&buf, 5, 4097, 4097) else {
            panic!("a flipped bit must be caught");
        };
        assert_eq!(offset, 4093);
    }

    #[test]
    fn another_message_or_a_shifted_copy_fails() {
        // Stale data from the previous message in the same slot.
        let buf = received(6, 100, 164);
        assert!(matches!(
            check_receive(&buf, 7, 100, 100),
            Err(Mismatch::Byte { offset: 0, .. })
        ));
        // The right message written one byte late.
        let mut shifted = vec![POISON; 164];
        fill(&mut shifted[1..101], 7);
        assert!(check_receive(&shifted, 7, 100, 100).is_err());
    }

    #[test]
    fn a_wrong_completion_size_fails() {
        let buf = received(1, 64, 128);
        assert_eq!(
            check_receive(&buf, 1, 64, 63),
            Err(Mismatch::Size { got: 63, sent: 64 })
        );
    }

    #[test]
    fn a_write_past_the_message_fails() {
        let mut buf = received(2, 10, 20);
        buf[12] = 0;
        assert_eq!(
            check_receive(&buf, 2, 10, 10),
            Err(Mismatch::PastEnd { offset: 12, got: 0 })
        );
    }

    fn seq(sizes: &[usize]) -> Vec<Completion> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, &size)| Completion {
                phase: "stream",
                index: i as u64,
                buffer: 0,
                size,
                tag: 7,
            })
            .collect()
    }

    #[test]
    fn equal_sequences_agree_and_any_difference_fails() {
        let a = seq(&[0, 1, 4096]);
        assert_eq!(compare_paths(("verbs", &a), ("mlx5", &a)), Ok(3));
        let b = seq(&[0, 2, 4096]);
        let err = compare_paths(("verbs", &a), ("mlx5", &b)).unwrap_err();
        assert!(err.contains("completion 1"), "{err}");
        let mut c = a.clone();
        c[2].tag = 8;
        assert!(compare_paths(("verbs", &a), ("mlx5", &c)).is_err());
        assert!(compare_paths(("verbs", &a), ("mlx5", &a[..2])).is_err());
    }

    #[test]
    fn completions_print_and_parse_back() {
        let c = Completion {
            phase: "grouped",
            index: 12,
            buffer: 3,
            size: 65537,
            tag: -4,
        };
        assert_eq!(Completion::parse(&c.to_string()), Some(c));
        assert_eq!(Completion::parse("grouped 1 2 3"), None);
        assert_eq!(Completion::parse("other 1 2 3 4"), None);
    }
}
