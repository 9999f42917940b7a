//! The receiving side of a connection (NCCL `accept`).

use super::HandshakeError;
use super::error::Incompatibility;
use super::io::{Common, FrameReader, ReadError, misuse, unexpected};
use crate::time::{Duration, Instant};
use crate::wire::{
    AcceptReply, EndpointInfo, Lanes, Message, MessageKind, RejectReason, RivetVersion,
};
use alloc::vec::Vec;

/// What the driver must act on, from [`Acceptor::poll_event`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AcceptorEvent {
    /// A valid connect request for this listener arrived (with all its lanes). Create the QP
    /// and control memory, move the QP to RTR and RTS towards `remote`, then call
    /// [`Acceptor::handle_local_ready`] (or [`Acceptor::reject`]). A request of several lanes
    /// ([`Acceptor::lanes`]) needs one QP per lane, each brought up towards its
    /// [`Acceptor::remote_lanes`] entry, and [`Acceptor::handle_local_lanes_ready`].
    Request {
        /// The connector's endpoint (lane 0).
        remote: EndpointInfo,
    },
    /// The connector's ready arrived: its QP is at RTS and may be written to. The recvComm is
    /// usable; the socket may be closed.
    Established,
}

/// Where an [`Acceptor`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AcceptorStage {
    /// Waiting for the connect request.
    AwaitingRequest,
    /// Waiting for the driver's [`Acceptor::handle_local_ready`].
    BringingUp,
    /// The accept reply is not fully written yet.
    SendingReply,
    /// Waiting for ready (or a reject).
    AwaitingReady,
    /// Done.
    Established,
    /// Failed; see [`Acceptor::error`].
    Failed,
}

impl AcceptorStage {
    /// The name used in error messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::AwaitingRequest => "awaiting connect request",
            Self::BringingUp => "bringing up the queue pair",
            Self::SendingReply => "sending accept reply",
            Self::AwaitingReady => "awaiting ready",
            Self::Established => "established",
            Self::Failed => "failed",
        }
    }
}

#[derive(Debug)]
enum State {
    AwaitingRequest(FrameReader),
    BringingUp {
        remote: EndpointInfo,
    },
    /// The reply is queued (possibly not yet written); reading ready once it is.
    AwaitingReady {
        remote: EndpointInfo,
        reader: FrameReader,
    },
    Established {
        remote: EndpointInfo,
    },
    Failed(HandshakeError),
}

/// The acceptor's handshake, one per accepted TCP connection: receive and check the connect
/// request, let the driver bring its QP up, send the accept reply, wait for ready.
///
/// Driven exactly like [`Connector`](super::Connector) (see its docs). The acceptor never reports
/// [`AcceptorEvent::Established`] before ready arrived, so the driver never writes to a peer QP
/// that is not yet at RTS.
#[derive(Debug)]
pub struct Acceptor {
    state: State,
    common: Common<AcceptorEvent>,
    listen_id: u64,
    peer_version: Option<RivetVersion>,
    /// The request's lanes (one until it arrived).
    lanes: Lanes,
    /// The connector's lanes as their frames arrive: the request's endpoint, then each Lane's.
    remotes: Vec<EndpointInfo>,
    /// This end has port failover on ([`with_failover`](Acceptor::with_failover)).
    failover_on: bool,
    /// The request asked for port failover.
    failover_asked: bool,
}

impl Acceptor {
    /// Starts accepting on a freshly accepted socket of the listen comm with id `listen_id`. The
    /// whole handshake must finish by `now + timeout`.
    pub fn new(listen_id: u64, now: Instant, timeout: Duration) -> Self {
        Self {
            state: State::AwaitingRequest(FrameReader::new()),
            common: Common::new(now, timeout),
            listen_id,
            peer_version: None,
            lanes: Lanes::ONE,
            remotes: Vec::new(),
            failover_on: false,
            failover_asked: false,
        }
    }

    /// This end has port failover on: a request that asks for it is answered so (after the
    /// lanes of the reply), and the connection fails over ([`failover`](Self::failover)).
    pub fn with_failover(mut self, on: bool) -> Self {
        self.failover_on = on;
        self
    }

    /// Whether the connection fails over among its ports: the connector asked and this end has
    /// it on (known once the request arrived).
    pub fn failover(&self) -> bool {
        self.failover_asked && self.failover_on
    }

    /// The connection's lanes, from the connect request (one before it arrived).
    pub fn lanes(&self) -> Lanes {
        self.lanes
    }

    /// Every lane of the connector, lane 0 first, once all arrived (empty before).
    pub fn remote_lanes(&self) -> &[EndpointInfo] {
        match &self.state {
            State::AwaitingRequest(_) | State::Failed(_) => &[],
            _ => &self.remotes,
        }
    }

    /// Where the machine is.
    pub fn stage(&self) -> AcceptorStage {
        match &self.state {
            State::AwaitingRequest(_) => AcceptorStage::AwaitingRequest,
            State::BringingUp { .. } => AcceptorStage::BringingUp,
            State::AwaitingReady { .. } if !self.common.outbox.is_empty() => {
                AcceptorStage::SendingReply
            }
            State::AwaitingReady { .. } => AcceptorStage::AwaitingReady,
            State::Established { .. } => AcceptorStage::Established,
            State::Failed(_) => AcceptorStage::Failed,
        }
    }

    /// True once ready arrived.
    pub fn is_established(&self) -> bool {
        matches!(self.state, State::Established { .. })
    }

    /// The error the machine failed with, if it failed.
    pub fn error(&self) -> Option<&HandshakeError> {
        match &self.state {
            State::Failed(error) => Some(error),
            _ => None,
        }
    }

    /// The connector's endpoint, once its request was accepted.
    pub fn remote(&self) -> Option<&EndpointInfo> {
        match &self.state {
            State::BringingUp { remote }
            | State::AwaitingReady { remote, .. }
            | State::Established { remote } => Some(remote),
            State::AwaitingRequest(_) | State::Failed(_) => None,
        }
    }

    /// The connector's Rivet release, once its request was decoded.
    pub fn peer_version(&self) -> Option<&RivetVersion> {
        self.peer_version.as_ref()
    }

    /// Bytes to write to the socket now (possibly none).
    #[must_use]
    pub fn poll_transmit(&self) -> &[u8] {
        self.common.outbox.pending()
    }

    /// Records that the first `n` bytes of [`poll_transmit`](Self::poll_transmit) were written.
    /// More than were pending is [`HandshakeError::Misuse`].
    pub fn handle_transmitted(&mut self, n: usize) {
        if !self.common.outbox.consume(n) && !matches!(self.state, State::Failed(_)) {
            self.fail_misuse("handle_transmitted reported more bytes than poll_transmit gave");
        }
    }

    /// How many bytes the machine takes now: 0 while it has bytes to send or expects none, else
    /// the rest of the current frame's header or body (at most
    /// [`MAX_FRAME_LEN`](crate::wire::MAX_FRAME_LEN)).
    pub fn input_wanted(&self) -> usize {
        if !self.common.outbox.is_empty() {
            return 0;
        }
        match &self.state {
            State::AwaitingRequest(reader) | State::AwaitingReady { reader, .. } => reader.wanted(),
            _ => 0,
        }
    }

    /// Takes bytes read from the socket: at most [`input_wanted`](Self::input_wanted), or it is
    /// [`HandshakeError::Misuse`]. A bad header byte fails at once.
    pub fn handle_input(&mut self, bytes: &[u8]) -> Result<(), HandshakeError> {
        if let State::Failed(error) = &self.state {
            return Err(error.clone());
        }
        if bytes.is_empty() {
            return Ok(());
        }
        if bytes.len() > self.input_wanted() {
            return Err(self.fail_misuse("handle_input got more bytes than input_wanted allowed"));
        }
        let stage = self.stage().name();
        let pushed = match &mut self.state {
            State::AwaitingRequest(reader) if self.remotes.is_empty() => {
                reader.push(bytes, &[MessageKind::ConnectRequest])
            }
            State::AwaitingRequest(reader) => {
                reader.push(bytes, &[MessageKind::Lane, MessageKind::Reject])
            }
            State::AwaitingReady { reader, .. } => {
                reader.push(bytes, &[MessageKind::Ready, MessageKind::Reject])
            }
            _ => return Err(self.fail_misuse("handle_input while no input is expected")),
        };
        let message = match pushed {
            Ok(None) => return Ok(()),
            Ok(Some(message)) => message,
            Err(ReadError::Wire(error)) => {
                return Err(self.fail(HandshakeError::Wire { stage, error }));
            }
            Err(ReadError::Unexpected(kind)) => {
                return Err(self.fail(HandshakeError::Protocol {
                    stage,
                    what: unexpected(kind),
                }));
            }
        };
        match (&self.state, message) {
            (State::AwaitingRequest(_), Message::ConnectRequest(request)) => {
                self.peer_version = Some(request.rivet_version);
                if request.listen_id != self.listen_id {
                    return Err(self.fail(HandshakeError::WrongListener {
                        expected: self.listen_id,
                        found: request.listen_id,
                    }));
                }
                self.lanes = request.lanes;
                self.failover_asked = request.failover;
                self.remotes.push(request.sender);
                self.lane_arrived();
                Ok(())
            }
            (State::AwaitingRequest(_), Message::Lane(lane)) => {
                self.remotes.push(lane);
                self.lane_arrived();
                Ok(())
            }
            (State::AwaitingReady { remote, .. }, Message::Ready) => {
                self.state = State::Established { remote: *remote };
                self.common.events.push_back(AcceptorEvent::Established);
                Ok(())
            }
            (_, Message::Reject(reject)) => Err(self.fail(HandshakeError::Rejected {
                stage,
                reason: reject.reason,
            })),
            (_, other) => Err(self.fail(HandshakeError::Protocol {
                stage,
                what: unexpected(other.kind()),
            })),
        }
    }

    /// A lane of the request arrived: once all have, the driver hears of the request; until then
    /// the next Lane frame is read.
    fn lane_arrived(&mut self) {
        if self.remotes.len() < self.lanes.count() {
            self.state = State::AwaitingRequest(FrameReader::new());
            return;
        }
        let remote = self.remotes[0];
        self.state = State::BringingUp { remote };
        self.common
            .events
            .push_back(AcceptorEvent::Request { remote });
    }

    /// The driver's QP is at RTR and RTS towards the connector (after
    /// [`AcceptorEvent::Request`]): queues the accept reply carrying `local`.
    ///
    /// An invalid `local`, or one on another link layer than the connector's, fails the machine
    /// and queues a Reject.
    pub fn handle_local_ready(&mut self, local: EndpointInfo) -> Result<(), HandshakeError> {
        self.handle_local_lanes_ready(&[local])
    }

    /// [`handle_local_ready`](Self::handle_local_ready) for every lane: `locals[i]` is brought
    /// up towards the connector's lane `i`; there must be exactly [`lanes`](Self::lanes) of them.
    pub fn handle_local_lanes_ready(
        &mut self,
        locals: &[EndpointInfo],
    ) -> Result<(), HandshakeError> {
        let remote = match &self.state {
            State::BringingUp { remote } => *remote,
            State::Failed(error) => return Err(error.clone()),
            _ => return Err(self.fail_misuse("handle_local_ready before a Request event")),
        };
        if locals.len() != self.remotes.len() {
            return Err(self.fail_misuse("handle_local_lanes_ready needs one endpoint per lane"));
        }
        let stage = self.stage().name();
        for (local, theirs) in locals.iter().zip(&self.remotes) {
            if let Err(error) = local.validate() {
                return Err(self.fail(HandshakeError::InvalidLocalInfo { stage, error }));
            }
            if local.link_layer != theirs.link_layer {
                let what = Incompatibility::LinkLayer {
                    ours: local.link_layer,
                    theirs: theirs.link_layer,
                };
                return Err(self.fail(HandshakeError::Incompatible { stage, what }));
            }
        }
        self.common.outbox.push(&Message::AcceptReply(AcceptReply {
            receiver: locals[0],
        }));
        for &lane in &locals[1..] {
            self.common.outbox.push(&Message::Lane(lane));
        }
        if self.failover_asked {
            self.common
                .outbox
                .push(&Message::Failover(self.failover_on));
        }
        self.state = State::AwaitingReady {
            remote,
            reader: FrameReader::new(),
        };
        Ok(())
    }

    /// The driver refuses the connector after [`AcceptorEvent::Request`] (for example a link layer
    /// mismatch, or it could not create its QP): queues a Reject and fails with
    /// [`HandshakeError::RejectedLocally`].
    pub fn reject(&mut self, reason: RejectReason) -> Result<(), HandshakeError> {
        match &self.state {
            State::BringingUp { .. } => {
                let stage = self.stage().name();
                self.fail(HandshakeError::RejectedLocally { stage, reason });
                Ok(())
            }
            State::Failed(error) => Err(error.clone()),
            _ => Err(self.fail_misuse("reject before a Request event")),
        }
    }

    /// The peer closed the socket (EOF). Fine once established; a failure before.
    pub fn handle_peer_closed(&mut self) -> Result<(), HandshakeError> {
        let partial = match &self.state {
            State::Established { .. } => return Ok(()),
            State::Failed(error) => return Err(error.clone()),
            State::AwaitingRequest(reader) | State::AwaitingReady { reader, .. } => {
                reader.buffered()
            }
            State::BringingUp { .. } => 0,
        };
        let stage = self.stage().name();
        Err(self.fail(HandshakeError::PeerClosed { stage, partial }))
    }

    /// The next event for the driver.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<AcceptorEvent> {
        self.common.next_event()
    }

    /// When [`handle_timeout`](Self::handle_timeout) must be called next; `None` once established
    /// or failed.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.common.deadline(self.finished())
    }

    /// The clock reached `now`: fails with [`HandshakeError::Timeout`] if the deadline passed.
    pub fn handle_timeout(&mut self, now: Instant) {
        let stage = self.stage().name();
        if let Some(error) = self.common.timed_out(self.finished(), now, stage) {
            self.fail(error);
        }
    }

    /// Established or failed: nothing more to wait for.
    fn finished(&self) -> bool {
        matches!(self.state, State::Established { .. } | State::Failed(_))
    }

    /// Enters the failed state, queuing a Reject for the peer when the error calls for one.
    fn fail(&mut self, error: HandshakeError) -> HandshakeError {
        self.common.failing(&error);
        self.state = State::Failed(error.clone());
        error
    }

    /// Reports a driver bug (see [`misuse`]).
    fn fail_misuse(&mut self, what: &'static str) -> HandshakeError {
        let (stage, established) = (self.stage().name(), self.is_established());
        misuse(stage, what, established, |error| self.fail(error))
    }
}
