//! The eager path: small sends written straight into a receiver-owned ring, without waiting for
//! the receive's clear-to-send entry (wire version 4).
//!
//! # Protocol
//!
//! **Negotiation** ([`DATA_VERSION`] 4). Nothing is negotiated beyond the two inbound regions
//! the handshake already exchanges: a receiver that takes eager messages announces an inbound region of at least
//! [`RECV_INBOUND_EAGER_LEN`] bytes (its completion records, then the ring), and a sender that
//! reads returned credits announces at least [`SEND_INBOUND_EAGER_LEN`] (its clear-to-send FIFO,
//! then the credit word). A sender writes eager messages only into a ring its peer announced; a
//! receiver flags its entries (below) and returns credits only to a sender that announced the
//! credit word. An older peer (wire version 3) announces the old lengths, so both ends keep the
//! clear-to-send protocol with it.
//!
//! **The ring.** [`EAGER_SLOTS`] slots of [`EAGER_SLOT_LEN`] bytes after the records. Eager message
//! number `k` (both ends count them) goes to slot `k % EAGER_SLOTS`: a 16-byte
//! [`EagerHeader`] (tag, size, the receive's full sequence number, a check) and then the payload,
//! in one RDMA WRITE WITH IMMEDIATE ([`EagerImm`]: its own magic byte, the sequence number's low
//! 16 bits, the epoch bit). The sender copies the header and payload into the work request inline
//! when they fit, else into its staging copy of the slot: only host memory is ever copied, so a
//! send from GPU memory never goes eager.
//!
//! **Which receive.** A sender goes eager only when it has matched every receive whose entries it
//! has read and the next receive's entries are not there yet, and only while the last entry it
//! read offered eager (a receiver whose buffers are GPU memory is not asked again and again). The
//! message is meant for that next receive, the `k`-th eager message in a row for the `k`-th
//! receive after it: the sender assumes each is a one-buffer receive.
//!
//! **Accepted or bounced** — one rule, [`accepts`], evaluated on the same inputs wherever it is
//! evaluated: the receive has one buffer, its entry offers eager (the receiver can copy into it:
//! host memory, flag [`CTS_EAGER_OK`](super::codec::CTS_EAGER_OK)), the tags are equal and the
//! size fits. The receiver evaluates it when both the message and the receive are there; it copies
//! an accepted message into the buffer and completes the receive, or bounces it: the receive keeps
//! waiting for data, and every later eager message of the same epoch is bounced too. A bounced send
//! and every later eager send still unconfirmed are sent again the clear-to-send way, in their order
//! (as NCCL's retries would have sent them: a send whose tag the oldest receive has no buffer for
//! waits for a later receive while other tags go on), and the sender flips the epoch. A bounce
//! costs a wasted write and a wait for the entries, never an ordering change: after it the sends
//! are matched exactly as without eager, tags and groups included.
//!
//! **Confirmation.** The sender learns each verdict in one of two ways, whichever comes first:
//! from the receive's clear-to-send entries (written when the receive was posted before the message
//! arrived; the sender applies the rule itself), or from the credit word. A receive posted after its
//! message arrived is completed at once from the ring and **writes no entries at all**: one RDMA
//! operation for the message, the credit word's share aside. The sender then walks past its FIFO
//! slot (never written; the slot's next lap has a fresh stamp).
//!
//! **Credits.** A slot is the sender's again once the receiver has taken or bounced its message.
//! The receiver writes its credit word ([`CreditWord`], 24 bytes with a check: one write is not
//! atomic) into the sender's region: the count of messages taken or bounced, and the message that
//! started the latest bounce, which tells the sender each verdict (a message below the count is taken
//! unless it is at or after a bounce it has not handled yet). The word goes after every
//! [`CREDIT_BATCH`] messages, at once after a bounce, and whenever no message waits in the ring
//! while a taken one is unconfirmed (so a sender waiting on its last sends always hears). The
//! sender holds at most [`EAGER_SLOTS`] messages in the ring; without credits it waits for
//! entries, as without eager. The count only grows and never passes what was sent, and a bounce
//! lies below it: anything else is a protocol error.
//!
//! **Receive work requests.** Every write with immediate consumes the receiver's oldest posted
//! receive work request, so a receiver taking eager messages keeps [`EAGER_SLOTS`] more posted
//! than it has receives outstanding: posted at the start, one more after each bounce (a bounced
//! message consumed one that its receive's data will need again); an accepted message consumes
//! the one its receive posted. Receive work requests therefore carry their position in the queue,
//! not a receive's sequence number.

use super::codec::{DecodeError, MAGIC_EAGER_HEADER};

/// The data protocol's version: 4 adds the eager path to version 3's clear-to-send protocol. It
/// is announced by the two inbound regions' lengths (above), inside handshake frames whose
/// format did not change ([`WIRE_VERSION`](crate::wire::WIRE_VERSION) stays 3): a Rivet that
/// speaks only version 3 still connects to this one, and the two keep version 3's protocol.
/// Bumping the frame version instead would have made every older release refuse the connection.
pub const DATA_VERSION: u16 = 4;
use super::{RECV_INBOUND_LEN, RECV_STAGING_LEN, SEND_INBOUND_LEN, SEND_STAGING_LEN};

/// Slots of the ring.
pub const EAGER_SLOTS: usize = 16;
/// Bytes of the header at the start of a slot.
pub const EAGER_HEADER_LEN: usize = 16;
/// Bytes of one slot: the header and up to [`EAGER_MAX`] bytes of payload, 64-byte aligned.
pub const EAGER_SLOT_LEN: usize = 16 * 1024 + 64;
/// Largest eager payload a ring can hold (the sender's threshold is at most this).
pub const EAGER_MAX: usize = EAGER_SLOT_LEN - EAGER_HEADER_LEN;
/// The receiver's inbound region with the ring: the completion records, then the ring.
pub const RECV_INBOUND_EAGER_LEN: usize = RECV_INBOUND_LEN + EAGER_SLOTS * EAGER_SLOT_LEN;
/// Offset of the credit word in the sender's inbound region (after the clear-to-send FIFO).
pub const CREDIT_OFFSET: usize = SEND_INBOUND_LEN;
/// The sender's inbound region with the credit word (one cache line after the FIFO).
pub const SEND_INBOUND_EAGER_LEN: usize = SEND_INBOUND_LEN + 64;
/// The sender's staging region with its copy of the ring (messages too long to go inline).
pub const SEND_STAGING_EAGER_LEN: usize = SEND_STAGING_LEN + EAGER_SLOTS * EAGER_SLOT_LEN;
/// The receiver's staging region with the credit word it writes from (when 8 bytes do not go
/// inline).
pub const RECV_STAGING_EAGER_LEN: usize = RECV_STAGING_LEN + 64;
/// The receiver returns credits after this many slots were freed (sooner after a bounce, or when
/// the ring is empty and a taken message is unconfirmed).
pub const CREDIT_BATCH: u64 = EAGER_SLOTS as u64 / 4;
/// Bytes of the credit word ([`CreditWord`]).
pub const CREDIT_LEN: usize = 24;
/// "No bounce yet", as the sender and receiver keep it.
pub const NO_BOUNCE: u64 = u64::MAX;

/// A bounce as the credit word carries it: its message number plus one, 0 for none.
pub const fn encode_bounce(bounce_at: u64) -> u64 {
    bounce_at.wrapping_add(1)
}

/// The sender's threshold when nothing sets it: sends of up to this many bytes go eager.
pub const DEFAULT_EAGER_THRESHOLD: u64 = 8 * 1024;

/// [`encode_bounce`] undone.
pub const fn decode_bounce(word: u64) -> u64 {
    word.wrapping_sub(1)
}

/// What the receiver's credit word says: little-endian `u64`s, the messages taken or bounced,
/// [`encode_bounce`] of the latest bounce, and a check of the two. One RDMA WRITE is not atomic:
/// the sender may read the word while it lands, so a word whose check fails is left for a later
/// read (the zeroed word the sender starts with fails it too, and means the same: nothing yet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CreditWord {
    /// Messages the receiver took or bounced.
    pub freed: u64,
    /// The message that started the latest bounce ([`NO_BOUNCE`]: none).
    pub bounce_at: u64,
}

impl CreditWord {
    fn check(freed: u64, bounce: u64) -> u64 {
        (freed ^ bounce.rotate_left(32) ^ 0x6372_6564_6974_7321).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }

    /// Encode into the wire layout.
    pub fn encode(&self) -> [u8; CREDIT_LEN] {
        let bounce = encode_bounce(self.bounce_at);
        let mut out = [0u8; CREDIT_LEN];
        out[..8].copy_from_slice(&self.freed.to_le_bytes());
        out[8..16].copy_from_slice(&bounce.to_le_bytes());
        out[16..].copy_from_slice(&Self::check(self.freed, bounce).to_le_bytes());
        out
    }

    /// The word, if its check holds (else it is still landing, or was never written).
    pub fn decode(bytes: &[u8; CREDIT_LEN]) -> Option<Self> {
        let word = |at: usize| {
            let mut raw = [0u8; 8];
            raw.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(raw)
        };
        let (freed, bounce) = (word(0), word(8));
        (word(16) == Self::check(freed, bounce)).then_some(Self {
            freed,
            bounce_at: decode_bounce(bounce),
        })
    }
}

const _: () = assert!(EAGER_SLOT_LEN % 64 == 0 && RECV_INBOUND_LEN % 64 == 0);
const _: () = assert!(EAGER_SLOTS.is_power_of_two() && EAGER_SLOTS <= 256);
const _: () = assert!(DEFAULT_EAGER_THRESHOLD as usize <= EAGER_MAX);

/// Offset of ring slot `slot` in the receiver's inbound region.
#[inline(always)]
pub const fn ring_offset(slot: usize) -> usize {
    RECV_INBOUND_LEN + slot * EAGER_SLOT_LEN
}

/// Offset of the sender's staging copy of ring slot `slot`.
#[inline(always)]
pub const fn staging_offset(slot: usize) -> usize {
    SEND_STAGING_LEN + slot * EAGER_SLOT_LEN
}

/// The header at the start of a ring slot.
///
/// | offset | bytes | field |
/// |---|---|---|
/// | 0 | 4 | `tag` |
/// | 4 | 4 | `size`: payload bytes after the header |
/// | 8 | 4 | `seq`: the receive the sender meant it for |
/// | 12 | 4 | `check`: `seq` XOR [`MAGIC_EAGER_HEADER`] XOR `size` rotated by 16 |
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct EagerHeader {
    /// The send's tag.
    pub tag: u32,
    /// Payload bytes.
    pub size: u32,
    /// Sequence number of the receive it is meant for.
    pub seq: u32,
}

impl EagerHeader {
    fn check(&self) -> u32 {
        self.seq ^ MAGIC_EAGER_HEADER ^ self.size.rotate_left(16)
    }

    /// Encode into the wire layout.
    pub fn encode(&self) -> [u8; EAGER_HEADER_LEN] {
        let mut out = [0u8; EAGER_HEADER_LEN];
        out[0..4].copy_from_slice(&self.tag.to_le_bytes());
        out[4..8].copy_from_slice(&self.size.to_le_bytes());
        out[8..12].copy_from_slice(&self.seq.to_le_bytes());
        out[12..16].copy_from_slice(&self.check().to_le_bytes());
        out
    }

    /// Decode and validate; `byte_len` is what the write placed (header and payload).
    pub fn decode(bytes: &[u8; EAGER_HEADER_LEN], byte_len: u32) -> Result<Self, DecodeError> {
        let word = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let header = Self {
            tag: word(0),
            size: word(4),
            seq: word(8),
        };
        if word(12) != header.check() {
            return Err(DecodeError::Checksum);
        }
        if header.size as usize > EAGER_MAX
            || u64::from(byte_len) != EAGER_HEADER_LEN as u64 + u64::from(header.size)
        {
            return Err(DecodeError::Truncated);
        }
        Ok(header)
    }
}

/// Value of the top byte of an eager message's immediate (the clear-to-send protocol's is
/// [`IMM_MAGIC`](super::codec::IMM_MAGIC)).
pub const IMM_EAGER_MAGIC: u8 = 0x45;

/// The immediate of an eager message.
///
/// | bits | field |
/// |---|---|
/// | 0–15 | low 16 bits of the receive sequence number the message is meant for |
/// | 16 | epoch |
/// | 17–23 | zero |
/// | 24–31 | [`IMM_EAGER_MAGIC`] |
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EagerImm {
    /// Low 16 bits of the receive sequence number.
    pub seq16: u16,
    /// The sender's epoch (flipped after each bounce it learns of).
    pub epoch: bool,
}

impl EagerImm {
    /// Encode into the host-order immediate.
    pub fn encode(&self) -> u32 {
        u32::from(self.seq16) | u32::from(self.epoch) << 16 | u32::from(IMM_EAGER_MAGIC) << 24
    }

    /// Whether `imm` is an eager message's (by its magic byte), decoded and validated.
    pub fn decode(imm: u32) -> Option<Result<Self, DecodeError>> {
        if (imm >> 24) as u8 != IMM_EAGER_MAGIC {
            return None;
        }
        if imm & (0x7f << 17) != 0 {
            return Some(Err(DecodeError::ReservedBits));
        }
        Some(Ok(Self {
            seq16: imm as u16,
            epoch: imm & 1 << 16 != 0,
        }))
    }
}

/// What both ends know of the receive an eager message is meant for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offer {
    /// Buffers in the receive.
    pub n: u8,
    /// Its (first) buffer takes eager messages (host memory, flagged in its entry).
    pub eager_ok: bool,
    /// The buffer's tag.
    pub tag: u32,
    /// The buffer's capacity in bytes.
    pub capacity: u64,
}

/// The one rule both ends apply: whether an eager message of `size` bytes tagged `tag` is taken
/// by the receive that `offer` describes. Anything else bounces it.
#[inline(always)]
pub fn accepts(offer: Offer, tag: u32, size: u64) -> bool {
    offer.n == 1 && offer.eager_ok && offer.tag == tag && size <= offer.capacity
}

/// A first-in first-out queue of at most [`EAGER_SLOTS`] items, in place.
#[derive(Clone, Copy, Debug)]
pub(super) struct Fifo<T: Copy> {
    items: [T; EAGER_SLOTS],
    head: u8,
    len: u8,
}

impl<T: Copy> Fifo<T> {
    pub(super) const fn new(fill: T) -> Self {
        Self {
            items: [fill; EAGER_SLOTS],
            head: 0,
            len: 0,
        }
    }

    #[inline(always)]
    pub(super) fn len(&self) -> usize {
        usize::from(self.len)
    }

    #[inline(always)]
    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Append `item`; false (nothing changed) when full.
    pub(super) fn push(&mut self, item: T) -> bool {
        if self.len() == EAGER_SLOTS {
            return false;
        }
        let at = (usize::from(self.head) + self.len()) % EAGER_SLOTS;
        self.items[at] = item;
        self.len += 1;
        true
    }

    /// The `i`-th item from the front.
    pub(super) fn get(&self, i: usize) -> Option<&T> {
        (i < self.len()).then(|| &self.items[(usize::from(self.head) + i) % EAGER_SLOTS])
    }

    pub(super) fn front(&self) -> Option<&T> {
        (!self.is_empty()).then(|| &self.items[usize::from(self.head)])
    }

    pub(super) fn pop(&mut self) -> Option<T> {
        let item = *self.front()?;
        self.head = ((usize::from(self.head) + 1) % EAGER_SLOTS) as u8;
        self.len -= 1;
        Some(item)
    }
}

/// The sender's count of ring slots: what it wrote and what the receiver returned.
#[derive(Clone, Copy, Debug)]
pub(super) struct Credits {
    /// Eager messages written.
    sent: u64,
    /// Messages the receiver took or bounced, as last read from the credit word.
    freed: u64,
    /// The latest bounce the credit word reported ([`NO_BOUNCE`]: none).
    bounce_at: u64,
    /// The latest bounce the sender handled (resent from): an older one in the word is old news.
    handled: u64,
}

impl Default for Credits {
    fn default() -> Self {
        Self {
            sent: 0,
            freed: 0,
            bounce_at: NO_BOUNCE,
            handled: NO_BOUNCE,
        }
    }
}

/// The receiver's verdict on eager message `number`, as far as the credit word tells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Heard {
    /// Not taken or bounced yet (or its credit word not written yet).
    Nothing,
    /// Taken: its receive is complete.
    Taken,
    /// Bounced (with every later message of its epoch).
    Bounced,
}

impl Credits {
    /// Take the credit word as read: the freed count never shrinks and never passes what was
    /// sent, and a bounce lies below it; anything else is the peer's (or memory's) fault.
    pub(super) fn update(&mut self, freed: u64, bounce_at: u64) -> Result<(), u64> {
        if freed < self.freed || freed > self.sent || (bounce_at != NO_BOUNCE && bounce_at >= freed)
        {
            return Err(freed);
        }
        self.freed = freed;
        self.bounce_at = bounce_at;
        Ok(())
    }

    /// What the credit word says of message `number`.
    pub(super) fn heard(&self, number: u64) -> Heard {
        if number >= self.freed {
            return Heard::Nothing;
        }
        let fresh_bounce = self.bounce_at != NO_BOUNCE
            && (self.handled == NO_BOUNCE || self.bounce_at > self.handled);
        if fresh_bounce && number >= self.bounce_at {
            Heard::Bounced
        } else {
            Heard::Taken
        }
    }

    /// The sender resends from message `number`, bounced (learnt from the word or from the
    /// receive's entries): the word's report of that bounce is old news from now on.
    pub(super) fn bounce_handled(&mut self, number: u64) {
        self.handled = number;
    }

    /// Whether a slot is free.
    #[inline(always)]
    pub(super) fn available(&self) -> bool {
        self.sent - self.freed < EAGER_SLOTS as u64
    }

    /// Take the next slot: the message's number and its slot.
    pub(super) fn take(&mut self) -> (u64, usize) {
        let number = self.sent;
        self.sent += 1;
        (number, (number % EAGER_SLOTS as u64) as usize)
    }
}

/// The receiver's count of ring slots: arrived, freed (taken or bounced), returned to the sender.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ring {
    arrived: u64,
    freed: u64,
    returned: u64,
    /// Bouncing every message of this epoch (after a bounce, until the sender's epoch flips).
    bouncing: Option<bool>,
    /// The number of the message that started the latest bounce ([`NO_BOUNCE`]: none).
    bounce_at: u64,
    /// A bounce the sender has not been told of yet.
    bounce_unreported: bool,
    /// Messages taken without their receive's entries being written: only the credit word
    /// confirms them.
    unconfirmed_takes: u64,
}

impl Default for Ring {
    fn default() -> Self {
        Self {
            arrived: 0,
            freed: 0,
            returned: 0,
            bouncing: None,
            bounce_at: NO_BOUNCE,
            bounce_unreported: false,
            unconfirmed_takes: 0,
        }
    }
}

/// What the receiver does with the oldest held message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Its receive is not posted yet: keep it (and every later one) in the ring.
    Hold,
    /// Copy it into the receive's buffer; the receive is done.
    Accept,
    /// Drop it; the receive waits for its data to come the clear-to-send way.
    Bounce,
}

impl Ring {
    /// A message arrived: the slot it was written to (they arrive in the order they were sent).
    /// `None` when more arrived than the ring holds (the sender ignored its credits).
    pub(super) fn arrive(&mut self) -> Option<usize> {
        if self.arrived - self.freed >= EAGER_SLOTS as u64 {
            return None;
        }
        let slot = (self.arrived % EAGER_SLOTS as u64) as usize;
        self.arrived += 1;
        Some(slot)
    }

    /// Messages that arrived since the start.
    pub(super) fn arrived(&self) -> u64 {
        self.arrived
    }

    /// The oldest message not yet taken or bounced: its slot.
    pub(super) fn oldest_held(&self) -> Option<usize> {
        (self.freed < self.arrived).then_some((self.freed % EAGER_SLOTS as u64) as usize)
    }

    /// The verdict on the oldest held message of `epoch`: `offer` is its receive, `None` when that
    /// is not posted yet. Bouncing starts with a refused message and lasts while the epoch does.
    pub(super) fn judge(
        &mut self,
        epoch: bool,
        tag: u32,
        size: u64,
        offer: Option<Offer>,
    ) -> Verdict {
        match self.bouncing {
            Some(bouncing) if bouncing == epoch => return Verdict::Bounce,
            Some(_) => self.bouncing = None,
            None => {}
        }
        let Some(offer) = offer else {
            return Verdict::Hold;
        };
        if accepts(offer, tag, size) {
            Verdict::Accept
        } else {
            self.bouncing = Some(epoch);
            self.bounce_at = self.freed;
            self.bounce_unreported = true;
            Verdict::Bounce
        }
    }

    /// Whether held messages of `epoch` are being bounced without a look at their receive.
    pub(super) fn bouncing(&self, epoch: bool) -> bool {
        self.bouncing == Some(epoch)
    }

    /// The oldest held message was taken or bounced: its slot is free. `unconfirmed`: it was
    /// taken without its receive's entries being written.
    pub(super) fn free_oldest(&mut self, unconfirmed: bool) {
        debug_assert!(self.freed < self.arrived);
        self.freed += 1;
        self.unconfirmed_takes += u64::from(unconfirmed);
    }

    /// The credit word to write now, if one is due: a batch freed, a bounce not reported, or an
    /// empty ring with a taken message only the word confirms.
    pub(super) fn credits_due(&self) -> Option<CreditWord> {
        let unreturned = self.freed - self.returned;
        let idle = self.freed == self.arrived && self.unconfirmed_takes > 0;
        (unreturned >= CREDIT_BATCH || self.bounce_unreported || (idle && unreturned > 0))
            .then_some(CreditWord {
                freed: self.freed,
                bounce_at: self.bounce_at,
            })
    }

    /// The credit word [`credits_due`](Self::credits_due) gave was written.
    pub(super) fn credits_returned(&mut self) {
        self.returned = self.freed;
        self.bounce_unreported = false;
        self.unconfirmed_takes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_roundtrip_and_checks() {
        let h = EagerHeader {
            tag: 7,
            size: 100,
            seq: 0x1_0005,
        };
        let bytes = h.encode();
        assert_eq!(EagerHeader::decode(&bytes, 116), Ok(h));
        assert_eq!(
            EagerHeader::decode(&bytes, 115),
            Err(DecodeError::Truncated),
            "the write's length must be header plus payload"
        );
        let mut bad = bytes;
        bad[8] ^= 1;
        assert_eq!(EagerHeader::decode(&bad, 116), Err(DecodeError::Checksum));
        assert_eq!(
            EagerHeader::decode(&[0; EAGER_HEADER_LEN], 16),
            Err(DecodeError::Checksum),
            "zeroed memory is no header"
        );
        let big = EagerHeader {
            size: EAGER_MAX as u32 + 1,
            ..h
        };
        assert_eq!(
            EagerHeader::decode(&big.encode(), EAGER_SLOT_LEN as u32 + 1),
            Err(DecodeError::Truncated)
        );
    }

    #[test]
    fn credit_word_roundtrip_and_torn_or_zeroed_words_are_not_read() {
        for (freed, bounce_at) in [(0, NO_BOUNCE), (5, 2), (u64::MAX - 1, NO_BOUNCE)] {
            let w = CreditWord { freed, bounce_at };
            assert_eq!(CreditWord::decode(&w.encode()), Some(w));
        }
        assert_eq!(CreditWord::decode(&[0; CREDIT_LEN]), None, "never written");
        // Half of a newer word over an older one, at every 8-byte boundary and byte by byte.
        let old = CreditWord {
            freed: 8,
            bounce_at: NO_BOUNCE,
        }
        .encode();
        let new = CreditWord {
            freed: 12,
            bounce_at: 9,
        }
        .encode();
        for cut in 1..CREDIT_LEN {
            let mut torn = old;
            torn[..cut].copy_from_slice(&new[..cut]);
            assert_eq!(CreditWord::decode(&torn), None, "new bytes up to {cut}");
            let mut torn = new;
            torn[..cut].copy_from_slice(&old[..cut]);
            assert_eq!(CreditWord::decode(&torn), None, "old bytes up to {cut}");
        }
    }

    #[test]
    fn imm_roundtrip_and_magic() {
        for (seq16, epoch) in [(0, false), (0xffff, true), (5, true)] {
            let imm = EagerImm { seq16, epoch };
            assert_eq!(EagerImm::decode(imm.encode()), Some(Ok(imm)));
        }
        assert_eq!(
            EagerImm::decode(0x5200_0001),
            None,
            "a clear-to-send immediate"
        );
        assert_eq!(
            EagerImm::decode(0x4502_0000),
            Some(Err(DecodeError::ReservedBits))
        );
    }

    #[test]
    fn the_rule_takes_only_a_fitting_one_buffer_host_receive_of_the_tag() {
        let offer = Offer {
            n: 1,
            eager_ok: true,
            tag: 3,
            capacity: 64,
        };
        assert!(accepts(offer, 3, 64));
        assert!(accepts(offer, 3, 0));
        assert!(!accepts(offer, 3, 65));
        assert!(!accepts(offer, 4, 8));
        assert!(!accepts(Offer { n: 2, ..offer }, 3, 8));
        assert!(!accepts(
            Offer {
                eager_ok: false,
                ..offer
            },
            3,
            8
        ));
    }

    #[test]
    fn credits_refuse_going_back_or_past_what_was_sent_and_tell_each_verdict() {
        let mut c = Credits::default();
        for i in 0..EAGER_SLOTS as u64 {
            assert!(c.available());
            assert_eq!(c.take(), (i, i as usize));
        }
        assert!(!c.available());
        let past = EAGER_SLOTS as u64 + 1;
        assert_eq!(c.update(past, NO_BOUNCE), Err(past));
        assert_eq!(c.update(3, 3), Err(3), "a bounce lies below the count");
        assert_eq!(c.update(3, NO_BOUNCE), Ok(()));
        assert!(c.available());
        assert_eq!(c.update(2, NO_BOUNCE), Err(2));
        assert_eq!((c.heard(2), c.heard(3)), (Heard::Taken, Heard::Nothing));
        assert_eq!(c.update(6, 4), Ok(()));
        assert_eq!(
            (c.heard(3), c.heard(4), c.heard(5), c.heard(6)),
            (Heard::Taken, Heard::Bounced, Heard::Bounced, Heard::Nothing)
        );
        c.bounce_handled(4);
        assert_eq!(c.update(9, 4), Ok(()));
        assert_eq!(c.heard(7), Heard::Taken, "a handled bounce is old news");
        assert_eq!(c.take(), (16, 0), "message 16 uses slot 0 again");
    }

    #[test]
    fn ring_holds_judges_bounces_by_epoch_and_says_when_credits_are_due() {
        let word = |freed: u64, bounce_at: u64| CreditWord { freed, bounce_at };
        let mut r = Ring::default();
        let offer = Offer {
            n: 1,
            eager_ok: true,
            tag: 1,
            capacity: 8,
        };
        assert_eq!(r.arrive(), Some(0));
        assert_eq!(r.judge(false, 1, 8, None), Verdict::Hold);
        assert_eq!(r.judge(false, 1, 8, Some(offer)), Verdict::Accept);
        r.free_oldest(false);
        assert_eq!(
            r.credits_due(),
            None,
            "confirmed by its entries, and no batch yet"
        );
        assert_eq!(r.arrive(), Some(1));
        assert_eq!(r.judge(false, 2, 8, Some(offer)), Verdict::Bounce);
        r.free_oldest(false);
        assert!(r.bouncing(false));
        assert_eq!(
            r.credits_due(),
            Some(word(2, 1)),
            "a bounce is told at once"
        );
        r.credits_returned();
        assert_eq!(r.arrive(), Some(2));
        assert_eq!(
            r.judge(false, 1, 8, Some(offer)),
            Verdict::Bounce,
            "the rest of the epoch bounces, acceptable or not"
        );
        r.free_oldest(false);
        assert_eq!(r.arrive(), Some(3));
        assert_eq!(r.judge(true, 1, 8, Some(offer)), Verdict::Accept);
        assert!(!r.bouncing(false));
        r.free_oldest(true);
        assert_eq!(
            r.credits_due(),
            Some(word(4, 1)),
            "the ring is empty and a take is confirmed by nothing else"
        );
        r.credits_returned();
        for _ in 0..CREDIT_BATCH - 1 {
            r.arrive();
            r.free_oldest(false);
        }
        assert_eq!(r.credits_due(), None);
        r.arrive();
        r.free_oldest(false);
        assert_eq!(r.credits_due(), Some(word(4 + CREDIT_BATCH, 1)));
        r.credits_returned();
        for _ in 0..EAGER_SLOTS {
            assert!(r.arrive().is_some());
        }
        assert_eq!(r.arrive(), None, "more than the ring holds");
    }

    #[test]
    fn fifo_keeps_order_and_bounds() {
        let mut f = Fifo::new(0u32);
        for i in 0..EAGER_SLOTS as u32 {
            assert!(f.push(i));
        }
        assert!(!f.push(99));
        assert_eq!(f.pop(), Some(0));
        assert!(f.push(16));
        let drained: alloc::vec::Vec<u32> = core::iter::from_fn(|| f.pop()).collect();
        assert_eq!(drained, (1..=16).collect::<alloc::vec::Vec<_>>());
        assert!(f.is_empty() && f.front().is_none());
    }
}
