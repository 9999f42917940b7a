//! The core data path on the mlx5 direct path over the software mlx5 model, against the same
//! traffic through the core simulator: nanoseconds per message round trip (irecv + isend + tests
//! until both complete, delivery by the model or the simulator included).
//!
//! Run: `cargo bench --bench mlx5_model`
//!
//! The mlx5 side is the plugin's own code: `plugin/src/backend/mlx5/{nic,model}.rs` are included
//! below with `#[path]` (they depend only on rivet-core and rivet-verbs-ffi for that reason), on
//! top of `rivet_verbs_ffi::mlx5::DirectQp` and the model. Both sides pay for their device: the
//! model parses and checks every WQE twice (at the doorbell and at execution) and every
//! doorbell's stores, so the mlx5 figure is an upper bound on the plugin's own cost.
//!
//! Instructions per message with callgrind (fixed iteration count, one case, one path):
//!
//! ```text
//! cargo bench --bench mlx5_model --no-run      # prints the binary path
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.mlx5 \
//!     target/release/deps/mlx5_model-<hash> --iters 20000 --case 8B --path mlx5
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.sim \
//!     target/release/deps/mlx5_model-<hash> --iters 20000 --case 8B --path sim
//! callgrind_annotate /tmp/cg.mlx5 | head -30
//! ```
//!
//! Run each twice with different `--iters` and divide the difference in instructions by the
//! difference in messages to cancel the setup cost.

use std::hint::black_box;
use std::time::Instant;

use rivet_core::data::{
    CQ_DEPTH, MAX_RECVS, RECV_INBOUND_LEN, RECV_STAGING_LEN, RecvBuf, RecvConn, SEND_INBOUND_LEN,
    SEND_STAGING_LEN, SendBuf, SendConn,
};
use rivet_core::data::{Connection, SizesOut};
use rivet_core::nic::Nic;
use rivet_core::sim::{DataPair, SimNic, irecv_direct, isend_direct};
use rivet_verbs_ffi::mlx5::model::{Model, ModelPd, ModelQpConfig};
use rivet_verbs_ffi::sys::access;

#[allow(dead_code)]
#[path = "../plugin/src/backend/mlx5/nic.rs"]
mod nic;

#[allow(dead_code)]
#[path = "../plugin/src/backend/mlx5/model.rs"]
mod model;

use model::{ModelNic, model_nic};

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

const MAX_INLINE: usize = 64;

/// A connected sender/receiver pair on some NIC.
trait Harness {
    type N: Nic;
    fn parts(&mut self) -> (&mut SendConn, &mut RecvConn, &mut Self::N, &mut Self::N);
    fn step(&self) -> bool;
    fn run_until_idle(&self) {
        while self.step() {}
    }
    fn send_buf(&self, bytes: &[u8]) -> SendBuf;
    fn recv_buf(&self, len: usize) -> RecvBuf;
}

impl Harness for DataPair {
    type N = SimNic;
    fn parts(&mut self) -> (&mut SendConn, &mut RecvConn, &mut SimNic, &mut SimNic) {
        (
            &mut self.send,
            &mut self.recv,
            &mut self.send_nic,
            &mut self.recv_nic,
        )
    }
    fn step(&self) -> bool {
        self.fabric.step()
    }
    fn send_buf(&self, bytes: &[u8]) -> SendBuf {
        Self::send_buf(self, bytes)
    }
    fn recv_buf(&self, len: usize) -> RecvBuf {
        Self::recv_buf(self, len)
    }
}

/// The mlx5 twin of `DataPair`.
struct Mlx5Pair {
    model: Model,
    send_pd: ModelPd,
    recv_pd: ModelPd,
    send_nic: ModelNic,
    recv_nic: ModelNic,
    send: SendConn,
    recv: RecvConn,
}

const USER: u32 = access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ;

impl Mlx5Pair {
    fn new(max_inline: usize) -> Self {
        let model = Model::new();
        let (send_pd, recv_pd) = (model.pd(), model.pd());
        let config = ModelQpConfig::default();
        assert!(config.cqe_cnt as usize > CQ_DEPTH);
        let (send_qp, send_nic) = model_nic(
            &model,
            send_pd,
            SEND_INBOUND_LEN,
            SEND_STAGING_LEN,
            max_inline,
            config,
        )
        .expect("sender");
        let (recv_qp, recv_nic) = model_nic(
            &model,
            recv_pd,
            RECV_INBOUND_LEN,
            RECV_STAGING_LEN,
            max_inline,
            config,
        )
        .expect("receiver");
        model.connect(&send_qp, &recv_qp);
        let send = SendConn::new(recv_nic.regions.inbound_region());
        let recv = RecvConn::new(send_nic.regions.inbound_region());
        Self {
            model,
            send_pd,
            recv_pd,
            send_nic,
            recv_nic,
            send,
            recv,
        }
    }
}

impl Harness for Mlx5Pair {
    type N = ModelNic;
    fn parts(&mut self) -> (&mut SendConn, &mut RecvConn, &mut ModelNic, &mut ModelNic) {
        (
            &mut self.send,
            &mut self.recv,
            &mut self.send_nic,
            &mut self.recv_nic,
        )
    }
    fn step(&self) -> bool {
        self.model.step()
    }
    fn send_buf(&self, bytes: &[u8]) -> SendBuf {
        let mr = self
            .model
            .alloc_registered(self.send_pd, bytes.len().max(1), USER);
        self.model.write(mr.addr, bytes);
        SendBuf {
            addr: mr.addr,
            len: bytes.len() as u64,
            lkey: mr.lkey,
        }
    }
    fn recv_buf(&self, len: usize) -> RecvBuf {
        let mr = self.model.alloc_registered(self.recv_pd, len.max(1), USER);
        RecvBuf {
            addr: mr.addr,
            len: len as u64,
            rkey: mr.rkey,
            host: false,
        }
    }
}

/// Where a test writes a finished request's sizes, as the plugin's `test` writes them into NCCL's
/// array (`Connection::test_into`, which the plugin's single-QP path calls).
struct Sizes([i32; MAX_RECVS]);

impl SizesOut for Sizes {
    #[inline(always)]
    fn put(&mut self, index: usize, size: u32) {
        if let Some(slot) = self.0.get_mut(index) {
            *slot = i32::try_from(size).unwrap_or(i32::MAX);
        }
    }
}

struct Bufs {
    send: SendBuf,
    recv: Vec<RecvBuf>,
    tags: Vec<u32>,
}

fn bufs(h: &impl Harness, case: &Case) -> Bufs {
    Bufs {
        send: h.send_buf(&vec![0xa5; case.len]),
        recv: (0..case.group).map(|_| h.recv_buf(case.len)).collect(),
        tags: (0..case.group as u32).collect(),
    }
}

/// `iters` receives of `case.group` messages each; returns the number of messages.
fn run<H: Harness>(h: &mut H, bufs: &Bufs, iters: usize) -> usize {
    let mut sends = [None; 8];
    let mut sizes = Sizes([0; MAX_RECVS]);
    for _ in 0..iters {
        let r = {
            let (_, recv, _, recv_nic) = h.parts();
            irecv_direct(recv, recv_nic, &bufs.recv, &bufs.tags)
                .expect("irecv")
                .expect("slot free")
        };
        // The device delivers the clear-to-send write before the sender looks for it, as when
        // NCCL has posted its receives ahead of the sends (a sender that looks too early gets no
        // request and asks again: the loop below).
        h.run_until_idle();
        for (t, slot) in sends.iter_mut().enumerate().take(bufs.tags.len()) {
            let id = loop {
                let (send, _, send_nic, _) = h.parts();
                // The plugin's driver: the one-buffer path decided from the entry it read.
                let sent = isend_direct(send, send_nic, bufs.send, t as u32).expect("isend");
                if let Some(id) = sent {
                    break id;
                }
                h.step();
            };
            *slot = Some(id);
        }
        h.run_until_idle();
        for id in sends.iter_mut().take(bufs.tags.len()) {
            let id = id.take().expect("posted");
            loop {
                let (send, _, send_nic, _) = h.parts();
                if send.test_into(send_nic, id, &mut sizes).expect("send test") {
                    break;
                }
                h.step();
            }
        }
        loop {
            let (_, recv, _, recv_nic) = h.parts();
            if recv.test_into(recv_nic, r, &mut sizes).expect("recv test") {
                break;
            }
            h.step();
        }
    }
    black_box(&sizes);
    iters * bufs.tags.len()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median and minimum ns per message over 7 runs.
fn measure<H: Harness>(h: &mut H, case: &Case) -> (usize, f64, f64) {
    let b = bufs(h, case);
    let iters = if case.len > 1024 {
        2_000
    } else {
        50_000 / case.group
    };
    run(h, &b, iters / 10); // warm up
    let mut per_msg = Vec::new();
    for _ in 0..7 {
        let start = Instant::now();
        let messages = run(h, &b, iters);
        per_msg.push(start.elapsed().as_nanos() as f64 / messages as f64);
    }
    let min = per_msg.iter().copied().fold(f64::INFINITY, f64::min);
    (iters * case.group, median(per_msg), min)
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
    let path = arg("--path");
    let want = |p: &str| path.as_deref().is_none_or(|w| w == p);
    let cases = CASES
        .iter()
        .filter(|c| only.as_deref().is_none_or(|o| o == c.name));

    if let Some(iters) = fixed {
        for case in cases {
            if want("mlx5") {
                let mut h = Mlx5Pair::new(MAX_INLINE);
                let b = bufs(&h, case);
                println!("mlx5 {}: {} messages", case.name, run(&mut h, &b, iters));
            }
            if want("sim") {
                let mut h = DataPair::new(MAX_INLINE);
                let b = bufs(&h, case);
                println!("sim {}: {} messages", case.name, run(&mut h, &b, iters));
            }
        }
        return;
    }

    println!(
        "rivet-core data path, mlx5 direct path on the model vs the core simulator \
         (max_inline {MAX_INLINE}), median of 7 runs"
    );
    println!(
        "{:<8} {:<6} {:>10} {:>14} {:>14}",
        "case", "path", "messages", "ns/message", "min ns/message"
    );
    for case in cases {
        if want("mlx5") {
            let (messages, med, min) = measure(&mut Mlx5Pair::new(MAX_INLINE), case);
            println!(
                "{:<8} {:<6} {messages:>10} {med:>14.1} {min:>14.1}",
                case.name, "mlx5"
            );
        }
        if want("sim") {
            let (messages, med, min) = measure(&mut DataPair::new(MAX_INLINE), case);
            println!(
                "{:<8} {:<6} {messages:>10} {med:>14.1} {min:>14.1}",
                case.name, "sim"
            );
        }
    }
}
