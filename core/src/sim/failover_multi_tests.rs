//! Port failover through the multi-lane connection of a fused device ([`MultiFailoverPair`]):
//! lanes spread over two ports (lane `i` on port `i % 2`), round-robin and split, one port cut
//! (every lane on it, on either end) at every step of a verified stream; failover off; both
//! ports cut.

use std::vec;

use super::{MultiFailoverPair, Outcome, Stream};
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
fn steps(lanes: usize, width: usize, stream: &Stream) -> usize {
    let mut p =
        MultiFailoverPair::new((lanes, width), 64, None, config(lanes, 1), config(lanes, 1));
    let mut last = 0;
    assert_eq!(p.run(stream, |_, step| last = step), Outcome::Done);
    last
}

/// Every step, every end: the stream arrives whole (checked byte for byte, in order, exactly
/// once by the harness), no error reaches a caller, and the cut port's lanes moved.
/// Returns how many calls found a lane blocked.
fn survive_a_port_cut_at_every_step(
    lanes: usize,
    width: usize,
    stream: &Stream,
    stride: usize,
) -> usize {
    let total = steps(lanes, width, stream);
    assert!(total > 20, "the stream takes {total} steps");
    let mut failovers = 0;
    let mut refused = 0;
    for at in (0..=total).step_by(stride) {
        for how in [Cut::Sender, Cut::Receiver, Cut::SenderAcksLost] {
            let mut p = MultiFailoverPair::new(
                (lanes, width),
                64,
                None,
                config(lanes, 1),
                config(lanes, 1),
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
            failovers += s.failovers;
            refused += p.refused_blocked;
        }
    }
    // A cut after the last work request ran fails nothing: most cuts must have failed over.
    let cuts = 3 * total.div_ceil(stride);
    assert!(
        failovers as usize > cuts / 2,
        "{failovers} lane failovers in {cuts} cuts"
    );
    refused
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
