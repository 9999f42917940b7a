//! A connection of several lanes with port failover on the simulated fabric: each lane one
//! [`SendConn`]/[`RecvConn`] over its own queue-pair pair, each end a [`Failover`] machine, and
//! a driver that does what the plugin will do around them (tripwires, journals, quiescing, the
//! socket between the machines, swapping in new queue pairs). The harness of the failover tests
//! and fuzz target: [`FailoverPair::run`] pushes a verified message stream through it while the
//! caller injects port failures.
//!
//! Ports may belong to different devices (the configurations' `port_devices`): each lane's
//! queue pairs then start on their port's device, every user buffer is registered on every
//! device (as NCCL registers a buffer on every member of a fused NIC) and a lane posts with
//! its device's keys, and a lane moved to another device has its control regions registered
//! there and replays under a [`Rekey`] (a rekeyed receiver telling the sender its new keys),
//! as the plugin does. The simulator refuses a key of another device, so a stale key fails.

use std::collections::VecDeque;
use std::vec::Vec;

use super::pair::qp_configs;
use super::suite::pattern;
use super::{EndpointId, Fabric, MemoryRegion, SimNic, irecv_direct, isend_direct};
use crate::data::failover::{
    Action, Failover, FailoverConfig, FailoverError, Guarded, KeyMap, Plan, QpInfo, RecvJournal,
    Rekey, Report, ReportBody, Role, SendJournal,
};
use crate::data::{
    Completed, Connection, DataError, RecvBuf, RecvConn, RequestId, SendBuf, SendConn,
};
use crate::nic::RemoteRegion;

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

/// Where a failover harness takes its user buffers from. On one device each buffer is its own
/// registration. On several (a fused NIC of devices) each registration is made on every device
/// (NCCL registers a buffer on every member) and, unless `distinct`, buffers are carved from a
/// few of them, rotating over [`CLASSES`] (NCCL's buffers come from a few registrations too: a
/// receiver rekeyed to another device tells the sender at most
/// [`MAX_KEY_PAIRS`](crate::data::failover::MAX_KEY_PAIRS) keys).
#[derive(Debug)]
pub(super) struct Buffers {
    ep: EndpointId,
    devices: u8,
    /// Every buffer its own registration.
    pub(super) distinct: bool,
    /// Per class, the registration buffers are carved from and how much of it is used.
    chunks: [Option<(MemoryRegion, u64)>; CLASSES],
}

/// Registrations buffers are carved from, at once, on several devices.
const CLASSES: usize = 3;
/// Bytes of one (unless a buffer needs more).
const CHUNK: usize = 2 << 20;

impl Buffers {
    pub(super) fn new(ep: EndpointId, devices: u8) -> Self {
        Self {
            ep,
            devices: devices.max(1),
            distinct: false,
            chunks: [None; CLASSES],
        }
    }

    /// `len` bytes (at least 1 allocated) of class `class`, as named by their device-0
    /// registration (the keys of another device: [`Fabric::key_on`]).
    pub(super) fn take(&mut self, fabric: &Fabric, class: usize, len: usize) -> MemoryRegion {
        let len = len.max(1);
        let register = |size: usize| {
            let mr = fabric.alloc_registered(self.ep, size);
            for device in 1..self.devices {
                fabric.register_on(self.ep, mr.addr, mr.len, device);
            }
            mr
        };
        if self.devices == 1 || self.distinct {
            return register(len);
        }
        let need = (len as u64).div_ceil(64) * 64;
        let chunk = &mut self.chunks[class % CLASSES];
        if chunk.is_none_or(|(mr, used)| used + need > mr.len) {
            *chunk = Some((register(CHUNK.max(len)), 0));
        }
        let (mr, used) = chunk.as_mut().expect("just made");
        let addr = mr.addr + *used;
        *used += need;
        MemoryRegion {
            addr,
            len: len as u64,
            ..*mr
        }
    }

    /// A buffer holding `bytes`, to send from.
    pub(super) fn send(&mut self, fabric: &Fabric, class: usize, bytes: &[u8]) -> SendBuf {
        let mr = self.take(fabric, class, bytes.len());
        fabric.write(self.ep, mr.addr, bytes);
        SendBuf {
            addr: mr.addr,
            len: bytes.len() as u64,
            lkey: mr.lkey,
        }
    }

    /// A buffer of `len` bytes to receive into.
    pub(super) fn recv(&mut self, fabric: &Fabric, class: usize, len: usize) -> RecvBuf {
        let mr = self.take(fabric, class, len);
        RecvBuf {
            addr: mr.addr,
            len: len as u64,
            rkey: mr.rkey,
            host: true,
        }
    }
}

/// Devices the ports of `configs` belong to (the largest device number plus one).
pub(super) fn devices_of(configs: [&FailoverConfig; 2]) -> u8 {
    configs
        .iter()
        .flat_map(|c| c.port_devices.iter())
        .map(|&d| d.saturating_add(1))
        .max()
        .unwrap_or(1)
}

/// The device of `port` in `config` (0 for a port outside it).
pub(super) fn port_device(config: &FailoverConfig, port: u8) -> u8 {
    config
        .port_devices
        .get(usize::from(port))
        .copied()
        .unwrap_or(0)
}

/// A new queue pair's connection info as the harnesses' reports carry it (the plugin's
/// `EndpointInfo` carries the same): its number and its inbound region as the peer must write
/// it (a queue pair on another device has the region under a new key).
pub(super) fn qp_info(nic: &SimNic) -> QpInfo {
    let region = nic.inbound_region();
    let mut bytes = [0u8; 20];
    bytes[..4].copy_from_slice(&nic.qp_num().to_le_bytes());
    bytes[4..12].copy_from_slice(&region.addr.to_le_bytes());
    bytes[12..16].copy_from_slice(&region.rkey.to_le_bytes());
    bytes[16..].copy_from_slice(&region.len.to_le_bytes());
    QpInfo::new(&bytes).expect("fits")
}

/// [`qp_info`] read back: the queue pair's number and inbound region.
pub(super) fn read_qp_info(info: &QpInfo) -> (u32, RemoteRegion) {
    let b = info.as_bytes();
    assert_eq!(b.len(), 20, "a harness's queue-pair info");
    let word = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let region = RemoteRegion {
        addr: u64::from(word(4)) | u64::from(word(8)) << 32,
        rkey: word(12),
        len: word(16),
    };
    (word(0), region)
}

/// How a test breaks the rekeying of a lane that moves to another device (a driver bug): each
/// must fail the connection cleanly, never write with a stale key unnoticed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyFault {
    /// A rekeyed receiver tells the sender no keys.
    NoPeerKeys,
    /// An end that moved device replays with a map that knows no key.
    EmptyLocalMap,
    /// An end that moved device replays as if it had not (`Rekey::local` `None`): its replayed
    /// writes carry the old device's keys, which the simulator refuses.
    NoLocalMap,
}

/// What a driver replays a moved lane under: the peer's region from its info and, when this
/// end moves device (`to` its new device), its keys there (broken as `fault` says).
pub(super) fn replay_rekey<'a>(
    peer_region: RemoteRegion,
    local: Option<&'a dyn Fn(u32) -> Option<u32>>,
    fault: Option<KeyFault>,
) -> Rekey<'a> {
    static NONE: fn(u32) -> Option<u32> = |_| None;
    let local = match (local, fault) {
        (Some(_), Some(KeyFault::EmptyLocalMap)) => Some(&NONE as &dyn Fn(u32) -> Option<u32>),
        (Some(_), Some(KeyFault::NoLocalMap)) => None,
        (local, _) => local,
    };
    Rekey { peer_region, local }
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
    /// The two ends' configurations (their ports' devices).
    send_config: FailoverConfig,
    recv_config: FailoverConfig,
    send_bufs: Buffers,
    recv_bufs: Buffers,
    /// A rekeying to break, if any.
    pub key_fault: Option<KeyFault>,
    /// Lane failovers an end started on the peer's report (its own queue pair had not failed).
    pub started_by_report: usize,
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
            ReportBody::Refusal(_) | ReportBody::Keys(_) => {}
        }
    }
}

impl FailoverPair {
    /// `lanes` lanes (at least 1) with the given configurations of the two ends (their
    /// `lane_ports` must have `lanes` entries), queue pairs allowing `max_inline` inline bytes.
    /// Each lane's queue pairs are on the devices of its ports.
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
        let devices = devices_of([&send_config, &recv_config]);
        let mut senders = Vec::new();
        let mut receivers = Vec::new();
        for lane in 0..lanes {
            let (send_nic, recv_nic) = fabric.connect_on(
                (send_ep, lane_device(&send_config, lane)),
                sc,
                (recv_ep, lane_device(&recv_config, lane)),
                rc,
            );
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
            send_fo: Failover::new(Role::Sender, send_config.clone()),
            recv_fo: Failover::new(Role::Receiver, recv_config.clone()),
            to_recv: VecDeque::new(),
            to_send: VecDeque::new(),
            send_gave_up: None,
            recv_gave_up: None,
            error: None,
            progress: (0..lanes).map(|_| Progress::default()).collect(),
            window: 16,
            tamper: None,
            reports: 0,
            send_config,
            recv_config,
            send_bufs: Buffers::new(send_ep, devices),
            recv_bufs: Buffers::new(recv_ep, devices),
            key_fault: None,
            started_by_report: 0,
        }
    }

    /// Give every user buffer its own registration (on every device), rather than carving
    /// them from a few when ports are on several devices.
    pub fn distinct_registrations(&mut self) {
        self.send_bufs.distinct = true;
        self.recv_bufs.distinct = true;
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
            // Offered with the keys of the lane's device.
            let device = self.receivers[lane].nic.nic.device();
            let bufs: Vec<RecvBuf> = stream.sizes[j]
                .iter()
                .map(|&len| {
                    let mut buf = self.recv_bufs.recv(&self.fabric, j, len.max(1));
                    buf.rkey = self.key(self.recv_ep, buf.rkey, device);
                    buf
                })
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
            let bytes = pattern(seed(lane, j, k), len);
            let mut buf = self.send_bufs.send(&self.fabric, j, &bytes);
            buf.lkey = self.key(self.send_ep, buf.lkey, self.senders[lane].nic.nic.device());
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

    /// `ep`'s key of the memory `key` names, on `device`.
    fn key(&self, ep: EndpointId, key: u32, device: u8) -> u32 {
        self.fabric
            .key_on(ep, key, device)
            .expect("user buffers are registered on every device")
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

    fn act_send(&mut self, action: Action) {
        match action {
            Action::QuiesceLane { lane } => {
                let end = &mut self.senders[usize::from(lane)];
                self.started_by_report += usize::from(end.nic.trip.first.is_none());
                self.fabric.fault_qp_error(&end.nic.nic);
                end.quiescing = true;
            }
            Action::CreateQp { lane, port } => {
                // On the port's device: its control regions registered there when it is
                // another device.
                let end = &mut self.senders[usize::from(lane)];
                let device = port_device(&self.send_config, port);
                let nic = self.fabric.successor(&end.nic.nic, device);
                assert_eq!(
                    self.send_fo.moves_device(lane),
                    device != end.nic.nic.device(),
                    "the machine knows when a lane changes device"
                );
                let info = qp_info(&nic);
                end.next = Some(nic);
                self.send_fo.handle_qp_created(lane, info, &KeyMap::EMPTY);
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
                let (qp_num, peer_region) = read_qp_info(&peer_qp);
                assert_eq!(
                    (qp_num, peer_region),
                    (peer.qp_num(), peer.inbound_region())
                );
                let end = &mut self.senders[l];
                let fresh = end.next.take().expect("created");
                if !fresh.is_connected() {
                    self.fabric.join(&fresh, peer);
                }
                let (fabric, ep, device) = (self.fabric.clone(), self.send_ep, fresh.device());
                let from = end.nic.nic.device();
                let map = move |key| fabric.key_moved(ep, key, from, device);
                let moved = self.send_fo.moves_device(lane);
                let local = moved.then_some(&map as &dyn Fn(u32) -> Option<u32>);
                let rekey = replay_rekey(peer_region, local, self.key_fault);
                end.nic = Guarded::new(fresh, true);
                let done = end.conn.failover_replay(
                    &mut end.nic.nic,
                    &plan,
                    &mut self.send_journals[l],
                    &rekey,
                );
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
                self.started_by_report += usize::from(end.nic.trip.first.is_none());
                self.fabric.fault_qp_error(&end.nic.nic);
                end.quiescing = true;
            }
            Action::CreateQp { lane, port } => {
                let l = usize::from(lane);
                let end = &mut self.receivers[l];
                let device = port_device(&self.recv_config, port);
                let nic = self.fabric.successor(&end.nic.nic, device);
                assert_eq!(
                    self.recv_fo.moves_device(lane),
                    device != end.nic.nic.device(),
                    "the machine knows when a lane changes device"
                );
                let info = qp_info(&nic);
                end.next = Some(nic);
                // Moving to another device: the sender must learn the new keys of the
                // entries it may have read.
                let mut keys = KeyMap::EMPTY;
                if self.recv_fo.moves_device(lane) && self.key_fault != Some(KeyFault::NoPeerKeys) {
                    let (fabric, ep) = (self.fabric.clone(), self.recv_ep);
                    let from = end.nic.nic.device();
                    let map = move |key| fabric.key_moved(ep, key, from, device);
                    let told = end
                        .conn
                        .failover_peer_keys(&self.recv_journals[l], &map, &mut keys);
                    if let Err(e) = told {
                        return self.recv_fo.handle_lane_error(lane, e);
                    }
                }
                self.recv_fo.handle_qp_created(lane, info, &keys);
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
                let (qp_num, peer_region) = read_qp_info(&peer_qp);
                assert_eq!(
                    (qp_num, peer_region),
                    (peer.qp_num(), peer.inbound_region())
                );
                let end = &mut self.receivers[l];
                let fresh = end.next.take().expect("created");
                if !fresh.is_connected() {
                    self.fabric.join(&fresh, peer);
                }
                let (fabric, ep, device) = (self.fabric.clone(), self.recv_ep, fresh.device());
                let from = end.nic.nic.device();
                let map = move |key| fabric.key_moved(ep, key, from, device);
                let moved = self.recv_fo.moves_device(lane);
                let local = moved.then_some(&map as &dyn Fn(u32) -> Option<u32>);
                let rekey = replay_rekey(peer_region, local, self.key_fault);
                end.nic = Guarded::new(fresh, true);
                let done = end.conn.failover_replay(
                    &mut end.nic.nic,
                    &plan,
                    &mut self.recv_journals[l],
                    &rekey,
                );
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

/// The device `lane` starts on in `config` (the machine's clamp: a port outside the device is
/// port 0).
pub(super) fn lane_device(config: &FailoverConfig, lane: usize) -> u8 {
    let port = config.lane_ports.get(lane).copied().unwrap_or(0);
    let port = if usize::from(port) < config.port_devices.len() {
        port
    } else {
        0
    };
    port_device(config, port)
}

/// The pattern seed of send `k` of receive `j` on `lane`.
fn seed(lane: usize, j: usize, k: usize) -> u64 {
    ((lane as u64) << 40) ^ ((j as u64) << 8) ^ k as u64 ^ 0x5eed
}
