//! Multi-QP connections on the simulated fabric: round-robin and split placement, completion only
//! after every part, delivery reordered between queue pairs, refusal, half-posted retries.

use std::vec::Vec;

use super::*;
use crate::sim::MultiPair;

fn policy(qps: i64, split: bool) -> QpPolicy {
    QpPolicy::new(qps, i64::from(split), false, 0).unwrap()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn done_size(c: Completed) -> Option<u64> {
    match c {
        Completed::Done { sizes, .. } => Some(u64::from(sizes[0])),
        Completed::Pending => None,
    }
}

fn irecv(p: &mut MultiPair, bufs: &[RecvBuf], tags: &[u32]) -> RequestId {
    p.recv.irecv(&mut p.recv_nics, bufs, tags).unwrap().unwrap()
}

fn isend(p: &mut MultiPair, buf: SendBuf, tag: u32) -> RequestId {
    p.send.isend(&mut p.send_nics, buf, tag).unwrap().unwrap()
}

/// The size a receive reports, `None` while pending.
fn recv_done(p: &mut MultiPair, id: RequestId) -> Option<u64> {
    done_size(p.recv.test(&mut p.recv_nics, id).unwrap())
}

/// The size a send reports, `None` while pending.
fn send_done(p: &mut MultiPair, id: RequestId) -> Option<u64> {
    done_size(p.send.test(&mut p.send_nics, id).unwrap())
}

#[test]
fn split_parts_are_128_aligned_contiguous_and_cover_the_message() {
    assert_eq!(
        (0..4).map(|i| split_part(1000, 4, i)).collect::<Vec<_>>(),
        [(0, 256), (256, 256), (512, 256), (768, 232)]
    );
    assert_eq!(
        (0..4).map(|i| split_part(100, 4, i)).collect::<Vec<_>>(),
        [(0, 100), (100, 0), (100, 0), (100, 0)]
    );
    for len in [0u64, 1, 127, 128, 129, 4095, 65536, 1 << 30] {
        for parts in [1usize, 2, 3, 4, 7, 128] {
            let mut next = 0;
            for i in 0..parts {
                let (offset, part) = split_part(len, parts, i);
                assert_eq!(offset, next, "len {len} parts {parts} part {i}");
                assert!(offset % SPLIT_ALIGN == 0 || part == 0);
                next = offset + part;
            }
            assert_eq!(next, len);
        }
    }
}

#[test]
fn policy_takes_nccl_bounds() {
    assert_eq!(QpPolicy::new(0, 0, false, 0), Err(PolicyError::Qps(0)));
    assert_eq!(QpPolicy::new(129, 0, false, 0), Err(PolicyError::Qps(129)));
    assert_eq!(QpPolicy::new(4, 2, false, 0), Err(PolicyError::Split(2)));
    assert_eq!(
        QpPolicy::new(4, 0, true, -1),
        Err(PolicyError::ArThreshold(-1))
    );
    let p = QpPolicy::new(128, 1, true, 8192).unwrap();
    assert_eq!(
        (p.qps(), p.split(), p.ar_threshold()),
        (128, true, Some(8192))
    );
    assert_eq!(QpPolicy::new(1, 0, false, 8192).unwrap(), QpPolicy::SINGLE);
}

#[test]
fn round_robin_puts_message_k_on_qp_k_mod_n() {
    let mut p = MultiPair::new(64, policy(4, false));
    let mut recvs = Vec::new();
    for k in 0..8u8 {
        let buf = p.recv_buf(4096);
        let id = irecv(&mut p, &[buf], &[7]);
        recvs.push((buf, id));
        let _ = k;
    }
    p.fabric.run_until_idle();
    let mut sends = Vec::new();
    for k in 0..8u8 {
        let data = pattern(1000 + usize::from(k), k);
        let buf = p.send_buf(&data);
        let before: Vec<usize> = p.send_nics.iter().map(|n| n.sq_occupancy()).collect();
        let id = isend(&mut p, buf, 7);
        let grew: Vec<usize> = p
            .send_nics
            .iter()
            .zip(&before)
            .filter(|(n, b)| n.sq_occupancy() > **b)
            .map(|_| 0)
            .collect();
        assert_eq!(grew.len(), 1, "message {k} went on exactly one queue pair");
        assert!(
            p.send_nics[usize::from(k) % 4].sq_occupancy() > before[usize::from(k) % 4],
            "message {k} on queue pair {}",
            k % 4
        );
        sends.push((data, id));
    }
    p.fabric.run_until_idle();
    for ((data, sid), (rbuf, rid)) in sends.into_iter().zip(recvs) {
        let size = recv_done(&mut p, rid).unwrap();
        assert_eq!(size, data.len() as u64);
        assert_eq!(p.received(&rbuf, data.len()), data);
        assert_eq!(send_done(&mut p, sid), Some(data.len() as u64));
    }
    assert_eq!((p.send.outstanding(), p.recv.outstanding()), (0, 0));
}

#[test]
fn round_robin_keeps_a_grouped_receive_on_one_qp() {
    let mut p = MultiPair::new(64, policy(2, false));
    let (a, b, c) = (p.recv_buf(512), p.recv_buf(512), p.recv_buf(512));
    let group = irecv(&mut p, &[a, b], &[1, 2]);
    let single = irecv(&mut p, &[c], &[9]);
    p.fabric.run_until_idle();
    let (da, db, dc) = (pattern(300, 1), pattern(200, 2), pattern(100, 3));
    let mut sends = Vec::new();
    for (data, tag) in [(&da, 1), (&db, 2), (&dc, 9)] {
        let buf = p.send_buf(data);
        sends.push(isend(&mut p, buf, tag));
    }
    // Both sends of the group went on queue pair 0 (data write + slot end), the single on 1.
    assert_eq!(p.send_nics[0].sq_occupancy(), 3);
    assert_eq!(p.send_nics[1].sq_occupancy(), 1);
    p.fabric.run_until_idle();
    match p.recv.test(&mut p.recv_nics, group).unwrap() {
        Completed::Done { n, sizes } => assert_eq!((n, sizes[0], sizes[1]), (2, 300, 200)),
        Completed::Pending => panic!("group not done"),
    }
    assert_eq!(recv_done(&mut p, single), Some(100));
    assert_eq!(p.received(&a, 300), da);
    assert_eq!(p.received(&b, 200), db);
    assert_eq!(p.received(&c, 100), dc);
    for id in sends {
        assert!(send_done(&mut p, id).is_some());
    }
}

#[test]
fn split_writes_every_part_at_its_offset() {
    for (qps, len) in [(4, 1000usize), (4, 100), (3, 65536 + 17), (2, 0), (8, 4096)] {
        let mut p = MultiPair::new(64, policy(qps, true));
        let rbuf = p.recv_buf(70000);
        let rid = irecv(&mut p, &[rbuf], &[5]);
        p.fabric.run_until_idle();
        let data = pattern(len, qps as u8);
        let sbuf = p.send_buf(&data);
        let sid = isend(&mut p, sbuf, 5);
        // One write with immediate per queue pair, empty parts included.
        for nic in &p.send_nics {
            assert_eq!(nic.sq_occupancy(), 1);
        }
        p.fabric.run_until_idle();
        assert_eq!(
            recv_done(&mut p, rid),
            Some(len as u64),
            "qps {qps} len {len}"
        );
        assert_eq!(p.received(&rbuf, len), data);
        assert_eq!(send_done(&mut p, sid), Some(len as u64));
    }
}

#[test]
fn split_completes_only_after_every_part_whatever_the_qp_order() {
    let mut p = MultiPair::new(64, policy(4, true));
    let rbuf = p.recv_buf(8192);
    let rid = irecv(&mut p, &[rbuf], &[1]);
    p.fabric.run_until_idle();
    let data = pattern(8000, 9);
    let sbuf = p.send_buf(&data);
    let sid = isend(&mut p, sbuf, 1);
    // Deliver queue pairs 3, 2, 1 (later parts first); part 0 is still on its way.
    for qp in [3, 2, 1] {
        assert!(p.fabric.step_qp(&p.send_nics[qp]));
        assert_eq!(
            p.recv.test(&mut p.recv_nics, rid).unwrap(),
            Completed::Pending
        );
        assert_eq!(
            p.send.test(&mut p.send_nics, sid).unwrap(),
            Completed::Pending
        );
    }
    assert!(p.fabric.step_qp(&p.send_nics[0]));
    assert_eq!(recv_done(&mut p, rid), Some(8000));
    assert_eq!(p.received(&rbuf, 8000), data);
    assert_eq!(send_done(&mut p, sid), Some(8000));
}

#[test]
fn round_robin_survives_later_qps_delivering_first() {
    let mut p = MultiPair::new(64, policy(4, false));
    let bufs: Vec<RecvBuf> = (0..8).map(|_| p.recv_buf(2048)).collect();
    let rids: Vec<RequestId> = bufs.iter().map(|b| irecv(&mut p, &[*b], &[3])).collect();
    p.fabric.run_until_idle();
    let datas: Vec<Vec<u8>> = (0..8).map(|k| pattern(1500 + k, k as u8)).collect();
    let sids: Vec<RequestId> = datas
        .iter()
        .map(|d| {
            let buf = p.send_buf(d);
            isend(&mut p, buf, 3)
        })
        .collect();
    // Only queue pairs 3 and 2 deliver: messages 3, 7, 2, 6 complete while 0, 1, 4, 5 wait.
    while p.fabric.step_qp(&p.send_nics[3]) || p.fabric.step_qp(&p.send_nics[2]) {}
    for k in 0..8 {
        let got = p.recv.test(&mut p.recv_nics, rids[k]).unwrap();
        if k % 4 >= 2 {
            assert_eq!(done_size(got), Some(datas[k].len() as u64), "message {k}");
            assert_eq!(p.received(&bufs[k], datas[k].len()), datas[k]);
        } else {
            assert_eq!(got, Completed::Pending, "message {k}");
        }
    }
    p.fabric.run_until_idle();
    for k in [0, 1, 4, 5] {
        assert_eq!(recv_done(&mut p, rids[k]), Some(datas[k].len() as u64));
        assert_eq!(p.received(&bufs[k], datas[k].len()), datas[k]);
    }
    for id in sids {
        assert!(send_done(&mut p, id).is_some());
    }
}

#[test]
fn split_send_too_large_fails_both_requests_and_the_connection_goes_on() {
    let mut p = MultiPair::new(64, policy(4, true));
    let small = p.recv_buf(1000);
    let rid = irecv(&mut p, &[small], &[1]);
    p.fabric.run_until_idle();
    let sbuf = p.send_buf(&pattern(2000, 1));
    let sid = isend(&mut p, sbuf, 1);
    p.fabric.run_until_idle();
    // Both sides name the whole message and the whole buffer, not one queue pair's part.
    let refused = DataError::SizeMismatch {
        index: 0,
        sent: 2000,
        capacity: 1000,
    };
    assert_eq!(p.send.test(&mut p.send_nics, sid), Err(refused));
    assert_eq!(p.recv.test(&mut p.recv_nics, rid), Err(refused));
    // The next message goes through.
    let rbuf = p.recv_buf(4096);
    let rid = irecv(&mut p, &[rbuf], &[2]);
    p.fabric.run_until_idle();
    let data = pattern(3000, 2);
    let sbuf = p.send_buf(&data);
    let sid = isend(&mut p, sbuf, 2);
    p.fabric.run_until_idle();
    assert_eq!(recv_done(&mut p, rid), Some(3000));
    assert_eq!(p.received(&rbuf, 3000), data);
    assert!(send_done(&mut p, sid).is_some());
}

#[test]
fn split_send_half_posted_resumes_on_the_same_retry_only() {
    let mut p = MultiPair::new(64, policy(2, true));
    let rbuf = p.recv_buf(4096);
    let rid = irecv(&mut p, &[rbuf], &[1]);
    // Only queue pair 0's clear-to-send lands.
    while p.fabric.step_qp(&p.recv_nics[0]) {}
    let data = pattern(4000, 4);
    let sbuf = p.send_buf(&data);
    assert_eq!(p.send.isend(&mut p.send_nics, sbuf, 1), Ok(None));
    assert_eq!(p.send_nics[0].sq_occupancy(), 1, "part 0 is posted");
    let other = p.send_buf(&pattern(10, 0));
    assert!(matches!(
        p.send.isend(&mut p.send_nics, other, 1),
        Err(DataError::InvalidArgument(_))
    ));
    p.fabric.run_until_idle();
    let sid = isend(&mut p, sbuf, 1);
    p.fabric.run_until_idle();
    assert_eq!(recv_done(&mut p, rid), Some(4000));
    assert_eq!(p.received(&rbuf, 4000), data);
    assert_eq!(send_done(&mut p, sid), Some(4000));
}

#[test]
fn a_failed_qp_fails_every_part_of_the_connection() {
    let mut p = MultiPair::new(64, policy(2, true));
    let rbuf = p.recv_buf(4096);
    let rid = irecv(&mut p, &[rbuf], &[1]);
    p.fabric.run_until_idle();
    // The receiver's queue pair 1 fails: its part is flushed, and the part still expected on
    // the healthy queue pair 0 must not keep the request pending for ever.
    p.fabric.fault_qp_error(&p.recv_nics[1]);
    p.fabric.run_until_idle();
    assert!(p.recv.test(&mut p.recv_nics, rid).is_err());
    assert!(p.recv.drain(&mut p.recv_nics).is_err());
    let sbuf = p.send_buf(&pattern(4000, 4));
    let sid = isend(&mut p, sbuf, 1);
    p.fabric.run_until_idle();
    assert!(p.send.test(&mut p.send_nics, sid).is_err());
}

#[test]
fn adaptive_routing_splits_data_and_immediate_above_the_threshold() {
    let mut p = crate::sim::DataPair::new(64);
    p.send.set_adaptive_routing(Some(8192));
    for (len, wrs) in [(8192usize, 1), (8193, 2), (100_000, 2), (0, 1)] {
        let rbuf = p.recv_buf(100_000);
        let rid = p
            .recv
            .irecv(&mut p.recv_nic, &[rbuf], &[1])
            .unwrap()
            .unwrap();
        p.fabric.run_until_idle();
        let data = pattern(len, 7);
        let sbuf = p.send_buf(&data);
        let sid = p.send.isend(&mut p.send_nic, sbuf, 1).unwrap().unwrap();
        assert_eq!(p.send_nic.sq_occupancy(), wrs, "len {len}");
        p.fabric.run_until_idle();
        assert_eq!(
            done_size(p.recv.test(&mut p.recv_nic, rid).unwrap()),
            Some(len as u64)
        );
        assert_eq!(p.received(&rbuf, len), data);
        assert_eq!(
            done_size(p.send.test(&mut p.send_nic, sid).unwrap()),
            Some(len as u64)
        );
    }
}

#[test]
fn split_receive_refuses_parts_that_sum_past_the_buffer() {
    // A hostile (or broken) peer writes 3000 bytes at offset 0 on both queue pairs: each part
    // fits the 4096-byte buffer, their sum does not.
    let mut p = MultiPair::new(64, policy(2, true));
    let rbuf = p.recv_buf(4096);
    let rid = irecv(&mut p, &[rbuf], &[1]);
    p.fabric.run_until_idle();
    let sbuf = p.send_buf(&pattern(3000, 1));
    for (conn, nic) in p.send.conns.iter_mut().zip(&mut p.send_nics) {
        conn.isend(nic, sbuf, 1).unwrap().unwrap();
    }
    p.fabric.run_until_idle();
    assert!(matches!(
        p.recv.test(&mut p.recv_nics, rid),
        Err(DataError::Protocol(ProtocolError::Overflow {
            size: 6000,
            capacity: 4096,
            ..
        }))
    ));
}

#[test]
fn each_queue_pair_gets_its_own_20_bit_flow_label() {
    // Queue pairs of one connection, as a device numbers them: consecutive QP numbers.
    for base in [17u32, 0x1234, 0xff_fff0] {
        let labels: Vec<u32> = (0..4)
            .map(|i| flow_label(base + i, base + 100 + i))
            .collect();
        for (i, a) in labels.iter().enumerate() {
            assert!((1..1 << 20).contains(a), "label {a:#x}");
            assert!(!labels[i + 1..].contains(a), "labels {labels:x?} repeat");
        }
    }
    assert_eq!(flow_label(0, 5), 1);
}

#[test]
fn width_stripes_each_receive_over_rotating_queue_pairs() {
    // Five queue pairs, each message over two (a fused device of two ports without split):
    // receive k uses queue pairs 2k and 2k + 1 (mod 5), grouped receives included.
    let (qps, width) = (5usize, 2usize);
    let mut p = MultiPair::with_width(64, qps, width, None);
    let mut recvs = Vec::new();
    for k in 0..7usize {
        let bufs = [p.recv_buf(4096), p.recv_buf(4096)];
        let n = if k % 3 == 1 { 2 } else { 1 };
        let tags = [k as u32, 100 + k as u32];
        let id = irecv(&mut p, &bufs[..n], &tags[..n]);
        recvs.push((bufs, n, id));
    }
    p.fabric.run_until_idle();
    let mut sends = Vec::new();
    for (k, (_, n, _)) in recvs.iter().enumerate() {
        let lanes = [(2 * k) % qps, (2 * k + 1) % qps];
        for b in 0..*n {
            let data = pattern(700 + 300 * b + k, k as u8);
            let buf = p.send_buf(&data);
            let before: Vec<usize> = p.send_nics.iter().map(|n| n.sq_occupancy()).collect();
            let tag = if b == 0 { k as u32 } else { 100 + k as u32 };
            let id = isend(&mut p, buf, tag);
            for (qp, nic) in p.send_nics.iter().enumerate() {
                assert_eq!(
                    nic.sq_occupancy() > before[qp],
                    lanes.contains(&qp),
                    "receive {k} buffer {b}: queue pair {qp}"
                );
            }
            sends.push((k, b, data, id));
        }
    }
    // Later queue pairs deliver first.
    for qp in (0..qps).rev() {
        while p.fabric.step_qp(&p.send_nics[qp]) {}
    }
    p.fabric.run_until_idle();
    for (k, (bufs, n, rid)) in recvs.iter().enumerate() {
        match p.recv.test(&mut p.recv_nics, *rid).unwrap() {
            Completed::Done { n: got, sizes } => {
                assert_eq!(usize::from(got), *n);
                for (b, size) in sizes.iter().enumerate().take(*n) {
                    assert_eq!(*size, (700 + 300 * b + k) as u32);
                }
            }
            Completed::Pending => panic!("receive {k} not done"),
        }
        for (sk, b, data, _) in &sends {
            if *sk == k {
                assert_eq!(p.received(&bufs[*b], data.len()), *data);
            }
        }
    }
    for (_, _, data, id) in sends {
        assert_eq!(send_done(&mut p, id), Some(data.len() as u64));
    }
    assert_eq!((p.send.outstanding(), p.recv.outstanding()), (0, 0));
}

/// A receive of `len` bytes, tag `tag`, posted with the buffer's key on both devices.
fn keyed_irecv(p: &mut MultiPair, len: usize, tag: u32) -> (RecvBuf, RequestId) {
    let rbuf = p.recv_buf(len);
    let rid = p
        .recv
        .irecv_keyed(
            &mut p.recv_nics,
            &[rbuf],
            &[[rbuf.rkey; MAX_RECVS]; 2],
            &[tag],
        )
        .unwrap()
        .unwrap();
    p.fabric.run_until_idle();
    (rbuf, rid)
}

#[test]
fn keyed_calls_use_each_devices_key_on_its_queue_pairs() {
    // Four queue pairs of two devices (queue pair i on device i % 2), every message split: the
    // right key per device moves the bytes, a wrong key for device 1 fails its queue pairs only.
    let mut p = MultiPair::with_width(64, 4, 4, None);
    let (rbuf, rid) = keyed_irecv(&mut p, 8192, 3);
    let data = pattern(6000, 4);
    let sbuf = p.send_buf(&data);
    let sid = p
        .send
        .isend_keyed(&mut p.send_nics, sbuf, &[sbuf.lkey, sbuf.lkey], 3)
        .unwrap()
        .unwrap();
    p.fabric.run_until_idle();
    assert_eq!(recv_done(&mut p, rid), Some(6000));
    assert_eq!(p.received(&rbuf, 6000), data);
    assert_eq!(send_done(&mut p, sid), Some(6000));

    let (_, _rid) = keyed_irecv(&mut p, 8192, 3);
    let sbuf = p.send_buf(&data);
    let bad = sbuf.lkey ^ 0x5a5a;
    let sid = p
        .send
        .isend_keyed(&mut p.send_nics, sbuf, &[sbuf.lkey, bad], 3)
        .unwrap()
        .unwrap();
    p.fabric.run_until_idle();
    assert!(
        p.send.test(&mut p.send_nics, sid).is_err(),
        "device 1's wrong key must fail the send"
    );
}

/// A blocked lane posts nothing: a message needing it is refused as not ready before any of
/// its parts is posted (a split one included, whose other parts' lanes are free), and goes
/// through once the lane is resumed.
#[test]
fn a_blocked_lane_posts_nothing_and_a_message_needing_it_is_not_ready() {
    for split in [false, true] {
        let mut p = MultiPair::new(64, policy(2, split));
        let rbuf = p.recv_buf(1000);
        let sbuf = p.send_buf(&pattern(1000, 3));
        // Receive 0 uses lane 0 (and lane 1 when split).
        p.recv.block_lane(0);
        assert!(p.recv.lane_blocked(0) && !p.recv.lane_blocked(1));
        assert_eq!(p.recv.irecv(&mut p.recv_nics, &[rbuf], &[1]), Ok(None));
        assert_eq!(p.recv.outstanding(), 0);
        for nic in &p.recv_nics {
            assert_eq!(
                nic.sq_occupancy(),
                0,
                "split {split}: no clear-to-send posted"
            );
        }
        p.recv.resume_lane(0);
        assert!(!p.recv.lane_blocked(0));
        let r = irecv(&mut p, &[rbuf], &[1]);
        p.fabric.run_until_idle();
        // The last lane blocks the message when split; lane 0 does when not.
        let lane = if split { 1 } else { 0 };
        p.send.block_lane(lane);
        assert_eq!(p.send.isend(&mut p.send_nics, sbuf, 1), Ok(None));
        assert_eq!(p.send.outstanding(), 0);
        for nic in &p.send_nics {
            assert_eq!(nic.sq_occupancy(), 0, "split {split}: no part posted");
        }
        p.send.resume_lane(lane);
        let s = isend(&mut p, sbuf, 1);
        p.fabric.run_until_idle();
        assert_eq!(recv_done(&mut p, r), Some(1000));
        assert_eq!(send_done(&mut p, s), Some(1000));
        assert_eq!(p.received(&rbuf, 1000), pattern(1000, 3));
    }
}

/// A blocked lane's NIC is not polled: a request with a part on it stays pending with its
/// completion left in the queue, and completes once the lane is resumed. A lane outside the
/// connection is never blocked.
#[test]
fn a_blocked_lane_is_not_polled_and_its_requests_wait() {
    let mut p = MultiPair::new(64, policy(2, false));
    let rbuf = p.recv_buf(64);
    let r = irecv(&mut p, &[rbuf], &[1]);
    p.fabric.run_until_idle();
    let sbuf = p.send_buf(&pattern(64, 5));
    let s = isend(&mut p, sbuf, 1);
    p.fabric.run_until_idle();
    p.recv.block_lane(0);
    p.recv.block_lane(7);
    assert!(!p.recv.lane_blocked(7));
    let queued = p.recv_nics[0].cq_len();
    assert!(queued > 0);
    assert_eq!(recv_done(&mut p, r), None);
    assert_eq!(p.recv.drain(&mut p.recv_nics), Ok(1));
    assert_eq!(p.recv_nics[0].cq_len(), queued, "nothing polled");
    p.recv.resume_lane(0);
    assert_eq!(recv_done(&mut p, r), Some(64));
    assert_eq!(send_done(&mut p, s), Some(64));
}

/// The failover hooks check their lane and their plan's role.
#[test]
fn the_failover_hooks_refuse_a_foreign_lane_or_plan() {
    use crate::data::failover::{
        FailoverError, Guarded, Plan, ReceiverPlan, Rekey, ReportBody, SenderPlan, SeqRange,
    };
    let mut p = MultiPair::new(64, policy(2, false));
    let range = SeqRange { start: 0, end: 0 };
    let receiver_plan = Plan::Receiver(ReceiverPlan { rewrite: range });
    let sender_plan = Plan::Sender(SenderPlan {
        complete: range,
        replay: range,
        peer_keys: None,
    });
    let to_recv = Rekey::same(p.recv_nics[0].inbound_region());
    let to_send = Rekey::same(p.send_nics[0].inbound_region());
    let nic = &mut p.send_nics[0];
    assert_eq!(
        p.send.failover_replay(0, nic, &sender_plan, &to_recv, 0),
        Err(FailoverError::Disabled),
        "no journal without enable_failover"
    );
    p.send.enable_failover();
    p.recv.enable_failover();
    assert!(p.send.failover_enabled() && p.recv.failover_enabled());
    assert!(matches!(
        p.send
            .failover_replay(0, &mut p.send_nics[0], &receiver_plan, &to_recv, 0),
        Err(FailoverError::Local(DataError::InvalidArgument(_)))
    ));
    assert!(matches!(
        p.recv
            .failover_replay(0, &mut p.recv_nics[0], &sender_plan, &to_send, 0),
        Err(FailoverError::Local(DataError::InvalidArgument(_)))
    ));
    assert_eq!(
        p.send.failover_snapshot(2),
        Err(FailoverError::Lane(2)),
        "two lanes"
    );
    assert!(matches!(
        p.recv.failover_snapshot(1),
        Ok(ReportBody::Receiver(_))
    ));
    let mut unarmed = Guarded::new(&mut p.send_nics[1], false);
    assert_eq!(
        p.send.failover_quiesce(1, &mut unarmed),
        Err(FailoverError::Disabled),
        "an unarmed lane cannot be quiesced"
    );
    assert_eq!(p.send.lanes(), 2);
}

/// A lane blocked while a split send is half posted: the retry posts nothing while the lane of
/// a part left is blocked, a block of the lane of a part already posted does not hold the rest
/// back, and once resumed the retry posts only the remaining part.
#[test]
fn a_block_in_the_middle_of_a_half_posted_send_holds_only_the_parts_left() {
    let mut p = MultiPair::new(64, policy(2, true));
    let rbuf = p.recv_buf(4096);
    let rid = irecv(&mut p, &[rbuf], &[1]);
    while p.fabric.step_qp(&p.recv_nics[0]) {}
    let data = pattern(4000, 9);
    let sbuf = p.send_buf(&data);
    assert_eq!(p.send.isend(&mut p.send_nics, sbuf, 1), Ok(None));
    assert_eq!(p.send_nics[0].sq_occupancy(), 1, "part 0 is posted");
    p.fabric.run_until_idle();
    p.send.block_lane(1);
    assert_eq!(p.send.isend(&mut p.send_nics, sbuf, 1), Ok(None));
    assert_eq!(
        p.send_nics[1].sq_occupancy(),
        0,
        "part 1 waits for its lane"
    );
    // Another call is still refused as not the retry, blocked or not.
    let other = p.send_buf(&pattern(10, 0));
    assert!(matches!(
        p.send.isend(&mut p.send_nics, other, 1),
        Err(DataError::InvalidArgument(_))
    ));
    p.send.resume_lane(1);
    p.send.block_lane(0);
    let lane0 = p.send_nics[0].sq_occupancy();
    let sid = isend(&mut p, sbuf, 1);
    assert_eq!(
        p.send_nics[0].sq_occupancy(),
        lane0,
        "part 0 is not posted again"
    );
    assert!(p.send_nics[1].sq_occupancy() > 0, "part 1 is posted");
    p.send.resume_lane(0);
    p.fabric.run_until_idle();
    assert_eq!(recv_done(&mut p, rid), Some(4000));
    assert_eq!(p.received(&rbuf, 4000), data);
    assert_eq!(send_done(&mut p, sid), Some(4000));
}
