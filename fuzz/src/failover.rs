//! Port failover (issue #39) on the simulated fabric: a multi-lane connection with failover on
//! (or off, on either end) carries a verified stream while ports are cut at arbitrary steps,
//! on either end, with or without lost acknowledgements, and a report may be tampered with (a
//! lying peer). Checked:
//!
//! - every receive that completes holds exactly the bytes sent, in order, once
//!   ([`FailoverPair::run`] checks each as it completes);
//! - without tampering nothing hangs; a connection that fails fails with a fatal error, after a
//!   cut, and an end that gave up says why;
//! - one cut, failover on at both ends with an attempt: the stream always completes (failover
//!   may not give up there);
//! - with a tampered report, nothing panics and no receive is wrong (a hang is the liar's).
//!
//! In multi mode the connection is one fused device's multi-lane connection driven through
//! `MultiSend`/`MultiRecv` ([`MultiFailoverPair`]): 2 to 4 lanes, each message over 1 to all
//! of them, a cut takes a whole port (every lane on it), and one stream runs over the
//! connection; the same checks hold.
//!
//! Topologies: the ports (2 or 3) of one device, each port its own device, or two ports per
//! device (4 or 6 ports on 2 or 3 devices). Across devices the simulator refuses a key of
//! another device, and a lane moved there is rekeyed (its control regions registered on the
//! new device, the replay under the new keys, a receiver's key reports): the rekey path is
//! fuzzed, a stale key fails loudly. User buffers are carved from a few registrations on every
//! device, or (`distinct`) each its own, when a receiver may find more than a failover carries
//! and give up (`FailoverError::Rekey`): the one give-up allowed after a single cut.
//!
//! The input is a small byte format of its own ([`Input::decode`]; missing bytes read as 0), so
//! the committed seeds are generated from named scenarios ([`seeds`]).

use rivet_core::data::DataError;
use rivet_core::data::failover::{Failover, FailoverConfig, FailoverError, FailoverStats};
use rivet_core::sim::{FailoverPair, MultiFailoverPair, Outcome, Stream, Tamper};
use rivet_core::time::Duration;

/// Bytes a send may carry (indexed by a nibble of the input, low 3 bits).
const SIZES: [usize; 8] = [0, 1, 8, 100, 512, 4096, 20_000, 70_000];
/// Receives per lane at most.
const MAX_RECEIVES: usize = 24;
/// Cuts at most.
const MAX_CUTS: usize = 4;

/// Where a port is cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cut {
    /// After this fabric step (mod 1024).
    pub step: u16,
    /// Which lane (mod lanes).
    pub lane: u8,
    /// 0: the sender's port, 1: the receiver's, 2: the sender's with its acknowledgements lost.
    pub kind: u8,
}

/// One input.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Input {
    /// Lanes, 1..=3.
    pub lanes: u8,
    /// Queue pairs with 64 inline bytes (else none).
    pub inline: bool,
    /// Adaptive routing's threshold, if on.
    pub adaptive_routing: Option<u16>,
    /// Failover off at the sending end.
    pub send_off: bool,
    /// Failover off at the receiving end.
    pub recv_off: bool,
    /// Attempts, 0..=3.
    pub attempts: u8,
    /// Three ports instead of two.
    pub third_port: bool,
    /// Every port on its own device (else all on one).
    pub devices: bool,
    /// Receives posted ahead at most, 1..=16.
    pub window: u8,
    /// Per receive: group size (low 3 bits + 1) and its sizes' nibbles.
    pub receives: Vec<(u8, u32)>,
    /// The cuts.
    pub cuts: Vec<Cut>,
    /// The report to tamper with: number and what to add to its numbers.
    pub tamper: Option<(u8, u32, u32)>,
    /// Multi mode: `lanes + 1` lanes (2..=4) driven through the multi connection, each message
    /// cut over `1 + multi % (lanes + 1)` of them.
    pub multi: Option<u8>,
    /// Two ports per device: 4 ports on 2 devices (6 on 3 with `third_port`); `devices` then
    /// says nothing.
    pub paired: bool,
    /// Every user buffer its own registration (else carved from a few).
    pub distinct: bool,
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn u8(&mut self) -> u8 {
        let (&b, rest) = self.0.split_first().unwrap_or((&0, &[]));
        self.0 = rest;
        b
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
}

impl Input {
    /// Decode any bytes (missing ones are 0).
    pub fn decode(bytes: &[u8]) -> Self {
        let mut r = Reader(bytes);
        let lanes = r.u8() % 3 + 1;
        let flags = r.u8();
        let attempts = r.u8() % 4;
        let window = r.u8() % 16 + 1;
        let threshold = r.u16();
        let receives = (0..usize::from(r.u8()) % (MAX_RECEIVES + 1))
            .map(|_| (r.u8(), r.u32()))
            .collect();
        let cuts = (0..usize::from(r.u8()) % (MAX_CUTS + 1))
            .map(|_| Cut {
                step: r.u16() % 1024,
                lane: r.u8() % lanes,
                kind: r.u8() % 3,
            })
            .collect();
        let tamper = (flags & 0x40 != 0).then(|| (r.u8() % 4, r.u32(), r.u32()));
        let multi = (flags & 0x80 != 0).then(|| r.u8() % (lanes + 1));
        // A byte added later: inputs without it read as before.
        let topology = r.u8();
        Self {
            lanes,
            inline: flags & 1 != 0,
            adaptive_routing: (flags & 2 != 0).then_some(threshold),
            send_off: flags & 4 != 0,
            recv_off: flags & 8 != 0,
            attempts,
            third_port: flags & 0x10 != 0,
            devices: flags & 0x20 != 0,
            window,
            receives,
            cuts,
            tamper,
            multi,
            paired: topology & 1 != 0,
            distinct: topology & 2 != 0,
        }
    }

    /// The bytes [`decode`](Self::decode) reads back as this input (which must be in range).
    pub fn encode(&self) -> Vec<u8> {
        let flags = u8::from(self.inline)
            | u8::from(self.adaptive_routing.is_some()) << 1
            | u8::from(self.send_off) << 2
            | u8::from(self.recv_off) << 3
            | u8::from(self.third_port) << 4
            | u8::from(self.devices) << 5
            | u8::from(self.tamper.is_some()) << 6
            | u8::from(self.multi.is_some()) << 7;
        let mut out = vec![self.lanes - 1, flags, self.attempts, self.window - 1];
        out.extend(self.adaptive_routing.unwrap_or(0).to_le_bytes());
        out.push(self.receives.len() as u8);
        for &(group, nibbles) in &self.receives {
            out.push(group);
            out.extend(nibbles.to_le_bytes());
        }
        out.push(self.cuts.len() as u8);
        for cut in &self.cuts {
            out.extend(cut.step.to_le_bytes());
            out.push(cut.lane);
            out.push(cut.kind);
        }
        if let Some((report, a, b)) = self.tamper {
            out.push(report);
            out.extend(a.to_le_bytes());
            out.extend(b.to_le_bytes());
        }
        if let Some(width) = self.multi {
            out.push(width);
        }
        let topology = u8::from(self.paired) | u8::from(self.distinct) << 1;
        if topology != 0 {
            out.push(topology);
        }
        out
    }
}

/// What a run came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    /// The outcome.
    pub outcome: Outcome,
    /// Cuts that happened before the stream ended.
    pub applied: usize,
    /// Why each end gave up, if it did.
    pub gave_up: (Option<FailoverError>, Option<FailoverError>),
    /// The sending end's statistics.
    pub stats: FailoverStats,
    /// Lanes the sending end ended on another device than they started on.
    pub moved_device: usize,
}

/// Lanes whose port at the end (`machine`'s) is on another device than their first.
fn moved_device(config: &FailoverConfig, machine: &Failover) -> usize {
    let device = |port: u8| config.port_devices.get(usize::from(port)).copied();
    config
        .lane_ports
        .iter()
        .enumerate()
        .filter(|&(lane, &first)| machine.lane_port(lane as u8).map(device) != Some(device(first)))
        .count()
}

/// Ports of the fused device.
fn ports(input: &Input) -> u8 {
    let devices = if input.third_port { 3 } else { 2 };
    if input.paired { 2 * devices } else { devices }
}

fn config(input: &Input, lanes: usize, off: bool) -> FailoverConfig {
    let ports = ports(input);
    FailoverConfig {
        enabled: !off,
        max_attempts: u32::from(input.attempts),
        timeout: Duration::from_secs(10),
        port_devices: (0..ports)
            .map(|p| match (input.paired, input.devices) {
                (true, _) => p / 2,
                (false, true) => p,
                (false, false) => 0,
            })
            .collect(),
        lane_ports: (0..lanes).map(|l| (l % usize::from(ports)) as u8).collect(),
    }
}

/// The receives of `input`: per receive, its sends' sizes.
fn receives(input: &Input) -> Vec<Vec<usize>> {
    input
        .receives
        .iter()
        .take(MAX_RECEIVES)
        .map(|&(group, nibbles)| {
            let n = usize::from(group & 7) + 1;
            (0..n)
                .map(|k| SIZES[(nibbles >> (4 * k)) as usize & 7])
                .collect()
        })
        .collect()
}

/// Run `input` (panics where a receive is wrong).
pub fn run(input: &Input) -> Run {
    let lanes = usize::from(input.lanes.clamp(1, 3));
    let receives = receives(input);
    if let Some(width) = input.multi {
        return run_multi(input, lanes + 1, width, receives);
    }
    let streams: Vec<Stream> = (0..lanes)
        .map(|lane| {
            // Each lane its own rotation of the receives.
            let mut sizes = receives.clone();
            let by = lane.min(sizes.len());
            sizes.rotate_left(by);
            Stream { sizes }
        })
        .collect();
    let max_inline = if input.inline { 64 } else { 0 };
    let mut p = FailoverPair::new(
        lanes,
        max_inline,
        config(input, lanes, input.send_off),
        config(input, lanes, input.recv_off),
    );
    p.window = usize::from(input.window.clamp(1, 16));
    if let Some(threshold) = input.adaptive_routing {
        for lane in 0..lanes {
            p.sender(lane)
                .set_adaptive_routing(Some(u64::from(threshold)));
        }
    }
    p.tamper = input.tamper.map(|(report, a, b)| Tamper {
        report: usize::from(report),
        a,
        b,
    });
    if input.distinct {
        p.distinct_registrations();
    }
    let mut applied = 0;
    let outcome = p.run(&streams, |p, step| {
        for cut in input.cuts.iter().take(MAX_CUTS) {
            if usize::from(cut.step) != step {
                continue;
            }
            let lane = usize::from(cut.lane) % lanes;
            let fabric = p.fabric.clone();
            match cut.kind {
                0 => fabric.cut_port(p.send_nic(lane)),
                1 => fabric.cut_port(p.recv_nic(lane)),
                _ => fabric.cut_port_acks_lost(p.send_nic(lane)),
            }
            applied += 1;
        }
    });
    Run {
        outcome,
        applied,
        gave_up: (p.send_gave_up, p.recv_gave_up),
        stats: p.send_fo.stats(),
        moved_device: moved_device(&config(input, lanes, input.send_off), &p.send_fo),
    }
}

/// Run `input` in multi mode: `lanes` lanes of one fused device, each message over
/// `1 + width % lanes` of them, one stream; a cut takes the port of its lane (every lane on it).
fn run_multi(input: &Input, lanes: usize, width: u8, receives: Vec<Vec<usize>>) -> Run {
    let width = 1 + usize::from(width) % lanes;
    let max_inline = if input.inline { 64 } else { 0 };
    let mut p = MultiFailoverPair::new(
        (lanes, width),
        max_inline,
        input.adaptive_routing.map(u64::from),
        config(input, lanes, input.send_off),
        config(input, lanes, input.recv_off),
    );
    p.window = usize::from(input.window.clamp(1, 16));
    p.tamper = input.tamper.map(|(report, a, b)| Tamper {
        report: usize::from(report),
        a,
        b,
    });
    if input.distinct {
        p.distinct_registrations();
    }
    let ports = usize::from(ports(input));
    let mut applied = 0;
    let outcome = p.run(&Stream { sizes: receives }, |p, step| {
        for cut in input.cuts.iter().take(MAX_CUTS) {
            if usize::from(cut.step) != step {
                continue;
            }
            let port = usize::from(cut.lane) % ports;
            let fabric = p.fabric.clone();
            // The lanes still on that port at the cut end (the ones that moved are elsewhere).
            for lane in 0..lanes {
                let machine = if cut.kind == 1 {
                    p.recv_fo()
                } else {
                    p.send_fo()
                };
                if machine.lane_port(lane as u8) != Some(port as u8) {
                    continue;
                }
                match cut.kind {
                    0 => fabric.cut_port(p.send_nic(lane)),
                    1 => fabric.cut_port(p.recv_nic(lane)),
                    _ => fabric.cut_port_acks_lost(p.send_nic(lane)),
                }
            }
            applied += 1;
        }
    });
    Run {
        outcome,
        applied,
        gave_up: (p.send_gave_up(), p.recv_gave_up()),
        stats: p.send_fo().stats(),
        moved_device: moved_device(&config(input, lanes, input.send_off), p.send_fo()),
    }
}

/// Run one input and check it against the model.
pub fn check(bytes: &[u8]) {
    let input = Input::decode(bytes);
    let run = run(&input);
    if input.tamper.is_some() {
        // A lying peer may hang or fail the connection; the receives that complete were checked.
        return;
    }
    match run.outcome {
        Outcome::Done => {}
        Outcome::Stuck => panic!("a hang without a lying peer: {run:?}"),
        Outcome::Failed(err) => {
            assert!(err.is_fatal(), "{err}");
            assert!(run.applied > 0, "failed without a cut: {err}");
            // In multi mode failover off at either end is failover not negotiated: the
            // tripwires are unarmed and the failure reaches the caller with no machine asked.
            let negotiated_off = input.multi.is_some() && (input.send_off || input.recv_off);
            assert!(
                run.gave_up.0.is_some() || run.gave_up.1.is_some() || negotiated_off,
                "failed without giving up: {err}"
            );
            let must_survive =
                run.applied == 1 && !input.send_off && !input.recv_off && input.attempts >= 1;
            // Every buffer its own registration: a receiver may have more behind a lane than
            // a failover to another device carries, and gives up (the only such reason).
            let too_many_keys = input.distinct
                && [run.gave_up.0, run.gave_up.1]
                    .iter()
                    .any(|r| matches!(r, Some(FailoverError::Rekey(why)) if why.contains("more registrations")));
            assert!(
                !must_survive || too_many_keys,
                "one cut with failover on must survive: {err}; {run:?}"
            );
        }
    }
}

/// The named scenarios the committed seeds are made from.
pub mod seeds {
    use super::{Cut, DataError, Input, Outcome, Run};

    /// A scenario: its name (the seed's file name), its input, and what its run must show.
    #[derive(Debug)]
    pub struct Seed {
        /// File name.
        pub name: &'static str,
        /// The input.
        pub input: Input,
        /// What the run must show.
        pub shows: fn(&Run) -> bool,
    }

    fn mixed(n: usize) -> Vec<(u8, u32)> {
        (0..n)
            .map(|j| {
                let group = if j % 4 == 3 { (j % 8) as u8 } else { 0 };
                (group, 0x7654_3210u32.rotate_left(4 * j as u32))
            })
            .collect()
    }

    fn base() -> Input {
        Input {
            lanes: 1,
            inline: true,
            attempts: 1,
            window: 8,
            receives: mixed(16),
            ..Input::default()
        }
    }

    fn cut(step: u16, lane: u8, kind: u8) -> Cut {
        Cut { step, lane, kind }
    }

    fn failed_over(run: &Run) -> bool {
        run.outcome == Outcome::Done && run.stats.failovers >= 1
    }

    fn failed(run: &Run) -> bool {
        matches!(run.outcome, Outcome::Failed(_))
    }

    /// Failed over to another device (rekeyed) and went on.
    fn moved_device(run: &Run) -> bool {
        failed_over(run) && run.moved_device >= 1
    }

    /// Every scenario.
    pub fn seeds() -> Vec<Seed> {
        vec![
            Seed {
                name: "cut_sender",
                input: Input {
                    cuts: vec![cut(20, 0, 0)],
                    ..base()
                },
                shows: failed_over,
            },
            Seed {
                name: "cut_receiver",
                input: Input {
                    cuts: vec![cut(30, 0, 1)],
                    ..base()
                },
                shows: failed_over,
            },
            Seed {
                name: "acks_lost",
                input: Input {
                    cuts: vec![cut(25, 0, 2)],
                    ..base()
                },
                shows: failed_over,
            },
            Seed {
                name: "three_lanes_groups",
                input: Input {
                    lanes: 3,
                    window: 16,
                    receives: mixed(20),
                    cuts: vec![cut(40, 1, 0)],
                    ..base()
                },
                shows: failed_over,
            },
            Seed {
                name: "split_staged",
                input: Input {
                    inline: false,
                    adaptive_routing: Some(4096),
                    cuts: vec![cut(30, 0, 1)],
                    ..base()
                },
                shows: failed_over,
            },
            Seed {
                name: "failover_off",
                input: Input {
                    send_off: true,
                    cuts: vec![cut(20, 0, 0)],
                    ..base()
                },
                shows: |run| matches!(run.outcome, Outcome::Failed(DataError::Completion { .. })),
            },
            Seed {
                name: "attempts_exhausted",
                input: Input {
                    lanes: 2,
                    cuts: vec![cut(15, 0, 0), cut(60, 1, 0)],
                    ..base()
                },
                shows: failed,
            },
            Seed {
                name: "lying_receiver",
                input: Input {
                    cuts: vec![cut(25, 0, 2)],
                    tamper: Some((1, u32::MAX, 0)),
                    ..base()
                },
                shows: failed,
            },
            Seed {
                name: "multi_round_robin_cut",
                input: Input {
                    lanes: 1,
                    multi: Some(0),
                    receives: mixed(20),
                    cuts: vec![cut(20, 0, 0)],
                    ..base()
                },
                shows: failed_over,
            },
            Seed {
                name: "multi_split_cut_receiver",
                input: Input {
                    lanes: 3,
                    multi: Some(3),
                    window: 16,
                    receives: mixed(20),
                    cuts: vec![cut(30, 0, 1)],
                    ..base()
                },
                shows: failed_over,
            },
            Seed {
                name: "multi_striped_acks_lost",
                input: Input {
                    lanes: 3,
                    multi: Some(1),
                    inline: false,
                    receives: mixed(20),
                    cuts: vec![cut(25, 1, 2)],
                    ..base()
                },
                shows: failed_over,
            },
            Seed {
                name: "multi_failover_off",
                input: Input {
                    lanes: 1,
                    multi: Some(1),
                    send_off: true,
                    recv_off: true,
                    cuts: vec![cut(20, 0, 0)],
                    ..base()
                },
                shows: |run| matches!(run.outcome, Outcome::Failed(DataError::Completion { .. })),
            },
            Seed {
                name: "multi_both_ports",
                input: Input {
                    lanes: 3,
                    multi: Some(0),
                    attempts: 2,
                    receives: mixed(24),
                    cuts: vec![cut(15, 0, 0), cut(60, 1, 0)],
                    ..base()
                },
                shows: |run| {
                    failed(run)
                        && [run.gave_up.0, run.gave_up.1]
                            .contains(&Some(super::FailoverError::NoSurvivingPort))
                },
            },
            Seed {
                name: "devices_cut_sender",
                input: Input {
                    devices: true,
                    cuts: vec![cut(20, 0, 0)],
                    ..base()
                },
                shows: moved_device,
            },
            Seed {
                name: "devices_cut_receiver",
                input: Input {
                    devices: true,
                    cuts: vec![cut(30, 0, 1)],
                    ..base()
                },
                shows: moved_device,
            },
            Seed {
                name: "devices_acks_lost_split_staged",
                input: Input {
                    devices: true,
                    inline: false,
                    adaptive_routing: Some(4096),
                    cuts: vec![cut(25, 0, 2)],
                    ..base()
                },
                shows: moved_device,
            },
            Seed {
                name: "devices_three_lanes_groups",
                input: Input {
                    lanes: 3,
                    devices: true,
                    third_port: true,
                    window: 16,
                    receives: mixed(20),
                    cuts: vec![cut(40, 1, 0)],
                    ..base()
                },
                shows: moved_device,
            },
            Seed {
                name: "devices_too_many_registrations",
                input: Input {
                    devices: true,
                    distinct: true,
                    window: 16,
                    receives: vec![(7, 0x2222_2222); 20],
                    cuts: vec![cut(40, 0, 1)],
                    ..base()
                },
                shows: |run| {
                    failed(run) && matches!(run.gave_up.1, Some(super::FailoverError::Rekey(_)))
                },
            },
            Seed {
                name: "multi_devices_split_cut_receiver",
                input: Input {
                    lanes: 3,
                    multi: Some(3),
                    devices: true,
                    window: 16,
                    receives: mixed(20),
                    cuts: vec![cut(30, 0, 1)],
                    ..base()
                },
                shows: moved_device,
            },
            Seed {
                name: "multi_devices_round_robin_acks_lost",
                input: Input {
                    lanes: 1,
                    multi: Some(0),
                    devices: true,
                    receives: mixed(20),
                    cuts: vec![cut(25, 0, 2)],
                    ..base()
                },
                shows: moved_device,
            },
            Seed {
                name: "multi_paired_second_cut_crosses_devices",
                input: Input {
                    lanes: 2,
                    multi: Some(1),
                    paired: true,
                    attempts: 2,
                    receives: mixed(24),
                    cuts: vec![cut(15, 0, 0), cut(70, 1, 0)],
                    ..base()
                },
                shows: moved_device,
            },
        ]
    }
}
