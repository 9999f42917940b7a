//! The data-path pair tests, written once and run over every NIC implementation: the simulated
//! fabric ([`DataPair`](super::DataPair), by `rivet-core`'s own tests) and the software mlx5
//! model (by the plugin). A harness implements [`PairHarness`]; [`data_pair_tests!`] expands to
//! one `#[test]` per function here. Each checks a point of NCCL's contract byte for byte.
//!
//! [`data_pair_tests!`]: crate::data_pair_tests

use std::vec::Vec;

use crate::data::Connection;
use crate::data::{
    CQ_DEPTH, Completed, DataError, MAX_RECVS, ProtocolError, RecvBuf, RecvConn, RequestId,
    SEND_QUEUE_DEPTH, SLOTS, SendBuf, SendConn, codec,
};
use crate::nic::{Nic, WcStatus};

/// One end of a pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// The `SendConn` side.
    Sender,
    /// The `RecvConn` side.
    Receiver,
}

/// A connected sender/receiver pair over some NIC, with the fault injections the tests use.
pub trait PairHarness: Sized {
    /// The NIC both ends drive.
    type Nic: Nic;
    /// A connected pair whose queue pairs allow `max_inline` inline bytes.
    fn new(max_inline: usize) -> Self;
    /// The sender's machine and NIC.
    fn send_side(&mut self) -> (&mut SendConn, &mut Self::Nic);
    /// The receiver's machine and NIC.
    fn recv_side(&mut self) -> (&mut RecvConn, &mut Self::Nic);
    /// The sender's machine.
    fn sender(&self) -> &SendConn;
    /// The receiver's machine.
    fn receiver(&self) -> &RecvConn;
    /// Replace both machines (to start them with other peer regions).
    fn replace_conns(&mut self, send: SendConn, recv: RecvConn);
    /// Execute one queued work request; false when none is queued.
    fn step(&mut self) -> bool;
    /// A registered send buffer holding `bytes`.
    fn send_buf(&mut self, bytes: &[u8]) -> SendBuf;
    /// A registered, zeroed receive buffer of `len` bytes.
    fn recv_buf(&mut self, len: usize) -> RecvBuf;
    /// The first `len` bytes of a receive buffer.
    fn received(&self, buf: &RecvBuf, len: usize) -> Vec<u8>;
    /// Write `bytes` into the sender's clear-to-send FIFO at `offset`, as a peer's NIC would.
    fn write_cts_fifo(&mut self, offset: u64, bytes: &[u8]);
    /// Put `end`'s queue pair into the error state (everything outstanding is flushed).
    fn fault_qp_error(&mut self, end: End);
    /// Deregister a receive buffer behind the protocol's back.
    fn deregister_receive_buffer(&mut self, rkey: u32);
    /// `end` vanishes: its work requests stop executing and the peer's retries run out.
    fn vanish(&mut self, end: End);
    /// Place RDMA writes in two steps, second half first (see `Fabric::set_split_placement`).
    fn set_split_placement(&mut self, on: bool);
    /// Work requests outstanding on `end`'s send queue.
    fn sq_occupancy(&self, end: End) -> usize;
    /// Completions waiting in `end`'s completion queue, where the harness can tell.
    fn cq_len(&self, end: End) -> Option<usize>;

    /// Execute queued work requests until none is left; returns how many ran.
    fn run_until_idle(&mut self) -> usize {
        let mut ran = 0;
        while self.step() {
            ran += 1;
        }
        ran
    }
    /// The sender's machine, mutably.
    fn sender_mut(&mut self) -> &mut SendConn {
        self.send_side().0
    }
    /// The receiver's machine, mutably.
    fn receiver_mut(&mut self) -> &mut RecvConn {
        self.recv_side().0
    }
    /// `SendConn::isend` on the sender's NIC.
    fn isend(&mut self, buf: SendBuf, tag: u32) -> Result<Option<RequestId>, DataError> {
        let (conn, nic) = self.send_side();
        conn.isend(nic, buf, tag)
    }
    /// `RecvConn::irecv` on the receiver's NIC.
    fn irecv(&mut self, bufs: &[RecvBuf], tags: &[u32]) -> Result<Option<RequestId>, DataError> {
        let (conn, nic) = self.recv_side();
        conn.irecv(nic, bufs, tags)
    }
    /// `SendConn::test` on the sender's NIC.
    fn test_send(&mut self, req: RequestId) -> Result<Completed, DataError> {
        let (conn, nic) = self.send_side();
        conn.test(nic, req)
    }
    /// `RecvConn::test` on the receiver's NIC.
    fn test_recv(&mut self, req: RequestId) -> Result<Completed, DataError> {
        let (conn, nic) = self.recv_side();
        conn.test(nic, req)
    }
}

/// Deterministic bytes for message `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Step the fabric and test `req` until it is no longer pending.
pub fn finish_send<H: PairHarness>(p: &mut H, req: RequestId) -> Result<Completed, DataError> {
    for _ in 0..100_000 {
        match p.test_send(req)? {
            Completed::Pending => {
                p.step();
            }
            done => return Ok(done),
        }
    }
    panic!("send {req} never completed");
}

/// Step the fabric and test the receive `req` until it is no longer pending.
pub fn finish_recv<H: PairHarness>(p: &mut H, req: RequestId) -> Result<Completed, DataError> {
    for _ in 0..100_000 {
        match p.test_recv(req)? {
            Completed::Pending => {
                p.step();
            }
            done => return Ok(done),
        }
    }
    panic!("receive {req} never completed");
}

/// irecv that must be accepted at once.
pub fn irecv<H: PairHarness>(p: &mut H, bufs: &[RecvBuf], tags: &[u32]) -> RequestId {
    p.irecv(bufs, tags)
        .expect("irecv failed")
        .expect("irecv said try later")
}

/// isend, stepping the fabric until the clear-to-send arrives.
pub fn isend<H: PairHarness>(p: &mut H, buf: SendBuf, tag: u32) -> RequestId {
    for _ in 0..10_000 {
        if let Some(id) = p.isend(buf, tag).expect("isend failed") {
            return id;
        }
        assert!(p.step(), "isend can never match: nothing left to deliver");
    }
    panic!("isend never matched");
}

/// isend of a fresh buffer holding `bytes`.
pub fn isend_bytes<H: PairHarness>(p: &mut H, bytes: &[u8], tag: u32) -> RequestId {
    let buf = p.send_buf(bytes);
    isend(p, buf, tag)
}

/// The per-buffer sizes of a completed request.
pub fn done_sizes(c: Completed) -> Vec<u64> {
    match c {
        Completed::Done { n, sizes } => sizes[..usize::from(n)]
            .iter()
            .map(|&s| u64::from(s))
            .collect(),
        Completed::Pending => panic!("still pending"),
    }
}

/// One message of `len` bytes, n == 1, through a fresh pair.
fn roundtrip_one<H: PairHarness>(max_inline: usize, len: usize, cap: usize) {
    let mut p = H::new(max_inline);
    let data = pattern(len as u64, len);
    let rbuf = p.recv_buf(cap);
    let r = irecv(&mut p, &[rbuf], &[9]);
    let s = isend_bytes(&mut p, &data, 9);
    assert_eq!(done_sizes(finish_send(&mut p, s).unwrap()), [len as u64]);
    assert_eq!(done_sizes(finish_recv(&mut p, r).unwrap()), [len as u64]);
    assert_eq!(p.received(&rbuf, len), data);
    assert_eq!(p.sender().outstanding() + p.receiver().outstanding(), 0);
}

#[doc(hidden)]
pub fn single_message_every_inline_setting<H: PairHarness>() {
    for max_inline in [0, 64, 256] {
        roundtrip_one::<H>(max_inline, 1000, 1000);
        roundtrip_one::<H>(max_inline, 8, 8);
    }
}

#[doc(hidden)]
pub fn fifo_order_is_kept<H: PairHarness>() {
    let mut p = H::new(64);
    let bufs: Vec<RecvBuf> = (0..20).map(|_| p.recv_buf(256)).collect();
    let recvs: Vec<RequestId> = bufs.iter().map(|b| irecv(&mut p, &[*b], &[1])).collect();
    let sends: Vec<RequestId> = (0..20u64)
        .map(|i| {
            let buf = p.send_buf(&pattern(i, 100 + i as usize));
            isend(&mut p, buf, 1)
        })
        .collect();
    for (i, (s, r)) in sends.into_iter().zip(recvs).enumerate() {
        finish_send(&mut p, s).unwrap();
        assert_eq!(
            done_sizes(finish_recv(&mut p, r).unwrap()),
            [100 + i as u64]
        );
        assert_eq!(p.received(&bufs[i], 100 + i), pattern(i as u64, 100 + i));
    }
}

#[doc(hidden)]
pub fn tags_only_choose_within_the_oldest_receive<H: PairHarness>() {
    let mut p = H::new(64);
    let a = p.recv_buf(64);
    let b = p.recv_buf(64);
    let ra = irecv(&mut p, &[a], &[1]);
    let rb = irecv(&mut p, &[b], &[2]);
    p.run_until_idle();
    let tag2 = p.send_buf(&pattern(2, 10));
    assert_eq!(p.isend(tag2, 2), Ok(None));
    let s1 = isend_bytes(&mut p, &pattern(1, 10), 1);
    let s2 = isend(&mut p, tag2, 2);
    finish_send(&mut p, s1).unwrap();
    finish_send(&mut p, s2).unwrap();
    finish_recv(&mut p, ra).unwrap();
    finish_recv(&mut p, rb).unwrap();
    assert_eq!(p.received(&a, 10), pattern(1, 10));
    assert_eq!(p.received(&b, 10), pattern(2, 10));
}

#[doc(hidden)]
pub fn grouped_receive_with_shuffled_tags<H: PairHarness>() {
    for max_inline in [0, 64, 256] {
        let mut p = H::new(max_inline);
        let tags = [5u32, 2, 7, 0, 3, 6, 1, 4];
        let bufs: Vec<RecvBuf> = (0..8).map(|i| p.recv_buf(1000 + i)).collect();
        let r = irecv(&mut p, &bufs, &tags);
        p.run_until_idle();
        let stranger = p.send_buf(&[1, 2, 3]);
        assert_eq!(p.isend(stranger, 99), Ok(None));
        let sends: Vec<RequestId> = (0..8u32)
            .map(|tag| {
                let buf = p.send_buf(&pattern(u64::from(tag), 100 * tag as usize));
                isend(&mut p, buf, tag)
            })
            .collect();
        for s in sends {
            finish_send(&mut p, s).unwrap();
        }
        let sizes = done_sizes(finish_recv(&mut p, r).unwrap());
        for (i, &tag) in tags.iter().enumerate() {
            let len = 100 * tag as usize;
            assert_eq!(sizes[i], len as u64, "buffer {i}");
            assert_eq!(p.received(&bufs[i], len), pattern(u64::from(tag), len));
        }
    }
}

#[doc(hidden)]
pub fn grouped_receive_with_repeated_tags_matches_in_entry_order<H: PairHarness>() {
    let mut p = H::new(64);
    let bufs: Vec<RecvBuf> = (0..3).map(|_| p.recv_buf(64)).collect();
    let r = irecv(&mut p, &bufs, &[4, 4, 4]);
    let sends: Vec<RequestId> = (0..3u64)
        .map(|i| {
            let buf = p.send_buf(&pattern(i, 8));
            isend(&mut p, buf, 4)
        })
        .collect();
    for s in sends {
        finish_send(&mut p, s).unwrap();
    }
    finish_recv(&mut p, r).unwrap();
    for (i, b) in bufs.iter().enumerate() {
        assert_eq!(p.received(b, 8), pattern(i as u64, 8));
    }
}

#[doc(hidden)]
pub fn receive_larger_than_send_reports_send_size<H: PairHarness>() {
    roundtrip_one::<H>(0, 100, 4096);
    roundtrip_one::<H>(64, 100, 4096);
}

#[doc(hidden)]
pub fn send_larger_than_receive_fails_both_sides_and_the_connection_goes_on<H: PairHarness>() {
    for max_inline in [0, 64] {
        let mut p = H::new(max_inline);
        let small = p.recv_buf(16);
        let r = irecv(&mut p, &[small], &[0]);
        let s = isend_bytes(&mut p, &pattern(1, 17), 0);
        let expected = DataError::SizeMismatch {
            index: 0,
            sent: 17,
            capacity: 16,
        };
        assert_eq!(finish_send(&mut p, s), Err(expected));
        assert_eq!(finish_recv(&mut p, r), Err(expected));
        assert_eq!(p.received(&small, 16), [0; 16], "nothing written");
        assert!(p.sender().failure().is_none() && p.receiver().failure().is_none());
        // The connection still works.
        let ok = p.recv_buf(64);
        let r = irecv(&mut p, &[ok], &[0]);
        let s = isend_bytes(&mut p, &pattern(2, 64), 0);
        finish_send(&mut p, s).unwrap();
        finish_recv(&mut p, r).unwrap();
        assert_eq!(p.received(&ok, 64), pattern(2, 64));
    }
}

#[doc(hidden)]
pub fn send_larger_than_grouped_receive_buffer_fails_that_send_and_the_receive<H: PairHarness>() {
    let mut p = H::new(0);
    let bufs = [p.recv_buf(32), p.recv_buf(8), p.recv_buf(32)];
    let r = irecv(&mut p, &bufs, &[0, 1, 2]);
    let s0 = isend_bytes(&mut p, &pattern(0, 32), 0);
    let s1 = isend_bytes(&mut p, &pattern(1, 9), 1);
    let s2 = isend_bytes(&mut p, &pattern(2, 32), 2);
    assert_eq!(
        finish_send(&mut p, s1),
        Err(DataError::SizeMismatch {
            index: 1,
            sent: 9,
            capacity: 8
        })
    );
    assert!(finish_send(&mut p, s0).is_ok());
    assert!(finish_send(&mut p, s2).is_ok());
    let err = finish_recv(&mut p, r).unwrap_err();
    assert_eq!(
        err,
        DataError::SizeMismatch {
            index: 1,
            sent: 9,
            capacity: 8
        }
    );
    assert!(std::format!("{err}").contains("9-byte send does not fit receive buffer 1"));
    assert_eq!(p.received(&bufs[1], 8), [0; 8]);
}

#[doc(hidden)]
pub fn zero_byte_messages_never_touch_the_user_address<H: PairHarness>() {
    for max_inline in [0, 64] {
        let mut p = H::new(max_inline);
        // A NULL buffer with a bogus rkey: any write aimed at it would fail with REM_ACCESS_ERR.
        let null = RecvBuf {
            addr: 0,
            len: 0,
            rkey: 0xbad,
            host: false,
        };
        let r = irecv(&mut p, &[null], &[3]);
        let empty = SendBuf {
            addr: 0,
            len: 0,
            lkey: 0xbad,
        };
        let s = isend(&mut p, empty, 3);
        assert_eq!(done_sizes(finish_send(&mut p, s).unwrap()), [0]);
        assert_eq!(done_sizes(finish_recv(&mut p, r).unwrap()), [0]);

        let data = p.recv_buf(16);
        let r = irecv(&mut p, &[null, data, null], &[1, 2, 3]);
        let s1 = isend(&mut p, empty, 1);
        let s2 = isend_bytes(&mut p, &pattern(5, 16), 2);
        let s3 = isend(&mut p, empty, 3);
        for s in [s1, s2, s3] {
            finish_send(&mut p, s).unwrap();
        }
        assert_eq!(done_sizes(finish_recv(&mut p, r).unwrap()), [0, 16, 0]);
        assert_eq!(p.received(&data, 16), pattern(5, 16));
        assert!(p.sender().failure().is_none() && p.receiver().failure().is_none());
    }
}

#[doc(hidden)]
pub fn isend_before_any_clear_to_send_is_try_later<H: PairHarness>() {
    let mut p = H::new(64);
    let buf = p.send_buf(&[1; 8]);
    assert_eq!(p.isend(buf, 0), Ok(None));
    // Posted but not delivered yet: still try later.
    let rbuf = p.recv_buf(8);
    let r = irecv(&mut p, &[rbuf], &[0]);
    assert_eq!(p.isend(buf, 0), Ok(None));
    let s = isend(&mut p, buf, 0);
    finish_send(&mut p, s).unwrap();
    finish_recv(&mut p, r).unwrap();
}

#[doc(hidden)]
pub fn deferred_clear_to_sends_go_when_the_sender_runs_low<H: PairHarness>() {
    use crate::data::{CTS_BATCH, CTS_LOW_WATER};
    // Post one receive fewer than makes a batch beyond the low-water mark: those beyond it stay
    // staged, so the sender can match exactly CTS_LOW_WATER sends and then waits.
    let posted = (CTS_LOW_WATER + CTS_BATCH - 1) as usize;
    let mut p = H::new(64);
    let payloads: Vec<Vec<u8>> = (0..posted).map(|i| pattern(i as u64, 24 + i)).collect();
    let rbufs: Vec<RecvBuf> = (0..posted).map(|_| p.recv_buf(64)).collect();
    // Each receive followed by a test, as a polling receiver does (back to back, none would wait).
    let recvs: Vec<RequestId> = rbufs
        .iter()
        .map(|b| {
            let id = irecv(&mut p, &[*b], &[3]);
            assert_eq!(p.test_recv(id), Ok(Completed::Pending));
            id
        })
        .collect();
    p.run_until_idle();
    let sbufs: Vec<SendBuf> = payloads.iter().map(|b| p.send_buf(b)).collect();
    let mut sends = Vec::new();
    for buf in &sbufs[..CTS_LOW_WATER as usize] {
        sends.push(isend(&mut p, *buf, 3));
    }
    p.run_until_idle();
    assert_eq!(
        p.isend(sbufs[CTS_LOW_WATER as usize], 3),
        Ok(None),
        "entries beyond the low-water mark are deferred"
    );
    // The receiver learns of the arrivals; its next call writes the deferred entries.
    assert!(matches!(p.test_recv(recvs[0]), Ok(Completed::Done { .. })));
    assert_eq!(p.test_recv(recvs[posted - 1]), Ok(Completed::Pending));
    for buf in &sbufs[CTS_LOW_WATER as usize..] {
        sends.push(isend(&mut p, *buf, 3));
    }
    for s in sends {
        finish_send(&mut p, s).unwrap();
    }
    for (i, r) in recvs.into_iter().enumerate().skip(1) {
        assert_eq!(
            done_sizes(finish_recv(&mut p, r).unwrap()),
            [payloads[i].len() as u64]
        );
        assert_eq!(p.received(&rbufs[i], payloads[i].len()), payloads[i]);
    }
}

#[doc(hidden)]
pub fn partially_delivered_grouped_cts_is_try_later<H: PairHarness>() {
    // max_inline 0 stages the CTS; the sender sees entry 0 fresh only once the whole write
    // landed, but a torn view (entry 0 fresh, entry 1 stale) must also be "try later".
    let mut p = H::new(0);
    let bufs = [p.recv_buf(8), p.recv_buf(8)];
    let r = irecv(&mut p, &bufs, &[0, 1]);
    p.run_until_idle();
    // Corrupt entry 1's stamp so it looks stale.
    p.write_cts_fifo(32 + 28, &[0, 0, 0, 0]);
    let buf = p.send_buf(&[7; 8]);
    assert_eq!(p.isend(buf, 0), Ok(None));
    p.write_cts_fifo(32 + 28, &1u32.to_le_bytes());
    let s0 = isend(&mut p, buf, 0);
    let s1 = isend(&mut p, buf, 1);
    finish_send(&mut p, s0).unwrap();
    finish_send(&mut p, s1).unwrap();
    assert_eq!(done_sizes(finish_recv(&mut p, r).unwrap()), [8, 8]);
}

#[doc(hidden)]
pub fn pools_exhausted_is_try_later_and_256_sends_stay_outstanding<H: PairHarness>() {
    let mut p = H::new(64);
    let mut bufs = Vec::new();
    let mut recvs = Vec::new();
    for _ in 0..33 {
        let group: Vec<RecvBuf> = (0..8).map(|_| p.recv_buf(64)).collect();
        recvs.push(irecv(&mut p, &group, &[0, 1, 2, 3, 4, 5, 6, 7]));
        bufs.push(group);
    }
    let mut sends = Vec::new();
    for k in 0..256u64 {
        let buf = p.send_buf(&pattern(k, 64));
        sends.push(isend(&mut p, buf, (k % 8) as u32));
    }
    assert_eq!(p.sender().outstanding(), 256);
    p.run_until_idle();
    let extra = p.send_buf(&[0; 8]);
    assert_eq!(p.isend(extra, 0), Ok(None), "pool full");
    for s in sends {
        finish_send(&mut p, s).unwrap();
    }
    for (g, r) in recvs.iter().take(32).enumerate() {
        assert_eq!(done_sizes(finish_recv(&mut p, *r).unwrap()), [64; 8]);
        for (i, b) in bufs[g].iter().enumerate() {
            assert_eq!(p.received(b, 64), pattern((g * 8 + i) as u64, 64));
        }
    }
    // The 33rd receive can now be served.
    let last: Vec<RequestId> = (0..8).map(|t| isend(&mut p, extra, t)).collect();
    for s in last {
        finish_send(&mut p, s).unwrap();
    }
    assert_eq!(done_sizes(finish_recv(&mut p, recvs[32]).unwrap()), [8; 8]);
}

#[doc(hidden)]
pub fn receive_slots_256_then_try_later<H: PairHarness>() {
    let mut p = H::new(256);
    let bufs: Vec<RecvBuf> = (0..257).map(|_| p.recv_buf(16)).collect();
    let recvs: Vec<RequestId> = bufs[..256]
        .iter()
        .map(|b| irecv(&mut p, &[*b], &[0]))
        .collect();
    assert_eq!(p.receiver().outstanding(), 256);
    assert_eq!(p.irecv(&[bufs[256]], &[0]), Ok(None));
    for (i, r) in recvs.into_iter().enumerate() {
        let s = isend_bytes(&mut p, &pattern(i as u64, 16), 0);
        finish_send(&mut p, s).unwrap();
        finish_recv(&mut p, r).unwrap();
        assert_eq!(p.received(&bufs[i], 16), pattern(i as u64, 16));
    }
    let r = irecv(&mut p, &[bufs[256]], &[0]);
    let s = isend_bytes(&mut p, &[9; 16], 0);
    finish_send(&mut p, s).unwrap();
    finish_recv(&mut p, r).unwrap();
}

/// Thousands of messages of mixed group sizes with a window of outstanding receives, wrapping
/// the FIFO and the 16-bit immediate sequence.
fn stream<H: PairHarness>(max_inline: usize, messages: usize, window: usize) {
    let mut p = H::new(max_inline);
    let recv_bufs: Vec<RecvBuf> = (0..SLOTS * MAX_RECVS).map(|_| p.recv_buf(300)).collect();
    let send_pool: Vec<Vec<u8>> = (0..16).map(|i| pattern(i, 300)).collect();
    let send_bufs: Vec<SendBuf> = send_pool.iter().map(|d| p.send_buf(d)).collect();
    let mut posted = std::collections::VecDeque::new();
    let mut seq = 0usize;
    let mut sent = 0usize;
    while sent < messages {
        while posted.len() < window {
            let n = 1 + seq % MAX_RECVS;
            let slot = seq % SLOTS;
            let bufs = &recv_bufs[slot * MAX_RECVS..slot * MAX_RECVS + n];
            let tags: Vec<u32> = (0..n as u32).rev().collect();
            let r = irecv(&mut p, bufs, &tags);
            posted.push_back((r, seq, n));
            seq += 1;
        }
        let (r, rseq, n) = posted.pop_front().unwrap();
        let mut sends = Vec::new();
        for t in 0..n as u32 {
            let which = (rseq + t as usize) % 16;
            let len = (rseq * 7 + t as usize * 13) % 301;
            let buf = SendBuf {
                len: len as u64,
                ..send_bufs[which]
            };
            sends.push((isend(&mut p, buf, t), len, which));
        }
        for (s, len, _) in &sends {
            assert_eq!(done_sizes(finish_send(&mut p, *s).unwrap()), [*len as u64]);
        }
        let sizes = done_sizes(finish_recv(&mut p, r).unwrap());
        let slot = rseq % SLOTS;
        for (t, (_, len, which)) in sends.iter().enumerate() {
            // Tags were reversed: tag t landed in buffer n - 1 - t.
            let i = n - 1 - t;
            assert_eq!(sizes[i], *len as u64);
            let got = p.received(&recv_bufs[slot * MAX_RECVS + i], *len);
            assert_eq!(got, send_pool[*which][..*len], "message {rseq} tag {t}");
        }
        sent += 1;
        assert!(p.sq_occupancy(End::Sender) <= SEND_QUEUE_DEPTH);
    }
    assert!(p.sender().failure().is_none() && p.receiver().failure().is_none());
}

#[doc(hidden)]
pub fn thousands_of_messages_wrap_the_fifo<H: PairHarness>() {
    stream::<H>(64, 3000, 200);
    stream::<H>(0, 1200, 256);
    stream::<H>(256, 1200, 17);
}

#[doc(hidden)]
pub fn sequence_wraps_16_bits<H: PairHarness>() {
    // 70,000 single-buffer messages: the immediate's 16-bit sequence wraps.
    let mut p = H::new(64);
    let rbuf = p.recv_buf(8);
    let sbuf = p.send_buf(&[1, 2, 3, 4, 5, 6, 7, 8]);
    for i in 0..70_000u32 {
        let r = irecv(&mut p, &[rbuf], &[i]);
        let s = isend(&mut p, sbuf, i);
        finish_send(&mut p, s).unwrap();
        assert_eq!(done_sizes(finish_recv(&mut p, r).unwrap()), [8]);
    }
    assert_eq!(p.received(&rbuf, 8), [1, 2, 3, 4, 5, 6, 7, 8]);
}

#[doc(hidden)]
pub fn unsignaled_cts_stream_drains<H: PairHarness>() {
    // The receiver's send queue only ever carries unsignaled CTS writes (and every 64th signaled):
    // over 20,000 receives its occupancy stays bounded and irecv never runs out of credits.
    let mut p = H::new(64);
    let rbuf = p.recv_buf(8);
    let sbuf = p.send_buf(&[0; 8]);
    let mut max_occupancy = 0;
    for i in 0..20_000u32 {
        let r = irecv(&mut p, &[rbuf], &[0]);
        let s = isend(&mut p, sbuf, 0);
        finish_send(&mut p, s).unwrap();
        finish_recv(&mut p, r).unwrap();
        max_occupancy = max_occupancy.max(p.sq_occupancy(End::Receiver));
        if i % 1000 == 0 {
            assert!(p.cq_len(End::Receiver).is_none_or(|len| len < CQ_DEPTH));
        }
    }
    assert!(max_occupancy <= 64, "occupancy {max_occupancy}");
}

#[doc(hidden)]
pub fn unsignaled_data_writes_drain<H: PairHarness>() {
    // Grouped receives: 7 of every 8 sends are unsignaled data writes.
    let mut p = H::new(64);
    let bufs: Vec<RecvBuf> = (0..8).map(|_| p.recv_buf(8)).collect();
    let sbuf = p.send_buf(&[3; 8]);
    let mut max_occupancy = 0;
    for _ in 0..3000 {
        let r = irecv(&mut p, &bufs, &[0; 8]);
        let sends: Vec<RequestId> = (0..8).map(|_| isend(&mut p, sbuf, 0)).collect();
        for s in sends {
            finish_send(&mut p, s).unwrap();
        }
        finish_recv(&mut p, r).unwrap();
        max_occupancy = max_occupancy.max(p.sq_occupancy(End::Sender));
    }
    assert!(max_occupancy <= 9 + 64, "occupancy {max_occupancy}");
}

#[doc(hidden)]
pub fn closing_receiver_drains_granted_receives_first<H: PairHarness>() {
    // closeRecv right after posting 32 receives (no test): the clear-to-send writes are still
    // queued. Draining before the queue pair goes lets every one reach the sender and the
    // sender's data land; only then does the receiver's queue pair disappear, and no send of the
    // sender fails.
    const N: usize = 32;
    const LEN: usize = 16 * 1024;
    let mut p = H::new(64);
    let bufs: Vec<RecvBuf> = (0..N).map(|_| p.recv_buf(LEN)).collect();
    for buf in &bufs {
        irecv(&mut p, &[*buf], &[5]);
    }
    let (recv, nic) = p.recv_side();
    assert_eq!(recv.drain(nic), Ok(N), "granted receives are outstanding");
    let mut sends = Vec::new();
    for i in 0..N {
        sends.push(isend_bytes(&mut p, &pattern(i as u64, LEN), 5));
    }
    let mut rounds = 0;
    loop {
        let (recv, nic) = p.recv_side();
        let left = recv.drain(nic).expect("healthy");
        assert!(left <= N);
        if left == 0 {
            break;
        }
        assert!(p.step(), "the drain waits for work that is not queued");
        rounds += 1;
    }
    assert!(rounds > 0);
    p.vanish(End::Receiver);
    for (i, s) in sends.into_iter().enumerate() {
        let done = finish_send(&mut p, s).expect("a send the receiver granted failed");
        assert_eq!(done_sizes(done), [LEN as u64]);
        assert_eq!(
            p.received(&bufs[i], LEN),
            pattern(i as u64, LEN),
            "message {i}"
        );
    }
}

#[doc(hidden)]
pub fn closing_receiver_never_announces_deferred_receives<H: PairHarness>() {
    // A polled receiver defers clear-to-send entries while the sender holds enough grants; a
    // close must not announce them (the sender would write into a queue pair about to go).
    let mut p = H::new(64);
    let bufs: Vec<RecvBuf> = (0..4).map(|_| p.recv_buf(64)).collect();
    let first = irecv(&mut p, &[bufs[0]], &[0]);
    let second = irecv(&mut p, &[bufs[1]], &[0]);
    assert_eq!(p.test_recv(first), Ok(Completed::Pending));
    irecv(&mut p, &[bufs[2]], &[0]);
    assert_eq!(
        p.receiver().unannounced(),
        1,
        "the third receive is deferred"
    );
    p.run_until_idle();
    let s0 = isend_bytes(&mut p, &[1; 64], 0);
    let s1 = isend_bytes(&mut p, &[2; 64], 0);
    p.run_until_idle();
    let (recv, nic) = p.recv_side();
    assert_eq!(recv.drain(nic), Ok(0), "both granted receives arrived");
    assert_eq!(p.receiver().unannounced(), 1, "the drain announced nothing");
    p.run_until_idle();
    let probe = p.send_buf(&[3; 64]);
    assert_eq!(p.isend(probe, 0), Ok(None), "the sender never learns of it");
    assert_eq!(done_sizes(finish_send(&mut p, s0).unwrap()), [64]);
    assert_eq!(done_sizes(finish_send(&mut p, s1).unwrap()), [64]);
    assert_eq!(done_sizes(finish_recv(&mut p, second).unwrap()), [64]);
}

#[doc(hidden)]
pub fn closing_sender_drains_posted_sends_first<H: PairHarness>() {
    let mut p = H::new(64);
    let bufs: Vec<RecvBuf> = (0..4).map(|_| p.recv_buf(4096)).collect();
    let recvs: Vec<RequestId> = bufs.iter().map(|b| irecv(&mut p, &[*b], &[1])).collect();
    for i in 0..4 {
        isend_bytes(&mut p, &pattern(40 + i, 4096), 1);
    }
    let (send, nic) = p.send_side();
    assert_eq!(send.drain(nic), Ok(4), "sends are on their way");
    loop {
        let (send, nic) = p.send_side();
        if send.drain(nic).expect("healthy") == 0 {
            break;
        }
        assert!(p.step(), "the drain waits for work that is not queued");
    }
    p.vanish(End::Sender);
    for (i, r) in recvs.into_iter().enumerate() {
        assert_eq!(done_sizes(finish_recv(&mut p, r).unwrap()), [4096]);
        assert_eq!(p.received(&bufs[i], 4096), pattern(40 + i as u64, 4096));
    }
}

#[doc(hidden)]
pub fn drain_of_a_failed_connection_is_its_error<H: PairHarness>() {
    let (mut p, _, _) = pair_with_outstanding::<H>(2);
    p.fault_qp_error(End::Receiver);
    let (recv, nic) = p.recv_side();
    assert!(recv.drain(nic).is_err());
}

/// A pair with `k` grouped receives (n = 2) outstanding and one send matched into each.
fn pair_with_outstanding<H: PairHarness>(k: usize) -> (H, Vec<RequestId>, Vec<RequestId>) {
    let mut p = H::new(64);
    let mut recvs = Vec::new();
    let mut sends = Vec::new();
    for i in 0..k {
        let bufs = [p.recv_buf(8), p.recv_buf(8)];
        recvs.push(irecv(&mut p, &bufs, &[0, 1]));
        if i == 0 {
            sends.push(isend_bytes(&mut p, &[1; 8], 0));
        }
    }
    p.run_until_idle();
    (p, sends, recvs)
}

fn assert_completion_error(err: DataError, status: WcStatus) {
    match err {
        DataError::Completion { status: got, .. } => assert_eq!(got, status, "{err}"),
        other => panic!("expected a {status} completion error, got {other}"),
    }
}

#[doc(hidden)]
pub fn qp_error_on_the_receiver_fails_everything_with_the_flush_named<H: PairHarness>() {
    let (mut p, sends, recvs) = pair_with_outstanding::<H>(3);
    p.fault_qp_error(End::Receiver);
    for r in &recvs {
        let err = p.test_recv(*r).unwrap_err();
        assert_completion_error(err, WcStatus::WR_FLUSH_ERR);
        assert!(std::format!("{err}").contains("Work Request Flushed Error"));
        assert!(std::format!("{err}").contains("receive work request"));
    }
    // Sticky: later calls return the same cause.
    let fresh = p.recv_buf(8);
    let again = p.irecv(&[fresh], &[0]).unwrap_err();
    assert_completion_error(again, WcStatus::WR_FLUSH_ERR);
    // The sender learns when it next writes: nobody answers.
    let s = isend_bytes(&mut p, &[2; 8], 1);
    let err = finish_send(&mut p, s).unwrap_err();
    assert_completion_error(err, WcStatus::RETRY_EXC_ERR);
    assert!(std::format!("{err}").contains("NCCL_IB_TIMEOUT"));
    for s in sends {
        assert_completion_error(p.test_send(s).unwrap_err(), WcStatus::RETRY_EXC_ERR);
    }
    assert_eq!(p.sender().outstanding(), 0);
}

#[doc(hidden)]
pub fn qp_error_on_the_sender_flushes_outstanding_sends<H: PairHarness>() {
    let mut p = H::new(64);
    let bufs: Vec<RecvBuf> = (0..4).map(|_| p.recv_buf(8)).collect();
    let _r = irecv(&mut p, &bufs, &[0, 1, 2, 3]);
    let s0 = isend_bytes(&mut p, &[1; 8], 0);
    let s1 = isend_bytes(&mut p, &[1; 8], 1);
    p.fault_qp_error(End::Sender);
    for s in [s0, s1] {
        assert_completion_error(p.test_send(s).unwrap_err(), WcStatus::WR_FLUSH_ERR);
    }
    let buf = p.send_buf(&[1; 8]);
    assert_completion_error(p.isend(buf, 2).unwrap_err(), WcStatus::WR_FLUSH_ERR);
    assert!(p.sender().failure().is_some());
}

#[doc(hidden)]
pub fn remote_access_error_fails_both_sides<H: PairHarness>() {
    let mut p = H::new(64);
    let victim = p.recv_buf(64);
    let other = p.recv_buf(64);
    let r1 = irecv(&mut p, &[victim], &[0]);
    let r2 = irecv(&mut p, &[other], &[0]);
    // The receiver's buffer is deregistered behind the protocol's back.
    p.deregister_receive_buffer(victim.rkey);
    let s = isend_bytes(&mut p, &[5; 64], 0);
    let err = finish_send(&mut p, s).unwrap_err();
    assert_completion_error(err, WcStatus::REM_ACCESS_ERR);
    assert!(std::format!("{err}").contains("remote access error"));
    assert!(std::format!("{err}").contains("RDMA write with immediate"));
    // The responder's queue pair went to error: its receives are flushed.
    for r in [r1, r2] {
        assert_completion_error(p.test_recv(r).unwrap_err(), WcStatus::WR_FLUSH_ERR);
    }
    let buf = p.send_buf(&[5; 8]);
    assert_eq!(p.isend(buf, 0), Err(err));
}

#[doc(hidden)]
pub fn bad_lkey_is_a_local_protection_error<H: PairHarness>() {
    let mut p = H::new(0);
    let rbuf = p.recv_buf(64);
    let r = irecv(&mut p, &[rbuf], &[0]);
    let mut buf = p.send_buf(&[5; 64]);
    buf.lkey ^= 0xffff;
    let s = isend(&mut p, buf, 0);
    let err = finish_send(&mut p, s).unwrap_err();
    assert_completion_error(err, WcStatus::LOC_PROT_ERR);
    assert!(std::format!("{err}").contains("NCCL_NET_GDR_LEVEL"));
    p.receiver_mut().handle_fatal(DataError::PeerLost);
    assert_eq!(p.test_recv(r), Err(DataError::PeerLost));
}

#[doc(hidden)]
pub fn vanished_peer_fails_sends_with_retry_exceeded_and_receives_on_notice<H: PairHarness>() {
    let (mut p, sends, recvs) = pair_with_outstanding::<H>(2);
    p.vanish(End::Receiver);
    let s = isend_bytes(&mut p, &[1; 8], 1);
    let err = finish_send(&mut p, s).unwrap_err();
    assert_completion_error(err, WcStatus::RETRY_EXC_ERR);
    for s in sends {
        assert_eq!(p.test_send(s), Err(err));
    }
    // A receiver whose peer vanished hears nothing from the fabric; the driver tells it.
    let (mut q, _, recvs_q) = pair_with_outstanding::<H>(2);
    q.vanish(End::Sender);
    assert_eq!(q.test_recv(recvs_q[0]), Ok(Completed::Pending));
    q.receiver_mut().handle_fatal(DataError::PeerLost);
    q.receiver_mut()
        .handle_fatal(DataError::Nic(crate::nic::NicError::Fatal {
            event: "later",
        }));
    for r in recvs_q {
        assert_eq!(q.test_recv(r), Err(DataError::PeerLost));
    }
    assert_eq!(q.receiver().failure(), Some(&DataError::PeerLost));
    drop(recvs);
}

#[doc(hidden)]
pub fn async_fatal_event_is_sticky_on_the_sender<H: PairHarness>() {
    let (mut p, sends, _) = pair_with_outstanding::<H>(1);
    let fatal = DataError::Nic(crate::nic::NicError::Fatal { event: "port down" });
    p.sender_mut().handle_fatal(fatal);
    assert_eq!(p.test_send(sends[0]), Err(fatal));
    let buf = p.send_buf(&[0; 8]);
    assert_eq!(p.isend(buf, 1), Err(fatal));
    assert!(std::format!("{fatal}").contains("port down"));
}

#[doc(hidden)]
pub fn stale_and_bogus_request_ids_are_errors<H: PairHarness>() {
    let mut p = H::new(64);
    let rbuf = p.recv_buf(8);
    let r = irecv(&mut p, &[rbuf], &[0]);
    let s = isend_bytes(&mut p, &[1; 8], 0);
    finish_send(&mut p, s).unwrap();
    finish_recv(&mut p, r).unwrap();
    assert_eq!(
        p.test_send(s),
        Err(DataError::InvalidRequest { bits: s.to_bits() })
    );
    assert_eq!(
        p.test_recv(r),
        Err(DataError::InvalidRequest { bits: r.to_bits() })
    );
    // Wrong direction.
    let r2 = irecv(&mut p, &[rbuf], &[0]);
    assert!(matches!(
        p.test_send(r2),
        Err(DataError::InvalidRequest { .. })
    ));
    // Every decodable id that was never handed out.
    for bits in [1u32 | 1 << 9 | 7 << 16, 256 | 2 << 9 | 0xffff << 16] {
        let id = RequestId::from_bits(bits).unwrap();
        assert!(p.test_send(id).is_err());
        assert!(p.test_recv(id).is_err());
    }
    // Errors like these do not fail the connection.
    assert!(p.sender().failure().is_none() && p.receiver().failure().is_none());
}

#[doc(hidden)]
pub fn invalid_arguments_are_refused_without_failing<H: PairHarness>() {
    let mut p = H::new(64);
    assert!(matches!(
        p.irecv(&[], &[]),
        Err(DataError::InvalidArgument(_))
    ));
    let b = p.recv_buf(8);
    assert!(matches!(
        p.irecv(&[b; 9], &[0; 9]),
        Err(DataError::InvalidArgument(_))
    ));
    assert!(matches!(
        p.irecv(&[b; 2], &[0]),
        Err(DataError::InvalidArgument(_))
    ));
    let huge = SendBuf {
        addr: 0,
        len: (1 << 30) + 1,
        lkey: 0,
    };
    assert!(matches!(
        p.isend(huge, 0),
        Err(DataError::InvalidArgument(_))
    ));
    assert!(p.sender().failure().is_none() && p.receiver().failure().is_none());
}

#[doc(hidden)]
pub fn malformed_fresh_cts_is_a_sticky_protocol_error<H: PairHarness>() {
    let mut p = H::new(64);
    let mut entry = [0u8; 32];
    entry[24] = 9; // n = 9
    entry[28..32].copy_from_slice(&1u32.to_le_bytes()); // fresh stamp for seq 0
    let check = codec::entry_check(&entry); // malformed, yet fully landed
    entry[26..28].copy_from_slice(&check.to_le_bytes());
    p.write_cts_fifo(0, &entry);
    let buf = p.send_buf(&[0; 8]);
    let err = p.isend(buf, 0).unwrap_err();
    assert!(
        matches!(err, DataError::Protocol(ProtocolError::CtsEntry { .. })),
        "{err}"
    );
    assert_eq!(p.isend(buf, 0), Err(err));
}

#[doc(hidden)]
pub fn short_peer_region_fails_the_connection<H: PairHarness>() {
    let region = crate::nic::RemoteRegion {
        addr: 0x1000,
        rkey: 1,
        len: 100,
    };
    let mut p = H::new(64);
    p.replace_conns(SendConn::new(region), RecvConn::new(region));
    let buf = p.send_buf(&[0; 8]);
    assert!(matches!(
        p.isend(buf, 0),
        Err(DataError::PeerRegion { len: 100, .. })
    ));
    let b = p.recv_buf(8);
    assert!(matches!(
        p.irecv(&[b], &[0]),
        Err(DataError::PeerRegion { len: 100, .. })
    ));
}

/// A clear-to-send entry whose second half (with the stamp) landed before its first half must
/// read as "not there yet", never as a malformed entry: the sender checks each stamp first and
/// reads the entry's fields only after it. Seen for real on Soft-RoCE before the fix.
#[doc(hidden)]
pub fn torn_clear_to_send_is_try_later_not_an_error<H: PairHarness>() {
    for n in [1usize, 3, 8] {
        let mut p = H::new(256);
        p.set_split_placement(true);
        let bufs: Vec<RecvBuf> = (0..n).map(|_| p.recv_buf(64)).collect();
        let tags: Vec<u32> = (0..n as u32).collect();
        let recv_req = p.irecv(&bufs, &tags).expect("irecv").expect("slot");
        // First step: only the tail of the CTS write (the last entries' stamps) is in place.
        assert!(p.step());
        let data = pattern(7, 40);
        let buf = p.send_buf(&data);
        let early = p.isend(buf, 0);
        assert_eq!(
            early,
            Ok(None),
            "n = {n}: a half-placed CTS must be try-later"
        );
        // Second step: the whole entry is there.
        assert!(p.step());
        let mut reqs = Vec::new();
        for tag in 0..n as u32 {
            let buf = p.send_buf(&data);
            reqs.push(p.isend(buf, tag).expect("isend").expect("matched"));
        }
        for req in reqs {
            assert!(matches!(
                finish_send(&mut p, req),
                Ok(Completed::Done { .. })
            ));
        }
        match finish_recv(&mut p, recv_req).expect("receive completes") {
            Completed::Done { n: got, sizes } => {
                assert_eq!(usize::from(got), n);
                for (i, buf) in bufs.iter().enumerate() {
                    assert_eq!(sizes[i], 40);
                    assert_eq!(p.received(buf, 40), data, "n = {n}, buffer {i}");
                }
            }
            Completed::Pending => unreachable!("finish_recv returns only when done"),
        }
    }
}

/// One `#[test]` per shared pair test, run on the harness `$harness` (a [`PairHarness`]).
#[macro_export]
macro_rules! data_pair_tests {
    ($harness:ty) => {
        #[test]
        fn single_message_every_inline_setting() {
            $crate::sim::suite::single_message_every_inline_setting::<$harness>();
        }
        #[test]
        fn fifo_order_is_kept() {
            $crate::sim::suite::fifo_order_is_kept::<$harness>();
        }
        #[test]
        fn tags_only_choose_within_the_oldest_receive() {
            $crate::sim::suite::tags_only_choose_within_the_oldest_receive::<$harness>();
        }
        #[test]
        fn grouped_receive_with_shuffled_tags() {
            $crate::sim::suite::grouped_receive_with_shuffled_tags::<$harness>();
        }
        #[test]
        fn grouped_receive_with_repeated_tags_matches_in_entry_order() {
            $crate::sim::suite::grouped_receive_with_repeated_tags_matches_in_entry_order::<$harness>();
        }
        #[test]
        fn receive_larger_than_send_reports_send_size() {
            $crate::sim::suite::receive_larger_than_send_reports_send_size::<$harness>();
        }
        #[test]
        fn send_larger_than_receive_fails_both_sides_and_the_connection_goes_on() {
            $crate::sim::suite::send_larger_than_receive_fails_both_sides_and_the_connection_goes_on::<$harness>();
        }
        #[test]
        fn send_larger_than_grouped_receive_buffer_fails_that_send_and_the_receive() {
            $crate::sim::suite::send_larger_than_grouped_receive_buffer_fails_that_send_and_the_receive::<$harness>();
        }
        #[test]
        fn zero_byte_messages_never_touch_the_user_address() {
            $crate::sim::suite::zero_byte_messages_never_touch_the_user_address::<$harness>();
        }
        #[test]
        fn deferred_clear_to_sends_go_when_the_sender_runs_low() {
            $crate::sim::suite::deferred_clear_to_sends_go_when_the_sender_runs_low::<$harness>();
        }
        #[test]
        fn isend_before_any_clear_to_send_is_try_later() {
            $crate::sim::suite::isend_before_any_clear_to_send_is_try_later::<$harness>();
        }
        #[test]
        fn partially_delivered_grouped_cts_is_try_later() {
            $crate::sim::suite::partially_delivered_grouped_cts_is_try_later::<$harness>();
        }
        #[test]
        fn pools_exhausted_is_try_later_and_256_sends_stay_outstanding() {
            $crate::sim::suite::pools_exhausted_is_try_later_and_256_sends_stay_outstanding::<$harness>();
        }
        #[test]
        fn receive_slots_256_then_try_later() {
            $crate::sim::suite::receive_slots_256_then_try_later::<$harness>();
        }
        #[test]
        fn thousands_of_messages_wrap_the_fifo() {
            $crate::sim::suite::thousands_of_messages_wrap_the_fifo::<$harness>();
        }
        #[test]
        fn sequence_wraps_16_bits() {
            $crate::sim::suite::sequence_wraps_16_bits::<$harness>();
        }
        #[test]
        fn unsignaled_cts_stream_drains() {
            $crate::sim::suite::unsignaled_cts_stream_drains::<$harness>();
        }
        #[test]
        fn unsignaled_data_writes_drain() {
            $crate::sim::suite::unsignaled_data_writes_drain::<$harness>();
        }
        #[test]
        fn qp_error_on_the_receiver_fails_everything_with_the_flush_named() {
            $crate::sim::suite::qp_error_on_the_receiver_fails_everything_with_the_flush_named::<$harness>();
        }
        #[test]
        fn qp_error_on_the_sender_flushes_outstanding_sends() {
            $crate::sim::suite::qp_error_on_the_sender_flushes_outstanding_sends::<$harness>();
        }
        #[test]
        fn remote_access_error_fails_both_sides() {
            $crate::sim::suite::remote_access_error_fails_both_sides::<$harness>();
        }
        #[test]
        fn bad_lkey_is_a_local_protection_error() {
            $crate::sim::suite::bad_lkey_is_a_local_protection_error::<$harness>();
        }
        #[test]
        fn vanished_peer_fails_sends_with_retry_exceeded_and_receives_on_notice() {
            $crate::sim::suite::vanished_peer_fails_sends_with_retry_exceeded_and_receives_on_notice::<$harness>();
        }
        #[test]
        fn async_fatal_event_is_sticky_on_the_sender() {
            $crate::sim::suite::async_fatal_event_is_sticky_on_the_sender::<$harness>();
        }
        #[test]
        fn stale_and_bogus_request_ids_are_errors() {
            $crate::sim::suite::stale_and_bogus_request_ids_are_errors::<$harness>();
        }
        #[test]
        fn invalid_arguments_are_refused_without_failing() {
            $crate::sim::suite::invalid_arguments_are_refused_without_failing::<$harness>();
        }
        #[test]
        fn malformed_fresh_cts_is_a_sticky_protocol_error() {
            $crate::sim::suite::malformed_fresh_cts_is_a_sticky_protocol_error::<$harness>();
        }
        #[test]
        fn short_peer_region_fails_the_connection() {
            $crate::sim::suite::short_peer_region_fails_the_connection::<$harness>();
        }
        #[test]
        fn torn_clear_to_send_is_try_later_not_an_error() {
            $crate::sim::suite::torn_clear_to_send_is_try_later_not_an_error::<$harness>();
        }
        #[test]
        fn closing_receiver_drains_granted_receives_first() {
            $crate::sim::suite::closing_receiver_drains_granted_receives_first::<$harness>();
            $crate::sim::suite::closing_receiver_never_announces_deferred_receives::<$harness>();
        }
        #[test]
        fn closing_sender_drains_posted_sends_first() {
            $crate::sim::suite::closing_sender_drains_posted_sends_first::<$harness>();
            $crate::sim::suite::drain_of_a_failed_connection_is_its_error::<$harness>();
        }
    };
}
