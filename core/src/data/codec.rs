//! Byte layouts of the data protocol: clear-to-send entries, completion records, immediates and
//! work-request ids. Pure functions; every decoder validates before it returns a value.
//!
//! All multi-byte fields are little-endian. The immediate is a host-order `u32` that the [`Nic`]
//! carries in network byte order (see [`SendOp::WriteImm`]).
//!
//! [`Nic`]: crate::nic::Nic
//! [`SendOp::WriteImm`]: crate::nic::SendOp::WriteImm

use core::fmt;

use super::{MAX_RECVS, MAX_REQUESTS, SLOTS};
use crate::nic::MAX_WR_BYTES;

/// Bytes of one clear-to-send entry in the sender's FIFO.
pub const CTS_ENTRY_LEN: usize = 32;
/// Bytes of one FIFO slot: [`MAX_RECVS`] entries.
pub const CTS_SLOT_LEN: usize = CTS_ENTRY_LEN * MAX_RECVS;
/// Bytes of one completion record: one little-endian `u32` size per receive buffer.
pub const RECORD_LEN: usize = 4 * MAX_RECVS;

/// One clear-to-send entry: the receiver offers one buffer of a (possibly grouped) receive.
///
/// | offset | bytes | field |
/// |---|---|---|
/// | 0 | 8 | `addr`: remote address of the buffer |
/// | 8 | 8 | `size`: capacity of the buffer in bytes |
/// | 16 | 4 | `rkey`: remote key covering the buffer |
/// | 20 | 4 | `tag` |
/// | 24 | 1 | `n`: buffers in the group, 1..=8 |
/// | 25 | 1 | `index`: position within the group, < `n` (bits 0–6); bit 7 [`CTS_EAGER_OK`] |
/// | 26 | 2 | `check`: [`entry_check`] of the other 30 bytes |
/// | 28 | 4 | `stamp`: receive sequence number + 1 (wrapping), last so it lands last |
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CtsEntry {
    /// Remote address of the receive buffer.
    pub addr: u64,
    /// Capacity of the receive buffer in bytes.
    pub size: u64,
    /// Remote key of the receive buffer.
    pub rkey: u32,
    /// Tag the matching send must carry.
    pub tag: u32,
    /// Number of buffers in the receive group (1..=[`MAX_RECVS`]).
    pub n: u8,
    /// Position of this buffer within its group.
    pub index: u8,
    /// The receiver takes eager messages into this buffer ([`crate::data::eager`]): a one-buffer
    /// receive in host memory, from a receiver that knows the sender reads the flag.
    pub eager_ok: bool,
    /// Freshness stamp: [`stamp_for`] of the receive's sequence number.
    pub stamp: u32,
}

/// Bit 7 of an entry's `index` byte: [`CtsEntry::eager_ok`]. Only a sender that announced the
/// credit word (wire version 4) is sent it.
pub const CTS_EAGER_OK: u8 = 0x80;

/// The constant an eager header's check starts from ([`crate::data::eager::EagerHeader`]).
pub const MAGIC_EAGER_HEADER: u32 = 0x4541_4752;

/// A 16-bit check of an entry's bytes other than the check field itself (26..28), computed over the
/// four little-endian 64-bit words of the entry (the check field masked to zero): each word rotated
/// to its own offset and folded into a seeded state by XOR, then one multiply by an odd constant,
/// whose top 16 bits are the check. Every input bit reaches those 16 bits (a multiply carries each
/// bit upwards, and bit 63 of an odd multiplier times bit `k` lands on bit 63); the rotations keep
/// the same change in two fields (an address and a size moving by the same bits) from cancelling.
///
/// RDMA orders nothing *within* one write: the peer's NIC may make the stamp at the end of an
/// entry visible before the fields at its start. A fresh stamp whose entry does not check is
/// therefore read as "not landed yet", not as a malformed entry. (An all-zero entry does not
/// check either: the state starts from a seed whose check is not zero.)
pub fn entry_check(bytes: &[u8; CTS_ENTRY_LEN]) -> u16 {
    check_words(entry_words(bytes))
}

/// Bits of the last word that hold the check field (bytes 26..28).
const CHECK_MASK: u64 = 0xffff << 16;
/// The fold's starting state; an all-zero entry's check is this times [`CHECK_MULTIPLIER`]'s top
/// 16 bits, not zero (a test says so).
const CHECK_SEED: u64 = 0x9e37_79b9_7f4a_7c15;
/// An odd 64-bit multiplier (a bijection on the state) with well-mixed high bits.
const CHECK_MULTIPLIER: u64 = 0xff51_afd7_ed55_8ccd;

/// [`entry_check`] over the entry as words. Independent rotate-and-XOR steps and one multiply, not a
/// chain of multiplies: it runs on every clear-to-send entry written and read.
#[inline(always)]
fn check_words(words: [u64; 4]) -> u16 {
    let folded = CHECK_SEED
        ^ words[0]
        ^ words[1].rotate_left(16)
        ^ words[2].rotate_left(32)
        ^ (words[3] & !CHECK_MASK).rotate_left(48);
    (folded.wrapping_mul(CHECK_MULTIPLIER) >> 48) as u16
}

/// The freshness stamp written into every entry of receive `seq`. A slot still holding an entry of
/// an earlier lap (or the zeroed memory of the first lap) carries a different stamp.
pub const fn stamp_for(seq: u32) -> u32 {
    seq.wrapping_add(1)
}

impl CtsEntry {
    /// Encode into the wire layout.
    #[inline(always)]
    pub fn encode(&self) -> [u8; CTS_ENTRY_LEN] {
        let mut words = [
            self.addr,
            self.size,
            u64::from(self.rkey) | u64::from(self.tag) << 32,
            u64::from(self.n)
                | u64::from(self.index | if self.eager_ok { CTS_EAGER_OK } else { 0 }) << 8
                | u64::from(self.stamp) << 32,
        ];
        words[3] |= u64::from(check_words(words)) << 16;
        let mut out = [0u8; CTS_ENTRY_LEN];
        for (chunk, word) in out.chunks_exact_mut(8).zip(words) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        out
    }

    /// The entry of a one-buffer receive (`n` 1, `index` 0) when `bytes` hold one that checks
    /// and validates as [`decode`](Self::decode) would take it; `None` for any other bytes
    /// (torn, grouped or malformed), which `decode` then sorts out. The sender's common case,
    /// built into its caller: one 16-bit compare stands for the group checks.
    #[inline(always)]
    pub fn decode_single(bytes: &[u8; CTS_ENTRY_LEN]) -> Option<Self> {
        let words = entry_words(bytes);
        let entry = Self::from_words(words);
        // Bytes 24 and 25: `n` = 1 and `index` = 0 (the eager flag aside).
        let single = words[3] as u16 & !(u16::from(CTS_EAGER_OK) << 8) == 1;
        let valid = single
            && (words[3] >> 16) as u16 == check_words(words)
            && entry.addr.checked_add(entry.size).is_some();
        valid.then_some(entry)
    }

    /// Decode and validate one entry. The stamp is returned as read; whether it is fresh is the
    /// caller's question.
    pub fn decode(bytes: &[u8; CTS_ENTRY_LEN]) -> Result<Self, DecodeError> {
        let words = entry_words(bytes);
        if (words[3] >> 16) as u16 != check_words(words) {
            return Err(DecodeError::Checksum);
        }
        let entry = Self::from_words(words);
        if entry.n == 0 || usize::from(entry.n) > MAX_RECVS {
            return Err(DecodeError::GroupSize(entry.n));
        }
        if entry.index >= entry.n {
            return Err(DecodeError::Index {
                index: entry.index,
                n: entry.n,
            });
        }
        if entry.addr.checked_add(entry.size).is_none() {
            return Err(DecodeError::AddressOverflow);
        }
        Ok(entry)
    }

    /// The fields as they lie in the entry's words (the layout table above), unvalidated.
    #[inline(always)]
    fn from_words(words: [u64; 4]) -> Self {
        Self {
            addr: words[0],
            size: words[1],
            rkey: words[2] as u32,
            tag: (words[2] >> 32) as u32,
            n: words[3] as u8,
            index: (words[3] >> 8) as u8 & !CTS_EAGER_OK,
            eager_ok: (words[3] >> 8) as u8 & CTS_EAGER_OK != 0,
            stamp: (words[3] >> 32) as u32,
        }
    }
}

/// The sizes a grouped send wrote into the receiver's completion record of one slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SizeRecord {
    /// Number of valid sizes.
    pub n: u8,
    /// Bytes sent into each buffer of the group (for a refused send: the size that did not fit).
    pub sizes: [u32; MAX_RECVS],
}

impl SizeRecord {
    /// Encode the first `n` sizes; returns the buffer and the number of bytes to write (`4 n`).
    pub fn encode(&self) -> ([u8; RECORD_LEN], usize) {
        let mut out = [0u8; RECORD_LEN];
        let n = usize::from(self.n).min(MAX_RECVS);
        for (chunk, size) in out.chunks_exact_mut(4).zip(&self.sizes[..n]) {
            chunk.copy_from_slice(&size.to_le_bytes());
        }
        (out, 4 * n)
    }

    /// Decode the first `n` sizes of `bytes` (which must hold at least `4 n` bytes).
    pub fn decode(bytes: &[u8], n: u8) -> Result<Self, DecodeError> {
        if n == 0 || usize::from(n) > MAX_RECVS {
            return Err(DecodeError::GroupSize(n));
        }
        let len = 4 * usize::from(n);
        let bytes = bytes.get(..len).ok_or(DecodeError::Truncated)?;
        let mut record = Self {
            n,
            sizes: [0; MAX_RECVS],
        };
        for (size, chunk) in record.sizes.iter_mut().zip(bytes.chunks_exact(4)) {
            let value = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            if value > MAX_WR_BYTES {
                return Err(DecodeError::SizeTooLarge(value));
            }
            *size = value;
        }
        Ok(record)
    }
}

/// Value of the top byte of every immediate.
pub const IMM_MAGIC: u8 = 0x52;
/// Immediate flag: the sizes are in the completion record (always set for grouped receives).
pub const IMM_RECORD: u32 = 1 << 19;
/// Immediate flag: a send did not fit its buffer; the record names the refused size.
pub const IMM_MISMATCH: u32 = 1 << 20;

/// The immediate of the write-with-immediate that ends a slot.
///
/// | bits | field |
/// |---|---|
/// | 0–15 | low 16 bits of the receive sequence number |
/// | 16–18 | `n − 1` |
/// | 19 | `RECORD`: sizes are in the completion record |
/// | 20 | `MISMATCH`: a send was refused (implies `RECORD`) |
/// | 21–23 | zero |
/// | 24–31 | [`IMM_MAGIC`] |
///
/// A grouped receive (`n > 1`) always has `RECORD`; `n == 1` without `RECORD` takes its size from
/// the completion's byte count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Imm {
    /// Low 16 bits of the receive sequence number.
    pub seq16: u16,
    /// Buffers in the group (1..=8).
    pub n: u8,
    /// The sizes are in the completion record.
    pub record: bool,
    /// A send was refused because it did not fit.
    pub mismatch: bool,
}

impl Imm {
    /// Encode into the host-order immediate.
    pub fn encode(&self) -> u32 {
        let mut imm = u32::from(self.seq16)
            | (u32::from(self.n.wrapping_sub(1)) & 0x7) << 16
            | u32::from(IMM_MAGIC) << 24;
        if self.record {
            imm |= IMM_RECORD;
        }
        if self.mismatch {
            imm |= IMM_MISMATCH;
        }
        imm
    }

    /// Decode and validate a host-order immediate.
    pub fn decode(imm: u32) -> Result<Self, DecodeError> {
        if (imm >> 24) as u8 != IMM_MAGIC {
            return Err(DecodeError::Magic);
        }
        if imm & (0x7 << 21) != 0 {
            return Err(DecodeError::ReservedBits);
        }
        let decoded = Self {
            seq16: imm as u16,
            n: ((imm >> 16) & 0x7) as u8 + 1,
            record: imm & IMM_RECORD != 0,
            mismatch: imm & IMM_MISMATCH != 0,
        };
        if (decoded.n > 1 || decoded.mismatch) && !decoded.record {
            return Err(DecodeError::Flags);
        }
        Ok(decoded)
    }
}

/// What a work request was posted for; carried in its `wr_id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WrKind {
    /// The receiver's RDMA WRITE of clear-to-send entries.
    Cts,
    /// The sender's RDMA WRITE of one grouped send's payload.
    Data,
    /// The sender's RDMA WRITE WITH IMMEDIATE that ends a slot.
    SlotEnd,
    /// The receiver's empty receive work request.
    Recv,
    /// The sender's RDMA WRITE WITH IMMEDIATE of an eager message into the receiver's ring.
    Eager,
    /// The receiver's RDMA WRITE of returned ring credits.
    Credit,
}

impl WrKind {
    fn code(self) -> u8 {
        match self {
            Self::Cts => 1,
            Self::Data => 2,
            Self::SlotEnd => 3,
            Self::Recv => 4,
            Self::Eager => 5,
            Self::Credit => 6,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Self::Cts),
            2 => Some(Self::Data),
            3 => Some(Self::SlotEnd),
            4 => Some(Self::Recv),
            5 => Some(Self::Eager),
            6 => Some(Self::Credit),
            _ => None,
        }
    }
}

impl fmt::Display for WrKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Cts => "clear-to-send RDMA write",
            Self::Data => "data RDMA write",
            Self::SlotEnd => "RDMA write with immediate",
            Self::Recv => "receive work request",
            Self::Eager => "eager RDMA write with immediate",
            Self::Credit => "credit RDMA write",
        })
    }
}

/// Value of the top byte of every `wr_id` the core posts.
pub const WR_ID_MAGIC: u8 = 0xD7;

/// A decoded `wr_id`.
///
/// | bits | field |
/// |---|---|
/// | 0–7 | kind: 1 CTS, 2 data, 3 slot end, 4 receive, 5 eager, 6 credit |
/// | 8–23 | index: the slot (CTS, slot end), the request (data), the ring slot (eager), the low byte of the position (receive), < 256 |
/// | 24–55 | sequence: send-queue post position (send kinds) or receive-queue position (receive) |
/// | 56–63 | [`WR_ID_MAGIC`] |
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WrId {
    /// What the work request was for.
    pub kind: WrKind,
    /// Slot or request index.
    pub index: u16,
    /// Post position (send queue) or receive sequence number.
    pub seq: u32,
}

impl WrId {
    /// Encode into a `wr_id`.
    pub fn encode(&self) -> u64 {
        u64::from(self.kind.code())
            | u64::from(self.index) << 8
            | u64::from(self.seq) << 24
            | u64::from(WR_ID_MAGIC) << 56
    }

    /// Decode and validate a `wr_id`.
    pub fn decode(wr_id: u64) -> Result<Self, DecodeError> {
        if (wr_id >> 56) as u8 != WR_ID_MAGIC {
            return Err(DecodeError::Magic);
        }
        let kind = WrKind::from_code(wr_id as u8).ok_or(DecodeError::Kind(wr_id as u8))?;
        let index = (wr_id >> 8) as u16;
        let bound = match kind {
            WrKind::Data => MAX_REQUESTS,
            _ => SLOTS,
        };
        if usize::from(index) >= bound {
            return Err(DecodeError::IndexRange(index));
        }
        Ok(Self {
            kind,
            index,
            seq: (wr_id >> 24) as u32,
        })
    }
}

/// Why bytes or numbers read from the peer or a completion were rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Reserved bits or bytes are not zero.
    ReservedBits,
    /// A clear-to-send entry's check does not match its bytes (torn or corrupted).
    Checksum,
    /// Group size outside 1..=8.
    GroupSize(u8),
    /// Index within the group not below the group size.
    Index {
        /// The index read.
        index: u8,
        /// The group size read.
        n: u8,
    },
    /// Address plus size overflows 64 bits.
    AddressOverflow,
    /// A size larger than one work request may carry.
    SizeTooLarge(u32),
    /// Fewer bytes than the layout needs.
    Truncated,
    /// The magic byte is wrong.
    Magic,
    /// Flag combination the sender never produces.
    Flags,
    /// Unknown work-request kind.
    Kind(u8),
    /// Slot or request index out of range.
    IndexRange(u16),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ReservedBits => f.write_str("reserved bits are not zero"),
            Self::Checksum => {
                f.write_str("check field does not match the entry (torn or corrupted)")
            }
            Self::GroupSize(n) => write!(f, "group size {n} outside 1..={MAX_RECVS}"),
            Self::Index { index, n } => write!(f, "index {index} not below group size {n}"),
            Self::AddressOverflow => f.write_str("address plus size overflows"),
            Self::SizeTooLarge(size) => {
                write!(f, "size {size} exceeds the {MAX_WR_BYTES}-byte limit")
            }
            Self::Truncated => f.write_str("truncated"),
            Self::Magic => f.write_str("wrong magic byte"),
            Self::Flags => f.write_str("invalid flag combination"),
            Self::Kind(kind) => write!(f, "unknown work request kind {kind}"),
            Self::IndexRange(index) => write!(f, "index {index} out of range"),
        }
    }
}

/// The entry's four little-endian 64-bit words, the unit [`check_words`] and
/// [`CtsEntry::from_words`] work in.
#[inline(always)]
fn entry_words(bytes: &[u8; CTS_ENTRY_LEN]) -> [u64; 4] {
    [
        le_u64(bytes, 0),
        le_u64(bytes, 8),
        le_u64(bytes, 16),
        le_u64(bytes, 24),
    ]
}

#[inline(always)]
fn le_u64(bytes: &[u8; CTS_ENTRY_LEN], at: usize) -> u64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> CtsEntry {
        CtsEntry {
            addr: 0x1000_2000,
            size: 4096,
            rkey: 0xdead_beef,
            tag: 7,
            n: 3,
            index: 2,
            eager_ok: false,
            stamp: 42,
        }
    }

    #[test]
    fn cts_entry_roundtrip() {
        let e = entry();
        assert_eq!(CtsEntry::decode(&e.encode()), Ok(e));
    }

    #[test]
    fn cts_entry_layout_is_little_endian() {
        let bytes = entry().encode();
        assert_eq!(bytes[0..8], 0x1000_2000u64.to_le_bytes());
        assert_eq!(bytes[16..20], 0xdead_beefu32.to_le_bytes());
        assert_eq!((bytes[24], bytes[25]), (3, 2));
        assert_eq!(bytes[28..32], 42u32.to_le_bytes());
    }

    /// Rewrite the check field after a test altered an entry's bytes.
    fn recheck(bytes: &mut [u8; CTS_ENTRY_LEN]) {
        let check = entry_check(bytes);
        bytes[26..28].copy_from_slice(&check.to_le_bytes());
    }

    #[test]
    fn cts_entry_rejects_bad_group() {
        let mut bytes = entry().encode();
        bytes[24] = 0;
        recheck(&mut bytes);
        assert_eq!(CtsEntry::decode(&bytes), Err(DecodeError::GroupSize(0)));
        bytes[24] = 9;
        recheck(&mut bytes);
        assert_eq!(CtsEntry::decode(&bytes), Err(DecodeError::GroupSize(9)));
        bytes[24] = 2;
        recheck(&mut bytes);
        assert_eq!(
            CtsEntry::decode(&bytes),
            Err(DecodeError::Index { index: 2, n: 2 })
        );
    }

    #[test]
    fn cts_entry_rejects_reserved_and_overflow() {
        let mut bytes = entry().encode();
        bytes[27] ^= 1;
        assert_eq!(CtsEntry::decode(&bytes), Err(DecodeError::Checksum));
        let mut torn = entry().encode();
        torn[..16].fill(0);
        assert_eq!(
            CtsEntry::decode(&torn),
            Err(DecodeError::Checksum),
            "a torn entry must not check"
        );
        assert_eq!(
            CtsEntry::decode(&[0; CTS_ENTRY_LEN]),
            Err(DecodeError::Checksum),
            "nor a zero one"
        );
        let mut e = entry();
        e.addr = u64::MAX - 10;
        assert_eq!(
            CtsEntry::decode(&e.encode()),
            Err(DecodeError::AddressOverflow)
        );
    }

    /// `decode_single` takes exactly the one-buffer entries `decode` takes, with the same fields.
    #[test]
    fn cts_entry_decode_single_takes_what_decode_takes_of_one_buffer() {
        let single = CtsEntry {
            n: 1,
            index: 0,
            ..entry()
        };
        let mut variants = alloc::vec![single.encode(), entry().encode(), [0; CTS_ENTRY_LEN]];
        for (n, index) in [(0, 0), (1, 1), (2, 0), (9, 0), (1, 2)] {
            let mut bytes = single.encode();
            (bytes[24], bytes[25]) = (n, index);
            recheck(&mut bytes);
            variants.push(bytes);
        }
        let mut flipped = single.encode();
        flipped[27] ^= 1;
        variants.push(flipped);
        let mut torn = single.encode();
        torn[..16].fill(0);
        variants.push(torn);
        variants.push(
            CtsEntry {
                addr: u64::MAX - 10,
                ..single
            }
            .encode(),
        );
        for bytes in variants {
            let want = CtsEntry::decode(&bytes).ok().filter(|e| e.n == 1);
            assert_eq!(CtsEntry::decode_single(&bytes), want, "{bytes:?}");
        }
        assert_eq!(CtsEntry::decode_single(&single.encode()), Some(single));
    }

    /// A fresh entry torn against what the slot held before (the previous lap's entry, or zeroed
    /// memory), at byte granularity in any order of words and at every split inside a word, never
    /// checks: the word-sized check must reject what the byte-wise one did.
    #[test]
    fn cts_entry_rejects_every_torn_mix() {
        let fresh = entry().encode();
        let mut old_entry = entry();
        old_entry.addr = 0x5000_0000;
        old_entry.size = 65536;
        old_entry.rkey = 0x1234_5678;
        old_entry.tag = 6;
        old_entry.n = 1;
        old_entry.index = 0;
        old_entry.stamp = 42u32.wrapping_sub(SLOTS as u32);
        for old in [old_entry.encode(), [0; CTS_ENTRY_LEN]] {
            // Any subset of whole words landed.
            for landed in 0u32..15 {
                let mut torn = old;
                for word in 0..4 {
                    if landed & (1 << word) != 0 {
                        torn[8 * word..8 * word + 8]
                            .copy_from_slice(&fresh[8 * word..8 * word + 8]);
                    }
                }
                if torn != fresh && torn != old {
                    assert_eq!(
                        CtsEntry::decode(&torn),
                        Err(DecodeError::Checksum),
                        "{landed:#x}"
                    );
                }
            }
            // Every prefix or suffix of bytes landed.
            for split in 1..CTS_ENTRY_LEN {
                for torn in [
                    [&fresh[..split], &old[split..]].concat(),
                    [&old[..split], &fresh[split..]].concat(),
                ] {
                    let torn: [u8; CTS_ENTRY_LEN] = torn.try_into().unwrap();
                    if torn != fresh && torn != old {
                        assert_eq!(
                            CtsEntry::decode(&torn),
                            Err(DecodeError::Checksum),
                            "{split}"
                        );
                    }
                }
            }
        }
    }

    /// The same change in two fields (an address and a size moved by the same bits, or the tag
    /// and the stamp) must not cancel out of the check, at any bit position.
    #[test]
    fn cts_check_sees_the_same_change_in_two_fields() {
        let fresh = entry().encode();
        let word = |bytes: &[u8; CTS_ENTRY_LEN], i: usize| le_u64(bytes, 8 * i);
        for bit in 0..64 {
            for (a, b) in [(0, 1), (0, 2), (1, 2), (0, 3), (2, 3)] {
                let mut torn = fresh;
                for i in [a, b] {
                    let changed = word(&torn, i) ^ (1u64 << bit);
                    torn[8 * i..8 * i + 8].copy_from_slice(&changed.to_le_bytes());
                }
                if (b == 3 && (16..32).contains(&bit)) || torn == fresh {
                    continue; // the check field itself
                }
                assert_ne!(
                    entry_check(&torn),
                    entry_check(&fresh),
                    "bit {bit} of words {a} and {b}"
                );
            }
        }
    }

    /// Over many random pairs of a previous lap's entry and a fresh one, every torn mix of whole
    /// words that differs from both fails the check: a 16-bit check lets about one in 65,536
    /// through by chance, so this bounds the check's quality, not only its shape.
    #[test]
    fn cts_check_rejects_random_torn_mixes() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let (mut tried, mut passed) = (0u32, 0u32);
        for _ in 0..20_000 {
            let random_entry = |next: &mut dyn FnMut() -> u64| CtsEntry {
                addr: next() >> 16,
                size: next() >> 40,
                rkey: next() as u32,
                tag: next() as u32,
                n: 1,
                index: 0,
                eager_ok: false,
                stamp: next() as u32,
            };
            let (old, fresh) = (
                random_entry(&mut next).encode(),
                random_entry(&mut next).encode(),
            );
            for landed in 1u32..15 {
                let mut torn = old;
                for w in 0..4 {
                    if landed & (1 << w) != 0 {
                        torn[8 * w..8 * w + 8].copy_from_slice(&fresh[8 * w..8 * w + 8]);
                    }
                }
                if torn != old && torn != fresh {
                    tried += 1;
                    passed += u32::from(CtsEntry::decode(&torn).is_ok());
                }
            }
        }
        assert!(tried > 250_000);
        assert!(
            passed <= tried / 10_000,
            "{passed} of {tried} torn mixes checked"
        );
    }

    #[test]
    fn stamp_of_first_lap_differs_from_zeroed_memory() {
        for seq in 0..SLOTS as u32 {
            assert_ne!(stamp_for(seq), 0);
            assert_ne!(stamp_for(seq), stamp_for(seq.wrapping_sub(SLOTS as u32)));
        }
    }

    #[test]
    fn record_roundtrip_and_limits() {
        let record = SizeRecord {
            n: 3,
            sizes: [1, 0, MAX_WR_BYTES, 0, 0, 0, 0, 0],
        };
        let (bytes, len) = record.encode();
        assert_eq!(len, 12);
        assert_eq!(SizeRecord::decode(&bytes[..len], 3), Ok(record));
        assert_eq!(
            SizeRecord::decode(&bytes[..8], 3),
            Err(DecodeError::Truncated)
        );
        assert_eq!(
            SizeRecord::decode(&bytes, 0),
            Err(DecodeError::GroupSize(0))
        );
        let too_big = (MAX_WR_BYTES + 1).to_le_bytes();
        assert_eq!(
            SizeRecord::decode(&too_big, 1),
            Err(DecodeError::SizeTooLarge(MAX_WR_BYTES + 1))
        );
    }

    #[test]
    fn imm_roundtrip_all_valid_combinations() {
        for n in 1..=8u8 {
            for (record, mismatch) in [(false, false), (true, false), (true, true)] {
                if n > 1 && !record {
                    continue;
                }
                let imm = Imm {
                    seq16: 0xbeef,
                    n,
                    record,
                    mismatch,
                };
                assert_eq!(Imm::decode(imm.encode()), Ok(imm));
            }
        }
    }

    #[test]
    fn imm_rejects_malformed() {
        assert_eq!(Imm::decode(0), Err(DecodeError::Magic));
        let base = Imm {
            seq16: 1,
            n: 1,
            record: false,
            mismatch: false,
        }
        .encode();
        assert_eq!(Imm::decode(base | 1 << 22), Err(DecodeError::ReservedBits));
        assert_eq!(Imm::decode(base | IMM_MISMATCH), Err(DecodeError::Flags));
        assert_eq!(Imm::decode(base | 1 << 16), Err(DecodeError::Flags));
    }

    #[test]
    fn wr_id_roundtrip_and_rejects() {
        for kind in [WrKind::Cts, WrKind::Data, WrKind::SlotEnd, WrKind::Recv] {
            let id = WrId {
                kind,
                index: 255,
                seq: u32::MAX,
            };
            assert_eq!(WrId::decode(id.encode()), Ok(id));
        }
        assert_eq!(WrId::decode(0), Err(DecodeError::Magic));
        let good = WrId {
            kind: WrKind::Cts,
            index: 0,
            seq: 0,
        }
        .encode();
        assert_eq!(WrId::decode(good & !0xff), Err(DecodeError::Kind(0)));
        assert_eq!(
            WrId::decode(good | 256 << 8),
            Err(DecodeError::IndexRange(256))
        );
    }
}
