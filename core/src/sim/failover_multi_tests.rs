//! Port failover through the multi-lane connection of a fused device ([`MultiFailoverPair`]):
//! lanes spread over two ports (lane `i` on port `i % 2`), round-robin and split, one port cut
//! (every lane on it, on either end) at every step of a verified stream; failover off; both
//! ports cut. The same over a fused NIC of two devices (port `i` on device `i`: each its own
//! protection domain and keys), where a moved lane is rekeyed; and what must fail cleanly
//! there (too many registrations, a broken key map).

use std::vec;

use super::{KeyFault, MultiFailoverPair, Outcome, Stream};
use crate::data::DataError;
use crate::data::failover::{FailoverConfig, FailoverError};
use crate::nic::WcStatus;
use crate::time::Duration;

/// Failover on, `lanes` lanes over two ports of one device, `attempts` attempts.
fn config(lanes: usize, attempts: u32) -> FailoverConfig {
    FailoverConfig {
        enabled: true,
        max_attempts: attempts,
        timeout: Duration::from_secs(10),
        port_devices: vec![0, 0],
        lane_ports: (0..lanes).map(|l| (l % 2) as u8).collect(),
    }
}

/// [`config`] over two devices: port `i` on device `i`.
fn two_devices(lanes: usize, attempts: u32) -> FailoverConfig {
    FailoverConfig {
        port_devices: vec![0, 1],
        ..config(lanes, attempts)
    }
}

/// `receives` receives, sizes from 0 B up to `max` (1 MiB at most), every third one a group of
/// up to 8.
fn stream(receives: usize, salt: usize, max: usize) -> Stream {
    const SIZES: [usize; 10] = [8, 0, 100, 4096, 65_536, 1, 300, 1 << 20, 17, 20_000];
    let sizes = (0..receives)
        .map(|j| {
            let n = if j % 3 == 2 { 1 + (j + salt) % 8 } else { 1 };
            (0..n)
                .map(|k| SIZES[(j * 3 + k + salt) % SIZES.len()].min(max))
                .collect()
        })
        .collect();
    Stream { sizes }
}

/// Which end's port 0 is cut.
#[derive(Clone, Copy, Debug)]
enum Cut {
    Sender,
    Receiver,
    /// The sender's, its unpolled acknowledgements lost.
    SenderAcksLost,
}

/// Cut port 0 (every lane on it: the even ones) of one end.
fn cut_port0(p: &mut MultiFailoverPair, how: Cut) {
    let fabric = p.fabric.clone();
    for lane in (0..p.lanes()).step_by(2) {
        match how {
            Cut::Sender => fabric.cut_port(p.send_nic(lane)),
            Cut::Receiver => fabric.cut_port(p.recv_nic(lane)),
            Cut::SenderAcksLost => fabric.cut_port_acks_lost(p.send_nic(lane)),
        }
    }
}

/// How many fabric steps `stream` takes on `lanes` lanes of `width` without a failure.
fn steps(lanes: usize, width: usize, stream: &Stream, topology: Topology) -> usize {
    let mut p = MultiFailoverPair::new(
        (lanes, width),
        64,
        None,
        topology(lanes, 1),
        topology(lanes, 1),
    );
    let mut last = 0;
    assert_eq!(p.run(stream, |_, step| last = step), Outcome::Done);
    last
}

/// The ends' configuration for `lanes` lanes and `attempts` attempts.
type Topology = fn(usize, u32) -> FailoverConfig;

/// What a sweep of cuts saw.
#[derive(Debug, Default)]
struct Sweep {
    /// Calls that found a lane blocked.
    refused: usize,
    /// Lane failovers an end started on the peer's report.
    started_by_report: usize,
}

/// Every step, every end: the stream arrives whole (checked byte for byte, in order, exactly
/// once by the harness), no error reaches a caller, and the cut port's lanes moved.
fn survive_a_port_cut_at_every_step(
    lanes: usize,
    width: usize,
    stream: &Stream,
    stride: usize,
) -> usize {
    sweep(lanes, width, stream, stride, config).refused
}

/// [`survive_a_port_cut_at_every_step`] over `topology`. Across devices both ends of every
/// lane also end on the same port (one that moved is followed: two devices are two rails).
fn sweep(lanes: usize, width: usize, stream: &Stream, stride: usize, topology: Topology) -> Sweep {
    let total = steps(lanes, width, stream, topology);
    assert!(total > 20, "the stream takes {total} steps");
    let across = topology(lanes, 1).port_devices != [0, 0];
    let mut failovers = 0;
    let mut seen = Sweep::default();
    for at in (0..=total).step_by(stride) {
        for how in [Cut::Sender, Cut::Receiver, Cut::SenderAcksLost] {
            let mut p = MultiFailoverPair::new(
                (lanes, width),
                64,
                None,
                topology(lanes, 1),
                topology(lanes, 1),
            );
            let outcome = p.run(stream, |p, step| {
                if step == at {
                    cut_port0(p, how);
                }
            });
            assert_eq!(
                outcome,
                Outcome::Done,
                "{lanes} lanes width {width}, cut {how:?} at step {at}: gave up {:?} / {:?}",
                p.send_gave_up(),
                p.recv_gave_up()
            );
            let (s, r) = (p.send_fo().stats(), p.recv_fo().stats());
            assert_eq!(s.failovers, r.failovers, "both ends fail over together");
            assert!(
                s.failovers as usize <= lanes / 2,
                "only port 0's lanes fail"
            );
            // Port 1 never failed: its lanes stay at both ends. (Port 0's lanes move at an end
            // that saw its port fail; one that only heard the peer's report keeps a port it
            // has no reason to leave.)
            for fo in [p.send_fo(), p.recv_fo()] {
                for l in 0..lanes {
                    let port = fo.lane_port(l as u8);
                    assert!(
                        port == Some(1) || (l % 2 == 0 && port == Some(0)),
                        "lane {l}"
                    );
                }
            }
            if across {
                for l in 0..lanes as u8 {
                    assert_eq!(
                        p.send_fo().lane_port(l),
                        p.recv_fo().lane_port(l),
                        "lane {l}, cut {how:?} at {at}: both ends on one device"
                    );
                }
            }
            failovers += s.failovers;
            seen.refused += p.refused_blocked;
            seen.started_by_report += p.started_by_report;
        }
    }
    // A cut after the last work request ran fails nothing: most cuts must have failed over.
    let cuts = 3 * total.div_ceil(stride);
    assert!(
        failovers as usize > cuts / 2,
        "{failovers} lane failovers in {cuts} cuts"
    );
    seen
}

#[test]
fn two_lanes_round_robin_survive_a_port_cut_at_every_step() {
    let refused = survive_a_port_cut_at_every_step(2, 1, &stream(24, 0, 65_536), 1);
    assert!(refused > 0, "some call found a lane blocked");
}

#[test]
fn two_lanes_split_survive_a_port_cut_at_every_step() {
    let refused = survive_a_port_cut_at_every_step(2, 2, &stream(24, 1, 65_536), 1);
    assert!(refused > 0, "some call found a lane blocked");
}

#[test]
fn four_lanes_round_robin_survive_a_port_cut_at_every_step() {
    let refused = survive_a_port_cut_at_every_step(4, 1, &stream(32, 2, 65_536), 1);
    assert!(refused > 0, "some call found a lane blocked");
}

#[test]
fn four_lanes_split_survive_a_port_cut_at_every_step() {
    let refused = survive_a_port_cut_at_every_step(4, 4, &stream(24, 3, 65_536), 1);
    assert!(refused > 0, "some call found a lane blocked");
}

#[test]
fn four_lanes_striped_over_the_two_ports_survive_a_port_cut() {
    // A fused device of 2 ports without split: each message over one lane of each port.
    let refused = survive_a_port_cut_at_every_step(4, 2, &stream(24, 4, 65_536), 2);
    assert!(refused > 0, "some call found a lane blocked");
}

#[test]
fn one_mib_messages_survive_a_port_cut() {
    let mut refused = 0;
    for (lanes, width) in [(2, 1), (2, 2), (4, 4)] {
        refused += survive_a_port_cut_at_every_step(lanes, width, &stream(12, 5, 1 << 20), 3);
    }
    assert!(refused > 0, "some call found a lane blocked");
}

#[test]
fn failover_off_fails_the_connection_with_the_first_error() {
    for (lanes, width) in [(2, 1), (4, 4)] {
        let mut off = config(lanes, 1);
        off.enabled = false;
        let mut p = MultiFailoverPair::new((lanes, width), 64, None, off.clone(), off);
        let outcome = p.run(&stream(40, 0, 65_536), |p, step| {
            if step == 20 {
                cut_port0(p, Cut::Sender);
            }
        });
        let Outcome::Failed(err) = outcome else {
            panic!("failover off must fail the connection: {outcome:?}")
        };
        // The sender's own retry exhaustion, as without the tripwires (unarmed).
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
        assert_eq!(p.send_fo().stats().failovers, 0);
        assert_eq!((p.send_gave_up(), p.recv_gave_up()), (None, None));
    }
}

#[test]
fn both_ports_cut_is_a_clean_error() {
    for (lanes, width) in [(2, 1), (4, 1), (4, 4)] {
        for second in [None, Some(150)] {
            let mut p = MultiFailoverPair::new(
                (lanes, width),
                64,
                None,
                config(lanes, 2),
                config(lanes, 2),
            );
            let outcome = p.run(&stream(60, 0, 65_536), |p, step| {
                let fabric = p.fabric.clone();
                if step == 20 {
                    cut_port0(p, Cut::Sender);
                    if second.is_none() {
                        for lane in 0..p.lanes() {
                            fabric.cut_port(p.send_nic(lane));
                        }
                    }
                }
                if Some(step) == second {
                    // Every lane is on port 1 by now.
                    for lane in 0..p.lanes() {
                        fabric.cut_port(p.send_nic(lane));
                    }
                }
            });
            let Outcome::Failed(err) = outcome else {
                panic!("{lanes} lanes, second cut {second:?}: {outcome:?}")
            };
            assert!(err.is_fatal(), "{err}");
            // The cut reaches both ends' queue pairs: either end may find no port left first
            // (the other then hears its refusal).
            let reasons = [p.send_gave_up(), p.recv_gave_up()];
            assert!(
                reasons.contains(&Some(FailoverError::NoSurvivingPort)),
                "{lanes} lanes, second cut {second:?}: {reasons:?}"
            );
        }
    }
}

/// Across two devices (port `i` on device `i`, separate protection domains): port 0 cut on
/// either end at every step, with and without lost acknowledgements, grouped receives of up to
/// 8, round-robin and split over 2 and 4 lanes: every lane moved to device 1 is rekeyed (its
/// control regions registered there, its buffers' keys mapped, the receiver's consumed entries
/// rekeyed by its key reports) and every message arrives once, byte-exact, in order, with no
/// error reaching a caller; port 1's lanes never move; an end whose port stayed up follows
/// the peer to device 1.
fn across_devices(lanes: usize, width: usize, stream: &Stream, stride: usize) -> Sweep {
    sweep(lanes, width, stream, stride, two_devices)
}

/// [`across_devices`], and some call found a lane blocked, and some end only heard of the cut
/// from its peer (and followed it).
fn across_devices_checked(lanes: usize, width: usize, stream: &Stream, stride: usize) {
    let seen = across_devices(lanes, width, stream, stride);
    assert!(seen.refused > 0, "some call found a lane blocked");
    assert!(seen.started_by_report > 0, "some end followed its peer");
}

#[test]
fn across_devices_two_lanes_round_robin_survive_a_port_cut_at_every_step() {
    across_devices_checked(2, 1, &stream(24, 0, 65_536), 1);
}

#[test]
fn across_devices_two_lanes_split_survive_a_port_cut_at_every_step() {
    across_devices_checked(2, 2, &stream(24, 1, 65_536), 1);
}

#[test]
fn across_devices_four_lanes_round_robin_survive_a_port_cut_at_every_step() {
    across_devices_checked(4, 1, &stream(32, 2, 65_536), 1);
}

#[test]
fn across_devices_four_lanes_split_survive_a_port_cut_at_every_step() {
    across_devices_checked(4, 4, &stream(24, 3, 65_536), 1);
}

#[test]
fn across_devices_one_mib_messages_survive_a_port_cut() {
    let mut seen = Sweep::default();
    for (lanes, width) in [(2, 1), (2, 2), (4, 4)] {
        let one = across_devices(lanes, width, &stream(12, 5, 1 << 20), 3);
        seen.refused += one.refused;
        seen.started_by_report += one.started_by_report;
    }
    assert!(seen.refused > 0 && seen.started_by_report > 0, "{seen:?}");
}

/// Cut port 0 of one end at `at` over two devices; the pair after the run and its outcome.
fn cut_across(
    (lanes, width): (usize, usize),
    stream: &Stream,
    how: Cut,
    at: usize,
    setup: impl FnOnce(&mut MultiFailoverPair),
) -> (Outcome, MultiFailoverPair) {
    let mut p = MultiFailoverPair::new(
        (lanes, width),
        64,
        None,
        two_devices(lanes, 1),
        two_devices(lanes, 1),
    );
    setup(&mut p);
    let outcome = p.run(stream, |p, step| {
        if step == at {
            cut_port0(p, how);
        }
    });
    (outcome, p)
}

/// A receiver whose lane's receives (from the oldest on) use more registrations than a
/// failover to another device carries (`MAX_KEY_PAIRS`: every buffer its own registration,
/// groups of 8 split over the lanes) gives up: the connection fails with the lane's first
/// error and the reason, at both ends, nothing hangs, no byte is wrong.
#[test]
fn across_devices_too_many_registrations_give_up_cleanly() {
    // Groups of 8 buffers of 100 bytes each, 16 posted ahead: up to 128 registrations per lane.
    let stream = Stream {
        sizes: vec![vec![100; 8]; 24],
    };
    let mut too_many = 0;
    for at in (0..200).step_by(7) {
        let (outcome, p) = cut_across((2, 2), &stream, Cut::Receiver, at, |p| {
            p.distinct_registrations();
        });
        match outcome {
            Outcome::Done => continue,
            Outcome::Stuck => panic!("cut at {at}: stuck"),
            Outcome::Failed(err) => {
                assert!(err.is_fatal(), "cut at {at}: {err}");
                let reasons = (p.send_gave_up(), p.recv_gave_up());
                let Some(FailoverError::Rekey(why)) = reasons.1 else {
                    panic!("cut at {at}: {reasons:?}, {err}")
                };
                assert!(why.contains("more registrations"), "{why}");
                assert!(
                    matches!(err, DataError::Completion { .. } | DataError::PeerLost),
                    "the lane's first error, as without failover: {err}"
                );
                assert!(
                    matches!(reasons.0, None | Some(FailoverError::PeerRefused(_))),
                    "the sender gave up only on hearing it: {reasons:?}"
                );
                too_many += 1;
            }
        }
    }
    assert!(too_many > 0, "some cut found more than 40 registrations");
    // Carved from a few registrations (as NCCL's buffers are), the same stream fails over.
    for at in (0..200).step_by(7) {
        let (outcome, _) = cut_across((2, 2), &stream, Cut::Receiver, at, |_| {});
        assert_eq!(outcome, Outcome::Done, "cut at {at}");
    }
}

/// A lane moved to another device replays only under keys it was told: a receiver that tells
/// no keys, or a key map that knows none, fails the failover (the lane's first error, a
/// `Rekey` reason) before any write with a stale key goes out; a driver that replays without
/// mapping its keys at all gets its writes refused by the device (the simulator checks keys
/// per device). Never a wrong byte, never a hang.
#[test]
fn across_devices_a_broken_key_map_fails_rather_than_writing_with_a_stale_key() {
    let stream = stream(24, 0, 65_536);
    for fault in [
        KeyFault::NoPeerKeys,
        KeyFault::EmptyLocalMap,
        KeyFault::NoLocalMap,
    ] {
        let mut failed = 0;
        for at in (0..300).step_by(5) {
            for how in [Cut::Sender, Cut::Receiver] {
                let (outcome, p) = cut_across((2, 1), &stream, how, at, |p| {
                    p.key_fault = Some(fault);
                });
                let err = match outcome {
                    Outcome::Done => continue,
                    Outcome::Stuck => panic!("{fault:?}, cut {how:?} at {at}: stuck"),
                    Outcome::Failed(err) => err,
                };
                assert!(err.is_fatal(), "{fault:?}: {err}");
                let reasons = [p.send_gave_up(), p.recv_gave_up()];
                match fault {
                    KeyFault::NoPeerKeys | KeyFault::EmptyLocalMap => {
                        // Refused before posting: no device refused a key.
                        assert!(
                            reasons
                                .iter()
                                .any(|r| matches!(r, Some(FailoverError::Rekey(_)))),
                            "{fault:?}, cut {how:?} at {at}: {reasons:?}, {err}"
                        );
                        assert!(
                            !matches!(
                                err,
                                DataError::Completion {
                                    status: WcStatus::REM_ACCESS_ERR | WcStatus::LOC_PROT_ERR,
                                    ..
                                }
                            ),
                            "{fault:?}: a stale key was written: {err}"
                        );
                    }
                    KeyFault::NoLocalMap => {
                        // The old device's keys on the new device's queue pair: refused there.
                        assert!(
                            reasons.iter().flatten().any(|r| matches!(
                                r,
                                FailoverError::NotSurvivable(
                                    WcStatus::LOC_PROT_ERR | WcStatus::REM_ACCESS_ERR
                                )
                            )) || matches!(
                                err,
                                DataError::Completion {
                                    status: WcStatus::LOC_PROT_ERR | WcStatus::REM_ACCESS_ERR,
                                    ..
                                }
                            ),
                            "{fault:?}, cut {how:?} at {at}: {reasons:?}, {err}"
                        );
                    }
                }
                failed += 1;
            }
        }
        assert!(failed > 0, "{fault:?} never mattered");
    }
}
