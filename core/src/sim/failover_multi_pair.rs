//! A fused device's multi-lane connection with port failover on the simulated fabric, driven
//! through [`MultiSend`]/[`MultiRecv`] as the plugin drives it: every lane behind a
//! [`Guarded`] NIC (armed only with failover on), the lanes' journals kept by the multi
//! connection, a failing lane blocked, quiesced, snapshotted and replayed through the
//! connection's failover hooks, then resumed. The harness of the multi-lane failover tests and
//! of the fuzz target's multi mode: [`MultiFailoverPair::run`] pushes one verified message
//! stream through it while the caller cuts ports.
//!
//! A fused NIC of several devices (the configurations' `port_devices`): lane `i` starts on its
//! port's device, every user buffer is registered on every device and every message goes
//! through the keyed calls with one key per port (its device's; the buffers' own keys wrong),
//! so a lane posts with its member's keys; a lane moved to another device has its control
//! regions registered there and replays under a [`Rekey`](crate::data::failover::Rekey), a
//! rekeyed receiver telling the sender its new keys, as the plugin does.

use std::collections::VecDeque;
use std::vec::Vec;

use super::failover_pair::{
    Buffers, KeyFault, Outcome, Stream, Tamper, devices_of, lane_device, port_device, qp_info,
    read_qp_info, replay_rekey,
};
use super::pair::qp_configs;
use super::suite::pattern;
use super::{EndpointId, Fabric, SimNic};
use crate::data::failover::{
    Action, Failover, FailoverConfig, FailoverError, Guarded, KeyMap, Report, Role,
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
    /// Per lane: the new queue pair, created and not swapped in yet, and the port it is on.
    next: Vec<Option<SimNic>>,
    next_port: Vec<u8>,
    fo: Failover,
    config: FailoverConfig,
    gave_up: Option<FailoverError>,
    /// Reports from the peer, not handled yet.
    inbox: VecDeque<Vec<u8>>,
    /// Where its user buffers come from.
    bufs: Buffers,
    ep: EndpointId,
}

impl<M> End<M> {
    fn new(
        conn: M,
        nics: Vec<SimNic>,
        armed: bool,
        (role, config): (Role, FailoverConfig),
        bufs: Buffers,
        ep: EndpointId,
    ) -> Self {
        let lanes = nics.len();
        Self {
            conn,
            nics: nics.into_iter().map(|n| Guarded::new(n, armed)).collect(),
            quiescing: std::vec![false; lanes],
            next: std::vec![None; lanes],
            next_port: std::vec![0; lanes],
            fo: Failover::new(role, config.clone()),
            config,
            gave_up: None,
            inbox: VecDeque::new(),
            bufs,
            ep,
        }
    }

    /// The keys of the memory `key` names, one per port of the fused NIC (its device's).
    fn port_keys(&self, fabric: &Fabric, key: u32) -> Vec<u32> {
        (0..self.config.port_devices.len() as u8)
            .map(|port| {
                let device = port_device(&self.config, port);
                fabric
                    .key_on(self.ep, key, device)
                    .expect("user buffers are registered on every device")
            })
            .collect()
    }
}

/// A multi-lane connection with failover through its multi driver, on a simulated fabric.
#[derive(Debug)]
pub struct MultiFailoverPair {
    /// The fabric.
    pub fabric: Fabric,
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
    /// The next receive's buffers and keys (one set per port on several devices), kept while
    /// the multi driver refuses it (its retry must be the same call).
    next_recv: Option<(Vec<RecvBuf>, Vec<[u32; MAX_RECVS]>)>,
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
    /// The ports are on more than one device: every message goes through the keyed calls.
    devices: u8,
    /// A rekeying to break, if any.
    pub key_fault: Option<KeyFault>,
    /// Lane failovers an end started on the peer's report (its own queue pair had not failed).
    pub started_by_report: usize,
}

impl MultiFailoverPair {
    /// `lanes` lanes cutting each message over `width` of them (1: round-robin; `lanes`:
    /// split), queue pairs allowing `max_inline` inline bytes, adaptive routing above
    /// `ar_threshold`, the two ends' failover configurations (`lane_ports` of `lanes`
    /// entries). An end's tripwires are armed and its journals kept only when failover is on
    /// at both ends (as negotiated). Each lane's queue pairs are on the devices of its ports.
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
        let devices = devices_of([&send_config, &recv_config]);
        let (mut send_conns, mut recv_conns) = (Vec::new(), Vec::new());
        let (mut send_nics, mut recv_nics) = (Vec::new(), Vec::new());
        for lane in 0..lanes {
            let (send_nic, recv_nic) = fabric.connect_on(
                (send_ep, lane_device(&send_config, lane)),
                sc,
                (recv_ep, lane_device(&recv_config, lane)),
                rc,
            );
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
                (Role::Sender, send_config),
                Buffers::new(send_ep, devices),
                send_ep,
            ),
            recv: End::new(
                recv,
                recv_nics,
                on,
                (Role::Receiver, recv_config),
                Buffers::new(recv_ep, devices),
                recv_ep,
            ),
            fabric,
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
            devices,
            key_fault: None,
            started_by_report: 0,
        }
    }

    /// Give every user buffer its own registration (on every device), rather than carving
    /// them from a few when ports are on several devices.
    pub fn distinct_registrations(&mut self) {
        self.send.bufs.distinct = true;
        self.recv.bufs.distinct = true;
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
            // Every third receive goes through the keyed call (one device) with the buffers'
            // own keys wrong: only the per-device keys are valid, so a replay that rewrote the
            // clear-to-send entries from anything but the keys offered would fail. On several
            // devices every receive does, with one set of keys per port (its device's).
            let keyed = j % 3 == 1 || self.devices > 1;
            let (bufs, keys) = self.next_recv.take().unwrap_or_else(|| {
                let ports = if self.devices > 1 {
                    self.recv.config.port_devices.len()
                } else {
                    1
                };
                let mut keys = std::vec![[0u32; MAX_RECVS]; ports];
                let bufs = stream.sizes[j]
                    .iter()
                    .enumerate()
                    .map(|(b, &len)| {
                        let mut buf = self.recv.bufs.recv(&self.fabric, j, len.max(1));
                        let port_keys = self.recv.port_keys(&self.fabric, buf.rkey);
                        for (keys, key) in keys.iter_mut().zip(port_keys) {
                            keys[b] = key;
                        }
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
                self.recv.conn.irecv_keyed(nics, &bufs, &keys, &tags)?
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
            let buf = self.next_send.take().unwrap_or_else(|| {
                let bytes = pattern(seed(j, k), len);
                self.send.bufs.send(&self.fabric, j, &bytes)
            });
            let posted = if self.devices > 1 {
                // Each lane reads the buffer with its member's key (its device's); the buffer's
                // own key is wrong.
                let lkeys = self.send.port_keys(&self.fabric, buf.lkey);
                let wrong = SendBuf {
                    lkey: !buf.lkey,
                    ..buf
                };
                let nics = &mut self.send.nics;
                self.send.conn.isend_keyed(nics, wrong, &lkeys, k as u32)?
            } else if j % 3 == 1 {
                let nics = &mut self.send.nics;
                self.send
                    .conn
                    .isend_keyed(nics, buf, &[buf.lkey], k as u32)?
            } else {
                self.send.conn.isend(&mut self.send.nics, buf, k as u32)?
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

    fn act(&mut self, sender: bool, action: Action) {
        match action {
            Action::QuiesceLane { lane } => {
                let l = usize::from(lane);
                let end = if sender {
                    self.send.conn.block_lane(lane);
                    &mut self.send.quiescing
                } else {
                    self.recv.conn.block_lane(lane);
                    &mut self.recv.quiescing
                };
                end[l] = true;
                let nic = if sender {
                    &self.send.nics[l]
                } else {
                    &self.recv.nics[l]
                };
                self.started_by_report += usize::from(nic.trip.first.is_none());
                self.fabric.fault_qp_error(&nic.nic);
            }
            Action::CreateQp { lane, port } => {
                if sender {
                    create_qp(&mut self.send, &self.fabric, lane, port, |_, _| {
                        Ok(KeyMap::EMPTY)
                    });
                } else {
                    let drop_keys = self.key_fault == Some(KeyFault::NoPeerKeys);
                    create_qp(&mut self.recv, &self.fabric, lane, port, |conn, new_key| {
                        if drop_keys {
                            Ok(KeyMap::EMPTY)
                        } else {
                            conn.failover_peer_keys(lane, new_key)
                        }
                    });
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
                let fault = self.key_fault;
                if sender {
                    let peer = self.recv.next[l].as_ref().unwrap_or(&self.recv.nics[l].nic);
                    let fabric = &self.fabric;
                    replay(
                        &mut self.send,
                        fabric,
                        peer,
                        (lane, peer_qp),
                        fault,
                        |conn, nic, rekey, member| {
                            conn.failover_replay(lane, nic, &plan, rekey, member)
                        },
                    );
                } else {
                    let peer = self.send.next[l].as_ref().unwrap_or(&self.send.nics[l].nic);
                    let fabric = &self.fabric;
                    replay(
                        &mut self.recv,
                        fabric,
                        peer,
                        (lane, peer_qp),
                        fault,
                        |conn, nic, rekey, member| {
                            conn.failover_replay(lane, nic, &plan, rekey, member)
                        },
                    );
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

/// `end`'s `CreateQp { lane, port }`: the lane's new queue pair on the port's device (its
/// control regions registered there when that is another device); a receiver moving to another
/// device tells the sender its keys there (`peer_keys` from the old key → new key map).
fn create_qp<M>(
    end: &mut End<M>,
    fabric: &Fabric,
    lane: u8,
    port: u8,
    peer_keys: impl FnOnce(&M, &dyn Fn(u32) -> Option<u32>) -> Result<KeyMap, FailoverError>,
) {
    let l = usize::from(lane);
    let device = port_device(&end.config, port);
    let nic = fabric.successor(&end.nics[l].nic, device);
    assert_eq!(
        end.fo.moves_device(lane),
        device != end.nics[l].nic.device(),
        "the machine knows when a lane changes device"
    );
    let info = qp_info(&nic);
    end.next[l] = Some(nic);
    end.next_port[l] = port;
    let mut keys = KeyMap::EMPTY;
    if end.fo.moves_device(lane) {
        let (ep, from) = (end.ep, end.nics[l].nic.device());
        let map = |key| fabric.key_moved(ep, key, from, device);
        match peer_keys(&end.conn, &map) {
            Ok(told) => keys = told,
            Err(e) => return end.fo.handle_lane_error(lane, e),
        }
    }
    end.fo.handle_qp_created(lane, info, &keys);
}

/// `end`'s `Replay`: connect the lane's new queue pair to the peer's (`peer`, as `peer_qp`
/// names it), swap it in and replay (`replay_lane`) under the rekeying a move to another device
/// needs (broken as `fault` says).
fn replay<M>(
    end: &mut End<M>,
    fabric: &Fabric,
    peer: &SimNic,
    (lane, peer_qp): (u8, crate::data::failover::QpInfo),
    fault: Option<KeyFault>,
    replay_lane: impl FnOnce(
        &mut M,
        &mut Guarded<SimNic>,
        &crate::data::failover::Rekey<'_>,
        u8,
    ) -> Result<crate::data::failover::Replayed, FailoverError>,
) {
    let l = usize::from(lane);
    let (qp_num, peer_region) = read_qp_info(&peer_qp);
    assert_eq!(
        (qp_num, peer_region),
        (peer.qp_num(), peer.inbound_region())
    );
    let fresh = end.next[l].take().expect("created");
    if !fresh.is_connected() {
        fabric.join(&fresh, peer);
    }
    let (ep, device, from) = (end.ep, fresh.device(), end.nics[l].nic.device());
    let map = |key| fabric.key_moved(ep, key, from, device);
    let local = end
        .fo
        .moves_device(lane)
        .then_some(&map as &dyn Fn(u32) -> Option<u32>);
    let rekey = replay_rekey(peer_region, local, fault);
    end.nics[l] = Guarded::new(fresh, true);
    let done = replay_lane(&mut end.conn, &mut end.nics[l], &rekey, end.next_port[l]);
    end.fo.handle_replayed(lane, done, fabric.now());
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
