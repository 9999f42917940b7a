//! The seeds of `rma_ops` (`fuzz/seeds/rma_ops/`), written as scenarios and encoded into the
//! bytes `arbitrary` decodes them from. `tests/replay.rs` checks that every committed seed is
//! what [`encode`] makes of its scenario and that it decodes back to it;
//! `RIVET_WRITE_SEEDS=1 cargo test -p rivet-fuzz --test replay rma_ops` rewrites them.
//!
//! The encoding is `arbitrary` 1.x's: integers little-endian, `bool` one byte (bit 0), `Option`
//! a `bool` then the value, a `Vec` a `true` byte before each element and a `false` after the
//! last, an enum's variant `v` of `n` a `u32` `x` with `x * n >> 32 == v`.

use super::{Amount, Base, EntrySpec, Handle, Input, Len, Op, PutArgs, Status, WindowSpec};

#[derive(Default)]
struct Enc(Vec<u8>);

impl Enc {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend(v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend(v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend(v.to_le_bytes());
    }
    fn bool(&mut self, v: bool) {
        self.0.push(u8::from(v));
    }
    fn variant(&mut self, v: u32, n: u32) {
        assert!(v < n);
        let x = (u64::from(v) << 32).div_ceil(u64::from(n));
        self.u32(x as u32);
    }
    fn option<T>(&mut self, v: Option<&T>, f: impl Fn(&mut Self, &T)) {
        self.bool(v.is_some());
        if let Some(v) = v {
            f(self, v);
        }
    }
    fn vec<T>(&mut self, items: &[T], f: impl Fn(&mut Self, &T)) {
        for item in items {
            self.bool(true);
            f(self, item);
        }
        self.bool(false);
    }

    fn amount(&mut self, a: &Amount) {
        match *a {
            Amount::Zero => self.variant(0, 6),
            Amount::Small(k) => {
                self.variant(1, 6);
                self.u8(k);
            }
            Amount::Frac(k) => {
                self.variant(2, 6);
                self.u8(k);
            }
            Amount::FromEnd(k) => {
                self.variant(3, 6);
                self.u16(k);
            }
            Amount::Gib(k, r) => {
                self.variant(4, 6);
                self.u8(k);
                self.u16(r);
            }
            Amount::Raw(x) => {
                self.variant(5, 6);
                self.u64(x);
            }
        }
    }

    fn entry(&mut self, e: &EntrySpec) {
        match e.base {
            Base::Page(k) => {
                self.variant(0, 3);
                self.u16(k);
            }
            Base::NearTop(k) => {
                self.variant(1, 3);
                self.u32(k);
            }
            Base::Raw(b) => {
                self.variant(2, 3);
                self.u64(b);
            }
        }
        match e.len {
            Len::Bytes(n) => {
                self.variant(0, 3);
                self.u16(n);
            }
            Len::Gib(k, r) => {
                self.variant(1, 3);
                self.u8(k);
                self.u32(r);
            }
            Len::Raw(n) => {
                self.variant(2, 3);
                self.u64(n);
            }
        }
        self.u32(e.rkey);
    }

    fn window(&mut self, w: &WindowSpec) {
        self.bool(w.host);
        self.bool(w.ragged);
        self.u32(w.lkey);
        self.vec(&w.entries, Self::entry);
    }

    fn status(&mut self, s: &Status) {
        let v = match s {
            Status::Success => 0,
            Status::FlushErr => 1,
            Status::RetryExc => 2,
            Status::RemAccess => 3,
            Status::LocProt => 4,
            Status::RnrRetry => 5,
            Status::General => 6,
            Status::Raw(_) => 7,
        };
        self.variant(v, 8);
        if let Status::Raw(x) = *s {
            self.u32(x);
        }
    }

    fn handle(&mut self, h: &Handle) {
        match *h {
            Handle::Live(k) => {
                self.variant(0, 3);
                self.u8(k);
            }
            Handle::Stale(k) => {
                self.variant(1, 3);
                self.u8(k);
            }
            Handle::Bogus(b) => {
                self.variant(2, 3);
                self.u32(b);
            }
        }
    }

    fn post_fails(&mut self, p: &Option<u8>) {
        self.option(p.as_ref(), |e, v| e.u8(*v));
    }

    fn op(&mut self, op: &Op) {
        const N: u32 = 12;
        match op {
            Op::Put {
                ctx,
                target,
                src,
                src_off,
                size,
                dst,
                dst_off,
                post_fails,
            } => {
                self.variant(0, N);
                self.u8(*ctx);
                self.u8(*target);
                self.u8(*src);
                self.amount(src_off);
                self.amount(size);
                self.u8(*dst);
                self.amount(dst_off);
                self.post_fails(post_fails);
            }
            Op::PutSignal {
                ctx,
                target,
                put,
                size,
                signal,
                signal_off,
                op,
                value,
                post_fails,
            } => {
                self.variant(1, N);
                self.u8(*ctx);
                self.u8(*target);
                self.option(put.as_ref(), |e, p: &PutArgs| {
                    e.u8(p.src);
                    e.amount(&p.src_off);
                    e.u8(p.dst);
                    e.amount(&p.dst_off);
                });
                self.amount(size);
                self.u8(*signal);
                self.amount(signal_off);
                self.u8(*op);
                self.u64(*value);
                self.post_fails(post_fails);
            }
            Op::Get {
                ctx,
                target,
                remote,
                remote_off,
                size,
                local,
                local_off,
                post_fails,
            } => {
                self.variant(2, N);
                self.u8(*ctx);
                self.u8(*target);
                self.u8(*remote);
                self.amount(remote_off);
                self.amount(size);
                self.u8(*local);
                self.amount(local_off);
                self.post_fails(post_fails);
            }
            Op::Flush {
                ctx,
                window,
                post_fails,
            } => {
                self.variant(3, N);
                self.u8(*ctx);
                self.u8(*window);
                self.post_fails(post_fails);
            }
            Op::Repeat(k) => {
                self.variant(4, N);
                self.u8(*k);
            }
            Op::Complete {
                lane,
                count,
                status,
            } => {
                self.variant(5, N);
                self.u8(*lane);
                self.u8(*count);
                self.status(status);
            }
            Op::CompleteAll(order) => {
                self.variant(6, N);
                self.u8(*order);
            }
            Op::Test(h) => {
                self.variant(7, N);
                self.handle(h);
            }
            Op::TestAll => self.variant(8, N),
            Op::Spurious {
                handle,
                piece,
                high,
                status,
            } => {
                self.variant(9, N);
                self.handle(handle);
                self.bool(*piece);
                self.bool(*high);
                self.status(status);
            }
            Op::AbandonStale { handle, errno } => {
                self.variant(10, N);
                self.handle(handle);
                self.u32(*errno as u32);
            }
            Op::BeginBadLane {
                past,
                work_requests,
            } => {
                self.variant(11, N);
                self.u16(*past);
                self.u32(*work_requests);
            }
        }
    }
}

/// The bytes `arbitrary` decodes into `input`.
pub fn encode(input: &Input) -> Vec<u8> {
    let mut e = Enc::default();
    e.u8(input.nranks);
    e.u8(input.rank);
    e.u8(input.contexts);
    e.u8(input.stride);
    e.u16(input.cq_depth);
    e.u8(input.max_inline);
    e.vec(&input.windows, Enc::window);
    e.vec(&input.ops, Enc::op);
    e.0
}

fn entry(page: u16, len: u16, rkey: u32) -> EntrySpec {
    EntrySpec {
        base: Base::Page(page),
        len: Len::Bytes(len),
        rkey,
    }
}

/// A window of `len` bytes per rank at pages 16, 32, ... (keys 0x100 + rank).
fn uniform(host: bool, len: u16, ranks: u16) -> WindowSpec {
    WindowSpec {
        host,
        ragged: false,
        lkey: 7,
        entries: (0..ranks)
            .map(|r| entry(16 * (r + 1), len, 0x100 + u32::from(r)))
            .collect(),
    }
}

fn put(ctx: u8, target: u8, size: Amount) -> Op {
    Op::Put {
        ctx,
        target,
        src: 0,
        src_off: Amount::Zero,
        size,
        dst: 0,
        dst_off: Amount::Zero,
        post_fails: None,
    }
}

fn get(ctx: u8, target: u8, size: Amount) -> Op {
    Op::Get {
        ctx,
        target,
        remote: 0,
        remote_off: Amount::Zero,
        size,
        local: 0,
        local_off: Amount::Small(8),
        post_fails: None,
    }
}

fn signal(ctx: u8, target: u8, put: Option<PutArgs>, size: Amount, off: Amount, op: u8) -> Op {
    Op::PutSignal {
        ctx,
        target,
        put,
        size,
        signal: 0,
        signal_off: off,
        op,
        value: 5,
        post_fails: None,
    }
}

fn input(nranks: u8, rank: u8, contexts: u8, stride: u8, cq_depth: u16) -> Input {
    // nranks, contexts and stride are encoded as `1 + x % n`.
    Input {
        nranks: nranks - 1,
        rank,
        contexts: contexts - 1,
        stride: stride - 1,
        cq_depth,
        max_inline: 1, // 64 bytes
        windows: vec![uniform(true, 4096, nranks.into())],
        ops: Vec::new(),
    }
}

/// The seeds: name and scenario.
pub fn seeds() -> Vec<(&'static str, Input)> {
    let both = Some(PutArgs {
        src: 0,
        src_off: Amount::Small(16),
        dst: 0,
        dst_off: Amount::Small(64),
    });

    // Every operation once, all succeed: an inline put, a put of device memory, a get, a put
    // with signal (INC and ADD), a flush of device memory; pending until completed.
    let mut all_ok = input(4, 1, 2, 1, 64);
    all_ok.windows.push(uniform(false, 4096, 4));
    all_ok.ops = vec![
        put(0, 2, Amount::Small(16)),
        Op::Put {
            ctx: 1,
            target: 3,
            src: 1,
            src_off: Amount::Frac(128),
            size: Amount::Small(200),
            dst: 1,
            dst_off: Amount::FromEnd(200),
            post_fails: None,
        },
        get(0, 0, Amount::Small(32)),
        signal(1, 2, both, Amount::Small(8), Amount::Small(0), 0),
        signal(0, 3, None, Amount::Zero, Amount::Small(8), 1),
        Op::Flush {
            ctx: 0,
            window: 1,
            post_fails: None,
        },
        Op::Flush {
            ctx: 1,
            window: 0,
            post_fails: None,
        },
        Op::TestAll,
        Op::CompleteAll(3),
        Op::TestAll,
    ];

    // A lane fails: its requests fail at once, later operations on it are refused, the other
    // lane keeps working, the flushed completions free the completion queue.
    let mut lane_failure = input(4, 0, 1, 1, 32);
    lane_failure.ops = vec![
        put(0, 2, Amount::Small(16)),
        Op::Repeat(2),
        put(0, 3, Amount::Small(16)),
        Op::Complete {
            lane: 0,
            count: 0,
            status: Status::RetryExc,
        },
        Op::Test(Handle::Live(1)),
        put(0, 2, Amount::Small(16)),
        Op::Test(Handle::Live(0)),
        Op::Complete {
            lane: 0,
            count: 7,
            status: Status::Success,
        },
        Op::TestAll,
        Op::CompleteAll(0),
        Op::TestAll,
    ];

    // Transfers of several work requests (1 GiB each); an unsignaled piece fails.
    let mut big = input(2, 0, 1, 1, 16);
    big.windows = vec![WindowSpec {
        host: false,
        ragged: false,
        lkey: 9,
        entries: vec![EntrySpec {
            base: Base::Page(1),
            len: Len::Gib(4, 0),
            rkey: 3,
        }],
    }];
    big.ops = vec![
        put(0, 1, Amount::Gib(2, 5)),
        get(0, 1, Amount::Gib(1, 0)),
        signal(
            0,
            1,
            Some(PutArgs {
                src: 0,
                src_off: Amount::Zero,
                dst: 0,
                dst_off: Amount::Gib(1, 0),
            }),
            Amount::Gib(3, 0),
            Amount::Small(0),
            1,
        ),
        Op::Complete {
            lane: 0,
            count: 0,
            status: Status::Success,
        },
        Op::Complete {
            lane: 0,
            count: 0,
            status: Status::LocProt,
        },
        Op::TestAll,
        Op::CompleteAll(1),
        Op::TestAll,
    ];

    // Refusals: lanes the stride leaves out, bad contexts and ranks, signals misaligned, out of
    // the window or with a bad operation, a window with too few entries.
    let mut refusals = input(8, 2, 2, 4, 64);
    refusals.windows.push(WindowSpec {
        host: false,
        ragged: true,
        lkey: 1,
        entries: vec![entry(1, 64, 1), entry(2, 64, 2)],
    });
    refusals.ops = vec![
        put(0, 3, Amount::Small(8)),
        put(0, 6, Amount::Small(8)),
        put(2, 2, Amount::Small(8)),
        put(0xF0, 2, Amount::Small(8)),
        put(0, 8, Amount::Small(8)),
        put(0, 0xF0, Amount::Small(8)),
        put(1, 2, Amount::Raw(4097)),
        signal(0, 6, None, Amount::Zero, Amount::Small(4), 0),
        signal(0, 6, None, Amount::Zero, Amount::FromEnd(7), 0),
        signal(0, 6, None, Amount::Zero, Amount::Small(0), 3),
        Op::Flush {
            ctx: 0,
            window: 1,
            post_fails: None,
        },
        Op::Get {
            ctx: 0,
            target: 6,
            remote: 1,
            remote_off: Amount::Zero,
            size: Amount::Small(1),
            local: 0,
            local_off: Amount::Zero,
            post_fails: None,
        },
        Op::CompleteAll(0),
        Op::TestAll,
    ];

    // The limits: 256 requests on a lane, then the completion queue's depth.
    let mut limits = input(2, 0, 1, 1, 300);
    limits.ops = vec![
        put(0, 1, Amount::Small(1)),
        Op::Repeat(63),
        Op::Repeat(63),
        Op::Repeat(63),
        Op::Repeat(63),
        put(0, 0, Amount::Small(1)),
        Op::Repeat(63),
        put(0, 0, Amount::Zero),
        Op::Complete {
            lane: 0,
            count: 7,
            status: Status::Success,
        },
        put(0, 1, Amount::Small(1)),
        Op::CompleteAll(7),
        Op::TestAll,
    ];

    // Handles and completions that name no request: stale, bogus, after a failed post.
    let mut strays = input(3, 2, 1, 1, 16);
    strays.ops = vec![
        put(0, 1, Amount::Small(4)),
        Op::CompleteAll(0),
        Op::TestAll,
        Op::Test(Handle::Stale(0)),
        Op::Spurious {
            handle: Handle::Stale(0),
            piece: false,
            high: false,
            status: Status::RetryExc,
        },
        Op::Spurious {
            handle: Handle::Bogus(0x0010_0005),
            piece: true,
            high: false,
            status: Status::General,
        },
        Op::Spurious {
            handle: Handle::Bogus(0x0010_0000),
            piece: false,
            high: true,
            status: Status::General,
        },
        Op::AbandonStale {
            handle: Handle::Stale(0),
            errno: 5,
        },
        Op::Test(Handle::Bogus(0xFFFF_FFFF)),
        Op::BeginBadLane {
            past: 0,
            work_requests: 1,
        },
        Op::Put {
            ctx: 0,
            target: 0,
            src: 0,
            src_off: Amount::Zero,
            size: Amount::Small(100),
            dst: 0,
            dst_off: Amount::Zero,
            post_fails: Some(12),
        },
        Op::Test(Handle::Stale(1)),
        put(0, 0, Amount::Small(100)),
        Op::TestAll,
        Op::CompleteAll(0),
        Op::TestAll,
    ];

    // The first failure of a lane is a flush (the queue pair was moved to error): it is the
    // lane's cause; two lanes fail with different causes, in both contexts.
    let mut flush_first = input(3, 0, 2, 1, 64);
    flush_first.ops = vec![
        put(0, 1, Amount::Small(4)),
        put(1, 1, Amount::Small(4)),
        put(0, 2, Amount::Small(4)),
        Op::Repeat(1),
        Op::Complete {
            lane: 0,
            count: 0,
            status: Status::FlushErr,
        },
        Op::Complete {
            lane: 1,
            count: 0,
            status: Status::RemAccess,
        },
        Op::TestAll,
        Op::CompleteAll(9),
        Op::TestAll,
        put(1, 2, Amount::Small(4)),
        Op::TestAll,
    ];

    // A peer's window entry near the top of the address space (finding 1): its ranges that do
    // not wrap are accepted and lie inside it.
    let mut near_top = input(2, 0, 1, 1, 16);
    near_top.windows = vec![WindowSpec {
        host: true,
        ragged: false,
        lkey: 2,
        entries: vec![
            entry(1, 4096, 1),
            EntrySpec {
                base: Base::NearTop(4095),
                len: Len::Bytes(4096),
                rkey: 2,
            },
        ],
    }];
    near_top.ops = vec![
        put(0, 1, Amount::Small(64)),
        signal(0, 1, None, Amount::Zero, Amount::FromEnd(8), 1),
        get(0, 1, Amount::FromEnd(8)),
        Op::CompleteAll(0),
        Op::TestAll,
    ];

    vec![
        ("all_ok", all_ok),
        ("lane_failure", lane_failure),
        ("big_transfers", big),
        ("refusals", refusals),
        ("limits", limits),
        ("strays", strays),
        ("flush_first", flush_first),
        ("near_top", near_top),
    ]
}
