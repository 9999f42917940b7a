//! Port failover (issue #39): moving a lane (one queue pair of a connection, one [`SendConn`](super::SendConn) or
//! [`RecvConn`](super::RecvConn)) whose port failed onto a queue pair of a surviving port of the fused device,
//! without losing, duplicating or reordering a message.
//!
//! # How it stays exact
//!
//! NCCL's IB transport probes the receiver's completion records with RDMA READs over extra
//! queue pairs to learn what landed. Rivet instead **quiesces, then exchanges exact state over
//! the socket, then replays**:
//!
//! 1. **Quiesce.** Both ends stop posting on the lane, move its old queue pair to the error state
//!    and drain its completion queue. A [`Tripwire`] between the core and the NIC ([`Guarded`])
//!    stops at the first failed completion: the core never sees it nor the flushes behind it
//!    (they are expected, counted, and not fatal), so the connection stays healthy. A flushed
//!    marker work request posted after the transition ([`SendConn::failover_quiesce`](super::SendConn::failover_quiesce),
//!    [`RecvConn::failover_quiesce`](super::RecvConn::failover_quiesce)) is the last completion of its queue: once it is seen,
//!    nothing of the old queue pair is left. Once the receiver's old queue pair is in error
//!    nothing more lands through it, so what it reports next is final.
//! 2. **Exchange** ([`report`]). The receiver reports `oldest` (the first receive whose data has
//!    not arrived) and `announced` (receives whose clear-to-send entries it wrote); the sender
//!    `ended` (receives whose slot it ended: their entries consumed) and `acked` (slot ends known
//!    complete below it). Each end checks the peer's numbers against its own
//!    ([`plan_sender`], [`plan_receiver`]): a report that cannot be true is a protocol error and
//!    the connection fails.
//! 3. **Replay** on the new queue pair, in order. The sender marks the receives in
//!    `acked..oldest` complete (their slot end landed; only the acknowledgement was lost) and
//!    re-posts, for every receive in `oldest..ended` and for the partly matched head receive, its
//!    data writes (idempotent: the same bytes into the same buffer) and its slot end (the
//!    write-with-immediate that completes the receive: exactly once, since the receiver's never
//!    arrived). The receiver re-posts one receive work request for each one the flush took, and
//!    re-writes the clear-to-send entries of receives `ended..announced` (the same bytes, the same
//!    stamps: idempotent). The sequence numbers in the immediates and the receiver's check of each
//!    against its oldest receive refuse anything else.
//!
//! The sender cannot rebuild a replay from the connection alone (the core does not keep the
//! local buffers of posted sends, nor the receiver the keys of its buffers: keeping them would
//! cost the hot path). A driver with failover on keeps them in a [`SendJournal`] /
//! [`RecvJournal`] (one array write per request, only when failover is on).
//!
//! # Deciding
//!
//! [`Failover`] is one end's decision machine for one connection (quinn-proto style:
//! `handle_*` inputs, [`Failover::poll_action`] outputs, time passed in). It gives up — the
//! connection then fails exactly as it does without failover — when failover is off on either
//! end, the status is not attributable to the port (only `RETRY_EXC_ERR`, or `WR_FLUSH_ERR`
//! after a `PORT_ERR` on the lane's port, are), the attempts are used up, no port survives, more
//! than one device of the fused NIC failed, the peer does not answer in time, or a report is bad.
//!
//! Not here: creating the new queue pair and carrying reports over the socket (the plugin's),
//! and the eager path (a lane with eager on is refused: [`FailoverError::Eager`]).

pub mod report;

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::vec::Vec;
use core::fmt;

use super::codec::{CtsEntry, stamp_for};
use super::{DataError, MAX_RECVS, MAX_REQUESTS, RecvBuf, RequestId, SLOTS, SendBuf};
use crate::nic::{Completion, Nic, NicError, SendWr, WcStatus};
use crate::time::{Duration, Instant};
pub use report::{KEYS_PER_REPORT, KeyChunk, QpInfo, Refusal, Report, ReportBody, ReportError};

/// Lanes (queue pairs) of one connection at most ([`super::multi::MAX_QPS`]).
pub const MAX_LANES: usize = super::multi::MAX_QPS;
/// Ports of a fused device at most.
pub const MAX_PORTS: usize = 16;
/// How long the peer has to answer a failover, by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The `wr_id` of the marker send posted on a failed queue pair (no core `wr_id` has it: its
/// magic byte is not [`WR_ID_MAGIC`](super::codec::WR_ID_MAGIC)).
pub const MARKER_SEND_WR_ID: u64 = 0xFA11_0E5D_0000_0001;
/// The `wr_id` of the marker receive posted on a failed queue pair.
pub const MARKER_RECV_WR_ID: u64 = 0xFA11_0E5D_0000_0002;

/// Why a failover gave up. Each comes with the connection failing, as without failover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailoverError {
    /// Failover is off on this end (`NCCL_IB_RESILIENCY_PORT_FAILOVER=0`).
    Disabled,
    /// The peer refused.
    PeerRefused(Refusal),
    /// The completion status is not attributable to the port.
    NotSurvivable(WcStatus),
    /// The connection already failed over `max` times (`…_MAX_ATTEMPTS`).
    AttemptsExhausted {
        /// The limit.
        max: u32,
    },
    /// Every port of the fused device is down.
    NoSurvivingPort,
    /// More than one device of the fused NIC failed.
    DevicesFailed {
        /// Devices with a failed port.
        failed: u32,
    },
    /// The peer did not answer within the timeout.
    Timeout {
        /// The lane waiting.
        lane: u8,
        /// The bound.
        after: Duration,
    },
    /// The peer's report does not decode.
    BadReport(ReportError),
    /// The peer's report cannot be true against this end's state.
    Inconsistent {
        /// The lane.
        lane: u8,
        /// What does not hold.
        why: &'static str,
    },
    /// The lane has the eager path on (its replay is not built).
    Eager,
    /// A lane index outside the connection.
    Lane(u8),
    /// A success completion came after the lane's queue pair failed (the hardware broke RC's
    /// order, or a driver bug).
    SuccessAfterFailure,
    /// This end's lane failed while failing over (a post refused, a completion that breaks the
    /// protocol, a state that cannot be replayed).
    Local(DataError),
    /// The driver could not do what the machine asked (create or connect the new queue pair,
    /// register on the new device): the connection fails with the lane's first error.
    Driver(&'static str),
    /// The lane's memory keys cannot be carried to the device it moves to (a buffer not
    /// registered there, more registrations behind its receives than a failover carries, a
    /// consumed entry's key the receiver did not tell): the connection fails with the lane's
    /// first error, as without failover.
    Rekey(&'static str),
}

impl fmt::Display for FailoverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("port failover gave up: ")?;
        match self {
            Self::Disabled => f.write_str("it is off (NCCL_IB_RESILIENCY_PORT_FAILOVER=0)"),
            Self::PeerRefused(why) => write!(f, "the peer refused: {why}"),
            Self::NotSurvivable(status) => write!(
                f,
                "{} (status {}) is not a port failure",
                status.name(),
                status.0
            ),
            Self::AttemptsExhausted { max } => write!(
                f,
                "{max} failover(s) already done (NCCL_IB_RESILIENCY_PORT_FAILOVER_MAX_ATTEMPTS)"
            ),
            Self::NoSurvivingPort => f.write_str("no port of the device is left"),
            Self::DevicesFailed { failed } => {
                write!(
                    f,
                    "{failed} devices of the fused NIC failed (at most 1 survives)"
                )
            }
            Self::Timeout { lane, after } => {
                write!(f, "the peer did not answer for lane {lane} within {after}")
            }
            Self::BadReport(err) => write!(f, "the peer's report is malformed: {err}"),
            Self::Inconsistent { lane, why } => {
                write!(f, "the peer's report for lane {lane} cannot be true: {why}")
            }
            Self::Eager => f.write_str("the lane has the eager path on, which is not replayed"),
            Self::Lane(lane) => write!(f, "lane {lane} is not one of the connection's"),
            Self::SuccessAfterFailure => {
                f.write_str("a completion succeeded after its queue pair failed")
            }
            Self::Local(err) => write!(f, "the lane failed while failing over: {err}"),
            Self::Driver(what) => write!(f, "{what}"),
            Self::Rekey(what) => write!(f, "the lane's keys cannot move to its new device: {what}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Snapshots and plans.

/// A quiesced sender's state of a lane (what its report says).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SenderSnapshot {
    /// Receives whose slot this end ended (entries consumed, slot end posted): `seq`.
    pub ended: u32,
    /// Receives below this are known complete here (their slot end's completion polled).
    pub acked: u32,
    /// The eager path is on.
    pub eager: bool,
}

/// A quiesced receiver's state of a lane (what its report says); final once its old queue pair is
/// in error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ReceiverSnapshot {
    /// The first receive whose data has not arrived.
    pub oldest: u32,
    /// Receives whose clear-to-send entries were written (posted less deferred).
    pub announced: u32,
    /// The eager path is on.
    pub eager: bool,
}

/// A run of receive sequence numbers `start..end` (wrapping).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SeqRange {
    /// First.
    pub start: u32,
    /// One past the last.
    pub end: u32,
}

impl SeqRange {
    /// How many.
    pub fn len(&self) -> u32 {
        self.end.wrapping_sub(self.start)
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The sequence numbers, in order.
    pub fn iter(&self) -> impl Iterator<Item = u32> {
        let start = self.start;
        (0..self.len()).map(move |i| start.wrapping_add(i))
    }
}

/// What the sender does on the new queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SenderPlan {
    /// Receives whose slot end landed but whose completion was lost: complete them here.
    pub complete: SeqRange,
    /// Receives whose data writes and slot end are posted again, in order (then the partly
    /// matched head receive's data writes).
    pub replay: SeqRange,
    /// The receiver moved the lane to another device: its buffers' keys in the clear-to-send
    /// entries this end consumed are replaced by these (every one must be there). `None`: the
    /// keys stay.
    pub peer_keys: Option<KeyMap>,
}

/// Memory keys pairs (a buffer's key on the lane's old device, its key on the new one), at most
/// [`MAX_KEY_PAIRS`]: what a receiver that moved a lane to another device tells the sender.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct KeyMap {
    pairs: [(u32, u32); MAX_KEY_PAIRS],
    len: u8,
}

/// Key pairs a rekeyed receiver may send for one lane: four key reports. More registrations
/// behind one lane's outstanding receives than this and the failover gives up.
pub const MAX_KEY_PAIRS: usize = 4 * KEYS_PER_REPORT;

impl KeyMap {
    /// No pairs.
    pub const EMPTY: Self = Self {
        pairs: [(0, 0); MAX_KEY_PAIRS],
        len: 0,
    };

    /// Add `old` → `new` (a pair already there is kept once); false when full.
    pub fn insert(&mut self, old: u32, new: u32) -> bool {
        if self.get(old).is_some() {
            return true;
        }
        let Some(slot) = self.pairs.get_mut(usize::from(self.len)) else {
            return false;
        };
        *slot = (old, new);
        self.len += 1;
        true
    }

    /// The new key of `old`.
    pub fn get(&self, old: u32) -> Option<u32> {
        self.pairs()
            .iter()
            .find(|(o, _)| *o == old)
            .map(|(_, n)| *n)
    }

    /// The pairs.
    pub fn pairs(&self) -> &[(u32, u32)] {
        &self.pairs[..usize::from(self.len)]
    }

    /// How many pairs.
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl fmt::Debug for KeyMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.pairs().iter().copied()).finish()
    }
}

/// What changes when a lane moves to another device (another protection domain), handed to a
/// lane's `failover_replay`.
#[derive(Clone, Copy)]
pub struct Rekey<'a> {
    /// The peer's inbound region as its new queue pair serves it (its key changes when the peer
    /// moved to another device; the same as before otherwise).
    pub peer_region: crate::nic::RemoteRegion,
    /// This end moved to another device: its memory keys of the old device to those of the new
    /// one (`None`: a key without a registration there, which fails the replay). `None`: the
    /// keys stay.
    pub local: Option<&'a dyn Fn(u32) -> Option<u32>>,
}

impl fmt::Debug for Rekey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rekey")
            .field("peer_region", &self.peer_region)
            .field("local", &self.local.is_some())
            .finish()
    }
}

impl Rekey<'_> {
    /// Keys unchanged, the peer's region `peer_region`.
    pub fn same(peer_region: crate::nic::RemoteRegion) -> Self {
        Self {
            peer_region,
            local: None,
        }
    }

    /// This end's key `key` on the lane's new device.
    pub(super) fn local_key(&self, key: u32) -> Result<u32, FailoverError> {
        match self.local {
            None => Ok(key),
            Some(map) => map(key).ok_or(FailoverError::Rekey(
                "a buffer of the lane is not registered on the device it moves to",
            )),
        }
    }
}

impl SenderPlan {
    /// The receiver's key `key` of a consumed entry, on the lane's new device.
    pub(super) fn peer_key(&self, key: u32) -> Result<u32, FailoverError> {
        match &self.peer_keys {
            None => Ok(key),
            Some(map) => map.get(key).ok_or(FailoverError::Rekey(
                "the receiver did not say a consumed entry's key on its new device",
            )),
        }
    }
}

/// What the receiver does on the new queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReceiverPlan {
    /// Receives whose clear-to-send entries are written again (the sender had not consumed
    /// them: they may not have landed).
    pub rewrite: SeqRange,
}

/// Either end's plan.
// A sender's plan carries the peer's key map inline (a few hundred bytes, off the hot path:
// one per lane failed over), so a plan stays `Copy`.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// This end sends.
    Sender(SenderPlan),
    /// This end receives.
    Receiver(ReceiverPlan),
}

/// `x` lies in `lo..=hi`, all wrapping, the span at most [`SLOTS`].
fn within(lo: u32, x: u32, hi: u32) -> bool {
    let span = hi.wrapping_sub(lo);
    span as usize <= SLOTS && x.wrapping_sub(lo) <= span
}

/// The sender's replay from its own state and the receiver's report (untrusted).
pub fn plan_sender(
    lane: u8,
    own: SenderSnapshot,
    peer: ReceiverSnapshot,
) -> Result<SenderPlan, FailoverError> {
    if own.eager || peer.eager {
        return Err(FailoverError::Eager);
    }
    let bad = |why| Err(FailoverError::Inconsistent { lane, why });
    if !within(own.acked, peer.oldest, own.ended) {
        return bad("its oldest receive is outside the slot ends posted and not acknowledged");
    }
    if !within(
        own.ended,
        peer.announced,
        own.acked.wrapping_add(SLOTS as u32),
    ) {
        return bad("it announced fewer receives than were consumed, or more than fit");
    }
    Ok(SenderPlan {
        complete: SeqRange {
            start: own.acked,
            end: peer.oldest,
        },
        replay: SeqRange {
            start: peer.oldest,
            end: own.ended,
        },
        peer_keys: None,
    })
}

/// The receiver's replay from its own state and the sender's report (untrusted).
pub fn plan_receiver(
    lane: u8,
    own: ReceiverSnapshot,
    peer: SenderSnapshot,
) -> Result<ReceiverPlan, FailoverError> {
    if own.eager || peer.eager {
        return Err(FailoverError::Eager);
    }
    let bad = |why| Err(FailoverError::Inconsistent { lane, why });
    if !within(own.oldest, peer.ended, own.announced) {
        return bad("it ended receives whose entries were never written, or before the oldest");
    }
    if !within(peer.acked, own.oldest, peer.ended) {
        return bad("it acknowledged slot ends whose data has not arrived");
    }
    Ok(ReceiverPlan {
        rewrite: SeqRange {
            start: peer.ended,
            end: own.announced,
        },
    })
}

/// Work done by a replay (for the statistics).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Replayed {
    /// Receives completed locally, replayed or re-announced.
    pub receives: u32,
    /// Work requests posted on the new queue pair.
    pub work_requests: u32,
}

// ---------------------------------------------------------------------------------------------
// Journals.

/// What a sending driver with failover on notes of every send it posts, so a replay can post it
/// again ([`SendJournal::note`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct JournaledSend {
    pub(super) buf: SendBuf,
    pub(super) tag: u32,
    pub(super) offset: u64,
}

/// The local buffers of a lane's posted sends, by request.
#[derive(Clone, Debug)]
pub struct SendJournal {
    sends: Box<[JournaledSend; MAX_REQUESTS]>,
}

impl Default for SendJournal {
    fn default() -> Self {
        Self::new()
    }
}

impl SendJournal {
    /// An empty journal.
    pub fn new() -> Self {
        Self {
            sends: Box::new(
                [JournaledSend {
                    buf: SendBuf {
                        addr: 0,
                        len: 0,
                        lkey: 0,
                    },
                    tag: 0,
                    offset: 0,
                }; MAX_REQUESTS],
            ),
        }
    }

    /// Send `req` (as `isend`/`isend_at` returned it) wrote `buf` tagged `tag` at byte `offset`
    /// of its receive buffer (0 unless a multi-QP driver split the message).
    pub fn note(&mut self, req: RequestId, buf: SendBuf, tag: u32, offset: u64) {
        self.sends[usize::from(req.index())] = JournaledSend { buf, tag, offset };
    }

    pub(super) fn get(&self, req: u8) -> JournaledSend {
        self.sends[usize::from(req)]
    }

    /// The lane moved to another device: every local key `new_key` knows becomes its new key
    /// (so a later move maps from this device's keys).
    pub(super) fn rekey(&mut self, new_key: &dyn Fn(u32) -> Option<u32>) {
        for sent in self.sends.iter_mut() {
            if let Some(key) = new_key(sent.buf.lkey) {
                sent.buf.lkey = key;
            }
        }
    }
}

/// What a receiving driver with failover on notes of every receive it posts.
#[derive(Clone, Copy, Debug)]
pub(super) struct JournaledRecv {
    pub(super) n: u8,
    pub(super) bufs: [(RecvBuf, u32); MAX_RECVS],
}

/// The buffers and tags of a lane's posted receives, by FIFO slot.
#[derive(Clone, Debug)]
pub struct RecvJournal {
    recvs: Box<[JournaledRecv; SLOTS]>,
}

impl Default for RecvJournal {
    fn default() -> Self {
        Self::new()
    }
}

impl RecvJournal {
    /// An empty journal.
    pub fn new() -> Self {
        let none = RecvBuf {
            addr: 0,
            len: 0,
            rkey: 0,
            host: false,
        };
        Self {
            recvs: Box::new(
                [JournaledRecv {
                    n: 0,
                    bufs: [(none, 0); MAX_RECVS],
                }; SLOTS],
            ),
        }
    }

    /// Receive `req` (as `irecv` returned it) posted `bufs` tagged `tags` (as passed to it).
    pub fn note(&mut self, req: RequestId, bufs: &[RecvBuf], tags: &[u32]) {
        let entry = &mut self.recvs[usize::from(req.index())];
        if let ([buf], [tag]) = (bufs, tags) {
            // NCCL's point-to-point receive: one buffer.
            entry.n = 1;
            entry.bufs[0] = (*buf, *tag);
            return;
        }
        entry.n = bufs.len().min(MAX_RECVS) as u8;
        // Indexed (a zip of three iterators cost the data path more than the copy itself).
        let n = usize::from(entry.n).min(tags.len());
        for i in 0..n {
            entry.bufs[i] = (bufs[i], tags[i]);
        }
    }

    /// The lane moved to another device: every remote key `new_key` knows becomes its new key
    /// (so a later move maps from this device's keys).
    pub(super) fn rekey(&mut self, new_key: &dyn Fn(u32) -> Option<u32>) {
        for recv in self.recvs.iter_mut() {
            for (buf, _) in recv.bufs.iter_mut().take(usize::from(recv.n)) {
                if let Some(key) = new_key(buf.rkey) {
                    buf.rkey = key;
                }
            }
        }
    }

    /// The clear-to-send entries receive `seq` wrote, rebuilt (as `irecv` built them with eager
    /// off), or `None` when the journal's slot holds another group size.
    pub(super) fn entries(&self, seq: u32, n: u8) -> Option<[CtsEntry; MAX_RECVS]> {
        let entry = &self.recvs[usize::from(seq as u8)];
        if entry.n != n {
            return None;
        }
        let mut out = [CtsEntry::default(); MAX_RECVS];
        for (i, (buf, tag)) in entry.bufs.iter().take(usize::from(n)).enumerate() {
            out[i] = CtsEntry {
                addr: buf.addr,
                size: buf.len,
                rkey: buf.rkey,
                tag: *tag,
                n,
                index: i as u8,
                eager_ok: false,
                stamp: stamp_for(seq),
            };
        }
        Some(out)
    }
}

// ---------------------------------------------------------------------------------------------
// The tripwire.

/// What a lane's completion queue reported since its queue pair failed ([`Guarded`]).
///
/// Unarmed (failover not negotiated on the connection, and [`Default`]), it passes every
/// completion, failed ones too, to the core as if it were not there; armed, the first failed
/// completion and everything after it are the tripwire's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tripwire {
    /// Whether it screens completions at all.
    pub armed: bool,
    /// The first failed completion.
    pub first: Option<Completion>,
    /// Failed completions seen, the first one included.
    pub failed: u32,
    /// The marker send's flush was seen.
    pub send_marker: bool,
    /// The marker receive's flush was seen.
    pub recv_marker: bool,
    /// A successful completion came after the first failed one.
    pub success_after: bool,
    /// The markers are posted (by the lane's `failover_quiesce`).
    pub markers_posted: bool,
}

impl Tripwire {
    /// A tripwire that has seen nothing, screening completions when `armed`.
    pub fn new(armed: bool) -> Self {
        Self {
            armed,
            ..Self::default()
        }
    }

    /// Whether the queue pair failed.
    pub fn tripped(&self) -> bool {
        self.first.is_some()
    }

    /// Screen polled completions `batch`: how many of them, from the front, the core may see
    /// (all when unarmed; armed, the successes before the first failure, the rest being the
    /// tripwire's).
    #[inline]
    fn screen(&mut self, batch: &[Completion]) -> usize {
        if !self.armed {
            return batch.len();
        }
        let mut passed = 0;
        for c in batch {
            if self.tripped() {
                self.absorb(c);
            } else if c.status.is_success() {
                // Before the first failure: successes are a prefix of the batch.
                passed += 1;
            } else {
                self.first = Some(*c);
                self.absorb(c);
            }
        }
        passed
    }

    fn absorb(&mut self, c: &Completion) {
        if c.status.is_success() {
            self.success_after = true;
            return;
        }
        self.failed += 1;
        // By `wr_id` alone: a failed completion carries no opcode, and a backend that tells the
        // queue apart by the core's `wr_id` layout cannot place the markers' (see `classify`).
        match c.wr_id {
            MARKER_SEND_WR_ID => self.send_marker = true,
            MARKER_RECV_WR_ID => self.recv_marker = true,
            _ => {}
        }
    }
}

/// A lane's NIC as the core sees it: with its [`Tripwire`] armed (failover on), completions pass
/// until the first failed one, which (with everything after it) goes to the tripwire instead,
/// so the core's connection stays healthy and its requests outstanding while the failover
/// machine decides. Unarmed, it is the NIC. It owns its NIC: wrap a `&mut` to keep the NIC
/// elsewhere.
#[derive(Debug)]
pub struct Guarded<N: Nic> {
    /// The lane's queue pair.
    pub nic: N,
    /// Its tripwire.
    pub trip: Tripwire,
}

impl<N: Nic> Guarded<N> {
    /// `nic` behind a fresh tripwire, armed when failover is on.
    pub fn new(nic: N, armed: bool) -> Self {
        Self {
            nic,
            trip: Tripwire::new(armed),
        }
    }
}

impl<N: Nic> Guarded<N> {
    /// [`Nic::poll_take`] once the tripwire tripped: everything goes to it (a call of its own,
    /// off the path every poll inlines).
    #[cold]
    #[inline(never)]
    fn poll_tripped(&mut self, out: &mut [Completion]) -> Result<(usize, usize), NicError> {
        let got = self.nic.poll(out)?;
        self.trip.screen(&out[..got]);
        Ok((got, 0))
    }

    /// [`Nic::poll_take`] with the tripwire armed: only successes are offered while nothing has
    /// failed; once tripped, everything goes to the tripwire.
    #[inline(always)]
    fn poll_armed(
        &mut self,
        out: &mut [Completion],
        mut take: impl FnMut(&Completion) -> bool,
    ) -> Result<(usize, usize), NicError> {
        if self.trip.tripped() {
            return self.poll_tripped(out);
        }
        // Armed, nothing failed yet: only successes are offered.
        let (got, left) = self
            .nic
            .poll_take(out, |c| c.status.is_success() && take(c))?;
        if left == 0 {
            // Everything polled was taken (the common case): nothing for the tripwire.
            return Ok((got, 0));
        }
        let passed = self.trip.screen(&out[..left.min(out.len())]);
        Ok((got, passed))
    }
}

impl<N: Nic> Nic for Guarded<N> {
    #[inline(always)]
    fn max_inline(&self) -> usize {
        self.nic.max_inline()
    }

    #[inline(always)]
    fn post_send(&mut self, chain: &[SendWr<'_>]) -> Result<(), NicError> {
        self.nic.post_send(chain)
    }

    #[inline(always)]
    fn post_recv(&mut self, wr_id: u64) -> Result<(), NicError> {
        self.nic.post_recv(wr_id)
    }

    #[inline(always)]
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize, NicError> {
        let got = self.nic.poll(out)?;
        Ok(self.trip.screen(&out[..got]))
    }

    /// The backend's own fast path stays (armed, it takes only successes while nothing failed).
    /// Two inlined copies of the backend's poll (unarmed, armed); the tripped case, rare, is a
    /// call of its own (inlined, it made a third copy in every caller: 44 KB of the library).
    #[inline(always)]
    fn poll_take(
        &mut self,
        out: &mut [Completion],
        take: impl FnMut(&Completion) -> bool,
    ) -> Result<(usize, usize), NicError> {
        // Unarmed: the backend's own poll, `take` unwrapped (the completion stays in registers).
        if !self.trip.armed {
            return self.nic.poll_take(out, take);
        }
        self.poll_armed(out, take)
    }

    /// As [`poll_take`](Nic::poll_take); unarmed, the backend's path for one completion.
    #[inline(always)]
    fn poll_take_expect_one(
        &mut self,
        out: &mut [Completion],
        take: impl FnMut(&Completion) -> bool,
    ) -> Result<(usize, usize), NicError> {
        if !self.trip.armed {
            return self.nic.poll_take_expect_one(out, take);
        }
        self.poll_armed(out, take)
    }

    #[inline(always)]
    fn read_inbound_stamped<const M: usize>(&self, offset: usize) -> (u32, [u8; M]) {
        self.nic.read_inbound_stamped::<M>(offset)
    }

    #[inline(always)]
    fn read_inbound(&self, offset: usize, out: &mut [u8]) {
        self.nic.read_inbound(offset, out);
    }

    #[inline(always)]
    fn write_staging(&mut self, offset: usize, bytes: &[u8]) {
        self.nic.write_staging(offset, bytes);
    }

    #[inline(always)]
    fn deliver_inbound(&mut self, offset: usize, len: usize, dst: u64) {
        self.nic.deliver_inbound(offset, len, dst);
    }

    fn write_inbound(&mut self, offset: usize, bytes: &[u8]) {
        self.nic.write_inbound(offset, bytes);
    }
}

// ---------------------------------------------------------------------------------------------
// The decision machine.

/// Which end of the connection this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The sending end (its lanes are [`SendConn`](super::SendConn)s).
    Sender,
    /// The receiving end (its lanes are [`RecvConn`](super::RecvConn)s).
    Receiver,
}

/// One end's failover settings and topology.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailoverConfig {
    /// `NCCL_IB_RESILIENCY_PORT_FAILOVER`.
    pub enabled: bool,
    /// `NCCL_IB_RESILIENCY_PORT_FAILOVER_MAX_ATTEMPTS`: port failures survived at most.
    pub max_attempts: u32,
    /// How long the peer has to answer.
    pub timeout: Duration,
    /// Per port of the fused device, the device it belongs to (at most [`MAX_PORTS`] ports).
    pub port_devices: Vec<u8>,
    /// Per lane, the port its queue pair uses (at most [`MAX_LANES`] lanes).
    pub lane_ports: Vec<u8>,
}

impl FailoverConfig {
    /// Off, with `lanes` lanes on one port (what a connection without failover has).
    pub fn off(lanes: usize) -> Self {
        Self {
            enabled: false,
            max_attempts: 1,
            timeout: DEFAULT_TIMEOUT,
            port_devices: alloc::vec![0],
            lane_ports: alloc::vec![0; lanes],
        }
    }
}

/// What the driver must do next ([`Failover::poll_action`]).
// A replay's plan is large (see `Plan`); actions are few and off the hot path.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Stop posting on the lane, move its old queue pair to the error state, and call the lane's
    /// `failover_quiesce` until it says quiesced, then [`Failover::handle_quiesced`].
    QuiesceLane {
        /// The lane.
        lane: u8,
    },
    /// Create the lane's new queue pair on `port` (not connected yet), then
    /// [`Failover::handle_qp_created`] with its info.
    CreateQp {
        /// The lane.
        lane: u8,
        /// The port of the fused device to create it on.
        port: u8,
    },
    /// Send these bytes to the peer over the handshake socket.
    SendReport(Report),
    /// Connect the new queue pair to the peer's (`peer_qp`), swap it in, run the lane's
    /// `failover_replay` with `plan`, then [`Failover::handle_replayed`].
    Replay {
        /// The lane.
        lane: u8,
        /// What to replay.
        plan: Plan,
        /// The peer's new queue pair.
        peer_qp: QpInfo,
    },
    /// The lane is whole again: resume posting on it.
    Resume {
        /// The lane.
        lane: u8,
    },
    /// Failover is impossible: fail the connection (every lane's `handle_fatal`) with `cause`,
    /// as without failover, and log `reason`.
    GiveUp {
        /// What the connection fails with.
        cause: DataError,
        /// Why it was not failed over.
        reason: FailoverError,
    },
}

/// Failover statistics of one connection end (the WARN line, `rivet info --stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FailoverStats {
    /// Lanes failed over.
    pub failovers: u32,
    /// Receives replayed, completed locally or re-announced.
    pub receives_replayed: u64,
    /// Work requests posted by replays.
    pub work_requests_replayed: u64,
    /// Time from the first sign to the lane resuming, summed over failovers.
    pub total_time: Duration,
    /// The longest one.
    pub max_time: Duration,
}

impl fmt::Display for FailoverStats {
    /// The WARN line's and `rivet info --stats`' words.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} lane failover(s), {} receive(s) and {} work request(s) replayed, {} in all, \
             longest {}",
            self.failovers,
            self.receives_replayed,
            self.work_requests_replayed,
            self.total_time,
            self.max_time
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Quiescing the old queue pair.
    Quiescing,
    /// Own state known; the new queue pair being created.
    Creating,
    /// Own report sent; waiting for the peer's.
    Exchanging,
    /// Replaying on the new queue pair.
    Replaying,
}

#[derive(Clone, Copy, Debug)]
struct Failing {
    stage: Stage,
    port: u8,
    since: Instant,
    deadline: Instant,
    own: Option<ReportBody>,
    peer: Option<Report>,
    attempt: u8,
    /// What the connection fails with if this failover gives up.
    cause: DataError,
    /// The lane moves to a port of another device (its memory keys change).
    rekeyed: bool,
    /// Key pairs the peer (a rekeyed receiver) sent so far, and how many key reports of it came.
    peer_keys: KeyMap,
    peer_key_reports: u8,
}

/// One end's failover decision machine for one connection.
#[derive(Debug)]
pub struct Failover {
    role: Role,
    config: FailoverConfig,
    /// Per lane, its failover in progress.
    lanes: Vec<Option<Failing>>,
    /// Per port: a `PORT_ERR` was seen and no `PORT_ACTIVE` since.
    port_down: Vec<bool>,
    /// Per port: a queue pair on it failed (for good: recovery is not built).
    port_failed: Vec<bool>,
    attempts: u32,
    actions: VecDeque<Action>,
    stats: FailoverStats,
    gave_up: Option<FailoverError>,
}

impl Failover {
    /// The machine of one end of a connection. Lanes whose port is outside `port_devices` are
    /// clamped to port 0 (a driver bug, not the peer's input).
    pub fn new(role: Role, mut config: FailoverConfig) -> Self {
        config.port_devices.truncate(MAX_PORTS);
        if config.port_devices.is_empty() {
            config.port_devices.push(0);
        }
        config.lane_ports.truncate(MAX_LANES);
        let ports = config.port_devices.len();
        for port in &mut config.lane_ports {
            if usize::from(*port) >= ports {
                *port = 0;
            }
        }
        Self {
            role,
            lanes: alloc::vec![None; config.lane_ports.len()],
            port_down: alloc::vec![false; ports],
            port_failed: alloc::vec![false; ports],
            config,
            attempts: 0,
            actions: VecDeque::new(),
            stats: FailoverStats::default(),
            gave_up: None,
        }
    }

    /// The statistics so far.
    pub fn stats(&self) -> FailoverStats {
        self.stats
    }

    /// Why it gave up, if it did.
    pub fn gave_up(&self) -> Option<FailoverError> {
        self.gave_up
    }

    /// The port lane `lane` uses now.
    pub fn lane_port(&self, lane: u8) -> Option<u8> {
        self.config.lane_ports.get(usize::from(lane)).copied()
    }

    /// Whether `lane`'s failover under way moves it to a port of another device (its memory
    /// keys and control regions must be registered there anew, and a receiver tells the sender
    /// its new keys: [`handle_qp_created`](Self::handle_qp_created)).
    pub fn moves_device(&self, lane: u8) -> bool {
        matches!(self.lanes.get(usize::from(lane)), Some(Some(f)) if f.rekeyed)
    }

    /// Whether `lane` is failing over (the driver must not post on it).
    pub fn is_failing(&self, lane: u8) -> bool {
        self.lanes
            .get(usize::from(lane))
            .is_some_and(|l| l.is_some())
    }

    /// The next thing to do.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// When [`handle_timeout`](Self::handle_timeout) must next be called.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.lanes.iter().flatten().map(|f| f.deadline).min()
    }

    /// Time passed: a lane whose peer has not answered by its deadline gives up.
    pub fn handle_timeout(&mut self, now: Instant) {
        let late = self
            .lanes
            .iter()
            .enumerate()
            .find(|(_, f)| f.is_some_and(|f| now >= f.deadline));
        if let Some((lane, _)) = late {
            self.give_up(
                DataError::PeerLost,
                FailoverError::Timeout {
                    lane: lane as u8,
                    after: self.config.timeout,
                },
            );
        }
    }

    /// A port event of the device (`PORT_ERR`: `up` false; `PORT_ACTIVE`: true).
    pub fn handle_port_event(&mut self, port: u8, up: bool) {
        if let Some(down) = self.port_down.get_mut(usize::from(port)) {
            *down = !up;
        }
    }

    /// A lane's tripwire caught failed completion `c` (its first).
    pub fn handle_completion_error(&mut self, lane: u8, c: &Completion, now: Instant) {
        let cause = super::completion_error(c);
        if self.gave_up.is_some() {
            return;
        }
        let Some(&port) = self.config.lane_ports.get(usize::from(lane)) else {
            return self.give_up(cause, FailoverError::Lane(lane));
        };
        if self.is_failing(lane) {
            // The old queue pair's flushes, or a second error of it: expected.
            return;
        }
        if !self.config.enabled {
            return self.give_up(cause, FailoverError::Disabled);
        }
        let port_attributable = c.status == WcStatus::RETRY_EXC_ERR
            || (c.status == WcStatus::WR_FLUSH_ERR && self.port_down[usize::from(port)]);
        if !port_attributable {
            return self.give_up(cause, FailoverError::NotSurvivable(c.status));
        }
        self.begin(lane, true, cause, now, None);
    }

    /// A report from the peer arrived on the socket (`bytes` as read: untrusted).
    pub fn handle_peer(&mut self, bytes: &[u8], now: Instant) {
        if self.gave_up.is_some() {
            return;
        }
        let report = match Report::decode(bytes) {
            Ok(r) => r,
            Err(err) => {
                let cause = DataError::Protocol(super::ProtocolError::FailoverReport);
                return self.give_up(cause, FailoverError::BadReport(err));
            }
        };
        let lane = report.lane;
        if usize::from(lane) >= self.lanes.len() {
            return self.give_up(DataError::PeerLost, FailoverError::Lane(lane));
        }
        let expected_peer = match (self.role, report.body) {
            (_, ReportBody::Refusal(why)) => {
                return self.give_up(DataError::PeerLost, FailoverError::PeerRefused(why));
            }
            (Role::Sender, ReportBody::Keys(chunk)) => return self.handle_keys(lane, chunk),
            (Role::Sender, ReportBody::Receiver(_)) | (Role::Receiver, ReportBody::Sender(_)) => {
                true
            }
            _ => false,
        };
        if !expected_peer {
            return self.give_up(
                DataError::PeerLost,
                FailoverError::Inconsistent {
                    lane,
                    why: "it reported the same role as this end",
                },
            );
        }
        match &mut self.lanes[usize::from(lane)] {
            Some(failing) => {
                if failing.peer.is_some() {
                    return self.give_up(
                        DataError::PeerLost,
                        FailoverError::Inconsistent {
                            lane,
                            why: "two reports for one failover",
                        },
                    );
                }
                failing.peer = Some(report);
                self.decide(lane);
            }
            None => {
                if !self.config.enabled {
                    self.actions
                        .push_back(Action::SendReport(refusal(lane, Refusal::Disabled)));
                    return self.give_up(DataError::PeerLost, FailoverError::Disabled);
                }
                self.begin(lane, false, DataError::PeerLost, now, Some(report));
            }
        }
    }

    /// A rekeyed receiver's key report for `lane`.
    fn handle_keys(&mut self, lane: u8, chunk: KeyChunk) {
        let inconsistent = |why| FailoverError::Inconsistent { lane, why };
        let Some(Some(failing)) = self.lanes.get_mut(usize::from(lane)) else {
            return self.give_up(
                DataError::PeerLost,
                inconsistent("keys for a lane that is not failing over"),
            );
        };
        let expected = failing.peer.map_or(0, |p| p.keys);
        if failing.peer_key_reports >= expected {
            return self.give_up(
                DataError::PeerLost,
                inconsistent("more key reports than its report said"),
            );
        }
        failing.peer_key_reports += 1;
        for &(old, new) in chunk.pairs() {
            if !failing.peer_keys.insert(old, new) {
                return self.give_up(DataError::PeerLost, inconsistent("too many keys"));
            }
        }
        self.decide(lane);
    }

    /// The lane's old queue pair is quiesced: `body` is its state (from the lane's
    /// `failover_snapshot`).
    pub fn handle_quiesced(&mut self, lane: u8, body: ReportBody) {
        if self.gave_up.is_some() {
            return;
        }
        let Some(Some(failing)) = self.lanes.get_mut(usize::from(lane)) else {
            return;
        };
        if failing.stage != Stage::Quiescing {
            return;
        }
        failing.own = Some(body);
        failing.stage = Stage::Creating;
        let port = failing.port;
        self.actions.push_back(Action::CreateQp { lane, port });
    }

    /// The lane's new queue pair exists: `info` is what the peer needs to connect to it. A
    /// receiver whose lane moves to another device ([`moves_device`](Self::moves_device)) passes
    /// `keys`: for every key of the receives the sender may have consumed (those from the
    /// oldest on), its key on the new device; the sender needs them to replay. Otherwise empty.
    pub fn handle_qp_created(&mut self, lane: u8, info: QpInfo, keys: &KeyMap) {
        if self.gave_up.is_some() {
            return;
        }
        let Some(Some(failing)) = self.lanes.get_mut(usize::from(lane)) else {
            return;
        };
        let (Stage::Creating, Some(body)) = (failing.stage, failing.own) else {
            return;
        };
        failing.stage = Stage::Exchanging;
        let send_keys = failing.rekeyed && self.role == Role::Receiver;
        let keys = if send_keys { keys.pairs() } else { &[] };
        let report = Report {
            lane,
            attempt: failing.attempt,
            body,
            qp_info: info,
            port: Some(failing.port),
            rekeyed: failing.rekeyed,
            keys: keys.len().div_ceil(KEYS_PER_REPORT) as u8,
        };
        let attempt = failing.attempt;
        self.actions.push_back(Action::SendReport(report));
        for chunk in keys.chunks(KEYS_PER_REPORT) {
            let Some(chunk) = KeyChunk::new(chunk) else {
                continue;
            };
            self.actions.push_back(Action::SendReport(Report {
                lane,
                attempt,
                body: ReportBody::Keys(chunk),
                qp_info: QpInfo::EMPTY,
                port: None,
                rekeyed: false,
                keys: 0,
            }));
        }
        self.decide(lane);
    }

    /// The lane's replay is posted (`Ok`) or failed.
    pub fn handle_replayed(
        &mut self,
        lane: u8,
        done: Result<Replayed, FailoverError>,
        now: Instant,
    ) {
        if self.gave_up.is_some() {
            return;
        }
        let Some(slot) = self.lanes.get_mut(usize::from(lane)) else {
            return;
        };
        let Some(failing) = *slot else {
            return;
        };
        let replayed = match done {
            Ok(r) => r,
            Err(reason) => return self.handle_lane_error(lane, reason),
        };
        *slot = None;
        self.config.lane_ports[usize::from(lane)] = failing.port;
        let took = now.saturating_duration_since(failing.since);
        let s = &mut self.stats;
        s.failovers += 1;
        s.receives_replayed += u64::from(replayed.receives);
        s.work_requests_replayed += u64::from(replayed.work_requests);
        s.total_time = Duration::from_nanos(s.total_time.as_nanos() + took.as_nanos());
        s.max_time = s.max_time.max(took);
        self.actions.push_back(Action::Resume { lane });
    }

    /// The lane's `failover_quiesce` or `failover_replay` failed with `reason`.
    pub fn handle_lane_error(&mut self, lane: u8, reason: FailoverError) {
        let cause = match (reason, self.lanes.get(usize::from(lane))) {
            (FailoverError::Local(err), _) => err,
            (_, Some(Some(failing))) => failing.cause,
            _ => DataError::Protocol(super::ProtocolError::FailoverReport),
        };
        self.give_up(cause, reason);
    }

    /// Start failing `lane` over: check the limits, pick a port.
    fn begin(
        &mut self,
        lane: u8,
        port_failed_here: bool,
        cause: DataError,
        now: Instant,
        peer: Option<Report>,
    ) {
        let old_port = self.config.lane_ports[usize::from(lane)];
        if port_failed_here && !self.port_failed[usize::from(old_port)] {
            // A port's first failure is one attempt; its other lanes follow it for free.
            if self.attempts >= self.config.max_attempts {
                return self.give_up(
                    cause,
                    FailoverError::AttemptsExhausted {
                        max: self.config.max_attempts,
                    },
                );
            }
            self.attempts += 1;
            self.port_failed[usize::from(old_port)] = true;
        }
        let mut failed_devices = 0u32;
        let mut seen = [false; 256];
        for (port, &device) in self.config.port_devices.iter().enumerate() {
            if self.port_failed[port] && !seen[usize::from(device)] {
                seen[usize::from(device)] = true;
                failed_devices += 1;
            }
        }
        if failed_devices > 1 {
            return self.give_up(
                cause,
                FailoverError::DevicesFailed {
                    failed: failed_devices,
                },
            );
        }
        let usable =
            |p: usize| p < self.port_failed.len() && !self.port_failed[p] && !self.port_down[p];
        let device = |p: u8| self.config.port_devices.get(usize::from(p)).copied();
        // The peer moved first: follow it to its port where this end can. Both new queue pairs
        // must share a rail (a port index of the fused device), and a link cut at one end only
        // leaves the other end's port up. Otherwise the peer's port may be the one that
        // failed: then this end's own port still serves, or else the first one usable.
        let peer_port = peer
            .and_then(|r| r.port)
            .filter(|&p| usable(usize::from(p)));
        let port = if let Some(p) = peer_port {
            Some(p)
        } else if usable(usize::from(old_port)) {
            Some(old_port)
        } else {
            (0..self.port_devices_len())
                .find(|&p| usable(p))
                .map(|p| p as u8)
        };
        let Some(port) = port else {
            return self.give_up(cause, FailoverError::NoSurvivingPort);
        };
        let attempt = self.attempts.clamp(1, 255) as u8;
        let rekeyed = device(old_port) != device(port);
        self.lanes[usize::from(lane)] = Some(Failing {
            stage: Stage::Quiescing,
            port,
            since: now,
            deadline: now + self.config.timeout,
            own: None,
            peer,
            attempt,
            cause,
            rekeyed,
            peer_keys: KeyMap::EMPTY,
            peer_key_reports: 0,
        });
        self.actions.push_back(Action::QuiesceLane { lane });
    }

    fn port_devices_len(&self) -> usize {
        self.config.port_devices.len()
    }

    /// Both reports are in: plan the replay, or give up on a report that cannot be true.
    fn decide(&mut self, lane: u8) {
        let Some(Some(failing)) = self.lanes.get_mut(usize::from(lane)) else {
            return;
        };
        let (Stage::Exchanging, Some(own), Some(peer)) = (failing.stage, failing.own, failing.peer)
        else {
            return;
        };
        if failing.peer_key_reports < peer.keys {
            // A rekeyed receiver's keys are still on their way.
            return;
        }
        let peer_keys = peer.rekeyed.then_some(failing.peer_keys);
        let plan = match (own, peer.body) {
            (ReportBody::Sender(own), ReportBody::Receiver(peer)) => plan_sender(lane, own, peer)
                .map(|plan| Plan::Sender(SenderPlan { peer_keys, ..plan })),
            (ReportBody::Receiver(own), ReportBody::Sender(peer)) => {
                plan_receiver(lane, own, peer).map(Plan::Receiver)
            }
            _ => Err(FailoverError::Inconsistent {
                lane,
                why: "it reported the same role as this end",
            }),
        };
        match plan {
            Ok(plan) => {
                failing.stage = Stage::Replaying;
                self.actions.push_back(Action::Replay {
                    lane,
                    plan,
                    peer_qp: peer.qp_info,
                });
            }
            Err(reason) => {
                let cause = DataError::Protocol(super::ProtocolError::FailoverReport);
                self.give_up(cause, reason);
            }
        }
    }

    fn give_up(&mut self, cause: DataError, reason: FailoverError) {
        if self.gave_up.is_some() {
            return;
        }
        self.gave_up = Some(reason);
        for lane in &mut self.lanes {
            *lane = None;
        }
        if !matches!(
            reason,
            FailoverError::PeerRefused(_) | FailoverError::Disabled
        ) {
            // Tell the peer, so it fails at once rather than at its deadline.
            self.actions
                .push_back(Action::SendReport(refusal(0, Refusal::GaveUp)));
        }
        self.actions.push_back(Action::GiveUp { cause, reason });
    }
}

fn refusal(lane: u8, why: Refusal) -> Report {
    Report {
        lane,
        attempt: 0,
        body: ReportBody::Refusal(why),
        qp_info: QpInfo::EMPTY,
        port: None,
        rekeyed: false,
        keys: 0,
    }
}

#[cfg(test)]
mod tests;
