//! A CollNet group's data path: the queue of operations NCCL posted, and the driver that runs
//! the head operation's [`Schedule`] over the group's p2p connections (`isend`/`irecv`/`test` of
//! [`crate::comm`]) and the reduction kernels of `rivet_core::collnet`.
//!
//! Operations run one after another in posting order: every rank posts them in the same order,
//! and each connection carries one operation's messages before the next one's. Everything is
//! allocated when the group forms; posting and testing allocate nothing.
//!
//! Unsafe (opted in): the CPU reads NCCL's send buffers and writes its receive buffers (folds,
//! staging copies) through raw addresses. Every range was checked against its registration when
//! the operation was posted, and NCCL keeps the buffers alive until `test` reports the
//! operation done.

#![allow(unsafe_code)]

use super::scratch::Scratch;
use crate::backend::OpenPort;
use crate::comm::{self, RecvArgs};
use crate::error::{ErrorClass, NetError, NetResult};
use crate::handle::Ptr;
use rivet_core::collnet::layout::{Regions, fold_all, fold_owned};
use rivet_core::collnet::reduce::Reduction;
use rivet_core::collnet::schedule::{
    Dest, Kind, LocalStep, Plan, RecvStep, Schedule, SendStep, Slot, Source,
};
use rivet_core::data::Completed;
use std::sync::{Arc, Mutex};

/// Messages in flight per connection and direction (and scratch slot rows).
pub(crate) const DEPTH: u32 = 4;
/// Operations a group queues before `iallreduce` & co. answer "not now" (a NULL request).
const MAX_OPS: usize = 64;
/// Scatter-gather parts an `iallgather`/`ireducescatter` may name.
pub(crate) const MAX_PARTS: usize = 8;
/// Allreduces up to this size send whole vectors and fold on every rank (one network step).
const SMALL_BYTES: u64 = 16 << 10;
/// Scratch budget for the receive slots (the send-staging slots take as much again).
const SLOT_BUDGET: u64 = 8 << 20;

/// Bytes per message for a group of `nranks`: the slot budget over `DEPTH × nranks` slots,
/// between 16 KiB and 512 KiB, a multiple of 4 KiB (every element size divides it). Every rank
/// computes the same value, which the schedule requires.
pub(crate) fn chunk_for(nranks: u32) -> u64 {
    let per_slot = SLOT_BUDGET / (u64::from(DEPTH) * u64::from(nranks.max(1)));
    per_slot.clamp(16 << 10, 512 << 10) & !4095
}

/// Bytes of receive slots (and of send slots) for `nranks` ranks.
pub(crate) fn slot_area(nranks: u32) -> usize {
    (u64::from(DEPTH) * u64::from(nranks) * chunk_for(nranks)) as usize
}

/// One registered part of a buffer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Part {
    /// First byte.
    pub(crate) addr: u64,
    /// Bytes.
    pub(crate) len: u64,
    /// Its registration.
    pub(crate) mh: Ptr,
}

/// A buffer as NCCL names it: one part, or a scatter-gather list.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Parts {
    parts: [Part; MAX_PARTS],
    n: usize,
}

impl Parts {
    /// No parts.
    pub(crate) fn empty() -> Self {
        Self {
            parts: [Part {
                addr: 0,
                len: 0,
                mh: core::ptr::null_mut(),
            }; MAX_PARTS],
            n: 0,
        }
    }

    /// A contiguous buffer.
    pub(crate) fn one(addr: u64, len: u64, mh: Ptr) -> Self {
        let mut p = Self::empty();
        p.parts[0] = Part { addr, len, mh };
        p.n = 1;
        p
    }

    /// Append a part; `false` past [`MAX_PARTS`].
    pub(crate) fn push(&mut self, part: Part) -> bool {
        if self.n == MAX_PARTS {
            return false;
        }
        self.parts[self.n] = part;
        self.n += 1;
        true
    }

    /// Total bytes.
    pub(crate) fn total(&self) -> u64 {
        self.parts[..self.n].iter().map(|p| p.len).sum()
    }

    /// Address and registration of `offset .. offset + len` if it lies inside one part.
    fn contiguous(&self, offset: u64, len: u64) -> Option<(u64, Ptr)> {
        let mut start = 0;
        for p in &self.parts[..self.n] {
            if offset >= start && offset + len <= start + p.len {
                return Some((p.addr + (offset - start), p.mh));
            }
            start += p.len;
        }
        None
    }

    /// The pieces of `offset .. offset + len`, part by part: `(address, bytes, offset in range)`.
    fn pieces(&self, offset: u64, len: u64, mut f: impl FnMut(u64, u64, u64)) {
        let (end, mut start) = (offset + len, 0);
        for p in &self.parts[..self.n] {
            let (lo, hi) = (offset.max(start), end.min(start + p.len));
            if lo < hi {
                f(p.addr + (lo - start), hi - lo, lo - offset);
            }
            start += p.len;
        }
    }
}

/// One posted operation, as every rank describes it alike.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OpSpec {
    /// The schedule's plan.
    pub(crate) plan: Plan,
    /// The arithmetic (`None` for allgather).
    pub(crate) reduction: Option<Reduction>,
    /// Where the input is (window-relative; allgather: the own part).
    pub(crate) input: Parts,
    /// Where the output goes (window-relative; reduce-scatter: the own part).
    pub(crate) output: Parts,
    /// What `test` reports as the size.
    pub(crate) bytes: u64,
}

impl OpSpec {
    /// An allreduce of `count` elements (small vectors take the one-step algorithm).
    pub(crate) fn allreduce(
        nranks: u32,
        count: u64,
        reduction: Reduction,
        input: Parts,
        output: Parts,
    ) -> Self {
        let elem = reduction.dtype.size() as u64;
        let chunk = chunk_for(nranks);
        let bytes = count * elem;
        let kind = if bytes <= SMALL_BYTES.min(chunk) {
            Kind::AllreduceSmall
        } else {
            Kind::Allreduce
        };
        Self {
            plan: Plan {
                kind,
                regions: Regions::Split { count, elem },
                chunk,
                depth: DEPTH,
            },
            reduction: Some(reduction),
            input,
            output,
            bytes,
        }
    }

    /// A reduce-scatter or allgather over a window of the `nranks × bytes_per_rank` vector.
    pub(crate) fn windowed(
        nranks: u32,
        regions: Regions,
        reduction: Option<Reduction>,
        input: Parts,
        output: Parts,
        bytes: u64,
    ) -> Self {
        let kind = if reduction.is_some() {
            Kind::ReduceScatter
        } else {
            Kind::Allgather
        };
        Self {
            plan: Plan {
                kind,
                regions,
                chunk: chunk_for(nranks),
                depth: DEPTH,
            },
            reduction,
            input,
            output,
            bytes,
        }
    }
}

/// A request in flight on one connection, with what to do when it completes.
#[derive(Clone, Copy, Debug)]
struct InFlight {
    request: Ptr,
    len: u64,
    /// Received into a staging slot: copy `len` bytes from the slot to this output offset.
    unstage: Option<(Slot, u64)>,
}

/// A fixed ring of at most [`DEPTH`] requests.
#[derive(Clone, Copy, Debug)]
struct Ring {
    items: [Option<InFlight>; DEPTH as usize],
    head: usize,
    len: usize,
}

impl Ring {
    const EMPTY: Self = Self {
        items: [None; DEPTH as usize],
        head: 0,
        len: 0,
    };

    fn push(&mut self, item: InFlight) {
        let at = (self.head + self.len) % self.items.len();
        self.items[at] = Some(item);
        self.len += 1;
    }

    fn front(&self) -> Option<InFlight> {
        if self.len == 0 {
            None
        } else {
            self.items[self.head]
        }
    }

    fn pop(&mut self) {
        if self.len > 0 {
            self.items[self.head] = None;
            self.head = (self.head + 1) % self.items.len();
            self.len -= 1;
        }
    }

    fn all(&self) -> impl Iterator<Item = InFlight> + '_ {
        (0..self.len).filter_map(|i| self.items[(self.head + i) % self.items.len()])
    }
}

#[derive(Clone, Copy, Debug)]
enum OpState {
    Free,
    Queued(OpSpec),
    Running(OpSpec),
    Done(u64),
}

#[derive(Clone, Copy, Debug)]
struct OpSlot {
    id: u32,
    state: OpState,
}

/// A group's connections, by rank (NULL at the own rank).
#[derive(Debug)]
pub(crate) struct Links {
    /// Send comms (this rank → rank q).
    pub(crate) sends: Vec<Ptr>,
    /// Receive comms (rank q → this rank).
    pub(crate) recvs: Vec<Ptr>,
}

/// An established group.
#[derive(Debug)]
pub(crate) struct CollComm {
    /// Ranks.
    pub(crate) nranks: u32,
    /// This rank.
    pub(crate) rank: u32,
    /// The port every connection and registration of the group uses.
    pub(crate) port: Arc<OpenPort>,
    /// The connections.
    pub(crate) links: Links,
    /// Slots and staging.
    pub(crate) scratch: Scratch,
    /// `scratch`'s registration.
    pub(crate) scratch_mh: Ptr,
    engine: Mutex<Engine>,
}

// SAFETY: the raw handles inside (`Ptr`s of comms and registrations) are opaque table handles,
// never dereferenced; the scratch memory is `Sync` itself and the engine is behind a mutex.
unsafe impl Send for CollComm {}
// SAFETY: as above.
unsafe impl Sync for CollComm {}

#[derive(Debug)]
struct Engine {
    schedule: Schedule,
    ops: Vec<OpSlot>,
    /// Next id to hand out (never 0).
    next_id: u32,
    /// Oldest operation not yet finished.
    oldest: u32,
    sends: Vec<Ring>,
    recvs: Vec<Ring>,
    failure: Option<(ErrorClass, String)>,
}

fn next(id: u32) -> u32 {
    id.checked_add(1).unwrap_or(1)
}

/// The bytes at `addr`.
///
/// # Safety
/// `addr .. addr + len` is readable memory of this process that nothing writes while the slice
/// lives.
unsafe fn bytes<'a>(addr: u64, len: u64) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: the caller's promise.
    unsafe { core::slice::from_raw_parts(addr as *const u8, len as usize) }
}

/// The bytes at `addr`, writable.
///
/// # Safety
/// `addr .. addr + len` is writable memory of this process that nothing else reads or writes
/// while the slice lives.
unsafe fn bytes_mut<'a>(addr: u64, len: u64) -> &'a mut [u8] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: the caller's promise.
    unsafe { core::slice::from_raw_parts_mut(addr as *mut u8, len as usize) }
}

fn overlaps(a: u64, b: u64, len: u64) -> bool {
    a < b + len && b < a + len
}

impl CollComm {
    /// A group over established `links`, with its registered `scratch`.
    pub(crate) fn new(
        nranks: u32,
        rank: u32,
        port: Arc<OpenPort>,
        links: Links,
        scratch: Scratch,
        scratch_mh: Ptr,
    ) -> NetResult<Self> {
        let schedule = Schedule::new(nranks, rank)
            .map_err(|e| NetError::invalid_usage(format!("CollNet connect: {e}")))?;
        let engine = Engine {
            schedule,
            ops: vec![
                OpSlot {
                    id: 0,
                    state: OpState::Free
                };
                MAX_OPS
            ],
            next_id: 1,
            oldest: 1,
            sends: vec![Ring::EMPTY; nranks as usize],
            recvs: vec![Ring::EMPTY; nranks as usize],
            failure: None,
        };
        Ok(Self {
            nranks,
            rank,
            port,
            links,
            scratch,
            scratch_mh,
            engine: Mutex::new(engine),
        })
    }

    fn chunk(&self) -> u64 {
        chunk_for(self.nranks)
    }

    /// Offset in `scratch` of receive slot `slot`.
    fn recv_slot(&self, slot: Slot) -> usize {
        ((slot.row as usize * self.nranks as usize) + slot.col as usize) * self.chunk() as usize
    }

    /// Offset in `scratch` of send-staging slot `slot`.
    fn send_slot(&self, slot: Slot) -> usize {
        slot_area(self.nranks) + self.recv_slot(slot)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Engine> {
        self.engine.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queue `spec`; its id, or `None` when the queue is full (NCCL retries).
    pub(crate) fn post(&self, spec: OpSpec) -> NetResult<Option<u32>> {
        let mut engine = self.lock();
        engine.check()?;
        let id = engine.next_id;
        let slot = &mut engine.ops[id as usize % MAX_OPS];
        if !matches!(slot.state, OpState::Free) {
            return Ok(None);
        }
        *slot = OpSlot {
            id,
            state: OpState::Queued(spec),
        };
        engine.next_id = next(id);
        // Start moving data now: the first messages go out before NCCL's first `test`.
        engine.progress(self)?;
        Ok(Some(id))
    }

    /// `test` of operation `id`: the size to report once it is done.
    pub(crate) fn test(&self, id: u32) -> NetResult<Option<u64>> {
        let mut engine = self.lock();
        engine.check()?;
        let slot = engine.ops[id as usize % MAX_OPS];
        if slot.id != id || matches!(slot.state, OpState::Free) {
            return Err(NetError::misuse(format!(
                "CollNet test: request {id} is not an operation in flight (completed and tested already?)"
            )));
        }
        if !matches!(slot.state, OpState::Done(_)) {
            engine.progress(self)?;
        }
        let slot = &mut engine.ops[id as usize % MAX_OPS];
        match slot.state {
            OpState::Done(bytes) => {
                slot.state = OpState::Free;
                Ok(Some(bytes))
            }
            _ => Ok(None),
        }
    }
}

impl Engine {
    fn check(&self) -> NetResult<()> {
        match &self.failure {
            Some((class, message)) => Err(NetError::new(*class, message.clone()).logged()),
            None => Ok(()),
        }
    }

    /// Record the group's failure (sticky: every later call reports it).
    fn fail(&mut self, comm: &CollComm, peer: Option<u32>, err: &NetError) -> NetError {
        let whom = peer.map_or(String::new(), |p| format!(" with rank {p}"));
        let message = format!(
            "CollNet rank {}/{}: the group failed{whom}: {}",
            comm.rank,
            comm.nranks,
            err.message()
        );
        self.failure = Some((err.class(), message.clone()));
        NetError::new(err.class(), message)
    }

    fn running(&self) -> Option<OpSpec> {
        match self.ops[self.oldest as usize % MAX_OPS] {
            OpSlot {
                id,
                state: OpState::Running(spec),
            } if id == self.oldest => Some(spec),
            _ => None,
        }
    }

    /// Start the oldest queued operation if none runs; `false` if there is none.
    fn start_next(&mut self) -> NetResult<bool> {
        if self.running().is_some() {
            return Ok(true);
        }
        let at = self.oldest as usize % MAX_OPS;
        let OpSlot {
            id,
            state: OpState::Queued(spec),
        } = self.ops[at]
        else {
            return Ok(false);
        };
        if id != self.oldest {
            return Ok(false);
        }
        self.schedule
            .start(spec.plan)
            .map_err(|e| NetError::invalid_argument(format!("CollNet: {e}")))?;
        self.ops[at].state = OpState::Running(spec);
        Ok(true)
    }

    /// Move the running operations forward as far as they go without waiting.
    fn progress(&mut self, comm: &CollComm) -> NetResult<()> {
        loop {
            if !self.start_next()? {
                return Ok(());
            }
            let Some(spec) = self.running() else {
                return Ok(());
            };
            let mut moved = false;
            for i in 1..comm.nranks {
                let peer = (comm.rank + i) % comm.nranks;
                match self.drive_peer(comm, &spec, peer) {
                    Ok(m) => moved |= m,
                    Err(e) => return Err(self.fail(comm, Some(peer), &e)),
                }
            }
            while let Some(step) = self.schedule.next_local() {
                if let Err(e) = self.local(comm, &spec, step) {
                    return Err(self.fail(comm, None, &e));
                }
                self.schedule.done_local();
                moved = true;
            }
            if self.schedule.is_done() {
                let at = self.oldest as usize % MAX_OPS;
                self.ops[at].state = OpState::Done(spec.bytes);
                self.oldest = next(self.oldest);
                continue;
            }
            if !moved {
                return Ok(());
            }
        }
    }

    /// Completions and new posts on the connections with `peer`; whether anything happened.
    fn drive_peer(&mut self, comm: &CollComm, spec: &OpSpec, peer: u32) -> NetResult<bool> {
        let p = peer as usize;
        let mut moved = false;
        while let Some(done) = self.sends[p].front() {
            if comm::internal::test(done.request)? == Completed::Pending {
                break;
            }
            self.sends[p].pop();
            self.schedule.send_completed(peer);
            moved = true;
        }
        while let Some(done) = self.recvs[p].front() {
            let Completed::Done { n, sizes } = comm::internal::test(done.request)? else {
                break;
            };
            if n != 1 || u64::from(sizes[0]) != done.len {
                return Err(NetError::remote(format!(
                    "rank {peer} sent {} bytes where this rank expected {} (the ranks disagree on \
                     the operation: were they posted in the same order with the same arguments?)",
                    sizes[0], done.len
                )));
            }
            if let Some((slot, offset)) = done.unstage {
                let from = comm.recv_slot(slot);
                // SAFETY: the receive into the slot completed; nothing else uses the slot until
                // the schedule hands it out again, after this.
                let src = unsafe { comm.scratch.bytes(from, done.len as usize) };
                spec.output.pieces(offset, done.len, |addr, len, at| {
                    let at = at as usize;
                    // SAFETY: the output range was checked against its registration at post;
                    // the schedule gives each output byte exactly one writer.
                    unsafe { bytes_mut(addr, len) }.copy_from_slice(&src[at..at + len as usize]);
                });
            }
            self.recvs[p].pop();
            self.schedule.recv_completed(peer);
            moved = true;
        }
        while let Some(step) = self.schedule.next_send(peer) {
            if !self.post_send(comm, spec, step)? {
                break;
            }
            self.schedule.sent(peer);
            moved = true;
        }
        while let Some(step) = self.schedule.next_recv(peer) {
            if !self.post_recv(comm, spec, step)? {
                break;
            }
            self.schedule.posted(peer);
            moved = true;
        }
        Ok(moved)
    }

    fn post_send(&mut self, comm: &CollComm, spec: &OpSpec, step: SendStep) -> NetResult<bool> {
        let (parts, offset) = match step.src {
            Source::Input { offset } | Source::OwnInput { offset } => (&spec.input, offset),
            Source::Output { offset } => (&spec.output, offset),
        };
        let (addr, mh) = match parts.contiguous(offset, step.len) {
            Some(found) => found,
            None => {
                // Spread over several scatter-gather parts: gather into a send slot.
                let at = comm.send_slot(step.stage);
                // SAFETY: the schedule hands out this send slot only to this message until it
                // completes; no transfer reads it before the isend below.
                let dst = unsafe { comm.scratch.bytes_mut(at, step.len as usize) };
                parts.pieces(offset, step.len, |addr, len, at| {
                    let at = at as usize;
                    // SAFETY: inside a part checked against its registration at post.
                    dst[at..at + len as usize].copy_from_slice(unsafe { bytes(addr, len) });
                });
                (comm.scratch.addr(at), comm.scratch_mh)
            }
        };
        let request = comm::internal::isend(
            comm.links.sends[step.peer as usize],
            addr as Ptr,
            step.len as usize,
            0,
            mh,
        )?;
        if request.is_null() {
            return Ok(false);
        }
        self.sends[step.peer as usize].push(InFlight {
            request,
            len: step.len,
            unstage: None,
        });
        Ok(true)
    }

    fn post_recv(&mut self, comm: &CollComm, spec: &OpSpec, step: RecvStep) -> NetResult<bool> {
        let (addr, mh, unstage) = match step.dst {
            Dest::Slot(slot) => (
                comm.scratch.addr(comm.recv_slot(slot)),
                comm.scratch_mh,
                None,
            ),
            Dest::Output { offset, stage } => match spec.output.contiguous(offset, step.len) {
                Some((addr, mh)) => (addr, mh, None),
                None => (
                    comm.scratch.addr(comm.recv_slot(stage)),
                    comm.scratch_mh,
                    Some((stage, offset)),
                ),
            },
        };
        let mut args = RecvArgs {
            n: 1,
            data: [core::ptr::null_mut(); 8],
            sizes: [0; 8],
            tags: [0; 8],
            mhandles: [core::ptr::null_mut(); 8],
        };
        args.data[0] = addr as Ptr;
        args.sizes[0] = step.len as usize;
        args.mhandles[0] = mh;
        let request = comm::internal::irecv(comm.links.recvs[step.peer as usize], &args)?;
        if request.is_null() {
            return Ok(false);
        }
        self.recvs[step.peer as usize].push(InFlight {
            request,
            len: step.len,
            unstage,
        });
        Ok(true)
    }

    /// The own input of `offset .. offset + len`, readable while `dst_addr .. + dst_len` is
    /// written: in place, or spread over parts, it is first copied to the own column of slot row
    /// `row`.
    ///
    /// # Safety
    /// Called only from a local step, when no transfer uses the own column of row `row`.
    unsafe fn own_input<'a>(
        comm: &'a CollComm,
        spec: &OpSpec,
        offset: u64,
        len: u64,
        row: u32,
        dst_addr: u64,
        dst_len: u64,
    ) -> &'a [u8] {
        match spec.input.contiguous(offset, len) {
            Some((addr, _)) if !overlaps(addr, dst_addr, len.max(dst_len)) => {
                // SAFETY: checked against the registration at post; no transfer writes the input.
                unsafe { bytes(addr, len) }
            }
            _ => {
                let at = comm.recv_slot(Slot {
                    row,
                    col: comm.rank,
                });
                // SAFETY: the own column is never a receive target (the caller's promise).
                let copy = unsafe { comm.scratch.bytes_mut(at, len as usize) };
                spec.input.pieces(offset, len, |addr, n, at| {
                    let at = at as usize;
                    // SAFETY: inside a checked input part.
                    copy[at..at + n as usize].copy_from_slice(unsafe { bytes(addr, n) });
                });
                copy
            }
        }
    }

    fn local(&mut self, comm: &CollComm, spec: &OpSpec, step: LocalStep) -> NetResult<()> {
        let n = comm.nranks;
        let arithmetic = |e: rivet_core::collnet::reduce::ReduceError| {
            NetError::misuse(format!("CollNet: reduction: {e}"))
        };
        match step {
            LocalStep::Fold {
                row,
                offset,
                region_offset,
                len,
                ..
            } => {
                let reduction = spec
                    .reduction
                    .ok_or_else(|| NetError::misuse("CollNet: a fold without a reduction"))?;
                let out_at = if spec.plan.kind == Kind::ReduceScatter {
                    region_offset
                } else {
                    offset
                };
                let (dst_addr, _) = spec.output.contiguous(out_at, len).ok_or_else(|| {
                    NetError::misuse("CollNet: the output of a fold is not contiguous")
                })?;
                // SAFETY: a local step runs when every receive of the row completed and the own
                // column is unused.
                let own = unsafe { Self::own_input(comm, spec, offset, len, row, dst_addr, len) };
                // SAFETY: the output chunk was checked at post; only this fold writes it and no
                // transfer reads it until the schedule sends it (after this step).
                let dst = unsafe { bytes_mut(dst_addr, len) };
                fold_owned(&reduction, n, comm.rank, dst, own, |q| {
                    let at = comm.recv_slot(Slot { row, col: q });
                    // SAFETY: every peer's receive into row `row` completed (the schedule's
                    // condition for this step) and none is posted again before it is done.
                    unsafe { comm.scratch.bytes(at, len as usize) }
                })
                .map_err(arithmetic)
            }
            LocalStep::FoldAll => {
                let reduction = spec
                    .reduction
                    .ok_or_else(|| NetError::misuse("CollNet: a fold without a reduction"))?;
                let total = spec.plan.regions.window_len();
                let (dst_addr, _) = spec.output.contiguous(0, total).ok_or_else(|| {
                    NetError::misuse("CollNet: the output of an allreduce is not contiguous")
                })?;
                // SAFETY: every send and receive of the operation completed (the schedule's
                // condition for this step).
                let own = unsafe { Self::own_input(comm, spec, 0, total, 0, dst_addr, total) };
                // SAFETY: checked at post; nothing else touches the output now.
                let dst = unsafe { bytes_mut(dst_addr, total) };
                fold_all(&reduction, n, &spec.plan.regions, dst, |q| {
                    if q == comm.rank {
                        own
                    } else {
                        let at = comm.recv_slot(Slot { row: 0, col: q });
                        // SAFETY: every receive completed.
                        unsafe { comm.scratch.bytes(at, total as usize) }
                    }
                })
                .map_err(arithmetic)
            }
            LocalStep::CopyOwn { offset, len } => {
                let (src, _) = spec.input.contiguous(0, len).ok_or_else(|| {
                    NetError::misuse("CollNet: the own part of an allgather is not contiguous")
                })?;
                spec.output.pieces(offset, len, |addr, n, at| {
                    // SAFETY: both ranges were checked at post; `copy` allows overlap (an
                    // allgather in place).
                    unsafe {
                        core::ptr::copy((src + at) as *const u8, addr as *mut u8, n as usize)
                    };
                });
                Ok(())
            }
        }
    }

    /// Every request still in flight (for close).
    fn in_flight(&self) -> usize {
        self.sends
            .iter()
            .chain(&self.recvs)
            .map(|r| r.all().count())
            .sum()
    }
}

impl CollComm {
    /// Requests still posted on the connections (they are abandoned when the group closes).
    pub(crate) fn in_flight(&self) -> usize {
        self.lock().in_flight()
    }
}
