//! Arbitrary interleavings of isend / irecv / test / per-queue-pair fabric steps / faults on a
//! multi-QP connection (1..=4 queue pairs: round-robin, split, or striped over some of them;
//! adaptive routing on or off)
//! through the simulated fabric. Stepping one queue pair at a time delivers the queue pairs in
//! any order against each other. Checked against a model:
//!
//! - sends match receives in FIFO order (single-buffer receives; tags are the same on both
//!   sides so every send matches the oldest unmatched receive); a refused call is retried with
//!   the same arguments, as NCCL does, so half-posted split requests always finish posting;
//! - that order is the order in which receives were posted, also after a fault: a receive the
//!   receiver already reported failed keeps its place, because its clear-to-send may have
//!   reached the sender before the fault, and the sender (which learns of a fault only from its
//!   own completions) matches it like any other (issue #31: the model used to drop failed
//!   receives, so it predicted the next receive's size for such a send);
//! - every request is reported exactly once (Done or an error), then its id is invalid;
//! - a completed receive holds exactly the bytes sent and reports their length, and is reported
//!   only when the sender's message was delivered on every queue pair it used; a send larger
//!   than its buffer fails on both sides;
//! - without faults, everything posted completes once the fabric is idle; after a fault, nothing
//!   panics and errors name a cause.

use std::collections::VecDeque;

use arbitrary::Arbitrary;
use rivet_core::data::multi::QpPolicy;
use rivet_core::data::{Completed, DataError, RecvBuf, RequestId, SendBuf};
use rivet_core::sim::MultiPair;
use rivet_core::sim::suite::pattern;

#[derive(Arbitrary, Debug)]
enum Op {
    Isend { len: u16 },
    Irecv { cap: u16 },
    TestSend(u8),
    TestRecv(u8),
    StepQp { qp: u8, sender: bool, times: u8 },
    StepAll(u8),
    FaultQp(u8),
    Fatal,
}

/// The target's input, decoded from libFuzzer's bytes by `arbitrary`.
#[derive(Arbitrary, Debug)]
pub struct Input {
    qps: u8,
    split: bool,
    /// Without split: queue pairs per message, 1..=qps (a fused device's stripes).
    width: u8,
    adaptive_routing: bool,
    ar_threshold: u16,
    inline: bool,
    ops: Vec<Op>,
}

struct Recv {
    id: RequestId,
    /// Its position in the matching order ([`Harness::slots`]).
    slot: usize,
    buf: RecvBuf,
    /// The message matched into it: number and length.
    matched: Option<(u64, u64)>,
}

struct Send {
    id: RequestId,
    len: u64,
    refused: bool,
}

struct Harness {
    p: MultiPair,
    recvs: VecDeque<Recv>,
    /// Capacity of every receive in posting order, reported or not: the order sends match.
    slots: Vec<u64>,
    /// Sends matched so far: the next send matches `slots[matched]`.
    matched: usize,
    /// A receive failed fatally and may have posted part of its clear-to-sends: its slot is
    /// the last.
    tail_posted: bool,
    sends: Vec<Send>,
    next_msg: u64,
    faulted: bool,
    /// A refused split call to repeat as is.
    retry_send: Option<SendBuf>,
    retry_recv: Option<RecvBuf>,
}

const TAG: u32 = 3;

impl Harness {
    fn isend(&mut self, len: u16) {
        let buf = match self.retry_send.take() {
            Some(buf) => buf,
            None => {
                let len = usize::from(len % 4096);
                if len == 0 {
                    SendBuf {
                        addr: 0,
                        len: 0,
                        lkey: 0xbad,
                    }
                } else {
                    self.p.send_buf(&pattern(self.next_msg, len))
                }
            }
        };
        match self.p.send.isend(&mut self.p.send_nics, buf, TAG) {
            Ok(Some(id)) => {
                let slot = self.matched;
                let capacity = *self
                    .slots
                    .get(slot)
                    .expect("isend matched although no receive was posted");
                self.matched += 1;
                // The receive may already have been reported (failed after a fault): then
                // there is nothing to mark, but the send still answers for its size.
                if let Some(recv) = self.recvs.iter_mut().find(|r| r.slot == slot) {
                    assert!(recv.matched.is_none(), "a receive matched twice");
                    recv.matched = Some((self.next_msg, buf.len));
                }
                let refused = buf.len > capacity;
                self.sends.push(Send {
                    id,
                    len: buf.len,
                    refused,
                });
                self.next_msg += 1;
            }
            Ok(None) => self.retry_send = Some(buf),
            Err(err) => assert!(self.faulted, "isend failed without a fault: {err}"),
        }
    }

    fn irecv(&mut self, cap: u16) {
        let buf = match self.retry_recv.take() {
            Some(buf) => buf,
            None => self.p.recv_buf(usize::from(cap % 4096)),
        };
        match self.p.recv.irecv(&mut self.p.recv_nics, &[buf], &[TAG]) {
            Ok(Some(id)) => {
                self.recvs.push_back(Recv {
                    id,
                    slot: self.slots.len(),
                    buf,
                    matched: None,
                });
                self.slots.push(buf.len);
            }
            Ok(None) => self.retry_recv = Some(buf),
            Err(err) => {
                assert!(self.faulted, "irecv failed without a fault: {err}");
                // A half-posted receive that failed on a later part has written its
                // clear-to-send on the earlier ones, which the sender may match. It is the
                // last receive this connection posts (the failure is fatal), so it is the
                // last slot.
                if err.is_fatal() && !self.tail_posted {
                    self.tail_posted = true;
                    self.slots.push(buf.len);
                }
            }
        }
    }

    fn test_send(&mut self, i: usize) -> bool {
        if self.sends.is_empty() {
            return true;
        }
        let i = i % self.sends.len();
        let send = &self.sends[i];
        match self.p.send.test(&mut self.p.send_nics, send.id) {
            Ok(Completed::Pending) => return false,
            Ok(Completed::Done { sizes, .. }) => {
                assert!(!send.refused, "a refused send completed");
                assert_eq!(u64::from(sizes[0]), send.len);
            }
            Err(DataError::SizeMismatch { .. }) => assert!(send.refused),
            Err(err) => assert!(self.faulted, "send failed without a fault: {err}"),
        }
        let id = self.sends.swap_remove(i).id;
        assert!(matches!(
            self.p.send.test(&mut self.p.send_nics, id),
            Err(DataError::InvalidRequest { .. })
        ));
        true
    }

    fn test_recv(&mut self, i: usize) -> bool {
        if self.recvs.is_empty() {
            return true;
        }
        let i = i % self.recvs.len();
        let recv = &self.recvs[i];
        match self.p.recv.test(&mut self.p.recv_nics, recv.id) {
            Ok(Completed::Pending) => return false,
            Ok(Completed::Done { n, sizes }) => {
                let (msg, len) = recv.matched.expect("a receive completed with no send");
                assert_eq!((n, u64::from(sizes[0])), (1, len));
                assert!(len <= recv.buf.len);
                let got = self.p.received(&recv.buf, len as usize);
                assert!(got == pattern(msg, len as usize), "received bytes differ");
            }
            // After a fault, a half-posted split send may have refused parts the model never saw.
            Err(DataError::SizeMismatch { .. }) if self.faulted => {}
            Err(DataError::SizeMismatch { .. }) => {
                let (_, len) = recv.matched.expect("a receive refused with no send");
                assert!(len > recv.buf.len);
            }
            Err(err) => assert!(self.faulted, "receive failed without a fault: {err}"),
        }
        let id = self.recvs[i].id;
        assert!(matches!(
            self.p.recv.test(&mut self.p.recv_nics, id),
            Err(DataError::InvalidRequest { .. })
        ));
        self.recvs.remove(i);
        true
    }
}

/// One run of the target on a decoded input.
pub fn check(input: Input) {
    let qps = i64::from(input.qps % 4) + 1;
    let Ok(policy) = QpPolicy::new(
        qps,
        i64::from(input.split),
        input.adaptive_routing,
        i64::from(input.ar_threshold),
    ) else {
        panic!("valid policy refused");
    };
    let width = if policy.split() {
        policy.qps()
    } else {
        usize::from(input.width) % policy.qps() + 1
    };
    let mut h = Harness {
        p: MultiPair::with_width(
            if input.inline { 64 } else { 0 },
            policy.qps(),
            width,
            policy.ar_threshold(),
        ),
        recvs: VecDeque::new(),
        sends: Vec::new(),
        next_msg: 0,
        faulted: false,
        slots: Vec::new(),
        matched: 0,
        tail_posted: false,
        retry_send: None,
        retry_recv: None,
    };
    for op in input.ops.into_iter().take(512) {
        match op {
            Op::Isend { len } => h.isend(len),
            Op::Irecv { cap } => {
                if h.recvs.len() < 200 {
                    h.irecv(cap)
                }
            }
            Op::TestSend(i) => {
                h.test_send(usize::from(i));
            }
            Op::TestRecv(i) => {
                h.test_recv(usize::from(i));
            }
            Op::StepQp { qp, sender, times } => {
                let qp = usize::from(qp) % h.p.send_nics.len();
                let nic = if sender {
                    &h.p.send_nics[qp]
                } else {
                    &h.p.recv_nics[qp]
                };
                for _ in 0..times % 16 {
                    h.p.fabric.step_qp(nic);
                }
            }
            Op::StepAll(times) => {
                for _ in 0..times % 32 {
                    h.p.fabric.step();
                }
            }
            Op::FaultQp(qp) => {
                let qp = usize::from(qp) % h.p.send_nics.len();
                h.p.fabric.fault_qp_error(&h.p.send_nics[qp]);
                h.faulted = true;
            }
            Op::Fatal => {
                h.p.send.handle_fatal(DataError::PeerLost);
                h.p.recv.handle_fatal(DataError::PeerLost);
                h.faulted = true;
            }
        }
    }
    // Finish: repeat refused calls, deliver everything, and every request must be reported.
    for _ in 0..4 {
        if let Some(buf) = h.retry_recv {
            h.irecv(buf.len as u16);
        }
        h.p.fabric.run_until_idle();
        // NCCL tests its receives while it waits: that writes clear-to-sends held back.
        for i in (0..h.recvs.len()).rev() {
            if h.recvs[i].matched.is_none() {
                h.test_recv(i);
            }
        }
        h.p.fabric.run_until_idle();
        if h.retry_send.is_some() {
            h.isend(0);
        }
        h.p.fabric.run_until_idle();
    }
    if h.faulted {
        return;
    }
    assert!(h.retry_send.is_none() || h.recvs.iter().all(|r| r.matched.is_some()));
    while !h.sends.is_empty() {
        assert!(h.test_send(0), "a delivered send is still pending");
    }
    // Receives with a send complete; the rest stay pending.
    let mut i = 0;
    while i < h.recvs.len() {
        if h.recvs[i].matched.is_some() {
            assert!(h.test_recv(i), "a delivered receive is still pending");
        } else {
            i += 1;
        }
    }
}
