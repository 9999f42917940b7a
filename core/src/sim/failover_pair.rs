//! A connection of several lanes with port failover on the simulated fabric: each lane one
//! [`SendConn`]/[`RecvConn`] over its own queue-pair pair, each end a [`Failover`] machine, and
//! a driver that does what the plugin will do around them (tripwires, journals, quiescing, the
//! socket between the machines, swapping in new queue pairs). The harness of the failover tests
//! and fuzz target: [`FailoverPair::run`] pushes a verified message stream through it while the
//! caller injects port failures.

use std::collections::VecDeque;
use std::vec::Vec;

use super::pair::{qp_configs, recv_buf, send_buf};
use super::suite::pattern;
use super::{EndpointId, Fabric, SimNic, irecv_direct, isend_direct};
use crate::data::failover::{
    Action, Failover, FailoverConfig, FailoverError, Guarded, Plan, QpInfo, RecvJournal, Report,
    ReportBody, Role, SendJournal,
};
use crate::data::{Completed, Connection, DataError, RecvBuf, RecvConn, RequestId, SendConn};

/// One end of one lane.
#[derive(Debug)]
struct End<C> {
    conn: C,
    /// The lane's queue pair behind its (armed) tripwire.
    nic: Guarded<SimNic>,
    /// Quiescing: call the lane's `failover_quiesce` until it says done.
    quiescing: bool,
    /// The new queue pair, created and not swapped in yet.
    next: Option<SimNic>,
}

/// One lane's stream: receives of `groups[j]` buffers, buffer `k` of receive `j` filled by send
/// `(j, k)` of `sizes[j][k]` bytes with pattern `seed(j, k)`.
#[derive(Clone, Debug, Default)]
pub struct Stream {
    /// Per receive, the sizes of its sends (1 to 8 of them).
    pub sizes: Vec<Vec<usize>>,
}

#[derive(Debug, Default)]
struct Progress {
    /// Receives posted, and their requests and buffers not yet checked.
    posted: usize,
    recvs: VecDeque<(usize, RequestId, Vec<RecvBuf>)>,
    /// Receives checked (byte-exact, in order).
    checked: usize,
    /// Next send: receive and buffer.
    send_at: (usize, usize),
    sends: VecDeque<RequestId>,
    sent_done: usize,
}

/// A multi-lane connection with failover, on a simulated fabric.
#[derive(Debug)]
pub struct FailoverPair {
    /// The fabric.
    pub fabric: Fabric,
    send_ep: EndpointId,
    recv_ep: EndpointId,
    senders: Vec<End<SendConn>>,
    receivers: Vec<End<RecvConn>>,
    send_journals: Vec<SendJournal>,
    recv_journals: Vec<RecvJournal>,
    /// The sending end's machine.
    pub send_fo: Failover,
    /// The receiving end's machine.
    pub recv_fo: Failover,
    /// Reports on their way to the receiving end, and to the sending end.
    to_recv: VecDeque<Vec<u8>>,
    to_send: VecDeque<Vec<u8>>,
    /// Why each end gave up, when it did.
    pub send_gave_up: Option<FailoverError>,
    /// See `send_gave_up`.
    pub recv_gave_up: Option<FailoverError>,
    /// The first error a caller's call returned (the connection failed).
    pub error: Option<DataError>,
    progress: Vec<Progress>,
    /// Receives a lane keeps posted at most.
    pub window: usize,
    /// A report to rewrite, if any.
    pub tamper: Option<Tamper>,
    reports: usize,
}

/// What a step of [`FailoverPair::run`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every message arrived, exactly once, byte-exact, in order.
    Done,
    /// A call returned this error (the connection failed).
    Failed(DataError),
    /// Nothing moved for long: a hang (a bug, unless a report was tampered with).
    Stuck,
}

/// A report to rewrite on its way (a peer that lies): report number `report` (counting both
/// directions from 0) gets `a` and `b` added (wrapping) to its two numbers, re-encoded with a
/// valid check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tamper {
    /// Which report.
    pub report: usize,
    /// Added to its first number (`ended` or `oldest`).
    pub a: u32,
    /// Added to its second number (`acked` or `announced`).
    pub b: u32,
}

impl Tamper {
    /// Rewrite report `r`'s two numbers.
    pub(super) fn apply(&self, r: &mut Report) {
        match &mut r.body {
            ReportBody::Sender(s) => {
                s.ended = s.ended.wrapping_add(self.a);
                s.acked = s.acked.wrapping_add(self.b);
            }
            ReportBody::Receiver(s) => {
                s.oldest = s.oldest.wrapping_add(self.a);
                s.announced = s.announced.wrapping_add(self.b);
            }
            ReportBody::Refusal(_) => {}
        }
    }
}

impl FailoverPair {
    /// `lanes` lanes (at least 1) with the given configurations of the two ends (their
    /// `lane_ports` must have `lanes` entries), queue pairs allowing `max_inline` inline bytes.
    pub fn new(
        lanes: usize,
        max_inline: usize,
        send_config: FailoverConfig,
        recv_config: FailoverConfig,
    ) -> Self {
        let fabric = Fabric::new();
        let send_ep = fabric.endpoint();
        let recv_ep = fabric.endpoint();
        let (sc, rc) = qp_configs(max_inline);
        let mut senders = Vec::new();
        let mut receivers = Vec::new();
        for _ in 0..lanes {
            let (send_nic, recv_nic) = fabric.connect(send_ep, sc, recv_ep, rc);
            senders.push(End {
                conn: SendConn::new(recv_nic.inbound_region()),
                nic: Guarded::new(send_nic.clone(), true),
                quiescing: false,
                next: None,
            });
            receivers.push(End {
                conn: RecvConn::new(send_nic.inbound_region()),
                nic: Guarded::new(recv_nic, true),
                quiescing: false,
                next: None,
            });
        }
        Self {
            fabric,
            send_ep,
            recv_ep,
            senders,
            receivers,
            send_journals: (0..lanes).map(|_| SendJournal::new()).collect(),
            recv_journals: (0..lanes).map(|_| RecvJournal::new()).collect(),
            send_fo: Failover::new(Role::Sender, send_config),
            recv_fo: Failover::new(Role::Receiver, recv_config),
            to_recv: VecDeque::new(),
            to_send: VecDeque::new(),
            send_gave_up: None,
            recv_gave_up: None,
            error: None,
            progress: (0..lanes).map(|_| Progress::default()).collect(),
            window: 16,
            tamper: None,
            reports: 0,
        }
    }

    /// The sending NIC of `lane` (its current queue pair).
    pub fn send_nic(&self, lane: usize) -> &SimNic {
        &self.senders[lane].nic.nic
    }

    /// The receiving NIC of `lane` (its current queue pair).
    pub fn recv_nic(&self, lane: usize) -> &SimNic {
        &self.receivers[lane].nic.nic
    }

    /// The sending connection of `lane`.
    pub fn sender(&mut self, lane: usize) -> &mut SendConn {
        &mut self.senders[lane].conn
    }

    /// Drive `streams` (one per lane) to the end, calling `inject(self, step)` after each
    /// fabric step. Every receive is checked byte for byte, in order, when it completes.
    /// Panics when a check fails.
    pub fn run(&mut self, streams: &[Stream], mut inject: impl FnMut(&mut Self, usize)) -> Outcome {
        let mut step = 0usize;
        let mut idle = 0usize;
        loop {
            if let Some(err) = self.error {
                return Outcome::Failed(err);
            }
            let mut moved = false;
            for (lane, stream) in streams.iter().enumerate() {
                match self.drive_lane(lane, stream) {
                    Ok(m) => moved |= m,
                    Err(err) => {
                        self.error.get_or_insert(err);
                    }
                }
            }
            if self.error.is_some() {
                continue;
            }
            moved |= self.failover_progress();
            if streams
                .iter()
                .enumerate()
                .all(|(lane, s)| self.lane_done(lane, s))
            {
                return Outcome::Done;
            }
            if self.fabric.step() {
                moved = true;
            }
            // Right after the step: its completions are not polled yet (a lost acknowledgement
            // is one of a write that executed).
            inject(self, step);
            step += 1;
            if moved {
                idle = 0;
            } else {
                idle += 1;
                // A failover waits on the peer only through the socket, delivered above:
                // nothing moving for this long is a hang.
                if idle >= 1000 {
                    return Outcome::Stuck;
                }
            }
        }
    }

    fn lane_done(&self, lane: usize, stream: &Stream) -> bool {
        let p = &self.progress[lane];
        let sends: usize = stream.sizes.iter().map(Vec::len).sum();
        p.checked == stream.sizes.len() && p.sent_done == sends
    }

    /// Post, test and check what lane `lane` can; whether anything moved.
    fn drive_lane(&mut self, lane: usize, stream: &Stream) -> Result<bool, DataError> {
        let mut moved = false;
        // Receives, in order, within the window.
        while !self.recv_fo.is_failing(lane as u8)
            && self.progress[lane].posted < stream.sizes.len()
            && self.progress[lane].recvs.len() < self.window
        {
            let j = self.progress[lane].posted;
            let bufs: Vec<RecvBuf> = stream.sizes[j]
                .iter()
                .map(|&len| recv_buf(&self.fabric, self.recv_ep, len.max(1)))
                .collect();
            let tags: Vec<u32> = (0..bufs.len() as u32).collect();
            let end = &mut self.receivers[lane];
            let nic = &mut end.nic;
            let Some(req) = irecv_direct(&mut end.conn, nic, &bufs, &tags)? else {
                break;
            };
            self.recv_journals[lane].note(req, &bufs, &tags);
            let p = &mut self.progress[lane];
            p.recvs.push_back((j, req, bufs));
            p.posted += 1;
            moved = true;
        }
        // Sends, in order.
        while !self.send_fo.is_failing(lane as u8)
            && self.progress[lane].send_at.0 < stream.sizes.len()
        {
            let (j, k) = self.progress[lane].send_at;
            let len = stream.sizes[j][k];
            let buf = send_buf(&self.fabric, self.send_ep, &pattern(seed(lane, j, k), len));
            let end = &mut self.senders[lane];
            let nic = &mut end.nic;
            let Some(req) = isend_direct(&mut end.conn, nic, buf, k as u32)? else {
                break;
            };
            self.send_journals[lane].note(req, buf, k as u32, 0);
            let p = &mut self.progress[lane];
            p.sends.push_back(req);
            p.send_at = if k + 1 == stream.sizes[j].len() {
                (j + 1, 0)
            } else {
                (j, k + 1)
            };
            moved = true;
        }
        // Test sends (any order is fine; oldest first).
        if !self.send_fo.is_failing(lane as u8) {
            let end = &mut self.senders[lane];
            let nic = &mut end.nic;
            let p = &mut self.progress[lane];
            while let Some(&req) = p.sends.front() {
                match end.conn.test(nic, req)? {
                    Completed::Pending => break,
                    Completed::Done { .. } => {
                        p.sends.pop_front();
                        p.sent_done += 1;
                        moved = true;
                    }
                }
            }
        }
        // Test receives in order and check their bytes.
        if !self.recv_fo.is_failing(lane as u8) {
            let end = &mut self.receivers[lane];
            let nic = &mut end.nic;
            while let Some((j, req, bufs)) = self.progress[lane].recvs.front().cloned() {
                match end.conn.test(nic, req)? {
                    Completed::Pending => break,
                    Completed::Done { n, sizes } => {
                        assert_eq!(
                            self.progress[lane].checked, j,
                            "lane {lane}: receives complete in order"
                        );
                        assert_eq!(
                            usize::from(n),
                            stream.sizes[j].len(),
                            "lane {lane} recv {j}"
                        );
                        for (k, buf) in bufs.iter().enumerate() {
                            let len = stream.sizes[j][k];
                            assert_eq!(sizes[k] as usize, len, "lane {lane} recv {j} buf {k}");
                            assert_eq!(
                                self.fabric.read(self.recv_ep, buf.addr, len),
                                pattern(seed(lane, j, k), len),
                                "lane {lane} recv {j} buf {k}: bytes"
                            );
                        }
                        let p = &mut self.progress[lane];
                        p.recvs.pop_front();
                        p.checked += 1;
                        moved = true;
                    }
                }
            }
        }
        Ok(moved)
    }

    /// What the plugin's failover driver does: trips become machine inputs, the machines'
    /// actions are carried out, reports cross the socket. Whether anything moved.
    fn failover_progress(&mut self) -> bool {
        let mut moved = false;
        let now = self.fabric.now();
        for _ in 0..64 {
            let mut again = false;
            for (lane, end) in self.senders.iter().enumerate() {
                if let Some(c) = end.nic.trip.first
                    && !self.send_fo.is_failing(lane as u8)
                    && self.send_gave_up.is_none()
                {
                    self.send_fo.handle_completion_error(lane as u8, &c, now);
                }
            }
            for (lane, end) in self.receivers.iter().enumerate() {
                if let Some(c) = end.nic.trip.first
                    && !self.recv_fo.is_failing(lane as u8)
                    && self.recv_gave_up.is_none()
                {
                    self.recv_fo.handle_completion_error(lane as u8, &c, now);
                }
            }
            while let Some(action) = self.send_fo.poll_action() {
                self.act_send(action);
                again = true;
            }
            while let Some(action) = self.recv_fo.poll_action() {
                self.act_recv(action);
                again = true;
            }
            again |= self.quiesce_step();
            while let Some(bytes) = self.to_recv.pop_front() {
                self.recv_fo.handle_peer(&bytes, now);
                again = true;
            }
            while let Some(bytes) = self.to_send.pop_front() {
                self.send_fo.handle_peer(&bytes, now);
                again = true;
            }
            self.send_fo.handle_timeout(now);
            self.recv_fo.handle_timeout(now);
            if !again {
                break;
            }
            moved = true;
        }
        moved
    }

    /// Quiesce the lanes that are quiescing; whether one finished.
    fn quiesce_step(&mut self) -> bool {
        let mut finished = false;
        for lane in 0..self.senders.len() {
            let end = &mut self.senders[lane];
            if end.quiescing {
                let nic = &mut end.nic;
                match end.conn.failover_quiesce(nic) {
                    Ok(true) => {
                        end.quiescing = false;
                        finished = true;
                        match end.conn.failover_snapshot() {
                            Ok(s) => self
                                .send_fo
                                .handle_quiesced(lane as u8, ReportBody::Sender(s)),
                            Err(e) => self
                                .send_fo
                                .handle_lane_error(lane as u8, FailoverError::Local(e)),
                        }
                    }
                    Ok(false) => {}
                    Err(e) => {
                        end.quiescing = false;
                        self.send_fo.handle_lane_error(lane as u8, e);
                    }
                }
            }
            let end = &mut self.receivers[lane];
            if end.quiescing {
                let nic = &mut end.nic;
                match end.conn.failover_quiesce(nic) {
                    Ok(true) => {
                        end.quiescing = false;
                        finished = true;
                        let s = end.conn.failover_snapshot();
                        self.recv_fo
                            .handle_quiesced(lane as u8, ReportBody::Receiver(s));
                    }
                    Ok(false) => {}
                    Err(e) => {
                        end.quiescing = false;
                        self.recv_fo.handle_lane_error(lane as u8, e);
                    }
                }
            }
        }
        finished
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
        if self.senders[lane].next.is_none() && self.receivers[lane].next.is_none() {
            let (s, r) = self
                .fabric
                .reconnect(&self.senders[lane].nic.nic, &self.receivers[lane].nic.nic);
            self.senders[lane].next = Some(s);
            self.receivers[lane].next = Some(r);
        }
        let nic = if sender {
            self.senders[lane].next.clone()
        } else {
            self.receivers[lane].next.clone()
        };
        nic.expect("made together")
    }

    fn act_send(&mut self, action: Action) {
        match action {
            Action::QuiesceLane { lane } => {
                let end = &mut self.senders[usize::from(lane)];
                self.fabric.fault_qp_error(&end.nic.nic);
                end.quiescing = true;
            }
            Action::CreateQp { lane, .. } => {
                let nic = self.new_qp(usize::from(lane), true);
                let info = QpInfo::new(&nic.qp_num().to_le_bytes()).expect("fits");
                self.send_fo.handle_qp_created(lane, info);
            }
            Action::SendReport(r) => {
                let r = self.tampered(r);
                self.to_recv.push_back(r.encode().to_vec());
            }
            Action::Replay {
                lane,
                plan,
                peer_qp,
            } => {
                let l = usize::from(lane);
                let Plan::Sender(plan) = plan else {
                    panic!("a sender's plan")
                };
                // The peer's new queue pair (swapped in already if it replayed first).
                let peer = self.receivers[l]
                    .next
                    .as_ref()
                    .unwrap_or(&self.receivers[l].nic.nic);
                assert_eq!(peer_qp.as_bytes(), peer.qp_num().to_le_bytes());
                let end = &mut self.senders[l];
                end.nic = Guarded::new(end.next.take().expect("created"), true);
                let done =
                    end.conn
                        .failover_replay(&mut end.nic.nic, &plan, &self.send_journals[l]);
                self.send_fo.handle_replayed(lane, done, self.fabric.now());
            }
            Action::Resume { .. } => {}
            Action::GiveUp { cause, reason } => {
                self.send_gave_up = Some(reason);
                for end in &mut self.senders {
                    end.conn.handle_fatal(cause);
                    end.quiescing = false;
                }
            }
        }
    }

    fn act_recv(&mut self, action: Action) {
        match action {
            Action::QuiesceLane { lane } => {
                let end = &mut self.receivers[usize::from(lane)];
                self.fabric.fault_qp_error(&end.nic.nic);
                end.quiescing = true;
            }
            Action::CreateQp { lane, .. } => {
                let nic = self.new_qp(usize::from(lane), false);
                let info = QpInfo::new(&nic.qp_num().to_le_bytes()).expect("fits");
                self.recv_fo.handle_qp_created(lane, info);
            }
            Action::SendReport(r) => {
                let r = self.tampered(r);
                self.to_send.push_back(r.encode().to_vec());
            }
            Action::Replay {
                lane,
                plan,
                peer_qp,
            } => {
                let l = usize::from(lane);
                let Plan::Receiver(plan) = plan else {
                    panic!("a receiver's plan")
                };
                let peer = self.senders[l]
                    .next
                    .as_ref()
                    .unwrap_or(&self.senders[l].nic.nic);
                assert_eq!(peer_qp.as_bytes(), peer.qp_num().to_le_bytes());
                let end = &mut self.receivers[l];
                end.nic = Guarded::new(end.next.take().expect("created"), true);
                let done =
                    end.conn
                        .failover_replay(&mut end.nic.nic, &plan, &self.recv_journals[l]);
                self.recv_fo.handle_replayed(lane, done, self.fabric.now());
            }
            Action::Resume { .. } => {}
            Action::GiveUp { cause, reason } => {
                self.recv_gave_up = Some(reason);
                for end in &mut self.receivers {
                    end.conn.handle_fatal(cause);
                    end.quiescing = false;
                }
            }
        }
    }
}

/// The pattern seed of send `k` of receive `j` on `lane`.
fn seed(lane: usize, j: usize, k: usize) -> u64 {
    ((lane as u64) << 40) ^ ((j as u64) << 8) ^ k as u64 ^ 0x5eed
}
