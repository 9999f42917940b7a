//! Port failover's driver (issue #39): runs `rivet_core`'s failover machine
//! ([`rivet_core::data::failover`]) for one multi-lane connection over a fused device, from the
//! data-path calls NCCL keeps making (no thread: `test`, `isend` and `irecv` drive it, as they
//! drive everything else).
//!
//! What the core decides, this module does: it moves a failed lane's queue pair to the error
//! state and lets the core quiesce it, creates the lane's new queue pair on the port the machine
//! chose (another port of the same device: [`ConnEndpoint::move_to`]), carries the two reports
//! over the connection's handshake socket (raw [`REPORT_LEN`]-byte reports: each carries its own
//! magic, version and check), connects the new queue pair to the peer's, and runs the core's
//! replay on it. Meanwhile the lane is blocked: posts that need it answer "try later" and
//! requests with parts on it stay pending, so NCCL sees nothing but a pause. When the machine
//! gives up, the connection fails with the first error, exactly as without failover.

use crate::backend::DataEndpoint as Endpoint;
use crate::backend::OpenPort;
use crate::backend::conn_endpoint::ConnEndpoint;
use crate::backend::endpoint::Role;
use crate::clock;
use crate::config::QpSettings;
use crate::log::{INIT_NET, info, warn};
use rivet_core::data::DataError;
use rivet_core::data::failover::report::REPORT_LEN;
use rivet_core::data::failover::{
    Action, Failover, FailoverConfig, FailoverError, FailoverStats, KeyMap, Plan, QpInfo, Rekey,
    Replayed, ReportBody, Role as Side,
};
use rivet_core::data::multi::{MultiRecv, MultiSend};
use rivet_core::nic::WcStatus;
use rivet_core::time::Instant;
use rivet_core::wire::{ENDPOINT_INFO_LEN, EndpointInfo};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

/// What the driver needs of a multi-lane connection, either direction (`rivet_core`'s
/// `MultiSend`/`MultiRecv` failover API).
pub(crate) trait FailoverLanes {
    /// Stop posting on `lane` (its failover began).
    fn block_lane(&mut self, lane: u8);
    /// Post on `lane` again (its failover ended).
    fn resume_lane(&mut self, lane: u8);
    /// Take what the lane's failed queue pair still reports; `Ok(true)` once nothing is left.
    fn quiesce(&mut self, lane: u8, nic: &mut Endpoint) -> Result<bool, FailoverError>;
    /// The quiesced lane's state, for the report.
    fn snapshot(&self, lane: u8) -> Result<ReportBody, FailoverError>;
    /// Replay `plan` on the lane's new queue pair, on fused member (port) `member`, under
    /// `rekey`.
    fn replay(
        &mut self,
        lane: u8,
        nic: &mut Endpoint,
        plan: &Plan,
        rekey: &Rekey<'_>,
        member: u8,
    ) -> Result<Replayed, FailoverError>;
    /// A receiver's lane moving to another device: the keys (old → `new_key`) of the receives
    /// the sender may have read entries of. A sender has none to tell.
    fn peer_keys(
        &self,
        lane: u8,
        new_key: &dyn Fn(u32) -> Option<u32>,
    ) -> Result<KeyMap, FailoverError>;
    /// Fail the connection with `err` (every lane).
    fn fail(&mut self, err: DataError);
}

macro_rules! failover_lanes {
    ($conn:ty, $peer_keys:expr) => {
        impl FailoverLanes for $conn {
            fn block_lane(&mut self, lane: u8) {
                <$conn>::block_lane(self, lane)
            }
            fn resume_lane(&mut self, lane: u8) {
                <$conn>::resume_lane(self, lane)
            }
            fn quiesce(&mut self, lane: u8, nic: &mut Endpoint) -> Result<bool, FailoverError> {
                <$conn>::failover_quiesce(self, lane, nic)
            }
            fn snapshot(&self, lane: u8) -> Result<ReportBody, FailoverError> {
                <$conn>::failover_snapshot(self, lane)
            }
            fn replay(
                &mut self,
                lane: u8,
                nic: &mut Endpoint,
                plan: &Plan,
                rekey: &Rekey<'_>,
                member: u8,
            ) -> Result<Replayed, FailoverError> {
                <$conn>::failover_replay(self, lane, nic, plan, rekey, member)
            }
            fn peer_keys(
                &self,
                lane: u8,
                new_key: &dyn Fn(u32) -> Option<u32>,
            ) -> Result<KeyMap, FailoverError> {
                $peer_keys(self, lane, new_key)
            }
            fn fail(&mut self, err: DataError) {
                <$conn>::handle_fatal(self, err)
            }
        }
    };
}

// A sender tells no keys; a receiver those of its receives ([`MultiRecv::failover_peer_keys`]).
failover_lanes!(MultiSend, |_: &MultiSend, _, _| Ok(KeyMap::EMPTY));
failover_lanes!(MultiRecv, |conn: &MultiRecv, lane, new_key| conn
    .failover_peer_keys(lane, new_key));

/// One connection's failover: the machine and what the plugin keeps to act on it.
#[derive(Debug)]
pub(crate) struct FailoverDriver {
    machine: Failover,
    /// The fused device's ports, by the machine's port index.
    ports: Vec<Arc<OpenPort>>,
    /// The lanes' endpoint role (their receive depth, for a new queue pair).
    role: Role,
    /// The connection's queue-pair settings (a new queue pair is connected with them).
    settings: QpSettings,
    /// The peer, for log lines.
    peer: String,
    /// A report being read from the socket.
    inbox: [u8; REPORT_LEN],
    inbox_len: usize,
    /// Reports not yet written to the socket.
    outbox: Vec<u8>,
    /// Lanes being quiesced (their quiesce runs again on every call until it is done), each
    /// with when its queue pair was last moved to the error state.
    quiescing: Vec<(u8, Instant)>,
    /// Per lane, the port it was on when its failover began (for the WARN line), and the one
    /// its new queue pair was created on.
    from_port: Vec<u8>,
    to_port: Vec<u8>,
    /// Lane 0's queue pair was replaced since the caller last asked (its event watch follows).
    lane0_moved: bool,
    /// A failover is under way (or a report half read or written): every call runs the machine.
    busy: bool,
    /// The machine's statistics as last published (`crate::stats` takes the differences).
    published: FailoverStats,
    /// Data-path calls since the socket was last read while nothing was under way.
    calls: u32,
}

/// While no failover is under way, the lanes' tripwires and the socket (for a peer's report) are
/// looked at every this many data-path calls: a read is a system call, and on every call the
/// look cost a fused connection's data path a third more instructions.
const REPORT_POLL_CALLS: u32 = 64;

/// How often a quiescing lane's queue pair is moved to the error state again while its markers'
/// flushes have not come back (see `quiesce_pending`).
const MARKER_KICK: rivet_core::time::Duration = rivet_core::time::Duration::from_millis(5);

impl FailoverDriver {
    /// The driver of a connection whose `lanes` lane `i` is on `ports[i % ports.len()]`, with
    /// failover on at both ends (negotiated at connect), at most `max_attempts` failovers.
    pub(crate) fn new(
        side: Side,
        ports: Vec<Arc<OpenPort>>,
        lanes: usize,
        max_attempts: u32,
        role: Role,
        settings: QpSettings,
        peer: String,
    ) -> Self {
        // A port's device is its protection domain: failover stays within one.
        let mut devices: Vec<&Arc<OpenPort>> = Vec::new();
        let port_devices = ports
            .iter()
            .map(|p| {
                let same = devices.iter().position(|d| d.same_domain(p));
                let index = same.unwrap_or_else(|| {
                    devices.push(p);
                    devices.len() - 1
                });
                index as u8
            })
            .collect();
        let lane_ports = (0..lanes).map(|i| (i % ports.len()) as u8).collect();
        let config = FailoverConfig {
            enabled: true,
            max_attempts,
            port_devices,
            lane_ports,
            ..FailoverConfig::off(lanes)
        };
        Self {
            machine: Failover::new(side, config),
            from_port: vec![0; lanes],
            to_port: vec![0; lanes],
            ports,
            role,
            settings,
            peer,
            inbox: [0; REPORT_LEN],
            inbox_len: 0,
            outbox: Vec::new(),
            quiescing: Vec::new(),
            lane0_moved: false,
            busy: false,
            published: FailoverStats::default(),
            calls: 0,
        }
    }

    /// Whether lane 0's queue pair was replaced since the last call (and forget it).
    pub(crate) fn take_lane0_moved(&mut self) -> bool {
        std::mem::take(&mut self.lane0_moved)
    }

    /// Run the machine as far as it goes now: hand it new lane failures and the peer's
    /// reports, act on what it decides. Called after each data-path call on the connection.
    #[inline(always)]
    pub(crate) fn drive<C: FailoverLanes>(
        &mut self,
        conn: &mut C,
        lanes: &mut [Endpoint],
        socket: &TcpStream,
    ) {
        // The common case, nothing under way: an increment and two branches. A lane's failure
        // is looked for every REPORT_POLL_CALLS calls too (NCCL calls `test` in a loop: that is
        // microseconds, against a retry budget of hundreds of milliseconds).
        self.calls = self.calls.wrapping_add(1);
        if !self.busy && self.calls % REPORT_POLL_CALLS != 0 {
            return;
        }
        // One copy of the machinery for both directions: it runs rarely.
        self.drive_now(conn, lanes, socket);
    }

    #[inline(never)]
    fn drive_now(
        &mut self,
        conn: &mut dyn FailoverLanes,
        lanes: &mut [Endpoint],
        socket: &TcpStream,
    ) {
        let now = clock::now();
        for (lane, nic) in lanes.iter().enumerate() {
            let lane = lane as u8;
            if let Some(first) = nic.trip.first
                && !self.machine.is_failing(lane)
                && self.machine.gave_up().is_none()
            {
                if first.status == WcStatus::WR_FLUSH_ERR {
                    // A flush is the port's doing only while its link is down: tell the
                    // machine what the port says now (its PORT_ERR event may not be read yet).
                    self.note_link(lane);
                }
                self.machine.handle_completion_error(lane, &first, now);
            }
        }
        self.read_reports(socket, now);
        if self.machine.poll_timeout().is_some_and(|t| now >= t) {
            self.machine.handle_timeout(now);
        }
        self.quiesce_pending(conn, lanes);
        while let Some(action) = self.machine.poll_action() {
            info!(INIT_NET, "port failover: {}", ActionName(&action));
            self.act(action, conn, lanes, now);
            self.quiesce_pending(conn, lanes);
        }
        self.write_reports(socket);
        self.busy = self.machine.poll_timeout().is_some()
            || !self.quiescing.is_empty()
            || !self.outbox.is_empty()
            || self.inbox_len > 0;
    }

    fn act(
        &mut self,
        action: Action,
        conn: &mut dyn FailoverLanes,
        lanes: &mut [Endpoint],
        now: Instant,
    ) {
        let lane_count = lanes.len();
        match action {
            Action::QuiesceLane { lane } => {
                conn.block_lane(lane);
                if let Some(port) = self.machine.lane_port(lane)
                    && let Some(from) = self.from_port.get_mut(usize::from(lane))
                {
                    *from = port;
                }
                let Some(nic) = lanes.get_mut(usize::from(lane)) else {
                    return self
                        .machine
                        .handle_lane_error(lane, FailoverError::Lane(lane));
                };
                // Already in error after a retry exhaustion; a peer-started failover finds it
                // healthy. Either way nothing more lands through it from here on.
                if let Err(e) = nic.fail_queue_pair() {
                    warn!(
                        "port failover: moving lane {lane}'s queue pair to the error state failed: {e}"
                    );
                }
                self.quiescing.push((lane, clock::now()));
            }
            Action::CreateQp { lane, port } => {
                if let Some(to) = self.to_port.get_mut(usize::from(lane)) {
                    *to = port;
                }
                let created = match (
                    lanes.get_mut(usize::from(lane)),
                    self.ports.get(usize::from(port)),
                ) {
                    (Some(nic), Some(port)) => nic
                        .move_to(port, self.role)
                        .map(|()| {
                            nic.trip = rivet_core::data::failover::Tripwire::new(true);
                            nic.local_info(&self.settings)
                        })
                        .map_err(|e| e.to_string()),
                    _ => Err(format!("no lane {lane} or port {port}")),
                };
                match created {
                    Ok(info) => {
                        let mut bytes = Vec::with_capacity(ENDPOINT_INFO_LEN);
                        info.encode_into(&mut bytes);
                        match QpInfo::new(&bytes) {
                            Some(info) => {
                                if lane == 0 {
                                    self.lane0_moved = true;
                                }
                                let keys = match self.peer_keys(conn, lane) {
                                    Ok(keys) => keys,
                                    Err(e) => {
                                        warn!(
                                            "port failover: lane {lane}'s receive buffers cannot be \
                                             named on the device it moves to: {e}"
                                        );
                                        return self.machine.handle_lane_error(lane, e);
                                    }
                                };
                                self.machine.handle_qp_created(lane, info, &keys);
                            }
                            None => {
                                self.local_error(lane, "the endpoint info does not fit a report")
                            }
                        }
                    }
                    Err(e) => {
                        warn!(
                            "port failover: creating lane {lane}'s queue pair on port {port} failed: {e}"
                        );
                        self.local_error(lane, "creating the new queue pair failed");
                    }
                }
            }
            Action::SendReport(report) => self.outbox.extend_from_slice(&report.encode()),
            Action::Replay {
                lane,
                plan,
                peer_qp,
            } => {
                let Some(nic) = lanes.get_mut(usize::from(lane)) else {
                    return self
                        .machine
                        .handle_lane_error(lane, FailoverError::Lane(lane));
                };
                let connected = EndpointInfo::decode(peer_qp.as_bytes())
                    .map_err(|e| format!("the peer's queue pair info: {e}"))
                    .and_then(|remote| {
                        nic.connect_lane(&remote, &self.settings, lane_count)
                            .map(|()| remote.inbound)
                    });
                let peer_region = match connected {
                    Ok(region) => region,
                    Err(e) => {
                        warn!("port failover: connecting lane {lane}'s new queue pair failed: {e}");
                        return self.local_error(lane, "connecting the new queue pair failed");
                    }
                };
                let member = self.to_port.get(usize::from(lane)).copied().unwrap_or(0);
                // Moved to another device: this end's keys there, for the work it replays.
                let own_keys = self
                    .machine
                    .moves_device(lane)
                    .then(|| self.key_map(lane, self.is_receiver()));
                let new_key = |key: u32| own_keys.as_ref().and_then(|m| m.get(key));
                let rekey = Rekey {
                    peer_region,
                    local: own_keys
                        .is_some()
                        .then_some(&new_key as &dyn Fn(u32) -> Option<u32>),
                };
                let replayed = conn.replay(lane, nic, &plan, &rekey, member);
                self.machine.handle_replayed(lane, replayed, now);
            }
            Action::Resume { lane } => {
                conn.resume_lane(lane);
                let now_stats = self.machine.stats();
                let before = std::mem::replace(&mut self.published, now_stats);
                crate::stats::lane_failed_over(
                    now_stats.receives_replayed - before.receives_replayed,
                    now_stats.work_requests_replayed - before.work_requests_replayed,
                    now_stats.max_time.as_nanos() / 1_000_000,
                );
                let from = self.from_port.get(usize::from(lane)).copied().unwrap_or(0);
                let to = self.machine.lane_port(lane).unwrap_or(0);
                let name = |p: u8| {
                    self.ports.get(usize::from(p)).map_or_else(
                        || format!("port index {p}"),
                        |p| format!("{} port {}", p.info.name, p.info.port),
                    )
                };
                let moved = if from == to {
                    format!(
                        "stays on {} with a new queue pair (the peer's port failed)",
                        name(to)
                    )
                } else {
                    format!("moved from {} to {}", name(from), name(to))
                };
                warn!(
                    "port failover: lane {lane} of the connection with {} {moved} ({})",
                    self.peer,
                    self.machine.stats()
                );
            }
            Action::GiveUp { cause, reason } => {
                crate::stats::gave_up();
                for &(lane, _) in &self.quiescing {
                    if let Some(nic) = lanes.get(usize::from(lane)) {
                        let t = &nic.trip;
                        warn!(
                            "port failover: lane {lane} was still quiescing: markers posted {}, \
                             send marker flushed {}, receive marker flushed {}, {} failed \
                             completion(s), the first {:?}",
                            t.markers_posted,
                            t.send_marker,
                            t.recv_marker,
                            t.failed,
                            t.first.map(|c| c.status)
                        );
                    }
                }
                warn!(
                    "port failover: the connection with {} fails: {reason} (cause: {cause})",
                    self.peer
                );
                conn.fail(cause);
            }
        }
    }

    /// Run the quiesce of every lane being quiesced; hand the machine those that finished.
    fn quiesce_pending(&mut self, conn: &mut dyn FailoverLanes, lanes: &mut [Endpoint]) {
        let mut i = 0;
        while i < self.quiescing.len() {
            let (lane, kicked) = self.quiescing[i];
            let Some(nic) = lanes.get_mut(usize::from(lane)) else {
                self.quiescing.swap_remove(i);
                continue;
            };
            match conn.quiesce(lane, nic) {
                Ok(false) => {
                    // Soft-RoCE flushes a user queue pair's queues only when its kernel side
                    // runs: an error transition schedules it, a receive posted from user space
                    // does not (and nothing arrives on a cut link to wake it), and a flush that
                    // found the completion queue full stops until it runs again. So the queue
                    // pair is moved to the error state again, now and then, until the markers
                    // (posted once the queues have room) come back.
                    let now = clock::now();
                    if now >= kicked + MARKER_KICK {
                        self.quiescing[i].1 = now;
                        if let Err(e) = nic.fail_queue_pair() {
                            warn!(
                                "port failover: moving lane {lane}'s queue pair to the error \
                                 state again failed: {e}"
                            );
                        }
                    }
                    i += 1;
                }
                Ok(true) => {
                    self.quiescing.swap_remove(i);
                    match conn.snapshot(lane) {
                        Ok(body) => self.machine.handle_quiesced(lane, body),
                        Err(e) => self.machine.handle_lane_error(lane, e),
                    }
                }
                Err(e) => {
                    self.quiescing.swap_remove(i);
                    self.machine.handle_lane_error(lane, e);
                }
            }
        }
    }

    /// Whether this end receives.
    fn is_receiver(&self) -> bool {
        matches!(self.role, Role::Receiver | Role::EagerReceiver)
    }

    /// `lane`'s registered buffers' keys (`remote`: remote keys) on the port it leaves → on the
    /// port its new queue pair is on.
    fn key_map(&self, lane: u8, remote: bool) -> crate::comm::mr::KeyTable {
        let from = self
            .machine
            .lane_port(lane)
            .and_then(|p| self.ports.get(usize::from(p)));
        let to = self
            .to_port
            .get(usize::from(lane))
            .and_then(|p| self.ports.get(usize::from(*p)));
        match (from, to) {
            (Some(from), Some(to)) => crate::comm::mr::key_map(from, to, remote),
            _ => crate::comm::mr::KeyTable::default(),
        }
    }

    /// What a receiver moving `lane` to another device tells the sender of its keys (nothing
    /// otherwise).
    fn peer_keys(&self, conn: &dyn FailoverLanes, lane: u8) -> Result<KeyMap, FailoverError> {
        if !self.is_receiver() || !self.machine.moves_device(lane) {
            return Ok(KeyMap::EMPTY);
        }
        let map = self.key_map(lane, true);
        conn.peer_keys(lane, &|key| map.get(key))
    }

    /// Tell the machine whether `lane`'s port's link is up.
    fn note_link(&mut self, lane: u8) {
        if let Some(port) = self.machine.lane_port(lane) {
            self.note_port(port);
        }
    }

    /// Tell the machine whether `port`'s link is up (as `ibv_query_port` says now).
    fn note_port(&mut self, port: u8) {
        if let Some(up) = self
            .ports
            .get(usize::from(port))
            .and_then(|p| p.link_active())
        {
            self.machine.handle_port_event(port, up);
        }
    }

    /// This end could not do its part of `lane`'s failover: the machine gives up, and the
    /// connection fails with the lane's first error (a network failure, as without failover).
    fn local_error(&mut self, lane: u8, what: &'static str) {
        self.machine
            .handle_lane_error(lane, FailoverError::Driver(what));
    }

    /// Read whatever of the peer's reports the socket holds, without blocking.
    fn read_reports(&mut self, socket: &TcpStream, now: Instant) {
        let mut socket = socket;
        loop {
            match socket.read(&mut self.inbox[self.inbox_len..]) {
                Ok(0) => return, // EOF: the watch reports the peer gone.
                Ok(n) => {
                    self.inbox_len += n;
                    if self.inbox_len == REPORT_LEN {
                        self.inbox_len = 0;
                        let report = self.inbox;
                        // The peer may start a failover this end has not seen yet: the machine
                        // then picks a port by what the links say now (both ends of a cut cable
                        // lose their link).
                        for port in 0..self.ports.len() {
                            self.note_port(port as u8);
                        }
                        self.machine.handle_peer(&report, now);
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return, // WouldBlock: nothing more now; an error: the watch's.
            }
        }
    }

    /// Write what the outbox holds, as far as the socket takes it now.
    fn write_reports(&mut self, socket: &TcpStream) {
        let mut socket = socket;
        while !self.outbox.is_empty() {
            match socket.write(&self.outbox) {
                Ok(0) => return,
                Ok(n) => {
                    self.outbox.drain(..n);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }
}

/// An action as the INFO line names it (without the report's bytes).
struct ActionName<'a>(&'a Action);

impl std::fmt::Display for ActionName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Action::QuiesceLane { lane } => write!(f, "quiescing lane {lane}"),
            Action::CreateQp { lane, port } => {
                write!(f, "a new queue pair for lane {lane} on port index {port}")
            }
            Action::SendReport(r) => write!(f, "report for lane {} sent: {:?}", r.lane, r.body),
            Action::Replay { lane, plan, .. } => write!(f, "replaying lane {lane}: {plan:?}"),
            Action::Resume { lane } => write!(f, "lane {lane} resumes"),
            Action::GiveUp { reason, .. } => write!(f, "giving up: {reason}"),
        }
    }
}
