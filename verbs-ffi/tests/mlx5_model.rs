//! The mlx5 direct data path ([`DirectQp`]) against the software model: ring bytes, every
//! opcode, inline boundaries, BlueFlame and doorbell choice, wraparound of every ring a million
//! WQEs long, selective signaling, error CQEs and flushes, and the model's own refusals.

use rivet_verbs_ffi::mlx5::model::{
    MODEL_VENDOR_SYNDROME, Model, ModelDoorbell, ModelMr, ModelPd, ModelQp, ModelQpConfig,
};
use rivet_verbs_ffi::mlx5::{
    CompletedOp, DirectCompletion, DirectError, DirectOp, DirectQp, DirectWr, DoorbellRegister,
    WorkQueue, WqeData,
};
use rivet_verbs_ffi::sys::{access, wc_status};

const ALL: u32 = access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ;

struct Side {
    qp: ModelQp,
    pd: ModelPd,
    direct: DirectQp<ModelDoorbell>,
}

fn pair(config: ModelQpConfig, max_inline: usize) -> (Model, Side, Side) {
    let model = Model::new();
    let mut sides = Vec::new();
    for _ in 0..2 {
        let pd = model.pd();
        let qp = model.create_qp(pd, config);
        let direct = qp.direct_qp(max_inline).expect("direct qp");
        sides.push(Side { qp, pd, direct });
    }
    let b = sides.pop().unwrap();
    let a = sides.pop().unwrap();
    model.connect(&a.qp, &b.qp);
    (model, a, b)
}

fn drain<D: DoorbellRegister>(qp: &mut DirectQp<D>) -> Vec<DirectCompletion> {
    let mut out = Vec::new();
    while qp.poll(16, |c| out.push(c)).expect("poll") > 0 {}
    out
}

fn write<'a>(wr_id: u64, data: WqeData<'a>, dst: &ModelMr, signaled: bool) -> DirectWr<'a> {
    DirectWr {
        wr_id,
        op: DirectOp::Write,
        data,
        remote_addr: dst.addr,
        rkey: dst.rkey,
        signaled,
    }
}

#[test]
fn ring_holds_the_exact_wqe_bytes_and_blueflame_carries_them() {
    let (model, mut a, _b) = pair(ModelQpConfig::default(), 220);
    let payload: Vec<u8> = (0xa0..0xa0 + 20).collect();
    let wr = DirectWr {
        wr_id: 7,
        op: DirectOp::WriteImm(0x5200_0001),
        data: WqeData::Inline(&payload),
        remote_addr: 0x1122_3344_5566_7788,
        rkey: 0xcafe_babe,
        signaled: true,
    };
    a.direct.post_send(&[wr]).unwrap();
    let qpn = a.qp.qpn();
    let mut golden = vec![
        0x00,
        0x00,
        0x00,
        0x09, // index 0, RDMA_WRITE_IMM
        (qpn >> 16) as u8,
        (qpn >> 8) as u8,
        qpn as u8,
        0x04, // qpn, ds = ctrl + raddr + 2 inline units
        0x00,
        0x00,
        0x00,
        0x08, // signature, stream id, CQ_UPDATE
        0x52,
        0x00,
        0x00,
        0x01, // immediate, network order
        0x11,
        0x22,
        0x33,
        0x44,
        0x55,
        0x66,
        0x77,
        0x88, // raddr
        0xca,
        0xfe,
        0xba,
        0xbe,
        0x00,
        0x00,
        0x00,
        0x00, // rkey, reserved
        0x80,
        0x00,
        0x00,
        0x14, // inline header: 20 bytes
    ];
    golden.extend(0xa0..0xac);
    golden.extend(0xac..0xb4);
    golden.extend([0; 8]); // padding to 16
    assert_eq!(a.qp.sq_bytes(0, 64), golden);
    assert_eq!(a.qp.qp_doorbell_record(), (0, 1));
    assert_eq!(
        model.stats().bf_copies,
        1,
        "one small WQE goes by BlueFlame"
    );

    // Second WQE at pi 1 (the other BlueFlame half), then a two-WQE chain by doorbell.
    let dst = model.alloc_registered(_b.pd, 64, ALL);
    let src = model.alloc_registered(a.pd, 64, ALL);
    let gather = WqeData::Gather {
        addr: src.addr,
        len: 64,
        lkey: src.lkey,
    };
    a.direct
        .post_send(&[write(8, gather, &dst, false)])
        .unwrap();
    let mut second = vec![
        0x00,
        0x00,
        0x01,
        0x08,
        (qpn >> 16) as u8,
        (qpn >> 8) as u8,
        qpn as u8,
        0x03,
    ];
    second.extend([0; 8]);
    second.extend(dst.addr.to_be_bytes());
    second.extend(dst.rkey.to_be_bytes());
    second.extend([0; 4]);
    second.extend([0x00, 0x00, 0x00, 0x40]);
    second.extend(src.lkey.to_be_bytes());
    second.extend(src.addr.to_be_bytes());
    assert_eq!(a.qp.sq_bytes(64, 48), second);
    a.direct
        .post_send(&[write(9, gather, &dst, false), write(10, gather, &dst, true)])
        .unwrap();
    assert_eq!(model.stats().bf_copies, 2);
    assert_eq!(
        model.stats().doorbells,
        1,
        "a chain rings the 8-byte doorbell"
    );
    assert_eq!(a.qp.qp_doorbell_record(), (0, 4));
}

#[test]
fn every_opcode_moves_the_right_bytes_and_completes() {
    let (model, mut a, mut b) = pair(ModelQpConfig::default(), 64);
    let src = model.alloc_registered(a.pd, 4096, ALL);
    let dst = model.alloc_registered(b.pd, 4096, ALL);
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 31 % 251) as u8).collect();
    model.write(src.addr, &data);
    b.direct.post_recv(0xbeef).unwrap();
    let gather = |off: u64, len: u32| WqeData::Gather {
        addr: src.addr + off,
        len,
        lkey: src.lkey,
    };
    a.direct
        .post_send(&[
            write(1, gather(0, 1000), &dst, true),
            DirectWr {
                wr_id: 2,
                op: DirectOp::WriteImm(0x5201_0203),
                data: gather(1000, 500),
                remote_addr: dst.addr + 1000,
                rkey: dst.rkey,
                signaled: true,
            },
            DirectWr {
                wr_id: 3,
                op: DirectOp::Read,
                data: WqeData::Gather {
                    addr: src.addr + 2048,
                    len: 1500,
                    lkey: src.lkey,
                },
                remote_addr: dst.addr,
                rkey: dst.rkey,
                signaled: true,
            },
        ])
        .unwrap();
    model.run_until_idle();
    assert_eq!(model.read(dst.addr, 1500), data[..1500]);
    assert_eq!(model.read(src.addr + 2048, 1500), data[..1500], "RDMA READ");
    let sent = drain(&mut a.direct);
    let ops: Vec<(u64, CompletedOp, u32, u32)> = sent
        .iter()
        .map(|c| (c.wr_id, c.op, c.status, c.byte_len))
        .collect();
    assert_eq!(
        ops,
        [
            (1, CompletedOp::Write, 0, 0),
            (2, CompletedOp::WriteImm, 0, 0),
            (3, CompletedOp::Read, 0, 1500)
        ]
    );
    assert!(sent.iter().all(|c| c.queue == WorkQueue::Send));
    let recv = drain(&mut b.direct);
    assert_eq!(recv.len(), 1);
    assert_eq!(
        (
            recv[0].wr_id,
            recv[0].op,
            recv[0].imm,
            recv[0].byte_len,
            recv[0].queue
        ),
        (
            0xbeef,
            CompletedOp::RecvWriteImm,
            Some(0x5201_0203),
            500,
            WorkQueue::Recv
        )
    );
    assert_eq!(a.direct.sq_outstanding(), 0);
    assert_eq!(a.qp.cq_doorbell_record(), 3, "consumer index written back");
}

#[test]
fn inline_boundaries_and_blueflame_limits() {
    for (max_inline, bf_size) in [(220, 256), (256, 256), (220, 0), (972, 256)] {
        let config = ModelQpConfig {
            bf_size,
            ..ModelQpConfig::default()
        };
        let (model, mut a, mut b) = pair(config, max_inline);
        let dst = model.alloc_registered(b.pd, 1024, ALL);
        let mut expected_bf = 0;
        let mut expected_db = 0;
        for len in [
            0usize, 1, 11, 12, 13, 27, 28, 29, 44, 45, 60, 61, 204, 219, 220, 221, 236, 256, 972,
        ] {
            if len > max_inline {
                let bytes = vec![1u8; len];
                let err = a
                    .direct
                    .post_send(&[write(0, WqeData::Inline(&bytes), &dst, true)])
                    .unwrap_err();
                assert_eq!(
                    err,
                    DirectError::InlineTooLong {
                        len,
                        max: max_inline
                    }
                );
                continue;
            }
            let bytes: Vec<u8> = (0..len).map(|i| (i as u8) ^ (len as u8)).collect();
            b.direct.post_recv(len as u64).unwrap();
            let wr = DirectWr {
                op: DirectOp::WriteImm(len as u32),
                ..write(len as u64, WqeData::Inline(&bytes), &dst, true)
            };
            a.direct.post_send(&[wr]).unwrap();
            // ctrl + raddr + inline: BlueFlame when the WQE fits a half.
            let ds = 2 + if len == 0 { 0 } else { (4 + len).div_ceil(16) };
            if bf_size > 0 && ds * 16 <= bf_size as usize {
                expected_bf += 1;
            } else {
                expected_db += 1;
            }
            model.run_until_idle();
            assert_eq!(model.read(dst.addr, len), bytes, "inline {len}");
            let c = drain(&mut b.direct);
            assert_eq!((c[0].imm, c[0].byte_len), (Some(len as u32), len as u32));
            assert_eq!(drain(&mut a.direct)[0].wr_id, len as u64);
        }
        let stats = model.stats();
        assert_eq!(
            (stats.bf_copies, stats.doorbells),
            (expected_bf, expected_db),
            "max_inline {max_inline} bf {bf_size}"
        );
    }
}

#[test]
fn a_wqe_straddling_the_ring_end_wraps_segment_by_segment() {
    let config = ModelQpConfig {
        sq_wqe_cnt: 4,
        ..ModelQpConfig::default()
    };
    let (model, mut a, b) = pair(config, 100);
    let dst = model.alloc_registered(b.pd, 128, ALL);
    let one: Vec<u8> = vec![0x11; 20]; // 1 BB
    for i in 0..3 {
        a.direct
            .post_send(&[write(i, WqeData::Inline(&one), &dst, true)])
            .unwrap();
    }
    model.run_until_idle();
    assert_eq!(drain(&mut a.direct).len(), 3);
    // pi = 3: ctrl + raddr + 7 inline units = 9 ds = 3 BBs, occupying BB 3, 0 and 1.
    let pattern: Vec<u8> = (0..100u8).collect();
    a.direct
        .post_send(&[write(9, WqeData::Inline(&pattern), &dst, true)])
        .unwrap();
    let ring = a.qp.sq_bytes(3 * 64, 192);
    assert_eq!(
        ring[0..4],
        [0x00, 0x00, 0x03, 0x08],
        "control segment at BB 3"
    );
    assert_eq!(ring[32..36], [0x80, 0x00, 0x00, 100], "inline header");
    assert_eq!(
        ring[64..80],
        pattern[28..44],
        "payload continues at the ring start"
    );
    model.run_until_idle();
    assert_eq!(model.read(dst.addr, 100), pattern);
    assert_eq!(drain(&mut a.direct)[0].wr_id, 9);
}

/// Deterministic pseudo-random numbers.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn a_million_wqes_wrap_every_ring_many_times() {
    const WQES: u64 = 1_000_000;
    let config = ModelQpConfig {
        sq_wqe_cnt: 16,
        rq_wqe_cnt: 8,
        rq_stride: 16,
        cqe_cnt: 16,
        cqe_size: 64,
        bf_size: 256,
    };
    let (model, mut a, mut b) = pair(config, 44);
    let src = model.alloc_registered(a.pd, 4096, ALL);
    let dst = model.alloc_registered(b.pd, 4096, ALL);
    let sink = model.alloc_registered(a.pd, 4096, ALL);
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    model.write(src.addr, &data);
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut posted = 0u64;
    let mut unsignaled = 0;
    let mut signaled_outstanding = 0u32;
    let mut expected_send = std::collections::VecDeque::new();
    let mut expected_recv = std::collections::VecDeque::new();
    let mut send_done = 0u64;
    let mut recv_done = 0u64;
    let mut inline = [0u8; 44];
    while posted < WQES || !expected_send.is_empty() {
        // Keep the receive queue full.
        while b.direct.rq_outstanding() < 8 {
            b.direct
                .post_recv(u64::from(b.direct.rq_outstanding()) | 0xabc << 8)
                .unwrap();
        }
        // Post until the send queue or the CQ budget runs out.
        while posted < WQES {
            let r = rng.next();
            let len = (r >> 8) as u32 % 45;
            let off = (r >> 20) % 2048;
            let kind = r % 5;
            let with_imm = kind == 0 || kind == 2;
            if with_imm && expected_recv.len() >= 8 {
                break;
            }
            for (i, byte) in inline.iter_mut().enumerate() {
                *byte = (posted as u8).wrapping_add(i as u8);
            }
            let payload = match kind {
                0 | 4 => WqeData::Inline(&inline[..len as usize]),
                3 => WqeData::Gather {
                    addr: sink.addr + off,
                    len,
                    lkey: sink.lkey,
                },
                _ => WqeData::Gather {
                    addr: src.addr + off,
                    len,
                    lkey: src.lkey,
                },
            };
            let need = 1 + (2 + (4 + len as usize).div_ceil(16)) / 4;
            let free = 16 - a.direct.sq_outstanding() as usize;
            let signaled = unsignaled >= 3 || free < 2 * need + 2 || kind == 3;
            if need > free || (signaled && signaled_outstanding >= 8) {
                break;
            }
            let op = match kind {
                0 | 2 => DirectOp::WriteImm(posted as u32),
                3 => DirectOp::Read,
                _ => DirectOp::Write,
            };
            let wr = DirectWr {
                wr_id: posted,
                op,
                data: payload,
                remote_addr: dst.addr + off,
                rkey: dst.rkey,
                signaled,
            };
            a.direct.post_send(&[wr]).unwrap();
            if signaled {
                expected_send.push_back(posted);
                signaled_outstanding += 1;
                unsignaled = 0;
            } else {
                unsignaled += 1;
            }
            if with_imm {
                expected_recv.push_back((posted as u32, len));
            }
            posted += 1;
            // Spot-check the bytes every so often.
            if posted % 9973 == 0 && kind != 3 && len > 0 {
                model.run_until_idle();
                let want = match payload {
                    WqeData::Inline(bytes) => bytes.to_vec(),
                    _ => data[off as usize..(off + u64::from(len)) as usize].to_vec(),
                };
                assert_eq!(
                    model.read(dst.addr + off, len as usize),
                    want,
                    "WQE {}",
                    posted - 1
                );
            }
        }
        model.run_until_idle();
        for c in drain(&mut a.direct) {
            assert_eq!(c.status, 0);
            assert_eq!(
                Some(c.wr_id),
                expected_send.pop_front(),
                "send completions in order"
            );
            signaled_outstanding -= 1;
            send_done += 1;
        }
        for c in drain(&mut b.direct) {
            let (imm, len) = expected_recv
                .pop_front()
                .expect("a receive completion was expected");
            assert_eq!((c.status, c.imm, c.byte_len), (0, Some(imm), len));
            recv_done += 1;
        }
    }
    let stats = model.stats();
    assert_eq!(stats.executed, WQES);
    assert!(a.direct.cq_consumer_index() as u64 == send_done && send_done > 16 * 10_000);
    assert!(
        recv_done > 8 * 10_000,
        "receive ring wrapped {recv_done} / 8 times"
    );
    assert!(
        stats.wqes == WQES && stats.bf_copies == WQES,
        "one WQE per doorbell here"
    );
    assert_eq!(a.direct.sq_outstanding(), 0);
}

#[test]
fn selective_signaling_completes_everything_before_the_signaled_wqe() {
    let (model, mut a, b) = pair(ModelQpConfig::default(), 64);
    let dst = model.alloc_registered(b.pd, 64, ALL);
    for i in 0..10 {
        a.direct
            .post_send(&[write(i, WqeData::Inline(&[1; 8]), &dst, i == 9)])
            .unwrap();
    }
    assert_eq!(a.direct.sq_outstanding(), 10);
    model.run_until_idle();
    let c = drain(&mut a.direct);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].wr_id, 9);
    assert_eq!(a.direct.sq_outstanding(), 0, "one CQE frees all ten");
}

#[test]
fn bad_rkey_is_remote_access_error_then_everything_is_flushed() {
    let (model, mut a, mut b) = pair(ModelQpConfig::default(), 64);
    let dst = model.alloc_registered(b.pd, 64, ALL);
    for i in 0..3 {
        b.direct.post_recv(100 + i).unwrap();
    }
    let bad = ModelMr {
        rkey: dst.rkey ^ 0x100,
        ..dst
    };
    let imm = |wr: DirectWr<'static>| DirectWr {
        op: DirectOp::WriteImm(1),
        ..wr
    };
    a.direct
        .post_send(&[
            write(1, WqeData::Inline(&[1; 8]), &dst, false),
            imm(write(2, WqeData::Inline(&[2; 8]), &bad, false)),
            write(3, WqeData::Inline(&[3; 8]), &dst, false),
            write(4, WqeData::Inline(&[4; 8]), &dst, true),
        ])
        .unwrap();
    model.run_until_idle();
    assert_eq!(
        model.read(dst.addr, 8),
        [1; 8],
        "the write before the error landed"
    );
    let c = drain(&mut a.direct);
    let got: Vec<(u64, u32)> = c.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        got,
        [
            (2, wc_status::REM_ACCESS_ERR),
            (3, wc_status::WR_FLUSH_ERR),
            (4, wc_status::WR_FLUSH_ERR)
        ],
        "failed WQEs complete even unsignaled"
    );
    assert_eq!(c[0].vendor_err, u32::from(MODEL_VENDOR_SYNDROME));
    assert_eq!(a.direct.sq_outstanding(), 0);
    // The responder failed too: its receives are flushed.
    let r = drain(&mut b.direct);
    assert_eq!(
        r.iter()
            .map(|c| (c.wr_id, c.status, c.queue))
            .collect::<Vec<_>>(),
        (100..103)
            .map(|i| (i, wc_status::WR_FLUSH_ERR, WorkQueue::Recv))
            .collect::<Vec<_>>()
    );
    // Later posts are flushed at once.
    a.direct
        .post_send(&[write(5, WqeData::Inline(&[5; 8]), &dst, false)])
        .unwrap();
    let c = drain(&mut a.direct);
    assert_eq!((c[0].wr_id, c[0].status), (5, wc_status::WR_FLUSH_ERR));
}

#[test]
fn bad_lkey_no_receive_and_vanished_peer_map_to_verbs_statuses() {
    // Bad lkey.
    let (model, mut a, b) = pair(ModelQpConfig::default(), 0);
    let src = model.alloc_registered(a.pd, 64, ALL);
    let dst = model.alloc_registered(b.pd, 64, ALL);
    let gather = WqeData::Gather {
        addr: src.addr,
        len: 64,
        lkey: src.lkey ^ 1,
    };
    a.direct
        .post_send(&[write(1, gather, &dst, false)])
        .unwrap();
    model.run_until_idle();
    assert_eq!(drain(&mut a.direct)[0].status, wc_status::LOC_PROT_ERR);
    // Out of range on the remote side.
    let (model, mut a, b) = pair(ModelQpConfig::default(), 64);
    let dst = model.alloc_registered(b.pd, 64, ALL);
    let past = ModelMr {
        addr: dst.addr + 60,
        ..dst
    };
    a.direct
        .post_send(&[write(1, WqeData::Inline(&[0; 8]), &past, false)])
        .unwrap();
    model.run_until_idle();
    assert_eq!(drain(&mut a.direct)[0].status, wc_status::REM_ACCESS_ERR);
    // No receive posted.
    let (model, mut a, b) = pair(ModelQpConfig::default(), 64);
    let dst = model.alloc_registered(b.pd, 64, ALL);
    let wr = DirectWr {
        op: DirectOp::WriteImm(0),
        ..write(1, WqeData::None, &dst, true)
    };
    a.direct.post_send(&[wr]).unwrap();
    model.run_until_idle();
    assert_eq!(drain(&mut a.direct)[0].status, wc_status::RNR_RETRY_EXC_ERR);
    // Vanished peer.
    let (model, mut a, b) = pair(ModelQpConfig::default(), 64);
    let dst = model.alloc_registered(b.pd, 64, ALL);
    model.vanish(&b.qp);
    a.direct
        .post_send(&[write(1, WqeData::Inline(&[0; 8]), &dst, true)])
        .unwrap();
    model.run_until_idle();
    assert_eq!(drain(&mut a.direct)[0].status, wc_status::RETRY_EXC_ERR);
}

#[test]
fn engine_refuses_what_it_cannot_post() {
    let config = ModelQpConfig {
        sq_wqe_cnt: 4,
        rq_wqe_cnt: 2,
        ..ModelQpConfig::default()
    };
    let (model, mut a, mut b) = pair(config, 64);
    let dst = model.alloc_registered(b.pd, 64, ALL);
    let five: Vec<DirectWr<'_>> = (0..5)
        .map(|i| write(i, WqeData::None, &dst, false))
        .collect();
    assert_eq!(
        a.direct.post_send(&five),
        Err(DirectError::SendQueueFull { need: 5, free: 4 })
    );
    assert_eq!(a.direct.sq_outstanding(), 0, "all or nothing");
    let read = DirectWr {
        op: DirectOp::Read,
        ..write(0, WqeData::Inline(&[1]), &dst, true)
    };
    assert!(matches!(
        a.direct.post_send(&[read]),
        Err(DirectError::Malformed { .. })
    ));
    b.direct.post_recv(1).unwrap();
    b.direct.post_recv(2).unwrap();
    assert_eq!(b.direct.post_recv(3), Err(DirectError::RecvQueueFull));
    assert!(
        DirectError::RecvQueueFull
            .to_string()
            .contains("receive queue full")
    );
    assert_eq!(
        DirectError::SendQueueFull { need: 1, free: 0 }.errno(),
        libc_enomem()
    );
}

fn libc_enomem() -> i32 {
    12
}

/// A doorbell register that tampers with what reaches the model.
struct Tamper {
    inner: ModelDoorbell,
    qp: ModelQp,
    kind: &'static str,
}

impl DoorbellRegister for Tamper {
    fn bf_size(&self) -> u32 {
        self.inner.bf_size()
    }
    fn wc_start(&mut self) {
        match self.kind {
            "zero byte count" => self.qp.poke_sq(32, &[0, 0, 0, 0]),
            "wrong index" => self.qp.poke_sq(2, &[0x05]),
            "wrong ds" => self.qp.poke_sq(7, &[0x04]),
            "wrong qpn" => self.qp.poke_sq(6, &[0x77]),
            "fence bit" => self.qp.poke_sq(11, &[0x88]),
            "no wc_start" => return,
            _ => {}
        }
        self.inner.wc_start();
    }
    fn store64(&mut self, offset: usize, value: u64) {
        match self.kind {
            "flipped word" if offset == 16 => self.inner.store64(offset, value ^ 1),
            "same half" => self.inner.store64(offset % 256, value),
            _ => self.inner.store64(offset, value),
        }
    }
    fn wc_flush(&mut self) {
        self.inner.wc_flush();
    }
}

fn tampered(kind: &'static str, posts: usize) {
    let model = Model::new();
    let pd = model.pd();
    let qp = model.create_qp(pd, ModelQpConfig::default());
    let peer_pd = model.pd();
    let peer = model.create_qp(peer_pd, ModelQpConfig::default());
    model.connect(&qp, &peer);
    let handle = qp.clone();
    let mut direct = qp
        .direct_qp_with(64, |inner| Tamper {
            inner,
            qp: handle,
            kind,
        })
        .unwrap();
    let src = model.alloc_registered(pd, 64, ALL);
    let gather = WqeData::Gather {
        addr: src.addr,
        len: 8,
        lkey: src.lkey,
    };
    for i in 0..posts {
        direct
            .post_send(&[DirectWr {
                wr_id: i as u64,
                op: DirectOp::Write,
                data: gather,
                remote_addr: 0,
                rkey: 0,
                signaled: false,
            }])
            .unwrap();
    }
}

#[test]
#[should_panic(expected = "byte_count 0 means 2 GiB")]
fn model_refuses_a_zero_byte_count() {
    tampered("zero byte count", 1);
}

#[test]
#[should_panic(expected = "control segment carries index")]
fn model_refuses_a_wrong_wqe_index() {
    tampered("wrong index", 1);
}

#[test]
#[should_panic(expected = "ds 4 for one data segment")]
fn model_refuses_a_wrong_ds() {
    tampered("wrong ds", 1);
}

#[test]
#[should_panic(expected = "wrong QPN")]
fn model_refuses_a_wrong_qpn() {
    tampered("wrong qpn", 1);
}

#[test]
#[should_panic(expected = "fm_ce_se")]
fn model_refuses_unexpected_control_bits() {
    tampered("fence bit", 1);
}

#[test]
#[should_panic(expected = "before wc_start")]
fn model_refuses_mmio_before_the_barrier() {
    tampered("no wc_start", 1);
}

#[test]
#[should_panic(expected = "BlueFlame word 2 differs")]
fn model_refuses_a_blueflame_copy_that_differs_from_the_ring() {
    tampered("flipped word", 1);
}

#[test]
#[should_panic(expected = "out of order")]
fn model_refuses_blueflame_halves_that_do_not_alternate() {
    tampered("same half", 2);
}

#[test]
#[should_panic(expected = "CQ overrun")]
fn model_refuses_a_cq_overrun() {
    let config = ModelQpConfig {
        cqe_cnt: 4,
        ..ModelQpConfig::default()
    };
    let (model, mut a, b) = pair(config, 64);
    let dst = model.alloc_registered(b.pd, 64, ALL);
    for i in 0..5 {
        a.direct
            .post_send(&[write(i, WqeData::Inline(&[1]), &dst, true)])
            .unwrap();
    }
    model.run_until_idle();
}

#[test]
#[should_panic(expected = "a second DirectQp")]
fn one_direct_qp_per_model_qp() {
    let model = Model::new();
    let pd = model.pd();
    let qp = model.create_qp(pd, ModelQpConfig::default());
    let _first = qp.direct_qp(0).unwrap();
    let _second = qp.direct_qp(0);
}

#[test]
fn malformed_wqes_complete_in_error_when_the_model_is_told_to() {
    for (kind, status) in [
        ("wrong ds", wc_status::LOC_LEN_ERR),
        ("zero byte count", wc_status::LOC_LEN_ERR),
        ("wrong qpn", wc_status::LOC_QP_OP_ERR),
        ("fence bit", wc_status::LOC_QP_OP_ERR),
    ] {
        let model = Model::new();
        model.set_malformed_wqe_completes_in_error(true);
        let pd = model.pd();
        let qp = model.create_qp(pd, ModelQpConfig::default());
        let peer_pd = model.pd();
        let peer = model.create_qp(peer_pd, ModelQpConfig::default());
        model.connect(&qp, &peer);
        let handle = qp.clone();
        let mut direct = qp
            .direct_qp_with(64, |inner| Tamper {
                inner,
                qp: handle,
                kind,
            })
            .unwrap();
        let src = model.alloc_registered(pd, 64, ALL);
        let dst = model.alloc_registered(peer_pd, 64, ALL);
        let gather = WqeData::Gather {
            addr: src.addr,
            len: 8,
            lkey: src.lkey,
        };
        direct.post_send(&[write(1, gather, &dst, false)]).unwrap();
        model.run_until_idle();
        let c = drain(&mut direct);
        assert_eq!(
            (c.len(), c[0].wr_id, c[0].status, c[0].op),
            (1, 1, status, CompletedOp::Failed),
            "{kind}"
        );
        assert_eq!(model.read(dst.addr, 8), [0; 8], "{kind}: nothing moved");
        assert_eq!(direct.sq_outstanding(), 0);
    }
}

#[test]
fn cqes_of_128_bytes_keep_the_64_byte_format_in_their_second_half() {
    let config = ModelQpConfig {
        cqe_size: 128,
        cqe_cnt: 8,
        ..ModelQpConfig::default()
    };
    let (model, mut a, mut b) = pair(config, 64);
    let dst = model.alloc_registered(b.pd, 64, ALL);
    for round in 0..40u32 {
        let payload = [round as u8; 16];
        b.direct.post_recv(u64::from(round)).unwrap();
        let wr = DirectWr {
            op: DirectOp::WriteImm(round),
            ..write(u64::from(round), WqeData::Inline(&payload), &dst, true)
        };
        a.direct.post_send(&[wr]).unwrap();
        model.run_until_idle();
        let s = drain(&mut a.direct);
        let r = drain(&mut b.direct);
        assert_eq!((s.len(), s[0].wr_id), (1, u64::from(round)));
        assert_eq!((r[0].imm, r[0].byte_len), (Some(round), 16));
    }
    // 40 CQEs through an 8-entry ring: five passes, the owner bit of the last written slot says
    // which (pass 4: bit 0).
    let last = a.qp.cqe_bytes(39);
    assert_eq!(last[63] & 1, ((39 / 8) % 2) as u8);
    assert_eq!(last[63] >> 4, 0, "requester CQE");
}
