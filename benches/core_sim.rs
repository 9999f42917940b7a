//! The core data path through the simulated fabric: nanoseconds per message round trip
//! (irecv + isend + tests until both complete, delivery by the simulator included).
//!
//! Run: `cargo bench --bench core_sim`
//!
//! Instructions per message with callgrind (fixed iteration count, one case):
//!
//! ```text
//! cargo bench --bench core_sim --no-run      # prints the binary path
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.out \
//!     target/release/deps/core_sim-<hash> --iters 20000 --case 8B
//! callgrind_annotate /tmp/cg.out | head -30
//! ```
//!
//! (`RIVET_BENCH_ITERS=20000` works too.) With `--iters` the bench runs each selected case once
//! with that many messages, printing the count; run it twice with different counts and divide
//! the difference in instructions by the difference in messages to cancel the setup cost.

use std::hint::black_box;
use std::time::Instant;

use rivet_core::data::Connection;
use rivet_core::data::{Completed, RecvBuf, SendBuf};
use rivet_core::sim::DataPair;

/// One benchmark case: `group` buffers of `len` bytes per receive.
struct Case {
    name: &'static str,
    len: usize,
    group: usize,
}

const CASES: [Case; 3] = [
    Case {
        name: "8B",
        len: 8,
        group: 1,
    },
    Case {
        name: "64KiB",
        len: 64 * 1024,
        group: 1,
    },
    Case {
        name: "8x8B",
        len: 8,
        group: 8,
    },
];

struct Bufs {
    send: SendBuf,
    recv: Vec<RecvBuf>,
    tags: Vec<u32>,
}

fn setup(case: &Case) -> (DataPair, Bufs) {
    let pair = DataPair::new(64);
    let send = pair.send_buf(&vec![0xa5; case.len]);
    let recv = (0..case.group).map(|_| pair.recv_buf(case.len)).collect();
    let tags = (0..case.group as u32).collect();
    (pair, Bufs { send, recv, tags })
}

/// `iters` receives of `case.group` messages each; returns the number of messages.
fn run(p: &mut DataPair, bufs: &Bufs, iters: usize) -> usize {
    let mut sends = [None; 8];
    for _ in 0..iters {
        let r = p
            .recv
            .irecv(&mut p.recv_nic, &bufs.recv, &bufs.tags)
            .expect("irecv")
            .expect("slot free");
        for (t, slot) in sends.iter_mut().enumerate().take(bufs.tags.len()) {
            let id = loop {
                if let Some(id) = p
                    .send
                    .isend(&mut p.send_nic, bufs.send, t as u32)
                    .expect("isend")
                {
                    break id;
                }
                p.fabric.step();
            };
            *slot = Some(id);
        }
        p.fabric.run_until_idle();
        for id in sends.iter_mut().take(bufs.tags.len()) {
            let id = id.take().expect("posted");
            while p.send.test(&mut p.send_nic, id).expect("send test") == Completed::Pending {
                p.fabric.step();
            }
        }
        loop {
            match p.recv.test(&mut p.recv_nic, r).expect("recv test") {
                Completed::Pending => {
                    p.fabric.step();
                }
                done => {
                    black_box(done);
                    break;
                }
            }
        }
    }
    iters * bufs.tags.len()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let fixed = arg("--iters")
        .or_else(|| std::env::var("RIVET_BENCH_ITERS").ok())
        .and_then(|v| v.parse::<usize>().ok());
    let only = arg("--case");
    let cases = CASES
        .iter()
        .filter(|c| only.as_deref().is_none_or(|o| o == c.name));

    if let Some(iters) = fixed {
        for case in cases {
            let (mut p, bufs) = setup(case);
            let messages = run(&mut p, &bufs, iters);
            println!("{}: {messages} messages", case.name);
        }
        return;
    }

    println!("rivet-core data path through the simulator (max_inline 64), median of 7 runs");
    println!(
        "{:<8} {:>10} {:>14} {:>14}",
        "case", "messages", "ns/message", "min ns/message"
    );
    for case in cases {
        let (mut p, bufs) = setup(case);
        // Enough messages for ~50 ms per run on a fast machine.
        let iters = if case.len > 1024 {
            2_000
        } else {
            50_000 / case.group
        };
        run(&mut p, &bufs, iters / 10); // warm up
        let mut per_msg = Vec::new();
        for _ in 0..7 {
            let start = Instant::now();
            let messages = run(&mut p, &bufs, iters);
            per_msg.push(start.elapsed().as_nanos() as f64 / messages as f64);
        }
        let min = per_msg.iter().copied().fold(f64::INFINITY, f64::min);
        println!(
            "{:<8} {:>10} {:>14.1} {:>14.1}",
            case.name,
            iters * case.group,
            median(per_msg),
            min
        );
    }
}
