//! Port failover on the simulated fabric ([`crate::data::failover`]): a verified message stream
//! with a port failure injected at every step, on either end, of one lane of several; and the
//! cases that must give up.

use std::vec;
use std::vec::Vec;

use super::{FailoverPair, Outcome, Stream};
use crate::data::failover::{FailoverConfig, FailoverError, Rekey, SenderPlan, SeqRange};
use crate::data::{DataError, ProtocolError};
use crate::nic::WcStatus;
use crate::time::Duration;

/// Failover on, `lanes` lanes spread over two ports of one device, `attempts` attempts.
fn config(lanes: usize, attempts: u32) -> FailoverConfig {
    FailoverConfig {
        enabled: true,
        max_attempts: attempts,
        timeout: Duration::from_secs(10),
        port_devices: vec![0, 0],
        lane_ports: (0..lanes).map(|l| (l % 2) as u8).collect(),
    }
}

/// Sizes from 0 and 8 bytes to 1 MiB; every fourth receive a group of up to 8.
fn stream(receives: usize, salt: usize) -> Stream {
    const SIZES: [usize; 9] = [8, 0, 100, 4096, 65_536, 1, 300, 1 << 20, 17];
    let sizes = (0..receives)
        .map(|j| {
            let n = if j % 4 == 3 { 1 + (j + salt) % 8 } else { 1 };
            (0..n)
                .map(|k| SIZES[(j * 3 + k + salt) % SIZES.len()])
                .collect()
        })
        .collect();
    Stream { sizes }
}

/// [`stream`] with messages of at most 64 KiB (the simulator copies every byte; quicker).
fn small_stream(receives: usize, salt: usize) -> Stream {
    let mut s = stream(receives, salt);
    for sizes in &mut s.sizes {
        for size in sizes {
            *size = (*size).min(20_000);
        }
    }
    s
}

/// Which queue pair a failure hits.
#[derive(Clone, Copy, Debug)]
enum Cut {
    /// The sending end's port of the lane.
    Sender,
    /// The receiving end's port of the lane.
    Receiver,
    /// The sending end's port, its unpolled acknowledgements lost.
    SenderAcksLost,
}

fn cut(p: &mut FailoverPair, lane: usize, how: Cut) {
    let fabric = p.fabric.clone();
    match how {
        Cut::Sender => fabric.cut_port(p.send_nic(lane)),
        Cut::Receiver => fabric.cut_port(p.recv_nic(lane)),
        Cut::SenderAcksLost => fabric.cut_port_acks_lost(p.send_nic(lane)),
    }
}

/// Run `streams` on `lanes` lanes, cutting `lane` (`how`) before fabric step `at`.
fn run_cut(lanes: usize, streams: &[Stream], lane: usize, how: Cut, at: usize) -> FailoverPair {
    let mut p = FailoverPair::new(lanes, 64, config(lanes, 1), config(lanes, 1));
    let outcome = p.run(streams, |p, step| {
        if step == at {
            cut(p, lane, how);
        }
    });
    assert_eq!(
        outcome,
        Outcome::Done,
        "cut {how:?} lane {lane} at step {at}: sender gave up {:?}, receiver {:?}",
        p.send_gave_up,
        p.recv_gave_up
    );
    p
}

/// How many fabric steps the stream takes without a failure.
fn steps(lanes: usize, streams: &[Stream]) -> usize {
    let mut p = FailoverPair::new(lanes, 64, config(lanes, 1), config(lanes, 1));
    let mut last = 0;
    assert_eq!(p.run(streams, |_, step| last = step), Outcome::Done);
    last
}

#[test]
fn one_lane_survives_a_cut_at_every_step_on_either_end() {
    let streams = [stream(24, 0)];
    let total = steps(1, &streams);
    assert!(total > 40, "the stream takes {total} steps");
    let mut failovers = 0;
    for at in 0..=total {
        for how in [Cut::Sender, Cut::Receiver, Cut::SenderAcksLost] {
            let p = run_cut(1, &streams, 0, how, at);
            let (s, r) = (p.send_fo.stats(), p.recv_fo.stats());
            assert_eq!(s.failovers, r.failovers, "both ends fail over together");
            failovers += s.failovers;
        }
    }
    // A cut after the last work request ran fails nothing: most cuts must have failed over.
    assert!(
        failovers as usize > 2 * total,
        "{failovers} failovers in {total} steps"
    );
}

#[test]
fn several_lanes_survive_a_cut_of_any_one_at_every_step() {
    let streams = [small_stream(12, 1), stream(12, 2), small_stream(12, 3)];
    let total = steps(3, &streams);
    for at in (0..=total).step_by(3) {
        for lane in 0..3 {
            for how in [Cut::Sender, Cut::Receiver] {
                let p = run_cut(3, &streams, lane, how, at);
                assert!(p.send_fo.stats().failovers <= 1);
            }
        }
    }
}

#[test]
fn a_lane_moves_to_the_surviving_port_and_stats_count_the_replay() {
    let streams = [stream(40, 5), stream(40, 6)];
    let mut p = FailoverPair::new(2, 64, config(2, 1), config(2, 1));
    // Lane 0 is on port 0, lane 1 on port 1.
    assert_eq!(p.send_fo.lane_port(0), Some(0));
    let outcome = p.run(&streams, |p, step| {
        if step == 30 {
            let fabric = p.fabric.clone();
            fabric.cut_port(p.send_nic(0));
        }
    });
    assert_eq!(outcome, Outcome::Done);
    assert_eq!(p.send_fo.lane_port(0), Some(1), "the sender's lane moved");
    assert_eq!(
        p.recv_fo.lane_port(0),
        Some(1),
        "the receiver's port still works, and it follows the sender to its port (one rail)"
    );
    let s = p.send_fo.stats();
    assert_eq!(s.failovers, 1);
    assert!(
        s.receives_replayed > 0 && s.work_requests_replayed > 0,
        "{s:?}"
    );
}

#[test]
fn failover_off_fails_the_connection_with_the_completion_error() {
    let streams = [stream(30, 0)];
    for (send_on, recv_on) in [(false, false), (false, true), (true, false)] {
        let mut sc = config(1, 1);
        sc.enabled = send_on;
        let mut rc = config(1, 1);
        rc.enabled = recv_on;
        let mut p = FailoverPair::new(1, 64, sc, rc);
        let outcome = p.run(&streams, |p, step| {
            if step == 20 {
                let fabric = p.fabric.clone();
                fabric.cut_port(p.send_nic(0));
            }
        });
        let Outcome::Failed(err) = outcome else {
            panic!("failover off ({send_on}, {recv_on}) must fail the connection")
        };
        assert!(err.is_fatal(), "{err}");
        let reasons = [p.send_gave_up, p.recv_gave_up];
        assert!(
            reasons.contains(&Some(FailoverError::Disabled))
                || reasons
                    .iter()
                    .flatten()
                    .any(|r| matches!(r, FailoverError::PeerRefused(_))),
            "{reasons:?}"
        );
        if !send_on {
            // The sender's own retry exhaustion, exactly as without failover.
            assert!(
                matches!(
                    err,
                    DataError::Completion {
                        status: WcStatus::RETRY_EXC_ERR,
                        ..
                    }
                ),
                "{err}"
            );
        }
    }
}

/// Cut lane 0's sender port at `first`, then whatever lane 0 and lane 1 use at `second`.
fn two_cuts(config_for: impl Fn() -> FailoverConfig) -> (Outcome, FailoverPair) {
    let streams = [stream(60, 0), stream(60, 1)];
    let mut p = FailoverPair::new(2, 64, config_for(), config_for());
    let outcome = p.run(&streams, |p, step| {
        let fabric = p.fabric.clone();
        if step == 20 {
            fabric.cut_port(p.send_nic(0));
        }
        if step == 200 {
            fabric.cut_port(p.send_nic(0));
            fabric.cut_port(p.send_nic(1));
        }
    });
    (outcome, p)
}

#[test]
fn a_second_port_failure_exhausts_one_attempt() {
    let (outcome, p) = two_cuts(|| config(2, 1));
    assert!(matches!(outcome, Outcome::Failed(_)), "{outcome:?}");
    assert_eq!(
        p.send_gave_up,
        Some(FailoverError::AttemptsExhausted { max: 1 })
    );
    assert_eq!(p.send_fo.stats().failovers, 1, "the first one succeeded");
}

#[test]
fn both_ports_failed_leaves_no_surviving_port() {
    let (outcome, p) = two_cuts(|| config(2, 2));
    assert!(matches!(outcome, Outcome::Failed(_)), "{outcome:?}");
    assert_eq!(p.send_gave_up, Some(FailoverError::NoSurvivingPort));
}

#[test]
fn two_failed_devices_give_up() {
    let (outcome, p) = two_cuts(|| FailoverConfig {
        port_devices: vec![0, 1, 2],
        ..config(2, 3)
    });
    assert!(matches!(outcome, Outcome::Failed(_)), "{outcome:?}");
    assert_eq!(
        p.send_gave_up,
        Some(FailoverError::DevicesFailed { failed: 2 })
    );
}

/// The immediates' sequence numbers are what keeps a receive from completing twice: a replay
/// that wrongly re-posted a slot end whose receive already completed (ignoring the receiver's
/// `oldest`) is refused by the receiver as a protocol error, never a second completion.
#[test]
fn a_replayed_slot_end_of_a_completed_receive_is_refused() {
    use crate::data::Connection;
    use crate::data::failover::{Guarded, SendJournal};
    use crate::data::{Completed, RecvBuf};
    use crate::sim::{DataPair, irecv_direct, isend_direct};

    let mut p = DataPair::new(64);
    let mut journal = SendJournal::new();
    let buf = p.send_buf(&[7u8; 64]);
    let rbuf: RecvBuf = p.recv_buf(64);
    let r = irecv_direct(&mut p.recv, &mut p.recv_nic, &[rbuf], &[1])
        .unwrap()
        .unwrap();
    p.fabric.run_until_idle();
    let s = isend_direct(&mut p.send, &mut p.send_nic, buf, 1)
        .unwrap()
        .unwrap();
    journal.note(s, buf, 1, 0);
    p.fabric.run_until_idle();
    assert!(matches!(
        p.recv.test(&mut p.recv_nic, r).unwrap(),
        Completed::Done { .. }
    ));
    // The sender's acknowledgement is lost: it sees a port failure instead.
    p.fabric.cut_port_acks_lost(&p.send_nic);
    let mut nic = Guarded::new(&mut p.send_nic, true);
    assert_eq!(p.send.test(&mut nic, s), Ok(Completed::Pending));
    assert!(p.send.failover_quiesce(&mut nic).unwrap());
    let own = p.send.failover_snapshot().unwrap();
    assert_eq!(
        (own.acked, own.ended),
        (0, 1),
        "its slot end is not known complete"
    );
    p.fabric.fault_qp_error(&p.recv_nic);
    let (mut send_nic, recv_nic) = p.fabric.reconnect(&p.send_nic, &p.recv_nic);
    p.recv_nic = recv_nic;
    // The receiver posts its next receive on the new queue pair.
    let r2 = irecv_direct(&mut p.recv, &mut p.recv_nic, &[rbuf], &[1])
        .unwrap()
        .unwrap();
    // The right plan (the receiver's oldest is 1) completes the send here without replaying.
    // A wrong one replays its slot end:
    let wrong = SenderPlan {
        complete: SeqRange { start: 0, end: 0 },
        replay: SeqRange { start: 0, end: 1 },
        peer_keys: None,
    };
    let rekey = Rekey::same(p.recv_nic.inbound_region());
    p.send
        .failover_replay(&mut send_nic, &wrong, &mut journal, &rekey)
        .unwrap();
    p.fabric.run_until_idle();
    assert_eq!(
        p.recv.test(&mut p.recv_nic, r2),
        Err(DataError::Protocol(ProtocolError::Sequence {
            expected: 1,
            got: 0
        })),
        "a receive never completes twice"
    );
}

/// Adaptive routing's split (data, then the record's write with immediate) and queue pairs
/// without inline room (every record and entry staged) replay as well: a cut at every step, the
/// kind of cut rotating.
#[test]
fn split_sends_and_staged_records_survive_a_cut_at_every_step() {
    let streams = [small_stream(16, 4), small_stream(16, 7)];
    let ar = |p: &mut FailoverPair| {
        for lane in 0..2 {
            p.sender(lane).set_adaptive_routing(Some(4096));
        }
    };
    let mut p = FailoverPair::new(2, 0, config(2, 1), config(2, 1));
    ar(&mut p);
    let mut total = 0;
    assert_eq!(p.run(&streams, |_, step| total = step), Outcome::Done);
    let mut failovers = 0;
    for at in 0..=total {
        let (lane, how) = [
            (0, Cut::Sender),
            (1, Cut::Receiver),
            (0, Cut::SenderAcksLost),
        ][at % 3];
        {
            let mut p = FailoverPair::new(2, 0, config(2, 1), config(2, 1));
            ar(&mut p);
            let outcome = p.run(&streams, |p, step| {
                if step == at {
                    cut(p, lane, how);
                }
            });
            assert_eq!(outcome, Outcome::Done, "cut {how:?} lane {lane} at {at}");
            failovers += p.send_fo.stats().failovers;
        }
    }
    assert!(failovers as usize > total / 2, "{failovers} failovers");
}

/// A receiver that reports an `oldest` one older than it has (a lie the sender cannot see
/// through while it stays inside what it has not seen acknowledged) makes the sender replay a
/// slot end whose receive completed; the receiver refuses it as a protocol error and the
/// connection fails: no receive completes twice, no bytes are delivered wrong (the harness
/// checks every completed receive).
#[test]
fn a_lying_receiver_report_fails_the_connection_not_the_data() {
    use super::Tamper;
    let streams = [stream(24, 0)];
    let total = steps(1, &streams);
    let mut refused = 0;
    for at in 0..=total {
        let mut p = FailoverPair::new(1, 64, config(1, 1), config(1, 1));
        // The sender's end trips first and reports first: the receiver's is report 1.
        p.tamper = Some(Tamper {
            report: 1,
            a: u32::MAX,
            b: 0,
        });
        let outcome = p.run(&streams, |p, step| {
            if step == at {
                cut(p, 0, Cut::SenderAcksLost);
            }
        });
        match outcome {
            Outcome::Failed(DataError::Protocol(ProtocolError::Sequence { .. })) => refused += 1,
            // The lie was past what the sender saw acknowledged, or no failover happened.
            Outcome::Failed(_) | Outcome::Done => {}
            Outcome::Stuck => panic!("cut at {at}: stuck"),
        }
    }
    assert!(refused > 0, "the lie got through somewhere");
}

/// [`config`] over two devices: port `i` on device `i` (separate protection domains).
fn two_devices(lanes: usize, attempts: u32) -> FailoverConfig {
    FailoverConfig {
        port_devices: vec![0, 1],
        ..config(lanes, attempts)
    }
}

/// Across two devices, one lane (on port 0, device 0) cut at every step on either end, with
/// and without lost acknowledgements: the lane moves to device 1 at both ends (one that only
/// heard of it follows), is rekeyed, and the stream arrives whole, in order, byte-exact.
#[test]
fn across_devices_one_lane_survives_a_cut_at_every_step_on_either_end() {
    let streams = [stream(24, 0)];
    let new = || FailoverPair::new(1, 64, two_devices(1, 1), two_devices(1, 1));
    let mut total = 0;
    assert_eq!(new().run(&streams, |_, step| total = step), Outcome::Done);
    let (mut failovers, mut followed) = (0, 0);
    for at in 0..=total {
        for how in [Cut::Sender, Cut::Receiver, Cut::SenderAcksLost] {
            let mut p = new();
            let outcome = p.run(&streams, |p, step| {
                if step == at {
                    cut(p, 0, how);
                }
            });
            assert_eq!(
                outcome,
                Outcome::Done,
                "cut {how:?} at {at}: gave up {:?} / {:?}",
                p.send_gave_up,
                p.recv_gave_up
            );
            let (s, r) = (p.send_fo.stats(), p.recv_fo.stats());
            assert_eq!(s.failovers, r.failovers, "both ends fail over together");
            assert_eq!(
                p.send_fo.lane_port(0),
                p.recv_fo.lane_port(0),
                "cut {how:?} at {at}: both ends on one device"
            );
            if s.failovers > 0 {
                assert_eq!(p.send_nic(0).device(), 1);
                assert_eq!(p.recv_nic(0).device(), 1);
            }
            failovers += s.failovers;
            followed += p.started_by_report;
        }
    }
    assert!(failovers as usize > 2 * total, "{failovers} failovers");
    assert!(followed > 0, "some end only heard of the cut from its peer");
}

/// Adaptive routing's split and queue pairs without inline room (every entry and record
/// staged, the staging regions registered on the new device) across two devices, the kind of
/// cut rotating at every step.
#[test]
fn across_devices_split_sends_and_staged_records_survive_a_cut_at_every_step() {
    let streams = [small_stream(16, 4), small_stream(16, 7)];
    let new = || {
        let mut p = FailoverPair::new(2, 0, two_devices(2, 1), two_devices(2, 1));
        for lane in 0..2 {
            p.sender(lane).set_adaptive_routing(Some(4096));
        }
        p
    };
    let mut total = 0;
    assert_eq!(new().run(&streams, |_, step| total = step), Outcome::Done);
    let mut failovers = 0;
    for at in 0..=total {
        let how = [Cut::Sender, Cut::Receiver, Cut::SenderAcksLost][at % 3];
        let mut p = new();
        let outcome = p.run(&streams, |p, step| {
            if step == at {
                cut(p, 0, how);
            }
        });
        assert_eq!(outcome, Outcome::Done, "cut {how:?} lane 0 at {at}");
        assert_eq!(p.send_fo.lane_port(1), Some(1), "lane 1 never moves");
        failovers += p.send_fo.stats().failovers;
    }
    assert!(failovers as usize > total / 2, "{failovers} failovers");
}

/// One lane's receives (from the oldest on) behind more registrations than a failover to
/// another device carries: the receiver gives up with the reason, the connection fails with
/// the lane's first error, nothing hangs.
#[test]
fn across_devices_a_receiver_with_too_many_registrations_gives_up() {
    let streams = [Stream {
        sizes: vec![vec![64; 8]; 20],
    }];
    let mut gave_up = 0;
    for at in (0..150).step_by(5) {
        let mut p = FailoverPair::new(1, 64, two_devices(1, 1), two_devices(1, 1));
        p.distinct_registrations();
        let outcome = p.run(&streams, |p, step| {
            if step == at {
                cut(p, 0, Cut::Receiver);
            }
        });
        match outcome {
            Outcome::Done => {}
            Outcome::Stuck => panic!("cut at {at}: stuck"),
            Outcome::Failed(err) => {
                assert!(err.is_fatal(), "{err}");
                assert!(
                    matches!(p.recv_gave_up, Some(FailoverError::Rekey(why)) if why.contains("more registrations")),
                    "cut at {at}: {:?} / {:?}",
                    p.send_gave_up,
                    p.recv_gave_up
                );
                gave_up += 1;
            }
        }
    }
    assert!(gave_up > 0);
}

/// The sender's quiesce makes every clear-to-send slot it has not read look unwritten: an
/// entry that landed before the failure carries the receiver's key of its old device under
/// the stamp its rewrite will have, so a send after the replay must wait for the rewrite (with
/// the new device's key), never take the stale entry. Here the receiver's rewrite is posted
/// but not executed when the sender's next send comes.
#[test]
fn across_devices_a_stale_entry_landed_before_the_cut_is_never_used() {
    use super::pair::qp_configs;
    use super::{Fabric, irecv_direct, isend_direct};
    use crate::data::failover::{
        Guarded, KeyMap, RecvJournal, SendJournal, plan_receiver, plan_sender,
    };
    use crate::data::{Completed, Connection, RecvBuf, RecvConn, SendBuf, SendConn};

    let fabric = Fabric::new();
    let (send_ep, recv_ep) = (fabric.endpoint(), fabric.endpoint());
    let (sc, rc) = qp_configs(64);
    let (send_nic, recv_nic) = fabric.connect_on((send_ep, 0), sc, (recv_ep, 0), rc);
    let mut send = SendConn::new(recv_nic.inbound_region());
    let mut recv = RecvConn::new(send_nic.inbound_region());
    let (smem, rmem) = (fabric.alloc(send_ep, 64), fabric.alloc(recv_ep, 64));
    fabric.write(send_ep, smem, &[0x5a; 64]);
    let skeys: Vec<_> = (0..2)
        .map(|d| fabric.register_on(send_ep, smem, 64, d))
        .collect();
    let rkeys: Vec<_> = (0..2)
        .map(|d| fabric.register_on(recv_ep, rmem, 64, d))
        .collect();
    let (mut send_journal, mut recv_journal) = (SendJournal::new(), RecvJournal::new());

    // The receive's entry lands in the sender's FIFO, with device 0's key.
    let rbuf = RecvBuf {
        addr: rmem,
        len: 64,
        rkey: rkeys[0].rkey,
        host: true,
    };
    let mut rg = Guarded::new(recv_nic, true);
    let r = irecv_direct(&mut recv, &mut rg, &[rbuf], &[1])
        .unwrap()
        .unwrap();
    recv_journal.note(r, &[rbuf], &[1]);
    fabric.run_until_idle();

    // Port 0's queue pairs fail before the sender read it; both ends quiesce.
    let mut sg = Guarded::new(send_nic, true);
    fabric.fault_qp_error(&sg.nic);
    fabric.fault_qp_error(&rg.nic);
    while !send.failover_quiesce(&mut sg).unwrap() {}
    while !recv.failover_quiesce(&mut rg).unwrap() {}
    let (own_s, own_r) = (send.failover_snapshot().unwrap(), recv.failover_snapshot());
    assert_eq!(
        (own_s.ended, own_r.announced),
        (0, 1),
        "the entry was not read"
    );

    // Both move to device 1: the receiver's keys there, the plans, the new queue pairs.
    let (send_map, recv_map) = (
        |key| fabric.key_on(send_ep, key, 1),
        |key| fabric.key_on(recv_ep, key, 1),
    );
    let mut keys = KeyMap::EMPTY;
    recv.failover_peer_keys(&recv_journal, &recv_map, &mut keys)
        .unwrap();
    assert_eq!(keys.pairs(), [(rkeys[0].rkey, rkeys[1].rkey)]);
    let send_plan = SenderPlan {
        peer_keys: Some(keys),
        ..plan_sender(0, own_s, own_r).unwrap()
    };
    let recv_plan = plan_receiver(0, own_r, own_s).unwrap();
    let (mut s2, mut r2) = fabric.reconnect_on(&sg.nic, 1, &rg.nic, 1);
    let rekey = |peer: &super::SimNic, map| Rekey {
        peer_region: peer.inbound_region(),
        local: Some(map),
    };
    send.failover_replay(
        &mut s2,
        &send_plan,
        &mut send_journal,
        &rekey(&r2, &send_map),
    )
    .unwrap();
    recv.failover_replay(
        &mut r2,
        &recv_plan,
        &mut recv_journal,
        &rekey(&s2, &recv_map),
    )
    .unwrap();

    // The rewrite is queued, not executed: the send must wait for it.
    let sbuf = SendBuf {
        addr: smem,
        len: 64,
        lkey: skeys[1].lkey,
    };
    assert_eq!(
        isend_direct(&mut send, &mut s2, sbuf, 1),
        Ok(None),
        "the stale entry (device 0's key) is not taken"
    );
    fabric.run_until_idle();
    let s = isend_direct(&mut send, &mut s2, sbuf, 1)
        .unwrap()
        .expect("the rewritten entry");
    send_journal.note(s, sbuf, 1, 0);
    fabric.run_until_idle();
    assert!(matches!(
        recv.test(&mut r2, r),
        Ok(Completed::Done { n: 1, .. })
    ));
    assert_eq!(fabric.read(recv_ep, rmem, 64), [0x5a; 64]);
    assert!(matches!(send.test(&mut s2, s), Ok(Completed::Done { .. })));
}
