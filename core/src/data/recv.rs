//! The receiving side of one connection.

use super::codec::{
    CTS_ENTRY_LEN, CTS_SLOT_LEN, CtsEntry, Imm, RECORD_LEN, SizeRecord, WrId, WrKind, stamp_for,
};
use super::eager::{
    CREDIT_LEN, CREDIT_OFFSET, EAGER_HEADER_LEN, EAGER_SLOTS, EagerHeader, EagerImm, Offer, Ring,
    SEND_INBOUND_EAGER_LEN, Verdict, ring_offset,
};
use super::error::{DataError, ProtocolError};
use super::pool::{RequestPool, RequestState};
use super::queue::SendQueue;
use super::{
    CQ_DEPTH, Connection, Health, MAX_RECVS, NO_COMPLETION, POLL_BATCH, RecvBuf, RequestId,
    SEND_INBOUND_LEN, SLOTS, Side, SizesOut, check_peer_region, completion_error, region_addr,
};
use crate::nic::{Completion, CompletionKind, Nic, Payload, RemoteRegion, SendOp, SendWr};

/// A receive may leave its CTS entries staged (deferred) while the sender holds at least this
/// many grants (receives whose entries were written and whose data has not arrived here), and only
/// when `test` ran on the connection since the previous receive: a deferred entry waits for a
/// later call, so only a receiver that is being polled, as NCCL's progress thread polls, defers;
/// receives posted back to back are written at once, as NCCL's IB transport writes them. The
/// deferred entries then go together, in one RDMA WRITE, at the first call after arrivals took the
/// grants below this, or when [`CTS_BATCH`] wait. A lone receive is written at once; a receiver
/// that keeps NCCL's 8 receives posted writes one CTS per up to 6 receives instead of one each.
/// On Soft-RoCE every RDMA operation is kernel work, and the clear-to-send writes were half of
/// them; batching them is what cut 8-byte latency against `ib_send_lat` (docs/performance.md).
/// Two grants in hand keep a streaming sender busy while the batch travels.
pub const CTS_LOW_WATER: u32 = 2;
/// Deferred CTS entries that are written at once even while the sender holds enough grants.
pub const CTS_BATCH: u32 = 6;

/// What a receive request of the pool is doing: at most 12 bytes, so posting and completing one
/// writes a few words (a grouped receive's capacities, then sizes, are in
/// [`RecvConn::groups`]). Capacities are `u32`, saturated: a send is at most
/// [`MAX_WR_BYTES`](crate::nic::MAX_WR_BYTES), so a larger buffer behaves as `u32::MAX` would.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RecvState {
    /// Not in use.
    Free,
    /// A one-buffer receive (NCCL's point-to-point) posted: receive and clear-to-send posted,
    /// waiting for the slot's write-with-immediate.
    PostedOne { seq: u32, capacity: u32 },
    /// A receive of `n` buffers posted; their capacities are the slot's group row.
    Posted { seq: u32, n: u8 },
    /// A one-buffer receive's data arrived.
    DoneOne { size: u32 },
    /// Data arrived; the sizes are the slot's group row.
    Done { n: u8 },
    /// The sender refused a send that did not fit (the fields of [`DataError::SizeMismatch`]).
    Refused { index: u8, sent: u32, capacity: u32 },
}

const _: () = assert!(size_of::<RecvState>() <= 16);

impl RequestState for RecvState {
    const FREE: Self = Self::Free;

    #[inline(always)]
    fn is_free(&self) -> bool {
        matches!(self, Self::Free)
    }

    #[inline(always)]
    fn pending(&self) -> bool {
        matches!(self, Self::PostedOne { .. } | Self::Posted { .. })
    }
}

impl RecvState {
    /// What `test` reports for it, `group` being its slot's row (see [`RequestPool::settle`]),
    /// its sizes written to `sizes` when it finished.
    #[inline(always)]
    fn report(
        &self,
        group: &[u32; MAX_RECVS],
        sizes: &mut impl SizesOut,
    ) -> Result<bool, DataError> {
        match *self {
            Self::PostedOne { .. } | Self::Posted { .. } | Self::Free => Ok(false),
            Self::DoneOne { size } => {
                sizes.put(0, size);
                Ok(true)
            }
            Self::Done { n } => {
                for (index, &size) in group.iter().take(usize::from(n)).enumerate() {
                    sizes.put(index, size);
                }
                Ok(true)
            }
            Self::Refused {
                index,
                sent,
                capacity,
            } => Err(DataError::size_mismatch(index, sent, u64::from(capacity))),
        }
    }
}

/// A buffer's capacity as a receive request keeps it (see [`RecvState`]).
#[inline(always)]
fn capacity32(len: u64) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

/// What [`RecvConn::irecv_one`] decided for a one-buffer receive.
#[derive(Debug, PartialEq, Eq)]
#[must_use]
pub enum OneRecv {
    /// The receive is taken: post the empty receive work request `recv`, then the clear-to-send
    /// write that [`RecvConn::one_cts_write`] builds from `cts` (its entry inline, borrowed from the
    /// connection), in that order. A post that fails must be reported with
    /// [`RecvConn::post_failed`]: the connection fails.
    Post {
        /// The request NCCL gets.
        req: RequestId,
        /// The `wr_id` of the empty receive that the sender's write with immediate will consume.
        recv: u64,
        /// The RDMA WRITE of the receive's clear-to-send entry, to build once `recv` is posted.
        cts: CtsWrite,
    },
    /// Not the common case (the slot or the send queue busy, entries deferred, a receiver being
    /// polled that may batch its entries, no inline room): the general [`RecvConn::irecv`]
    /// decides.
    General,
}

/// The clear-to-send write of the receive [`RecvConn::irecv_one`] just took, which
/// [`RecvConn::one_cts_write`] turns into its work request. Built after the empty receive is posted,
/// the write's fields are not held across that call (a driver keeps them in registers only so
/// long). Neither copied nor made outside the core: one write per receive taken.
#[derive(Debug, PartialEq, Eq)]
#[must_use]
pub struct CtsWrite {
    slot: u8,
}

/// The receiving side of one connection: posts receives and clear-to-send entries, and turns
/// write-with-immediate completions into finished receives.
#[derive(Debug)]
pub struct RecvConn {
    /// The sender's CTS FIFO.
    peer_fifo: RemoteRegion,
    sq: SendQueue,
    /// The receives in order and their work requests: what a data completion is checked against
    /// and changes (one pointer for the completion fast path, [`arrived_one`]).
    ledger: Ledger,
    /// Per slot, a grouped receive's capacities while it is posted, then the sizes that arrived
    /// (a one-buffer receive keeps its one number in its state). Unused entries are zero.
    groups: [[u32; MAX_RECVS]; SLOTS],
    /// Whether `test` ran since the last `irecv`: only a receiver that is being polled may defer
    /// (receives posted back to back are all written at once, as NCCL's IB transport writes them).
    polled: bool,
    health: Health,
    /// Poll buffer, kept here so polling does not initialise one per call.
    batch: [Completion; POLL_BATCH],
    /// The clear-to-send entry [`irecv_one`](Self::irecv_one) hands out inline, kept here so the
    /// work request it returns can borrow it until the driver posts.
    cts_out: [u8; CTS_ENTRY_LEN],
    /// Receive work requests posted since the start: the next one's position, its `wr_id`.
    rq_posted: u32,
    /// The eager path's receiving half ([`super::eager`]); `None` unless the driver turned it on
    /// and the sender reads what it writes back.
    eager: Option<EagerRx>,
    /// Per FIFO slot, the one-buffer receive's buffer address, tag and memory (for the eager path;
    /// written by every one-buffer receive, eager or not: a branch would cost more).
    targets: [Target; SLOTS],
    /// Eager messages wait in the ring for receives not posted yet (`irecv` takes them).
    holding: bool,
    /// `eager` is on (kept apart: the entries' flag reads it on every receive).
    eager_on: bool,
    /// A credit word is due but found the send queue full: `test` writes it.
    credits_owed: bool,
}

/// [`RecvConn`]'s receives in order and the count of their work requests.
#[derive(Debug)]
struct Ledger {
    /// Sequence number the next receive gets.
    next_seq: u32,
    /// Oldest receive whose write-with-immediate has not arrived.
    oldest: u32,
    /// A receive request is named by its FIFO slot.
    requests: RequestPool<RecvState, false>,
    /// Receive work requests posted and not completed.
    recvs_posted: usize,
    /// The newest receives whose CTS entries are staged but not yet written to the sender
    /// (always the last `deferred` receives posted; see [`CTS_LOW_WATER`]).
    deferred: u32,
    /// Receive work requests consumed (in posting order: the queue is first in, first out).
    rq_consumed: u32,
}

/// What the receiver keeps for the eager path.
#[derive(Debug)]
struct EagerRx {
    ring: Ring,
    /// Per ring slot, the message held there (valid from arrival to taken or bounced).
    held: [Held; EAGER_SLOTS],
    /// The credit count inline, kept here so its work request can borrow it until posted.
    credit_out: [u8; CREDIT_LEN],
}

#[derive(Clone, Copy, Debug, Default)]
struct Held {
    header: EagerHeader,
    epoch: bool,
}

#[derive(Clone, Copy, Debug, Default)]
struct Target {
    addr: u64,
    tag: u32,
    host: bool,
}

impl RecvConn {
    /// A receiver writing clear-to-send entries into `peer_fifo` (the sender's inbound region,
    /// from the handshake). A region shorter than [`SEND_INBOUND_LEN`] fails the connection.
    pub fn new(peer_fifo: RemoteRegion) -> Self {
        let health = match check_peer_region(peer_fifo, SEND_INBOUND_LEN) {
            Ok(_) => Health::Active,
            Err(err) => Health::Failed(err),
        };
        Self {
            peer_fifo,
            sq: SendQueue::default(),
            ledger: Ledger {
                next_seq: 0,
                oldest: 0,
                requests: RequestPool::new(Side::Recv),
                recvs_posted: 0,
                deferred: 0,
                rq_consumed: 0,
            },
            groups: [[0; MAX_RECVS]; SLOTS],
            polled: false,
            health,
            batch: [NO_COMPLETION; POLL_BATCH],
            cts_out: [0; CTS_ENTRY_LEN],
            rq_posted: 0,
            eager: None,
            targets: [Target::default(); SLOTS],
            holding: false,
            eager_on: false,
            credits_owed: false,
        }
    }

    /// Take eager messages (wire version 4): the driver's inbound region holds the ring
    /// ([`RECV_INBOUND_EAGER_LEN`](super::eager::RECV_INBOUND_EAGER_LEN) bytes, announced to the
    /// sender) and its staging region the credit word
    /// ([`RECV_STAGING_EAGER_LEN`](super::eager::RECV_STAGING_EAGER_LEN)). Nothing changes when
    /// the sender did not announce its credit word (an older sender never writes eager
    /// messages). Posts the receive work requests the ring needs; call it before the first
    /// `irecv`, once the queue pair can take receives. Whether it is on.
    pub fn enable_eager(&mut self, nic: &mut impl Nic) -> Result<bool, DataError> {
        self.health.check()?;
        if self.eager.is_some() || (self.peer_fifo.len as usize) < SEND_INBOUND_EAGER_LEN {
            return Ok(self.eager.is_some());
        }
        for _ in 0..EAGER_SLOTS {
            self.post_stock(nic)?;
        }
        self.eager = Some(EagerRx {
            ring: Ring::default(),
            held: [Held::default(); EAGER_SLOTS],
            credit_out: [0; CREDIT_LEN],
        });
        self.eager_on = true;
        Ok(true)
    }

    /// Whether eager messages are taken.
    pub fn eager_enabled(&self) -> bool {
        self.eager.is_some()
    }

    /// Eager messages that arrived (taken or bounced or held) since the start.
    pub fn eager_arrivals(&self) -> u64 {
        self.eager.as_ref().map_or(0, |e| e.ring.arrived())
    }

    /// Post one receive work request that no receive owns (for an eager message).
    fn post_stock(&mut self, nic: &mut impl Nic) -> Result<(), DataError> {
        let wr_id = self.next_recv_id();
        nic.post_recv(wr_id)
            .map_err(|err| self.health.fail(err.into()))?;
        self.ledger.recvs_posted += 1;
        Ok(())
    }

    /// The `wr_id` of the next receive work request, its position taken.
    #[inline(always)]
    fn next_recv_id(&mut self) -> u64 {
        let pos = self.rq_posted;
        self.rq_posted = pos.wrapping_add(1);
        WrId {
            kind: WrKind::Recv,
            index: u16::from(pos as u8),
            seq: pos,
        }
        .encode()
    }

    /// A one-buffer receive (NCCL's point-to-point) of `buf` tagged `tag`, decided without the
    /// NIC: the common case — slot and send queue free, nothing deferred, the entry due at once and
    /// fitting `max_inline` (the driver's inline limit) — is taken here and returned as the two
    /// work requests to post; every other case is left to [`irecv`](Self::irecv)
    /// ([`OneRecv::General`]), which polls, defers or stages as it must.
    #[inline(always)]
    pub fn irecv_one(
        &mut self,
        buf: RecvBuf,
        tag: u32,
        max_inline: usize,
    ) -> Result<OneRecv, DataError> {
        self.health.check()?;
        if buf.addr.checked_add(buf.len).is_none() {
            return Err(DataError::InvalidArgument(
                "receive buffer wraps the address space",
            ));
        }
        let seq = self.ledger.next_seq;
        let slot = seq as u8;
        // As `post_receive`'s inline case: nothing deferred, and the entry due now (a receiver
        // not being polled writes at once; one being polled when the sender holds fewer than
        // `CTS_LOW_WATER` grants).
        let due = !self.polled || seq.wrapping_sub(self.ledger.oldest) < CTS_LOW_WATER;
        if !self.ledger.requests.is_free(slot)
            || !self.sq.has_room_beside(2, self.ledger.recvs_posted + 1)
            || self.ledger.deferred != 0
            || !due
            || CTS_ENTRY_LEN > max_inline
        {
            return Ok(OneRecv::General);
        }
        // Inside the sender's FIFO by construction: `new` checked that the region holds
        // `SEND_INBOUND_LEN` bytes without wrapping (else the health check above failed), and a
        // slot's first entry ends below that.
        const _: () = assert!((SLOTS - 1) * CTS_SLOT_LEN + CTS_ENTRY_LEN <= SEND_INBOUND_LEN);
        if self.holding {
            // Messages wait for this receive: the general path takes them.
            return Ok(OneRecv::General);
        }
        self.polled = false;
        let eager_ok = self.note_target(slot, buf, tag);
        self.cts_out = CtsEntry {
            addr: buf.addr,
            size: buf.len,
            rkey: buf.rkey,
            tag,
            n: 1,
            index: 0,
            eager_ok,
            stamp: stamp_for(seq),
        }
        .encode();
        let recv = self.next_recv_id();
        self.ledger.recvs_posted += 1;
        let req = self.ledger.requests.occupy(
            slot,
            RecvState::PostedOne {
                seq,
                capacity: capacity32(buf.len),
            },
        );
        self.ledger.next_seq = seq.wrapping_add(1);
        Ok(OneRecv::Post {
            req,
            recv,
            cts: CtsWrite { slot },
        })
    }

    /// The clear-to-send write of the receive [`irecv_one`](Self::irecv_one) took (`cts`, from
    /// its [`OneRecv::Post`]): takes its send-queue position (room was checked there).
    #[inline(always)]
    pub fn one_cts_write(&mut self, cts: CtsWrite) -> SendWr<'_> {
        let slot = cts.slot;
        let remote_addr = self.peer_fifo.addr + (usize::from(slot) * CTS_SLOT_LEN) as u64;
        let posted = self.sq.next(WrKind::Cts, u16::from(slot), false);
        fifo_write(
            &self.peer_fifo,
            posted,
            Payload::Inline(&self.cts_out),
            remote_addr,
        )
    }

    /// The driver could not post what [`irecv_one`](Self::irecv_one) returned for `req`: the
    /// connection fails with `err`, and the request, never handed out, is freed.
    #[cold]
    pub fn post_failed(&mut self, req: RequestId, err: crate::nic::NicError) -> DataError {
        if let Ok(index) = self.ledger.requests.lookup(req) {
            self.ledger.requests.release(index);
        }
        self.health.fail(err.into())
    }

    /// Post a receive of `bufs.len()` (1..=8) buffers, `tags[i]` choosing the send for `bufs[i]`.
    ///
    /// `Ok(None)` means "try later": the next slot is still in use or the send queue is full.
    pub fn irecv(
        &mut self,
        nic: &mut impl Nic,
        bufs: &[RecvBuf],
        tags: &[u32],
    ) -> Result<Option<RequestId>, DataError> {
        self.health.check()?;
        let n = bufs.len();
        if n == 0 || n > MAX_RECVS {
            return Err(DataError::InvalidArgument("a receive takes 1 to 8 buffers"));
        }
        if tags.len() != n {
            return Err(DataError::InvalidArgument("one tag per receive buffer"));
        }
        for b in bufs {
            if b.addr.checked_add(b.len).is_none() {
                return Err(DataError::InvalidArgument(
                    "receive buffer wraps the address space",
                ));
            }
        }
        let seq = self.ledger.next_seq;
        let slot = seq as u8;
        if !self.ledger.requests.is_free(slot) {
            return Ok(None);
        }
        // Room for the receive and for a flush of every deferred entry (two writes at the wrap).
        if !self.sq.has_room_beside(2, self.ledger.recvs_posted + 1) {
            self.poll_cq(nic)?;
            if !self.sq.has_room_beside(2, self.ledger.recvs_posted + 1) {
                return Ok(None);
            }
        }
        let stamp = stamp_for(seq);
        // Inlined into both uses below (as a closure it stayed out of line).
        #[inline(always)]
        fn entry(bufs: &[RecvBuf], tags: &[u32], i: usize, stamp: u32) -> CtsEntry {
            CtsEntry {
                addr: bufs[i].addr,
                size: bufs[i].len,
                rkey: bufs[i].rkey,
                tag: tags[i],
                n: bufs.len() as u8,
                index: i as u8,
                eager_ok: false,
                stamp,
            }
        }
        if n == 1 {
            // One buffer (NCCL's point-to-point): its entry alone, not a whole slot's bytes.
            let eager_ok = self.note_target(slot, bufs[0], tags[0]);
            let bytes = CtsEntry {
                eager_ok,
                ..entry(bufs, tags, 0, stamp)
            }
            .encode();
            let state = RecvState::PostedOne {
                seq,
                capacity: capacity32(bufs[0].len),
            };
            return self.post_receive(nic, seq, state, &bytes).map(Some);
        }
        let mut capacity = [0u32; MAX_RECVS];
        let mut bytes = [0u8; CTS_SLOT_LEN];
        for (i, out) in bytes.chunks_exact_mut(CTS_ENTRY_LEN).take(n).enumerate() {
            capacity[i] = capacity32(bufs[i].len);
            out.copy_from_slice(&entry(bufs, tags, i, stamp).encode());
        }
        self.groups[usize::from(slot)] = capacity;
        let state = RecvState::Posted { seq, n: n as u8 };
        self.post_receive(nic, seq, state, &bytes[..n * CTS_ENTRY_LEN])
            .map(Some)
    }

    /// Post receive `seq` (its slot free, room checked) in `state`, whose encoded CTS entries
    /// are `bytes`: the receive work request, the request, and the entries,
    /// written at once (inline when they are the only deferred ones and fit), staged, or left
    /// deferred (see [`CTS_LOW_WATER`]).
    #[inline(always)]
    fn post_receive(
        &mut self,
        nic: &mut impl Nic,
        seq: u32,
        state: RecvState,
        bytes: &[u8],
    ) -> Result<RequestId, DataError> {
        let slot = seq as u8;
        let offset = usize::from(slot) * CTS_SLOT_LEN;
        let recv_id = self.next_recv_id();
        if let Err(err) = nic.post_recv(recv_id) {
            return Err(self.health.fail(err.into()));
        }
        self.ledger.recvs_posted += 1;

        let id = self.ledger.requests.occupy(slot, state);
        self.ledger.next_seq = seq.wrapping_add(1);
        let may_defer = core::mem::replace(&mut self.polled, false);
        // Its message may be waiting in the ring: taken now, the receive needs no entries at all.
        if self.holding && self.take_held(nic, Some(seq))? {
            return Ok(id);
        }
        // Nothing else deferred, and this receive's entries due at once (`flush_due` with this
        // one deferred: the sender holds the `seq - oldest` older grants) and fitting inline:
        // one RDMA WRITE of them, nothing staged, nothing deferred. The room for it was checked
        // with the receive's.
        if self.ledger.deferred == 0
            && (!may_defer || seq.wrapping_sub(self.ledger.oldest) < CTS_LOW_WATER)
            && bytes.len() <= nic.max_inline()
        {
            let written = self.write_cts_inline(nic, slot, bytes);
            if written.is_err() {
                // Not written: it is deferred, so it is staged after all.
                self.ledger.deferred = 1;
                nic.write_staging(offset, bytes);
            }
            written?;
        } else {
            self.ledger.deferred += 1;
            let flush_now = !may_defer || self.flush_due();
            // Staged: a later flush may carry it with its neighbours.
            nic.write_staging(offset, bytes);
            if flush_now {
                self.flush_cts(nic)?;
            }
        }
        if self.holding {
            self.take_held(nic, None)?;
        }
        Ok(id)
    }

    /// Remember a one-buffer receive's buffer for the eager path; whether its entry offers eager
    /// (host memory, and a sender that reads the flag).
    #[inline(always)]
    fn note_target(&mut self, slot: u8, buf: RecvBuf, tag: u32) -> bool {
        self.targets[usize::from(slot)] = Target {
            addr: buf.addr,
            tag,
            host: buf.host,
        };
        buf.host & self.eager_on
    }

    /// Take or bounce the held eager messages in their order, as far as their receives are
    /// posted ([`super::eager`]), then return credits when due. `fresh`: a receive just posted
    /// whose entries are not written (nor deferred); whether it was taken (it then needs none).
    fn take_held(&mut self, nic: &mut impl Nic, fresh: Option<u32>) -> Result<bool, DataError> {
        let mut fresh_taken = false;
        loop {
            let Some(e) = &self.eager else {
                return Ok(false);
            };
            let Some(ring_slot) = e.ring.oldest_held() else {
                break;
            };
            let Held { header, epoch } = e.held[ring_slot];
            let bouncing = e.ring.bouncing(epoch);
            if !bouncing && header.seq != self.ledger.oldest {
                return Err(self.health.fail(
                    ProtocolError::Sequence {
                        expected: self.ledger.oldest as u16,
                        got: header.seq as u16,
                    }
                    .into(),
                ));
            }
            let slot = header.seq as u8;
            let posted = !bouncing && header.seq != self.ledger.next_seq;
            let offer = posted.then(|| self.offer(slot));
            let unwritten = fresh == Some(header.seq);
            let size = u64::from(header.size);
            if !unwritten
                && self.ledger.deferred > 0
                && offer.is_some_and(|o| super::eager::accepts(o, header.tag, size))
            {
                // The receive's entries must reach the sender (it confirms the message by them)
                // before the receive completes: write what is deferred first.
                self.flush_cts(nic)?;
                if self.ledger.deferred > 0 {
                    // No room in the send queue yet: a later call takes it.
                    break;
                }
            }
            let Some(e) = &mut self.eager else {
                return Ok(false);
            };
            match e.ring.judge(epoch, header.tag, size, offer) {
                Verdict::Hold => break,
                Verdict::Accept => {
                    let target = self.targets[usize::from(slot)];
                    nic.deliver_inbound(
                        ring_offset(ring_slot) + EAGER_HEADER_LEN,
                        header.size as usize,
                        target.addr,
                    );
                    e.ring.free_oldest(unwritten);
                    fresh_taken |= unwritten;
                    *self.ledger.requests.state_mut(usize::from(slot)) =
                        RecvState::DoneOne { size: header.size };
                    self.ledger.oldest = self.ledger.oldest.wrapping_add(1);
                }
                Verdict::Bounce => {
                    e.ring.free_oldest(false);
                    // The message consumed a receive work request its receive's data needs.
                    self.post_stock(nic)?;
                }
            }
        }
        self.holding = self
            .eager
            .as_ref()
            .is_some_and(|e| e.ring.oldest_held().is_some());
        self.return_credits(nic)?;
        Ok(fresh_taken)
    }

    /// What the receive in FIFO slot `slot` (posted) offers an eager message.
    fn offer(&self, slot: u8) -> Offer {
        match *self.ledger.requests.state(usize::from(slot)) {
            RecvState::PostedOne { capacity, .. } => {
                let target = self.targets[usize::from(slot)];
                Offer {
                    n: 1,
                    eager_ok: target.host,
                    tag: target.tag,
                    capacity: u64::from(capacity),
                }
            }
            RecvState::Posted { n, .. } => Offer {
                n,
                eager_ok: false,
                tag: 0,
                capacity: 0,
            },
            _ => Offer {
                n: 0,
                eager_ok: false,
                tag: 0,
                capacity: 0,
            },
        }
    }

    /// Write the credit word into the sender's region when one is due and the send queue has room
    /// (else a later call does).
    fn return_credits(&mut self, nic: &mut impl Nic) -> Result<(), DataError> {
        let Some(e) = &mut self.eager else {
            return Ok(());
        };
        let Some(word) = e.ring.credits_due() else {
            self.credits_owed = false;
            return Ok(());
        };
        if !self.sq.has_room_beside(1, self.ledger.recvs_posted) {
            // `test` tries again once completions made room.
            self.credits_owed = true;
            return Ok(());
        }
        self.credits_owed = false;
        let remote_addr = self.peer_fifo.addr + CREDIT_OFFSET as u64;
        e.credit_out = word.encode();
        let posted = self.sq.next(WrKind::Credit, 0, false);
        let payload = if nic.max_inline() >= CREDIT_LEN {
            Payload::Inline(&e.credit_out)
        } else {
            nic.write_staging(super::RECV_STAGING_LEN, &e.credit_out);
            Payload::Staged {
                offset: super::RECV_STAGING_LEN as u32,
                len: CREDIT_LEN as u32,
            }
        };
        let write = fifo_write(&self.peer_fifo, posted, payload, remote_addr);
        if let Err(err) = nic.post_send(&[write]) {
            return Err(self.health.fail(err.into()));
        }
        e.ring.credits_returned();
        Ok(())
    }

    /// Write the entries of receive `slot`, the only one to announce (none deferred), inline
    /// (`bytes`, at most `max_inline`) with one RDMA WRITE, taking its send-queue position. The
    /// caller checked the send queue's room.
    #[inline(always)]
    fn write_cts_inline(
        &mut self,
        nic: &mut impl Nic,
        slot: u8,
        bytes: &[u8],
    ) -> Result<(), DataError> {
        let offset = usize::from(slot) * CTS_SLOT_LEN;
        let remote_addr =
            region_addr(&self.peer_fifo, offset, bytes.len()).ok_or(DataError::PeerRegion {
                len: self.peer_fifo.len,
                need: SEND_INBOUND_LEN,
            })?;
        let posted = self.sq.next(WrKind::Cts, u16::from(slot), false);
        let write = fifo_write(&self.peer_fifo, posted, Payload::Inline(bytes), remote_addr);
        if let Err(err) = nic.post_send(&[write]) {
            return Err(self.health.fail(err.into()));
        }
        Ok(())
    }

    /// The cause the connection failed with, if it did.
    pub fn failure(&self) -> Option<&DataError> {
        self.health.failure()
    }

    /// Receives posted whose CTS entries have not been written to the sender yet: always the
    /// newest ones (see [`CTS_LOW_WATER`]).
    pub fn unannounced(&self) -> usize {
        self.ledger.deferred as usize
    }

    /// Receives whose CTS entries the sender has (or will have, the write being under way) and
    /// whose data has not arrived.
    fn granted(&self) -> u32 {
        self.ledger.next_seq.wrapping_sub(self.ledger.oldest) - self.ledger.deferred
    }

    /// Whether the deferred CTS entries must go now: the sender holds fewer than
    /// [`CTS_LOW_WATER`] grants, or [`CTS_BATCH`] entries are waiting.
    fn flush_due(&self) -> bool {
        self.ledger.deferred > 0
            && (self.granted() < CTS_LOW_WATER || self.ledger.deferred >= CTS_BATCH)
    }

    /// Write every deferred CTS entry to the sender: the slots are consecutive, so one RDMA
    /// WRITE from staging covers them (two when they wrap past the last slot). When the send
    /// queue has no room the entries stay deferred and the next call tries again.
    fn flush_cts(&mut self, nic: &mut impl Nic) -> Result<(), DataError> {
        if !self.sq.has_room_beside(2, self.ledger.recvs_posted) {
            self.poll_cq(nic)?;
            if !self.sq.has_room_beside(2, self.ledger.recvs_posted) {
                return Ok(());
            }
        }
        let first = self.ledger.next_seq.wrapping_sub(self.ledger.deferred);
        let first_slot = usize::from(first as u8);
        let count = self.ledger.deferred as usize;
        if count == 0 {
            return Ok(());
        }
        // The deferred slots up to the end of the FIFO, then (wrapping) the rest from slot 0.
        let head = count.min(SLOTS - first_slot);
        let posted = if head == count {
            // One write (the common case: no chain array to fill).
            let write = self.cts_write(first_slot, count)?;
            nic.post_send(&[write])
        } else {
            let first = self.cts_write(first_slot, head)?;
            let rest = self.cts_write(0, count - head)?;
            nic.post_send(&[first, rest])
        };
        if let Err(err) = posted {
            return Err(self.health.fail(err.into()));
        }
        self.ledger.deferred = 0;
        Ok(())
    }

    /// The RDMA WRITE of the staged CTS entries of the `slots` (at least one) consecutive FIFO
    /// slots from `start`, taking its send-queue position.
    #[inline(always)]
    fn cts_write(&mut self, start: usize, slots: usize) -> Result<SendWr<'static>, DataError> {
        let last = (start + slots).saturating_sub(1);
        let n = match *self.ledger.requests.state(last) {
            RecvState::PostedOne { .. } => 1,
            RecvState::Posted { n, .. } => n,
            _ => {
                return Err(self
                    .health
                    .fail(ProtocolError::UnexpectedCompletion { wr: WrKind::Cts }.into()));
            }
        };
        let offset = start * CTS_SLOT_LEN;
        let len = (slots - 1) * CTS_SLOT_LEN + usize::from(n) * CTS_ENTRY_LEN;
        let remote_addr =
            region_addr(&self.peer_fifo, offset, len).ok_or(DataError::PeerRegion {
                len: self.peer_fifo.len,
                need: SEND_INBOUND_LEN,
            })?;
        let payload = Payload::Staged {
            offset: offset as u32,
            len: len as u32,
        };
        let posted = self.sq.next(WrKind::Cts, last as u16, false);
        Ok(fifo_write(&self.peer_fifo, posted, payload, remote_addr))
    }

    /// Process every completion the queue holds (bounded by its depth).
    #[inline(never)]
    fn poll_cq(&mut self, nic: &mut impl Nic) -> Result<(), DataError> {
        self.poll_cq_inline(nic)
    }

    /// [`poll_cq`](Self::poll_cq), inlined into `test`, which polls on every call. The common
    /// completion ([`arrived_one`]) is taken as the NIC hands it over where the backend offers
    /// it; the rest come back in the poll buffer, in order, and are taken there or go the long
    /// way.
    #[inline(always)]
    fn poll_cq_inline(&mut self, nic: &mut impl Nic) -> Result<(), DataError> {
        for _ in 0..CQ_DEPTH / POLL_BATCH + 1 {
            let Self { batch, ledger, .. } = self;
            let (got, left) = nic
                .poll_take_expect_one(
                    batch,
                    #[inline(always)]
                    |c| arrived_one(c, ledger),
                )
                .map_err(|e| self.health.fail(e.into()))?;
            for i in 0..left.min(POLL_BATCH) {
                let c = self.batch[i];
                if !arrived_one(&c, &mut self.ledger) {
                    self.handle_completion(nic, &c)
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
    fn handle_completion(&mut self, nic: &mut impl Nic, c: &Completion) -> Result<(), DataError> {
        if !c.status.is_success() {
            return Err(completion_error(c));
        }
        let id = WrId::decode(c.wr_id).map_err(|err| ProtocolError::WrId {
            wr_id: c.wr_id,
            err,
        })?;
        match (c.kind, id.kind) {
            (CompletionKind::Send, WrKind::Cts | WrKind::Credit) => {
                self.sq.complete(id.seq, id.kind)?;
                Ok(())
            }
            (CompletionKind::RecvWriteImm { imm, byte_len }, WrKind::Recv) => {
                if id.seq != self.ledger.rq_consumed
                    || id.index != u16::from(self.ledger.rq_consumed as u8)
                {
                    return Err(ProtocolError::UnexpectedCompletion { wr: WrKind::Recv }.into());
                }
                match EagerImm::decode(imm) {
                    Some(eager) => {
                        let eager = eager.map_err(|err| ProtocolError::Immediate { imm, err })?;
                        self.handle_eager_arrival(nic, eager, byte_len)
                    }
                    None => self.handle_arrival(nic, imm, byte_len),
                }
            }
            (_, kind) => Err(ProtocolError::UnexpectedCompletion { wr: kind }.into()),
        }
    }

    /// An eager message arrived (its receive work request checked): hold it in its ring slot,
    /// then take or bounce what can be.
    fn handle_eager_arrival(
        &mut self,
        nic: &mut impl Nic,
        imm: EagerImm,
        byte_len: u32,
    ) -> Result<(), DataError> {
        let Some(e) = &mut self.eager else {
            // No ring was announced to this sender.
            return Err(ProtocolError::UnexpectedCompletion { wr: WrKind::Eager }.into());
        };
        let Some(ring_slot) = e.ring.arrive() else {
            return Err(ProtocolError::RingOverrun.into());
        };
        let mut raw = [0u8; EAGER_HEADER_LEN];
        nic.read_inbound(ring_offset(ring_slot), &mut raw);
        let header = EagerHeader::decode(&raw, byte_len).map_err(ProtocolError::EagerHeader)?;
        if header.seq as u16 != imm.seq16 {
            return Err(ProtocolError::Sequence {
                expected: header.seq as u16,
                got: imm.seq16,
            }
            .into());
        }
        e.held[ring_slot] = Held {
            header,
            epoch: imm.epoch,
        };
        self.ledger.rq_consumed = self.ledger.rq_consumed.wrapping_add(1);
        self.ledger.recvs_posted -= 1;
        self.take_held(nic, None).map(drop)
    }

    /// The write-with-immediate of the oldest outstanding receive arrived (its receive work
    /// request checked).
    fn handle_arrival(&mut self, nic: &impl Nic, imm: u32, byte_len: u32) -> Result<(), DataError> {
        let seq = self.ledger.oldest;
        let slot = seq as u8;
        let (posted_seq, n, one_capacity) = match *self.ledger.requests.state(usize::from(slot)) {
            RecvState::PostedOne { seq, capacity } => (seq, 1, capacity),
            RecvState::Posted { seq, n } => (seq, n, 0),
            _ => return Err(ProtocolError::UnexpectedCompletion { wr: WrKind::Recv }.into()),
        };
        // `granted() == 0`: the oldest receive's CTS entry was never written, so no data for it
        // can be on its way.
        if seq == self.ledger.next_seq || self.granted() == 0 || posted_seq != seq {
            return Err(ProtocolError::UnexpectedCompletion { wr: WrKind::Recv }.into());
        }
        let imm = Imm::decode(imm).map_err(|err| ProtocolError::Immediate { imm, err })?;
        if imm.seq16 != seq as u16 {
            return Err(ProtocolError::Sequence {
                expected: seq as u16,
                got: imm.seq16,
            }
            .into());
        }
        if imm.n != n {
            return Err(ProtocolError::GroupSize {
                expected: n,
                got: imm.n,
            }
            .into());
        }
        let state = if imm.record {
            let len = 4 * usize::from(n);
            if byte_len as usize != len {
                return Err(ProtocolError::Record(super::codec::DecodeError::Truncated).into());
            }
            let mut raw = [0u8; RECORD_LEN];
            nic.read_inbound(usize::from(slot) * RECORD_LEN, &mut raw[..len]);
            let record = SizeRecord::decode(&raw[..len], n).map_err(ProtocolError::Record)?;
            let mut capacity = self.groups[usize::from(slot)];
            if n == 1 {
                capacity[0] = one_capacity;
            }
            let sizes = record.sizes;
            let oversize = (0..usize::from(n)).find(|&i| sizes[i] > capacity[i]);
            match (imm.mismatch, oversize) {
                (true, Some(index)) => RecvState::Refused {
                    index: index as u8,
                    sent: sizes[index],
                    capacity: capacity[index],
                },
                (true, None) => return Err(ProtocolError::BogusMismatch.into()),
                (false, Some(index)) => {
                    return Err(ProtocolError::Overflow {
                        index,
                        size: u64::from(sizes[index]),
                        capacity: u64::from(capacity[index]),
                    }
                    .into());
                }
                (false, None) => {
                    self.groups[usize::from(slot)] = sizes;
                    RecvState::Done { n }
                }
            }
        } else {
            // Without a record the group has one buffer (`Imm::decode` checked).
            if byte_len > one_capacity {
                return Err(ProtocolError::Overflow {
                    index: 0,
                    size: u64::from(byte_len),
                    capacity: u64::from(one_capacity),
                }
                .into());
            }
            RecvState::DoneOne { size: byte_len }
        };
        *self.ledger.requests.state_mut(usize::from(slot)) = state;
        self.ledger.oldest = seq.wrapping_add(1);
        self.ledger.rq_consumed = self.ledger.rq_consumed.wrapping_add(1);
        self.ledger.recvs_posted -= 1;
        Ok(())
    }
}

/// An RDMA WRITE of `payload` to `remote_addr` in the sender's region `peer_fifo` (entries or the
/// credit word), at the send-queue position `posted`.
#[inline(always)]
fn fifo_write<'a>(
    peer_fifo: &RemoteRegion,
    posted: super::queue::Slotted,
    payload: Payload<'a>,
    remote_addr: u64,
) -> SendWr<'a> {
    SendWr {
        wr_id: posted.wr_id,
        op: SendOp::Write,
        payload,
        remote_addr,
        rkey: peer_fifo.rkey,
        signaled: posted.signaled,
    }
}

/// Take completion `c` if it is the common one, without decoding: the write-with-immediate,
/// without a record, of the oldest receive (`oldest`), a one-buffer one whose CTS entry was
/// written, fitting its buffer. Every check of [`RecvConn::handle_completion`] and
/// [`RecvConn::handle_arrival`] holds for it: the `wr_id` and the immediate are compared whole
/// with the only values those accept (so their decoders' checks are in the compares). Anything
/// else (`false`, nothing changed) goes the long way, which names the violation. The receiver's
/// fields come one by one: the poll buffer, borrowed apart, is not among them.
#[inline(always)]
fn arrived_one(c: &Completion, ledger: &mut Ledger) -> bool {
    let Ledger {
        next_seq,
        oldest,
        requests,
        recvs_posted,
        deferred,
        rq_consumed,
    } = ledger;
    let Completion {
        wr_id: got_wr_id,
        status,
        kind: CompletionKind::RecvWriteImm { imm, byte_len },
        ..
    } = *c
    else {
        return false;
    };
    let seq = *oldest;
    let slot = seq as u8;
    let RecvState::PostedOne {
        seq: posted_seq,
        capacity,
    } = *requests.state(usize::from(slot))
    else {
        return false;
    };
    let wr_id = WrId {
        kind: WrKind::Recv,
        index: u16::from(*rq_consumed as u8),
        seq: *rq_consumed,
    }
    .encode();
    let expected_imm = Imm {
        seq16: seq as u16,
        n: 1,
        record: false,
        mismatch: false,
    }
    .encode();
    // `next_seq - oldest > deferred`: the receive is outstanding and granted (see
    // `handle_arrival`).
    if !status.is_success()
        || got_wr_id != wr_id
        || imm != expected_imm
        || posted_seq != seq
        || byte_len > capacity
        || next_seq.wrapping_sub(seq) <= *deferred
    {
        return false;
    }
    *requests.state_mut(usize::from(slot)) = RecvState::DoneOne { size: byte_len };
    *oldest = seq.wrapping_add(1);
    *rq_consumed = rq_consumed.wrapping_add(1);
    *recvs_posted -= 1;
    true
}

impl Connection for RecvConn {
    /// Poll the completion queue, then report on `req`. Finishing and errors free the request.
    #[inline(always)]
    fn test_into(
        &mut self,
        nic: &mut impl Nic,
        req: RequestId,
        sizes: &mut impl SizesOut,
    ) -> Result<bool, DataError> {
        let index = self.ledger.requests.lookup(req)?;
        self.polled = true;
        let mut progress = Ok(());
        if self.flush_due() && self.health.check().is_ok() {
            progress = self.flush_cts(nic);
        }
        if self.credits_owed && progress.is_ok() && self.health.check().is_ok() {
            progress = self.return_credits(nic);
        }
        if progress.is_ok() && self.ledger.requests.state(index).pending() {
            progress = self.health.check().and_then(|()| self.poll_cq_inline(nic));
        }
        let Self { ledger, groups, .. } = self;
        ledger.requests.settle(
            index,
            progress,
            #[inline(always)]
            |state| state.report(&groups[index], sizes),
        )
    }

    /// Fail the connection with `err` (an asynchronous fatal event, or the peer died), unless it
    /// failed already.
    fn handle_fatal(&mut self, err: DataError) {
        self.health.fail(err);
    }

    /// Before closing: poll the completion queue, then say how many receives the sender may
    /// still write into: those it was told about (their clear-to-send entries written) whose data
    /// has not arrived. `Ok(0)` means drained. Receives whose entries are still deferred are never
    /// announced now, so the sender never learns of them. An error when the connection failed:
    /// nothing more will arrive.
    ///
    /// The driver calls it until it says 0, the connection fails, the peer is gone, or a
    /// deadline passes, and only then destroys the queue pair. Destroying it earlier cuts off
    /// clear-to-send writes still queued and the sender's writes for receives it was granted:
    /// its sends would then fail (or wait for a grant that never comes) although the receiver
    /// posted their receives.
    fn drain(&mut self, nic: &mut impl Nic) -> Result<usize, DataError> {
        self.health.check()?;
        self.poll_cq(nic)?;
        Ok(self.granted() as usize)
    }

    /// Requests handed out and not yet freed by `test`.
    fn outstanding(&self) -> usize {
        self.ledger.requests.outstanding()
    }
}

/// Port failover ([`super::failover`]): quiesce, snapshot and replay a lane. Off the hot path:
/// nothing here runs unless a lane failed.
impl RecvConn {
    /// Quiesce this lane after the driver moved its queue pair to the error state: post the
    /// marker send and receive once, then take what the completion queue holds (arrivals before
    /// the failure as usual; the failure and the flushes behind it go to the tripwire).
    /// `Ok(true)` once both markers' flushes are seen: nothing of the old queue pair is left and
    /// nothing more can land through it, so [`failover_snapshot`](Self::failover_snapshot) is
    /// final.
    pub fn failover_quiesce<N: Nic>(
        &mut self,
        nic: &mut super::failover::Guarded<N>,
    ) -> Result<bool, super::failover::FailoverError> {
        use super::failover::{FailoverError, MARKER_RECV_WR_ID, MARKER_SEND_WR_ID};
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
            // Refused while a queue is full of work still flushing: tried again next call.
            nic.trip.markers_posted = nic.nic.post_send(&[marker]).is_ok()
                && nic.nic.post_recv(MARKER_RECV_WR_ID).is_ok();
        }
        self.poll_cq(nic).map_err(FailoverError::Local)?;
        if nic.trip.success_after {
            return Err(FailoverError::SuccessAfterFailure);
        }
        Ok(nic.trip.send_marker && nic.trip.recv_marker)
    }

    /// The quiesced lane's state, for the report.
    pub fn failover_snapshot(&self) -> super::failover::ReceiverSnapshot {
        super::failover::ReceiverSnapshot {
            oldest: self.ledger.oldest,
            announced: self.ledger.next_seq.wrapping_sub(self.ledger.deferred),
            eager: self.eager.is_some(),
        }
    }

    /// Replay `plan` on the lane's new queue pair `nic` (connected to the peer's new one), the
    /// receives' buffers from `journal`: one receive work request for each the flush took, then
    /// the clear-to-send entries the sender had not consumed, written again (the same bytes).
    /// Deferred entries stay deferred. The send queue starts over.
    ///
    /// `rekey` gives the sender's FIFO as its new queue pair serves it and, when this end moved
    /// to another device, its keys there: the entries written again and those still deferred
    /// (staged) then carry the new keys.
    pub fn failover_replay(
        &mut self,
        nic: &mut impl Nic,
        plan: &super::failover::ReceiverPlan,
        journal: &mut super::failover::RecvJournal,
        rekey: &super::failover::Rekey<'_>,
    ) -> Result<super::failover::Replayed, super::failover::FailoverError> {
        use super::failover::{FailoverError, Replayed};
        let local = FailoverError::Local;
        self.health.check().map_err(local)?;
        let own = self.failover_snapshot();
        let span = own.announced.wrapping_sub(own.oldest);
        if plan.rewrite.end != own.announced || plan.rewrite.start.wrapping_sub(own.oldest) > span {
            return Err(local(DataError::InvalidArgument(
                "the replay plan is not this lane's",
            )));
        }
        self.peer_fifo = check_peer_region(rekey.peer_region, SEND_INBOUND_LEN).map_err(local)?;
        if rekey.local.is_some() {
            // Deferred entries are staged with the old keys: stage them again.
            for seq in (0..self.ledger.deferred).map(|i| own.announced.wrapping_add(i)) {
                self.stage_journaled(nic, seq, journal, rekey)?;
            }
        }
        self.sq = SendQueue::default();
        let mut done = Replayed::default();
        // The flushed receive work requests, again, numbered on from the last one consumed.
        self.rq_posted = self.ledger.rq_consumed;
        for _ in 0..self.ledger.recvs_posted {
            let wr_id = self.next_recv_id();
            nic.post_recv(wr_id).map_err(|err| local(err.into()))?;
            done.work_requests += 1;
        }
        for seq in plan.rewrite.iter() {
            let slot = usize::from(seq as u8);
            self.stage_journaled(nic, seq, journal, rekey)?;
            if !self.sq.has_room_beside(1, self.ledger.recvs_posted) {
                return Err(local(DataError::InvalidArgument(
                    "the replay does not fit the send queue",
                )));
            }
            let write = self.cts_write(slot, 1).map_err(local)?;
            nic.post_send(&[write]).map_err(|err| local(err.into()))?;
            done.work_requests += 1;
            done.receives += 1;
        }
        if let Some(new_key) = rekey.local {
            // Receives still outstanding move again with the keys they have now.
            journal.rekey(new_key);
        }
        Ok(done)
    }

    /// Stage receive `seq`'s clear-to-send entries again, from `journal`, under this end's keys
    /// on the lane's device (`rekey`).
    fn stage_journaled(
        &self,
        nic: &mut impl Nic,
        seq: u32,
        journal: &super::failover::RecvJournal,
        rekey: &super::failover::Rekey<'_>,
    ) -> Result<(), super::failover::FailoverError> {
        let (n, mut entries) = self.journaled(seq, journal)?;
        let mut bytes = [0u8; CTS_SLOT_LEN];
        for (out, entry) in bytes
            .chunks_exact_mut(CTS_ENTRY_LEN)
            .zip(&mut entries[..usize::from(n)])
        {
            entry.rkey = rekey.local_key(entry.rkey)?;
            out.copy_from_slice(&entry.encode());
        }
        let len = usize::from(n) * CTS_ENTRY_LEN;
        nic.write_staging(usize::from(seq as u8) * CTS_SLOT_LEN, &bytes[..len]);
        Ok(())
    }

    /// Posted receive `seq`'s buffer count and clear-to-send entries, rebuilt from `journal`
    /// (its slot must hold it, and the journal the same group).
    fn journaled(
        &self,
        seq: u32,
        journal: &super::failover::RecvJournal,
    ) -> Result<(u8, [CtsEntry; MAX_RECVS]), super::failover::FailoverError> {
        use super::failover::FailoverError;
        let n = match *self.ledger.requests.state(usize::from(seq as u8)) {
            RecvState::PostedOne { seq: s, .. } if s == seq => 1,
            RecvState::Posted { seq: s, n } if s == seq => n,
            _ => {
                return Err(FailoverError::Local(
                    ProtocolError::UnexpectedCompletion { wr: WrKind::Cts }.into(),
                ));
            }
        };
        let entries =
            journal
                .entries(seq, n)
                .ok_or(FailoverError::Local(DataError::InvalidArgument(
                    "the receive journal does not match the lane's receives",
                )))?;
        Ok((n, entries))
    }

    /// For port failover to another device: each distinct key of the receives the sender may
    /// have consumed entries of (from the oldest on, as noted in `journal`), with its key on the
    /// new device by `new_key`, into `keys`. Fails ([`FailoverError::Rekey`](super::failover::FailoverError::Rekey))
    /// when one has none there or `keys` is full: more than
    /// [`MAX_KEY_PAIRS`](super::failover::MAX_KEY_PAIRS) registrations.
    pub fn failover_peer_keys(
        &self,
        journal: &super::failover::RecvJournal,
        new_key: &dyn Fn(u32) -> Option<u32>,
        keys: &mut super::failover::KeyMap,
    ) -> Result<(), super::failover::FailoverError> {
        use super::failover::FailoverError;
        let own = self.failover_snapshot();
        let span = own.announced.wrapping_sub(own.oldest);
        for seq in (0..span).map(|i| own.oldest.wrapping_add(i)) {
            let (n, entries) = self.journaled(seq, journal)?;
            for entry in entries.iter().take(usize::from(n)) {
                let new = new_key(entry.rkey).ok_or(FailoverError::Rekey(
                    "a buffer of the lane is not registered on the device it moves to",
                ))?;
                if !keys.insert(entry.rkey, new) {
                    return Err(FailoverError::Rekey(
                        "the lane's receives use more registrations than a failover to another \
                         device carries",
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
