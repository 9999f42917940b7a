//! One-sided RMA (NCCL's `ncclRmaPlugin` tables): what each operation posts, and when a request
//! is done.
//!
//! The plugin owns the queue pairs: per RMA context, one RC queue pair per (context index, peer)
//! — a *lane* — with the lane to the own rank connected to itself (NCCL flushes with a put from a
//! rank to itself), and one completion queue for all of them. This module decides everything
//! else, with no IO:
//!
//! - [`Window`]: a symmetric registration as every rank registered it (base, length, remote key
//!   per rank; the own local key). Every offset and size NCCL passes is checked against the
//!   window it addresses before anything is posted ([`RmaError::OutOfWindow`]).
//! - [`plan_put`], [`plan_put_signal`], [`plan_get`], [`plan_flush`]: the work requests of one
//!   operation ([`Plan`]): the transfer split into pieces of at most [`MAX_WR_BYTES`], inline when
//!   the source is host memory and short enough, the signal as a 64-bit fetch-and-add after it.
//!   Only the last work request of an operation is signaled: RC completes a queue pair's work
//!   requests in order, so its completion means the earlier ones are done; an unsignaled one that
//!   fails still reports (with the mark [`PIECE_MARK`] in its `wr_id`).
//! - [`Requests`]: the request machine. [`Requests::begin`] admits an operation on a lane
//!   (refusing a failed lane, a full lane, or a completion queue that could overflow);
//!   [`Requests::handle_completion`] takes each completion; [`Requests::test`] answers NCCL's
//!   `test`. A failed completion fails its request and, sticky, the lane: every other request
//!   outstanding on it fails at once (the peer or the queue pair is gone; NCCL must not wait for
//!   flushed completions), later operations on it are refused, and [`Requests::has_error`]
//!   (`queryLastError`) says so. Other lanes keep working.
//!
//! **Ordering.** Operations on one lane (same context index, same peer) are posted on one RC
//! queue pair and execute in order at the target; a signal is posted after its put on the same
//! queue pair, so a rank that sees the new signal value sees the put's bytes (NCCL's "strong"
//! signal; weak signals get the same). Different context indices are independent queue pairs.

use crate::nic::{MAX_WR_BYTES, WcStatus};
use alloc::vec::Vec;
use core::fmt;

#[cfg(test)]
mod tests;

/// NCCL's `NCCL_NET_SIGNAL_OP_INC`.
pub const SIGNAL_OP_INC: u32 = 1;
/// NCCL's `NCCL_NET_SIGNAL_OP_ADD`.
pub const SIGNAL_OP_ADD: u32 = 2;

/// Requests outstanding per lane at most: NCCL keeps at most 32 × `maxRecvs` (8) per peer.
pub const MAX_REQUESTS_PER_LANE: u32 = 256;
/// Work requests outstanding per lane at most (the send queue depth the plugin creates).
pub const LANE_QUEUE_DEPTH: u32 = 1024;
/// Bit 63 of a `wr_id`: an unsignaled piece of an operation, not its last work request.
pub const PIECE_MARK: u64 = 1 << 63;

/// Bits of a request id for the slot; the rest (12 bits) carry the slot's generation.
const SLOT_BITS: u32 = 20;
/// Slots a request table holds at most (the id's slot field).
pub const MAX_SLOTS: usize = 1 << SLOT_BITS;

/// Which address an out-of-window error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    /// A put's source in the own window.
    Source,
    /// A put's destination in the target's window.
    Destination,
    /// The signal word in the target's signal window.
    Signal,
    /// A get's source in the target's window.
    Remote,
    /// A get's destination in the own window.
    Local,
}

impl fmt::Display for Which {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Source => "source",
            Self::Destination => "destination",
            Self::Signal => "signal",
            Self::Remote => "remote (get source)",
            Self::Local => "local (get destination)",
        })
    }
}

/// Why an RMA operation was refused or failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RmaError {
    /// `offset + size` lies outside the window rank `rank` registered (`len` bytes).
    OutOfWindow {
        /// Which address.
        which: Which,
        /// Whose window.
        rank: u32,
        /// Offset NCCL passed.
        offset: u64,
        /// Size NCCL passed (8 for a signal).
        size: u64,
        /// The window's length.
        len: u64,
    },
    /// The signal word is not 8-byte aligned (RDMA atomics need it).
    MisalignedSignal {
        /// Offset NCCL passed.
        offset: u64,
        /// The address it names at the target.
        addr: u64,
    },
    /// A signal operation other than `INC`/`ADD`.
    BadSignalOp(u32),
    /// A context index outside `0..contexts`.
    BadContext {
        /// Index NCCL passed.
        context: i64,
        /// Contexts created.
        contexts: u32,
    },
    /// A rank outside `0..nranks`.
    BadRank {
        /// Rank NCCL passed.
        rank: u64,
        /// Ranks of the group.
        nranks: u32,
    },
    /// No lane to this rank: the context's `rankStride` left it out.
    NotConnected {
        /// Rank NCCL passed.
        rank: u32,
        /// The stride the context was created with.
        stride: u32,
    },
    /// The lane to `rank` failed earlier (sticky): `status` is the first failed completion's.
    PeerFailed {
        /// The peer.
        rank: u32,
        /// Context index of the lane.
        context: u32,
        /// The first failure seen on the lane.
        status: WcStatus,
    },
    /// More requests or work requests outstanding on the lane than NCCL's bound.
    LaneFull {
        /// The peer.
        rank: u32,
        /// Requests outstanding on the lane.
        requests: u32,
    },
    /// The context's completion queue could overflow with one more operation.
    QueueFull {
        /// Completions reserved.
        reserved: u32,
        /// The completion queue's depth.
        depth: u32,
    },
    /// A request handle that is not outstanding (stale, already tested, or bogus).
    UnknownRequest,
    /// Posting failed (the queue pair refused the work request).
    Post {
        /// The peer.
        rank: u32,
        /// The provider's errno.
        errno: i32,
    },
}

impl fmt::Display for RmaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::OutOfWindow {
                which,
                rank,
                offset,
                size,
                len,
            } => write!(
                f,
                "{which} offset {offset} + size {size} lies outside rank {rank}'s window of {len} \
                 bytes"
            ),
            Self::MisalignedSignal { offset, addr } => write!(
                f,
                "signal offset {offset} (address {addr:#x}) is not 8-byte aligned; RDMA atomics \
                 need an aligned 64-bit word"
            ),
            Self::BadSignalOp(op) => write!(
                f,
                "signal operation {op}: only NCCL_NET_SIGNAL_OP_INC (1) and _ADD (2) exist"
            ),
            Self::BadContext { context, contexts } => write!(
                f,
                "context index {context}: the RMA context has {contexts}, indices 0 to {}",
                contexts.saturating_sub(1)
            ),
            Self::BadRank { rank, nranks } => {
                write!(f, "rank {rank}: the group has {nranks} rank(s)")
            }
            Self::NotConnected { rank, stride } => write!(
                f,
                "rank {rank} is not connected: the context was created with rankStride {stride}"
            ),
            Self::PeerFailed {
                rank,
                context,
                status,
            } => write!(
                f,
                "the queue pair to rank {rank} (context {context}) failed: {status}"
            ),
            Self::LaneFull { rank, requests } => write!(
                f,
                "{requests} requests already in flight to rank {rank}: NCCL keeps at most \
                 {MAX_REQUESTS_PER_LANE} per peer"
            ),
            Self::QueueFull { reserved, depth } => write!(
                f,
                "the context's completion queue ({depth} entries, {reserved} reserved) could \
                 overflow"
            ),
            Self::UnknownRequest => f.write_str("not an outstanding RMA request"),
            Self::Post { rank, errno } => {
                write!(f, "posting to rank {rank} failed (errno {errno})")
            }
        }
    }
}

/// One rank's part of a symmetric registration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowEntry {
    /// Address of the first byte, in that rank's address space.
    pub base: u64,
    /// Length in bytes.
    pub len: u64,
    /// Remote key on that rank's port.
    pub rkey: u32,
}

/// A symmetric registration: every rank's entry, the own local key, and whether the own memory
/// is host memory (the CPU may read it, so short puts from it go inline).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    /// Entries by rank.
    pub entries: Vec<WindowEntry>,
    /// The own rank.
    pub rank: u32,
    /// Local key of the own registration.
    pub lkey: u32,
    /// The own memory is host memory.
    pub host: bool,
}

impl Window {
    /// The address of `offset .. offset + size` in rank `rank`'s part, or why not.
    pub fn range(&self, which: Which, rank: u32, offset: u64, size: u64) -> Result<u64, RmaError> {
        let entry = self.entries.get(rank as usize).ok_or(RmaError::BadRank {
            rank: u64::from(rank),
            nranks: self.entries.len() as u32,
        })?;
        // Within the entry's length, and (the entry is a peer's word, untrusted) within the
        // address space: a range may end at 2^64, never past it, and its first address must be
        // one (an empty range at 2^64 is not).
        let end = u128::from(entry.base) + u128::from(offset) + u128::from(size);
        match (offset.checked_add(size), entry.base.checked_add(offset)) {
            (Some(within), Some(addr)) if within <= entry.len && end <= 1 << 64 => Ok(addr),
            _ => Err(()),
        }
        .map_err(|()| RmaError::OutOfWindow {
            which,
            rank,
            offset,
            size,
            len: entry.len,
        })
    }

    /// The remote key of rank `rank`'s part (the rank was checked by [`range`](Self::range)).
    fn rkey(&self, rank: u32) -> u32 {
        self.entries.get(rank as usize).map_or(0, |e| e.rkey)
    }
}

/// Local memory of a transfer: address, key and length (up to the whole operation's size; the
/// plugin posts it in [`pieces`](Transfer::pieces)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transfer {
    /// Local address of the first byte.
    pub local: u64,
    /// Local key.
    pub lkey: u32,
    /// Remote address of the first byte.
    pub remote: u64,
    /// Remote key.
    pub rkey: u32,
    /// Bytes in all.
    pub len: u64,
    /// The bytes go inline (host memory, at most the lane's inline size): the CPU copies them
    /// into the work request.
    pub inline: bool,
}

/// One work request's share of a [`Transfer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Local address.
    pub local: u64,
    /// Remote address.
    pub remote: u64,
    /// Bytes (at most [`MAX_WR_BYTES`]).
    pub len: u32,
}

impl Transfer {
    /// The work requests of the transfer, in order: at most [`MAX_WR_BYTES`] each.
    pub fn pieces(&self) -> impl Iterator<Item = Piece> + '_ {
        let step = u64::from(MAX_WR_BYTES);
        (0..self.len.div_ceil(step)).map(move |i| {
            let at = i * step;
            Piece {
                local: self.local + at,
                remote: self.remote + at,
                len: (self.len - at).min(step) as u32,
            }
        })
    }

    /// How many work requests [`pieces`](Self::pieces) yields.
    pub fn piece_count(&self) -> u32 {
        // Saturating: a count that does not fit is refused as more than a lane holds.
        u32::try_from(self.len.div_ceil(u64::from(MAX_WR_BYTES))).unwrap_or(u32::MAX)
    }
}

/// The signal of a put-with-signal: a 64-bit fetch-and-add at the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SignalAdd {
    /// Address of the signal word at the target (8-byte aligned).
    pub remote: u64,
    /// Remote key of the signal window at the target.
    pub rkey: u32,
    /// What to add (1 for `INC`).
    pub add: u64,
}

/// What one operation posts on its lane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Nothing: the request is done at once (an empty put or get, a flush of host memory).
    Nothing,
    /// RDMA WRITEs.
    Put(Transfer),
    /// RDMA WRITEs (none for an empty put), then the fetch-and-add.
    PutSignal(Option<Transfer>, SignalAdd),
    /// RDMA READs.
    Get(Transfer),
    /// A 1-byte RDMA READ of the own window's first byte over the lane to the own rank: it cannot
    /// pass the NIC's earlier writes into that memory, so its completion means they landed.
    FlushRead {
        /// Address of the own window's first byte.
        remote: u64,
        /// The own window's remote key.
        rkey: u32,
    },
}

impl Plan {
    /// Work requests the plan posts (each may produce one completion).
    pub fn work_requests(&self) -> u32 {
        match self {
            Self::Nothing => 0,
            Self::Put(t) | Self::Get(t) => t.piece_count(),
            Self::PutSignal(t, _) => t
                .as_ref()
                .map_or(0, Transfer::piece_count)
                .saturating_add(1),
            Self::FlushRead { .. } => 1,
        }
    }
}

/// A put of `size` bytes from `src_off` of the own part of `src` to `dst_off` of rank `target`'s
/// part of `dst`.
pub fn plan_put(
    src: &Window,
    src_off: u64,
    size: u64,
    dst: &Window,
    dst_off: u64,
    target: u32,
    max_inline: u32,
) -> Result<Plan, RmaError> {
    Ok(
        match transfer_to(src, src_off, size, dst, dst_off, target, max_inline)? {
            Some(t) => Plan::Put(t),
            None => Plan::Nothing,
        },
    )
}

/// A put (as [`plan_put`]; none when `size` is 0 and no windows are given), then `op` on the
/// 64-bit word at `signal_off` of rank `target`'s part of `signal`.
#[allow(clippy::too_many_arguments)] // NCCL's iputSignal arguments
pub fn plan_put_signal(
    put: Option<(&Window, u64, &Window, u64)>,
    size: u64,
    target: u32,
    signal: &Window,
    signal_off: u64,
    op: u32,
    value: u64,
    max_inline: u32,
) -> Result<Plan, RmaError> {
    let add = match op {
        SIGNAL_OP_INC => 1,
        SIGNAL_OP_ADD => value,
        other => return Err(RmaError::BadSignalOp(other)),
    };
    let remote = signal.range(Which::Signal, target, signal_off, 8)?;
    if remote % 8 != 0 {
        return Err(RmaError::MisalignedSignal {
            offset: signal_off,
            addr: remote,
        });
    }
    let transfer = match put {
        Some((src, src_off, dst, dst_off)) => {
            transfer_to(src, src_off, size, dst, dst_off, target, max_inline)?
        }
        None => None,
    };
    Ok(Plan::PutSignal(
        transfer,
        SignalAdd {
            remote,
            rkey: signal.rkey(target),
            add,
        },
    ))
}

/// A get of `size` bytes from `remote_off` of rank `target`'s part of `remote` into `local_off`
/// of the own part of `local`.
pub fn plan_get(
    remote: &Window,
    remote_off: u64,
    size: u64,
    local: &Window,
    local_off: u64,
    target: u32,
) -> Result<Plan, RmaError> {
    let from = remote.range(Which::Remote, target, remote_off, size)?;
    let into = local.range(Which::Local, local.rank, local_off, size)?;
    if size == 0 {
        return Ok(Plan::Nothing);
    }
    Ok(Plan::Get(Transfer {
        local: into,
        lkey: local.lkey,
        remote: from,
        rkey: remote.rkey(target),
        len: size,
        inline: false,
    }))
}

/// A flush of `window`: a read over the own lane for device memory, nothing for host memory (the
/// CPU sees the NIC's writes in host memory once they completed) or an empty window.
pub fn plan_flush(window: &Window) -> Result<Plan, RmaError> {
    if window.host {
        return Ok(Plan::Nothing);
    }
    match window.range(Which::Local, window.rank, 0, 1) {
        Ok(remote) => Ok(Plan::FlushRead {
            remote,
            rkey: window.rkey(window.rank),
        }),
        Err(RmaError::OutOfWindow { .. }) => Ok(Plan::Nothing),
        Err(e) => Err(e),
    }
}

fn transfer_to(
    src: &Window,
    src_off: u64,
    size: u64,
    dst: &Window,
    dst_off: u64,
    target: u32,
    max_inline: u32,
) -> Result<Option<Transfer>, RmaError> {
    let local = src.range(Which::Source, src.rank, src_off, size)?;
    let remote = dst.range(Which::Destination, target, dst_off, size)?;
    Ok((size > 0).then(|| Transfer {
        local,
        lkey: src.lkey,
        remote,
        rkey: dst.rkey(target),
        len: size,
        inline: src.host && size <= u64::from(max_inline),
    }))
}

/// A request's handle: slot and generation, packed into a non-zero `u32`
/// ([`to_bits`](Self::to_bits)), which is also the `wr_id` of its last work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RequestId {
    slot: u32,
    generation: u16,
}

impl RequestId {
    /// Bits 0–19 the slot, 20–31 the generation (never 0, so the id is never 0).
    pub fn to_bits(self) -> u32 {
        self.slot | u32::from(self.generation) << SLOT_BITS
    }

    /// Unpack; `None` for bits no request has (generation 0).
    pub fn from_bits(bits: u32) -> Option<Self> {
        let generation = (bits >> SLOT_BITS) as u16;
        (generation != 0).then_some(Self {
            slot: bits & (MAX_SLOTS as u32 - 1),
            generation,
        })
    }

    /// The `wr_id` of the operation's last (signaled) work request.
    pub fn wr_id(self) -> u64 {
        u64::from(self.to_bits())
    }

    /// The `wr_id` of the operation's other (unsignaled) work requests.
    pub fn piece_wr_id(self) -> u64 {
        self.wr_id() | PIECE_MARK
    }
}

/// Where a request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Free,
    /// Posted; its last completion has not come. `failed`: it is known failed already (an
    /// earlier piece or another request on its lane failed).
    Posted {
        failed: Option<RmaError>,
    },
    /// Its last completion came: success.
    Done,
    /// Its last completion came: failure.
    Failed(RmaError),
    /// NCCL was told it failed (and let go of it) before its last completion came: the slot
    /// waits for that completion (which frees the completion queue entries it reserved).
    Orphan,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    generation: u16,
    state: State,
    lane: u32,
    /// Completion queue entries reserved (its work requests).
    reserved: u32,
}

/// One lane's bookkeeping.
#[derive(Clone, Copy, Debug, Default)]
struct Lane {
    /// Requests posted whose last completion has not come.
    requests: u32,
    /// Work requests posted whose operation's last completion has not come.
    work_requests: u32,
    /// The first failure (sticky).
    failed: Option<WcStatus>,
    /// The lane exists (rank stride).
    connected: bool,
}

/// What [`Requests::test`] answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tested {
    /// Still in flight.
    Pending,
    /// Done; the handle is released.
    Done,
}

/// The request machine of one RMA context: `contexts` × `nranks` lanes, one completion queue of
/// `cq_depth` entries.
#[derive(Debug)]
pub struct Requests {
    slots: Vec<Slot>,
    free: Vec<u32>,
    lanes: Vec<Lane>,
    nranks: u32,
    contexts: u32,
    stride: u32,
    cq_depth: u32,
    reserved: u32,
    errors: bool,
    /// Lanes failed so far (for the plugin, to act on a new failure without scanning lanes).
    failed_lanes: u32,
}

impl Requests {
    /// A machine for `contexts` context indices over a group of `nranks` with own rank `rank`,
    /// lanes to the ranks `rankStride` reaches (every rank for stride 1; the own rank always), and
    /// a completion queue of `cq_depth` entries.
    pub fn new(contexts: u32, nranks: u32, rank: u32, stride: u32, cq_depth: u32) -> Self {
        let stride = stride.max(1);
        let lanes = (0..contexts)
            .flat_map(|_| 0..nranks)
            .map(|peer| Lane {
                connected: connected(rank, peer, nranks, stride),
                ..Lane::default()
            })
            .collect();
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            lanes,
            nranks,
            contexts,
            stride,
            cq_depth,
            reserved: 0,
            errors: false,
            failed_lanes: 0,
        }
    }

    /// Whether the lane to `peer` exists (for the plugin creating the queue pairs).
    pub fn is_connected(&self, peer: u32) -> bool {
        peer < self.nranks && self.lanes.get(peer as usize).is_some_and(|l| l.connected)
    }

    /// The lane index of (`context`, `rank`), checked.
    pub fn lane(&self, context: i32, rank: u32) -> Result<u32, RmaError> {
        let context = u32::try_from(context)
            .ok()
            .filter(|&c| c < self.contexts)
            .ok_or(RmaError::BadContext {
                context: i64::from(context),
                contexts: self.contexts,
            })?;
        if rank >= self.nranks {
            return Err(RmaError::BadRank {
                rank: u64::from(rank),
                nranks: self.nranks,
            });
        }
        let index = context * self.nranks + rank;
        let lane = &self.lanes[index as usize];
        if !lane.connected {
            return Err(RmaError::NotConnected {
                rank,
                stride: self.stride,
            });
        }
        if let Some(status) = lane.failed {
            return Err(RmaError::PeerFailed {
                rank,
                context,
                status,
            });
        }
        Ok(index)
    }

    /// The peer of the outstanding request `id` (`None` when it is not outstanding).
    pub fn peer_of_request(&self, id: RequestId) -> Option<u32> {
        self.slot(id).map(|s| self.peer_of(s.lane))
    }

    /// The peer rank of lane `lane`.
    pub fn peer_of(&self, lane: u32) -> u32 {
        lane % self.nranks.max(1)
    }

    /// Admit an operation posting `work_requests` work requests on `lane` (from
    /// [`lane`](Self::lane)); 0 makes a request that is done at once.
    pub fn begin(&mut self, lane: u32, work_requests: u32) -> Result<RequestId, RmaError> {
        let peer = self.peer_of(lane);
        let l = self
            .lanes
            .get(lane as usize)
            .copied()
            .ok_or(RmaError::BadRank {
                rank: u64::from(lane),
                nranks: self.nranks,
            })?;
        if work_requests > 0 {
            if l.requests >= MAX_REQUESTS_PER_LANE
                || l.work_requests.saturating_add(work_requests) > LANE_QUEUE_DEPTH
            {
                return Err(RmaError::LaneFull {
                    rank: peer,
                    requests: l.requests,
                });
            }
            if self.reserved.saturating_add(work_requests) > self.cq_depth {
                return Err(RmaError::QueueFull {
                    reserved: self.reserved,
                    depth: self.cq_depth,
                });
            }
        }
        let slot = match self.free.pop() {
            Some(s) => s,
            None if self.slots.len() < MAX_SLOTS => {
                self.slots.push(Slot {
                    generation: 0,
                    state: State::Free,
                    lane: 0,
                    reserved: 0,
                });
                self.slots.len() as u32 - 1
            }
            None => {
                return Err(RmaError::QueueFull {
                    reserved: self.reserved,
                    depth: MAX_SLOTS as u32,
                });
            }
        };
        let s = &mut self.slots[slot as usize];
        s.generation = next_generation(s.generation);
        s.lane = lane;
        s.reserved = work_requests;
        s.state = if work_requests == 0 {
            State::Done
        } else {
            State::Posted { failed: None }
        };
        if work_requests > 0 {
            let l = &mut self.lanes[lane as usize];
            l.requests += 1;
            l.work_requests += work_requests;
            self.reserved += work_requests;
        }
        Ok(RequestId {
            slot,
            generation: s.generation,
        })
    }

    /// Posting `id`'s work requests failed with `errno` before any was handed to the NIC: the
    /// request is withdrawn (its handle never reached NCCL) and the error returned for NCCL.
    pub fn abandon(&mut self, id: RequestId, errno: i32) -> RmaError {
        let err = RmaError::Post {
            rank: self.slot(id).map_or(0, |s| self.peer_of(s.lane)),
            errno,
        };
        if self.slot(id).is_some() {
            self.settle(id.slot);
            self.release(id.slot);
        }
        err
    }

    /// One completion of the context's queue.
    pub fn handle_completion(&mut self, wr_id: u64, status: WcStatus) {
        let last = wr_id & PIECE_MARK == 0;
        let Some(id) = u32::try_from(wr_id & !PIECE_MARK)
            .ok()
            .and_then(RequestId::from_bits)
        else {
            return;
        };
        let Some(slot) = self.slot(id).copied() else {
            return;
        };
        if !status.is_success() {
            self.fail_lane(slot.lane, status);
        }
        if !last {
            // An unsignaled piece reports only when it failed; the request waits for its last
            // completion (flushed after the failure) to free what it reserved.
            return;
        }
        let state = match slot.state {
            State::Posted { failed: None } if status.is_success() => State::Done,
            State::Posted { failed: Some(e) } => State::Failed(e),
            State::Posted { failed: None } => State::Failed(self.failure(slot.lane, status)),
            State::Orphan => {
                self.settle(id.slot);
                self.release(id.slot);
                return;
            }
            // A second last completion for one request cannot come; ignore it.
            State::Done | State::Failed(_) | State::Free => return,
        };
        self.settle(id.slot);
        self.slots[id.slot as usize].state = state;
    }

    /// NCCL's `test`: done (and released), pending, or the failure (and released as far as
    /// NCCL is concerned).
    pub fn test(&mut self, id: RequestId) -> Result<Tested, RmaError> {
        let slot = self.slot(id).copied().ok_or(RmaError::UnknownRequest)?;
        match slot.state {
            State::Posted { failed: None } => Ok(Tested::Pending),
            State::Posted { failed: Some(e) } => {
                self.slots[id.slot as usize].state = State::Orphan;
                Err(e)
            }
            State::Done => {
                self.release(id.slot);
                Ok(Tested::Done)
            }
            State::Failed(e) => {
                self.release(id.slot);
                Err(e)
            }
            State::Orphan | State::Free => Err(RmaError::UnknownRequest),
        }
    }

    /// `queryLastError`: some lane failed.
    pub fn has_error(&self) -> bool {
        self.errors
    }

    /// How many lanes have failed so far: it changes exactly when a lane fails, so a caller
    /// compares it with the count it last acted on instead of asking every lane.
    pub fn failed_lanes(&self) -> u32 {
        self.failed_lanes
    }

    /// Requests NCCL still holds or that wait for their last completion.
    pub fn outstanding(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Completion queue entries reserved by posted operations.
    pub fn reserved(&self) -> u32 {
        self.reserved
    }

    /// The first failure of lane `lane`, with the peer and context it names.
    pub fn lane_failure(&self, lane: u32) -> Option<RmaError> {
        let l = self.lanes.get(lane as usize)?;
        l.failed.map(|status| self.failure(lane, status))
    }

    fn failure(&self, lane: u32, status: WcStatus) -> RmaError {
        RmaError::PeerFailed {
            rank: self.peer_of(lane),
            context: lane / self.nranks.max(1),
            status: self.lanes[lane as usize].failed.unwrap_or(status),
        }
    }

    /// A failed completion on `lane`: the lane fails (the first non-flush status is kept), and
    /// every request posted on it fails now.
    fn fail_lane(&mut self, lane: u32, status: WcStatus) {
        let l = &mut self.lanes[lane as usize];
        let first = l.failed.is_none();
        if first || l.failed == Some(WcStatus::WR_FLUSH_ERR) && status != WcStatus::WR_FLUSH_ERR {
            l.failed = Some(status);
        }
        self.errors = true;
        if first {
            self.failed_lanes += 1;
        }
        if !first {
            return;
        }
        let err = self.failure(lane, status);
        for s in self.slots.iter_mut().filter(|s| s.lane == lane) {
            if let State::Posted { failed: None } = s.state {
                s.state = State::Posted { failed: Some(err) };
            }
        }
    }

    /// The live slot `id` names.
    fn slot(&self, id: RequestId) -> Option<&Slot> {
        self.slots
            .get(id.slot as usize)
            .filter(|s| s.generation == id.generation && s.state != State::Free)
    }

    /// The slot's last completion came (or never will): give back what it reserved.
    fn settle(&mut self, slot: u32) {
        let s = &mut self.slots[slot as usize];
        let reserved = core::mem::take(&mut s.reserved);
        if reserved > 0 {
            let l = &mut self.lanes[s.lane as usize];
            l.requests = l.requests.saturating_sub(1);
            l.work_requests = l.work_requests.saturating_sub(reserved);
            self.reserved = self.reserved.saturating_sub(reserved);
        }
    }

    fn release(&mut self, slot: u32) {
        self.slots[slot as usize].state = State::Free;
        self.free.push(slot);
    }
}

/// Whether the lane from `rank` to `peer` exists under `stride`: the own rank, and every peer a
/// multiple of `stride` away in either direction (so both ends agree).
fn connected(rank: u32, peer: u32, nranks: u32, stride: u32) -> bool {
    let n = u64::from(nranks.max(1));
    let up = (u64::from(peer) + n - u64::from(rank) % n) % n;
    let down = (n - up) % n;
    up % u64::from(stride) == 0 || down % u64::from(stride) == 0
}

/// The next generation of a slot: 1..=4095, skipping 0.
fn next_generation(g: u16) -> u16 {
    let max = (1u16 << (32 - SLOT_BITS)) - 1;
    if g >= max { 1 } else { g + 1 }
}
