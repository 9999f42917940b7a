//! The seeds of `eager_ops` (`fuzz/seeds/eager_ops/`), written as scenarios, each with what its
//! run must show (so a seed keeps exercising what it is named for). `tests/replay.rs` checks that
//! every committed seed is [`Input::encode`] of its scenario, that it decodes back to it, and
//! that its run shows what it claims; `RIVET_WRITE_SEEDS=1 cargo test -p rivet-fuzz --test replay
//! eager_ops` rewrites them.

use super::{BufSpec, Capacity, Input, Op, Outcome, Size, THRESHOLDS};

/// A scenario: its name, its input, and what a run of it must show.
#[derive(Debug)]
pub struct Seed {
    pub name: &'static str,
    pub input: Input,
    pub shows: fn(&Outcome) -> bool,
}

/// Index of `threshold` in [`THRESHOLDS`].
fn threshold(threshold: u64) -> u8 {
    THRESHOLDS
        .iter()
        .position(|&t| t == threshold)
        .expect("a listed threshold") as u8
}

/// Index of `max_inline` in [`super::MAX_INLINES`].
fn inline(max_inline: usize) -> u8 {
    super::MAX_INLINES
        .iter()
        .position(|&m| m == max_inline)
        .expect("a listed inline limit") as u8
}

fn input(max_inline: usize, eager_threshold: u64, ops: Vec<Op>) -> Input {
    Input {
        max_inline: inline(max_inline),
        threshold: threshold(eager_threshold),
        ops,
    }
}

/// A send from host memory; `tag` chooses among the tags the stream allows.
fn send(size: Size, tag: u8) -> Op {
    Op::Send {
        size,
        tag,
        gpu: false,
    }
}

fn host(capacity: Capacity) -> BufSpec {
    BufSpec {
        capacity,
        gpu: false,
        tag: 0,
    }
}

fn gpu(capacity: Capacity) -> BufSpec {
    BufSpec {
        capacity,
        gpu: true,
        tag: 0,
    }
}

fn recv(capacity: Capacity) -> Op {
    Op::Recv(host(capacity))
}

/// Deliver, then test the oldest receive and the oldest send.
fn settle() -> [Op; 3] {
    [Op::Deliver, Op::TestRecv, Op::TestSend]
}

/// Every size sent before its receive, then received and tested.
fn every_size_first() -> Vec<Op> {
    let sizes = [
        Size::Empty,
        Size::One,
        Size::InlineMost,
        Size::InlinePast,
        Size::Mid,
        Size::BelowThreshold,
        Size::Threshold,
        Size::AboveThreshold,
        Size::Page,
        Size::Large,
    ];
    let mut ops = Vec::new();
    for size in sizes {
        ops.extend([send(size, 0), Op::Deliver, recv(Capacity::Fits)]);
        // A send above the threshold waited: its retry goes now that the entry is in.
        ops.extend([Op::Deliver, send(Size::Empty, 0)]);
        ops.extend(settle());
    }
    ops
}

/// The seeds: scenarios and what each must show.
pub fn seeds() -> Vec<Seed> {
    let mut seeds = Vec::new();
    let mut add = |name, input, shows| seeds.push(Seed { name, input, shows });

    add(
        "send_before_recv",
        input(
            64,
            8192,
            vec![
                send(Size::Mid, 1),
                Op::Deliver,
                Op::TestSend,
                recv(Capacity::Fits),
                Op::TestRecv,
                Op::Deliver,
                Op::TestSend,
                Op::TestRecv,
            ],
        ),
        |o| o.eager_arrivals == 1,
    );
    add(
        "recv_before_send",
        input(
            64,
            8192,
            vec![
                recv(Capacity::Fits),
                Op::Deliver,
                send(Size::Mid, 1),
                Op::Step(0),
                Op::TestRecv,
                Op::Deliver,
                Op::TestRecv,
                Op::TestSend,
            ],
        ),
        |o| o.eager_arrivals == 0 && o.send_retries == 0,
    );
    add(
        "recv_posted_not_landed",
        // The receive's entry is still on its way when the send comes: it goes eager and is
        // taken at once, the receive being posted.
        input(
            256,
            4096,
            vec![
                recv(Capacity::Fits),
                send(Size::InlineMost, 0),
                Op::Deliver,
                Op::TestRecv,
                Op::TestSend,
            ],
        ),
        |o| o.eager_arrivals == 1,
    );
    add(
        "every_size_inline_none",
        input(0, 8192, every_size_first()),
        |o| o.eager_arrivals >= 7,
    );
    add(
        "every_size_inline_16",
        input(16, 4096, every_size_first()),
        |o| o.eager_arrivals >= 7,
    );
    add(
        "every_size_inline_256",
        input(256, 64, every_size_first()),
        |o| o.eager_arrivals >= 5,
    );
    add(
        "every_size_largest_threshold",
        input(
            64,
            rivet_core::data::eager::EAGER_MAX as u64,
            every_size_first(),
        ),
        |o| o.eager_arrivals >= 8,
    );
    add(
        "gpu_recv_bounce",
        // The message waits for a GPU buffer: bounced, sent again the clear-to-send way. The
        // GPU entry turns eager off: the next send waits for its entry, until entries the
        // general path reads (an empty send's) offer eager again.
        input(
            64,
            8192,
            vec![
                send(Size::Mid, 0),
                Op::Deliver,
                Op::Recv(gpu(Capacity::Fits)),
                Op::Deliver,
                Op::TestSend,
                Op::Deliver,
                Op::TestRecv,
                Op::TestSend,
                send(Size::Mid, 0),
                Op::Deliver,
                Op::Recv(gpu(Capacity::Fits)),
                Op::Deliver,
                send(Size::Mid, 0),
                Op::Deliver,
                Op::TestRecv,
                Op::TestSend,
                recv(Capacity::Fits),
                Op::Deliver,
                send(Size::Empty, 0),
                Op::Deliver,
                Op::TestRecv,
                Op::TestSend,
                send(Size::One, 0),
                Op::Deliver,
                recv(Capacity::Fits),
                Op::Deliver,
                Op::TestRecv,
                Op::TestSend,
            ],
        ),
        |o| o.eager_arrivals == 2 && o.send_retries >= 1,
    );
    add(
        "gpu_recv_bounces_the_epoch",
        // Four eager sends; the first one's receive is GPU memory: all four bounce (the rest of
        // the epoch), then go the clear-to-send way into host receives.
        input(
            64,
            8192,
            vec![
                send(Size::One, 0),
                send(Size::Mid, 1),
                send(Size::InlineMost, 2),
                send(Size::Empty, 3),
                Op::Deliver,
                Op::Recv(gpu(Capacity::Fits)),
                recv(Capacity::Fits),
                Op::Step(2),
                recv(Capacity::Mid),
                recv(Capacity::Fits),
                Op::Deliver,
                Op::TestSend,
                Op::Deliver,
                Op::TestSend,
                Op::DrainSend,
                Op::Deliver,
                Op::TestRecv,
                Op::TestRecv,
                Op::TestRecv,
                Op::TestRecv,
                Op::TestSend,
                Op::TestSend,
                // Sending them again read the host receives' entries: eager again.
                recv(Capacity::Fits),
                Op::Deliver,
                send(Size::Mid, 0),
                Op::Deliver,
                Op::TestRecv,
                Op::TestSend,
                send(Size::One, 0),
                Op::Deliver,
                recv(Capacity::Fits),
                Op::Deliver,
                Op::TestRecv,
                Op::TestSend,
            ],
        ),
        |o| o.eager_arrivals == 5,
    );
    add(
        "group_recv_bounce",
        input(
            64,
            8192,
            vec![
                send(Size::Mid, 1),
                send(Size::One, 2),
                Op::Deliver,
                Op::Group(vec![
                    BufSpec {
                        tag: 1,
                        ..host(Capacity::Fits)
                    },
                    host(Capacity::Mid),
                ]),
                Op::Deliver,
                Op::TestSend,
                Op::Deliver,
                Op::TestRecv,
                Op::TestSend,
                Op::TestSend,
            ],
        ),
        |o| o.eager_arrivals == 2,
    );
    add(
        "group_recv_partly_sent",
        // Three eager sends tagged a, b, a: the group posted for them takes a and b and ends
        // there (the second a fills the next receive); the next group of four gets its sends
        // after it is posted, out of its buffers' order.
        input(
            64,
            4096,
            vec![
                send(Size::One, 0),
                send(Size::Mid, 1),
                send(Size::Empty, 0),
                Op::Deliver,
                Op::Group(vec![
                    host(Capacity::Fits),
                    host(Capacity::Fits),
                    host(Capacity::Fits),
                ]),
                recv(Capacity::Fits),
                Op::Deliver,
                Op::TestSend,
                Op::Group(vec![
                    host(Capacity::Fits),
                    gpu(Capacity::Fits),
                    host(Capacity::Page),
                    host(Capacity::Mid),
                ]),
                send(Size::Mid, 3),
                send(Size::One, 1),
                Op::Deliver,
                Op::TestSend,
                send(Size::Page, 0),
                send(Size::Empty, 0),
                Op::Deliver,
                Op::TestRecv,
                Op::TestRecv,
                Op::TestRecv,
                Op::TestSend,
            ],
        ),
        |o| o.eager_arrivals >= 3,
    );
    let mut credits = Vec::new();
    for i in 0..20u8 {
        credits.push(send(Size::One, i % 4));
    }
    credits.push(Op::Deliver);
    for _ in 0..8 {
        credits.push(recv(Capacity::Fits));
    }
    credits.extend([Op::Deliver, Op::TestRecv, Op::TestRecv, Op::DrainRecv]);
    for _ in 0..8 {
        credits.extend([Op::TestRecv, Op::TestSend]);
    }
    credits.push(Op::Deliver);
    for _ in 0..12 {
        credits.extend([recv(Capacity::Fits), send(Size::Mid, 0), Op::Deliver]);
        credits.extend([Op::TestRecv, Op::TestSend, Op::TestSend]);
    }
    add(
        "credits_exhausted",
        // More sends than the ring holds before any receive: the 17th waits for credits or its
        // entry.
        input(64, 8192, credits),
        |o| o.eager_arrivals >= 16 && o.send_retries >= 1,
    );
    let mut stream = Vec::new();
    for i in 0..48u8 {
        stream.extend([send(Size::InlineMost, 0), Op::Step(i % 3)]);
        if i % 2 == 1 {
            stream.extend([recv(Capacity::Fits), recv(Capacity::Fits)]);
            stream.extend([Op::Step(i % 5), Op::TestRecv, Op::TestSend, Op::TestRecv]);
            stream.push(Op::TestSend);
        }
    }
    add(
        "credits_returned_in_batches",
        // A stream three rings long with sends ahead of receives: credits come back in batches.
        input(256, 4096, stream),
        |o| o.eager_arrivals >= 16,
    );
    add(
        "size_mismatch_eager",
        // An eager send larger than its host buffer: bounced, then refused on both sides;
        // the connection goes on eager.
        input(
            64,
            8192,
            vec![
                send(Size::Mid, 0),
                Op::Deliver,
                recv(Capacity::InlineMost),
                Op::Deliver,
                Op::TestSend,
                Op::Deliver,
                Op::TestRecv,
                Op::TestSend,
                send(Size::InlineMost, 0),
                Op::Deliver,
                recv(Capacity::InlineMost),
                Op::Deliver,
                Op::TestRecv,
                Op::TestSend,
            ],
        ),
        |o| o.size_mismatches == 1 && o.eager_arrivals == 2,
    );
    add(
        "size_mismatch_posted_first",
        input(
            16,
            64,
            vec![
                recv(Capacity::One),
                recv(Capacity::Empty),
                Op::Deliver,
                send(Size::Threshold, 0),
                send(Size::One, 0),
                Op::Deliver,
                Op::TestRecv,
                Op::TestSend,
                Op::TestRecv,
                Op::TestSend,
            ],
        ),
        |o| o.size_mismatches == 2,
    );
    add(
        "size_mismatch_in_group",
        input(
            64,
            8192,
            vec![
                send(Size::Page, 0),
                send(Size::Mid, 1),
                Op::Deliver,
                Op::Group(vec![host(Capacity::Mid), host(Capacity::Fits)]),
                Op::Deliver,
                Op::TestSend,
                Op::Deliver,
                Op::TestRecv,
                Op::TestSend,
                Op::TestSend,
            ],
        ),
        |o| o.size_mismatches == 1,
    );
    add(
        "threshold_zero",
        // Eager off: every send waits for its entry, the empty ones too (handed their bytes,
        // as the plugin does).
        input(
            64,
            0,
            vec![
                send(Size::Empty, 0),
                send(Size::Empty, 0),
                Op::Deliver,
                recv(Capacity::Fits),
                Op::Deliver,
                send(Size::Empty, 0),
                send(Size::One, 0),
                recv(Capacity::Fits),
                Op::Deliver,
                send(Size::One, 0),
                Op::Deliver,
                Op::TestRecv,
                Op::TestRecv,
                Op::TestSend,
                Op::TestSend,
            ],
        ),
        |o| o.eager_arrivals == 0 && o.send_retries >= 1,
    );
    add(
        "threshold_one",
        input(
            16,
            1,
            vec![
                send(Size::Empty, 0),
                send(Size::One, 0),
                send(Size::AboveThreshold, 0),
                Op::Deliver,
                recv(Capacity::Fits),
                recv(Capacity::One),
                recv(Capacity::One),
                Op::Deliver,
                send(Size::AboveThreshold, 0),
                Op::Deliver,
                Op::TestRecv,
                Op::TestRecv,
                Op::TestRecv,
                Op::TestSend,
                Op::TestSend,
                Op::TestSend,
            ],
        ),
        |o| o.eager_arrivals == 2 && o.size_mismatches == 1,
    );
    add(
        "gpu_send_waits",
        // A send from GPU memory is never copied: it waits for its entry.
        input(
            64,
            8192,
            vec![
                Op::Send {
                    size: Size::Mid,
                    tag: 0,
                    gpu: true,
                },
                Op::Deliver,
                recv(Capacity::Fits),
                Op::Deliver,
                send(Size::Empty, 0),
                Op::Deliver,
                Op::TestRecv,
                Op::TestSend,
            ],
        ),
        |o| o.eager_arrivals == 0 && o.send_retries == 1,
    );
    add(
        "drains_count_unconfirmed",
        input(
            64,
            8192,
            vec![
                send(Size::One, 0),
                send(Size::One, 1),
                Op::Deliver,
                Op::DrainSend,
                Op::DrainRecv,
                recv(Capacity::Fits),
                Op::DrainRecv,
                Op::DrainSend,
                Op::Deliver,
                Op::DrainSend,
                recv(Capacity::Fits),
                Op::Step(1),
                Op::DrainRecv,
                Op::DrainSend,
                Op::Deliver,
                Op::DrainSend,
                Op::TestRecv,
                Op::TestRecv,
                Op::TestSend,
                Op::TestSend,
            ],
        ),
        |o| o.eager_arrivals == 2,
    );
    add(
        "stepped_interleaving",
        // Single steps between every call: entries and messages cross on the wire.
        input(
            64,
            8192,
            vec![
                send(Size::Mid, 2),
                Op::Step(0),
                recv(Capacity::Fits),
                send(Size::One, 1),
                Op::Step(0),
                Op::TestRecv,
                recv(Capacity::Fits),
                Op::Step(0),
                Op::TestSend,
                send(Size::BelowThreshold, 0),
                Op::Step(1),
                Op::TestRecv,
                recv(Capacity::Threshold),
                Op::Step(0),
                Op::TestSend,
                Op::Step(0),
                Op::TestRecv,
                Op::TestSend,
                Op::TestRecv,
            ],
        ),
        |o| o.eager_arrivals >= 1,
    );
    seeds
}
