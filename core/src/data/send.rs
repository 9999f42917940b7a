//! The sending side of one connection.

use super::codec::{
    CTS_ENTRY_LEN, CTS_SLOT_LEN, CtsEntry, DecodeError, Imm, RECORD_LEN, SizeRecord, WrId, WrKind,
    stamp_for,
};
use super::eager::{
    CREDIT_LEN, CREDIT_OFFSET, CreditWord, Credits, EAGER_HEADER_LEN, EAGER_MAX, EAGER_SLOTS,
    EagerHeader, EagerImm, Fifo, Heard, Offer, RECV_INBOUND_EAGER_LEN, ring_offset, staging_offset,
};
use super::error::{DataError, ProtocolError};
use super::pool::{RequestPool, RequestState};
use super::queue::SendQueue;
use super::{
    CQ_DEPTH, Connection, EMPTY_WR, Health, MAX_RECVS, NO_COMPLETION, POLL_BATCH, RECV_INBOUND_LEN,
    RequestId, SLOTS, SendBuf, Side, SizesOut, check_peer_region, completion_error, region_addr,
};
use crate::nic::{
    Completion, CompletionKind, MAX_WR_BYTES, Nic, Payload, RemoteRegion, SendOp, SendWr, Sge,
};

/// What a send request of the pool is doing. Sizes are `u32`: a send is at most
/// [`MAX_WR_BYTES`] and a part's end too (checked when matching).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SendState {
    /// In the free list.
    Free,
    /// Posted (or waiting for the rest of its group); done when its slot's end completes.
    InFlight { size: u32 },
    /// The slot's end completed.
    Done { size: u32 },
    /// Refused: it did not fit its buffer (the fields of [`DataError::SizeMismatch`]).
    Refused { index: u8, sent: u32, capacity: u64 },
}

const _: () = assert!(size_of::<SendState>() <= 16);

impl RequestState for SendState {
    const FREE: Self = Self::Free;

    #[inline(always)]
    fn is_free(&self) -> bool {
        matches!(self, Self::Free)
    }

    #[inline(always)]
    fn pending(&self) -> bool {
        matches!(self, Self::InFlight { .. })
    }
}

impl SendState {
    /// What `test` reports for it (see [`RequestPool::settle`]), its size written to `sizes`
    /// when it finished.
    #[inline(always)]
    fn report(&self, sizes: &mut impl SizesOut) -> Result<bool, DataError> {
        match *self {
            Self::InFlight { .. } | Self::Free => Ok(false),
            Self::Done { size } => {
                sizes.put(0, size);
                Ok(true)
            }
            Self::Refused {
                index,
                sent,
                capacity,
            } => Err(DataError::size_mismatch(index, sent, capacity)),
        }
    }
}

/// A slot whose end (write-with-immediate) is posted and not yet completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EndState {
    Idle,
    Ending {
        /// Post position of the write-with-immediate (as carried in its `wr_id`).
        post: u32,
        /// Requests completed by it (refused ones are not listed).
        reqs: [u8; MAX_RECVS],
        count: u8,
    },
}

/// The oldest receive not yet fully matched. The matching data stays in place from one slot to
/// the next (rewriting ~300 bytes per message showed up in the instruction counts); `state` says
/// whether it is valid.
#[derive(Clone, Copy, Debug)]
struct Head {
    state: HeadState,
    m: Matching,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HeadState {
    /// Its entries have not been read (completely) yet; `m` is stale.
    Unread,
    /// Entries read and validated into `m`; matching in progress.
    Matching,
}

#[derive(Clone, Copy, Debug)]
struct Matching {
    n: u8,
    entries: [CtsEntry; MAX_RECVS],
    /// Bit i set: entry i is matched.
    matched: u8,
    reqs: [u8; MAX_RECVS],
    count: u8,
    record: SizeRecord,
    mismatch: bool,
}

/// A send matched to a buffer of the oldest outstanding receive ([`SendConn::isend`]'s first step).
#[derive(Clone, Copy, Debug)]
struct SendMatch {
    /// Index of the buffer in the receive's group.
    pos: u8,
    /// Buffers in the group.
    n: u8,
    /// The buffer's clear-to-send entry.
    entry: CtsEntry,
    /// The receive's FIFO slot.
    slot: u8,
    /// The request the send will take.
    req_index: u8,
    /// Larger than the buffer: refused, no data written.
    mismatch: bool,
    /// Where the send ends in the buffer (offset + length): the size a refused send reports.
    end: u64,
    /// The group's last unmatched buffer: this send ends the slot.
    last: bool,
    /// Some send of the group (this one included) was refused.
    group_mismatch: bool,
    /// The request exists already (an eager send bounced and now sent again): its state is
    /// updated, not a new one taken.
    reuse: bool,
}

impl SendMatch {
    /// Whether the send writes payload into the buffer (not when refused or empty).
    fn writes_data(&self, buf: SendBuf) -> bool {
        !self.mismatch && buf.len > 0
    }
}

/// What a planned work request carries.
#[derive(Clone, Copy, Debug)]
enum Body {
    /// Nothing.
    Empty,
    /// The user's payload.
    Data(Sge),
    /// The group's size record (inline or staged when posted).
    Record,
}

/// Where a planned work request writes.
#[derive(Clone, Copy, Debug)]
enum Target {
    /// The receiver's completion record of the slot.
    Record,
    /// A buffer of the receive (address and key from its clear-to-send entry).
    Buffer { addr: u64, rkey: u32 },
}

/// One planned work request.
#[derive(Clone, Copy, Debug)]
struct PlannedWr {
    wr_id: u64,
    op: SendOp,
    body: Body,
    target: Target,
    signaled: bool,
}

impl PlannedWr {
    const NONE: Self = Self {
        wr_id: 0,
        op: SendOp::Write,
        body: Body::Empty,
        target: Target::Record,
        signaled: false,
    };
}

/// The work requests of a matched send, with the record they may carry ([`SendConn::isend`]'s
/// second step; posted by the third, committed by the last).
#[derive(Clone, Copy, Debug)]
struct SendPlan {
    wrs: [PlannedWr; 2],
    used: usize,
    /// Post position of the write with immediate that ends the slot, when this send ends it.
    end_post: Option<u32>,
    /// The group's sizes so far, this send's included.
    record: SizeRecord,
    /// `record` encoded, when this send writes it (a group's end, or a refused single send).
    record_bytes: [u8; RECORD_LEN],
    record_len: usize,
    record_offset: usize,
}

impl SendPlan {
    fn push(&mut self, wr: PlannedWr) {
        self.wrs[self.used] = wr;
        self.used += 1;
    }
}

/// What [`SendConn::isend_one`] decided for a send, given the head receive's first
/// clear-to-send entry as the driver read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum OneSend<'a> {
    /// The send is taken: post `wr` (one signaled write with immediate; its payload inline when
    /// the driver handed the bytes over). A post that fails must be reported with
    /// [`SendConn::post_failed`]: the connection fails.
    Post {
        /// The request NCCL gets.
        req: RequestId,
        /// The work request to post.
        wr: SendWr<'a>,
    },
    /// The head receive's entry has not landed yet: try later.
    NotYet,
    /// Not the one-buffer case (a grouped receive, another tag, a send that does not fit or is
    /// empty, adaptive routing's split, a full pool or queue, an entry still landing): the general
    /// [`SendConn::isend`] decides.
    General,
}

/// The sending side of one connection: matches sends against the receiver's clear-to-send
/// entries and writes the data.
#[derive(Debug)]
pub struct SendConn {
    /// The receiver's completion records.
    peer_records: RemoteRegion,
    sq: SendQueue,
    /// Sequence number of the oldest receive not yet fully matched.
    seq: u32,
    head: Head,
    ends: [EndState; SLOTS],
    requests: RequestPool<SendState, true>,
    health: Health,
    /// Consecutive reads of a fresh-stamped entry that did not check yet.
    torn_reads: u32,
    /// Poll buffer, kept here so polling does not initialise one per call.
    batch: [Completion; POLL_BATCH],
    /// Single sends larger than this write their data first and end the slot with a separate
    /// write with immediate of the size record (adaptive routing may reorder the packets of
    /// one write, never a later write before an earlier one completes at the receiver).
    /// `u64::MAX`: always one write (the default).
    ar_threshold: u64,
    /// The eager path's sending half ([`super::eager`]).
    eager: EagerTx,
    /// Host-memory sends of up to this many bytes carry their payload inline (0: never).
    inline_max: u64,
}

/// What the sender keeps for the eager path.
#[derive(Clone, Copy, Debug)]
struct EagerTx {
    /// Sends of up to this many bytes may go eager; 0: off (the peer announced no ring, or the
    /// driver did not turn it on).
    threshold: u64,
    credits: Credits,
    /// Flipped after each bounce learnt of; carried in every eager message.
    epoch: bool,
    /// The last clear-to-send entries the general path read offered eager, or [`EAGER_RETRY`]
    /// sends have waited for their entries since a bounce: try eager for the next send.
    predict: bool,
    /// Sends that could have gone eager but waited since `predict` went off.
    waited: u32,
    /// Eager sends not confirmed yet (their receive's entries not read), or, while `resending`,
    /// the bounced ones to send again the clear-to-send way: in send order.
    waiting: Fifo<Waiting>,
    resending: bool,
}

/// An eager send the sender has not seen taken yet.
#[derive(Clone, Copy, Debug)]
struct Waiting {
    req: u8,
    tag: u32,
    buf: SendBuf,
    /// The eager message's number (the credit word's verdicts name it).
    number: u64,
}

const NO_WAITING: Waiting = Waiting {
    req: 0,
    tag: 0,
    buf: SendBuf {
        addr: 0,
        len: 0,
        lkey: 0,
    },
    number: 0,
};

/// After a bounce, sends that wait for their entries before eager is tried again (unless the
/// general path reads entries that offer it first).
const EAGER_RETRY: u32 = 64;

/// Eager messages at most this long (header included) are assembled on the stack and posted
/// inline when the queue pair's inline limit allows; longer ones go through staging.
const EAGER_INLINE_MAX: usize = 512;

/// Consecutive failed checks of a fresh-stamped entry after which it is called corrupt rather
/// than still landing (a write lands within microseconds; this is many seconds of polling).
const MAX_TORN_READS: u32 = 1 << 24;

impl SendConn {
    /// A sender writing completion records into `peer_records` (the receiver's inbound region,
    /// from the handshake). A region shorter than [`RECV_INBOUND_LEN`] fails the connection.
    pub fn new(peer_records: RemoteRegion) -> Self {
        let health = match check_peer_region(peer_records, RECV_INBOUND_LEN) {
            Ok(_) => Health::Active,
            Err(err) => Health::Failed(err),
        };
        Self {
            peer_records,
            torn_reads: 0,
            sq: SendQueue::default(),
            seq: 0,
            head: Head {
                state: HeadState::Unread,
                m: Matching {
                    n: 1,
                    entries: [CtsEntry::default(); MAX_RECVS],
                    matched: 0,
                    reqs: [0; MAX_RECVS],
                    count: 0,
                    record: SizeRecord::default(),
                    mismatch: false,
                },
            },
            ends: [EndState::Idle; SLOTS],
            requests: RequestPool::new(Side::Send),
            health,
            batch: [NO_COMPLETION; POLL_BATCH],
            ar_threshold: u64::MAX,
            eager: EagerTx {
                threshold: 0,
                credits: Credits::default(),
                epoch: false,
                predict: true,
                waited: 0,
                waiting: Fifo::new(NO_WAITING),
                resending: false,
            },
            inline_max: 0,
        }
    }

    /// Let one-buffer sends of up to `max_inline` bytes (the queue pair's inline limit) whose
    /// bytes the driver hands over (host memory) carry them inline
    /// ([`isend_one`](Self::isend_one)).
    pub fn set_inline_max(&mut self, max_inline: usize) {
        self.inline_max = max_inline as u64;
    }

    /// Send messages of up to `threshold` bytes (at most [`EAGER_MAX`]) eager when the peer
    /// announced a ring ([`RECV_INBOUND_EAGER_LEN`] bytes of inbound region, wire version 4).
    /// The driver's inbound region must hold the credit word
    /// ([`SEND_INBOUND_EAGER_LEN`](super::eager::SEND_INBOUND_EAGER_LEN), announced to the
    /// receiver) and its staging region the ring's copy
    /// ([`SEND_STAGING_EAGER_LEN`](super::eager::SEND_STAGING_EAGER_LEN)). Returns the
    /// threshold in force (0: off).
    pub fn enable_eager(&mut self, threshold: u64) -> u64 {
        if (self.peer_records.len as usize) >= RECV_INBOUND_EAGER_LEN {
            self.eager.threshold = threshold.min(EAGER_MAX as u64);
        }
        self.eager.threshold
    }

    /// The eager threshold in force (0: off): the driver hands [`isend_host`](Self::isend_host)
    /// the bytes of a host-memory send up to it.
    #[inline(always)]
    pub fn eager_threshold(&self) -> u64 {
        self.eager.threshold
    }

    /// Adaptive routing (`NCCL_IB_ADAPTIVE_ROUTING`): single sends of more than `threshold`
    /// bytes (`NCCL_IB_AR_THRESHOLD`) post their data as a plain RDMA WRITE followed by a
    /// write with immediate carrying only the size record; `None` turns it off (data and
    /// immediate in one write, whatever the size).
    pub fn set_adaptive_routing(&mut self, threshold: Option<u64>) {
        self.ar_threshold = threshold.unwrap_or(u64::MAX);
    }

    /// Receives whose slot this side has ended (all their sends posted): a multi-QP driver
    /// learns from it when a grouped receive is complete on this queue pair.
    pub fn receives_ended(&self) -> u32 {
        self.seq
    }

    /// Send `buf` to the oldest outstanding receive's first unmatched buffer tagged `tag`.
    ///
    /// `Ok(None)` means "try later": the receiver has not posted that receive yet, no unmatched
    /// buffer of the oldest receive carries `tag`, or a pool or the send queue is full. Nothing is
    /// posted then. May poll the completion queue (when short of credits, or when the slot's
    /// previous lap has not completed here yet).
    ///
    /// A send larger than the matched buffer is not written: the request is created and its
    /// `test` returns [`DataError::SizeMismatch`]; the receiver's request fails the same way.
    pub fn isend(
        &mut self,
        nic: &mut impl Nic,
        buf: SendBuf,
        tag: u32,
    ) -> Result<Option<RequestId>, DataError> {
        self.isend_host(nic, buf, None, tag)
    }

    /// [`isend`](Self::isend), where `host` holds the send's bytes when the buffer is host
    /// memory (the driver may leave it `None` above [`eager_threshold`](Self::eager_threshold)):
    /// such a send may go eager ([`super::eager`]) when the receive's entries are not there yet.
    /// While earlier eager sends wait to be confirmed, a send goes eager or waits (`Ok(None)`).
    ///
    /// A send that waits polls the completion queue while anything it posted is not known
    /// complete: an inline send's request is done at its post ([`isend_one`](Self::isend_one)),
    /// so a sender whose sends all went inline may test nothing in flight; should one of those
    /// writes fail (a failed work request completes, with its error, signaled or not), the
    /// connection fails here, as soon as this side waits for its peer, not never.
    pub fn isend_host(
        &mut self,
        nic: &mut impl Nic,
        buf: SendBuf,
        host: Option<&[u8]>,
        tag: u32,
    ) -> Result<Option<RequestId>, DataError> {
        let sent = self.isend_or_wait(nic, buf, host, tag)?;
        if sent.is_none() && self.sq.unretired() != 0 {
            self.poll_cq(nic)?;
        }
        Ok(sent)
    }

    /// [`isend_host`](Self::isend_host) without the poll of a send that waits.
    fn isend_or_wait(
        &mut self,
        nic: &mut impl Nic,
        buf: SendBuf,
        host: Option<&[u8]>,
        tag: u32,
    ) -> Result<Option<RequestId>, DataError> {
        self.health.check()?;
        if !self.eager.waiting.is_empty() {
            self.eager_progress(nic)?;
            if !self.eager.waiting.is_empty() {
                return self.try_eager(nic, buf, host, tag);
            }
        }
        if let Some(req) = self.isend_at(nic, buf, tag, 0)? {
            return Ok(Some(req));
        }
        if self.head.state == HeadState::Unread {
            // The receive's entries are not there yet.
            return self.try_eager(nic, buf, host, tag);
        }
        Ok(None)
    }

    /// Write `buf` eager into the peer's ring for the receive after the ones already waiting,
    /// when allowed ([`super::eager`]): `Ok(None)` otherwise.
    fn try_eager(
        &mut self,
        nic: &mut impl Nic,
        buf: SendBuf,
        host: Option<&[u8]>,
        tag: u32,
    ) -> Result<Option<RequestId>, DataError> {
        let Some(bytes) = host else {
            return Ok(None);
        };
        if !self.eager.predict && buf.len <= self.eager.threshold {
            // A receiver that bounced may take eager messages again (its buffers changed): ask
            // again after a while, since the fast path does not look.
            self.eager.waited += 1;
            if self.eager.waited >= EAGER_RETRY {
                self.eager.predict = true;
            }
        }
        let e = &self.eager;
        if e.threshold == 0
            || buf.len > e.threshold
            || !e.predict
            || e.resending
            || e.waiting.len() == EAGER_SLOTS
            || buf.addr.checked_add(buf.len).is_none()
        {
            return Ok(None);
        }
        if bytes.len() as u64 != buf.len {
            return Err(DataError::InvalidArgument(
                "an eager send's bytes differ from its buffer",
            ));
        }
        if !e.credits.available() {
            self.read_credits(nic)?;
            if !self.eager.credits.available() {
                return Ok(None);
            }
        }
        let Some(req_index) = self.requests.next_free() else {
            return Ok(None);
        };
        if !self.sq.has_room(1) {
            self.poll_cq(nic)?;
            if !self.sq.has_room(1) {
                return Ok(None);
            }
        }
        let seq = self.seq.wrapping_add(self.eager.waiting.len() as u32);
        let (number, ring_slot) = self.eager.credits.take();
        let header = EagerHeader {
            tag,
            size: buf.len as u32,
            seq,
        }
        .encode();
        let imm = EagerImm {
            seq16: seq as u16,
            epoch: self.eager.epoch,
        }
        .encode();
        // Inside the ring: `enable_eager` checked the peer's region holds it.
        let remote_addr = self.peer_records.addr + ring_offset(ring_slot) as u64;
        let posted = self.sq.next(WrKind::Eager, ring_slot as u16, false);
        let total = EAGER_HEADER_LEN + bytes.len();
        let mut inline = [0u8; EAGER_INLINE_MAX];
        let payload = if total <= nic.max_inline().min(EAGER_INLINE_MAX) {
            inline[..EAGER_HEADER_LEN].copy_from_slice(&header);
            inline[EAGER_HEADER_LEN..total].copy_from_slice(bytes);
            Payload::Inline(&inline[..total])
        } else {
            let offset = staging_offset(ring_slot);
            nic.write_staging(offset, &header);
            nic.write_staging(offset + EAGER_HEADER_LEN, bytes);
            Payload::Staged {
                offset: offset as u32,
                len: total as u32,
            }
        };
        let wr = SendWr {
            wr_id: posted.wr_id,
            op: SendOp::WriteImm(imm),
            payload,
            remote_addr,
            rkey: self.peer_records.rkey,
            signaled: posted.signaled,
        };
        nic.post_send(&[wr])
            .map_err(|err| self.health.fail(err.into()))?;
        let id = self.requests.occupy(
            req_index,
            SendState::InFlight {
                size: buf.len as u32,
            },
        );
        self.eager.waiting.push(Waiting {
            req: req_index,
            tag,
            buf,
            number,
        });
        Ok(Some(id))
    }

    /// Read the receiver's credit word (one still landing is left for a later read).
    fn read_credits(&mut self, nic: &impl Nic) -> Result<(), DataError> {
        let mut raw = [0u8; CREDIT_LEN];
        nic.read_inbound(CREDIT_OFFSET, &mut raw);
        let Some(word) = CreditWord::decode(&raw) else {
            return Ok(());
        };
        self.eager
            .credits
            .update(word.freed, word.bounce_at)
            .map_err(|freed| self.health.fail(ProtocolError::Credits { freed }.into()))
    }

    /// Confirm the waiting eager sends whose receives' entries are in, by the rule both ends
    /// apply; on the first bounce, send it and every later one again the clear-to-send way, in
    /// order, as far as their receives allow.
    #[inline(never)]
    fn eager_progress(&mut self, nic: &mut impl Nic) -> Result<(), DataError> {
        self.read_credits(nic)?;
        while !self.eager.resending {
            let Some(&w) = self.eager.waiting.front() else {
                break;
            };
            let taken = match self.eager.credits.heard(w.number) {
                Heard::Taken => true,
                Heard::Bounced => false,
                Heard::Nothing => {
                    // Not in the credit word yet: the receive's entries tell, if they are in.
                    if !self.load_head(nic)? {
                        break;
                    }
                    let m = &self.head.m;
                    let first = m.entries[0];
                    let offer = Offer {
                        n: m.n,
                        eager_ok: first.eager_ok,
                        tag: first.tag,
                        capacity: first.size,
                    };
                    super::eager::accepts(offer, w.tag, w.buf.len)
                }
            };
            if taken {
                *self.requests.state_mut(usize::from(w.req)) = SendState::Done {
                    size: w.buf.len as u32,
                };
                // Its receive is done; its entries, if the receiver wrote any, are not needed.
                self.head.state = HeadState::Unread;
                self.seq = self.seq.wrapping_add(1);
                self.eager.waiting.pop();
            } else {
                // The receiver bounced it and every later one of this epoch.
                self.eager.credits.bounce_handled(w.number);
                self.eager.resending = true;
                self.eager.epoch = !self.eager.epoch;
            }
        }
        if self.eager.resending {
            self.resend(nic)?;
        }
        Ok(())
    }

    /// Send the bounced eager sends again the clear-to-send way, as NCCL's own retries of them
    /// would have gone without eager: in order, except that a send whose tag the oldest receive
    /// has no free buffer for waits for a later receive while sends of other tags go on (every
    /// later send of its tag waits behind it).
    fn resend(&mut self, nic: &mut impl Nic) -> Result<(), DataError> {
        let mut kept = Fifo::new(NO_WAITING);
        let mut blocked = false;
        while let Some(w) = self.eager.waiting.pop() {
            let tag_waits = (0..kept.len()).any(|i| kept.get(i).is_some_and(|k| k.tag == w.tag));
            if blocked || tag_waits {
                kept.push(w);
                continue;
            }
            if self.load_head(nic)? && !self.head_has_free(w.tag) {
                kept.push(w);
                continue;
            }
            match self.match_send(nic, w.buf, w.tag, 0, Some(w.req))? {
                Some(matched) => {
                    self.post_matched(nic, &matched, w.buf)?;
                }
                None => {
                    // The entries are not in, or no room: this and every later one wait.
                    blocked = true;
                    kept.push(w);
                }
            }
        }
        self.eager.resending = !kept.is_empty();
        self.eager.waiting = kept;
        Ok(())
    }

    /// Whether the oldest receive, its entries loaded, has an unmatched buffer tagged `tag`.
    fn head_has_free(&self, tag: u32) -> bool {
        let m = &self.head.m;
        (0..m.n).any(|i| m.matched & (1 << i) == 0 && m.entries[usize::from(i)].tag == tag)
    }

    /// Where the head receive's first clear-to-send entry lies in the inbound FIFO, when
    /// [`isend_one`](Self::isend_one) may decide the next send: no receive is half matched and
    /// the slot's previous lap has completed here.
    #[inline(always)]
    pub fn head_entry(&self) -> Option<usize> {
        let slot = self.seq as u8;
        (self.head.state == HeadState::Unread
            && self.ends[usize::from(slot)] == EndState::Idle
            && self.eager.waiting.is_empty())
        .then_some(usize::from(slot) * CTS_SLOT_LEN)
    }

    /// The send of `buf` tagged `tag`, decided from the entry at [`head_entry`](Self::head_entry)
    /// as the driver read it: `stamp` (its last four bytes, read first) and then `entry` (all 32).
    /// The common case, a whole send into a one-buffer receive (NCCL's point-to-point), is taken
    /// here and returned as the one work request to post: the core does not call the NIC, the
    /// driver posts. Every other case is left to [`isend`](Self::isend) ([`OneSend::General`]),
    /// which reads the entries again.
    ///
    /// `host`: the send's bytes, when the driver can hand them over (host memory). Up to the
    /// limit of [`set_inline_max`](Self::set_inline_max) the write carries them inline: the NIC
    /// copies them at the post and reads no memory later, as `ib_send_lat` sends small messages
    /// (on Soft-RoCE half a microsecond of an 8-byte message's latency). Ignored unless it is
    /// exactly `buf.len` bytes.
    #[inline(always)]
    pub fn isend_one<'a>(
        &mut self,
        stamp: u32,
        entry: &[u8; CTS_ENTRY_LEN],
        buf: SendBuf,
        tag: u32,
        host: Option<&'a [u8]>,
    ) -> Result<OneSend<'a>, DataError> {
        self.health.check()?;
        if stamp != stamp_for(self.seq) {
            // Not there yet: the general path may send it eager.
            // The general path also polls while it waits (see `isend_host`).
            return Ok(if self.eager.threshold != 0 || self.sq.unretired() != 0 {
                OneSend::General
            } else {
                OneSend::NotYet
            });
        }
        let Some(cts) = CtsEntry::decode_single(entry) else {
            // Still landing, grouped, or malformed: the general path counts, takes or reports it.
            return Ok(OneSend::General);
        };
        self.torn_reads = 0;
        if cts.tag != tag
            || cts.stamp != stamp
            || buf.len == 0
            || buf.len > cts.size
            || buf.len > self.ar_threshold
            || buf.addr.checked_add(buf.len).is_none()
            || !self.sq.has_room(1)
        {
            // `buf.len <= cts.size`, a checked size, also bounds it by the work request limit
            // below (checked there again for a send the general path takes).
            return Ok(OneSend::General);
        }
        if buf.len > u64::from(MAX_WR_BYTES) {
            return Err(DataError::InvalidArgument("send larger than 1 GiB"));
        }
        let Some(req_index) = self.requests.next_free() else {
            return Ok(OneSend::General);
        };
        let size = buf.len as u32;
        let (req, wr) = match host {
            Some(bytes) if bytes.len() as u64 == buf.len && buf.len <= self.inline_max => {
                self.end_inline(req_index, bytes, cts.addr, cts.rkey)
            }
            _ => self.end_whole(
                req_index,
                size,
                Payload::Local(Sge {
                    addr: buf.addr,
                    len: size,
                    lkey: buf.lkey,
                }),
                cts.addr,
                cts.rkey,
            ),
        };
        Ok(OneSend::Post { req, wr })
    }

    /// The driver could not post what [`isend_one`](Self::isend_one) returned for `req`: the
    /// connection fails with `err`, and the request, never handed out, is freed.
    #[cold]
    pub fn post_failed(&mut self, req: RequestId, err: crate::nic::NicError) -> DataError {
        if let Ok(index) = self.requests.lookup(req) {
            self.requests.release(index);
        }
        self.health.fail(err.into())
    }

    /// The one signaled write with immediate that ends the head receive's slot with request
    /// `req_index` (a whole send of `size` bytes into a one-buffer receive): takes its send-queue
    /// position, records the request in flight and the slot ending, moves to the next receive.
    /// The caller posts the work request.
    #[inline(always)]
    fn end_whole<'a>(
        &mut self,
        req_index: u8,
        size: u32,
        payload: Payload<'a>,
        remote_addr: u64,
        rkey: u32,
    ) -> (RequestId, SendWr<'a>) {
        self.end_whole_as(req_index, false, size, payload, remote_addr, rkey)
    }

    /// [`end_whole`](Self::end_whole) of an inline send: the NIC copied `bytes` into the work
    /// request at the post, so the send's buffer is free and its request done at once (its `test`
    /// polls nothing), and nothing waits for the write's completion. It is a
    /// [`WrKind::Data`] write, signaled only as the send queue's credits need (every
    /// [`SIGNAL_INTERVAL`](super::queue::SIGNAL_INTERVAL)-th), and the slot is not tracked: its
    /// next lap may start at once. A failed write still completes, with its error, and fails the
    /// connection at the next poll: every `test` of a request in flight and every `isend` that
    /// has to wait polls ([`isend_host`](Self::isend_host)); a close fences the unsignaled tail
    /// ([`drain`](Connection::drain)).
    #[inline(always)]
    fn end_inline<'a>(
        &mut self,
        req_index: u8,
        bytes: &'a [u8],
        remote_addr: u64,
        rkey: u32,
    ) -> (RequestId, SendWr<'a>) {
        let size = bytes.len() as u32;
        let (_, wr) = self.write_slot_end(WrKind::Data, Payload::Inline(bytes), remote_addr, rkey);
        let req = self.requests.occupy(req_index, SendState::Done { size });
        (req, wr)
    }

    /// [`end_whole`](Self::end_whole) for a new request, or (`reuse`) one that exists already.
    #[inline(always)]
    fn end_whole_as<'a>(
        &mut self,
        req_index: u8,
        reuse: bool,
        size: u32,
        payload: Payload<'a>,
        remote_addr: u64,
        rkey: u32,
    ) -> (RequestId, SendWr<'a>) {
        let (slot, wr) = self.write_slot_end(WrKind::SlotEnd, payload, remote_addr, rkey);
        let req = self.take_request(req_index, reuse, SendState::InFlight { size });
        let mut reqs = [0; MAX_RECVS];
        reqs[0] = req_index;
        self.ends[usize::from(slot)] = EndState::Ending {
            post: self.sq.posted() as u32,
            reqs,
            count: 1,
        };
        (req, wr)
    }

    /// The write with immediate that ends the head receive's slot (a whole send into a
    /// one-buffer receive), as a work request of `kind`: signaled when it ends the slot
    /// ([`WrKind::SlotEnd`], its completion completes the request), else as credits need. Takes
    /// its send-queue position and moves to the next receive; returns the slot it ended.
    #[inline(always)]
    fn write_slot_end<'a>(
        &mut self,
        kind: WrKind,
        payload: Payload<'a>,
        remote_addr: u64,
        rkey: u32,
    ) -> (u8, SendWr<'a>) {
        let slot = self.seq as u8;
        let imm = Imm {
            seq16: self.seq as u16,
            n: 1,
            record: false,
            mismatch: false,
        }
        .encode();
        let posted = self.sq.next(kind, u16::from(slot), kind == WrKind::SlotEnd);
        let wr = SendWr {
            wr_id: posted.wr_id,
            op: SendOp::WriteImm(imm),
            payload,
            remote_addr,
            rkey,
            signaled: posted.signaled,
        };
        // The slot ended: the next send reads the next receive's entries. (`head.m` needs no
        // update: it is rewritten when that receive is loaded.)
        self.head.state = HeadState::Unread;
        self.seq = self.seq.wrapping_add(1);
        (slot, wr)
    }

    /// [`isend`](Self::isend) of one part of a larger message: `buf` goes to byte `offset` of
    /// the matched buffer (a multi-QP connection splitting a message over its queue pairs posts
    /// the whole buffer on every one and sends part `i` at its offset). The part is refused when
    /// `offset + buf.len` exceeds the buffer.
    #[inline(always)]
    pub fn isend_at(
        &mut self,
        nic: &mut impl Nic,
        buf: SendBuf,
        tag: u32,
        offset: u64,
    ) -> Result<Option<RequestId>, DataError> {
        let Some(matched) = self.match_send(nic, buf, tag, offset, None)? else {
            return Ok(None);
        };
        self.post_matched(nic, &matched, buf).map(Some)
    }

    /// Post and commit a matched send.
    #[inline(always)]
    fn post_matched(
        &mut self,
        nic: &mut impl Nic,
        matched: &SendMatch,
        buf: SendBuf,
    ) -> Result<RequestId, DataError> {
        if matched.n == 1 && !matched.mismatch && buf.len <= self.ar_threshold {
            return self.send_whole(nic, matched, buf);
        }
        let plan = self.plan_send(matched, buf);
        self.post_plan(nic, &plan)?;
        Ok(self.commit_send(matched, &plan, buf))
    }

    /// Put a request in slot `index` in `state`: a new one, or (`reuse`) the one already there.
    #[inline(always)]
    fn take_request(&mut self, index: u8, reuse: bool, state: SendState) -> RequestId {
        if reuse {
            self.requests.reoccupy(index, state)
        } else {
            self.requests.occupy(index, state)
        }
    }

    /// Validate `buf` and find the buffer of the oldest outstanding receive it goes to: `None`
    /// ("try later") while that receive's entries are not all in, none of its unmatched buffers
    /// has `tag`, no request is free, or the send queue has no room for what the send will post.
    #[inline(always)]
    fn match_send(
        &mut self,
        nic: &mut impl Nic,
        buf: SendBuf,
        tag: u32,
        offset: u64,
        reuse: Option<u8>,
    ) -> Result<Option<SendMatch>, DataError> {
        self.health.check()?;
        // A part's end, not only its length, stays within one work request's limit: a refused
        // part reports its end in the size record.
        if buf.len > u64::from(MAX_WR_BYTES) || offset > u64::from(MAX_WR_BYTES) - buf.len {
            return Err(DataError::InvalidArgument("send larger than 1 GiB"));
        }
        if buf.addr.checked_add(buf.len).is_none() {
            return Err(DataError::InvalidArgument(
                "send buffer wraps the address space",
            ));
        }
        if !self.load_head(nic)? || self.head.state != HeadState::Matching {
            return Ok(None);
        }
        let head = &self.head.m;
        let n = head.n;
        // A plain loop: as an iterator `find` the compiler kept it out of line in the plugin's
        // `isend`.
        let mut found = None;
        for i in 0..n {
            if head.matched & (1 << i) == 0 && head.entries[usize::from(i)].tag == tag {
                found = Some(i);
                break;
            }
        }
        let Some(pos) = found else {
            return Ok(None);
        };
        let Some(req_index) = reuse.or_else(|| self.requests.next_free()) else {
            return Ok(None);
        };
        let mut entry = head.entries[usize::from(pos)];
        // `offset` is at most the buffer's size here, and `addr + size` was checked not to wrap.
        let mismatch = offset > entry.size || buf.len > entry.size - offset;
        if !mismatch {
            entry.addr += offset;
            entry.size -= offset;
        }
        let matched = SendMatch {
            pos,
            n,
            entry,
            slot: self.seq as u8,
            req_index,
            mismatch,
            end: offset + buf.len,
            last: head.matched.count_ones() + 1 == u32::from(n),
            group_mismatch: head.mismatch || mismatch,
            reuse: reuse.is_some(),
        };
        let wr_count = if n == 1 {
            1 + usize::from(matched.writes_data(buf) && buf.len > self.ar_threshold)
        } else {
            usize::from(matched.writes_data(buf)) + usize::from(matched.last)
        };
        if !self.sq.has_room(wr_count) {
            self.poll_cq(nic)?;
            if !self.sq.has_room(wr_count) {
                return Ok(None);
            }
        }
        Ok(Some(matched))
    }

    /// A send that fits a one-buffer receive, without adaptive routing's split (the common
    /// case, NCCL's point-to-point): one signaled write with immediate of the data (or of nothing
    /// into the record, for an empty send) ends the slot. The same work request as
    /// [`plan_send`](Self::plan_send) → [`post_plan`](Self::post_plan) →
    /// [`commit_send`](Self::commit_send) produce for it, built once, with no plan and no record.
    #[inline(always)]
    fn send_whole(
        &mut self,
        nic: &mut impl Nic,
        m: &SendMatch,
        buf: SendBuf,
    ) -> Result<RequestId, DataError> {
        let (payload, remote_addr, rkey) = if buf.len == 0 {
            let record_addr = self.peer_record_addr(usize::from(m.slot) * RECORD_LEN)?;
            (Payload::Empty, record_addr, self.peer_records.rkey)
        } else {
            let sge = Sge {
                addr: buf.addr,
                // `buf.len <= MAX_WR_BYTES` was checked when matching.
                len: buf.len as u32,
                lkey: buf.lkey,
            };
            (Payload::Local(sge), m.entry.addr, m.entry.rkey)
        };
        let (id, wr) = self.end_whole_as(
            m.req_index,
            m.reuse,
            buf.len as u32,
            payload,
            remote_addr,
            rkey,
        );
        nic.post_send(&[wr]).map_err(|err| {
            if m.reuse {
                self.health.fail(err.into())
            } else {
                self.post_failed(id, err)
            }
        })?;
        Ok(id)
    }

    /// The work requests for a matched send (taking their send-queue positions): for a single
    /// receive one signaled write with immediate (of the data, of nothing, or of the record of a
    /// refused send); for a group the data write, then at the group's last send the record's
    /// write with immediate that ends the slot.
    #[inline(always)]
    fn plan_send(&mut self, m: &SendMatch, buf: SendBuf) -> SendPlan {
        let mut record = self.head.m.record;
        // `buf.len <= MAX_WR_BYTES` was checked when matching, so it fits `u32`.
        let len32 = buf.len as u32;
        // A refused send reports where it would have ended, which is what did not fit.
        record.sizes[usize::from(m.pos)] = if m.mismatch { m.end as u32 } else { len32 };
        // Only encoded when a record is written (a group's end, or a refused single send).
        let split_end = m.n == 1 && buf.len > self.ar_threshold && m.writes_data(buf);
        let with_record = m.n > 1 || m.mismatch || split_end;
        let (record_bytes, record_len) = if m.last && with_record {
            record.encode()
        } else {
            ([0; RECORD_LEN], 0)
        };
        let data = Body::Data(Sge {
            addr: buf.addr,
            len: len32,
            lkey: buf.lkey,
        });
        let imm = Imm {
            seq16: self.seq as u16,
            n: m.n,
            record: with_record,
            mismatch: m.group_mismatch,
        }
        .encode();
        let mut plan = SendPlan {
            wrs: [PlannedWr::NONE; 2],
            used: 0,
            end_post: None,
            record,
            record_bytes,
            record_len,
            record_offset: usize::from(m.slot) * RECORD_LEN,
        };
        let buffer = Target::Buffer {
            addr: m.entry.addr,
            rkey: m.entry.rkey,
        };
        if m.n == 1 && !split_end {
            let (body, target) = if m.mismatch {
                (Body::Record, Target::Record)
            } else if buf.len == 0 {
                (Body::Empty, Target::Record)
            } else {
                (data, buffer)
            };
            let posted = self.sq.next(WrKind::SlotEnd, u16::from(m.slot), true);
            plan.end_post = Some(self.sq.posted() as u32);
            plan.push(PlannedWr {
                wr_id: posted.wr_id,
                op: SendOp::WriteImm(imm),
                body,
                target,
                signaled: true,
            });
            return plan;
        }
        if m.writes_data(buf) {
            let posted = self.sq.next(WrKind::Data, u16::from(m.req_index), false);
            plan.push(PlannedWr {
                wr_id: posted.wr_id,
                op: SendOp::Write,
                body: data,
                target: buffer,
                signaled: posted.signaled,
            });
        }
        if m.last {
            let posted = self.sq.next(WrKind::SlotEnd, u16::from(m.slot), true);
            plan.end_post = Some(self.sq.posted() as u32);
            plan.push(PlannedWr {
                wr_id: posted.wr_id,
                op: SendOp::WriteImm(imm),
                body: Body::Record,
                target: Target::Record,
                signaled: true,
            });
        }
        plan
    }

    /// Post the planned work requests as one chain. The record goes inline when it fits, else
    /// through staging.
    #[inline(always)]
    fn post_plan(&mut self, nic: &mut impl Nic, plan: &SendPlan) -> Result<(), DataError> {
        if plan.used == 0 {
            return Ok(());
        }
        let record_addr = self.peer_record_addr(plan.record_offset)?;
        let max_inline = nic.max_inline();
        let mut chain = [EMPTY_WR; 2];
        for (out, wr) in chain.iter_mut().zip(&plan.wrs[..plan.used]) {
            let payload = match wr.body {
                Body::Empty => Payload::Empty,
                Body::Data(sge) => Payload::Local(sge),
                Body::Record => record_payload(
                    nic,
                    max_inline,
                    plan.record_offset,
                    &plan.record_bytes[..plan.record_len],
                ),
            };
            let (remote_addr, rkey) = match wr.target {
                Target::Record => (record_addr, self.peer_records.rkey),
                Target::Buffer { addr, rkey } => (addr, rkey),
            };
            *out = SendWr {
                wr_id: wr.wr_id,
                op: wr.op,
                payload,
                remote_addr,
                rkey,
                signaled: wr.signaled,
            };
        }
        nic.post_send(&chain[..plan.used])
            .map_err(|err| self.health.fail(err.into()))
    }

    /// Posted: take the request, record the match, and when the send ended its slot, move on
    /// to the next receive.
    #[inline(always)]
    fn commit_send(&mut self, m: &SendMatch, plan: &SendPlan, buf: SendBuf) -> RequestId {
        let state = if m.mismatch {
            // A part of a striped message reports where it would have ended, as its record
            // does: the last part's end is the message's size, which is what did not fit.
            SendState::Refused {
                index: m.pos,
                sent: m.end as u32,
                capacity: m.entry.size,
            }
        } else {
            SendState::InFlight {
                size: buf.len as u32,
            }
        };
        let id = self.take_request(m.req_index, m.reuse, state);
        let head = &mut self.head.m;
        head.matched |= 1 << m.pos;
        head.record = plan.record;
        head.mismatch = m.group_mismatch;
        if !m.mismatch {
            head.reqs[usize::from(head.count)] = m.req_index;
            head.count += 1;
        }
        if let Some(post) = plan.end_post {
            self.ends[usize::from(m.slot)] = EndState::Ending {
                post,
                reqs: head.reqs,
                count: head.count,
            };
            self.head.state = HeadState::Unread;
            self.seq = self.seq.wrapping_add(1);
        }
        id
    }

    /// The cause the connection failed with, if it did.
    pub fn failure(&self) -> Option<&DataError> {
        self.health.failure()
    }

    /// [`read_entry`], counting how long an entry with a fresh stamp keeps failing its check: a
    /// write lands in microseconds, so [`MAX_TORN_READS`] consecutive failures mean corruption.
    fn read_landed(
        &mut self,
        nic: &impl Nic,
        base: usize,
        slot: u8,
        i: u8,
    ) -> Result<Option<CtsEntry>, DataError> {
        match read_entry(nic, base, slot, i) {
            Ok(Some(entry)) => {
                self.torn_reads = 0;
                Ok(Some(entry))
            }
            Ok(None) if self.torn_reads < MAX_TORN_READS => {
                self.torn_reads += 1;
                Ok(None)
            }
            Ok(None) => Err(self.health.fail(
                ProtocolError::CtsEntry {
                    slot: slot.into(),
                    entry: i,
                    err: DecodeError::Checksum,
                }
                .into(),
            )),
            Err(e) => Err(self.health.fail(e)),
        }
    }

    /// Read and validate the oldest receive's entries into `self.head` on first use. False while
    /// they are not all there or while the slot's previous lap has not completed here yet.
    fn load_head(&mut self, nic: &mut impl Nic) -> Result<bool, DataError> {
        if self.head.state == HeadState::Matching {
            return Ok(true);
        }
        let slot = self.seq as u8;
        if self.ends[usize::from(slot)] != EndState::Idle {
            self.poll_cq(nic)?;
            if self.ends[usize::from(slot)] != EndState::Idle {
                return Ok(false);
            }
        }
        let base = usize::from(slot) * CTS_SLOT_LEN;
        let stamp = stamp_for(self.seq);
        // The peer's NIC writes the entries while we read them. Read each entry's stamp first and
        // only then (after `read_inbound`'s acquire fence) the entry itself: reading the whole
        // entry at once could pair a fresh stamp with fields of the previous lap.
        if !stamp_fresh(nic, base, stamp) {
            return Ok(false);
        }
        let Some(first) = self.read_landed(nic, base, slot, 0)? else {
            return Ok(false);
        };
        let n = first.n;
        if first.index != 0 {
            return Err(self.fail_group(slot));
        }
        for i in 1..n {
            if !stamp_fresh(nic, base + usize::from(i) * CTS_ENTRY_LEN, stamp) {
                // The rest of the group's write has not landed yet.
                return Ok(false);
            }
        }
        // Stamps never go stale while we are behind them: the receiver rewrites this slot only
        // after this receive completed, which needs this sender's write-with-immediate.
        self.head.m.entries[0] = first;
        for i in 1..n {
            let Some(entry) = self.read_landed(nic, base, slot, i)? else {
                return Ok(false);
            };
            if entry.n != n || entry.index != i {
                return Err(self.fail_group(slot));
            }
            self.head.m.entries[usize::from(i)] = entry;
        }
        // The entries tell whether this receiver takes eager messages (host memory, one buffer).
        self.eager.predict = first.eager_ok;
        self.eager.waited = 0;
        let m = &mut self.head.m;
        m.n = n;
        m.matched = 0;
        m.count = 0;
        m.mismatch = false;
        m.record.n = n;
        self.head.state = HeadState::Matching;
        Ok(true)
    }

    /// The entries of `slot` disagree about their group: fail the connection.
    fn fail_group(&mut self, slot: u8) -> DataError {
        self.health
            .fail(ProtocolError::CtsGroup { slot: slot.into() }.into())
    }

    /// Process every completion the queue holds (bounded by its depth).
    #[inline(never)]
    fn poll_cq(&mut self, nic: &mut impl Nic) -> Result<(), DataError> {
        self.poll_cq_inline(nic)
    }

    /// [`poll_cq`](Self::poll_cq), inlined into `test`, which polls on every call. The common
    /// completion ([`ended_one`]) is taken as the NIC hands it over where the backend offers it;
    /// the rest come back in the poll buffer, in order, and are taken there or go the long way.
    #[inline(always)]
    fn poll_cq_inline(&mut self, nic: &mut impl Nic) -> Result<(), DataError> {
        for _ in 0..CQ_DEPTH / POLL_BATCH + 1 {
            let Self {
                batch,
                ends,
                sq,
                requests,
                ..
            } = self;
            let (got, left) = nic
                .poll_take(
                    batch,
                    #[inline(always)]
                    |c| ended_one(c, ends, sq, requests),
                )
                .map_err(|e| self.health.fail(e.into()))?;
            for i in 0..left.min(POLL_BATCH) {
                let c = self.batch[i];
                if !ended_one(&c, &mut self.ends, &mut self.sq, &mut self.requests) {
                    self.handle_completion(&c)
                        .map_err(|e| self.health.fail(e))?;
                }
            }
            if got < POLL_BATCH {
                break;
            }
        }
        Ok(())
    }

    #[inline(never)]
    fn handle_completion(&mut self, c: &Completion) -> Result<(), DataError> {
        if !c.status.is_success() {
            return Err(completion_error(c));
        }
        let id = WrId::decode(c.wr_id).map_err(|err| ProtocolError::WrId {
            wr_id: c.wr_id,
            err,
        })?;
        if c.kind != CompletionKind::Send {
            return Err(ProtocolError::UnexpectedCompletion { wr: WrKind::Recv }.into());
        }
        match id.kind {
            WrKind::Data => {
                self.sq.complete(id.seq, id.kind)?;
            }
            WrKind::SlotEnd => {
                let slot = usize::from(id.index as u8);
                let EndState::Ending { post, reqs, count } = self.ends[slot] else {
                    return Err(ProtocolError::UnexpectedCompletion { wr: id.kind }.into());
                };
                if post != id.seq {
                    return Err(ProtocolError::UnexpectedCompletion { wr: id.kind }.into());
                }
                self.sq.complete(id.seq, id.kind)?;
                end_slot(&mut self.ends, &mut self.requests, slot, reqs, count);
            }
            WrKind::Eager => {
                self.sq.complete(id.seq, id.kind)?;
            }
            WrKind::Cts | WrKind::Recv | WrKind::Credit => {
                return Err(ProtocolError::UnexpectedCompletion { wr: id.kind }.into());
            }
        }
        Ok(())
    }
}

/// Take completion `c` if it is the common one, without decoding: the successful
/// write-with-immediate that ends a slot, at the post position the slot's end was posted at.
/// Every check of [`SendConn::handle_completion`] holds for it: the `wr_id` is compared whole
/// with the only value its decoder and the slot accept (magic, kind, index in range, position),
/// and the send queue validates the position as before. Anything else (`false`, nothing changed)
/// goes the long way, which names the violation. The sender's fields come one by one: the poll
/// buffer, borrowed apart, is not among them.
#[inline(always)]
fn ended_one(
    c: &Completion,
    ends: &mut [EndState; SLOTS],
    sq: &mut SendQueue,
    requests: &mut RequestPool<SendState, true>,
) -> bool {
    let Completion {
        wr_id: got_wr_id,
        status,
        kind: CompletionKind::Send,
        ..
    } = *c
    else {
        return false;
    };
    // The slot the `wr_id` names, if it is a slot end (`SLOTS` is 256: a `u8` is in range);
    // the compare below rejects a `wr_id` whose index does not fit one.
    let slot = usize::from((got_wr_id >> 8) as u8);
    let EndState::Ending { post, reqs, count } = ends[slot] else {
        return false;
    };
    let wr_id = WrId {
        kind: WrKind::SlotEnd,
        index: slot as u16,
        seq: post,
    }
    .encode();
    if !status.is_success() || got_wr_id != wr_id || sq.complete(post, WrKind::SlotEnd).is_err() {
        return false;
    }
    end_slot(ends, requests, slot, reqs, count);
    true
}

/// The slot's end completed: its requests are done.
#[inline(always)]
fn end_slot(
    ends: &mut [EndState; SLOTS],
    requests: &mut RequestPool<SendState, true>,
    slot: usize,
    reqs: [u8; MAX_RECVS],
    count: u8,
) {
    for &req in reqs.iter().take(usize::from(count)) {
        let state = requests.state_mut(usize::from(req));
        if let SendState::InFlight { size } = *state {
            *state = SendState::Done { size };
        }
    }
    ends[slot] = EndState::Idle;
}

/// Read and decode entry `i` of the FIFO slot at `base`. `None` while its bytes do not check
/// (the write is still landing: RDMA does not order bytes within one write); a malformed entry
/// that does check is a protocol error.
fn read_entry(nic: &impl Nic, base: usize, slot: u8, i: u8) -> Result<Option<CtsEntry>, DataError> {
    let mut bytes = [0u8; CTS_ENTRY_LEN];
    nic.read_inbound(base + usize::from(i) * CTS_ENTRY_LEN, &mut bytes);
    match CtsEntry::decode(&bytes) {
        Ok(entry) => Ok(Some(entry)),
        Err(DecodeError::Checksum) => Ok(None),
        Err(err) => Err(ProtocolError::CtsEntry {
            slot: slot.into(),
            entry: i,
            err,
        }
        .into()),
    }
}

/// The record bytes as a payload: inline when they fit, else staged at the slot's staging offset.
fn record_payload<'a>(
    nic: &mut impl Nic,
    max_inline: usize,
    offset: usize,
    bytes: &'a [u8],
) -> Payload<'a> {
    if bytes.len() <= max_inline {
        Payload::Inline(bytes)
    } else {
        nic.write_staging(offset, bytes);
        Payload::Staged {
            offset: offset as u32,
            len: bytes.len() as u32,
        }
    }
}

impl Connection for SendConn {
    /// Poll the completion queue, then report on `req`. Finishing and errors free the request.
    #[inline(always)]
    fn test_into(
        &mut self,
        nic: &mut impl Nic,
        req: RequestId,
        sizes: &mut impl SizesOut,
    ) -> Result<bool, DataError> {
        let index = self.requests.lookup(req)?;
        let progress = if self.requests.state(index).pending() {
            let polled = self.health.check().and_then(|()| self.poll_cq_inline(nic));
            // Eager sends are confirmed by the receiver's entries or credit word, not by a
            // completion (one branch when none waits).
            if polled.is_ok() && !self.eager.waiting.is_empty() {
                self.eager_progress(nic)
            } else {
                polled
            }
        } else {
            Ok(())
        };
        self.requests.settle(
            index,
            progress,
            #[inline(always)]
            |state| state.report(sizes),
        )
    }

    /// Fail the connection with `err` (an asynchronous fatal event, or the peer died), unless it
    /// failed already.
    fn handle_fatal(&mut self, err: DataError) {
        self.health.fail(err);
    }

    /// Before closing: poll the completion queue, then say how many receives this side's posted
    /// sends are still completing: write-with-immediates that end a receive (and complete it at
    /// the receiver) not completed yet. `Ok(0)` means drained: the receiver has all the data this
    /// side posted. The data writes of a grouped receive whose other sends never came cannot complete
    /// it and are not waited for. An error when the connection failed.
    ///
    /// The driver calls it until it says 0, the connection fails, the peer is gone, or a
    /// deadline passes, and only then destroys the queue pair, so a peer's receive is not cut
    /// off half-written.
    fn drain(&mut self, nic: &mut impl Nic) -> Result<usize, DataError> {
        self.health.check()?;
        self.poll_cq(nic)?;
        if !self.eager.waiting.is_empty() {
            self.eager_progress(nic)?;
        }
        if self.sq.unsignaled_tail() {
            self.post_fence(nic)?;
        }
        let pending = self
            .ends
            .iter()
            .filter(|end| **end != EndState::Idle)
            .count()
            + self.eager.waiting.len();
        // With nothing else pending, writes not known complete (inline sends, the fence) count
        // as one.
        Ok(pending.max(usize::from(self.sq.unretired() != 0)))
    }

    /// Requests handed out and not yet freed by `test`.
    fn outstanding(&self) -> usize {
        self.requests.outstanding()
    }
}

impl SendConn {
    /// The address of the completion record at `offset` in the peer's records region. The region
    /// was checked to hold [`RECV_INBOUND_LEN`] bytes when it was taken, so this fails only if a
    /// caller's offset does.
    #[inline(always)]
    fn peer_record_addr(&self, offset: usize) -> Result<u64, DataError> {
        region_addr(&self.peer_records, offset, RECORD_LEN).ok_or(DataError::PeerRegion {
            len: self.peer_records.len,
            need: RECV_INBOUND_LEN,
        })
    }

    /// Post a signaled empty write after unsignaled ones (inline sends, done at their post), so
    /// that a close learns when they completed: its completion retires every work request before
    /// it. It writes nothing (zero bytes, no immediate) into the peer's completion records.
    #[cold]
    fn post_fence(&mut self, nic: &mut impl Nic) -> Result<(), DataError> {
        if !self.sq.has_room(1) {
            // A signaled one is still in flight behind the tail's credits; it retires them.
            return Ok(());
        }
        let remote_addr = self.peer_record_addr(0)?;
        let posted = self.sq.next(WrKind::Data, 0, true);
        let wr = SendWr {
            wr_id: posted.wr_id,
            op: SendOp::Write,
            payload: Payload::Empty,
            remote_addr,
            rkey: self.peer_records.rkey,
            signaled: true,
        };
        nic.post_send(&[wr])
            .map_err(|err| self.health.fail(err.into()))
    }
}

/// Port failover ([`super::failover`]): quiesce, snapshot and replay a lane. Off the hot path:
/// nothing here runs unless a lane failed.
impl SendConn {
    /// Quiesce this lane after its queue pair failed and the driver moved it to the error state:
    /// post the marker send once, then take what the completion queue holds (successes before the
    /// failure as usual; the failure and the flushes behind it go to the tripwire). `Ok(true)`
    /// once the marker's flush is seen: nothing of the old queue pair is left.
    pub fn failover_quiesce<N: Nic>(
        &mut self,
        nic: &mut super::failover::Guarded<N>,
    ) -> Result<bool, super::failover::FailoverError> {
        use super::failover::{FailoverError, MARKER_SEND_WR_ID};
        self.health.check().map_err(FailoverError::Local)?;
        // Unarmed, the flushes would reach the connection as failures: failover is off.
        if !nic.trip.armed {
            return Err(FailoverError::Disabled);
        }
        if !nic.trip.markers_posted {
            let marker = SendWr {
                wr_id: MARKER_SEND_WR_ID,
                op: SendOp::Write,
                payload: Payload::Empty,
                remote_addr: 0,
                rkey: 0,
                signaled: true,
            };
            // Refused while the queue is full of work still flushing: tried again next call.
            nic.trip.markers_posted = nic.nic.post_send(&[marker]).is_ok();
        }
        self.poll_cq(nic).map_err(FailoverError::Local)?;
        if nic.trip.success_after {
            return Err(FailoverError::SuccessAfterFailure);
        }
        if nic.trip.send_marker {
            self.invalidate_unread_entries(&mut nic.nic);
        }
        Ok(nic.trip.send_marker)
    }

    /// Make every clear-to-send slot this end has not read yet look unwritten (its stamps those
    /// of the slot's previous lap). The receiver writes those entries again after the failover
    /// (its replay rewrites every entry from the first receive this end had not ended), and
    /// when it moved to another device, with new keys: an entry that landed before the failure
    /// carries keys that no longer work, and the same stamp. Nothing lands any more: the old
    /// queue pair is in error, the new one not yet connected. The slots whose entries this end
    /// read (the receives it ended and not yet known complete, and the head receive being
    /// matched) are kept: the replay reads them.
    fn invalidate_unread_entries(&self, nic: &mut impl Nic) {
        let acked = self.acked();
        let first = if self.head.state == HeadState::Matching {
            self.seq.wrapping_add(1)
        } else {
            self.seq
        };
        let end = acked.wrapping_add(SLOTS as u32);
        for seq in (0..end.wrapping_sub(first)).map(|i| first.wrapping_add(i)) {
            let stale = stamp_for(seq.wrapping_sub(SLOTS as u32)).to_le_bytes();
            let base = usize::from(seq as u8) * CTS_SLOT_LEN;
            for i in 0..MAX_RECVS {
                nic.write_inbound(base + (i + 1) * CTS_ENTRY_LEN - 4, &stale);
            }
        }
    }

    /// Receives below this are known complete here: their slot ends' completions were polled
    /// (slot ends complete in order, so those still ending are the newest).
    fn acked(&self) -> u32 {
        let ending = self.ends.iter().filter(|e| **e != EndState::Idle).count() as u32;
        self.seq.wrapping_sub(ending)
    }

    /// The quiesced lane's state, for the report.
    pub fn failover_snapshot(&self) -> Result<super::failover::SenderSnapshot, DataError> {
        let acked = self.acked();
        let ending = self.seq.wrapping_sub(acked);
        // Slot ends complete in order (RC): the ones still ending are the newest.
        for i in 0..ending {
            let slot = usize::from(acked.wrapping_add(i) as u8);
            if self.ends[slot] == EndState::Idle {
                return Err(ProtocolError::UnexpectedCompletion {
                    wr: WrKind::SlotEnd,
                }
                .into());
            }
        }
        Ok(super::failover::SenderSnapshot {
            ended: self.seq,
            acked,
            eager: self.eager.threshold != 0,
        })
    }

    /// Replay `plan` on the lane's new queue pair `nic` (connected to the peer's new one), the
    /// sends' buffers from `journal`: receives whose slot end landed are completed here, then
    /// every receive from the receiver's oldest on gets its data writes and slot end again, in
    /// order, then the partly matched head receive its data writes. The send queue starts over.
    ///
    /// `rekey` gives the receiver's records region as its new queue pair serves it and, when
    /// this end moved to another device, its own keys there; the plan the receiver's new keys of
    /// the entries consumed when it moved. Replayed writes and the head receive's entries (read
    /// before the failure) take the new keys.
    pub fn failover_replay(
        &mut self,
        nic: &mut impl Nic,
        plan: &super::failover::SenderPlan,
        journal: &mut super::failover::SendJournal,
        rekey: &super::failover::Rekey<'_>,
    ) -> Result<super::failover::Replayed, super::failover::FailoverError> {
        use super::failover::{FailoverError, Replayed};
        self.health.check().map_err(FailoverError::Local)?;
        let own = self.failover_snapshot().map_err(FailoverError::Local)?;
        if plan.complete.start != own.acked
            || plan.complete.end != plan.replay.start
            || plan.replay.end != own.ended
        {
            return Err(FailoverError::Local(DataError::InvalidArgument(
                "the replay plan is not this lane's",
            )));
        }
        self.peer_records =
            check_peer_region(rekey.peer_region, RECV_INBOUND_LEN).map_err(FailoverError::Local)?;
        if self.head.state == HeadState::Matching {
            let n = usize::from(self.head.m.n);
            for entry in self.head.m.entries.iter_mut().take(n) {
                entry.rkey = plan.peer_key(entry.rkey)?;
            }
        }
        self.sq = SendQueue::default();
        let mut done = Replayed::default();
        for seq in plan.complete.iter() {
            let slot = usize::from(seq as u8);
            if let EndState::Ending { reqs, count, .. } = self.ends[slot] {
                end_slot(&mut self.ends, &mut self.requests, slot, reqs, count);
            }
            done.receives += 1;
        }
        for seq in plan.replay.iter() {
            let EndState::Ending { reqs, count, .. } = self.ends[usize::from(seq as u8)] else {
                return Err(FailoverError::Local(
                    ProtocolError::UnexpectedCompletion {
                        wr: WrKind::SlotEnd,
                    }
                    .into(),
                ));
            };
            done.work_requests +=
                self.replay_slot(nic, seq, (reqs, count), true, journal, plan, rekey)?;
            done.receives += 1;
        }
        if self.head.state == HeadState::Matching && self.head.m.matched != 0 {
            if self.head.m.mismatch {
                return Err(FailoverError::Local(DataError::InvalidArgument(
                    "a half-matched receive with a refused send is not replayed",
                )));
            }
            let sends = (self.head.m.reqs, self.head.m.count);
            done.work_requests +=
                self.replay_slot(nic, self.seq, sends, false, journal, plan, rekey)?;
        }
        if let Some(new_key) = rekey.local {
            // Sends still in flight move again with the keys they have now.
            journal.rekey(new_key);
        }
        Ok(done)
    }

    /// Post receive `seq`'s sends `reqs[..count]` (`sends`) again (their match order, so
    /// matching by tag finds the same buffers): the data writes, and when `ended` the slot end,
    /// under the keys of the lane's new devices. Returns the work requests posted.
    #[allow(clippy::too_many_arguments)]
    fn replay_slot(
        &mut self,
        nic: &mut impl Nic,
        seq: u32,
        (reqs, count): ([u8; MAX_RECVS], u8),
        ended: bool,
        journal: &super::failover::SendJournal,
        plan: &super::failover::SenderPlan,
        rekey: &super::failover::Rekey<'_>,
    ) -> Result<u32, super::failover::FailoverError> {
        use super::failover::FailoverError;
        let local = FailoverError::Local;
        let slot = seq as u8;
        let base = usize::from(slot) * CTS_SLOT_LEN;
        // The receiver rewrites this slot only after this receive completed: the entries this
        // side matched are still there.
        let corrupt = || {
            local(
                ProtocolError::CtsEntry {
                    slot: slot.into(),
                    entry: 0,
                    err: DecodeError::Checksum,
                }
                .into(),
            )
        };
        let first = read_entry(nic, base, slot, 0)
            .map_err(local)?
            .ok_or_else(corrupt)?;
        let n = first.n;
        let mut entries = [first; MAX_RECVS];
        for i in 1..n {
            entries[usize::from(i)] = read_entry(nic, base, slot, i)
                .map_err(local)?
                .ok_or_else(corrupt)?;
        }
        for entry in entries.iter_mut().take(usize::from(n)) {
            entry.rkey = plan.peer_key(entry.rkey)?;
        }
        if ended && count != n {
            // A refused send is not listed: its receive fails anyway, but its record is gone.
            return Err(local(DataError::InvalidArgument(
                "a receive with a refused send is not replayed",
            )));
        }
        let record_addr = self
            .peer_record_addr(usize::from(slot) * RECORD_LEN)
            .map_err(local)?;
        let mut record = SizeRecord {
            n,
            ..SizeRecord::default()
        };
        let mut matched = 0u8;
        let mut posted = 0u32;
        let mut single = None;
        for &req in reqs.iter().take(usize::from(count)) {
            let sent = journal.get(req);
            let pos = (0..n)
                .find(|&i| matched & (1 << i) == 0 && entries[usize::from(i)].tag == sent.tag)
                .ok_or(local(DataError::InvalidArgument(
                    "the send journal does not match the lane's sends",
                )))?;
            matched |= 1 << pos;
            let entry = entries[usize::from(pos)];
            let len = sent.buf.len as u32;
            record.sizes[usize::from(pos)] = len;
            let addr = entry.addr.wrapping_add(sent.offset);
            let data = Payload::Local(Sge {
                addr: sent.buf.addr,
                len,
                lkey: rekey.local_key(sent.buf.lkey)?,
            });
            if n == 1 {
                single = Some((data, addr, entry.rkey, len));
                continue;
            }
            if len > 0 {
                self.replay_post(
                    nic,
                    WrKind::Data,
                    slot,
                    SendOp::Write,
                    data,
                    addr,
                    entry.rkey,
                )?;
                posted += 1;
            }
        }
        if !ended {
            return Ok(posted);
        }
        let imm = |record| {
            Imm {
                seq16: seq as u16,
                n,
                record,
                mismatch: false,
            }
            .encode()
        };
        let (record_bytes, record_len) = record.encode();
        let max_inline = nic.max_inline();
        match single {
            Some((_, _, _, 0)) => {
                let op = SendOp::WriteImm(imm(false));
                let rkey = self.peer_records.rkey;
                self.replay_post(
                    nic,
                    WrKind::SlotEnd,
                    slot,
                    op,
                    Payload::Empty,
                    record_addr,
                    rkey,
                )?;
            }
            Some((data, addr, rkey, len)) if u64::from(len) <= self.ar_threshold => {
                let op = SendOp::WriteImm(imm(false));
                self.replay_post(nic, WrKind::SlotEnd, slot, op, data, addr, rkey)?;
            }
            Some((data, addr, rkey, _)) => {
                // Adaptive routing's split: the data, then the record's write with immediate.
                self.replay_post(nic, WrKind::Data, slot, SendOp::Write, data, addr, rkey)?;
                posted += 1;
                let payload = record_payload(
                    nic,
                    max_inline,
                    usize::from(slot) * RECORD_LEN,
                    &record_bytes[..record_len],
                );
                let (op, rkey) = (SendOp::WriteImm(imm(true)), self.peer_records.rkey);
                self.replay_post(nic, WrKind::SlotEnd, slot, op, payload, record_addr, rkey)?;
            }
            None => {
                let payload = record_payload(
                    nic,
                    max_inline,
                    usize::from(slot) * RECORD_LEN,
                    &record_bytes[..record_len],
                );
                let (op, rkey) = (SendOp::WriteImm(imm(true)), self.peer_records.rkey);
                self.replay_post(nic, WrKind::SlotEnd, slot, op, payload, record_addr, rkey)?;
            }
        }
        posted += 1;
        self.ends[usize::from(slot)] = EndState::Ending {
            post: self.sq.posted() as u32,
            reqs,
            count,
        };
        Ok(posted)
    }

    /// Post one replayed work request on the new queue pair (a slot end is signaled).
    #[allow(clippy::too_many_arguments)]
    fn replay_post(
        &mut self,
        nic: &mut impl Nic,
        kind: WrKind,
        slot: u8,
        op: SendOp,
        payload: Payload<'_>,
        remote_addr: u64,
        rkey: u32,
    ) -> Result<(), super::failover::FailoverError> {
        use super::failover::FailoverError;
        if !self.sq.has_room(1) {
            return Err(FailoverError::Local(DataError::InvalidArgument(
                "the replay does not fit the send queue",
            )));
        }
        let posted = self.sq.next(kind, u16::from(slot), kind == WrKind::SlotEnd);
        let wr = SendWr {
            wr_id: posted.wr_id,
            op,
            payload,
            remote_addr,
            rkey,
            signaled: posted.signaled,
        };
        nic.post_send(&[wr])
            .map_err(|err| FailoverError::Local(err.into()))
    }
}

#[cfg(test)]
mod tests;

/// Whether the entry at `offset` of the inbound FIFO carries `stamp` (read on its own, before the
/// entry's other fields).
fn stamp_fresh(nic: &impl Nic, offset: usize, stamp: u32) -> bool {
    let mut raw = [0u8; 4];
    nic.read_inbound(offset + CTS_ENTRY_LEN - 4, &mut raw);
    raw == stamp.to_le_bytes()
}
