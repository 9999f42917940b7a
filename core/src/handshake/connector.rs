//! The sending side of a connection (NCCL `connect`).

use super::HandshakeError;
use super::error::Incompatibility;
use super::io::{Common, FrameReader, ReadError, misuse, unexpected};
use crate::time::{Duration, Instant};
use crate::wire::{
    ConnectRequest, EndpointInfo, Lanes, ListenHandle, Message, MessageKind, RejectReason,
    RivetVersion,
};
use alloc::vec::Vec;

/// What the driver must act on, from [`Connector::poll_event`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectorEvent {
    /// The acceptor's QPs are at RTS. Move the local QP to RTR and RTS towards `remote` (every
    /// lane towards its [`Connector::remote_lanes`] entry), then call
    /// [`Connector::handle_qp_ready`] (or [`Connector::reject`]).
    BringUp {
        /// The acceptor's endpoint (lane 0).
        remote: EndpointInfo,
    },
    /// Ready was written: both QPs are at RTS. The socket may be closed; the sendComm is usable.
    Established,
}

/// Where a [`Connector`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConnectorStage {
    /// The connect request is not fully written yet.
    SendingRequest,
    /// Waiting for the accept reply (or a reject).
    AwaitingReply,
    /// Waiting for the driver's [`Connector::handle_qp_ready`].
    BringingUp,
    /// Ready is not fully written yet.
    SendingReady,
    /// Done.
    Established,
    /// Failed; see [`Connector::error`].
    Failed,
}

impl ConnectorStage {
    /// The name used in error messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::SendingRequest => "sending connect request",
            Self::AwaitingReply => "awaiting accept reply",
            Self::BringingUp => "bringing up the queue pair",
            Self::SendingReady => "sending ready",
            Self::Established => "established",
            Self::Failed => "failed",
        }
    }
}

#[derive(Debug)]
enum State {
    /// The request is queued (possibly not yet written); reading the reply once it is.
    AwaitingReply(FrameReader),
    BringingUp {
        remote: EndpointInfo,
    },
    /// Ready is queued; established once it is written.
    SendingReady {
        remote: EndpointInfo,
    },
    Established {
        remote: EndpointInfo,
    },
    Failed(HandshakeError),
}

/// The connector's handshake: send a connect request, receive the acceptor's endpoint, let the
/// driver bring the QP up, send ready.
///
/// Driving protocol (every call is non-blocking):
///
/// 1. Write [`poll_transmit`](Self::poll_transmit) to the socket as far as it goes; report the
///    count with [`handle_transmitted`](Self::handle_transmitted).
/// 2. Read at most [`input_wanted`](Self::input_wanted) bytes (never more: the machine reads
///    exactly one frame at a time) and pass them to [`handle_input`](Self::handle_input);
///    on EOF call [`handle_peer_closed`](Self::handle_peer_closed).
/// 3. Act on every [`poll_event`](Self::poll_event).
/// 4. Call [`handle_timeout`](Self::handle_timeout) when [`poll_timeout`](Self::poll_timeout)
///    has passed.
///
/// Until [`is_established`](Self::is_established) or [`error`](Self::error). After a failure,
/// write what `poll_transmit` still returns (a Reject telling the peer why), best effort, then
/// close. Once failed, the machine stays failed and every fallible call returns the same error.
#[derive(Debug)]
pub struct Connector {
    state: State,
    common: Common<ConnectorEvent>,
    listener_version: RivetVersion,
    /// The local lanes (lane 0 is `local`).
    locals: Vec<EndpointInfo>,
    /// The acceptor's lanes as their frames arrive: the reply's endpoint, then each Lane's.
    remotes: Vec<EndpointInfo>,
    /// The request asked for port failover.
    failover_asked: bool,
    /// The acceptor's answer to it, once its Failover frame arrived.
    peer_failover: Option<bool>,
}

impl Connector {
    /// Starts connecting to the listener `handle` describes, as `local` (this end's QP, at INIT,
    /// and inbound region). The whole handshake must finish by `now + timeout`.
    ///
    /// An invalid `local` makes the machine fail at once with
    /// [`HandshakeError::InvalidLocalInfo`].
    pub fn new(
        handle: &ListenHandle,
        local: EndpointInfo,
        now: Instant,
        timeout: Duration,
    ) -> Self {
        Self::with_lanes(handle, &[local], 1, now, timeout)
    }

    /// Like [`new`](Self::new) for a connection of `locals.len()` queue pairs ("lanes", at
    /// most [`MAX_LANES`](crate::wire::MAX_LANES)), each message spread over `width` of them: the
    /// request carries lane 0, and one Lane frame follows for each further lane.
    ///
    /// No lanes, too many, or a `width` outside `1..=locals.len()` is
    /// [`HandshakeError::Misuse`]; an invalid lane, [`HandshakeError::InvalidLocalInfo`].
    pub fn with_lanes(
        handle: &ListenHandle,
        locals: &[EndpointInfo],
        width: usize,
        now: Instant,
        timeout: Duration,
    ) -> Self {
        Self::with_options(handle, locals, width, false, now, timeout)
    }

    /// Like [`with_lanes`](Self::with_lanes), asking for port failover when `failover` is set
    /// (this end has it on): the acceptor then answers whether it has it on too, after its lanes
    /// and before the queue pairs are brought up ([`failover`](Self::failover)). An acceptor of
    /// an earlier release refuses such a request.
    pub fn with_options(
        handle: &ListenHandle,
        locals: &[EndpointInfo],
        width: usize,
        failover: bool,
        now: Instant,
        timeout: Duration,
    ) -> Self {
        let mut common = Common::new(now, timeout);
        let stage = ConnectorStage::SendingRequest.name();
        let lanes = Lanes::new(locals.len(), width);
        let invalid = locals.iter().find_map(|l| l.validate().err());
        let state = match (lanes, invalid, locals.first()) {
            (Some(lanes), None, Some(&first)) => {
                common.outbox.push(&Message::ConnectRequest(ConnectRequest {
                    listen_id: handle.listen_id,
                    rivet_version: RivetVersion::ours(),
                    lanes,
                    failover,
                    sender: first,
                }));
                for &lane in &locals[1..] {
                    common.outbox.push(&Message::Lane(lane));
                }
                State::AwaitingReply(FrameReader::new())
            }
            (_, Some(error), _) => State::Failed(HandshakeError::InvalidLocalInfo { stage, error }),
            _ => State::Failed(HandshakeError::Misuse {
                stage,
                what: "with_lanes needs 1..=128 lanes and a width of 1..=lanes",
            }),
        };
        Self {
            state,
            common,
            listener_version: handle.rivet_version,
            locals: locals.to_vec(),
            remotes: Vec::new(),
            failover_asked: failover,
            peer_failover: None,
        }
    }

    /// Whether the connection fails over among its ports: this end asked and the acceptor has
    /// it on too (known once the queue pairs are brought up; false before).
    pub fn failover(&self) -> bool {
        self.failover_asked && self.peer_failover == Some(true)
    }

    /// Where the machine is.
    pub fn stage(&self) -> ConnectorStage {
        match &self.state {
            State::AwaitingReply(_) if !self.common.outbox.is_empty() => {
                ConnectorStage::SendingRequest
            }
            State::AwaitingReply(_) => ConnectorStage::AwaitingReply,
            State::BringingUp { .. } => ConnectorStage::BringingUp,
            State::SendingReady { .. } => ConnectorStage::SendingReady,
            State::Established { .. } => ConnectorStage::Established,
            State::Failed(_) => ConnectorStage::Failed,
        }
    }

    /// True once ready was written.
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

    /// The acceptor's endpoint, once its reply arrived.
    pub fn remote(&self) -> Option<&EndpointInfo> {
        match &self.state {
            State::BringingUp { remote }
            | State::SendingReady { remote }
            | State::Established { remote } => Some(remote),
            State::AwaitingReply(_) | State::Failed(_) => None,
        }
    }

    /// Every lane of the acceptor, lane 0 first, once all arrived (empty before).
    pub fn remote_lanes(&self) -> &[EndpointInfo] {
        match &self.state {
            State::AwaitingReply(_) | State::Failed(_) => &[],
            _ => &self.remotes,
        }
    }

    /// The Rivet release of the listener, from the handle.
    pub fn listener_version(&self) -> &RivetVersion {
        &self.listener_version
    }

    /// Bytes to write to the socket now (possibly none).
    #[must_use]
    pub fn poll_transmit(&self) -> &[u8] {
        self.common.outbox.pending()
    }

    /// Records that the first `n` bytes of [`poll_transmit`](Self::poll_transmit) were written.
    /// More than were pending is [`HandshakeError::Misuse`].
    pub fn handle_transmitted(&mut self, n: usize) {
        if !self.common.outbox.consume(n) {
            if !matches!(self.state, State::Failed(_)) {
                self.fail_misuse("handle_transmitted reported more bytes than poll_transmit gave");
            }
            return;
        }
        if let State::SendingReady { remote } = self.state {
            if self.common.outbox.is_empty() {
                self.state = State::Established { remote };
                self.common.events.push_back(ConnectorEvent::Established);
            }
        }
    }

    /// How many bytes the machine takes now: 0 while it has bytes to send or expects none, else
    /// the rest of the current frame's header or body (at most
    /// [`MAX_FRAME_LEN`](crate::wire::MAX_FRAME_LEN)).
    pub fn input_wanted(&self) -> usize {
        match &self.state {
            State::AwaitingReply(reader) if self.common.outbox.is_empty() => reader.wanted(),
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
        let State::AwaitingReply(reader) = &mut self.state else {
            return Err(self.fail_misuse("handle_input while no input is expected"));
        };
        let allowed: &[MessageKind] = if self.remotes.is_empty() {
            &[MessageKind::AcceptReply, MessageKind::Reject]
        } else if self.remotes.len() < self.locals.len() {
            &[MessageKind::Lane, MessageKind::Reject]
        } else {
            // Every lane is in: only a request with failover waits for more.
            &[MessageKind::Failover, MessageKind::Reject]
        };
        let message = match reader.push(bytes, allowed) {
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
        let remote = match message {
            Message::AcceptReply(reply) => reply.receiver,
            Message::Lane(lane) => lane,
            Message::Failover(on) => {
                self.peer_failover = Some(on);
                self.bring_up();
                return Ok(());
            }
            Message::Reject(reject) => {
                return Err(self.fail(HandshakeError::Rejected {
                    stage,
                    reason: reject.reason,
                }));
            }
            other => {
                return Err(self.fail(HandshakeError::Protocol {
                    stage,
                    what: unexpected(other.kind()),
                }));
            }
        };
        // Lane i of the acceptor connects to local lane i: their link layers must agree.
        let Some(ours) = self.locals.get(self.remotes.len()).map(|l| l.link_layer) else {
            return Err(self.fail_misuse("a lane arrived after the last one"));
        };
        if remote.link_layer != ours {
            let what = Incompatibility::LinkLayer {
                ours,
                theirs: remote.link_layer,
            };
            return Err(self.fail(HandshakeError::Incompatible { stage, what }));
        }
        self.remotes.push(remote);
        if self.remotes.len() < self.locals.len() || self.failover_asked {
            // More lanes, or the acceptor's failover answer, to read.
            self.state = State::AwaitingReply(FrameReader::new());
            return Ok(());
        }
        self.bring_up();
        Ok(())
    }

    /// Everything of the acceptor arrived: the driver brings the queue pairs up.
    fn bring_up(&mut self) {
        let remote = self.remotes[0];
        self.state = State::BringingUp { remote };
        self.common
            .events
            .push_back(ConnectorEvent::BringUp { remote });
    }

    /// The driver moved the QP to RTR and RTS after [`ConnectorEvent::BringUp`]: queues ready.
    pub fn handle_qp_ready(&mut self) -> Result<(), HandshakeError> {
        match &self.state {
            State::BringingUp { remote } => {
                self.state = State::SendingReady { remote: *remote };
                self.common.outbox.push(&Message::Ready);
                Ok(())
            }
            State::Failed(error) => Err(error.clone()),
            _ => Err(self.fail_misuse("handle_qp_ready before a BringUp event")),
        }
    }

    /// The driver refuses the acceptor after [`ConnectorEvent::BringUp`] (for example it could not
    /// bring its QP up): queues a Reject and fails with [`HandshakeError::RejectedLocally`].
    pub fn reject(&mut self, reason: RejectReason) -> Result<(), HandshakeError> {
        match &self.state {
            State::BringingUp { .. } => {
                let stage = self.stage().name();
                self.fail(HandshakeError::RejectedLocally { stage, reason });
                Ok(())
            }
            State::Failed(error) => Err(error.clone()),
            _ => Err(self.fail_misuse("reject before a BringUp event")),
        }
    }

    /// The peer closed the socket (EOF). Fine once established; a failure before.
    pub fn handle_peer_closed(&mut self) -> Result<(), HandshakeError> {
        let partial = match &self.state {
            State::Established { .. } => return Ok(()),
            State::Failed(error) => return Err(error.clone()),
            State::AwaitingReply(reader) => reader.buffered(),
            _ => 0,
        };
        let stage = self.stage().name();
        Err(self.fail(HandshakeError::PeerClosed { stage, partial }))
    }

    /// The next event for the driver.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<ConnectorEvent> {
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
