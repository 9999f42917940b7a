//! The schedule of one CollNet operation on one rank, as a sans-IO machine: which message to
//! send to or receive from which peer next, when a chunk is ready to fold, and when the
//! operation is complete. The plugin asks ([`Schedule::next_send`], [`Schedule::next_recv`],
//! [`Schedule::next_local`]), performs the step with the p2p transport or the reduction kernels,
//! confirms it ([`Schedule::sent`], [`Schedule::posted`], [`Schedule::done_local`]) and reports
//! completions ([`Schedule::send_completed`], [`Schedule::recv_completed`]).
//!
//! # Algorithms
//!
//! Every rank holds a connection to every other rank, one per direction; each carries its
//! messages in order (Rivet's p2p transport is FIFO per connection), so a message is identified
//! by its position and carries no header.
//!
//! - **Reduce-scatter, direct and pipelined** ([`Kind::ReduceScatter`], first half of
//!   [`Kind::Allreduce`]): rank `r` sends each owner `q` the bytes of `q`'s region in chunks of
//!   [`Plan::chunk`] bytes; it receives the chunks of its own region from every peer into
//!   scratch slots and folds chunk `c` once every peer's chunk `c` has arrived, in the order
//!   [`super::layout`] defines. Up to [`Plan::depth`] chunks are in flight per connection.
//! - **Allgather, direct and pipelined** ([`Kind::Allgather`], second half of
//!   [`Kind::Allreduce`]): the owner sends its region to every peer in chunks, as soon as each
//!   chunk is final (folded, for an allreduce).
//! - **Small allreduce** ([`Kind::AllreduceSmall`]): one message each way per peer carrying the
//!   whole vector; every rank folds every segment itself in the same order (one network step
//!   instead of two; `n − 1` times the bytes, so only for small vectors).
//!
//! Per rank and operation the reduce-scatter plus allgather moves `2(n−1)/n` of the vector out
//! and in, like a ring, in two network steps instead of `2(n−1)`.

use super::layout::{MAX_RANKS, Regions, Span};
use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

/// Which collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Reduce-scatter then allgather.
    Allreduce,
    /// Whole vectors to every peer, every rank folds.
    AllreduceSmall,
    /// Reduce-scatter only: each rank ends with its own region reduced.
    ReduceScatter,
    /// Allgather only: each rank ends with every region.
    Allgather,
}

impl Kind {
    const fn reduces(self) -> bool {
        matches!(self, Self::Allreduce | Self::ReduceScatter)
    }
    const fn gathers(self) -> bool {
        matches!(self, Self::Allreduce | Self::Allgather)
    }
}

/// One operation, as every rank of the group describes it alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The collective.
    pub kind: Kind,
    /// Who owns what.
    pub regions: Regions,
    /// Bytes per message (a multiple of the element size; the scratch slot size).
    pub chunk: u64,
    /// Messages in flight per connection and direction (scratch slot rows).
    pub depth: u32,
}

/// A plan or group the schedule cannot run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanError {
    /// `nranks` outside `2..=MAX_RANKS` or `rank ≥ nranks`.
    Group {
        /// Ranks.
        nranks: u32,
        /// This rank.
        rank: u32,
    },
    /// A zero chunk or depth.
    Geometry,
    /// A small allreduce larger than one chunk (it must fit a scratch slot).
    TooLargeForSmall {
        /// The vector's bytes.
        bytes: u64,
        /// The slot size.
        chunk: u64,
    },
    /// More chunks than a `u32` counts.
    TooManyChunks,
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Group { nranks, rank } => write!(
                f,
                "rank {rank} of {nranks}: a group has 2..={MAX_RANKS} ranks and rank < nranks"
            ),
            Self::Geometry => f.write_str("chunk size and depth must be non-zero"),
            Self::TooLargeForSmall { bytes, chunk } => write!(
                f,
                "a small allreduce of {bytes} bytes does not fit one {chunk}-byte slot"
            ),
            Self::TooManyChunks => f.write_str("the operation has more than 2^32 chunks"),
        }
    }
}

/// A scratch slot: row (pipeline position) and column (the rank whose data it holds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// `chunk % depth`.
    pub row: u32,
    /// A rank.
    pub col: u32,
}

/// Where a message's bytes come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The operation's input at this window offset (allreduce, reduce-scatter).
    Input {
        /// Window-relative offset.
        offset: u64,
    },
    /// This rank's own input part at this offset (allgather's `sendData`).
    OwnInput {
        /// Offset into the own part.
        offset: u64,
    },
    /// The operation's output at this window offset (allreduce's folded region).
    Output {
        /// Window-relative offset.
        offset: u64,
    },
}

/// Where a message's bytes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dest {
    /// A scratch slot, for folding.
    Slot(Slot),
    /// The output at this window offset; `stage` is a free slot for a driver whose output is not
    /// contiguous there (scatter-gather parts) and must receive, then copy.
    Output {
        /// Window-relative offset.
        offset: u64,
        /// Staging slot.
        stage: Slot,
    },
}

/// A message to post to `peer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendStep {
    /// Destination rank.
    pub peer: u32,
    /// Bytes.
    pub src: Source,
    /// Length.
    pub len: u64,
    /// A free send-staging slot, for a driver whose input is not contiguous there.
    pub stage: Slot,
}

/// A receive to post from `peer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvStep {
    /// Source rank.
    pub peer: u32,
    /// Where it lands.
    pub dst: Dest,
    /// Length (the sender sends exactly this many bytes).
    pub len: u64,
}

/// Work on this rank's own memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalStep {
    /// Every contribution to chunk `chunk` of the own region has arrived: fold the slots of row
    /// `row` (column `q` holds rank `q`'s bytes) with the own input into the output.
    Fold {
        /// Chunk index within the own region.
        chunk: u32,
        /// Slot row.
        row: u32,
        /// Window-relative offset of the chunk.
        offset: u64,
        /// Offset of the chunk within the own region.
        region_offset: u64,
        /// Bytes.
        len: u64,
    },
    /// Small allreduce: every vector has arrived (row 0, column `q`) and every send completed.
    FoldAll,
    /// Allgather: copy the own input part to its place in the output (window offset `offset`).
    CopyOwn {
        /// Window-relative offset of the own region.
        offset: u64,
        /// Bytes.
        len: u64,
    },
}

#[derive(Clone, Copy, Debug, Default)]
struct Peer {
    sent: u32,
    send_done: u32,
    posted: u32,
    recv_done: u32,
}

/// One rank's schedule; reused operation after operation without allocating.
#[derive(Clone, Debug)]
pub struct Schedule {
    nranks: u32,
    rank: u32,
    peers: Vec<Peer>,
    plan: Option<Plan>,
    /// Chunks of the own region folded (reduce kinds), or 1 once the small fold or own copy ran.
    local_done: u32,
}

impl Schedule {
    /// A schedule for `rank` of `nranks` (allocates the per-peer state once).
    pub fn new(nranks: u32, rank: u32) -> Result<Self, PlanError> {
        if !(2..=MAX_RANKS).contains(&nranks) || rank >= nranks {
            return Err(PlanError::Group { nranks, rank });
        }
        Ok(Self {
            nranks,
            rank,
            peers: vec![Peer::default(); nranks as usize],
            plan: None,
            local_done: 0,
        })
    }

    /// Begin `plan` (the previous operation must be complete, or is abandoned).
    pub fn start(&mut self, plan: Plan) -> Result<(), PlanError> {
        if plan.chunk == 0 || plan.depth == 0 {
            return Err(PlanError::Geometry);
        }
        let bytes = plan.regions.window_len();
        if plan.kind == Kind::AllreduceSmall && bytes > plan.chunk {
            return Err(PlanError::TooLargeForSmall {
                bytes,
                chunk: plan.chunk,
            });
        }
        if bytes.div_ceil(plan.chunk) > u64::from(u32::MAX) {
            return Err(PlanError::TooManyChunks);
        }
        self.peers.fill(Peer::default());
        self.plan = Some(plan);
        self.local_done = 0;
        Ok(())
    }

    /// The running plan.
    pub fn plan(&self) -> Option<&Plan> {
        self.plan.as_ref()
    }

    /// Ranks in the group.
    pub fn nranks(&self) -> u32 {
        self.nranks
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    fn region(&self, plan: &Plan, q: u32) -> Span {
        plan.regions.region(self.nranks, q)
    }

    fn chunks(&self, plan: &Plan, q: u32) -> u32 {
        self.region(plan, q).len.div_ceil(plan.chunk) as u32
    }

    /// Bytes of chunk `c` of `span`.
    fn chunk_len(plan: &Plan, span: Span, c: u32) -> u64 {
        (span.len - u64::from(c) * plan.chunk).min(plan.chunk)
    }

    fn small_bytes(plan: &Plan) -> u64 {
        plan.regions.window_len()
    }

    /// Messages this rank sends `peer` in the reduce-scatter part.
    fn rs_sends(&self, plan: &Plan, peer: u32) -> u32 {
        if plan.kind.reduces() {
            self.chunks(plan, peer)
        } else {
            0
        }
    }

    fn total_sends(&self, plan: &Plan, peer: u32) -> u32 {
        match plan.kind {
            Kind::AllreduceSmall => u32::from(Self::small_bytes(plan) > 0),
            _ => {
                let ag = if plan.kind.gathers() {
                    self.chunks(plan, self.rank)
                } else {
                    0
                };
                self.rs_sends(plan, peer) + ag
            }
        }
    }

    /// Messages this rank receives from `peer` in the reduce-scatter part.
    fn rs_recvs(&self, plan: &Plan) -> u32 {
        if plan.kind.reduces() {
            self.chunks(plan, self.rank)
        } else {
            0
        }
    }

    fn total_recvs(&self, plan: &Plan, peer: u32) -> u32 {
        match plan.kind {
            Kind::AllreduceSmall => u32::from(Self::small_bytes(plan) > 0),
            _ => {
                let ag = if plan.kind.gathers() {
                    self.chunks(plan, peer)
                } else {
                    0
                };
                self.rs_recvs(plan) + ag
            }
        }
    }

    fn peer(&self, peer: u32) -> Option<Peer> {
        (peer != self.rank).then(|| self.peers.get(peer as usize).copied())?
    }

    /// The next message to send `peer`, if one may be posted now.
    pub fn next_send(&self, peer: u32) -> Option<SendStep> {
        let plan = self.plan.as_ref()?;
        let p = self.peer(peer)?;
        let m = p.sent;
        if m >= self.total_sends(plan, peer) || m >= p.send_done + plan.depth {
            return None;
        }
        if plan.kind == Kind::AllreduceSmall {
            return Some(SendStep {
                peer,
                src: Source::Input { offset: 0 },
                len: Self::small_bytes(plan),
                stage: Slot { row: 0, col: peer },
            });
        }
        let rs = self.rs_sends(plan, peer);
        let (c, span, src) = if m < rs {
            let span = self.region(plan, peer);
            let off = u64::from(m) * plan.chunk;
            (
                m,
                span,
                Source::Input {
                    offset: span.offset + off,
                },
            )
        } else {
            let c = m - rs;
            let span = self.region(plan, self.rank);
            let off = u64::from(c) * plan.chunk;
            let src = match plan.kind {
                Kind::Allreduce if c >= self.local_done => return None,
                Kind::Allreduce => Source::Output {
                    offset: span.offset + off,
                },
                _ => Source::OwnInput { offset: off },
            };
            (c, span, src)
        };
        Some(SendStep {
            peer,
            src,
            len: Self::chunk_len(plan, span, c),
            stage: Slot {
                row: c % plan.depth,
                col: peer,
            },
        })
    }

    /// `next_send(peer)` was posted.
    pub fn sent(&mut self, peer: u32) {
        if self.next_send(peer).is_some() {
            self.peers[peer as usize].sent += 1;
        }
    }

    /// The next receive to post from `peer`, if one may be posted now.
    pub fn next_recv(&self, peer: u32) -> Option<RecvStep> {
        let plan = self.plan.as_ref()?;
        let p = self.peer(peer)?;
        let m = p.posted;
        if m >= self.total_recvs(plan, peer) || m >= p.recv_done + plan.depth {
            return None;
        }
        if plan.kind == Kind::AllreduceSmall {
            return Some(RecvStep {
                peer,
                dst: Dest::Slot(Slot { row: 0, col: peer }),
                len: Self::small_bytes(plan),
            });
        }
        let rs = self.rs_recvs(plan);
        if m < rs {
            // A chunk of the own region: its slot row must be free (folded `depth` chunks ago).
            if m >= self.local_done + plan.depth {
                return None;
            }
            let span = self.region(plan, self.rank);
            return Some(RecvStep {
                peer,
                dst: Dest::Slot(Slot {
                    row: m % plan.depth,
                    col: peer,
                }),
                len: Self::chunk_len(plan, span, m),
            });
        }
        let c = m - rs;
        // An allreduce receives the owner's chunk where this rank's input of the same chunk
        // was: with the send and receive buffers the same (in place), only after that send
        // completed may the peer's write land there.
        if plan.kind == Kind::Allreduce && p.send_done <= c {
            return None;
        }
        let span = self.region(plan, peer);
        Some(RecvStep {
            peer,
            dst: Dest::Output {
                offset: span.offset + u64::from(c) * plan.chunk,
                stage: Slot {
                    row: c % plan.depth,
                    col: peer,
                },
            },
            len: Self::chunk_len(plan, span, c),
        })
    }

    /// `next_recv(peer)` was posted.
    pub fn posted(&mut self, peer: u32) {
        if self.next_recv(peer).is_some() {
            self.peers[peer as usize].posted += 1;
        }
    }

    fn all_peers(&self, f: impl Fn(&Peer) -> bool) -> bool {
        self.peers
            .iter()
            .enumerate()
            .all(|(q, p)| q == self.rank as usize || f(p))
    }

    /// Local work that may run now.
    pub fn next_local(&self) -> Option<LocalStep> {
        let plan = self.plan.as_ref()?;
        match plan.kind {
            Kind::AllreduceSmall => (self.local_done == 0
                && Self::small_bytes(plan) > 0
                && self.all_peers(|p| p.recv_done >= 1 && p.send_done >= 1))
            .then_some(LocalStep::FoldAll),
            Kind::Allgather => {
                let span = self.region(plan, self.rank);
                (self.local_done == 0 && span.len > 0).then_some(LocalStep::CopyOwn {
                    offset: span.offset,
                    len: span.len,
                })
            }
            Kind::Allreduce | Kind::ReduceScatter => {
                let c = self.local_done;
                if c >= self.chunks(plan, self.rank) || !self.all_peers(|p| p.recv_done > c) {
                    return None;
                }
                let span = self.region(plan, self.rank);
                let region_offset = u64::from(c) * plan.chunk;
                Some(LocalStep::Fold {
                    chunk: c,
                    row: c % plan.depth,
                    offset: span.offset + region_offset,
                    region_offset,
                    len: Self::chunk_len(plan, span, c),
                })
            }
        }
    }

    /// `next_local()` was performed.
    pub fn done_local(&mut self) {
        if self.next_local().is_some() {
            self.local_done += 1;
        }
    }

    /// The oldest outstanding send to `peer` completed.
    pub fn send_completed(&mut self, peer: u32) {
        if let Some(p) = self.peers.get_mut(peer as usize) {
            if p.send_done < p.sent {
                p.send_done += 1;
            }
        }
    }

    /// The oldest outstanding receive from `peer` completed.
    pub fn recv_completed(&mut self, peer: u32) {
        if let Some(p) = self.peers.get_mut(peer as usize) {
            if p.recv_done < p.posted {
                p.recv_done += 1;
            }
        }
    }

    /// Sends to `peer` posted and not yet completed.
    pub fn sends_in_flight(&self, peer: u32) -> u32 {
        self.peers
            .get(peer as usize)
            .map_or(0, |p| p.sent - p.send_done)
    }

    /// Receives from `peer` posted and not yet completed.
    pub fn recvs_in_flight(&self, peer: u32) -> u32 {
        self.peers
            .get(peer as usize)
            .map_or(0, |p| p.posted - p.recv_done)
    }

    /// Whether every message was sent and received and the local work done.
    pub fn is_done(&self) -> bool {
        let Some(plan) = self.plan.as_ref() else {
            return true;
        };
        let local = match plan.kind {
            Kind::AllreduceSmall => Self::small_bytes(plan) == 0 || self.local_done == 1,
            Kind::Allgather => self.region(plan, self.rank).len == 0 || self.local_done == 1,
            Kind::Allreduce | Kind::ReduceScatter => {
                self.local_done == self.chunks(plan, self.rank)
            }
        };
        local
            && self.peers.iter().enumerate().all(|(q, p)| {
                q == self.rank as usize
                    || (p.send_done == self.total_sends(plan, q as u32)
                        && p.recv_done == self.total_recvs(plan, q as u32))
            })
    }
}

#[cfg(test)]
mod tests;
