//! The schedule run on a simulated group: `n` ranks in memory, one FIFO per directed connection
//! that matches a posted send with the peer's oldest posted receive (the p2p transport's
//! rendezvous), completions delivered late and in random order across connections. Every
//! operation must finish, and every rank's output must equal the reference fold.

use super::*;
use crate::collnet::layout::{fold_all, fold_owned};
use crate::collnet::reduce::{DataType, RedOp, Reduction};
use alloc::collections::VecDeque;
use alloc::vec;
use alloc::vec::Vec;

struct Rank {
    schedule: Schedule,
    input: Vec<u8>,
    output: Vec<u8>,
    slots: Vec<u8>,
    /// Completions not yet reported, per peer: (sends, receives).
    pending: Vec<(u32, u32)>,
}

/// A posted send: the source resolved at match time (RDMA reads memory when it moves).
#[derive(Clone, Copy)]
struct PostedSend(SendStep);

struct Group {
    ranks: Vec<Rank>,
    /// Per (from, to): posted sends, posted receives (at `to`).
    sends: Vec<VecDeque<PostedSend>>,
    recvs: Vec<VecDeque<RecvStep>>,
    plan: Plan,
    reduction: Reduction,
    n: u32,
}

fn lcg(state: &mut u64) -> u64 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *state >> 33
}

impl Group {
    fn new(n: u32, plan: Plan, reduction: Reduction, inputs: Vec<Vec<u8>>, out_len: usize) -> Self {
        let slot_bytes = (plan.depth * n) as usize * plan.chunk as usize;
        let ranks = (0..n)
            .zip(inputs)
            .map(|(r, input)| {
                let mut schedule = Schedule::new(n, r).unwrap();
                schedule.start(plan).unwrap();
                Rank {
                    schedule,
                    input,
                    output: vec![0xee; out_len],
                    slots: vec![0xcc; slot_bytes],
                    pending: vec![(0, 0); n as usize],
                }
            })
            .collect();
        let pairs = (n * n) as usize;
        Self {
            ranks,
            sends: (0..pairs).map(|_| VecDeque::new()).collect(),
            recvs: (0..pairs).map(|_| VecDeque::new()).collect(),
            plan,
            reduction,
            n,
        }
    }

    fn slot_range(&self, slot: Slot, len: u64) -> core::ops::Range<usize> {
        let chunk = self.plan.chunk as usize;
        let at = (slot.row as usize * self.n as usize + slot.col as usize) * chunk;
        at..at + len as usize
    }

    fn source_bytes(&self, from: u32, step: &SendStep) -> Vec<u8> {
        let rank = &self.ranks[from as usize];
        let len = step.len as usize;
        match step.src {
            Source::Input { offset } | Source::OwnInput { offset } => {
                rank.input[offset as usize..offset as usize + len].to_vec()
            }
            Source::Output { offset } => {
                rank.output[offset as usize..offset as usize + len].to_vec()
            }
        }
    }

    /// One random step; false when nothing at all could happen.
    fn step(&mut self, state: &mut u64) -> bool {
        let n = self.n;
        let mut progressed = false;
        for _ in 0..4 {
            let r = (lcg(state) % u64::from(n)) as u32;
            let p = (lcg(state) % u64::from(n)) as u32;
            if r == p {
                continue;
            }
            match lcg(state) % 5 {
                0 => {
                    if let Some(s) = self.ranks[r as usize].schedule.next_send(p) {
                        self.ranks[r as usize].schedule.sent(p);
                        self.sends[(r * n + p) as usize].push_back(PostedSend(s));
                        progressed = true;
                    }
                }
                1 => {
                    if let Some(s) = self.ranks[r as usize].schedule.next_recv(p) {
                        self.ranks[r as usize].schedule.posted(p);
                        self.recvs[(p * n + r) as usize].push_back(s);
                        progressed = true;
                    }
                }
                2 => {
                    // Match on connection r → p.
                    let pair = (r * n + p) as usize;
                    if !self.sends[pair].is_empty() && !self.recvs[pair].is_empty() {
                        let send = self.sends[pair].pop_front().unwrap().0;
                        let recv = self.recvs[pair].pop_front().unwrap();
                        assert_eq!(send.len, recv.len, "sender and receiver agree on sizes");
                        let bytes = self.source_bytes(r, &send);
                        let dst = &mut self.ranks[p as usize];
                        match recv.dst {
                            Dest::Slot(slot) => {
                                let range = {
                                    let chunk = self.plan.chunk as usize;
                                    let at = (slot.row as usize * n as usize + slot.col as usize)
                                        * chunk;
                                    at..at + bytes.len()
                                };
                                assert_eq!(slot.col, r, "a slot column names the sender");
                                dst.slots[range].copy_from_slice(&bytes);
                            }
                            Dest::Output { offset, .. } => {
                                dst.output[offset as usize..offset as usize + bytes.len()]
                                    .copy_from_slice(&bytes);
                            }
                        }
                        self.ranks[r as usize].pending[p as usize].0 += 1;
                        self.ranks[p as usize].pending[r as usize].1 += 1;
                        progressed = true;
                    }
                }
                3 => {
                    let rank = &mut self.ranks[r as usize];
                    let (s, rc) = &mut rank.pending[p as usize];
                    if *s > 0 {
                        *s -= 1;
                        rank.schedule.send_completed(p);
                        progressed = true;
                    }
                    if *rc > 0 {
                        *rc -= 1;
                        rank.schedule.recv_completed(p);
                        progressed = true;
                    }
                }
                _ => {
                    if let Some(local) = self.ranks[r as usize].schedule.next_local() {
                        self.run_local(r, local);
                        self.ranks[r as usize].schedule.done_local();
                        progressed = true;
                    }
                }
            }
        }
        progressed
    }

    fn run_local(&mut self, r: u32, local: LocalStep) {
        let n = self.n;
        let red = self.reduction;
        let plan = self.plan;
        let ranges: Vec<_> = (0..n)
            .map(|q| self.slot_range(Slot { row: 0, col: q }, plan.chunk))
            .collect();
        let rank = &mut self.ranks[r as usize];
        match local {
            LocalStep::Fold {
                row,
                offset,
                region_offset,
                len,
                ..
            } => {
                let at = if plan.kind == Kind::ReduceScatter {
                    region_offset
                } else {
                    offset
                };
                let own = rank.input[offset as usize..(offset + len) as usize].to_vec();
                let slots = rank.slots.clone();
                let dst = &mut rank.output[at as usize..(at + len) as usize];
                fold_owned(&red, n, r, dst, &own, |q| {
                    let start = (row as usize * n as usize + q as usize) * plan.chunk as usize;
                    &slots[start..start + len as usize]
                })
                .unwrap();
            }
            LocalStep::FoldAll => {
                let bytes = plan.regions.window_len() as usize;
                let slots = rank.slots.clone();
                let input = rank.input.clone();
                fold_all(&red, n, &plan.regions, &mut rank.output, |q| {
                    if q == r {
                        &input[..]
                    } else {
                        &slots[ranges[q as usize].start..ranges[q as usize].start + bytes]
                    }
                })
                .unwrap();
            }
            LocalStep::CopyOwn { offset, len } => {
                let len = len as usize;
                rank.output[offset as usize..offset as usize + len]
                    .copy_from_slice(&rank.input[..len]);
            }
        }
    }

    fn run(&mut self, seed: u64) {
        let mut state = seed;
        let mut idle = 0;
        while !self.ranks.iter().all(|r| r.schedule.is_done()) {
            if self.step(&mut state) {
                idle = 0;
            } else {
                idle += 1;
                assert!(idle < 100_000, "the group stalled: {:?}", self.plan);
            }
        }
        assert!(
            self.sends.iter().all(VecDeque::is_empty) && self.recvs.iter().all(VecDeque::is_empty)
        );
    }
}

fn random_input(state: &mut u64, dtype: DataType, bytes: usize) -> Vec<u8> {
    // Small floats so sums stay finite and the order still shows in the low bits.
    (0..bytes / dtype.size())
        .flat_map(|_| {
            let v = (lcg(state) % 2000) as f64 / 7.0 - 140.0;
            match dtype {
                DataType::Float32 => (v as f32).to_ne_bytes().to_vec(),
                DataType::Float64 => v.to_ne_bytes().to_vec(),
                DataType::Int32 => (v as i32).to_ne_bytes().to_vec(),
                DataType::Uint8 => vec![v as i64 as u8],
                DataType::Float16 => crate::collnet::float::FP16
                    .encode(v as f32)
                    .to_ne_bytes()
                    .to_vec(),
                _ => unreachable!(),
            }
        })
        .collect()
}

fn reference_allreduce(red: &Reduction, n: u32, regions: &Regions, inputs: &[Vec<u8>]) -> Vec<u8> {
    let mut out = vec![0u8; regions.window_len() as usize];
    fold_all(red, n, regions, &mut out, |q| &inputs[q as usize]).unwrap();
    out
}

#[test]
fn allreduce_matches_the_reference_fold() {
    let mut state = 99;
    for n in 2..=5u32 {
        for (dtype, op) in [
            (DataType::Float32, RedOp::Sum),
            (DataType::Float16, RedOp::Avg),
            (DataType::Int32, RedOp::Prod),
            (DataType::Uint8, RedOp::Max),
            (DataType::Float64, RedOp::Min),
        ] {
            for count in [0u64, 1, 3, 17, 1000, 4099] {
                for (kind, chunk, depth) in [
                    (Kind::Allreduce, 64, 2),
                    (Kind::Allreduce, 1024, 4),
                    (Kind::AllreduceSmall, 65536, 1),
                ] {
                    let red = Reduction::new(dtype, op);
                    let regions = Regions::Split {
                        count,
                        elem: dtype.size() as u64,
                    };
                    let bytes = regions.window_len() as usize;
                    let inputs: Vec<Vec<u8>> = (0..n)
                        .map(|_| random_input(&mut state, dtype, bytes))
                        .collect();
                    let want = reference_allreduce(&red, n, &regions, &inputs);
                    let plan = Plan {
                        kind,
                        regions,
                        chunk,
                        depth,
                    };
                    let mut group = Group::new(n, plan, red, inputs, bytes);
                    group.run(lcg(&mut state));
                    for (r, rank) in group.ranks.iter().enumerate() {
                        assert!(
                            rank.output == want,
                            "n={n} {dtype:?} {op:?} count={count} {kind:?} rank {r}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn reduce_scatter_and_allgather_windows() {
    let mut state = 5;
    for n in 2..=4u32 {
        for (bpr, w0, wlen) in [
            (100u64, 0u64, 400u64),
            (100, 152, 200),
            (64, 0, 64),
            (4096, 1000, 7000),
        ] {
            let total = bpr * u64::from(n);
            if w0 >= total {
                continue;
            }
            let wlen = wlen.min(total - w0);
            let regions = Regions::PerRank {
                bytes_per_rank: bpr,
                window_offset: w0,
                window_bytes: wlen,
            };
            let red = Reduction::new(DataType::Int32, RedOp::Sum);
            let plan = Plan {
                kind: Kind::ReduceScatter,
                regions,
                chunk: 32,
                depth: 3,
            };
            // Reduce-scatter: every rank's input is the window; rank r keeps its region.
            let inputs: Vec<Vec<u8>> = (0..n)
                .map(|_| random_input(&mut state, DataType::Int32, wlen as usize))
                .collect();
            let full = reference_allreduce_per_rank(&red, n, &regions, &inputs);
            let out_len = (0..n).map(|q| regions.region(n, q).len).max().unwrap() as usize;
            let mut group = Group::new(n, plan, red, inputs, out_len);
            group.run(lcg(&mut state));
            for r in 0..n {
                let span = regions.region(n, r);
                let got = &group.ranks[r as usize].output[..span.len as usize];
                assert_eq!(
                    got,
                    &full[span.offset as usize..(span.offset + span.len) as usize]
                );
            }
            // Allgather: every rank's input is its own part of the window.
            let parts: Vec<Vec<u8>> = (0..n)
                .map(|q| {
                    random_input(
                        &mut state,
                        DataType::Int32,
                        regions.region(n, q).len as usize,
                    )
                })
                .collect();
            let plan = Plan {
                kind: Kind::Allgather,
                regions,
                chunk: 48,
                depth: 2,
            };
            let mut group = Group::new(n, plan, red, parts.clone(), wlen as usize);
            group.run(lcg(&mut state));
            let want: Vec<u8> = parts.concat();
            for rank in &group.ranks {
                assert_eq!(rank.output, want);
            }
        }
    }
}

fn reference_allreduce_per_rank(
    red: &Reduction,
    n: u32,
    regions: &Regions,
    inputs: &[Vec<u8>],
) -> Vec<u8> {
    reference_allreduce(red, n, regions, inputs)
}

#[test]
fn flow_control_bounds_messages_in_flight() {
    let regions = Regions::Split {
        count: 10_000,
        elem: 4,
    };
    let plan = Plan {
        kind: Kind::Allreduce,
        regions,
        chunk: 256,
        depth: 3,
    };
    let mut s = Schedule::new(4, 1).unwrap();
    s.start(plan).unwrap();
    let mut posted = 0;
    while s.next_send(2).is_some() {
        s.sent(2);
        posted += 1;
    }
    assert_eq!(posted, 3, "no more than depth sends before a completion");
    s.send_completed(2);
    assert!(s.next_send(2).is_some());
    let mut recvs = 0;
    while s.next_recv(0).is_some() {
        s.posted(0);
        recvs += 1;
    }
    assert_eq!(recvs, 3);
    assert!(
        s.next_local().is_none(),
        "no fold before every peer's chunk 0 arrived"
    );
}

#[test]
fn bad_groups_and_plans_are_refused() {
    assert!(Schedule::new(1, 0).is_err());
    assert!(Schedule::new(4, 4).is_err());
    assert!(Schedule::new(MAX_RANKS + 1, 0).is_err());
    let mut s = Schedule::new(2, 0).unwrap();
    let regions = Regions::Split {
        count: 100,
        elem: 4,
    };
    assert_eq!(
        s.start(Plan {
            kind: Kind::Allreduce,
            regions,
            chunk: 0,
            depth: 1
        }),
        Err(PlanError::Geometry)
    );
    assert!(matches!(
        s.start(Plan {
            kind: Kind::AllreduceSmall,
            regions,
            chunk: 64,
            depth: 1
        }),
        Err(PlanError::TooLargeForSmall { .. })
    ));
}
