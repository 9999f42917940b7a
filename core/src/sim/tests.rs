//! The simulator's own semantics and its checks on what the core posts.

use super::*;

fn config(max_inline: usize) -> QpConfig {
    QpConfig {
        max_inline,
        sq_depth: 4,
        rq_depth: 2,
        cq_depth: 8,
        inbound_len: 64,
        staging_len: 64,
    }
}

struct Setup {
    fabric: Fabric,
    a: SimNic,
    b: SimNic,
    b_ep: EndpointId,
    a_buf: MemoryRegion,
    b_buf: MemoryRegion,
}

fn setup() -> Setup {
    let fabric = Fabric::new();
    let a_ep = fabric.endpoint();
    let b_ep = fabric.endpoint();
    let (a, b) = fabric.connect(a_ep, config(16), b_ep, config(16));
    let a_buf = fabric.alloc_registered(a_ep, 128);
    let b_buf = fabric.alloc_registered(b_ep, 128);
    fabric.write(a_ep, a_buf.addr, &[7; 128]);
    Setup {
        fabric,
        a,
        b,
        b_ep,
        a_buf,
        b_buf,
    }
}

fn write(s: &Setup, op: SendOp, len: u32, signaled: bool) -> SendWr<'static> {
    SendWr {
        wr_id: 99,
        op,
        payload: Payload::Local(crate::nic::Sge {
            addr: s.a_buf.addr,
            len,
            lkey: s.a_buf.lkey,
        }),
        remote_addr: s.b_buf.addr,
        rkey: s.b_buf.rkey,
        signaled,
    }
}

fn poll_all(nic: &mut SimNic) -> Vec<Completion> {
    let mut batch = [Completion {
        wr_id: 0,
        status: WcStatus::SUCCESS,
        vendor_err: 0,
        kind: CompletionKind::Send,
    }; 16];
    let got = nic.poll(&mut batch).unwrap();
    batch[..got].to_vec()
}

#[test]
fn write_with_immediate_lands_data_then_completes_both_sides() {
    let mut s = setup();
    s.b.post_recv(5).unwrap();
    let wr = write(&s, SendOp::WriteImm(0xabcd), 100, true);
    s.a.post_send(&[wr]).unwrap();
    assert_eq!(s.fabric.pending(), 1);
    assert!(s.fabric.step());
    assert_eq!(s.fabric.read(s.b_ep, s.b_buf.addr, 100), [7; 100]);
    let recv = poll_all(&mut s.b);
    assert_eq!(
        recv[0].kind,
        CompletionKind::RecvWriteImm {
            imm: 0xabcd,
            byte_len: 100
        }
    );
    assert_eq!(recv[0].wr_id, 5);
    assert_eq!(poll_all(&mut s.a)[0].wr_id, 99);
}

#[test]
fn unsignaled_writes_complete_silently_and_hold_the_queue_until_a_signal() {
    let mut s = setup();
    for _ in 0..3 {
        let wr = write(&s, SendOp::Write, 8, false);
        s.a.post_send(&[wr]).unwrap();
    }
    s.fabric.run_until_idle();
    assert!(poll_all(&mut s.a).is_empty());
    assert_eq!(s.a.sq_occupancy(), 3);
    let wr = write(&s, SendOp::Write, 8, true);
    s.a.post_send(&[wr]).unwrap();
    s.fabric.run_until_idle();
    assert_eq!(poll_all(&mut s.a).len(), 1);
    assert_eq!(s.a.sq_occupancy(), 0);
}

#[test]
fn write_with_immediate_without_receive_is_rnr_retry_exceeded() {
    let mut s = setup();
    let wr = write(&s, SendOp::WriteImm(1), 8, false);
    s.a.post_send(&[wr]).unwrap();
    s.fabric.step();
    assert_eq!(poll_all(&mut s.a)[0].status, WcStatus::RNR_RETRY_EXC_ERR);
    assert!(s.a.is_error());
}

#[test]
fn bad_rkey_is_remote_access_error_and_fails_the_responder() {
    let mut s = setup();
    s.b.post_recv(1).unwrap();
    let mut wr = write(&s, SendOp::Write, 8, false);
    wr.rkey ^= 1;
    s.a.post_send(&[wr]).unwrap();
    s.fabric.step();
    assert_eq!(poll_all(&mut s.a)[0].status, WcStatus::REM_ACCESS_ERR);
    assert!(s.b.is_error());
    let flushed = poll_all(&mut s.b);
    assert_eq!(flushed[0].status, WcStatus::WR_FLUSH_ERR);
    assert_eq!(flushed[0].kind, CompletionKind::RecvFailed);
}

#[test]
fn out_of_bounds_and_zero_length_writes_check_the_region() {
    let mut s = setup();
    let mut wr = write(&s, SendOp::Write, 8, false);
    wr.remote_addr = s.b_buf.addr + 124;
    s.a.post_send(&[wr]).unwrap();
    s.fabric.step();
    assert_eq!(poll_all(&mut s.a)[0].status, WcStatus::REM_ACCESS_ERR);

    let mut t = setup();
    let mut wr = write(&t, SendOp::Write, 0, true);
    wr.payload = Payload::Empty;
    wr.remote_addr = 0;
    t.a.post_send(&[wr]).unwrap();
    t.fabric.step();
    assert_eq!(poll_all(&mut t.a)[0].status, WcStatus::REM_ACCESS_ERR);
}

#[test]
fn qp_error_flushes_every_outstanding_request() {
    let mut s = setup();
    s.b.post_recv(1).unwrap();
    for _ in 0..2 {
        let wr = write(&s, SendOp::Write, 8, false);
        s.a.post_send(&[wr]).unwrap();
    }
    s.fabric.fault_qp_error(&s.a);
    let flushed = poll_all(&mut s.a);
    assert_eq!(flushed.len(), 2);
    assert!(flushed.iter().all(|c| c.status == WcStatus::WR_FLUSH_ERR));
    // Later posts are flushed at once.
    let wr = write(&s, SendOp::Write, 8, false);
    s.a.post_send(&[wr]).unwrap();
    assert_eq!(poll_all(&mut s.a).len(), 1);
    assert_eq!(s.fabric.run_until_idle(), 0);
}

/// A key works only for queue pairs of its registration's device: a local key of another
/// device fails the requester with `LOC_PROT_ERR`, a remote key of another device the
/// requester with `REM_ACCESS_ERR` (and the responder), each device's own keys of the same
/// memory work.
#[test]
fn keys_work_only_on_the_device_they_were_registered_on() {
    let fabric = Fabric::new();
    let (a_ep, b_ep) = (fabric.endpoint(), fabric.endpoint());
    let a_mem = fabric.alloc(a_ep, 128);
    let b_mem = fabric.alloc(b_ep, 128);
    fabric.write(a_ep, a_mem, &[5; 128]);
    let a_keys: Vec<MemoryRegion> = (0..2)
        .map(|d| fabric.register_on(a_ep, a_mem, 128, d))
        .collect();
    let b_keys: Vec<MemoryRegion> = (0..2)
        .map(|d| fabric.register_on(b_ep, b_mem, 128, d))
        .collect();
    assert_eq!((a_keys[1].device, b_keys[0].device), (1, 0));
    assert_ne!(a_keys[0].lkey, a_keys[1].lkey);
    assert_eq!(fabric.key_on(a_ep, a_keys[0].lkey, 1), Some(a_keys[1].lkey));
    assert_eq!(fabric.key_on(b_ep, b_keys[1].rkey, 0), Some(b_keys[0].rkey));
    assert_eq!(
        fabric.key_on(b_ep, b_keys[1].rkey, 2),
        None,
        "not registered there"
    );
    let wr = |lkey, rkey| SendWr {
        wr_id: 7,
        op: SendOp::Write,
        payload: Payload::Local(crate::nic::Sge {
            addr: a_mem,
            len: 8,
            lkey,
        }),
        remote_addr: b_mem,
        rkey,
        signaled: true,
    };
    // (a's device, b's device), (the device of the local key, of the remote key), the status.
    type Case = ((u8, u8), (u8, u8), WcStatus);
    let cases: [Case; 5] = [
        ((1, 1), (1, 1), WcStatus::SUCCESS),
        ((0, 1), (0, 1), WcStatus::SUCCESS),
        ((1, 1), (0, 1), WcStatus::LOC_PROT_ERR),
        ((1, 1), (1, 0), WcStatus::REM_ACCESS_ERR),
        ((0, 0), (0, 1), WcStatus::REM_ACCESS_ERR),
    ];
    for ((a_device, b_device), (lkey_device, rkey_device), status) in cases {
        let (mut a, b) =
            fabric.connect_on((a_ep, a_device), config(0), (b_ep, b_device), config(0));
        assert_eq!((a.device(), b.device()), (a_device, b_device));
        let lkey = a_keys[usize::from(lkey_device)].lkey;
        let rkey = b_keys[usize::from(rkey_device)].rkey;
        a.post_send(&[wr(lkey, rkey)]).unwrap();
        fabric.run_until_idle();
        assert_eq!(poll_all(&mut a)[0].status, status, "{a_device} {b_device}");
        assert_eq!(b.is_error(), status == WcStatus::REM_ACCESS_ERR);
    }
}

/// A queue pair moved to another device ([`Fabric::successor`], [`Fabric::reconnect_on`]) has
/// its control regions registered there: the same memory and contents under new keys; on its
/// own device it shares them. Sends wait for [`Fabric::join`].
#[test]
fn a_successor_on_another_device_registers_its_control_regions_there() {
    let fabric = Fabric::new();
    let (a_ep, b_ep) = (fabric.endpoint(), fabric.endpoint());
    let (a, b) = fabric.connect(a_ep, config(0), b_ep, config(0));
    let old = b.inbound_region();
    fabric.write(b_ep, old.addr, &[9; 8]);
    let same = fabric.successor(&b, 0);
    assert_eq!(same.inbound_region(), old);
    assert!(!same.is_connected());
    let (a2, b2) = fabric.reconnect_on(&a, 0, &b, 1);
    assert!(a2.is_connected() && b2.is_connected());
    assert_eq!(b2.device(), 1);
    let moved = b2.inbound_region();
    assert_eq!((moved.addr, moved.len), (old.addr, old.len));
    assert_ne!(moved.rkey, old.rkey);
    let mut bytes = [0u8; 8];
    b2.read_inbound(0, &mut bytes);
    assert_eq!(bytes, [9; 8], "the same memory");
    // The old key does not work on the new queue pair, the new one does.
    let a_buf = fabric.alloc_registered(a_ep, 8);
    let mut a2 = a2;
    for (rkey, status) in [
        (old.rkey, WcStatus::REM_ACCESS_ERR),
        (moved.rkey, WcStatus::SUCCESS),
    ] {
        let (mut a3, _b3) = fabric.reconnect_on(&a2, 0, &b2, 1);
        let wr = SendWr {
            wr_id: 1,
            op: SendOp::Write,
            payload: Payload::Local(crate::nic::Sge {
                addr: a_buf.addr,
                len: 8,
                lkey: a_buf.lkey,
            }),
            remote_addr: old.addr,
            rkey,
            signaled: true,
        };
        a3.post_send(&[wr]).unwrap();
        fabric.run_until_idle();
        assert_eq!(poll_all(&mut a3)[0].status, status);
        a2 = a3;
    }
}

#[test]
#[should_panic(expected = "not connected yet")]
fn a_send_on_a_queue_pair_not_joined_panics() {
    let fabric = Fabric::new();
    let (a_ep, b_ep) = (fabric.endpoint(), fabric.endpoint());
    let (a, _b) = fabric.connect(a_ep, config(0), b_ep, config(0));
    let mut fresh = fabric.successor(&a, 1);
    let wr = SendWr {
        wr_id: 1,
        op: SendOp::Write,
        payload: Payload::Empty,
        remote_addr: 0,
        rkey: 0,
        signaled: true,
    };
    let _ = fresh.post_send(&[wr]);
}

#[test]
fn vanished_peer_is_retry_exceeded() {
    let mut s = setup();
    s.fabric.vanish(s.b_ep);
    let wr = write(&s, SendOp::Write, 8, false);
    s.a.post_send(&[wr]).unwrap();
    s.fabric.step();
    assert_eq!(poll_all(&mut s.a)[0].status, WcStatus::RETRY_EXC_ERR);
}

#[test]
#[should_panic(expected = "exceeds max_inline")]
fn inline_beyond_max_inline_panics() {
    let mut s = setup();
    let mut wr = write(&s, SendOp::Write, 0, false);
    wr.payload = Payload::Inline(&[0; 17]);
    let _ = s.a.post_send(&[wr]);
}

#[test]
#[should_panic(expected = "send queue overrun")]
fn send_queue_overrun_panics() {
    let mut s = setup();
    let wr = write(&s, SendOp::Write, 8, false);
    let _ = s.a.post_send(&[wr; 5]);
}

#[test]
#[should_panic(expected = "receive queue overrun")]
fn receive_queue_overrun_panics() {
    let mut s = setup();
    for i in 0..3 {
        let _ = s.b.post_recv(i);
    }
}

#[test]
#[should_panic(expected = "completion queue overrun")]
fn completion_queue_overrun_panics() {
    let fabric = Fabric::new();
    let a_ep = fabric.endpoint();
    let b_ep = fabric.endpoint();
    let small_cq = QpConfig {
        cq_depth: 2,
        ..config(16)
    };
    let (mut a, _b) = fabric.connect(a_ep, small_cq, b_ep, config(16));
    let src = fabric.alloc_registered(a_ep, 8);
    let dst = fabric.alloc_registered(b_ep, 8);
    let wr = SendWr {
        wr_id: 1,
        op: SendOp::Write,
        payload: Payload::Local(crate::nic::Sge {
            addr: src.addr,
            len: 8,
            lkey: src.lkey,
        }),
        remote_addr: dst.addr,
        rkey: dst.rkey,
        signaled: true,
    };
    a.post_send(&[wr; 3]).unwrap();
    fabric.run_until_idle();
}

#[test]
#[should_panic(expected = "outside the staging region")]
fn staged_range_outside_staging_panics() {
    let mut s = setup();
    let mut wr = write(&s, SendOp::Write, 0, false);
    wr.payload = Payload::Staged { offset: 60, len: 8 };
    let _ = s.a.post_send(&[wr]);
}
