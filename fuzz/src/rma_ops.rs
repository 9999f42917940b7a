//! One-sided RMA ([`rivet_core::rma`]): arbitrary groups, windows and operations planned and
//! admitted, completions delivered as RC queue pairs deliver them, requests tested (live, stale
//! and bogus handles), checked against a model:
//!
//! - every plan and every refusal is what the model predicts (the window checks, the signal's
//!   operation and alignment, inline only for short puts from host memory, the flush read);
//!   every accepted plan's addresses lie inside the window entry they were checked against
//!   (`base <= addr`, `addr + len <= base + len`, no overflow), its pieces tile the transfer, and
//!   a refused operation never produces a request;
//! - the completion queue behaves as RC queue pairs make it: on one lane (context index, peer)
//!   completions come in posting order, lanes interleave arbitrarily; an unsignaled piece reports
//!   only when it fails; after the first failure on a lane every remaining work request of that
//!   lane completes with a flush error;
//! - a request tests Done only once its last completion came with success, and exactly once
//!   (then its handle is unknown); after a failure on a lane every request on it whose last
//!   completion had not come tests failed at once (`PeerFailed` naming the lane's rank, context
//!   and first status), later operations on the lane are refused, other lanes are unaffected;
//!   `has_error` is true iff some lane saw a failure, `failed_lanes` counts the lanes that did;
//! - `reserved()` is the sum of the work requests of posted operations whose last completion has
//!   not come, never above the completion queue's depth; per lane at most
//!   [`MAX_REQUESTS_PER_LANE`] requests and [`LANE_QUEUE_DEPTH`] work requests; stale and bogus
//!   handles and completions change nothing; once everything completed and was tested,
//!   `outstanding()` and `reserved()` are 0.

use std::collections::{BTreeMap, VecDeque};

use arbitrary::Arbitrary;
use rivet_core::nic::{MAX_WR_BYTES, WcStatus};
use rivet_core::rma::{
    LANE_QUEUE_DEPTH, MAX_REQUESTS_PER_LANE, PIECE_MARK, Plan, RequestId, Requests, RmaError,
    SIGNAL_OP_ADD, SIGNAL_OP_INC, SignalAdd, Tested, Transfer, Which, Window, WindowEntry,
    plan_flush, plan_get, plan_put, plan_put_signal,
};

pub mod seeds;

/// The own window entry is real memory the plugin registered: it lies in a 57-bit address space
/// (5-level paging) and is at most 64 TiB long. Peers' entries are arbitrary (untrusted).
const OWN_BASE_SPAN: u64 = 1 << 56;
const OWN_MAX_LEN: u64 = 1 << 46;

/// Plan operations one input may run (with repeats), to keep an execution fast.
const MAX_PLANNED: usize = 8192;

/// Where in a window entry, or how many bytes; resolved against an entry's length.
#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Amount {
    /// 0.
    Zero,
    /// A few bytes.
    Small(u8),
    /// `len * k / 255`.
    Frac(u8),
    /// `len - k` (0 below).
    FromEnd(u16),
    /// `k` GiB and `r` bytes: transfers of several work requests.
    Gib(u8, u16),
    /// Anything.
    Raw(u64),
}

impl Amount {
    fn resolve(self, len: u64) -> u64 {
        match self {
            Self::Zero => 0,
            Self::Small(k) => u64::from(k),
            Self::Frac(k) => (u128::from(len) * u128::from(k) / 255) as u64,
            Self::FromEnd(k) => len.saturating_sub(u64::from(k)),
            Self::Gib(k, r) => (u64::from(k) << 30) + u64::from(r),
            Self::Raw(x) => x,
        }
    }
}

/// A window entry's first address.
#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Base {
    /// Page `k` (`k * 4096`).
    Page(u16),
    /// `u64::MAX - k`: ranges near the top of the address space.
    NearTop(u32),
    /// Anything.
    Raw(u64),
}

/// A window entry's length.
#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Len {
    /// Bytes.
    Bytes(u16),
    /// `k` GiB and `r` bytes.
    Gib(u8, u32),
    /// Anything.
    Raw(u64),
}

/// One rank's entry of a window.
#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntrySpec {
    pub base: Base,
    pub len: Len,
    pub rkey: u32,
}

/// A window: entries for every rank (the given ones repeated), or exactly the given ones
/// (`ragged`: too few or too many for the group).
#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
pub struct WindowSpec {
    pub host: bool,
    pub ragged: bool,
    pub lkey: u32,
    pub entries: Vec<EntrySpec>,
}

/// A put's windows and offsets (for a put with signal).
#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
pub struct PutArgs {
    pub src: u8,
    pub src_off: Amount,
    pub dst: u8,
    pub dst_off: Amount,
}

/// A completion status.
#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Success,
    FlushErr,
    RetryExc,
    RemAccess,
    LocProt,
    RnrRetry,
    General,
    /// Any status (0 is success).
    Raw(u32),
}

impl Status {
    fn wc(self) -> WcStatus {
        match self {
            Self::Success => WcStatus::SUCCESS,
            Self::FlushErr => WcStatus::WR_FLUSH_ERR,
            Self::RetryExc => WcStatus::RETRY_EXC_ERR,
            Self::RemAccess => WcStatus::REM_ACCESS_ERR,
            Self::LocProt => WcStatus::LOC_PROT_ERR,
            Self::RnrRetry => WcStatus::RNR_RETRY_EXC_ERR,
            Self::General => WcStatus::GENERAL_ERR,
            Self::Raw(s) => WcStatus(s),
        }
    }
}

/// A request handle NCCL might pass.
#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handle {
    /// The `k`-th request NCCL holds.
    Live(u8),
    /// One it was already told about (or never got).
    Stale(u8),
    /// Any bits.
    Bogus(u32),
}

/// One step. `ctx` and `target` pick mostly valid indices (and one past the end), a few
/// values at the top of the byte pick hostile ones. `post_fails`: posting the work requests
/// fails with that errno, and the request is abandoned.
#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Put {
        ctx: u8,
        target: u8,
        src: u8,
        src_off: Amount,
        size: Amount,
        dst: u8,
        dst_off: Amount,
        post_fails: Option<u8>,
    },
    PutSignal {
        ctx: u8,
        target: u8,
        put: Option<PutArgs>,
        size: Amount,
        signal: u8,
        signal_off: Amount,
        op: u8,
        value: u64,
        post_fails: Option<u8>,
    },
    Get {
        ctx: u8,
        target: u8,
        remote: u8,
        remote_off: Amount,
        size: Amount,
        local: u8,
        local_off: Amount,
        post_fails: Option<u8>,
    },
    Flush {
        ctx: u8,
        window: u8,
        post_fails: Option<u8>,
    },
    /// The last operation again, `1 + k % 64` times.
    Repeat(u8),
    /// The next `1 + count % 8` work requests of a lane with some posted complete (`status`
    /// for the first, flush errors after a failure).
    Complete {
        lane: u8,
        count: u8,
        status: Status,
    },
    /// Every posted work request completes, the lanes interleaved by `order` (successfully,
    /// unless the lane failed).
    CompleteAll(u8),
    Test(Handle),
    TestAll,
    /// A completion for a handle no request on the queue has (stale or bogus).
    Spurious {
        handle: Handle,
        piece: bool,
        high: bool,
        status: Status,
    },
    /// `abandon` of a handle that is not a posted request's.
    AbandonStale {
        handle: Handle,
        errno: i32,
    },
    /// `begin` on a lane index past the last.
    BeginBadLane {
        past: u16,
        work_requests: u32,
    },
}

/// The target's input, decoded from libFuzzer's bytes by `arbitrary`.
#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
pub struct Input {
    /// 1..=9 ranks.
    pub nranks: u8,
    /// The own rank (mod nranks).
    pub rank: u8,
    /// 1..=3 context indices.
    pub contexts: u8,
    /// rankStride 1..=4.
    pub stride: u8,
    pub cq_depth: u16,
    /// The lane's inline size: 0, 64, 220, 1024 (255: `u32::MAX`).
    pub max_inline: u8,
    /// 1..=4 windows (none: one window of 4 KiB per rank).
    pub windows: Vec<WindowSpec>,
    pub ops: Vec<Op>,
}

/// A request the core holds: NCCL holds its handle, or it waits for its last completion.
#[derive(Debug)]
struct Req {
    id: RequestId,
    lane: u32,
    work_requests: u32,
    /// The status of its last completion, once it came.
    last: Option<WcStatus>,
    /// Its lane failed before its last completion came: what `test` says.
    failed: Option<RmaError>,
    /// NCCL still holds the handle (false: told it failed; waits for the flushed completion).
    held: bool,
}

#[derive(Debug, Default)]
struct LaneModel {
    connected: bool,
    /// The first failed completion (sticky).
    failed: Option<WcStatus>,
    /// Work requests posted and not completed, in posting order: request and whether it is the
    /// last (signaled) one.
    queue: VecDeque<(RequestId, bool)>,
    /// Requests posted whose last completion has not come.
    requests: u32,
    /// Their work requests.
    work_requests: u32,
}

struct Harness {
    r: Requests,
    nranks: u32,
    contexts: u32,
    stride: u32,
    rank: u32,
    cq_depth: u32,
    max_inline: u32,
    windows: Vec<Window>,
    lanes: Vec<LaneModel>,
    /// Requests alive in the core, by id bits.
    reqs: BTreeMap<u32, Req>,
    /// Work requests of posted operations whose last completion has not come.
    reserved: u32,
    /// Handles NCCL no longer holds (the newest 64).
    stale: VecDeque<RequestId>,
    last: Option<Op>,
    planned: usize,
}

/// Whether the lane from `rank` to `peer` exists: the own rank, or a multiple of `stride` away
/// in either direction around the ring.
fn model_connected(rank: u32, peer: u32, nranks: u32, stride: u32) -> bool {
    let up = (peer + nranks - rank) % nranks;
    let down = (nranks - up) % nranks;
    up % stride == 0 || down % stride == 0
}

fn entry(spec: &EntrySpec) -> WindowEntry {
    WindowEntry {
        base: match spec.base {
            Base::Page(k) => u64::from(k) * 4096,
            Base::NearTop(k) => u64::MAX - u64::from(k),
            Base::Raw(b) => b,
        },
        len: match spec.len {
            Len::Bytes(n) => u64::from(n),
            Len::Gib(k, r) => (u64::from(k) << 30) + u64::from(r),
            Len::Raw(n) => n,
        },
        rkey: spec.rkey,
    }
}

fn window(spec: &WindowSpec, nranks: u32, rank: u32) -> Window {
    let mut entries: Vec<WindowEntry> = if spec.ragged {
        spec.entries.iter().take(12).map(entry).collect()
    } else {
        (0..nranks as usize)
            .map(|r| match spec.entries.get(r % spec.entries.len().max(1)) {
                Some(e) => entry(e),
                None => WindowEntry {
                    base: (r as u64 + 1) << 20,
                    len: 4096,
                    rkey: 100 + r as u32,
                },
            })
            .collect()
    };
    if let Some(own) = entries.get_mut(rank as usize) {
        own.base %= OWN_BASE_SPAN;
        own.len %= OWN_MAX_LEN;
    }
    Window {
        entries,
        rank,
        lkey: spec.lkey,
        host: spec.host,
    }
}

/// The model of `Window::range`.
fn model_range(
    w: &Window,
    which: Which,
    rank: u32,
    offset: u64,
    size: u64,
) -> Result<u64, RmaError> {
    let Some(e) = w.entries.get(rank as usize) else {
        return Err(RmaError::BadRank {
            rank: u64::from(rank),
            nranks: w.entries.len() as u32,
        });
    };
    let oow = RmaError::OutOfWindow {
        which,
        rank,
        offset,
        size,
        len: e.len,
    };
    let end = offset.checked_add(size).ok_or(oow)?;
    if end > e.len {
        return Err(oow);
    }
    // A peer's entry is untrusted: the range must also end within the address space (it may end
    // exactly at 2^64).
    if u128::from(e.base) + u128::from(end) > 1 << 64 {
        return Err(oow);
    }
    e.base.checked_add(offset).ok_or(oow)
}

/// `addr .. addr + len` lies inside rank `rank`'s entry of `w` (an entry may end exactly at
/// 2^64: its last byte is `u64::MAX`).
fn assert_inside(w: &Window, rank: u32, addr: u64, len: u64, what: &str) {
    let e = w.entries[rank as usize];
    assert!(
        e.base <= addr,
        "{what}: address {addr:#x} below the entry {e:x?}"
    );
    let entry_end = u128::from(e.base) + u128::from(e.len);
    let end = u128::from(addr) + u128::from(len);
    // Even inside an entry that itself runs past 2^64 (a peer's word), an accepted range never
    // does (finding 1 of the target's first run, fixed in the core).
    assert!(
        end <= 1 << 64,
        "{what}: {addr:#x} + {len:#x} wraps (entry {e:x?})"
    );
    assert!(
        end <= entry_end,
        "{what}: {addr:#x} + {len:#x} outside the entry {e:x?}"
    );
}

/// The transfer's pieces: at most MAX_WR_BYTES each, contiguous, covering it exactly.
fn assert_pieces(t: &Transfer) {
    let count = t.piece_count();
    assert_eq!(u64::from(count), t.len.div_ceil(u64::from(MAX_WR_BYTES)));
    if count > 64 {
        return;
    }
    let mut at = 0u64;
    for p in t.pieces() {
        assert!(p.len > 0 && p.len <= MAX_WR_BYTES);
        assert_eq!((p.local, p.remote), (t.local + at, t.remote + at));
        at += u64::from(p.len);
    }
    assert_eq!(at, t.len);
}

fn pieces_of(size: u64) -> u64 {
    size.div_ceil(u64::from(MAX_WR_BYTES))
}

impl Harness {
    fn new(input: &Input) -> Self {
        let nranks = 1 + u32::from(input.nranks) % 9;
        let rank = u32::from(input.rank) % nranks;
        let contexts = 1 + u32::from(input.contexts) % 3;
        let stride = 1 + u32::from(input.stride) % 4;
        let cq_depth = u32::from(input.cq_depth);
        let max_inline = match input.max_inline {
            255 => u32::MAX,
            m => [0, 64, 220, 1024][usize::from(m % 4)],
        };
        let mut windows: Vec<Window> = input
            .windows
            .iter()
            .take(4)
            .map(|w| window(w, nranks, rank))
            .collect();
        if windows.is_empty() {
            windows.push(window(
                &WindowSpec {
                    host: true,
                    ragged: false,
                    lkey: 1,
                    entries: Vec::new(),
                },
                nranks,
                rank,
            ));
        }
        let lanes = (0..contexts * nranks)
            .map(|l| LaneModel {
                connected: model_connected(rank, l % nranks, nranks, stride),
                ..LaneModel::default()
            })
            .collect();
        let r = Requests::new(contexts, nranks, rank, stride, cq_depth);
        for peer in 0..nranks {
            assert_eq!(
                r.is_connected(peer),
                model_connected(rank, peer, nranks, stride),
                "is_connected({peer})"
            );
        }
        assert!(r.is_connected(rank), "the lane to the own rank is missing");
        Self {
            r,
            nranks,
            contexts,
            stride,
            rank,
            cq_depth,
            max_inline,
            windows,
            lanes,
            reqs: BTreeMap::new(),
            reserved: 0,
            stale: VecDeque::new(),
            last: None,
            planned: 0,
        }
    }

    fn ctx(&self, c: u8) -> i32 {
        if c < 0xF0 {
            (u32::from(c) % (self.contexts + 1)) as i32
        } else {
            [-1, i32::MIN, i32::MAX, 3, 4, 255, -2, 1 << 20][usize::from(c & 7)]
        }
    }

    fn target(&self, t: u8) -> u32 {
        if t < 0xF0 {
            u32::from(t) % (self.nranks + 1)
        } else {
            [
                u32::MAX,
                self.nranks + 7,
                1 << 31,
                9,
                10,
                64,
                u32::MAX - 1,
                1 << 20,
            ][usize::from(t & 7)]
        }
    }

    fn window(&self, w: u8) -> &Window {
        &self.windows[usize::from(w) % self.windows.len()]
    }

    fn own_len(&self, w: u8) -> u64 {
        self.window(w)
            .entries
            .get(self.rank as usize)
            .map_or(0, |e| e.len)
    }

    fn peer_len(&self, w: u8, target: u32) -> u64 {
        self.window(w)
            .entries
            .get(target as usize)
            .map_or(0, |e| e.len)
    }

    /// The model of `Requests::lane`.
    fn model_lane(&self, context: i32, rank: u32) -> Result<u32, RmaError> {
        let Some(c) = u32::try_from(context).ok().filter(|&c| c < self.contexts) else {
            return Err(RmaError::BadContext {
                context: i64::from(context),
                contexts: self.contexts,
            });
        };
        if rank >= self.nranks {
            return Err(RmaError::BadRank {
                rank: u64::from(rank),
                nranks: self.nranks,
            });
        }
        let lane = c * self.nranks + rank;
        let l = &self.lanes[lane as usize];
        if !l.connected {
            return Err(RmaError::NotConnected {
                rank,
                stride: self.stride,
            });
        }
        if let Some(status) = l.failed {
            return Err(RmaError::PeerFailed {
                rank,
                context: c,
                status,
            });
        }
        Ok(lane)
    }

    /// Per lane, requests and work requests posted whose last completion has not come, and
    /// their sum over the lanes, recounted from the requests.
    fn loads(&self) -> (Vec<(u32, u32)>, u32) {
        let mut loads = vec![(0, 0); self.lanes.len()];
        for q in self
            .reqs
            .values()
            .filter(|q| q.work_requests > 0 && q.last.is_none())
        {
            let l = &mut loads[q.lane as usize];
            *l = (l.0 + 1, l.1 + q.work_requests);
        }
        let reserved = loads.iter().map(|l| l.1).sum();
        (loads, reserved)
    }

    /// One plan operation: lane, plan, admission, posting.
    fn operate(&mut self, op: &Op) {
        if self.planned >= MAX_PLANNED {
            return;
        }
        self.planned += 1;
        let (ctx, target, post_fails) = match *op {
            Op::Put {
                ctx,
                target,
                post_fails,
                ..
            }
            | Op::PutSignal {
                ctx,
                target,
                post_fails,
                ..
            }
            | Op::Get {
                ctx,
                target,
                post_fails,
                ..
            } => (self.ctx(ctx), self.target(target), post_fails),
            Op::Flush {
                ctx, post_fails, ..
            } => (self.ctx(ctx), self.rank, post_fails),
            _ => return,
        };
        let (plan, expected, wrs) = self.plan(op, target);
        assert_eq!(plan, expected, "plan of {op:?}");
        let lane = self.r.lane(ctx, target);
        assert_eq!(lane, self.model_lane(ctx, target), "lane({ctx}, {target})");
        for e in [plan.as_ref().err(), lane.as_ref().err()]
            .into_iter()
            .flatten()
        {
            assert!(!e.to_string().is_empty());
        }
        let before = self.r.outstanding();
        let (Ok(plan), Ok(lane)) = (plan, lane) else {
            assert_eq!(
                self.r.outstanding(),
                before,
                "a refused operation made a request"
            );
            return;
        };
        let wrs = u32::try_from(wrs).expect("work requests fit u32");
        assert_eq!(plan.work_requests(), wrs, "work requests of {plan:?}");
        match plan {
            Plan::Put(t) | Plan::Get(t) | Plan::PutSignal(Some(t), _) => assert_pieces(&t),
            Plan::Nothing | Plan::PutSignal(None, _) | Plan::FlushRead { .. } => {}
        }
        // Admission.
        let (requests, lane_wrs) = (
            self.lanes[lane as usize].requests,
            self.lanes[lane as usize].work_requests,
        );
        let reserved = self.reserved;
        let admit = if wrs > 0
            && (requests >= MAX_REQUESTS_PER_LANE || lane_wrs + wrs > LANE_QUEUE_DEPTH)
        {
            Err(RmaError::LaneFull {
                rank: target,
                requests,
            })
        } else if wrs > 0 && u64::from(reserved) + u64::from(wrs) > u64::from(self.cq_depth) {
            Err(RmaError::QueueFull {
                reserved,
                depth: self.cq_depth,
            })
        } else {
            Ok(())
        };
        let begun = self.r.begin(lane, wrs);
        let id = match (begun, admit) {
            (Ok(id), Ok(())) => id,
            (Err(got), Err(want)) => {
                assert_eq!(got, want, "begin refused with another reason");
                assert_eq!(
                    self.r.outstanding(),
                    before,
                    "a refused begin made a request"
                );
                return;
            }
            (got, want) => panic!("begin({lane}, {wrs}) = {got:?}, model {want:?}"),
        };
        assert_ne!(id.to_bits(), 0);
        assert_eq!(RequestId::from_bits(id.to_bits()), Some(id));
        assert!(
            !self.reqs.contains_key(&id.to_bits()),
            "begin handed out the id of a live request"
        );
        if let (Some(errno), true) = (post_fails, wrs > 0) {
            let errno = -i32::from(errno);
            let err = self.r.abandon(id, errno);
            assert_eq!(
                err,
                RmaError::Post {
                    rank: target,
                    errno
                }
            );
            assert_eq!(self.r.outstanding(), before, "abandon left the request");
            assert_eq!(self.r.test(id), Err(RmaError::UnknownRequest));
            self.push_stale(id);
            return;
        }
        self.reqs.insert(
            id.to_bits(),
            Req {
                id,
                lane,
                work_requests: wrs,
                last: None,
                failed: None,
                held: true,
            },
        );
        let l = &mut self.lanes[lane as usize];
        if wrs > 0 {
            l.requests += 1;
            l.work_requests += wrs;
            self.reserved += wrs;
        }
        for k in 0..wrs {
            l.queue.push_back((id, k + 1 == wrs));
        }
    }

    /// The plan the core makes for `op`, the model's, and the model's work request count.
    #[allow(clippy::type_complexity)]
    fn plan(&self, op: &Op, target: u32) -> (Result<Plan, RmaError>, Result<Plan, RmaError>, u64) {
        let rank = self.rank;
        let inline = |w: &Window, size: u64| w.host && size <= u64::from(self.max_inline);
        // The model's transfer from the own part of `src` to `target`'s part of `dst`.
        let transfer = |src: &Window, src_off, size, dst: &Window, dst_off| {
            let local = model_range(src, Which::Source, rank, src_off, size)?;
            let remote = model_range(dst, Which::Destination, target, dst_off, size)?;
            Ok::<_, RmaError>((size > 0).then(|| {
                assert_inside(src, rank, local, size, "put source");
                assert_inside(dst, target, remote, size, "put destination");
                Transfer {
                    local,
                    lkey: src.lkey,
                    remote,
                    rkey: dst.entries[target as usize].rkey,
                    len: size,
                    inline: inline(src, size),
                }
            }))
        };
        match *op {
            Op::Put {
                src,
                src_off,
                size,
                dst,
                dst_off,
                ..
            } => {
                let size = size.resolve(self.own_len(src));
                let src_off = src_off.resolve(self.own_len(src));
                let dst_off = dst_off.resolve(self.peer_len(dst, target));
                let (s, d) = (self.window(src), self.window(dst));
                let got = plan_put(s, src_off, size, d, dst_off, target, self.max_inline);
                let want = transfer(s, src_off, size, d, dst_off)
                    .map(|t| t.map_or(Plan::Nothing, Plan::Put));
                (got, want, pieces_of(size))
            }
            Op::PutSignal {
                put,
                size,
                signal,
                signal_off,
                op,
                value,
                ..
            } => {
                let op = match op % 4 {
                    0 => SIGNAL_OP_INC,
                    1 => SIGNAL_OP_ADD,
                    2 => 0,
                    _ => u32::from(op),
                };
                let sig = self.window(signal);
                let signal_off = signal_off.resolve(self.peer_len(signal, target));
                let size = match put {
                    Some(p) => size.resolve(self.own_len(p.src)),
                    None => size.resolve(0),
                };
                let args = put.map(|p| {
                    (
                        self.window(p.src),
                        p.src_off.resolve(self.own_len(p.src)),
                        self.window(p.dst),
                        p.dst_off.resolve(self.peer_len(p.dst, target)),
                    )
                });
                let got = plan_put_signal(
                    args,
                    size,
                    target,
                    sig,
                    signal_off,
                    op,
                    value,
                    self.max_inline,
                );
                let want = (|| {
                    let add = match op {
                        SIGNAL_OP_INC => 1,
                        SIGNAL_OP_ADD => value,
                        other => return Err(RmaError::BadSignalOp(other)),
                    };
                    let remote = model_range(sig, Which::Signal, target, signal_off, 8)?;
                    if remote % 8 != 0 {
                        return Err(RmaError::MisalignedSignal {
                            offset: signal_off,
                            addr: remote,
                        });
                    }
                    assert_inside(sig, target, remote, 8, "signal word");
                    let t = match args {
                        Some((s, so, d, dof)) => transfer(s, so, size, d, dof)?,
                        None => None,
                    };
                    Ok(Plan::PutSignal(
                        t,
                        SignalAdd {
                            remote,
                            rkey: sig.entries[target as usize].rkey,
                            add,
                        },
                    ))
                })();
                let wrs = match want {
                    Ok(Plan::PutSignal(t, _)) => t.map_or(0, |t| pieces_of(t.len)) + 1,
                    _ => 0,
                };
                (got, want, wrs)
            }
            Op::Get {
                remote,
                remote_off,
                size,
                local,
                local_off,
                ..
            } => {
                let size = size.resolve(self.own_len(local));
                let remote_off = remote_off.resolve(self.peer_len(remote, target));
                let local_off = local_off.resolve(self.own_len(local));
                let (rw, lw) = (self.window(remote), self.window(local));
                let got = plan_get(rw, remote_off, size, lw, local_off, target);
                let want = (|| {
                    let from = model_range(rw, Which::Remote, target, remote_off, size)?;
                    let into = model_range(lw, Which::Local, rank, local_off, size)?;
                    if size == 0 {
                        return Ok(Plan::Nothing);
                    }
                    assert_inside(rw, target, from, size, "get source");
                    assert_inside(lw, rank, into, size, "get destination");
                    Ok(Plan::Get(Transfer {
                        local: into,
                        lkey: lw.lkey,
                        remote: from,
                        rkey: rw.entries[target as usize].rkey,
                        len: size,
                        inline: false,
                    }))
                })();
                (got, want, pieces_of(size))
            }
            Op::Flush { window, .. } => {
                let w = self.window(window);
                let got = plan_flush(w);
                let want = if w.host {
                    Ok(Plan::Nothing)
                } else {
                    match model_range(w, Which::Local, rank, 0, 1) {
                        Ok(remote) => {
                            assert_inside(w, rank, remote, 1, "flush read");
                            Ok(Plan::FlushRead {
                                remote,
                                rkey: w.entries[rank as usize].rkey,
                            })
                        }
                        Err(RmaError::OutOfWindow { .. }) => Ok(Plan::Nothing),
                        Err(e) => Err(e),
                    }
                };
                let wrs = u64::from(matches!(want, Ok(Plan::FlushRead { .. })));
                (got, want, wrs)
            }
            _ => unreachable!("not a plan operation"),
        }
    }

    /// The next work request of `lane` completes: with `status` unless the lane failed (then
    /// flushed); a successful unsignaled piece reports nothing.
    fn complete_next(&mut self, lane: usize, status: WcStatus) {
        let Some((id, last)) = self.lanes[lane].queue.pop_front() else {
            return;
        };
        let status = if self.lanes[lane].failed.is_some() {
            WcStatus::WR_FLUSH_ERR
        } else {
            status
        };
        if status.is_success() && !last {
            return;
        }
        self.r
            .handle_completion(if last { id.wr_id() } else { id.piece_wr_id() }, status);
        let l = &mut self.lanes[lane];
        if !status.is_success() {
            let first = l.failed.is_none();
            if first || l.failed == Some(WcStatus::WR_FLUSH_ERR) && status != WcStatus::WR_FLUSH_ERR
            {
                l.failed = Some(status);
            }
            if first {
                let err = RmaError::PeerFailed {
                    rank: lane as u32 % self.nranks,
                    context: lane as u32 / self.nranks,
                    status,
                };
                for q in self.reqs.values_mut() {
                    if q.lane == lane as u32 && q.last.is_none() {
                        q.failed = Some(err);
                    }
                }
            }
        }
        if last {
            let q = self
                .reqs
                .get_mut(&id.to_bits())
                .expect("a queued work request's request is alive");
            q.last = Some(status);
            let l = &mut self.lanes[lane];
            l.requests -= 1;
            l.work_requests -= q.work_requests;
            self.reserved -= q.work_requests;
            if !q.held {
                self.reqs.remove(&id.to_bits());
            }
        }
    }

    fn complete_all(&mut self, order: u8) {
        let mut x = u32::from(order) | 1;
        loop {
            let busy: Vec<usize> = (0..self.lanes.len())
                .filter(|&l| !self.lanes[l].queue.is_empty())
                .collect();
            if busy.is_empty() {
                break;
            }
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            let lane = busy[(x >> 16) as usize % busy.len()];
            self.complete_next(lane, WcStatus::SUCCESS);
        }
    }

    fn push_stale(&mut self, id: RequestId) {
        if self.stale.len() == 64 {
            self.stale.pop_front();
        }
        self.stale.push_back(id);
    }

    /// Test a request NCCL holds; returns whether it was released.
    fn test_held(&mut self, bits: u32) -> bool {
        let q = &self.reqs[&bits];
        let want = if q.work_requests == 0 {
            Ok(Tested::Done)
        } else if let Some(e) = q.failed {
            Err(e)
        } else if let Some(status) = q.last {
            assert!(status.is_success());
            Ok(Tested::Done)
        } else {
            Ok(Tested::Pending)
        };
        let id = q.id;
        let got = self.r.test(id);
        assert_eq!(got, want, "test of {q:?}");
        if want == Ok(Tested::Pending) {
            return false;
        }
        if let Err(e) = got {
            assert!(!e.to_string().is_empty());
        }
        let q = self.reqs.get_mut(&bits).expect("tested request");
        if q.last.is_some() || q.work_requests == 0 {
            self.reqs.remove(&bits);
        } else {
            q.held = false;
        }
        self.push_stale(id);
        // Never twice.
        assert_eq!(
            self.r.test(id),
            Err(RmaError::UnknownRequest),
            "tested twice"
        );
        true
    }

    fn held(&self) -> Vec<u32> {
        self.reqs
            .values()
            .filter(|q| q.held)
            .map(|q| q.id.to_bits())
            .collect()
    }

    /// A handle that names no request alive in the core (`None` for a live pick or a stale
    /// one whose bits a live request reuses).
    fn dead_handle(&self, h: Handle) -> Option<u32> {
        let bits = match h {
            Handle::Live(_) => return None,
            Handle::Stale(k) => self
                .stale
                .get(usize::from(k) % self.stale.len().max(1))?
                .to_bits(),
            Handle::Bogus(b) => b,
        };
        (!self.reqs.contains_key(&bits)).then_some(bits)
    }

    /// The core's observable state, to compare before and after something that must not change it.
    fn snapshot(&self) -> (u32, usize, bool, Vec<Option<RmaError>>) {
        (
            self.r.reserved(),
            self.r.outstanding(),
            self.r.has_error(),
            (0..self.lanes.len() as u32)
                .map(|l| self.r.lane_failure(l))
                .collect(),
        )
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::Put { .. } | Op::PutSignal { .. } | Op::Get { .. } | Op::Flush { .. } => {
                self.operate(op);
                self.last = Some(op.clone());
            }
            Op::Repeat(k) => {
                if let Some(last) = self.last.clone() {
                    for _ in 0..=k % 64 {
                        self.operate(&last);
                    }
                }
            }
            Op::Complete {
                lane,
                count,
                status,
            } => {
                let busy: Vec<usize> = (0..self.lanes.len())
                    .filter(|&l| !self.lanes[l].queue.is_empty())
                    .collect();
                if let Some(&l) = busy.get(usize::from(lane) % busy.len().max(1)) {
                    for _ in 0..=count % 8 {
                        self.complete_next(l, status.wc());
                    }
                }
            }
            Op::CompleteAll(order) => self.complete_all(order),
            Op::Test(Handle::Live(k)) => {
                let held = self.held();
                if let Some(&bits) = held.get(usize::from(k) % held.len().max(1)) {
                    self.test_held(bits);
                }
            }
            Op::Test(h) => {
                if let Some(id) = self.dead_handle(h).and_then(RequestId::from_bits) {
                    let before = self.snapshot();
                    assert_eq!(self.r.test(id), Err(RmaError::UnknownRequest));
                    assert_eq!(
                        self.snapshot(),
                        before,
                        "testing a dead handle changed state"
                    );
                }
            }
            Op::TestAll => {
                for bits in self.held() {
                    self.test_held(bits);
                }
            }
            Op::Spurious {
                handle,
                piece,
                high,
                status,
            } => {
                if let Some(bits) = self.dead_handle(handle) {
                    let mut wr_id = u64::from(bits);
                    if piece {
                        wr_id |= PIECE_MARK;
                    }
                    if high {
                        wr_id |= 1 << 40;
                    }
                    let before = self.snapshot();
                    self.r.handle_completion(wr_id, status.wc());
                    assert_eq!(self.snapshot(), before, "a stray completion changed state");
                }
            }
            Op::AbandonStale { handle, errno } => {
                if let Some(id) = self.dead_handle(handle).and_then(RequestId::from_bits) {
                    let before = self.snapshot();
                    assert_eq!(self.r.abandon(id, errno), RmaError::Post { rank: 0, errno });
                    assert_eq!(
                        self.snapshot(),
                        before,
                        "abandoning a dead handle changed state"
                    );
                }
            }
            Op::BeginBadLane {
                past,
                work_requests,
            } => {
                let lane = self.lanes.len() as u32 + u32::from(past);
                let before = self.snapshot();
                assert_eq!(
                    self.r.begin(lane, work_requests),
                    Err(RmaError::BadRank {
                        rank: u64::from(lane),
                        nranks: self.nranks
                    })
                );
                assert_eq!(self.snapshot(), before, "a refused begin changed state");
            }
        }
    }

    /// Invariants after every step.
    fn check(&self) {
        let (loads, reserved) = self.loads();
        assert_eq!(self.reserved, reserved);
        assert_eq!(
            self.r.reserved(),
            reserved,
            "reserved completion queue entries"
        );
        assert!(
            reserved <= self.cq_depth,
            "reserved past the completion queue's depth"
        );
        assert_eq!(
            self.r.outstanding(),
            self.reqs.len(),
            "requests leaked or lost"
        );
        let mut failed = 0;
        for (i, l) in self.lanes.iter().enumerate() {
            let lane = i as u32;
            let (requests, wrs) = loads[i];
            assert_eq!((l.requests, l.work_requests), (requests, wrs));
            assert!(requests <= MAX_REQUESTS_PER_LANE && wrs <= LANE_QUEUE_DEPTH);
            assert!(l.queue.len() as u32 <= wrs);
            failed += u32::from(l.failed.is_some());
            let want = l.failed.map(|status| RmaError::PeerFailed {
                rank: lane % self.nranks,
                context: lane / self.nranks,
                status,
            });
            assert_eq!(self.r.lane_failure(lane), want, "failure of lane {lane}");
        }
        assert_eq!(self.r.has_error(), failed > 0, "has_error");
        assert_eq!(self.r.failed_lanes(), failed, "failed_lanes");
    }

    /// Everything completes, everything NCCL holds is tested: nothing may be left.
    fn close(&mut self) {
        self.complete_all(0);
        for bits in self.held() {
            assert!(
                self.test_held(bits),
                "a request still pending once everything completed"
            );
        }
        self.check();
        assert_eq!(
            self.r.outstanding(),
            0,
            "requests left after everything completed"
        );
        assert_eq!(self.r.reserved(), 0);
    }
}

/// One run of the target on a decoded input.
pub fn check(input: Input) {
    let mut h = Harness::new(&input);
    for op in input.ops.iter().take(4096) {
        h.step(op);
        h.check();
    }
    h.close();
}
