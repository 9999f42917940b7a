//! The eager path ([`rivet_core::data::eager`]) end to end on the simulated fabric: sends,
//! receives, fabric steps, tests and drains in any interleaving on one [`DataPair::new_eager`],
//! driven as the plugin drives them (`isend_direct_host` with a host-memory send's bytes up to the
//! threshold, `irecv_direct`), and checked against NCCL's contract rather than the protocol:
//!
//! - per tag, the `k`-th send tagged `T` fills the `k`-th receive buffer tagged `T`, receives in
//!   posting order and a group's buffers in their order. Only streams NCCL can produce are
//!   generated: the sends go in the order of the receives they fill (within a grouped receive in
//!   any order; its tags are distinct), whichever is posted first, so the matching is the same
//!   however the eager path guesses;
//! - a completed receive holds exactly its sends' bytes and reports their sizes, and nothing past
//!   a message changed (the rest of its buffer and guard bytes after it, also after everything
//!   else completed); a send larger than its buffer fails with [`DataError::SizeMismatch`] on
//!   both sides and that buffer is untouched;
//! - a send completes with its size only once its receive is posted with every send of it issued,
//!   a receive only once all its sends are issued; every request completes once (then its id is
//!   invalid) and the two sides' `outstanding()` are the model's counts at every step; no call
//!   fails and neither side fails (the simulator panics on an overrun of a queue or a region,
//!   and an overrun ring fails the receiver);
//! - eager messages come only from sends handed their bytes, none with the threshold 0;
//! - once the stream is completed (the retried calls go through, every send gets its receive and
//!   every receive its sends) and the fabric is idle, everything completes, both drains say 0 and
//!   nothing is outstanding.
//!
//! `try later` (`Ok(None)`) from `isend` or `irecv` is retried with the same call before any new
//! one of that side, as NCCL retries.

use std::collections::{BTreeMap, VecDeque};

use rivet_core::data::eager::EAGER_MAX;
use rivet_core::data::{
    CQ_DEPTH, Completed, Connection, DataError, RecvBuf, RequestId, SEND_QUEUE_DEPTH, SendBuf,
};
use rivet_core::sim::suite::pattern;
use rivet_core::sim::{DataPair, irecv_direct, isend_direct_host};

pub mod seeds;

/// The queue pairs' inline limits: none, under the 16-byte eager header, and two that inline
/// small eager messages.
pub const MAX_INLINES: [usize; 4] = [0, 16, 64, 256];
/// The eager thresholds: off, tiny, the defaults' neighbours and the largest a slot holds.
pub const THRESHOLDS: [u64; 6] = [0, 1, 64, 4096, 8192, EAGER_MAX as u64];
/// The tags sends and buffers choose from (NCCL's are non-negative `int`s).
pub const TAGS: [u32; 4] = [0, 1, 2, 0x7fff_ffff];
/// Receives NCCL keeps posted on a connection at most.
const MAX_RECVS_OUTSTANDING: usize = 8;
/// Sends outstanding at most: more than a ring holds, within NCCL's 32 requests.
const MAX_SENDS_OUTSTANDING: usize = 24;
/// Operations one input runs, to keep an execution fast.
const MAX_OPS: usize = 512;
/// Bytes checked after every receive buffer.
const GUARD: usize = 64;
/// What a receive buffer and its guard hold before anything is written.
const FILL: u8 = 0xa5;
/// Rounds of the final completion before a stall is a failure (each posts or completes
/// something while anything is left).
const MAX_FINISH_ROUNDS: usize = 1000;
/// Size of the sends the final completion issues for buffers still waiting: fits every capacity
/// at least this large, the whole smaller ones.
const FINISH_LEN: u64 = 64;

/// A message size, resolved against the pair's inline limit and threshold ([`Size::bytes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    Empty,
    One,
    /// The longest eager message the work request carries inline (header included).
    InlineMost,
    /// One byte more: staged.
    InlinePast,
    Mid,
    BelowThreshold,
    Threshold,
    /// One byte past the threshold: never eager.
    AboveThreshold,
    Page,
    /// 12 KiB.
    Large,
}

impl Size {
    const ALL: [Self; 10] = [
        Self::Empty,
        Self::One,
        Self::InlineMost,
        Self::InlinePast,
        Self::Mid,
        Self::BelowThreshold,
        Self::Threshold,
        Self::AboveThreshold,
        Self::Page,
        Self::Large,
    ];

    fn bytes(self, max_inline: usize, threshold: u64) -> u64 {
        // An eager message goes inline when its header and payload fit the smaller of the queue
        // pair's limit and the core's 512-byte assembly buffer.
        let inline_most = max_inline.min(512).saturating_sub(16) as u64;
        match self {
            Self::Empty => 0,
            Self::One => 1,
            Self::InlineMost => inline_most,
            Self::InlinePast => inline_most + 1,
            Self::Mid => 200,
            Self::BelowThreshold => threshold.saturating_sub(1),
            Self::Threshold => threshold,
            Self::AboveThreshold => threshold + 1,
            Self::Page => 4096,
            Self::Large => 12 * 1024,
        }
    }

    fn decode(byte: u8) -> Self {
        Self::ALL[usize::from(byte) % Self::ALL.len()]
    }

    fn encode(self) -> u8 {
        Self::ALL.iter().position(|&s| s == self).expect("listed") as u8
    }
}

/// A receive buffer's capacity; every one below [`Capacity::Fits`] is smaller than some sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capacity {
    /// Larger than every send.
    Fits,
    Large,
    Threshold,
    Page,
    Mid,
    InlineMost,
    One,
    Empty,
}

impl Capacity {
    /// Indexed by a byte's low three bits (bytes from 128 on; the lower half fits).
    const SMALLER: [Self; 8] = [
        Self::Fits,
        Self::Large,
        Self::Threshold,
        Self::Page,
        Self::Mid,
        Self::InlineMost,
        Self::One,
        Self::Empty,
    ];

    fn bytes(self, max_inline: usize, threshold: u64) -> u64 {
        let size = |s: Size| s.bytes(max_inline, threshold);
        match self {
            // The largest send is one past the largest threshold.
            Self::Fits => EAGER_MAX as u64 + 64,
            Self::Large => size(Size::Large),
            Self::Threshold => size(Size::Threshold),
            Self::Page => size(Size::Page),
            Self::Mid => size(Size::Mid),
            Self::InlineMost => size(Size::InlineMost),
            Self::One => 1,
            Self::Empty => 0,
        }
    }

    fn decode(byte: u8) -> Self {
        if byte < 128 {
            Self::Fits
        } else {
            Self::SMALLER[usize::from(byte % 8)]
        }
    }

    fn encode(self) -> u8 {
        match self {
            Self::Fits => 0,
            other => {
                128 + Self::SMALLER
                    .iter()
                    .position(|&c| c == other)
                    .expect("listed") as u8
            }
        }
    }
}

/// One receive buffer to post.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufSpec {
    pub capacity: Capacity,
    /// GPU memory: the receiver never copies an eager message into it.
    pub gpu: bool,
    /// Which tag, among those the stream allows ([`TAGS`] index or choice among the free ones).
    pub tag: u8,
}

/// A tag choice (low two bits) and a memory kind (GPU for one value in eight of the next three
/// bits) in one byte.
fn decode_flags(byte: u8) -> (u8, bool) {
    (byte & 3, (byte >> 2) & 7 == 0)
}

fn encode_flags(tag: u8, gpu: bool) -> u8 {
    assert!(tag < 4);
    tag | if gpu { 0 } else { 1 << 2 }
}

/// One step of the driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Send a message (or retry the send waiting to be taken).
    Send {
        size: Size,
        tag: u8,
        gpu: bool,
    },
    /// Post a one-buffer receive (or retry the receive waiting to be taken).
    Recv(BufSpec),
    /// Post a receive of 2–4 buffers (or retry the waiting one).
    Group(Vec<BufSpec>),
    /// Execute 1–16 work requests on the fabric.
    Step(u8),
    /// `test` the oldest outstanding send.
    TestSend,
    /// `test` the oldest outstanding receive.
    TestRecv,
    DrainSend,
    DrainRecv,
    /// Run the fabric until nothing is queued.
    Deliver,
}

/// The target's input: a pair's settings and the operations on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Input {
    /// Index into [`MAX_INLINES`].
    pub max_inline: u8,
    /// Index into [`THRESHOLDS`].
    pub threshold: u8,
    pub ops: Vec<Op>,
}

impl Input {
    /// Any bytes decode: the first two choose the inline limit and the threshold, then an
    /// opcode byte (modulo 9) and its argument bytes per operation; missing bytes read as 0.
    pub fn decode(bytes: &[u8]) -> Self {
        let mut bytes = bytes.iter().copied();
        let mut next = || bytes.next().unwrap_or(0);
        let max_inline = next() % MAX_INLINES.len() as u8;
        let threshold = next() % THRESHOLDS.len() as u8;
        let buf_spec = |next: &mut dyn FnMut() -> u8| {
            let capacity = Capacity::decode(next());
            let (tag, gpu) = decode_flags(next());
            BufSpec { capacity, gpu, tag }
        };
        let mut ops = Vec::new();
        while bytes.len() > 0 {
            let mut next = || bytes.next().unwrap_or(0);
            let op = match next() % 9 {
                0 => {
                    let size = Size::decode(next());
                    let (tag, gpu) = decode_flags(next());
                    Op::Send { size, tag, gpu }
                }
                1 => Op::Recv(buf_spec(&mut next)),
                2 => {
                    let n = 2 + next() % 3;
                    Op::Group((0..n).map(|_| buf_spec(&mut next)).collect())
                }
                3 => Op::Step(next() % 16),
                4 => Op::TestSend,
                5 => Op::TestRecv,
                6 => Op::DrainSend,
                7 => Op::DrainRecv,
                _ => Op::Deliver,
            };
            ops.push(op);
        }
        Self {
            max_inline,
            threshold,
            ops,
        }
    }

    /// The bytes [`decode`](Self::decode) makes this input of.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![self.max_inline, self.threshold];
        let buf_spec = |out: &mut Vec<u8>, b: &BufSpec| {
            out.push(b.capacity.encode());
            out.push(encode_flags(b.tag, b.gpu));
        };
        for op in &self.ops {
            match op {
                Op::Send { size, tag, gpu } => {
                    out.extend([0, size.encode(), encode_flags(*tag, *gpu)]);
                }
                Op::Recv(b) => {
                    out.push(1);
                    buf_spec(&mut out, b);
                }
                Op::Group(bufs) => {
                    assert!((2..=4).contains(&bufs.len()));
                    out.extend([2, bufs.len() as u8 - 2]);
                    for b in bufs {
                        buf_spec(&mut out, b);
                    }
                }
                Op::Step(k) => out.extend([3, *k]),
                Op::TestSend => out.push(4),
                Op::TestRecv => out.push(5),
                Op::DrainSend => out.push(6),
                Op::DrainRecv => out.push(7),
                Op::Deliver => out.push(8),
            }
        }
        out
    }
}

/// What a run saw, for the seeds' checks that they exercise what they are named for.
#[derive(Clone, Copy, Debug, Default)]
pub struct Outcome {
    /// Eager messages the receiver saw arrive.
    pub eager_arrivals: u64,
    /// `isend` answers "try later".
    pub send_retries: usize,
    /// Sends refused as larger than their buffer.
    pub size_mismatches: usize,
}

/// A receive buffer as the model knows it.
struct ModelBuf {
    /// Its capacity is `buf.len`; [`GUARD`] bytes after it are registered too.
    buf: RecvBuf,
    tag: u32,
    /// The send that fills it (index into [`Harness::sends`]).
    send: Option<usize>,
}

struct ModelRecv {
    bufs: Vec<ModelBuf>,
    /// Its request, once `irecv` took it.
    id: Option<RequestId>,
    reported: bool,
}

struct ModelSend {
    tag: u32,
    buf: SendBuf,
    /// Its bytes are handed to `isend` (host memory up to the threshold).
    host: bool,
    id: Option<RequestId>,
    /// The buffer it fills: receive and position.
    target: Option<(usize, usize)>,
    reported: bool,
}

struct Harness {
    p: DataPair,
    max_inline: usize,
    /// The threshold in force.
    threshold: u64,
    recvs: Vec<ModelRecv>,
    sends: Vec<ModelSend>,
    /// Per tag, buffers no send fills yet and sends with no buffer yet, oldest first.
    free_bufs: BTreeMap<u32, VecDeque<(usize, usize)>>,
    unmatched_sends: BTreeMap<u32, VecDeque<usize>>,
    /// The send / receive `isend` / `irecv` answered "try later" for, retried before any other.
    retry_send: Option<usize>,
    retry_recv: Option<usize>,
    /// Issued sends that were handed their bytes.
    host_sends: u64,
    outcome: Outcome,
}

impl Harness {
    fn new(input: &Input) -> Self {
        let max_inline = MAX_INLINES[usize::from(input.max_inline)];
        let p = DataPair::new_eager(max_inline, THRESHOLDS[usize::from(input.threshold)]);
        let threshold = p.send.eager_threshold();
        Self {
            p,
            max_inline,
            threshold,
            recvs: Vec::new(),
            sends: Vec::new(),
            free_bufs: BTreeMap::new(),
            unmatched_sends: BTreeMap::new(),
            retry_send: None,
            retry_recv: None,
            host_sends: 0,
            outcome: Outcome::default(),
        }
    }

    fn sends_outstanding(&self) -> usize {
        self.sends.iter().filter(|s| !s.reported).count()
    }

    fn recvs_outstanding(&self) -> usize {
        self.recvs.iter().filter(|r| !r.reported).count()
    }

    /// The oldest receive with a buffer no send fills yet: the next send must take one of its
    /// buffers (NCCL sends in the order of the receives).
    fn open_recv(&self) -> Option<&ModelRecv> {
        self.recvs
            .iter()
            .find(|r| r.bufs.iter().any(|b| b.send.is_none()))
    }

    /// Sends no buffer takes yet, oldest first: the next receive's first buffers are theirs.
    fn waiting_sends(&self) -> Vec<usize> {
        (0..self.sends.len())
            .filter(|&i| self.sends[i].target.is_none())
            .collect()
    }

    /// The model's matching: per tag, the oldest send without a buffer with the oldest buffer
    /// without a send.
    fn match_send(&mut self, send: usize) {
        let tag = self.sends[send].tag;
        match self.free_bufs.entry(tag).or_default().pop_front() {
            Some((recv, pos)) => self.pair(send, recv, pos),
            None => self.unmatched_sends.entry(tag).or_default().push_back(send),
        }
    }

    fn match_buf(&mut self, recv: usize, pos: usize) {
        let tag = self.recvs[recv].bufs[pos].tag;
        match self.unmatched_sends.entry(tag).or_default().pop_front() {
            Some(send) => self.pair(send, recv, pos),
            None => self
                .free_bufs
                .entry(tag)
                .or_default()
                .push_back((recv, pos)),
        }
    }

    fn pair(&mut self, send: usize, recv: usize, pos: usize) {
        self.sends[send].target = Some((recv, pos));
        self.recvs[recv].bufs[pos].send = Some(send);
    }

    fn send_len(&self, send: usize) -> u64 {
        self.sends[send].buf.len
    }

    /// A new send of `len` bytes; `tag` chooses among the tags the stream allows.
    fn new_send(&mut self, len: u64, tag: u8, gpu: bool) {
        if self.sends_outstanding() >= MAX_SENDS_OUTSTANDING {
            return;
        }
        let tag = match self.open_recv() {
            Some(open) => {
                let free: Vec<u32> = open
                    .bufs
                    .iter()
                    .filter(|b| b.send.is_none())
                    .map(|b| b.tag)
                    .collect();
                free[usize::from(tag) % free.len()]
            }
            None => TAGS[usize::from(tag) % TAGS.len()],
        };
        let index = self.sends.len();
        let buf = self.p.send_buf(&pattern(index as u64 + 1, len as usize));
        self.sends.push(ModelSend {
            tag,
            buf,
            // As the plugin hands them over: host memory up to the threshold (an empty send
            // with the threshold 0 too, which must not go eager:
            // `regressions/eager_ops/empty-send-with-eager-off`).
            host: !gpu && len <= self.threshold,
            id: None,
            target: None,
            reported: false,
        });
        self.match_send(index);
        self.try_send(index);
    }

    /// `isend` of send `index` as the plugin calls it.
    fn try_send(&mut self, index: usize) {
        let s = &self.sends[index];
        let buf = s.buf;
        let host = s.host.then(|| self.p.send_bytes(&buf));
        let sent = isend_direct_host(
            &mut self.p.send,
            &mut self.p.send_nic,
            buf,
            host.as_deref(),
            s.tag,
        );
        match sent {
            Ok(Some(id)) => {
                assert!(
                    !self.sends.iter().any(|o| !o.reported && o.id == Some(id)),
                    "send request {id} handed out while outstanding"
                );
                self.sends[index].id = Some(id);
                self.host_sends += u64::from(self.sends[index].host);
                self.retry_send = None;
            }
            Ok(None) => {
                self.outcome.send_retries += 1;
                self.retry_send = Some(index);
            }
            Err(err) => panic!("isend of send {index} failed: {err}"),
        }
    }

    /// A new receive of `specs.len()` buffers, their tags chosen among those the stream allows;
    /// a group may end early (below).
    fn new_recv(&mut self, specs: &[BufSpec]) {
        if self.recvs_outstanding() >= MAX_RECVS_OUTSTANDING {
            return;
        }
        let waiting: Vec<u32> = self
            .waiting_sends()
            .iter()
            .map(|&i| self.sends[i].tag)
            .collect();
        let mut tags: Vec<u32> = Vec::new();
        for spec in specs {
            let tag = match waiting.get(tags.len()) {
                // A waiting send's tag the group has already: that send fills a later receive,
                // so the group ends here (its tags stay distinct and the sends in order).
                Some(tag) if tags.contains(tag) => break,
                Some(&tag) => tag,
                None => {
                    let unused: Vec<u32> = TAGS.into_iter().filter(|t| !tags.contains(t)).collect();
                    unused[usize::from(spec.tag) % unused.len()]
                }
            };
            tags.push(tag);
        }
        // The waiting sends fill the group in any order: rotate their buffers.
        let taken = waiting.len().min(tags.len());
        if taken > 1 {
            tags[..taken].rotate_left(usize::from(specs[0].tag) % taken);
        }
        let bufs = specs
            .iter()
            .zip(tags)
            .map(|(spec, tag)| {
                let capacity = spec.capacity.bytes(self.max_inline, self.threshold);
                let mut buf = self.p.recv_buf(capacity as usize + GUARD);
                self.p.fabric.write(
                    self.p.recv_ep,
                    buf.addr,
                    &vec![FILL; capacity as usize + GUARD],
                );
                buf.len = capacity;
                buf.host = !spec.gpu;
                ModelBuf {
                    buf,
                    tag,
                    send: None,
                }
            })
            .collect::<Vec<_>>();
        let index = self.recvs.len();
        let n = bufs.len();
        self.recvs.push(ModelRecv {
            bufs,
            id: None,
            reported: false,
        });
        for pos in 0..n {
            self.match_buf(index, pos);
        }
        self.try_recv(index);
    }

    /// `irecv` of receive `index` as the plugin calls it.
    fn try_recv(&mut self, index: usize) {
        let r = &self.recvs[index];
        let bufs: Vec<RecvBuf> = r.bufs.iter().map(|b| b.buf).collect();
        let tags: Vec<u32> = r.bufs.iter().map(|b| b.tag).collect();
        match irecv_direct(&mut self.p.recv, &mut self.p.recv_nic, &bufs, &tags) {
            Ok(Some(id)) => {
                assert!(
                    !self.recvs.iter().any(|o| !o.reported && o.id == Some(id)),
                    "receive request {id} handed out while outstanding"
                );
                self.recvs[index].id = Some(id);
                self.retry_recv = None;
            }
            Ok(None) => self.retry_recv = Some(index),
            Err(err) => panic!("irecv of receive {index} failed: {err}"),
        }
    }

    fn send_op(&mut self, size: Size, tag: u8, gpu: bool) {
        match self.retry_send {
            Some(index) => self.try_send(index),
            None => self.new_send(size.bytes(self.max_inline, self.threshold), tag, gpu),
        }
    }

    fn recv_op(&mut self, specs: &[BufSpec]) {
        match self.retry_recv {
            Some(index) => self.try_recv(index),
            None => self.new_recv(specs),
        }
    }

    /// Whether every buffer of receive `recv` has its send, and each send was issued.
    fn all_sends_issued(&self, recv: usize) -> bool {
        self.recvs[recv]
            .bufs
            .iter()
            .all(|b| b.send.is_some_and(|s| self.sends[s].id.is_some()))
    }

    /// `test` send `index` (issued, not reported); whether it completed.
    fn test_send(&mut self, index: usize) -> bool {
        let id = self.sends[index].id.expect("issued");
        let result = self.p.send.test(&mut self.p.send_nic, id);
        let len = self.send_len(index);
        match result {
            Ok(Completed::Pending) => return false,
            Ok(Completed::Done { n, sizes }) => {
                let (recv, pos) = self.sends[index]
                    .target
                    .unwrap_or_else(|| panic!("send {index} completed without a buffer"));
                assert!(
                    self.recvs[recv].id.is_some(),
                    "send {index} completed before its receive was posted"
                );
                assert!(
                    self.all_sends_issued(recv),
                    "send {index} completed before every send of its receive was issued"
                );
                let capacity = self.recvs[recv].bufs[pos].buf.len;
                assert!(len <= capacity, "send {index} completed although refused");
                assert_eq!((n, u64::from(sizes[0])), (1, len), "send {index}'s size");
            }
            Err(DataError::SizeMismatch {
                index: at,
                sent,
                capacity,
            }) => {
                let (recv, pos) = self.sends[index]
                    .target
                    .unwrap_or_else(|| panic!("send {index} refused without a buffer"));
                let buf = &self.recvs[recv].bufs[pos].buf;
                assert_eq!(
                    (at, sent, capacity),
                    (pos, len, buf.len),
                    "send {index}'s refusal"
                );
                assert!(len > buf.len, "send {index} refused although it fits");
                self.outcome.size_mismatches += 1;
            }
            Err(err) => panic!("send {index} failed: {err}"),
        }
        self.sends[index].reported = true;
        assert!(
            matches!(
                self.p.send.test(&mut self.p.send_nic, id),
                Err(DataError::InvalidRequest { .. })
            ),
            "send {index}'s request still valid after it completed"
        );
        true
    }

    /// `test` receive `index` (posted, not reported); whether it completed.
    fn test_recv(&mut self, index: usize) -> bool {
        let id = self.recvs[index].id.expect("posted");
        let result = self.p.recv.test(&mut self.p.recv_nic, id);
        match result {
            Ok(Completed::Pending) => return false,
            Ok(completed) => {
                assert!(
                    self.all_sends_issued(index),
                    "receive {index} completed before all its sends were issued"
                );
                let expected: Vec<u32> = self.recvs[index]
                    .bufs
                    .iter()
                    .map(|b| self.send_len(b.send.expect("issued")) as u32)
                    .collect();
                let Completed::Done { n, sizes } = completed else {
                    unreachable!("pending handled above")
                };
                assert_eq!(
                    &sizes[..usize::from(n)],
                    &expected[..],
                    "receive {index}'s sizes"
                );
                assert!(
                    self.refused(index).is_none(),
                    "receive {index} completed although a send did not fit"
                );
            }
            Err(DataError::SizeMismatch {
                index: at,
                sent,
                capacity,
            }) => {
                let pos = self
                    .refused(index)
                    .unwrap_or_else(|| panic!("receive {index} refused although every send fit"));
                let b = &self.recvs[index].bufs[pos];
                assert_eq!(
                    (at, sent, capacity),
                    (pos, self.send_len(b.send.expect("matched")), b.buf.len),
                    "receive {index}'s refusal names its first buffer that did not fit"
                );
            }
            Err(err) => panic!("receive {index} failed: {err}"),
        }
        self.check_bytes(index);
        self.recvs[index].reported = true;
        assert!(
            matches!(
                self.p.recv.test(&mut self.p.recv_nic, id),
                Err(DataError::InvalidRequest { .. })
            ),
            "receive {index}'s request still valid after it completed"
        );
        true
    }

    /// The first buffer of receive `index` whose send is larger than it.
    fn refused(&self, index: usize) -> Option<usize> {
        self.recvs[index]
            .bufs
            .iter()
            .position(|b| b.send.is_some_and(|s| self.send_len(s) > b.buf.len))
    }

    /// Receive `index`'s buffers: each holds its message and nothing past it changed; a buffer
    /// whose send did not fit is untouched. In a refused group the others hold their message or
    /// nothing (NCCL reads none of them).
    fn check_bytes(&self, index: usize) {
        let refused = self.refused(index).is_some();
        for (pos, b) in self.recvs[index].bufs.iter().enumerate() {
            let send = b.send.expect("matched");
            let len = self.send_len(send);
            let got = self
                .p
                .fabric
                .read(self.p.recv_ep, b.buf.addr, b.buf.len as usize + GUARD);
            let untouched = got.iter().all(|&x| x == FILL);
            if len > b.buf.len {
                assert!(
                    untouched,
                    "receive {index} buffer {pos}: a refused send wrote"
                );
                continue;
            }
            if refused && untouched {
                continue;
            }
            let len = len as usize;
            assert!(
                got[..len] == pattern(send as u64 + 1, len)[..],
                "receive {index} buffer {pos}: not send {send}'s bytes"
            );
            assert!(
                got[len..].iter().all(|&x| x == FILL),
                "receive {index} buffer {pos}: written past send {send}'s {len} bytes"
            );
        }
    }

    fn test_oldest_send(&mut self) {
        if let Some(index) =
            (0..self.sends.len()).find(|&i| !self.sends[i].reported && self.sends[i].id.is_some())
        {
            self.test_send(index);
        }
    }

    fn test_oldest_recv(&mut self) {
        if let Some(index) =
            (0..self.recvs.len()).find(|&i| !self.recvs[i].reported && self.recvs[i].id.is_some())
        {
            self.test_recv(index);
        }
    }

    /// `drain` of the sender. What it counts is not bounded by the requests outstanding: a
    /// refused send is reported at once while the write that ends its receive is under way.
    fn drain_send(&mut self) -> usize {
        self.p
            .send
            .drain(&mut self.p.send_nic)
            .unwrap_or_else(|err| panic!("sender's drain failed: {err}"))
    }

    /// `drain` of the receiver: at most its receives outstanding.
    fn drain_recv(&mut self) -> usize {
        let left = self
            .p
            .recv
            .drain(&mut self.p.recv_nic)
            .unwrap_or_else(|err| panic!("receiver's drain failed: {err}"));
        assert!(left <= self.p.recv.outstanding(), "receiver drains {left}");
        left
    }

    /// After every operation.
    fn check_state(&mut self) {
        assert_eq!(self.p.send.failure(), None, "the sender failed");
        assert_eq!(self.p.recv.failure(), None, "the receiver failed");
        let issued = self
            .sends
            .iter()
            .filter(|s| s.id.is_some() && !s.reported)
            .count();
        let posted = self
            .recvs
            .iter()
            .filter(|r| r.id.is_some() && !r.reported)
            .count();
        assert_eq!(self.p.send.outstanding(), issued, "send requests");
        assert_eq!(self.p.recv.outstanding(), posted, "receive requests");
        assert!(self.p.send_nic.sq_occupancy() <= SEND_QUEUE_DEPTH);
        assert!(self.p.recv_nic.sq_occupancy() <= SEND_QUEUE_DEPTH);
        assert!(self.p.send_nic.cq_len() <= CQ_DEPTH && self.p.recv_nic.cq_len() <= CQ_DEPTH);
        let arrivals = self.p.recv.eager_arrivals();
        assert!(
            arrivals <= self.host_sends,
            "{arrivals} eager messages from {} sends handed their bytes",
            self.host_sends
        );
        if self.threshold == 0 {
            assert_eq!(arrivals, 0, "eager messages with the threshold 0");
        }
        self.outcome.eager_arrivals = arrivals;
    }

    /// Complete the stream as NCCL would go on calling: retry what waits, give every waiting
    /// send a receive and every buffer a send, deliver, test everything; until all completed.
    fn finish(&mut self) {
        for _ in 0..MAX_FINISH_ROUNDS {
            if self.sends.iter().all(|s| s.reported) && self.recvs.iter().all(|r| r.reported) {
                break;
            }
            if let Some(index) = self.retry_send {
                self.try_send(index);
            } else if let Some(open) = self.open_recv() {
                let buf = open.bufs.iter().find(|b| b.send.is_none()).expect("open");
                let len = buf.buf.len.min(FINISH_LEN);
                // Choice 0 of the open receive's free tags: its first free buffer's.
                self.new_send(len, 0, false);
            }
            if let Some(index) = self.retry_recv {
                self.try_recv(index);
            } else if !self.waiting_sends().is_empty() {
                let spec = BufSpec {
                    capacity: Capacity::Fits,
                    gpu: false,
                    tag: 0,
                };
                self.new_recv(&[spec]);
            }
            self.p.fabric.run_until_idle();
            for index in 0..self.sends.len() {
                if !self.sends[index].reported && self.sends[index].id.is_some() {
                    self.test_send(index);
                }
            }
            for index in 0..self.recvs.len() {
                if !self.recvs[index].reported && self.recvs[index].id.is_some() {
                    self.test_recv(index);
                }
            }
            self.drain_send();
            self.drain_recv();
            self.check_state();
        }
        let sends_left = self.sends.iter().filter(|s| !s.reported).count();
        let recvs_left = self.recvs.iter().filter(|r| !r.reported).count();
        assert_eq!(
            (sends_left, recvs_left),
            (0, 0),
            "sends and receives left after {MAX_FINISH_ROUNDS} rounds of completion"
        );
        self.p.fabric.run_until_idle();
        if self.drain_send() == 1 {
            // Inline sends are done at their post and unsignaled: the drain fences their tail
            // once (a signaled empty write), which the fabric delivers; then nothing is left.
            self.p.fabric.run_until_idle();
        }
        assert_eq!(
            self.drain_send(),
            0,
            "the sender's drain once all completed"
        );
        assert_eq!(
            self.drain_recv(),
            0,
            "the receiver's drain once all completed"
        );
        assert_eq!(self.p.send.outstanding() + self.p.recv.outstanding(), 0);
        self.check_state();
        // Nothing wrote into a buffer after its receive completed.
        for index in 0..self.recvs.len() {
            self.check_bytes(index);
        }
    }
}

/// One run of the target on libFuzzer's bytes.
pub fn check(bytes: &[u8]) {
    run(&Input::decode(bytes));
}

/// One run on a decoded input.
pub fn run(input: &Input) -> Outcome {
    let mut h = Harness::new(input);
    for op in input.ops.iter().take(MAX_OPS) {
        match op {
            Op::Send { size, tag, gpu } => h.send_op(*size, *tag, *gpu),
            Op::Recv(spec) => h.recv_op(std::slice::from_ref(spec)),
            Op::Group(specs) => h.recv_op(specs),
            Op::Step(k) => {
                for _ in 0..=*k {
                    h.p.fabric.step();
                }
            }
            Op::TestSend => h.test_oldest_send(),
            Op::TestRecv => h.test_oldest_recv(),
            Op::DrainSend => {
                h.drain_send();
            }
            Op::DrainRecv => {
                h.drain_recv();
            }
            Op::Deliver => {
                h.p.fabric.run_until_idle();
            }
        }
        h.check_state();
    }
    h.finish();
    h.outcome
}
