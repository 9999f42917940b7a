//! The data path: receiver-driven rendezvous over one reliable-connected queue pair per
//! connection ([`SendConn`], [`RecvConn`]); [`multi`] drives several of them in lockstep as one
//! connection of several queue pairs.
//!
//! # Protocol
//!
//! Both ends always run Rivet; the wire format is our own (layouts in [`codec`]).
//!
//! **Regions.** The sender owns an inbound region, the clear-to-send (CTS) FIFO: [`SLOTS`] slots of
//! [`MAX_RECVS`] 32-byte entries ([`SEND_INBOUND_LEN`]). The receiver owns an inbound region of
//! completion records: [`SLOTS`] records of [`MAX_RECVS`] little-endian `u32` sizes
//! ([`RECV_INBOUND_LEN`]). Each side also has an outbound staging region for control bytes that
//! do not fit inline: the receiver stages CTS entries at `slot × 256` ([`RECV_STAGING_LEN`]), the
//! sender stages completion records at `slot × 32` ([`SEND_STAGING_LEN`]). A slot's staging bytes
//! are rewritten only when the slot comes round again, which needs the previous use of the slot to
//! have completed end to end, so the NIC has long read them.
//!
//! **Receive** ([`RecvConn::irecv`], 1..=8 buffers). Receive number `seq` takes slot
//! `seq % SLOTS` (FIFO order), posts one empty receive work request, and writes its `n` CTS entries
//! (address, capacity, rkey, tag, `n`, index, stamp `seq + 1`) into the sender's FIFO slot with
//! one RDMA WRITE, inline when `32 n ≤ max_inline`, else from staging. The stamp tells a fresh
//! entry from one of an earlier lap (or the zeroed first lap).
//!
//! **Batched clear-to-send.** While the sender holds at least [`CTS_LOW_WATER`] grants (receives
//! whose entries were written and whose data has not arrived), a new receive's entries are only
//! staged. The deferred slots are consecutive, so one RDMA WRITE from staging carries them all
//! (two at the FIFO's wrap); it goes when [`CTS_BATCH`] wait, or at the first call after arrivals
//! took the grants below the mark. The sender is unchanged: it reads the same FIFO. A receiver
//! that keeps several receives posted, as NCCL does, writes one CTS per batch instead of one per
//! receive; a lone receive is written at once.
//!
//! **Send** ([`SendConn::isend`]). The sender reads the slot of the oldest receive not yet fully
//! matched. When its entries are not all fresh yet, or none of its unmatched entries carries the
//! send's tag, the answer is `Ok(None)` ("try later"): tags only choose among the buffers of the
//! oldest outstanding receive. Every field is validated before use. For `n == 1` the send is one
//! signaled RDMA WRITE WITH IMMEDIATE of the payload. For a group, each matched send writes its
//! payload with a plain RDMA WRITE, and when the last entry of the slot is matched one signaled
//! RDMA WRITE WITH IMMEDIATE writes the `n` sizes into the receiver's completion record of the
//! slot. Zero-length payloads never target the user's buffer: an `n == 1` zero-length send is a
//! zero-length write-with-immediate aimed at the receiver's completion record, and a grouped one
//! writes no data at all (its size, 0, travels in the record).
//!
//! **Size mismatch.** A send larger than its matched buffer is refused, never truncated: no data
//! is written, the send request fails, and the slot is still completed, with the `MISMATCH` flag
//! in the immediate and the refused size in the record, so the receive request fails too.
//!
//! **Receive completions** arrive in FIFO order (RC): each write-with-immediate completion belongs
//! to the oldest outstanding receive; its `wr_id`, the immediate's sequence number, group size and
//! flags are checked against it. For `n == 1` without `RECORD` the size is the completion's byte
//! count; otherwise the sizes come from the record, each checked against its buffer.
//!
//! **Send queue.** Selective signaling with credit accounting (module `queue`): the write-with-immediate
//! ending a slot is signaled; data and CTS writes are unsignaled except every 64th and while credits
//! are low, so a queue carrying only unsignaled writes still drains. A call that would need more
//! credits than are free polls once, then answers `Ok(None)` and posts nothing.
//!
//! **Errors.** A failed completion, a [`NicError`](crate::nic::NicError), a protocol violation, or
//! [`SendConn::handle_fatal`] puts the connection into a sticky failed state: every outstanding
//! request and every later call returns the first cause (a request that had already completed
//! still reports `Done`: its data is there). A size mismatch fails only the requests involved; a
//! stale or bogus [`RequestId`] or invalid arguments fail only the call. `test` frees the request
//! whenever it returns `Done` or an error.
//!
//! **Close.** Before the driver destroys the queue pair it calls `drain`
//! ([`RecvConn::drain`], [`SendConn::drain`]) until nothing is left on its way: the receiver
//! waits for the data of every receive whose clear-to-send entries it wrote (deferred ones are
//! never written now), the sender for every posted slot end. The sender then has completions for
//! every receive it was granted, and learns of the close from the driver (the peer's socket).
//!
//! **Alignment.** The driver allocates both inbound regions at least 32-byte aligned (a page in
//! practice). Every CTS entry and record is then 32-byte aligned, so a NIC writing with relaxed
//! ordering cannot tear one; entries of one slot may still land in any order, which is why each
//! carries its own stamp and the sender only matches once all `n` are fresh.
//!
//! **Queue depths.** [`SEND_QUEUE_DEPTH`] = 512: 256 outstanding sends of grouped receives need at
//! most 256 data writes + 32 slot ends (288), a receiver at most 256 CTS writes, plus the
//! ≤ 63-request unsignaled tail; credits make overrunning impossible in any case.
//! [`RECV_QUEUE_DEPTH`] = [`SLOTS`]: one receive per outstanding slot. [`CQ_DEPTH`] = 768 = send
//! depth + receive depth: even when the queue pair fails and flushes every outstanding work request
//! (signaled or not) with an error completion, the completion queue cannot overrun.
//!
//! **Pools.** Every pool (requests, slots, staging) is a fixed-size array inside the connection;
//! `isend`, `irecv` and `test` never allocate.

pub mod codec;
pub mod eager;
mod error;
pub mod failover;
#[cfg(test)]
mod mock;
pub mod multi;
#[cfg(test)]
mod pair_tests;
mod recv;
mod send;

pub use codec::WrKind;
pub use error::{DataError, ProtocolError};
pub use recv::{CTS_BATCH, CTS_LOW_WATER, CtsWrite, OneRecv, RecvConn};
pub use send::{OneSend, SendConn};

use core::fmt;

use crate::nic::{Completion, CompletionKind, Nic, Queue, RawCompletion, RawOp, WcStatus};

/// Slots of the CTS FIFO, receives outstanding per connection at most.
pub const SLOTS: usize = 256;
/// Buffers of one grouped receive at most.
pub const MAX_RECVS: usize = 8;
/// Requests outstanding per direction at most (`NCCL_NET_MAX_REQUESTS` × [`MAX_RECVS`]).
pub const MAX_REQUESTS: usize = 256;

/// Bytes of the sender's inbound region (the CTS FIFO).
pub const SEND_INBOUND_LEN: usize = SLOTS * codec::CTS_SLOT_LEN;
/// Bytes of the sender's outbound staging region (completion records).
pub const SEND_STAGING_LEN: usize = SLOTS * codec::RECORD_LEN;
/// Bytes of the receiver's inbound region (completion records).
pub const RECV_INBOUND_LEN: usize = SLOTS * codec::RECORD_LEN;
/// Bytes of the receiver's outbound staging region (CTS entries).
pub const RECV_STAGING_LEN: usize = SLOTS * codec::CTS_SLOT_LEN;

/// Send-queue depth (`max_send_wr`) to create the queue pair with, on both sides.
pub const SEND_QUEUE_DEPTH: usize = 512;
/// Receive-queue depth (`max_recv_wr`) to create the queue pair with (the sender needs none):
/// one receive work request per outstanding receive, and one per ring slot for eager messages.
pub const RECV_QUEUE_DEPTH: usize = SLOTS + eager::EAGER_SLOTS;
/// Completion-queue depth, on both sides: every send and receive work request may complete
/// (with a flush error) at once.
pub const CQ_DEPTH: usize = SEND_QUEUE_DEPTH + RECV_QUEUE_DEPTH;

/// The core's view of a completion the hardware reported: what completed, from its operation, or
/// for a failed completion (which reports none) from its queue, or from its work-request id, which
/// the core chose. A receive consumed by anything but a write with immediate cannot happen in this
/// protocol: it is passed on as a write with immediate of 0, so validation names the violation.
#[inline(always)]
pub fn classify(raw: &RawCompletion) -> Completion {
    let kind = if raw.status.is_success() {
        match raw.op {
            RawOp::RecvWriteImm { imm } => CompletionKind::RecvWriteImm {
                imm,
                byte_len: raw.byte_len,
            },
            RawOp::RecvOther => CompletionKind::RecvWriteImm {
                imm: 0,
                byte_len: raw.byte_len,
            },
            RawOp::Send | RawOp::Unknown => CompletionKind::Send,
        }
    } else {
        let from_recv = match raw.queue {
            Some(queue) => queue == Queue::Recv,
            None => {
                codec::WrId::decode(raw.wr_id).is_ok_and(|id| id.kind == WrKind::Recv)
                    || raw.wr_id == failover::MARKER_RECV_WR_ID
            }
        };
        if from_recv {
            CompletionKind::RecvFailed
        } else {
            CompletionKind::Send
        }
    };
    Completion {
        wr_id: raw.wr_id,
        status: raw.status,
        vendor_err: raw.vendor_err,
        kind,
    }
}

/// Completions polled per `poll` call.
const POLL_BATCH: usize = 16;

// Indices are `u8`: slot and request numbers can never be out of range.
const _: () = assert!(SLOTS == 256 && MAX_REQUESTS == 256);
const _: () = assert!(MAX_REQUESTS >= 32 * MAX_RECVS);
const _: () = assert!(SEND_QUEUE_DEPTH >= MAX_REQUESTS + MAX_REQUESTS / MAX_RECVS);

/// A registered local buffer to send from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendBuf {
    /// Address of the first byte.
    pub addr: u64,
    /// Bytes to send (at most [`MAX_WR_BYTES`](crate::nic::MAX_WR_BYTES)).
    pub len: u64,
    /// Local key of the memory region covering the buffer.
    pub lkey: u32,
}

/// A registered local buffer to receive into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvBuf {
    /// Address of the first byte (may be 0 when `len` is 0).
    pub addr: u64,
    /// Capacity in bytes.
    pub len: u64,
    /// Remote key of the memory region covering the buffer.
    pub rkey: u32,
    /// Host memory the driver may copy into ([`Nic::deliver_inbound`]): an eager message may
    /// fill it. False for GPU memory, which the CPU never touches.
    pub host: bool,
}

/// Answer of `test`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completed {
    /// Not complete yet.
    Pending,
    /// Complete; the request is freed and its id is no longer valid.
    Done {
        /// Number of valid sizes (1 for a send).
        n: u8,
        /// Bytes per buffer (for a send, `sizes[0]` is the bytes sent). A work request carries
        /// at most [`MAX_WR_BYTES`](crate::nic::MAX_WR_BYTES) and a record's sizes are `u32`.
        sizes: [u32; MAX_RECVS],
    },
}

impl Completed {
    /// Hand the sizes of a finished request to `out`; whether it finished.
    #[inline]
    pub fn deliver(self, out: &mut impl SizesOut) -> bool {
        match self {
            Self::Pending => false,
            Self::Done { n, sizes } => {
                for (index, &size) in sizes.iter().take(usize::from(n)).enumerate() {
                    out.put(index, size);
                }
                true
            }
        }
    }
}

/// Where [`Connection::test_into`] writes a finished request's sizes, one call per buffer in
/// buffer order: straight into the driver's answer, instead of a [`Completed`] copied up to it.
pub trait SizesOut {
    /// The size of buffer `index` (below [`MAX_RECVS`]): for a send, index 0 and the bytes sent.
    fn put(&mut self, index: usize, size: u32);
}

/// The sizes of one request gathered into a [`Completed`].
#[derive(Clone, Copy, Debug, Default)]
pub struct CollectSizes {
    n: u8,
    sizes: [u32; MAX_RECVS],
}

impl CollectSizes {
    /// The answer: [`Completed::Pending`] unless `done`.
    pub fn completed(self, done: bool) -> Completed {
        if done {
            Completed::Done {
                n: self.n,
                sizes: self.sizes,
            }
        } else {
            Completed::Pending
        }
    }
}

impl SizesOut for CollectSizes {
    #[inline]
    fn put(&mut self, index: usize, size: u32) {
        // Sizes come in buffer order: the last one names the count.
        if let Some(slot) = self.sizes.get_mut(index) {
            *slot = size;
            self.n = index as u8 + 1;
        }
    }
}

/// What either direction of a connection offers once requests are posted: the one interface a
/// driver tests, fails and drains both [`SendConn`] and [`RecvConn`] through.
pub trait Connection {
    /// Poll the completion queue, then report on `req`: `Ok(true)` when it finished, its sizes
    /// written to `sizes` first. Finishing and errors free the request.
    fn test_into(
        &mut self,
        nic: &mut impl Nic,
        req: RequestId,
        sizes: &mut impl SizesOut,
    ) -> Result<bool, DataError>;

    /// [`test_into`](Self::test_into), the answer as one value.
    #[inline]
    fn test(&mut self, nic: &mut impl Nic, req: RequestId) -> Result<Completed, DataError> {
        let mut sizes = CollectSizes::default();
        let done = self.test_into(nic, req, &mut sizes)?;
        Ok(sizes.completed(done))
    }

    /// A fatal condition found outside the data path (the peer's socket closed, a device event):
    /// the connection fails with `err` unless it already failed.
    fn handle_fatal(&mut self, err: DataError);

    /// Before a close: poll for what is already posted and return how many requests are still
    /// outstanding (0: nothing left to wait for).
    fn drain(&mut self, nic: &mut impl Nic) -> Result<usize, DataError>;

    /// Requests handed out and not yet freed by `test`.
    fn outstanding(&self) -> usize;
}

/// Which direction a request belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Side {
    Send,
    Recv,
}

/// Handle of an outstanding request: pool index and generation, so a stale id is detected.
///
/// Kept packed, as it travels: bits 0–8 index + 1, 9–10 direction (1 send, 2 receive), 11–15
/// zero, 16–31 generation. Never 0, so it can travel as a non-NULL pointer. A pool keeps each
/// slot's current id the same way, so checking one is a single compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RequestId(u32);

impl RequestId {
    /// The id of request slot `index` of direction `side` in its `generation`.
    #[inline(always)]
    const fn new(index: u8, side: Side, generation: u16) -> Self {
        let side = match side {
            Side::Send => 1,
            Side::Recv => 2,
        };
        Self((index as u32 + 1) | side << 9 | (generation as u32) << 16)
    }

    /// The pool slot it names (of an id from `from_bits`, some slot: the pool's compare then
    /// refuses what that slot did not hand out).
    #[inline(always)]
    fn index(self) -> u8 {
        // Bits 0–8 are index + 1 (1..=MAX_REQUESTS) in every id `new` makes.
        self.0.wrapping_sub(1) as u8
    }

    /// The id the same slot's next request gets (the generation wraps).
    #[inline(always)]
    fn next_generation(self) -> Self {
        Self(self.0.wrapping_add(1 << 16))
    }

    /// The id packed into a non-zero `u32`.
    #[inline(always)]
    pub fn to_bits(self) -> u32 {
        self.0
    }

    /// Unpack an id; `None` when bits 11–15 are not zero (a flush id, for instance), which no
    /// request id has. Any other value unpacks, and may be stale or never handed out: the pool
    /// refuses it unless it equals, in every bit, the id its slot handed out, which carries
    /// index, direction and generation (the pool's `lookup`). That compare is the validation;
    /// this one only keeps other ids apart.
    #[inline(always)]
    pub fn from_bits(bits: u32) -> Option<Self> {
        (bits & 0xf800 == 0).then_some(Self(bits))
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.to_bits())
    }
}

/// The sticky state of a connection.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Health {
    /// Working.
    Active,
    /// Failed for good; every call returns the cause.
    Failed(DataError),
}

impl Health {
    /// Record `err` unless a cause is already recorded; return the recorded cause.
    fn fail(&mut self, err: DataError) -> DataError {
        match self {
            Self::Failed(first) => *first,
            Self::Active => {
                *self = Self::Failed(err);
                err
            }
        }
    }

    fn check(&self) -> Result<(), DataError> {
        match self {
            Self::Active => Ok(()),
            Self::Failed(err) => Err(*err),
        }
    }

    fn failure(&self) -> Option<&DataError> {
        match self {
            Self::Active => None,
            Self::Failed(err) => Some(err),
        }
    }
}

/// An empty completion to initialise poll batches with.
const NO_COMPLETION: Completion = Completion {
    wr_id: 0,
    status: WcStatus::SUCCESS,
    vendor_err: 0,
    kind: CompletionKind::Send,
};

/// The error a failed completion stands for.
fn completion_error(c: &Completion) -> DataError {
    DataError::Completion {
        status: c.status,
        vendor_err: c.vendor_err,
        wr: codec::WrId::decode(c.wr_id).ok().map(|id| id.kind),
    }
}

/// A placeholder to fill work-request chains with (never posted).
const EMPTY_WR: crate::nic::SendWr<'static> = crate::nic::SendWr {
    wr_id: 0,
    op: crate::nic::SendOp::Write,
    payload: crate::nic::Payload::Empty,
    remote_addr: 0,
    rkey: 0,
    signaled: false,
};

/// Address `offset` bytes into a peer region, refusing to leave it.
/// `region` (the peer's, untrusted) if it holds at least `need` bytes and does not run past the
/// address space; the error a connection fails with otherwise.
fn check_peer_region(
    region: crate::nic::RemoteRegion,
    need: usize,
) -> Result<crate::nic::RemoteRegion, DataError> {
    if (region.len as usize) < need || region.addr.checked_add(u64::from(region.len)).is_none() {
        return Err(DataError::PeerRegion {
            len: region.len,
            need,
        });
    }
    Ok(region)
}

fn region_addr(region: &crate::nic::RemoteRegion, offset: usize, len: usize) -> Option<u64> {
    let end = offset.checked_add(len)?;
    if end > region.len as usize {
        return None;
    }
    region.addr.checked_add(offset as u64)
}

mod pool {
    //! The request slots of one direction of a connection, shared by [`super::SendConn`] and
    //! [`super::RecvConn`]: every slot carries a generation, so a stale id (its request already
    //! reported) or one of the other direction is refused, never taken for a newer request; and
    //! `test` reports a request's end the same way on both sides.
    //!
    //! Sends take any free slot (a free list, since they end in any order); receives take the slot of
    //! their sequence number (the clear-to-send FIFO is positional), so the free list is a const
    //! parameter.

    use super::{DataError, MAX_REQUESTS, RequestId, Side};

    /// The state a direction keeps per request.
    pub(super) trait RequestState: Copy {
        /// A slot not in use.
        const FREE: Self;
        /// Whether this is [`FREE`](Self::FREE) (a `matches!`, not the derived `PartialEq`, which
        /// compares every field of every variant and is not always inlined).
        fn is_free(&self) -> bool;
        /// Still waiting for its completion (`test` polls the NIC only then).
        fn pending(&self) -> bool;
    }

    #[derive(Clone, Copy, Debug)]
    struct Slot<S> {
        /// The id the slot's request has (or its next one will have): its generation is in it.
        id: RequestId,
        state: S,
    }

    /// [`MAX_REQUESTS`] generation-checked slots; with `FREE_LIST`, a stack of the free ones.
    #[derive(Clone, Debug)]
    pub(super) struct RequestPool<S, const FREE_LIST: bool> {
        slots: [Slot<S>; MAX_REQUESTS],
        /// Free slots, popped from the end (only with `FREE_LIST`).
        free: [u8; MAX_REQUESTS],
        free_len: usize,
        in_use: usize,
    }

    impl<S: RequestState, const FREE_LIST: bool> RequestPool<S, FREE_LIST> {
        /// Every slot free; with the free list, slot 0 is handed out first.
        pub(super) fn new(side: Side) -> Self {
            let mut free = [0u8; MAX_REQUESTS];
            for (i, slot) in free.iter_mut().enumerate() {
                *slot = (MAX_REQUESTS - 1 - i) as u8;
            }
            let mut slots = [Slot {
                id: RequestId::new(0, side, 0),
                state: S::FREE,
            }; MAX_REQUESTS];
            for (index, slot) in slots.iter_mut().enumerate() {
                slot.id = RequestId::new(index as u8, side, 0);
            }
            Self {
                slots,
                free,
                free_len: if FREE_LIST { MAX_REQUESTS } else { 0 },
                in_use: 0,
            }
        }

        /// The slot the next [`occupy`](Self::occupy) of a free-list pool takes, if any is free.
        #[inline(always)]
        pub(super) fn next_free(&self) -> Option<u8> {
            FREE_LIST
                .then(|| self.free_len.checked_sub(1).map(|top| self.free[top]))
                .flatten()
        }

        /// Whether slot `index` is free.
        #[inline(always)]
        pub(super) fn is_free(&self, index: u8) -> bool {
            self.slots[usize::from(index)].state.is_free()
        }

        /// Put a request in slot `index` (free: [`next_free`](Self::next_free) with the free list,
        /// [`is_free`](Self::is_free) without) and name it.
        #[inline(always)]
        pub(super) fn occupy(&mut self, index: u8, state: S) -> RequestId {
            if FREE_LIST {
                debug_assert_eq!(
                    self.next_free(),
                    Some(index),
                    "a free-list pool takes its top"
                );
                self.free_len -= 1;
            }
            self.in_use += 1;
            let slot = &mut self.slots[usize::from(index)];
            slot.state = state;
            slot.id
        }

        /// Change the state of the request in use in slot `index` (it keeps its id).
        #[inline(always)]
        pub(super) fn reoccupy(&mut self, index: u8, state: S) -> RequestId {
            let slot = &mut self.slots[usize::from(index)];
            debug_assert!(!slot.state.is_free(), "reoccupy keeps a request in use");
            slot.state = state;
            slot.id
        }

        /// The slot of `req`, if it names a request in use of this pool.
        #[inline(always)]
        pub(super) fn lookup(&self, req: RequestId) -> Result<usize, DataError> {
            let index = usize::from(req.index());
            let slot = &self.slots[index];
            // The id carries the direction and the generation: one compare refuses both an id of
            // the other direction and a stale one.
            if slot.id != req || slot.state.is_free() {
                return Err(DataError::InvalidRequest {
                    bits: req.to_bits(),
                });
            }
            Ok(index)
        }

        /// The state of slot `index`.
        #[inline(always)]
        pub(super) fn state(&self, index: usize) -> &S {
            &self.slots[index].state
        }

        /// The state of slot `index`, to change.
        #[inline(always)]
        pub(super) fn state_mut(&mut self, index: usize) -> &mut S {
            &mut self.slots[index].state
        }

        /// End the request in slot `index` (nothing if it is free): its id goes stale.
        pub(super) fn release(&mut self, index: usize) {
            if !self.slots[index].state.is_free() {
                self.end_in_use(index);
            }
        }

        /// `test`'s answer for the request in slot `index` (found in use by [`lookup`](Self::lookup))
        /// after the direction's `progress` (polling the NIC): a failed progress, or else what
        /// `report` makes of the slot's state (`Ok(false)` pending, `Ok(true)` finished with its
        /// sizes written, or the request's error). Anything but pending frees the slot.
        #[inline(always)]
        pub(super) fn settle(
            &mut self,
            index: usize,
            progress: Result<(), DataError>,
            report: impl FnOnce(&S) -> Result<bool, DataError>,
        ) -> Result<bool, DataError> {
            // `lookup` found the slot in use and progress never frees one: no stale check again.
            let report = match progress {
                Err(err) => Err(err),
                Ok(()) => report(&self.slots[index].state),
            };
            if !matches!(report, Ok(false)) {
                self.end_in_use(index);
            }
            report
        }

        /// [`release`](Self::release) of a slot known to be in use (`settle`'s: `lookup` found it
        /// so, and nothing between frees one), inlined into `test`.
        #[inline(always)]
        fn end_in_use(&mut self, index: usize) {
            let slot = &mut self.slots[index];
            debug_assert!(!slot.state.is_free(), "settle ends a request in use");
            slot.state = S::FREE;
            slot.id = slot.id.next_generation();
            self.in_use -= 1;
            if FREE_LIST && self.free_len < MAX_REQUESTS {
                self.free[self.free_len] = index as u8;
                self.free_len += 1;
            }
        }

        /// Requests in use.
        #[inline(always)]
        pub(super) fn outstanding(&self) -> usize {
            self.in_use
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        enum Toy {
            Free,
            Waiting,
            Done,
            Failed,
        }

        impl RequestState for Toy {
            const FREE: Self = Self::Free;
            fn is_free(&self) -> bool {
                matches!(self, Self::Free)
            }
            fn pending(&self) -> bool {
                *self == Self::Waiting
            }
        }

        impl Toy {
            fn report(&self) -> Result<bool, DataError> {
                match self {
                    Self::Waiting => Ok(false),
                    Self::Done => Ok(true),
                    Self::Failed | Self::Free => Err(DataError::InvalidArgument("toy")),
                }
            }
        }

        #[test]
        fn ids_go_stale_when_reported_and_never_cross_directions() {
            let mut sends: RequestPool<Toy, true> = RequestPool::new(Side::Send);
            let first = sends.next_free().unwrap();
            assert_eq!(first, 0, "request 0 is handed out first");
            let id = sends.occupy(first, Toy::Waiting);
            assert_eq!(sends.outstanding(), 1);
            let i = sends.lookup(id).unwrap();
            assert_eq!(sends.settle(i, Ok(()), Toy::report), Ok(false));
            *sends.state_mut(i) = Toy::Done;
            assert_eq!(sends.settle(i, Ok(()), Toy::report), Ok(true));
            assert_eq!(sends.outstanding(), 0);
            assert!(sends.lookup(id).is_err(), "a reported id is stale");
            // The slot comes back with a new generation: the old id does not name the new request.
            let again = sends.occupy(sends.next_free().unwrap(), Toy::Waiting);
            assert_eq!(again.index(), id.index());
            assert!(sends.lookup(id).is_err() && sends.lookup(again).is_ok());

            let mut recvs: RequestPool<Toy, false> = RequestPool::new(Side::Recv);
            assert_eq!(
                recvs.next_free(),
                None,
                "receives take their slot by position"
            );
            assert!(recvs.is_free(5));
            let r = recvs.occupy(5, Toy::Waiting);
            assert!(!recvs.is_free(5));
            assert!(sends.lookup(r).is_err(), "a receive id is not a send id");
            assert!(recvs.lookup(again).is_err(), "nor the other way round");
            // A failed progress ends the request with its error.
            let i = recvs.lookup(r).unwrap();
            assert_eq!(
                recvs.settle(i, Err(DataError::InvalidArgument("poll")), Toy::report),
                Err(DataError::InvalidArgument("poll"))
            );
            assert!(recvs.is_free(5) && recvs.outstanding() == 0);
            // A refused request reports its error once, then is gone.
            let r = recvs.occupy(6, Toy::Failed);
            let i = recvs.lookup(r).unwrap();
            assert!(recvs.settle(i, Ok(()), Toy::report).is_err());
            assert!(recvs.lookup(r).is_err());
        }

        /// Every value `RequestId::from_bits` unpacks that no slot handed out is refused by the
        /// one compare, with every slot in use (so the free check decides nothing): zero, index 0
        /// or above `MAX_REQUESTS`, direction 0 or 3, the other direction, another generation.
        #[test]
        fn lookup_refuses_every_id_no_slot_handed_out() {
            let mut sends: RequestPool<Toy, true> = RequestPool::new(Side::Send);
            while let Some(i) = sends.next_free() {
                sends.occupy(i, Toy::Waiting);
            }
            for bits in [
                0,
                1,
                1 << 9,
                257 | 1 << 9,
                0x1ff | 1 << 9,
                1 | 3 << 9,
                1 | 2 << 9,
                1 | 1 << 9 | 1 << 16,
                !0xf800,
            ] {
                let id = RequestId::from_bits(bits).expect("bits 11-15 clear");
                assert_eq!(
                    sends.lookup(id),
                    Err(DataError::InvalidRequest { bits }),
                    "{bits:#x}"
                );
            }
            let handed_out = RequestId::from_bits(1 | 1 << 9).expect("an id");
            assert_eq!(sends.lookup(handed_out), Ok(0));
        }

        #[test]
        fn the_free_list_hands_out_every_slot_once() {
            let mut pool: RequestPool<Toy, true> = RequestPool::new(Side::Send);
            let mut seen = [false; MAX_REQUESTS];
            while let Some(i) = pool.next_free() {
                assert!(!seen[usize::from(i)]);
                seen[usize::from(i)] = true;
                pool.occupy(i, Toy::Waiting);
            }
            assert!(seen.iter().all(|&s| s));
            assert_eq!(pool.outstanding(), MAX_REQUESTS);
            pool.release(3);
            assert_eq!(pool.next_free(), Some(3));
            pool.release(3);
            assert_eq!(
                pool.outstanding(),
                MAX_REQUESTS - 1,
                "releasing twice is a no-op"
            );
        }
    }
}

pub(crate) mod queue {
    //! Send-queue credit and completion-queue accounting shared by both directions.
    //!
    //! Every send work request takes one credit when it is posted. RC completes the send queue in
    //! order, so a signaled completion returns the credits of every work request up to and including
    //! it. To make sure credits always come back, a work request is signaled when it ends a slot, when
    //! [`SIGNAL_INTERVAL`] − 1 unsignaled ones precede it, or when fewer than [`LOW_WATER`] credits
    //! would be left after it. The `wr_id` carries the post position (1-based, truncated to 32 bits),
    //! so a completion says how far the queue has drained; positions are validated on the way back.

    use super::codec::{WrId, WrKind};
    use super::error::ProtocolError;
    use super::{CQ_DEPTH, SEND_QUEUE_DEPTH};

    const _: () = assert!(SEND_QUEUE_DEPTH <= CQ_DEPTH);

    /// At most this many consecutive unsignaled work requests.
    pub(crate) const SIGNAL_INTERVAL: u32 = 64;
    /// Signal every work request while fewer credits than this remain.
    pub(crate) const LOW_WATER: u64 = SIGNAL_INTERVAL as u64;

    /// Credit state of one send queue.
    #[derive(Debug, Clone, Default)]
    pub(crate) struct SendQueue {
        /// Work requests posted since the connection started.
        posted: u64,
        /// Work requests known complete (up to the last polled signaled completion).
        retired: u64,
        /// Unsignaled work requests posted since the last signaled one.
        unsignaled_run: u32,
        /// Signaled work requests whose completion has not been polled yet.
        signaled_in_flight: u32,
    }

    /// A post position and signal decision for one work request about to be posted.
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct Slotted {
        pub(crate) wr_id: u64,
        pub(crate) signaled: bool,
    }

    impl SendQueue {
        /// True when `count` more work requests fit, their completions alone in the CQ (a
        /// sender's). Such a CQ holds at most one completion per work request posted and not
        /// retired (signaled, or failed), never more than [`SEND_QUEUE_DEPTH`] of them, and it is
        /// no shallower: room in the queue is room in the CQ.
        #[inline(always)]
        pub(crate) fn has_room(&self, count: usize) -> bool {
            (self.posted - self.retired) as usize + count <= SEND_QUEUE_DEPTH
        }

        /// True when `count` more work requests fit, and their completions fit the CQ next to
        /// `other_cqes` (receive completions that may arrive: a receiver's).
        pub(crate) fn has_room_beside(&self, count: usize, other_cqes: usize) -> bool {
            self.has_room(count)
                && self.signaled_in_flight as usize + count + other_cqes <= CQ_DEPTH
        }

        /// Take the next post position for a work request of `kind` at `index`; `must_signal` forces
        /// a signaled completion. The caller must have checked [`has_room`](Self::has_room).
        #[inline(always)]
        pub(crate) fn next(&mut self, kind: WrKind, index: u16, must_signal: bool) -> Slotted {
            self.posted += 1;
            // Fewer than `LOW_WATER` credits left after it (none when past the depth).
            let low = self.posted - self.retired > SEND_QUEUE_DEPTH as u64 - LOW_WATER;
            let signaled = must_signal || self.unsignaled_run + 1 >= SIGNAL_INTERVAL || low;
            if signaled {
                self.unsignaled_run = 0;
                self.signaled_in_flight += 1;
            } else {
                self.unsignaled_run += 1;
            }
            let wr_id = WrId {
                kind,
                index,
                seq: self.posted as u32,
            }
            .encode();
            Slotted { wr_id, signaled }
        }

        /// Account a successful signaled completion at post position `seq` (as carried in the
        /// `wr_id`). Returns the full 64-bit position.
        pub(crate) fn complete(&mut self, seq: u32, kind: WrKind) -> Result<u64, ProtocolError> {
            let behind = u64::from((self.posted as u32).wrapping_sub(seq));
            if behind >= self.posted - self.retired || self.signaled_in_flight == 0 {
                return Err(ProtocolError::UnexpectedCompletion { wr: kind });
            }
            self.retired = self.posted - behind;
            self.signaled_in_flight -= 1;
            Ok(self.retired)
        }

        /// True when unsignaled work requests were posted after the last signaled one: nothing
        /// will tell that they completed until a signaled one follows them.
        pub(crate) fn unsignaled_tail(&self) -> bool {
            self.unsignaled_run != 0
        }

        /// Work requests posted and not yet known complete.
        pub(crate) fn unretired(&self) -> u64 {
            self.posted - self.retired
        }

        /// Position the last posted work request got.
        pub(crate) fn posted(&self) -> u64 {
            self.posted
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn empty_next_signals_every_64th() {
            let mut sq = SendQueue::default();
            let mut signaled = 0;
            for _ in 0..256 {
                if sq.next(WrKind::Cts, 0, false).signaled {
                    signaled += 1;
                }
            }
            assert_eq!(signaled, 4);
            assert_eq!(sq.unretired(), 256);
        }

        #[test]
        fn full_next_signals_when_credits_low() {
            let mut sq = SendQueue::default();
            for _ in 0..SEND_QUEUE_DEPTH - LOW_WATER as usize {
                sq.next(WrKind::Cts, 0, false);
            }
            assert!(sq.next(WrKind::Cts, 0, false).signaled);
            assert!(sq.next(WrKind::Cts, 0, false).signaled);
        }

        #[test]
        fn full_has_room_refuses_past_depth() {
            let mut sq = SendQueue::default();
            for _ in 0..SEND_QUEUE_DEPTH {
                assert!(sq.has_room(1));
                sq.next(WrKind::Data, 0, false);
            }
            assert!(!sq.has_room(1));
        }

        #[test]
        fn posted_complete_returns_credits_up_to_it() {
            let mut sq = SendQueue::default();
            for _ in 0..10 {
                sq.next(WrKind::Data, 0, false);
            }
            let end = sq.next(WrKind::SlotEnd, 0, true);
            sq.next(WrKind::Data, 0, false);
            let seq = WrId::decode(end.wr_id).unwrap().seq;
            assert_eq!(sq.complete(seq, WrKind::SlotEnd), Ok(11));
            assert_eq!(sq.unretired(), 1);
        }

        #[test]
        fn posted_complete_rejects_stale_and_future_positions() {
            let mut sq = SendQueue::default();
            let first = sq.next(WrKind::SlotEnd, 0, true);
            let seq = WrId::decode(first.wr_id).unwrap().seq;
            assert!(sq.complete(seq + 1, WrKind::SlotEnd).is_err());
            assert!(sq.complete(seq, WrKind::SlotEnd).is_ok());
            assert!(sq.complete(seq, WrKind::SlotEnd).is_err());
        }
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn completions_are_classified_by_op_then_queue_then_wr_id() {
        use crate::nic::{Queue, RawCompletion, RawOp};
        let recv_id = codec::WrId {
            kind: WrKind::Recv,
            index: 3,
            seq: 9,
        }
        .encode();
        let send_id = codec::WrId {
            kind: WrKind::SlotEnd,
            index: 3,
            seq: 9,
        }
        .encode();
        let raw = |wr_id, status, op, queue| RawCompletion {
            wr_id,
            status,
            vendor_err: 7,
            op,
            byte_len: 64,
            queue,
        };
        let ok = WcStatus::SUCCESS;
        let bad = WcStatus::WR_FLUSH_ERR;
        let kind = |r: RawCompletion| classify(&r).kind;
        assert_eq!(
            kind(raw(recv_id, ok, RawOp::RecvWriteImm { imm: 5 }, None)),
            CompletionKind::RecvWriteImm {
                imm: 5,
                byte_len: 64
            }
        );
        assert_eq!(
            kind(raw(recv_id, ok, RawOp::RecvOther, None)),
            CompletionKind::RecvWriteImm {
                imm: 0,
                byte_len: 64
            }
        );
        assert_eq!(
            kind(raw(send_id, ok, RawOp::Send, None)),
            CompletionKind::Send
        );
        // Failed: the queue decides where the format says it, else the core's wr_id.
        assert_eq!(
            kind(raw(send_id, bad, RawOp::Unknown, Some(Queue::Recv))),
            CompletionKind::RecvFailed
        );
        assert_eq!(
            kind(raw(recv_id, bad, RawOp::Unknown, Some(Queue::Send))),
            CompletionKind::Send
        );
        assert_eq!(
            kind(raw(recv_id, bad, RawOp::Unknown, None)),
            CompletionKind::RecvFailed
        );
        assert_eq!(
            kind(raw(send_id, bad, RawOp::Unknown, None)),
            CompletionKind::Send
        );
        assert_eq!(
            kind(raw(0xdead, bad, RawOp::Unknown, None)),
            CompletionKind::Send
        );
        let c = classify(&raw(send_id, bad, RawOp::Unknown, None));
        assert_eq!((c.wr_id, c.status, c.vendor_err), (send_id, bad, 7));
    }
    use super::*;

    #[test]
    fn request_id_roundtrip() {
        for index in [0u8, 1, 255] {
            for side in [Side::Send, Side::Recv] {
                for generation in [0u16, 1, u16::MAX] {
                    let id = RequestId::new(index, side, generation);
                    assert_ne!(id.to_bits(), 0);
                    assert_eq!(RequestId::from_bits(id.to_bits()), Some(id));
                    assert_eq!(id.index(), index);
                }
            }
        }
    }

    /// Bits 11–15 set never unpack (a flush id has bit 15); every other value does, for the
    /// pool's compare to judge (`pool`'s tests).
    #[test]
    fn request_id_keeps_other_ids_apart() {
        assert_eq!(RequestId::from_bits(1 | 1 << 9 | 1 << 12), None);
        assert_eq!(RequestId::from_bits(1 | 1 << 9 | 1 << 15), None);
        assert!(RequestId::from_bits(0).is_some());
    }

    #[test]
    fn layout_constants() {
        assert_eq!(SEND_INBOUND_LEN, 64 * 1024);
        assert_eq!(RECV_INBOUND_LEN, 8 * 1024);
        assert_eq!(CQ_DEPTH, 784);
    }
}
