//! A fused device's multi-lane connection with port failover on the simulated fabric, driven
//! through [`MultiSend`]/[`MultiRecv`] as the plugin drives it: every lane behind a
//! [`Guarded`] NIC (armed only with failover on), the lanes' journals kept by the multi
//! connection, a failing lane blocked, quiesced, snapshotted and replayed through the
//! connection's failover hooks, then resumed. The harness of the multi-lane failover tests and
//! of the fuzz target's multi mode: [`MultiFailoverPair::run`] pushes one verified message
//! stream through it while the caller cuts ports.

use std::collections::VecDeque;
use std::vec::Vec;

use super::failover_pair::{Outcome, Stream, Tamper};
use super::pair::{qp_configs, recv_buf, send_buf};
use super::suite::pattern;
use super::{EndpointId, Fabric, SimNic};
use crate::data::failover::{
    Action, Failover, FailoverConfig, FailoverError, Guarded, QpInfo, Report, Role,
};
use crate::data::multi::{MultiRecv, MultiSend};
use crate::data::{
    Completed, DataError, MAX_RECVS, RecvBuf, RecvConn, RequestId, SendBuf, SendConn,
};

/// One end: its multi-lane connection, its lanes' NICs and its failover machine.
#[derive(Debug)]
struct End<M> {
    conn: M,
    nics: Vec<Guarded<SimNic>>,
    /// Per lane: quiescing (call `failover_quiesce` until it says done).
    quiescing: Vec<bool>,
    /// Per lane: the new queue pair, created and not swapped in yet.
    next: Vec<Option<SimNic>>,
    fo: Failover,
    gave_up: Option<FailoverError>,
    /// Reports from the peer, not handled yet.
    inbox: VecDeque<Vec<u8>>,
}

impl<M> End<M> {
    fn new(conn: M, nics: Vec<SimNic>, armed: bool, fo: Failover) -> Self {
        let lanes = nics.len();
        Self {
            conn,
            nics: nics.into_iter().map(|n| Guarded::new(n, armed)).collect(),
            quiescing: std::vec![false; lanes],
            next: std::vec![None; lanes],
            fo,
            gave_up: None,
            inbox: VecDeque::new(),
        }
    }
}

/// A multi-lane connection with failover through its multi driver, on a simulated fabric.
#[derive(Debug)]
pub struct MultiFailoverPair {
    /// The fabric.
    pub fabric: Fabric,
    send_ep: EndpointId,
    recv_ep: EndpointId,
    send: End<MultiSend>,
    recv: End<MultiRecv>,
    /// The first error a caller's call returned (the connection failed).
    pub error: Option<DataError>,
    /// Receives posted ahead at most.
    pub window: usize,
    /// Receives posted, and those not yet checked (their request and buffers).
    posted: usize,
    recvs: VecDeque<(usize, RequestId, Vec<RecvBuf>)>,
    /// The next receive's buffers, kept while the multi driver refuses it (its retry must be
    /// the same call).
    next_recv: Option<(Vec<RecvBuf>, [u32; MAX_RECVS])>,
    checked: usize,
    /// The next send, as (receive, buffer), and its buffer while refused.
    send_at: (usize, usize),
    next_send: Option<SendBuf>,
    sends: VecDeque<RequestId>,
    sent_done: usize,
    /// Calls refused (`Ok(None)`) while a lane they needed was blocked.
    pub refused_blocked: usize,
    /// A report to rewrite, if any (a peer that lies).
    pub tamper: Option<Tamper>,
    reports: usize,
}

impl MultiFailoverPair {
    /// `lanes` lanes cutting each message over `width` of them (1: round-robin; `lanes`:
    /// split), queue pairs allowing `max_inline` inline bytes, adaptive routing above
    /// `ar_threshold`, the two ends' failover configurations (`lane_ports` of `lanes`
    /// entries). An end's tripwires are armed and its journals kept only when failover is on
    /// at both ends (as negotiated).
    pub fn new(
        (lanes, width): (usize, usize),
        max_inline: usize,
        ar_threshold: Option<u64>,
        send_config: FailoverConfig,
        recv_config: FailoverConfig,
    ) -> Self {
        let fabric = Fabric::new();
        let send_ep = fabric.endpoint();
        let recv_ep = fabric.endpoint();
        let (sc, rc) = qp_configs(max_inline);
        let (mut send_conns, mut recv_conns) = (Vec::new(), Vec::new());
        let (mut send_nics, mut recv_nics) = (Vec::new(), Vec::new());
        for _ in 0..lanes {
            let (send_nic, recv_nic) = fabric.connect(send_ep, sc, recv_ep, rc);
            send_conns.push(SendConn::new(recv_nic.inbound_region()));
            recv_conns.push(RecvConn::new(send_nic.inbound_region()));
            send_nics.push(send_nic);
            recv_nics.push(recv_nic);
        }
        let on = send_config.enabled && recv_config.enabled;
        let mut send = MultiSend::with_width(send_conns, width, ar_threshold);
        let mut recv = MultiRecv::with_width(recv_conns, width);
        if on {
            send.enable_failover();
            recv.enable_failover();
        }
        Self {
            send: End::new(
                send,
                send_nics,
                on,
                Failover::new(Role::Sender, send_config),
            ),
            recv: End::new(
                recv,
                recv_nics,
                on,
                Failover::new(Role::Receiver, recv_config),
            ),
            fabric,
            send_ep,
            recv_ep,
            error: None,
            window: 16,
            posted: 0,
            recvs: VecDeque::new(),
            next_recv: None,
            checked: 0,
            send_at: (0, 0),
            next_send: None,
            sends: VecDeque::new(),
            sent_done: 0,
            refused_blocked: 0,
            tamper: None,
            reports: 0,
        }
    }

    /// The sending NIC of `lane` (its current queue pair).
    pub fn send_nic(&self, lane: usize) -> &SimNic {
        &self.send.nics[lane].nic
    }

    /// The receiving NIC of `lane`.
    pub fn recv_nic(&self, lane: usize) -> &SimNic {
        &self.recv.nics[lane].nic
    }

    /// Lanes of the connection.
    pub fn lanes(&self) -> usize {
        self.send.nics.len()
    }

    /// The sending end's machine.
    pub fn send_fo(&self) -> &Failover {
        &self.send.fo
    }

    /// The receiving end's machine.
    pub fn recv_fo(&self) -> &Failover {
        &self.recv.fo
    }

    /// Why the sending end gave up, if it did.
    pub fn send_gave_up(&self) -> Option<FailoverError> {
        self.send.gave_up
    }

    /// Why the receiving end gave up, if it did.
    pub fn recv_gave_up(&self) -> Option<FailoverError> {
        self.recv.gave_up
    }

    /// Drive `stream` to the end, calling `inject(self, step)` after each fabric step. Every
    /// receive is checked byte for byte, in order, when it completes. Panics when a check
    /// fails.
    pub fn run(&mut self, stream: &Stream, mut inject: impl FnMut(&mut Self, usize)) -> Outcome {
        let mut step = 0usize;
        let mut idle = 0usize;
        loop {
            if let Some(err) = self.error {
                return Outcome::Failed(err);
            }
            let mut moved = match self.drive(stream) {
                Ok(moved) => moved,
                Err(err) => {
                    self.error = Some(err);
                    continue;
                }
            };
            moved |= self.failover_progress();
            let sends: usize = stream.sizes.iter().map(Vec::len).sum();
            if self.checked == stream.sizes.len() && self.sent_done == sends {
                return Outcome::Done;
            }
            if self.fabric.step() {
                moved = true;
            }
            inject(self, step);
            step += 1;
            if moved {
                idle = 0;
            } else {
                idle += 1;
                if idle >= 1000 {
                    return Outcome::Stuck;
                }
            }
        }
    }

    /// Post, test and check what the connection can; whether anything moved.
    fn drive(&mut self, stream: &Stream) -> Result<bool, DataError> {
        let mut moved = false;
        while self.posted < stream.sizes.len() && self.recvs.len() < self.window {
            let j = self.posted;
            // Every other receive goes through the keyed call (one device) with the buffers'
            // own keys wrong: only the per-device keys are valid, so a replay that rewrote the
            // clear-to-send entries from anything but the keys offered would fail.
            let keyed = j % 3 == 1;
            let (bufs, keys) = self.next_recv.take().unwrap_or_else(|| {
                let mut keys = [0u32; MAX_RECVS];
                let bufs = stream.sizes[j]
                    .iter()
                    .zip(&mut keys)
                    .map(|(&len, key)| {
                        let mut buf = recv_buf(&self.fabric, self.recv_ep, len.max(1));
                        *key = buf.rkey;
                        if keyed {
                            buf.rkey = !buf.rkey;
                        }
                        buf
                    })
                    .collect();
                (bufs, keys)
            });
            let tags: Vec<u32> = (0..bufs.len() as u32).collect();
            let posted = if keyed {
                let nics = &mut self.recv.nics;
                self.recv.conn.irecv_keyed(nics, &bufs, &[keys], &tags)?
            } else {
                self.recv.conn.irecv(&mut self.recv.nics, &bufs, &tags)?
            };
            let Some(req) = posted else {
                let conn = &self.recv.conn;
                self.refused_blocked +=
                    usize::from((0..conn.lanes()).any(|l| conn.lane_blocked(l as u8)));
                self.next_recv = Some((bufs, keys));
                break;
            };
            self.recvs.push_back((j, req, bufs));
            self.posted += 1;
            moved = true;
        }
        while self.send_at.0 < stream.sizes.len() {
            let (j, k) = self.send_at;
            let len = stream.sizes[j][k];
            let buf = self
                .next_send
                .take()
                .unwrap_or_else(|| send_buf(&self.fabric, self.send_ep, &pattern(seed(j, k), len)));
            let nics = &mut self.send.nics;
            let posted = if j % 3 == 1 {
                self.send
                    .conn
                    .isend_keyed(nics, buf, &[buf.lkey], k as u32)?
            } else {
                self.send.conn.isend(nics, buf, k as u32)?
            };
            let Some(req) = posted else {
                let conn = &self.send.conn;
                self.refused_blocked +=
                    usize::from((0..conn.lanes()).any(|l| conn.lane_blocked(l as u8)));
                self.next_send = Some(buf);
                break;
            };
            self.sends.push_back(req);
            self.send_at = if k + 1 == stream.sizes[j].len() {
                (j + 1, 0)
            } else {
                (j, k + 1)
            };
            moved = true;
        }
        while let Some(&req) = self.sends.front() {
            match self.send.conn.test(&mut self.send.nics, req)? {
                Completed::Pending => break,
                Completed::Done { .. } => {
                    self.sends.pop_front();
                    self.sent_done += 1;
                    moved = true;
                }
            }
        }
        while let Some((j, req, bufs)) = self.recvs.front().cloned() {
            match self.recv.conn.test(&mut self.recv.nics, req)? {
                Completed::Pending => break,
                Completed::Done { n, sizes } => {
                    assert_eq!(self.checked, j, "receives complete in order");
                    assert_eq!(usize::from(n), stream.sizes[j].len(), "recv {j}");
                    for (k, buf) in bufs.iter().enumerate() {
                        let len = stream.sizes[j][k];
                        assert_eq!(sizes[k] as usize, len, "recv {j} buf {k}");
                        assert_eq!(
                            self.fabric.read(self.recv_ep, buf.addr, len),
                            pattern(seed(j, k), len),
                            "recv {j} buf {k}: bytes"
                        );
                    }
                    self.recvs.pop_front();
                    self.checked += 1;
                    moved = true;
                }
            }
        }
        Ok(moved)
    }

    /// The plugin's failover driver: trips become machine inputs, the machines' actions are
    /// carried out through the multi connections' hooks, reports cross the socket (one call
    /// later).
    fn failover_progress(&mut self) -> bool {
        let mut moved = false;
        let now = self.fabric.now();
        let (mut delivered_recv, mut delivered_send) =
            (self.recv.inbox.len(), self.send.inbox.len());
        for _ in 0..64 {
            let mut again = false;
            feed_trips(&mut self.send, now);
            feed_trips(&mut self.recv, now);
            while let Some(action) = self.send.fo.poll_action() {
                self.act(true, action);
                again = true;
            }
            while let Some(action) = self.recv.fo.poll_action() {
                self.act(false, action);
                again = true;
            }
            again |= quiesce_send(&mut self.send) | quiesce_recv(&mut self.recv);
            // Reports sent in an earlier call arrive now; this call's wait for the next one,
            // so a failover spans calls of the data path, which must find the lane blocked.
            for _ in 0..delivered_recv {
                let bytes = self.recv.inbox.pop_front().expect("counted");
                self.recv.fo.handle_peer(&bytes, now);
                again = true;
            }
            for _ in 0..delivered_send {
                let bytes = self.send.inbox.pop_front().expect("counted");
                self.send.fo.handle_peer(&bytes, now);
                again = true;
            }
            (delivered_recv, delivered_send) = (0, 0);
            self.send.fo.handle_timeout(now);
            self.recv.fo.handle_timeout(now);
            if !again {
                break;
            }
            moved = true;
        }
        moved
    }

    /// `r`, rewritten when it is the report [`tamper`](Self::tamper) names.
    fn tampered(&mut self, mut r: Report) -> Report {
        let number = self.reports;
        self.reports += 1;
        if let Some(t) = self.tamper.filter(|t| t.report == number) {
            t.apply(&mut r);
        }
        r
    }

    /// The lane's new queue-pair pair, made by whichever end asks first.
    fn new_qp(&mut self, lane: usize, sender: bool) -> SimNic {
        if self.send.next[lane].is_none() && self.recv.next[lane].is_none() {
            let (s, r) = self
                .fabric
                .reconnect(&self.send.nics[lane].nic, &self.recv.nics[lane].nic);
            self.send.next[lane] = Some(s);
            self.recv.next[lane] = Some(r);
        }
        let nic = if sender {
            self.send.next[lane].clone()
        } else {
            self.recv.next[lane].clone()
        };
        nic.expect("made together")
    }

    fn act(&mut self, sender: bool, action: Action) {
        let now = self.fabric.now();
        match action {
            Action::QuiesceLane { lane } => {
                let l = usize::from(lane);
                if sender {
                    self.send.conn.block_lane(lane);
                    self.fabric.fault_qp_error(&self.send.nics[l].nic);
                    self.send.quiescing[l] = true;
                } else {
                    self.recv.conn.block_lane(lane);
                    self.fabric.fault_qp_error(&self.recv.nics[l].nic);
                    self.recv.quiescing[l] = true;
                }
            }
            Action::CreateQp { lane, .. } => {
                let nic = self.new_qp(usize::from(lane), sender);
                let info = QpInfo::new(&nic.qp_num().to_le_bytes()).expect("fits");
                if sender {
                    self.send.fo.handle_qp_created(lane, info);
                } else {
                    self.recv.fo.handle_qp_created(lane, info);
                }
            }
            Action::SendReport(r) => {
                let bytes = self.tampered(r).encode().to_vec();
                if sender {
                    self.recv.inbox.push_back(bytes);
                } else {
                    self.send.inbox.push_back(bytes);
                }
            }
            Action::Replay {
                lane,
                plan,
                peer_qp,
            } => {
                let l = usize::from(lane);
                // The peer's new queue pair (swapped in already if it replayed first).
                let peer = if sender {
                    self.recv.next[l].as_ref().unwrap_or(&self.recv.nics[l].nic)
                } else {
                    self.send.next[l].as_ref().unwrap_or(&self.send.nics[l].nic)
                };
                assert_eq!(peer_qp.as_bytes(), peer.qp_num().to_le_bytes());
                if sender {
                    let fresh = self.send.next[l].take().expect("created");
                    self.send.nics[l] = Guarded::new(fresh, true);
                    let done = self
                        .send
                        .conn
                        .failover_replay(lane, &mut self.send.nics[l], &plan);
                    self.send.fo.handle_replayed(lane, done, now);
                } else {
                    let fresh = self.recv.next[l].take().expect("created");
                    self.recv.nics[l] = Guarded::new(fresh, true);
                    let done = self
                        .recv
                        .conn
                        .failover_replay(lane, &mut self.recv.nics[l], &plan);
                    self.recv.fo.handle_replayed(lane, done, now);
                }
            }
            Action::Resume { lane } => {
                if sender {
                    self.send.conn.resume_lane(lane);
                } else {
                    self.recv.conn.resume_lane(lane);
                }
            }
            Action::GiveUp { cause, reason } => {
                if sender {
                    self.send.gave_up = Some(reason);
                    self.send.conn.handle_fatal(cause);
                    self.send.quiescing.fill(false);
                } else {
                    self.recv.gave_up = Some(reason);
                    self.recv.conn.handle_fatal(cause);
                    self.recv.quiescing.fill(false);
                }
            }
        }
    }
}

/// A lane's first failed completion becomes its machine's input (the machine then fails the
/// lane over or gives up, either of which stops the feeding).
fn feed_trips<M>(end: &mut End<M>, now: crate::time::Instant) {
    for (lane, nic) in end.nics.iter().enumerate() {
        if let Some(c) = nic.trip.first
            && !end.fo.is_failing(lane as u8)
            && end.fo.gave_up().is_none()
        {
            end.fo.handle_completion_error(lane as u8, &c, now);
        }
    }
}

fn quiesce_send(end: &mut End<MultiSend>) -> bool {
    let mut finished = false;
    for lane in 0..end.nics.len() {
        if !end.quiescing[lane] {
            continue;
        }
        let l = lane as u8;
        match end.conn.failover_quiesce(l, &mut end.nics[lane]) {
            Ok(true) => {
                end.quiescing[lane] = false;
                finished = true;
                match end.conn.failover_snapshot(l) {
                    Ok(body) => end.fo.handle_quiesced(l, body),
                    Err(e) => end.fo.handle_lane_error(l, e),
                }
            }
            Ok(false) => {}
            Err(e) => {
                end.quiescing[lane] = false;
                end.fo.handle_lane_error(l, e);
            }
        }
    }
    finished
}

fn quiesce_recv(end: &mut End<MultiRecv>) -> bool {
    let mut finished = false;
    for lane in 0..end.nics.len() {
        if !end.quiescing[lane] {
            continue;
        }
        let l = lane as u8;
        match end.conn.failover_quiesce(l, &mut end.nics[lane]) {
            Ok(true) => {
                end.quiescing[lane] = false;
                finished = true;
                match end.conn.failover_snapshot(l) {
                    Ok(body) => end.fo.handle_quiesced(l, body),
                    Err(e) => end.fo.handle_lane_error(l, e),
                }
            }
            Ok(false) => {}
            Err(e) => {
                end.quiescing[lane] = false;
                end.fo.handle_lane_error(l, e);
            }
        }
    }
    finished
}

/// The pattern seed of send `k` of receive `j`.
fn seed(j: usize, k: usize) -> u64 {
    ((j as u64) << 8) ^ k as u64 ^ 0x5eed_0001
}
