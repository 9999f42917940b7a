//! The failover report: the one message each end sends the other over the connection's handshake
//! socket when a lane fails over ([`super`]). Fixed length, little-endian:
//!
//! | offset | bytes | field |
//! |---|---|---|
//! | 0 | 4 | magic `RVFO` |
//! | 4 | 1 | version ([`REPORT_VERSION`]) |
//! | 5 | 1 | kind: 1 sender, 2 receiver, 3 refusal, 4 keys |
//! | 6 | 1 | lane (queue pair index within the connection, below [`MAX_LANES`]) |
//! | 7 | 1 | attempt (the sender of the report's count of failovers begun, 1-based; 0 in a refusal) |
//! | 8 | 4 | sender: `ended`; receiver: `oldest`; refusal: the [`Refusal`] code; keys: pairs carried (1 to [`KEYS_PER_REPORT`]) |
//! | 12 | 4 | sender: `acked`; receiver: `announced`; refusal, keys: 0 |
//! | 16 | 1 | flags: bit 0 eager on, bit 1 rekeyed (the writer's lane moves to another device: its memory keys change); every other bit zero |
//! | 17 | 1 | bytes of `qp_info` used (at most [`QP_INFO_LEN`]; keys: 8 per pair) |
//! | 18 | 1 | sender, receiver: the port index the writer's lane moves to, plus one (0: not said); refusal, keys: 0 |
//! | 19 | 1 | receiver: key reports that follow this one (rekeyed only); otherwise 0 |
//! | 20 | 80 | `qp_info`: the new queue pair's connection info, opaque to the core (the plugin fills and reads it); keys: the pairs, old key then new key; unused bytes zero |
//! | 100 | 4 | check: FNV-1a of bytes 0..100 |
//!
//! Every field is validated on decode; what the numbers mean against the reader's own state is
//! checked by [`plan_sender`](super::plan_sender) and [`plan_receiver`](super::plan_receiver).

use core::fmt;

use super::{MAX_LANES, ReceiverSnapshot, SenderSnapshot};

/// Version of the report layout.
pub const REPORT_VERSION: u8 = 1;
/// Bytes of an encoded report.
pub const REPORT_LEN: usize = 20 + QP_INFO_LEN + 4;
/// Bytes of opaque queue-pair connection info a report carries at most.
pub const QP_INFO_LEN: usize = 80;
/// Memory-key pairs (old, new) one key report carries at most.
pub const KEYS_PER_REPORT: usize = QP_INFO_LEN / 8;

const MAGIC: [u8; 4] = *b"RVFO";
const KIND_SENDER: u8 = 1;
const KIND_RECEIVER: u8 = 2;
const KIND_REFUSAL: u8 = 3;
const KIND_KEYS: u8 = 4;
const FLAG_EAGER: u8 = 1;
const FLAG_REKEYED: u8 = 2;
const CHECKED_LEN: usize = REPORT_LEN - 4;

/// The new queue pair's connection info (number, GID, …), as the plugin encodes it: the core
/// only carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpInfo {
    len: u8,
    bytes: [u8; QP_INFO_LEN],
}

impl QpInfo {
    /// No info (a refusal, or a test).
    pub const EMPTY: Self = Self {
        len: 0,
        bytes: [0; QP_INFO_LEN],
    };

    /// `bytes` as info; `None` when longer than [`QP_INFO_LEN`].
    pub fn new(bytes: &[u8]) -> Option<Self> {
        let mut info = Self::EMPTY;
        info.bytes.get_mut(..bytes.len())?.copy_from_slice(bytes);
        info.len = bytes.len() as u8;
        Some(info)
    }

    /// The info's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

/// Why an end refused to fail a lane over (it then fails the connection, and so does the peer
/// on reading the refusal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Failover is off on this end.
    Disabled,
    /// This end gave up (any reason of [`FailoverError`](super::FailoverError)).
    GaveUp,
}

impl Refusal {
    fn code(self) -> u32 {
        match self {
            Self::Disabled => 1,
            Self::GaveUp => 2,
        }
    }

    fn from_code(code: u32) -> Option<Self> {
        match code {
            1 => Some(Self::Disabled),
            2 => Some(Self::GaveUp),
            _ => None,
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Disabled => "port failover is off there",
            Self::GaveUp => "it gave up failing over",
        })
    }
}

/// What a report says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReportBody {
    /// The sending end's state of the lane, quiesced.
    Sender(SenderSnapshot),
    /// The receiving end's state of the lane, quiesced (final: its old queue pair is in error).
    Receiver(ReceiverSnapshot),
    /// The end will not fail over: the connection fails.
    Refusal(Refusal),
    /// Some of a rekeyed receiver's memory keys, old and new: after its report, the receiver
    /// sends as many of these as it said, so the sender can rewrite the keys of clear-to-send
    /// entries it had consumed before the failure.
    Keys(KeyChunk),
}

/// Up to [`KEYS_PER_REPORT`] memory-key pairs (the key a receive buffer had on the lane's old
/// device, the one it has on the new device).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct KeyChunk {
    pairs: [(u32, u32); KEYS_PER_REPORT],
    len: u8,
}

impl KeyChunk {
    /// `pairs` as a chunk; `None` when empty or longer than [`KEYS_PER_REPORT`].
    pub fn new(pairs: &[(u32, u32)]) -> Option<Self> {
        if pairs.is_empty() || pairs.len() > KEYS_PER_REPORT {
            return None;
        }
        let mut chunk = Self {
            pairs: [(0, 0); KEYS_PER_REPORT],
            len: pairs.len() as u8,
        };
        chunk.pairs[..pairs.len()].copy_from_slice(pairs);
        Some(chunk)
    }

    /// The pairs.
    pub fn pairs(&self) -> &[(u32, u32)] {
        &self.pairs[..usize::from(self.len)]
    }
}

impl fmt::Debug for KeyChunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.pairs().iter().copied()).finish()
    }
}

/// One failover report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Report {
    /// The lane failing over.
    pub lane: u8,
    /// The writer's count of failovers begun (0 in a refusal).
    pub attempt: u8,
    /// The state or the refusal.
    pub body: ReportBody,
    /// The writer's new queue pair (empty in a refusal and in keys).
    pub qp_info: QpInfo,
    /// Sender, receiver: the port index the writer's lane moves to (`None`: not said).
    pub port: Option<u8>,
    /// Sender, receiver: the writer's lane moves to another device, so its memory keys change.
    pub rekeyed: bool,
    /// Receiver: how many key reports follow this one (only when rekeyed).
    pub keys: u8,
}

/// A report that does not decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReportError {
    /// Not [`REPORT_LEN`] bytes.
    Length(usize),
    /// The magic is wrong.
    Magic,
    /// A version this end does not speak.
    Version(u8),
    /// The check does not match the bytes.
    Check,
    /// Unknown kind.
    Kind(u8),
    /// Lane not below [`MAX_LANES`].
    Lane(u8),
    /// Info longer than [`QP_INFO_LEN`].
    InfoLength(u8),
    /// A reserved byte or bit, or an unused info byte, is not zero.
    Reserved,
    /// A refusal with an unknown code, or a report whose attempt is 0 (or a refusal's is not).
    Field,
}

impl fmt::Display for ReportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Length(len) => write!(f, "{len} bytes, a report has {REPORT_LEN}"),
            Self::Magic => f.write_str("bad magic"),
            Self::Version(v) => write!(f, "version {v}, this end speaks {REPORT_VERSION}"),
            Self::Check => f.write_str("the check does not match"),
            Self::Kind(k) => write!(f, "unknown kind {k}"),
            Self::Lane(l) => write!(f, "lane {l} is out of range"),
            Self::InfoLength(l) => write!(f, "{l} bytes of queue-pair info, at most {QP_INFO_LEN}"),
            Self::Reserved => f.write_str("reserved bytes are not zero"),
            Self::Field => f.write_str("a field is out of range"),
        }
    }
}

/// FNV-1a (32-bit): enough to tell a report from garbage on a socket that is already reliable.
fn check(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |h: u32, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

impl Report {
    /// The wire bytes.
    pub fn encode(&self) -> [u8; REPORT_LEN] {
        let mut out = [0u8; REPORT_LEN];
        out[..4].copy_from_slice(&MAGIC);
        out[4] = REPORT_VERSION;
        out[6] = self.lane;
        out[7] = self.attempt;
        let (kind, a, b, eager) = match self.body {
            ReportBody::Sender(s) => (KIND_SENDER, s.ended, s.acked, s.eager),
            ReportBody::Receiver(r) => (KIND_RECEIVER, r.oldest, r.announced, r.eager),
            ReportBody::Refusal(why) => (KIND_REFUSAL, why.code(), 0, false),
            ReportBody::Keys(chunk) => (KIND_KEYS, u32::from(chunk.len), 0, false),
        };
        out[5] = kind;
        out[8..12].copy_from_slice(&a.to_le_bytes());
        out[12..16].copy_from_slice(&b.to_le_bytes());
        out[16] = if eager { FLAG_EAGER } else { 0 } | if self.rekeyed { FLAG_REKEYED } else { 0 };
        out[18] = self.port.map_or(0, |p| p.saturating_add(1));
        out[19] = self.keys;
        if let ReportBody::Keys(chunk) = self.body {
            out[17] = chunk.len * 8;
            for (i, (old, new)) in chunk.pairs().iter().enumerate() {
                let at = 20 + i * 8;
                out[at..at + 4].copy_from_slice(&old.to_le_bytes());
                out[at + 4..at + 8].copy_from_slice(&new.to_le_bytes());
            }
        } else {
            out[17] = self.qp_info.len;
            out[20..20 + QP_INFO_LEN].copy_from_slice(&self.qp_info.bytes);
        }
        let sum = check(&out[..CHECKED_LEN]);
        out[CHECKED_LEN..].copy_from_slice(&sum.to_le_bytes());
        out
    }

    /// Decode and validate `bytes` (from the peer: untrusted).
    pub fn decode(bytes: &[u8]) -> Result<Self, ReportError> {
        let bytes: &[u8; REPORT_LEN] = bytes
            .try_into()
            .map_err(|_| ReportError::Length(bytes.len()))?;
        if bytes[..4] != MAGIC {
            return Err(ReportError::Magic);
        }
        if bytes[4] != REPORT_VERSION {
            return Err(ReportError::Version(bytes[4]));
        }
        let stored = u32::from_le_bytes([
            bytes[CHECKED_LEN],
            bytes[CHECKED_LEN + 1],
            bytes[CHECKED_LEN + 2],
            bytes[CHECKED_LEN + 3],
        ]);
        if check(&bytes[..CHECKED_LEN]) != stored {
            return Err(ReportError::Check);
        }
        let lane = bytes[6];
        if usize::from(lane) >= MAX_LANES {
            return Err(ReportError::Lane(lane));
        }
        let attempt = bytes[7];
        let a = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        let b = u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]);
        let flags = bytes[16];
        let info_len = bytes[17];
        if flags & !(FLAG_EAGER | FLAG_REKEYED) != 0 {
            return Err(ReportError::Reserved);
        }
        let rekeyed = flags & FLAG_REKEYED != 0;
        let port = bytes[18].checked_sub(1);
        let keys = bytes[19];
        if usize::from(info_len) > QP_INFO_LEN {
            return Err(ReportError::InfoLength(info_len));
        }
        let info = &bytes[20..20 + QP_INFO_LEN];
        if info[usize::from(info_len)..].iter().any(|&b| b != 0) {
            return Err(ReportError::Reserved);
        }
        let eager = flags & FLAG_EAGER != 0;
        let body = match bytes[5] {
            KIND_SENDER => ReportBody::Sender(SenderSnapshot {
                ended: a,
                acked: b,
                eager,
            }),
            KIND_RECEIVER => ReportBody::Receiver(ReceiverSnapshot {
                oldest: a,
                announced: b,
                eager,
            }),
            KIND_REFUSAL => {
                let why = Refusal::from_code(a).ok_or(ReportError::Field)?;
                if b != 0 || eager || info_len != 0 {
                    return Err(ReportError::Reserved);
                }
                ReportBody::Refusal(why)
            }
            KIND_KEYS => {
                if b != 0 || eager || u32::from(info_len) != a.saturating_mul(8) {
                    return Err(ReportError::Reserved);
                }
                let mut pairs = [(0u32, 0u32); KEYS_PER_REPORT];
                let n = (a as usize).min(KEYS_PER_REPORT);
                for (i, pair) in pairs.iter_mut().take(n).enumerate() {
                    let word = |at: usize| {
                        u32::from_le_bytes([info[at], info[at + 1], info[at + 2], info[at + 3]])
                    };
                    *pair = (word(i * 8), word(i * 8 + 4));
                }
                ReportBody::Keys(KeyChunk::new(&pairs[..n]).ok_or(ReportError::Field)?)
            }
            kind => return Err(ReportError::Kind(kind)),
        };
        // Only a state report says a port or that it was rekeyed; only a rekeyed receiver's
        // says that keys follow.
        let state = matches!(body, ReportBody::Sender(_) | ReportBody::Receiver(_));
        if (!state && (rekeyed || port.is_some() || keys != 0))
            || (keys != 0 && !(rekeyed && matches!(body, ReportBody::Receiver(_))))
        {
            return Err(ReportError::Reserved);
        }
        if matches!(body, ReportBody::Refusal(_)) != (attempt == 0) {
            return Err(ReportError::Field);
        }
        let mut qp_info = QpInfo::EMPTY;
        if state {
            qp_info.len = info_len;
            qp_info.bytes.copy_from_slice(info);
        }
        Ok(Self {
            lane,
            attempt,
            body,
            qp_info,
            port,
            rekeyed,
            keys,
        })
    }
}

#[cfg(test)]
mod tests {
    use alloc::vec::Vec;

    use super::*;

    fn sample() -> Report {
        Report {
            lane: 3,
            attempt: 1,
            body: ReportBody::Receiver(ReceiverSnapshot {
                oldest: u32::MAX - 1,
                announced: 5,
                eager: false,
            }),
            qp_info: QpInfo::new(&[1, 2, 3, 4, 5]).unwrap(),
            port: None,
            rekeyed: false,
            keys: 0,
        }
    }

    #[test]
    fn every_kind_roundtrips() {
        let sender = Report {
            lane: 0,
            attempt: 2,
            body: ReportBody::Sender(SenderSnapshot {
                ended: 7,
                acked: 3,
                eager: true,
            }),
            qp_info: QpInfo::new(&[9; QP_INFO_LEN]).unwrap(),
            port: None,
            rekeyed: false,
            keys: 0,
        };
        let refusal = Report {
            lane: 127,
            attempt: 0,
            body: ReportBody::Refusal(Refusal::Disabled),
            qp_info: QpInfo::EMPTY,
            port: None,
            rekeyed: false,
            keys: 0,
        };
        for r in [sample(), sender, refusal] {
            assert_eq!(Report::decode(&r.encode()), Ok(r));
        }
        assert_eq!(sample().qp_info.as_bytes(), &[1, 2, 3, 4, 5]);
        assert_eq!(QpInfo::new(&[0; QP_INFO_LEN + 1]), None);
    }

    #[test]
    fn ports_rekeying_and_keys_roundtrip() {
        let moved = Report {
            port: Some(3),
            rekeyed: true,
            keys: 2,
            ..sample()
        };
        assert_eq!(Report::decode(&moved.encode()), Ok(moved));
        let pairs: Vec<(u32, u32)> = (0..KEYS_PER_REPORT as u32).map(|i| (i, !i)).collect();
        for n in [1, KEYS_PER_REPORT] {
            let keys = Report {
                lane: 5,
                attempt: 2,
                body: ReportBody::Keys(KeyChunk::new(&pairs[..n]).unwrap()),
                qp_info: QpInfo::EMPTY,
                port: None,
                rekeyed: false,
                keys: 0,
            };
            let decoded = Report::decode(&keys.encode()).unwrap();
            assert_eq!(decoded, keys);
            let ReportBody::Keys(chunk) = decoded.body else {
                panic!("keys decode as keys");
            };
            assert_eq!(chunk.pairs(), &pairs[..n]);
        }
        assert_eq!(KeyChunk::new(&[]), None);
        assert_eq!(KeyChunk::new(&[(1, 2); KEYS_PER_REPORT + 1]), None);
        // A sender's report that says keys follow, a keys report with a port, flag or a count
        // that disagrees with its length: refused.
        let reencode = |mut b: [u8; REPORT_LEN]| {
            let sum = check(&b[..CHECKED_LEN]);
            b[CHECKED_LEN..].copy_from_slice(&sum.to_le_bytes());
            Report::decode(&b)
        };
        let mut sender = Report {
            body: ReportBody::Sender(SenderSnapshot::default()),
            rekeyed: true,
            ..sample()
        }
        .encode();
        sender[19] = 1;
        assert_eq!(reencode(sender), Err(ReportError::Reserved));
        let keys = Report {
            lane: 0,
            attempt: 1,
            body: ReportBody::Keys(KeyChunk::new(&pairs[..2]).unwrap()),
            qp_info: QpInfo::EMPTY,
            port: None,
            rekeyed: false,
            keys: 0,
        }
        .encode();
        for (at, v) in [(18, 1), (16, 2), (8, 3), (8, 0), (17, 8)] {
            let mut b = keys;
            b[at] = v;
            assert!(reencode(b).is_err(), "byte {at} = {v}");
        }
    }

    #[test]
    fn every_bad_field_is_refused() {
        let good = sample().encode();
        let with = |i: usize, v: u8| {
            let mut b = good;
            b[i] = v;
            // Re-check so the field, not the check, is what fails.
            let sum = check(&b[..CHECKED_LEN]);
            b[CHECKED_LEN..].copy_from_slice(&sum.to_le_bytes());
            Report::decode(&b)
        };
        assert_eq!(Report::decode(&good[..10]), Err(ReportError::Length(10)));
        assert_eq!(with(0, b'X'), Err(ReportError::Magic));
        assert_eq!(with(4, 2), Err(ReportError::Version(2)));
        assert_eq!(with(5, 9), Err(ReportError::Kind(9)));
        assert_eq!(with(6, MAX_LANES as u8), Err(ReportError::Lane(128)));
        assert_eq!(with(7, 0), Err(ReportError::Field));
        assert_eq!(with(16, 4), Err(ReportError::Reserved));
        // Keys follow only a rekeyed receiver's report.
        assert_eq!(with(19, 1), Err(ReportError::Reserved));
        assert_eq!(
            with(17, QP_INFO_LEN as u8 + 1),
            Err(ReportError::InfoLength(QP_INFO_LEN as u8 + 1))
        );
        assert_eq!(REPORT_LEN, 104, "the layout table's length");
        let full = Report {
            qp_info: QpInfo::new(&[0xab; 80]).unwrap(),
            ..sample()
        };
        assert_eq!(
            Report::decode(&full.encode()),
            Ok(full),
            "an 80-byte EndpointInfo fits"
        );
        assert_eq!(
            with(17, 2),
            Err(ReportError::Reserved),
            "info past its length"
        );
        // A refusal carries no state, no info and attempt 0.
        let refusal = Report {
            lane: 0,
            attempt: 0,
            body: ReportBody::Refusal(Refusal::GaveUp),
            qp_info: QpInfo::EMPTY,
            port: None,
            rekeyed: false,
            keys: 0,
        }
        .encode();
        let mut bad_code = refusal;
        bad_code[8] = 7;
        let sum = check(&bad_code[..CHECKED_LEN]);
        bad_code[CHECKED_LEN..].copy_from_slice(&sum.to_le_bytes());
        assert_eq!(Report::decode(&bad_code), Err(ReportError::Field));
        // Any flipped bit fails the check.
        for i in 0..REPORT_LEN {
            let mut b = good;
            b[i] ^= 0x10;
            assert!(Report::decode(&b).is_err(), "byte {i}");
        }
    }
}
