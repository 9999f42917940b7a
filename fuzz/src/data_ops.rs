//! Arbitrary interleavings of isend / irecv / test / fabric steps / faults on a connected pair
//! through the simulated fabric, checked against a model of the protocol:
//!
//! - a send matches the first unmatched entry with its tag of the oldest receive with unmatched
//!   entries, or nothing; it is refused only while that receive's CTS is not yet written (the
//!   receiver may hold back its newest ones until its next call) or still in flight;
//! - every request is reported exactly once (Done or an error), then its id is invalid;
//! - received bytes and sizes are exactly what was sent (each message's bytes derive from its
//!   number), a send larger than its buffer fails on both sides;
//! - without faults, every fully matched receive and its sends complete once the fabric is idle;
//! - after a fault, errors are sticky and name a cause; nothing panics;
//! - the drain before a close (`drain`) counts exactly what is still on its way once the fabric is
//!   idle: nothing on the sender, and on the receiver every receive not fully matched that the
//!   sender was told about (the rest are still deferred, never announced by the drain);
//! - memory stays bounded: outstanding requests, queue occupancies and completion queues never
//!   exceed their pools and depths (the simulator itself panics on any overrun).

use std::collections::VecDeque;

use arbitrary::Arbitrary;
use rivet_core::data::Connection;
use rivet_core::data::{
    CQ_DEPTH, Completed, DataError, MAX_RECVS, MAX_REQUESTS, RecvBuf, RequestId, SEND_QUEUE_DEPTH,
    SLOTS, SendBuf,
};
use rivet_core::sim::suite::pattern;
use rivet_core::sim::{DataPair, irecv_direct, isend_direct};

#[derive(Arbitrary, Debug)]
enum Fault {
    QpErrorSender,
    QpErrorReceiver,
    VanishReceiver,
    VanishSender,
    /// Deregister the oldest receive's first buffer (remote access error when written).
    DeregisterRecvBuffer,
    FatalSender,
    FatalReceiver,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Isend {
        tag: u8,
        len: u16,
    },
    Irecv {
        n: u8,
        sizes: [u16; MAX_RECVS],
        tags: [u8; MAX_RECVS],
    },
    TestSend(u8),
    TestRecv(u8),
    Step(u8),
    Drain,
    /// What a close does before destroying the queue pairs: run the fabric, then `drain` both.
    DrainForClose,
    Fault(Fault),
    Close,
}

/// The target's input, decoded from libFuzzer's bytes by `arbitrary`.
#[derive(Arbitrary, Debug)]
pub struct Input {
    inline: u8,
    ops: Vec<Op>,
}

#[derive(Debug)]
struct ModelRecv {
    id: RequestId,
    bufs: Vec<RecvBuf>,
    tags: Vec<u32>,
    /// Per entry: the message (number, length) matched into it.
    matched: Vec<Option<(u64, u64)>>,
    /// `test` reported it (it stays in the model while the sender may still match into it).
    reported: bool,
}

impl ModelRecv {
    fn complete(&self) -> bool {
        self.matched.iter().all(Option::is_some)
    }
}

#[derive(Debug)]
struct ModelSend {
    id: RequestId,
    len: u64,
    /// Sequence (model index) of the receive it matched and whether it did not fit.
    recv_seq: u64,
    refused: bool,
}

struct Harness {
    p: DataPair,
    recvs: VecDeque<(u64, ModelRecv)>,
    next_recv_seq: u64,
    sends: Vec<ModelSend>,
    next_msg: u64,
    faulted: bool,
    /// Nothing was posted since the fabric last ran dry: every posted CTS has landed.
    idle: bool,
}

impl Harness {
    fn check_bounds(&self) {
        assert!(self.p.send.outstanding() <= MAX_REQUESTS);
        assert!(self.p.recv.outstanding() <= SLOTS);
        assert_eq!(
            self.p.send.outstanding(),
            self.sends.len(),
            "send requests leaked or lost"
        );
        let unreported = self.recvs.iter().filter(|(_, r)| !r.reported).count();
        assert_eq!(
            self.p.recv.outstanding(),
            unreported,
            "receive requests leaked or lost"
        );
        assert!(self.p.send_nic.sq_occupancy() <= SEND_QUEUE_DEPTH);
        assert!(self.p.recv_nic.sq_occupancy() <= SEND_QUEUE_DEPTH);
        assert!(self.p.send_nic.cq_len() <= CQ_DEPTH && self.p.recv_nic.cq_len() <= CQ_DEPTH);
    }

    fn isend(&mut self, tag: u8, len: u16) {
        // The top bit picks the driver: the plugin's (the core decides a one-buffer send from the
        // entry the driver read, `isend_one`, the general `isend` for the rest) or `isend` alone.
        let direct = tag & 0x80 != 0;
        let tag = u32::from(tag % 4);
        let len = usize::from(len % 1024);
        let msg = self.next_msg;
        let buf = if len == 0 {
            SendBuf {
                addr: 0,
                len: 0,
                lkey: 0xbad,
            }
        } else {
            self.p.send_buf(&pattern(msg, len))
        };
        let sent = if direct {
            isend_direct(&mut self.p.send, &mut self.p.send_nic, buf, tag)
        } else {
            self.p.send.isend(&mut self.p.send_nic, buf, tag)
        };
        match sent {
            Ok(Some(id)) => {
                assert!(!self.faulted || self.p.send.failure().is_none());
                // The model's choice: oldest receive with unmatched entries, first entry with tag.
                let (seq, recv) = self
                    .recvs
                    .iter_mut()
                    .find(|(_, r)| !r.complete())
                    .expect("isend matched although no receive is waiting");
                let entry = (0..recv.tags.len())
                    .find(|&i| recv.matched[i].is_none() && recv.tags[i] == tag)
                    .expect("isend matched a tag the oldest receive does not offer");
                recv.matched[entry] = Some((msg, len as u64));
                let refused = len as u64 > recv.bufs[entry].len;
                self.idle = false;
                self.sends.push(ModelSend {
                    id,
                    len: len as u64,
                    recv_seq: *seq,
                    refused,
                });
                self.next_msg += 1;
            }
            Ok(None) => {
                // Liveness: with every CTS written and delivered, a pool slot free and no fault,
                // a send whose tag the oldest waiting receive offers must be taken. The receiver
                // may hold back the CTS of its newest receives until its next call.
                let announced_below = self.next_recv_seq - self.p.recv.unannounced() as u64;
                let offered =
                    self.recvs
                        .iter()
                        .find(|(_, r)| !r.complete())
                        .is_some_and(|(seq, r)| {
                            *seq < announced_below
                                && (0..r.tags.len())
                                    .any(|i| r.matched[i].is_none() && r.tags[i] == tag)
                        });
                assert!(
                    !(offered
                        && self.idle
                        && !self.faulted
                        && self.p.send.outstanding() < MAX_REQUESTS),
                    "isend refused a match whose clear-to-send had landed"
                );
            }
            Err(err) => self.expect_failure(err, true),
        }
    }

    fn irecv(&mut self, n: u8, sizes: [u16; MAX_RECVS], tags: [u8; MAX_RECVS]) {
        // The top bit picks the driver, as for sends: the plugin's (`irecv_one` for one buffer)
        // or `irecv` alone.
        let direct = n & 0x80 != 0;
        let n = 1 + usize::from(n) % MAX_RECVS;
        let bufs: Vec<RecvBuf> = sizes[..n]
            .iter()
            .map(|&s| {
                let cap = usize::from(s % 1100);
                if cap == 0 {
                    RecvBuf {
                        addr: 0,
                        len: 0,
                        rkey: 0xbad,
                        host: false,
                    }
                } else {
                    self.p.recv_buf(cap)
                }
            })
            .collect();
        let tags: Vec<u32> = tags[..n].iter().map(|&t| u32::from(t % 4)).collect();
        let posted = if direct {
            irecv_direct(&mut self.p.recv, &mut self.p.recv_nic, &bufs, &tags)
        } else {
            self.p.recv.irecv(&mut self.p.recv_nic, &bufs, &tags)
        };
        match posted {
            Ok(Some(id)) => {
                let seq = self.next_recv_seq;
                self.next_recv_seq += 1;
                self.idle = false;
                self.recvs.push_back((
                    seq,
                    ModelRecv {
                        id,
                        bufs,
                        tags,
                        matched: vec![None; n],
                        reported: false,
                    },
                ));
            }
            Ok(None) => {}
            Err(err) => self.expect_failure(err, false),
        }
    }

    /// An error from a call: allowed only as a sticky connection failure.
    fn expect_failure(&self, err: DataError, send_side: bool) {
        let failure = if send_side {
            self.p.send.failure()
        } else {
            self.p.recv.failure()
        };
        assert_eq!(failure, Some(&err), "non-sticky error {err}");
        assert!(!std::format!("{err}").is_empty());
    }

    fn test_send(&mut self, i: usize) -> bool {
        if self.sends.is_empty() {
            return false;
        }
        let i = i % self.sends.len();
        let id = self.sends[i].id;
        let result = self.p.send.test(&mut self.p.send_nic, id);
        let s = &self.sends[i];
        match result {
            Ok(Completed::Pending) => return false,
            Ok(Completed::Done { n, sizes }) => {
                assert_eq!(n, 1);
                assert_eq!(u64::from(sizes[0]), s.len);
                assert!(!s.refused, "an oversized send completed");
                let recv_complete = self
                    .recvs
                    .iter()
                    .find(|(seq, _)| *seq == s.recv_seq)
                    .is_none_or(|(_, r)| r.complete());
                assert!(
                    recv_complete,
                    "send completed before its group was fully matched"
                );
            }
            Err(DataError::SizeMismatch { sent, capacity, .. }) => {
                assert!(s.refused && sent == s.len && sent > capacity);
            }
            Err(err) => self.expect_failure(err, true),
        }
        self.sends.swap_remove(i);
        assert!(matches!(
            self.p.send.test(&mut self.p.send_nic, id),
            Err(DataError::InvalidRequest { .. })
        ));
        true
    }

    fn test_recv(&mut self, i: usize) -> bool {
        let live: Vec<usize> = (0..self.recvs.len())
            .filter(|&k| !self.recvs[k].1.reported)
            .collect();
        if live.is_empty() {
            return false;
        }
        let i = live[i % live.len()];
        let id = self.recvs[i].1.id;
        let result = self.p.recv.test(&mut self.p.recv_nic, id);
        let r = &self.recvs[i].1;
        match result {
            Ok(Completed::Pending) => return false,
            Ok(Completed::Done { n, sizes }) => {
                assert_eq!(usize::from(n), r.bufs.len());
                assert!(
                    r.complete(),
                    "receive completed before all its sends matched"
                );
                for (k, matched) in r.matched.iter().enumerate() {
                    let (msg, len) = matched.expect("complete");
                    assert!(len <= r.bufs[k].len);
                    assert_eq!(u64::from(sizes[k]), len, "size of buffer {k}");
                    if len > 0 {
                        let got = self.p.received(&r.bufs[k], len as usize);
                        assert_eq!(got, pattern(msg, len as usize), "bytes of buffer {k}");
                    }
                }
            }
            Err(DataError::SizeMismatch {
                index,
                sent,
                capacity,
            }) => {
                assert!(r.complete());
                let first = r
                    .matched
                    .iter()
                    .zip(&r.bufs)
                    .position(|(m, b)| m.is_some_and(|(_, len)| len > b.len))
                    .expect("mismatch reported but every send fit");
                assert_eq!(index, first);
                assert_eq!(sent, r.matched[first].unwrap().1);
                assert_eq!(capacity, r.bufs[first].len);
            }
            Err(err) => self.expect_failure(err, false),
        }
        self.recvs[i].1.reported = true;
        // Forget receives the sender can no longer match into.
        while self
            .recvs
            .front()
            .is_some_and(|(_, r)| r.reported && r.complete())
        {
            self.recvs.pop_front();
        }
        assert!(matches!(
            self.p.recv.test(&mut self.p.recv_nic, id),
            Err(DataError::InvalidRequest { .. })
        ));
        true
    }

    fn fault(&mut self, fault: Fault) {
        self.faulted = true;
        match fault {
            Fault::QpErrorSender => self.p.fabric.fault_qp_error(&self.p.send_nic),
            Fault::QpErrorReceiver => self.p.fabric.fault_qp_error(&self.p.recv_nic),
            Fault::VanishReceiver => {
                self.p.fabric.vanish(self.p.recv_ep);
                self.p.recv.handle_fatal(DataError::PeerLost);
            }
            Fault::VanishSender => {
                self.p.fabric.vanish(self.p.send_ep);
                self.p.send.handle_fatal(DataError::PeerLost);
            }
            Fault::DeregisterRecvBuffer => {
                if let Some((_, r)) = self.recvs.iter().find(|(_, r)| !r.reported) {
                    if r.bufs[0].len > 0 {
                        self.p.fabric.deregister(self.p.recv_ep, r.bufs[0].rkey);
                    }
                }
            }
            Fault::FatalSender => self.p.send.handle_fatal(DataError::PeerLost),
            Fault::FatalReceiver => self.p.recv.handle_fatal(DataError::PeerLost),
        }
    }

    /// Deliver everything, then every request that can complete must.
    fn drain_for_close(&mut self) {
        self.p.fabric.run_until_idle();
        self.idle = true;
        let unannounced = self.p.recv.unannounced();
        let mut send_left = self.p.send.drain(&mut self.p.send_nic);
        if send_left == Ok(1) && !self.faulted {
            // Inline sends are done at their post and unsignaled: the drain fences their tail
            // once (a signaled empty write), which the fabric delivers; then nothing is left.
            self.p.fabric.run_until_idle();
            send_left = self.p.send.drain(&mut self.p.send_nic);
        }
        let recv_left = self.p.recv.drain(&mut self.p.recv_nic);
        assert_eq!(
            self.p.recv.unannounced(),
            unannounced,
            "the drain announced a deferred receive"
        );
        if self.faulted {
            return;
        }
        assert_eq!(send_left, Ok(0), "sends still in flight on an idle fabric");
        let incomplete = self.recvs.iter().filter(|(_, r)| !r.complete()).count();
        assert_eq!(
            recv_left.map(|left| left + unannounced),
            Ok(incomplete),
            "the receiver's drain miscounts what the sender may still write"
        );
    }

    fn close(&mut self) {
        self.p.fabric.run_until_idle();
        for _ in 0..2 {
            let mut i = 0;
            while i < self.sends.len() {
                if !self.test_send(i) {
                    i += 1;
                }
            }
            let live = self.recvs.iter().filter(|(_, r)| !r.reported).count();
            let mut i = 0;
            for _ in 0..live {
                // test_recv picks among unreported receives by position.
                if !self.test_recv(i) {
                    i += 1;
                }
            }
        }
        if !self.faulted {
            assert!(self.p.send.failure().is_none() && self.p.recv.failure().is_none());
            for s in &self.sends {
                let owner = self.recvs.iter().find(|(seq, _)| *seq == s.recv_seq);
                assert!(
                    owner.is_some_and(|(_, r)| !r.complete()),
                    "send of a complete group lost its completion"
                );
            }
            for (_, r) in &self.recvs {
                assert!(
                    r.reported || !r.complete(),
                    "fully matched receive lost its completion"
                );
            }
        } else {
            // A failed connection fails every outstanding request.
            if self.p.send.failure().is_some() {
                assert!(self.sends.is_empty(), "outstanding send not failed");
            }
            if self.p.recv.failure().is_some() {
                assert!(
                    self.recvs.iter().all(|(_, r)| r.reported),
                    "outstanding receive not failed"
                );
            }
        }
        self.check_bounds();
    }
}

/// One run of the target on a decoded input.
pub fn check(input: Input) {
    let max_inline = [0, 64, 256][usize::from(input.inline % 3)];
    let mut h = Harness {
        p: DataPair::new(max_inline),
        recvs: VecDeque::new(),
        next_recv_seq: 0,
        sends: Vec::new(),
        next_msg: 0,
        faulted: false,
        idle: true,
    };
    for op in input.ops.into_iter().take(4096) {
        match op {
            Op::Isend { tag, len } => h.isend(tag, len),
            Op::Irecv { n, sizes, tags } => h.irecv(n, sizes, tags),
            Op::TestSend(i) => {
                h.test_send(usize::from(i));
            }
            Op::TestRecv(i) => {
                h.test_recv(usize::from(i));
            }
            Op::Step(k) => {
                for _ in 0..=k {
                    h.p.fabric.step();
                }
                h.idle |= h.p.fabric.pending() == 0;
            }
            Op::Drain => {
                h.p.fabric.run_until_idle();
                h.idle = true;
            }
            Op::DrainForClose => h.drain_for_close(),
            Op::Fault(fault) => h.fault(fault),
            Op::Close => break,
        }
        // Any call may post work (a `test` of the receiver writes the clear-to-sends it held
        // back): while the fabric carries some, a clear-to-send may be on its way, not landed.
        h.idle &= h.p.fabric.pending() == 0;
        h.check_bounds();
    }
    h.close();
}
