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
