//! Link flaps on the simulated fabric, with the event policy of [`crate::event`] applied the way
//! the plugin applies it: each side's device has an [`EventBook`] in which its connection is
//! registered, every event the device reports goes through it, and a connection the book says
//! failed is failed with [`EventBook::fatal_error`] (the plugin's data-path check, between calls).

use std::vec::Vec;

use super::suite::{done_sizes, pattern};
use super::{DataPair, EndpointId, Fabric};
use crate::data::Connection;
use crate::data::{Completed, DataError, RecvBuf, RequestId};
use crate::event::{DeviceEvent, EventBook, WatchId, rc_retry_budget};
use crate::nic::WcStatus;
use crate::time::Duration;

/// One side's device: its event book and the connection's registration in it.
struct Device {
    ep: EndpointId,
    book: EventBook,
    id: WatchId,
    seen: Vec<DeviceEvent>,
}

impl Device {
    fn new(ep: EndpointId, qp: u32, cq: u64) -> Self {
        let mut book = EventBook::new();
        let id = book.watch(qp, cq);
        Self {
            ep,
            book,
            id,
            seen: Vec::new(),
        }
    }

    /// Read the device's pending events into the book; the error to fail the connection with.
    fn check(&mut self, fabric: &Fabric) -> Option<DataError> {
        while let Some(event) = fabric.take_event(self.ep) {
            let name = match event {
                DeviceEvent::PortError { .. } => "port error",
                DeviceEvent::PortActive { .. } => "port active",
                _ => "other event",
            };
            self.book.handle(event, name);
            self.seen.push(event);
        }
        self.book.fatal_error(self.id)
    }
}

struct Flap {
    p: DataPair,
    send_dev: Device,
    recv_dev: Device,
}

impl Flap {
    fn new() -> Self {
        let p = DataPair::new(64);
        let send_dev = Device::new(p.send_ep, p.send_nic.qp_num(), p.send_nic.cq_handle());
        let recv_dev = Device::new(p.recv_ep, p.recv_nic.qp_num(), p.recv_nic.cq_handle());
        Self {
            p,
            send_dev,
            recv_dev,
        }
    }

    /// What the plugin does between data-path calls: apply device events to both connections.
    fn watch(&mut self) {
        if let Some(err) = self.send_dev.check(&self.p.fabric) {
            self.p.send.handle_fatal(err);
        }
        if let Some(err) = self.recv_dev.check(&self.p.fabric) {
            self.p.recv.handle_fatal(err);
        }
    }

    /// Let `total` pass in one-second ticks, stepping the fabric, applying events and testing
    /// every request each tick, as NCCL's progress thread keeps polling; every test must be
    /// `Pending` or `Done`, never an error.
    fn ride_out(&mut self, total: Duration, sends: &mut [Option<RequestId>], recvs: &[RequestId]) {
        let ticks = total.as_millis() / 1000;
        for _ in 0..ticks {
            self.p.fabric.advance(Duration::from_secs(1));
            self.p.fabric.step();
            self.watch();
            for req in recvs {
                let got = self.p.recv.test(&mut self.p.recv_nic, *req);
                assert_eq!(
                    got,
                    Ok(Completed::Pending),
                    "a receive failed or completed during the flap"
                );
            }
            for req in sends.iter().flatten() {
                let got = self.p.send.test(&mut self.p.send_nic, *req);
                assert_eq!(
                    got,
                    Ok(Completed::Pending),
                    "a send failed or completed during the flap"
                );
            }
            // A sender waiting for a clear-to-send keeps trying, and is told to try later.
            let probe = self.p.send_buf(&[1; 8]);
            assert_eq!(self.p.send.isend(&mut self.p.send_nic, probe, 99), Ok(None));
        }
    }
}

const MSG: usize = 4096;
const WINDOW: usize = 8;

fn post_receives(f: &mut Flap) -> (Vec<RecvBuf>, Vec<RequestId>) {
    let bufs: Vec<RecvBuf> = (0..WINDOW).map(|_| f.p.recv_buf(MSG)).collect();
    let reqs = bufs
        .iter()
        .map(|b| {
            f.p.recv
                .irecv(&mut f.p.recv_nic, &[*b], &[7])
                .expect("irecv")
                .expect("irecv accepted")
        })
        .collect();
    (bufs, reqs)
}

/// A fresh pair with [`WINDOW`] receives posted, whose receiver's link goes down before their
/// clear-to-send writes leave (they wait in its send queue) and stays down, polled, until
/// `short` seconds before the retry budget runs out.
fn receiver_link_down_until(short: u64) -> (Flap, Vec<RecvBuf>, Vec<RequestId>, Duration) {
    let budget = rc_retry_budget(20, 7).expect("finite");
    let mut f = Flap::new();
    let (bufs, recvs) = post_receives(&mut f);
    f.p.fabric.link_down(f.p.recv_ep);
    let ride = Duration::from_secs(budget.as_millis() / 1000 - short);
    f.ride_out(ride, &mut [], &recvs);
    (f, bufs, recvs, ride)
}

#[test]
fn a_link_flap_shorter_than_the_retry_budget_is_ridden_out_byte_exact() {
    let (mut f, bufs, recvs, ride) = receiver_link_down_until(4);
    f.p.fabric.link_up(f.p.recv_ep);
    f.p.fabric.run_until_idle();

    // The grants arrived; the sends go. Then the sender's link flaps with data in flight.
    let mut sends = Vec::new();
    for i in 0..WINDOW {
        let buf = f.p.send_buf(&pattern(i as u64, MSG));
        let mut req = None;
        for _ in 0..1000 {
            req = f.p.send.isend(&mut f.p.send_nic, buf, 7).expect("isend");
            if req.is_some() {
                break;
            }
            f.p.fabric.step();
        }
        sends.push(Some(req.expect("the clear-to-send arrived after the flap")));
        if i == 2 {
            f.p.fabric.link_down(f.p.send_ep);
        }
    }
    f.ride_out(ride, &mut sends, &recvs);
    f.p.fabric.link_up(f.p.send_ep);
    f.p.fabric.run_until_idle();
    f.watch();
    for (i, (req, buf)) in sends.iter().zip(&bufs).enumerate() {
        let send = f.p.send.test(&mut f.p.send_nic, req.expect("posted"));
        assert_eq!(
            done_sizes(send.expect("send survived the flap")),
            [MSG as u64]
        );
        let recv = f.p.recv.test(&mut f.p.recv_nic, recvs[i]);
        assert_eq!(
            done_sizes(recv.expect("receive survived the flap")),
            [MSG as u64]
        );
        assert_eq!(
            f.p.received(buf, MSG),
            pattern(i as u64, MSG),
            "message {i}"
        );
    }
    // Both devices reported the flaps, and the connections go on.
    assert!(
        f.recv_dev
            .seen
            .contains(&DeviceEvent::PortError { port: 1 })
    );
    assert!(
        f.send_dev
            .seen
            .contains(&DeviceEvent::PortActive { port: 1 })
    );
    assert_eq!(f.p.send.failure(), None);
    assert_eq!(f.p.recv.failure(), None);
    let (bufs, recvs) = post_receives(&mut f);
    for (i, recv) in recvs.iter().enumerate() {
        let buf = f.p.send_buf(&pattern(100 + i as u64, MSG));
        let send = super::suite::isend(&mut f.p, buf, 7);
        super::suite::finish_send(&mut f.p, send).expect("send after the flaps");
        super::suite::finish_recv(&mut f.p, *recv).expect("receive after the flaps");
        assert_eq!(f.p.received(&bufs[i], MSG), pattern(100 + i as u64, MSG));
    }
}

#[test]
fn a_link_down_past_the_retry_budget_fails_the_connection_with_retry_exhaustion() {
    // Within the budget nothing fails.
    let (mut f, _, recvs, _) = receiver_link_down_until(1);
    // Past it, the waiting clear-to-send write fails the receiver's queue pair.
    f.p.fabric.advance(Duration::from_secs(3));
    f.p.fabric.run_until_idle();
    f.watch();
    match f.p.recv.test(&mut f.p.recv_nic, recvs[0]) {
        Err(DataError::Completion { status, .. }) => assert_eq!(status, WcStatus::RETRY_EXC_ERR),
        other => panic!("expected retry exhaustion, got {other:?}"),
    }
    for req in &recvs[1..] {
        assert!(f.p.recv.test(&mut f.p.recv_nic, *req).is_err(), "sticky");
    }
    // Not because of the port event: the book failed nothing.
    assert_eq!(f.recv_dev.book.failure(f.recv_dev.id), None);
}
