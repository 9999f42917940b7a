//! Several queue pairs per connection (`NCCL_IB_QPS_PER_CONNECTION`).
//!
//! A multi-QP connection is `qps` single-QP connections ([`SendConn`], [`RecvConn`]), each with
//! its own queue pair, completion queue, clear-to-send FIFO and completion records, driven in
//! lockstep. Each keeps its own send-queue credits and selective signaling; this module owns
//! what spans them: which queue pairs a message uses, and when a message is complete.
//!
//! **Ordering across queue pairs.** Both ends count messages (receives, and the slots the sender
//! ends) the same way, so they pick the same queue pairs without telling each other. In general
//! each receive's messages travel over `width` queue pairs starting at a rotating one (NCCL's
//! `qpIndex`), which moves on by `width` per receive; the two settings NCCL names are its ends:
//! - round-robin ([`QpPolicy::split`] off, NCCL's default): message `k` travels whole on queue
//!   pair `k % qps`; a grouped receive's sends all go to the queue pair of its receive, and the
//!   sender moves on once that queue pair has ended the receive's slot;
//! - split: every message travels on every queue pair. The receiver offers the whole buffer on
//!   each; the sender cuts its payload into `qps` parts of [`split_part`] (NCCL's
//!   `roundup(ceil(len / qps), 128)` chunks, so LL and LL128 lines are never cut) and writes
//!   part `i` at its offset through queue pair `i`. Parts past the end are zero-length sends, so
//!   every queue pair's receive completes;
//! - in between (a fused device of `d` ports without split: `width = d`, one queue pair per port
//!   for each message, as NCCL's IB transport stripes over its `nDataQps`), the receive at
//!   rotation `r` uses queue pairs `r, r + 1, …, r + width - 1` (mod their count) and the message
//!   is cut into `width` parts.
//!
//! Each queue pair is reliable-connected and in order; queue pairs are not ordered against each
//! other (a fabric may deliver queue pair 1's message before queue pair 0's). Nothing here relies
//! on it: a message is complete when every one of its parts is, which each queue pair learns
//! from its own write with immediate (the part's last work request).
//!
//! **Completion.** A request is complete when all its parts completed; its size is the sum of
//! the parts' sizes (the receiver checks that sum against the buffer, since each queue pair
//! only checks its own part). A part refused for size fails the request once every other part
//! is in; any other part error fails every queue pair of the connection (the connection is
//! one unit to NCCL).
//!
//! **Retries.** A part may find its queue pair not ready (`Ok(None)`) after earlier parts were
//! posted. The request is then kept half-posted and the next call, which must be the same
//! `isend`/`irecv` again (NCCL retries the same operation), posts the rest.
//!
//! **Port failover** ([`super::failover`], the [`failover`] submodule): with
//! [`MultiSend::enable_failover`] every part posted is journaled for its lane; a lane being
//! failed over is *blocked* (a message needing it is refused as not ready before any part is
//! posted, and its NIC is not polled), quiesced, snapshotted and replayed through the lane's
//! connection, then resumed.

use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

use super::failover::{RecvJournal, SendJournal};
use super::{
    Completed, Connection, DataError, MAX_RECVS, MAX_REQUESTS, ProtocolError, RecvBuf, RecvConn,
    RequestId, SendBuf, SendConn, Side,
};
use crate::nic::{MAX_WR_BYTES, Nic};

pub mod failover;

/// Most queue pairs per connection (NCCL's bound for `NCCL_IB_QPS_PER_CONNECTION`).
pub const MAX_QPS: usize = 128;
/// Split parts start at multiples of this (LL128 line size).
pub const SPLIT_ALIGN: u64 = 128;
/// `NCCL_IB_AR_THRESHOLD`'s default: sends above it post data and immediate separately when
/// adaptive routing is on.
pub const DEFAULT_AR_THRESHOLD: u64 = 8192;

/// How a connection uses its queue pairs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpPolicy {
    qps: u8,
    split: bool,
    ar_threshold: Option<u64>,
}

/// A setting outside its bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyError {
    /// `NCCL_IB_QPS_PER_CONNECTION` outside 1..=[`MAX_QPS`].
    Qps(i64),
    /// `NCCL_IB_SPLIT_DATA_ON_QPS` not 0 or 1.
    Split(i64),
    /// `NCCL_IB_AR_THRESHOLD` negative.
    ArThreshold(i64),
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Qps(v) => write!(f, "NCCL_IB_QPS_PER_CONNECTION={v} is outside 1..={MAX_QPS}"),
            Self::Split(v) => write!(f, "NCCL_IB_SPLIT_DATA_ON_QPS={v} is not 0 or 1"),
            Self::ArThreshold(v) => write!(f, "NCCL_IB_AR_THRESHOLD={v} is negative"),
        }
    }
}

impl QpPolicy {
    /// One queue pair, whole messages, adaptive routing off: the single-QP connection.
    pub const SINGLE: Self = Self {
        qps: 1,
        split: false,
        ar_threshold: None,
    };

    /// The policy from NCCL's settings: `qps` queue pairs (1..=128), `split` 0 or 1,
    /// `ar_threshold` bytes (≥ 0) used only when `adaptive_routing`.
    pub fn new(
        qps: i64,
        split: i64,
        adaptive_routing: bool,
        ar_threshold: i64,
    ) -> Result<Self, PolicyError> {
        if !(1..=MAX_QPS as i64).contains(&qps) {
            return Err(PolicyError::Qps(qps));
        }
        let split = match split {
            0 => false,
            1 => true,
            other => return Err(PolicyError::Split(other)),
        };
        if ar_threshold < 0 {
            return Err(PolicyError::ArThreshold(ar_threshold));
        }
        Ok(Self {
            qps: qps as u8,
            split,
            ar_threshold: adaptive_routing.then_some(ar_threshold as u64),
        })
    }

    /// Queue pairs per connection.
    pub fn qps(&self) -> usize {
        usize::from(self.qps)
    }

    /// Whether every message is split over all queue pairs.
    pub fn split(&self) -> bool {
        self.split
    }

    /// The adaptive-routing threshold, when adaptive routing is on.
    pub fn ar_threshold(&self) -> Option<u64> {
        self.ar_threshold
    }
}

/// Part `i` of a `len`-byte message split over `parts` queue pairs: `(offset, length)`. Parts
/// are `roundup(ceil(len / parts), 128)` bytes; the last ones may be shorter or empty.
pub fn split_part(len: u64, parts: usize, i: usize) -> (u64, u64) {
    let parts = parts.max(1) as u64;
    let chunk = len.div_ceil(parts).div_ceil(SPLIT_ALIGN) * SPLIT_ALIGN;
    let offset = (chunk * i as u64).min(len);
    (offset, chunk.min(len - offset))
}

/// The GRH flow label for a queue pair connecting `local_qpn` to `remote_qpn` (20 bits, never 0).
///
/// On RoCE v2 the NIC derives the UDP source port from a non-zero flow label, and ECMP hashes on
/// it: giving each queue pair of a connection its own label (from the pair of QP numbers, which
/// differ between the queue pairs) spreads them over the paths. The mix is the kernel's
/// `rdma_calc_flow_label` one (the product of the numbers, folded to 20 bits), so the label is
/// what the kernel would pick for the pair; a product that folds to 0 takes 1.
pub fn flow_label(local_qpn: u32, remote_qpn: u32) -> u32 {
    let mut v = u64::from(local_qpn) * u64::from(remote_qpn);
    v ^= v >> 20;
    v ^= v >> 40;
    ((v & 0xf_ffff) as u32).max(1)
}

/// A set of queue pairs as a bit mask (bit `i`: queue pair `i`).
type QpMask = u128;

const _: () = assert!(MAX_QPS <= QpMask::BITS as usize);

/// One request of a multi-QP connection: its parts still outstanding.
#[derive(Clone, Copy, Debug)]
struct MultiReq {
    generation: u16,
    /// Parts posted and not yet reported by their queue pair.
    pending: QpMask,
    /// Every part is posted.
    posted: bool,
    in_use: bool,
    sizes: [u64; MAX_RECVS],
    n: usize,
    /// The first error a part reported.
    error: Option<DataError>,
}

impl MultiReq {
    const FREE: Self = Self {
        generation: 0,
        pending: 0,
        posted: false,
        in_use: false,
        sizes: [0; MAX_RECVS],
        n: 0,
        error: None,
    };
}

/// The request pool and part bookkeeping both directions share; `A` are the arguments of a
/// call, kept while its request is half posted.
#[derive(Debug)]
struct Parts<A> {
    side: Side,
    qps: usize,
    reqs: Vec<MultiReq>,
    /// `ids[req * qps + qp]`: the queue pair's request for that part.
    ids: Vec<Option<RequestId>>,
    free: Vec<u8>,
    half: Option<HalfPosted<A>>,
}

impl<A: Copy + PartialEq> Parts<A> {
    fn new(side: Side, qps: usize) -> Self {
        Self {
            side,
            qps,
            reqs: vec![MultiReq::FREE; MAX_REQUESTS],
            ids: vec![None; MAX_REQUESTS * qps],
            free: (0..MAX_REQUESTS).rev().map(|i| i as u8).collect(),
            half: None,
        }
    }

    /// The request a call with `args` posts parts of, and the first part left to post: the
    /// half-posted one when this is its retry, else a fresh one (`None`: pool empty).
    fn start(
        &mut self,
        args: A,
        retry_first: &'static str,
    ) -> Result<Option<(u8, usize)>, DataError> {
        match self.half {
            Some(half) if half.args == args => Ok(Some((half.index, half.next_part))),
            Some(_) => Err(DataError::InvalidArgument(retry_first)),
            None => Ok(self.take().map(|index| (index, 0))),
        }
    }

    /// Whether a call with `args` would post a part on a queue pair of `blocked`: the parts
    /// left of the half-posted request when this is its retry, else all `width` of a fresh one
    /// from queue pair `current` on. A retry of another call is not judged here (`start`
    /// refuses it).
    fn needs_blocked(&self, args: A, current: usize, width: usize, blocked: QpMask) -> bool {
        let first = match self.half {
            Some(half) if half.args == args => half.next_part,
            Some(_) => return false,
            None => 0,
        };
        (first..width).any(|part| blocked & (1 << ((current + part) % self.qps)) != 0)
    }

    /// Record what posting part `part` of request `index` on queue pair `qp` gave: `Ok(true)`
    /// posted; `Ok(false)`
    /// not now (the request is kept half posted for the retry of `args`, or freed when none of
    /// it is posted yet); an error frees it (NCCL never sees its id; parts already posted stay
    /// with their queue pairs, which the caller fails).
    fn part_posted(
        &mut self,
        index: u8,
        (qp, part): (usize, usize),
        outcome: Result<Option<RequestId>, DataError>,
        args: A,
    ) -> Result<bool, DataError> {
        match outcome {
            Ok(Some(id)) => {
                self.add(index, qp, id);
                Ok(true)
            }
            Ok(None) => {
                // NCCL cannot test a request it has no id of: no part of it completed yet.
                if self.reqs[usize::from(index)].pending == 0 {
                    self.half = None;
                    self.release(index);
                } else {
                    self.half = Some(HalfPosted {
                        index,
                        next_part: part,
                        args,
                    });
                }
                Ok(false)
            }
            Err(err) => {
                self.half = None;
                self.release(index);
                Err(err)
            }
        }
    }

    /// Every part of `index` is posted: its id for NCCL.
    fn posted(&mut self, index: u8) -> RequestId {
        self.half = None;
        self.reqs[usize::from(index)].posted = true;
        self.id(index)
    }

    fn take(&mut self) -> Option<u8> {
        let index = self.free.pop()?;
        let req = &mut self.reqs[usize::from(index)];
        req.in_use = true;
        req.posted = false;
        req.pending = 0;
        req.sizes = [0; MAX_RECVS];
        req.n = 0;
        req.error = None;
        Some(index)
    }

    fn add(&mut self, index: u8, qp: usize, id: RequestId) {
        self.ids[usize::from(index) * self.qps + qp] = Some(id);
        self.reqs[usize::from(index)].pending |= 1 << qp;
    }

    fn id(&self, index: u8) -> RequestId {
        RequestId::new(index, self.side, self.reqs[usize::from(index)].generation)
    }

    fn lookup(&self, req: RequestId) -> Result<u8, DataError> {
        let index = req.index();
        if !self.reqs[usize::from(index)].in_use || self.id(index) != req {
            return Err(DataError::InvalidRequest {
                bits: req.to_bits(),
            });
        }
        Ok(index)
    }

    fn release(&mut self, index: u8) {
        let req = &mut self.reqs[usize::from(index)];
        req.in_use = false;
        req.generation = req.generation.wrapping_add(1);
        self.free.push(index);
    }

    fn outstanding(&self) -> usize {
        MAX_REQUESTS - self.free.len()
    }

    /// Test every outstanding part of `index` on its queue pair; `Some(result)` once all are in
    /// (the request is then freed).
    fn test<C: Connection, N: Nic>(
        &mut self,
        conns: &mut [C],
        nics: &mut [N],
        index: u8,
        blocked: &mut QpMask,
    ) -> Result<Option<PartSums>, DataError> {
        let base = usize::from(index) * self.qps;
        // A second round only after a part failed the connection: the parts tested before it
        // in the first round now report the failure instead of waiting for ever.
        for _round in 0..2 {
            // A blocked lane's NIC is the failover driver's while it quiesces: its parts wait.
            let mut pending = self.reqs[usize::from(index)].pending & !*blocked;
            while pending != 0 {
                let qp = pending.trailing_zeros() as usize;
                pending &= pending - 1;
                let Some(id) = self.ids[base + qp] else {
                    continue;
                };
                let outcome = conns[qp].test(&mut nics[qp], id);
                let req = &mut self.reqs[usize::from(index)];
                match outcome {
                    Ok(Completed::Pending) => continue,
                    Ok(Completed::Done { n, sizes }) => {
                        req.n = usize::from(n);
                        for (total, part) in req.sizes.iter_mut().zip(sizes) {
                            *total = total.saturating_add(u64::from(part));
                        }
                    }
                    Err(err) => {
                        // A connection failure outranks a part refused for size: it is what
                        // NCCL must hear about. Of the parts refused for size, the one that
                        // ends last names the message's size.
                        if req.error.is_none_or(|first| outranks(err, first)) {
                            req.error = Some(err);
                        }
                        if err.is_fatal() {
                            // One queue pair failing fails the connection: the others' parts
                            // would otherwise wait for data that is never sent. A blocked
                            // lane has no failover left to wait for: it reports the failure
                            // too.
                            for conn in conns.iter_mut() {
                                conn.handle_fatal(err);
                            }
                            *blocked = 0;
                        }
                    }
                }
                req.pending &= !(1 << qp);
                self.ids[base + qp] = None;
            }
            if !self.reqs[usize::from(index)]
                .error
                .is_some_and(|err| err.is_fatal())
            {
                break;
            }
        }
        let req = self.reqs[usize::from(index)];
        if !req.posted || req.pending != 0 {
            return Ok(None);
        }
        self.release(index);
        match req.error {
            Some(err) => Err(err),
            None => Ok(Some(PartSums {
                n: req.n.max(1),
                sizes: req.sizes,
            })),
        }
    }
}

/// A finished multi-QP request: per buffer, the sum of its parts' sizes (wide, so that a peer's
/// overlapping parts cannot wrap it before the receiver checks it against the buffer).
#[derive(Clone, Copy, Debug)]
struct PartSums {
    n: usize,
    sizes: [u64; MAX_RECVS],
}

impl PartSums {
    /// `test`'s answer: the sums as reported sizes (each at most the buffer's capacity, checked
    /// on the receiving side; a sender's parts sum to its message, at most
    /// [`MAX_WR_BYTES`](crate::nic::MAX_WR_BYTES)).
    fn completed(&self) -> Completed {
        let mut sizes = [0u32; MAX_RECVS];
        for (out, &sum) in sizes.iter_mut().zip(&self.sizes) {
            *out = u32::try_from(sum).unwrap_or(u32::MAX);
        }
        Completed::Done {
            n: self.n as u8,
            sizes,
        }
    }
}

/// Whether a part's error `err` replaces `first` as the request's error: a connection failure
/// outranks a size refusal, and a size refusal that ends later outranks an earlier one.
fn outranks(err: DataError, first: DataError) -> bool {
    match (err, first) {
        (
            DataError::SizeMismatch { sent, .. },
            DataError::SizeMismatch {
                sent: first_sent, ..
            },
        ) => sent > first_sent,
        _ => err.is_fatal() && !first.is_fatal(),
    }
}

/// A send or receive posted on some queue pairs, waiting for the rest.
#[derive(Clone, Copy, Debug)]
struct HalfPosted<A> {
    index: u8,
    /// The first part (0..width) not posted yet.
    next_part: usize,
    args: A,
}

/// The sending side of a multi-QP connection.
#[derive(Debug)]
pub struct MultiSend {
    conns: Vec<SendConn>,
    /// Queue pairs each message is cut over.
    width: usize,
    /// The first queue pair of the oldest receive not yet ended.
    current: usize,
    /// That queue pair's [`SendConn::receives_ended`] when the receive became the oldest: the
    /// receive has ended once the count moves.
    current_ended: u32,
    parts: Parts<(SendBuf, u32)>,
    /// Per lane, the sends posted on it, once failover is enabled (`None`: off).
    journals: Option<Vec<SendJournal>>,
    /// Lanes being failed over: nothing is posted on them and their NICs are not polled.
    blocked: QpMask,
    /// Per lane, which of a fused NIC's members (ports) it is on: the index of its memory key
    /// among the keys `isend_keyed`/`irecv_keyed` are given. Lane `i` starts on member `i`
    /// (modulo the members); port failover may move it.
    members: Vec<u8>,
}

impl MultiSend {
    /// A sender over `conns` (one per queue pair, in the order both ends agreed on in the
    /// handshake), using them as `policy` says: whole messages round-robin, or each split over
    /// all of them.
    pub fn new(conns: Vec<SendConn>, policy: QpPolicy) -> Self {
        let width = if policy.split { conns.len() } else { 1 };
        Self::with_width(conns, width, policy.ar_threshold)
    }

    /// A sender cutting each message over `width` of its queue pairs (1..=`conns.len()`; the
    /// receiver must use the same), with adaptive routing above `ar_threshold` bytes.
    pub fn with_width(mut conns: Vec<SendConn>, width: usize, ar_threshold: Option<u64>) -> Self {
        assert!(
            !conns.is_empty() && conns.len() <= MAX_QPS,
            "1..=128 queue pairs"
        );
        assert!((1..=conns.len()).contains(&width), "width 1..=queue pairs");
        for conn in &mut conns {
            conn.set_adaptive_routing(ar_threshold);
        }
        let qps = conns.len();
        Self {
            conns,
            width,
            current: 0,
            current_ended: 0,
            parts: Parts::new(Side::Send, qps),
            journals: None,
            blocked: 0,
            members: (0..qps).map(|i| i as u8).collect(),
        }
    }

    /// Queue pairs of the connection.
    pub fn qps(&self) -> usize {
        self.conns.len()
    }

    /// Send `buf` to the matching buffer, as [`SendConn::isend`]; `nics[i]` is queue pair `i`.
    pub fn isend<N: Nic>(
        &mut self,
        nics: &mut [N],
        buf: SendBuf,
        tag: u32,
    ) -> Result<Option<RequestId>, DataError> {
        self.isend_keyed(nics, buf, &[buf.lkey], tag)
    }

    /// [`isend`](Self::isend) on queue pairs of several devices (a fused NIC): queue pair `i`
    /// belongs to device `d = i % lkeys.len()` (until port failover moves it) and reads `buf`
    /// with that device's key `lkeys[d]` (`buf.lkey` is not used).
    pub fn isend_keyed<N: Nic>(
        &mut self,
        nics: &mut [N],
        buf: SendBuf,
        lkeys: &[u32],
        tag: u32,
    ) -> Result<Option<RequestId>, DataError> {
        if lkeys.is_empty() {
            return Err(DataError::InvalidArgument("no memory key"));
        }
        if nics.len() != self.conns.len() {
            return Err(DataError::InvalidArgument("one NIC per queue pair"));
        }
        if buf.len > u64::from(MAX_WR_BYTES) {
            return Err(DataError::InvalidArgument("send larger than 1 GiB"));
        }
        if buf.addr.checked_add(buf.len).is_none() {
            return Err(DataError::InvalidArgument(
                "send buffer wraps the address space",
            ));
        }
        let args = (buf, tag);
        // Decided before the first part: a block never leaves a message half posted.
        if self.blocked != 0
            && self
                .parts
                .needs_blocked(args, self.current, self.width, self.blocked)
        {
            return Ok(None);
        }
        let Some((index, first)) = self.parts.start(
            args,
            "a split send was half posted: retry the same send first",
        )?
        else {
            return Ok(None);
        };
        let (qps, width) = (self.conns.len(), self.width);
        for part in first..width {
            let qp = (self.current + part) % qps;
            let (offset, len) = split_part(buf.len, width, part);
            let piece = SendBuf {
                addr: buf.addr + offset,
                len,
                lkey: lkeys[usize::from(self.members[qp]) % lkeys.len()],
            };
            let outcome = self.conns[qp].isend_at(&mut nics[qp], piece, tag, offset);
            if let Some(journals) = &mut self.journals
                && let Ok(Some(id)) = outcome
            {
                journals[qp].note(id, piece, tag, offset);
            }
            match self.parts.part_posted(index, (qp, part), outcome, args) {
                Ok(true) => {}
                Ok(false) => return Ok(None),
                Err(err) => {
                    if err.is_fatal() {
                        self.fail_all(err);
                    }
                    return Err(err);
                }
            }
        }
        // Every queue pair of the receive saw this send; when it ended the receive's slot, the
        // next receive starts `width` queue pairs on.
        if self.conns[self.current].receives_ended() != self.current_ended {
            self.current = (self.current + width) % qps;
            self.current_ended = self.conns[self.current].receives_ended();
        }
        Ok(Some(self.parts.posted(index)))
    }

    /// Fail every lane; a blocked one has no failover left to wait for (its requests report
    /// the failure).
    fn fail_all(&mut self, err: DataError) {
        for conn in &mut self.conns {
            conn.handle_fatal(err);
        }
        self.blocked = 0;
    }

    /// Test `req`: done once every part is.
    pub fn test<N: Nic>(&mut self, nics: &mut [N], req: RequestId) -> Result<Completed, DataError> {
        let index = self.parts.lookup(req)?;
        Ok(self
            .parts
            .test(&mut self.conns, nics, index, &mut self.blocked)?
            .map_or(Completed::Pending, |done| done.completed()))
    }

    /// Fail every queue pair with `err` (blocked lanes are unblocked: no failover is left to
    /// wait for, and their requests report the failure).
    pub fn handle_fatal(&mut self, err: DataError) {
        self.fail_all(err);
    }

    /// Sum of the queue pairs' [`Connection::drain`].
    pub fn drain<N: Nic>(&mut self, nics: &mut [N]) -> Result<usize, DataError> {
        drain_all(&mut self.conns, nics, self.blocked)
    }

    /// Requests handed out and not yet freed by `test`.
    pub fn outstanding(&self) -> usize {
        self.parts.outstanding()
    }
}

/// The receiving side of a multi-QP connection.
#[derive(Debug)]
pub struct MultiRecv {
    conns: Vec<RecvConn>,
    /// Queue pairs each receive is posted on.
    width: usize,
    /// The first queue pair of the next receive.
    current: usize,
    parts: Parts<RecvArgs>,
    /// Capacities of each request's buffers, to check the parts' sum against.
    capacity: Vec<[u64; MAX_RECVS]>,
    /// Per lane, the receives posted on it, once failover is enabled (`None`: off).
    journals: Option<Vec<RecvJournal>>,
    /// Lanes being failed over: nothing is posted on them and their NICs are not polled.
    blocked: QpMask,
    /// Per lane, which of a fused NIC's members (ports) it is on: the index of its memory key
    /// among the keys `isend_keyed`/`irecv_keyed` are given. Lane `i` starts on member `i`
    /// (modulo the members); port failover may move it.
    members: Vec<u8>,
}

/// The arguments of a split receive, kept while it is half posted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RecvArgs {
    n: usize,
    bufs: [RecvBuf; MAX_RECVS],
    tags: [u32; MAX_RECVS],
}

impl MultiRecv {
    /// A receiver over `conns` (one per queue pair, in the handshake's order).
    pub fn new(conns: Vec<RecvConn>, policy: QpPolicy) -> Self {
        let width = if policy.split { conns.len() } else { 1 };
        Self::with_width(conns, width)
    }

    /// A receiver posting each receive on `width` of its queue pairs (the sender's width).
    pub fn with_width(conns: Vec<RecvConn>, width: usize) -> Self {
        assert!(
            !conns.is_empty() && conns.len() <= MAX_QPS,
            "1..=128 queue pairs"
        );
        assert!((1..=conns.len()).contains(&width), "width 1..=queue pairs");
        let qps = conns.len();
        Self {
            conns,
            width,
            current: 0,
            parts: Parts::new(Side::Recv, qps),
            capacity: vec![[0; MAX_RECVS]; MAX_REQUESTS],
            journals: None,
            blocked: 0,
            members: (0..qps).map(|i| i as u8).collect(),
        }
    }

    /// Queue pairs of the connection.
    pub fn qps(&self) -> usize {
        self.conns.len()
    }

    /// Post a receive, as [`RecvConn::irecv`]; `nics[i]` is queue pair `i`.
    pub fn irecv<N: Nic>(
        &mut self,
        nics: &mut [N],
        bufs: &[RecvBuf],
        tags: &[u32],
    ) -> Result<Option<RequestId>, DataError> {
        self.irecv_keyed(nics, bufs, &[], tags)
    }

    /// [`irecv`](Self::irecv) on queue pairs of several devices (a fused NIC): queue pair `i`
    /// belongs to device `d = i % rkeys.len()` (until port failover moves it) and offers buffer
    /// `b` with that device's key
    /// `rkeys[d][b]`; with no `rkeys`, every queue pair offers the buffers' own keys.
    pub fn irecv_keyed<N: Nic>(
        &mut self,
        nics: &mut [N],
        bufs: &[RecvBuf],
        rkeys: &[[u32; MAX_RECVS]],
        tags: &[u32],
    ) -> Result<Option<RequestId>, DataError> {
        if nics.len() != self.conns.len() {
            return Err(DataError::InvalidArgument("one NIC per queue pair"));
        }
        let n = bufs.len();
        if n == 0 || n > MAX_RECVS || tags.len() != n {
            return Err(DataError::InvalidArgument(
                "a receive takes 1 to 8 buffers, one tag each",
            ));
        }
        let mut args = RecvArgs {
            n,
            bufs: [RecvBuf {
                addr: 0,
                len: 0,
                rkey: 0,
                host: false,
            }; MAX_RECVS],
            tags: [0; MAX_RECVS],
        };
        args.bufs[..n].copy_from_slice(bufs);
        args.tags[..n].copy_from_slice(tags);
        let (qps, width) = (self.conns.len(), self.width);
        // Decided before the first part: a block never leaves a receive half posted.
        if self.blocked != 0
            && self
                .parts
                .needs_blocked(args, self.current, width, self.blocked)
        {
            return Ok(None);
        }
        let Some((index, first)) = self.parts.start(
            args,
            "a split receive was half posted: retry the same receive first",
        )?
        else {
            return Ok(None);
        };
        for part in first..width {
            let qp = (self.current + part) % qps;
            let outcome = match rkeys.len() {
                0 => {
                    let outcome = self.conns[qp].irecv(&mut nics[qp], bufs, tags);
                    if let Some(journals) = &mut self.journals
                        && let Ok(Some(id)) = outcome
                    {
                        journals[qp].note(id, bufs, tags);
                    }
                    outcome
                }
                devices => {
                    let mut keyed = args.bufs;
                    let member = usize::from(self.members[qp]) % devices;
                    for (buf, key) in keyed.iter_mut().zip(rkeys[member]) {
                        buf.rkey = key;
                    }
                    let outcome = self.conns[qp].irecv(&mut nics[qp], &keyed[..n], tags);
                    // The keys this lane offered: a replay rewrites the same entries.
                    if let Some(journals) = &mut self.journals
                        && let Ok(Some(id)) = outcome
                    {
                        journals[qp].note(id, &keyed[..n], tags);
                    }
                    outcome
                }
            };
            match self.parts.part_posted(index, (qp, part), outcome, args) {
                Ok(true) => {}
                Ok(false) => return Ok(None),
                Err(err) => {
                    if err.is_fatal() {
                        self.handle_fatal(err);
                    }
                    return Err(err);
                }
            }
        }
        self.current = (self.current + width) % qps;
        let mut capacity = [0; MAX_RECVS];
        for (cap, buf) in capacity.iter_mut().zip(bufs) {
            *cap = buf.len;
        }
        self.capacity[usize::from(index)] = capacity;
        Ok(Some(self.parts.posted(index)))
    }

    /// Test `req`: done once every part is, with each buffer's size the sum of its parts.
    pub fn test<N: Nic>(&mut self, nics: &mut [N], req: RequestId) -> Result<Completed, DataError> {
        let index = self.parts.lookup(req)?;
        let Some(done) = self
            .parts
            .test(&mut self.conns, nics, index, &mut self.blocked)?
        else {
            return Ok(Completed::Pending);
        };
        let PartSums { n, sizes } = done;
        let capacity = &self.capacity[usize::from(index)];
        // Each queue pair checked its part against the buffer; the sum is checked here (a peer
        // sending overlapping parts could otherwise report more than fits).
        if let Some(i) = (0..n.min(MAX_RECVS)).find(|&i| sizes[i] > capacity[i]) {
            let err = DataError::from(ProtocolError::Overflow {
                index: i,
                size: sizes[i],
                capacity: capacity[i],
            });
            self.handle_fatal(err);
            return Err(err);
        }
        Ok(done.completed())
    }

    /// Fail every queue pair with `err` (blocked lanes are unblocked: no failover is left to
    /// wait for, and their requests report the failure).
    pub fn handle_fatal(&mut self, err: DataError) {
        for conn in &mut self.conns {
            conn.handle_fatal(err);
        }
        self.blocked = 0;
    }

    /// Sum of the queue pairs' [`Connection::drain`].
    pub fn drain<N: Nic>(&mut self, nics: &mut [N]) -> Result<usize, DataError> {
        drain_all(&mut self.conns, nics, self.blocked)
    }

    /// Requests handed out and not yet freed by `test`.
    pub fn outstanding(&self) -> usize {
        self.parts.outstanding()
    }
}

/// Drain every lane but the `blocked` ones (their NICs are the failover driver's); what they
/// hold counts as left.
fn drain_all<C: Connection, N: Nic>(
    conns: &mut [C],
    nics: &mut [N],
    blocked: QpMask,
) -> Result<usize, DataError> {
    let mut left = 0;
    for (qp, (conn, nic)) in conns.iter_mut().zip(nics).enumerate() {
        if blocked & (1 << qp) != 0 {
            left += conn.outstanding();
            continue;
        }
        left += conn.drain(nic)?;
    }
    Ok(left)
}

#[cfg(test)]
mod tests;
