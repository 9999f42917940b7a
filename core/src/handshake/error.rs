//! Why a handshake failed.

use core::fmt;

use crate::time::Duration;
use crate::wire::{LinkLayer, RejectReason, WireError};

/// An incompatibility between the two ends' endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Incompatibility {
    /// The ports use different link layers; an RC QP cannot connect across them.
    LinkLayer {
        /// Our port's link layer.
        ours: LinkLayer,
        /// The peer's port's link layer.
        theirs: LinkLayer,
    },
}

impl fmt::Display for Incompatibility {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::LinkLayer { ours, theirs } => write!(
                f,
                "link layers differ: our port is {ours}, the peer's is {theirs} (check NCCL_IB_HCA on both ranks)"
            ),
        }
    }
}

/// Why a [`Connector`](super::Connector) or [`Acceptor`](super::Acceptor) failed.
///
/// `stage` fields name the stage the machine was in (see
/// [`ConnectorStage::name`](super::ConnectorStage::name) and
/// [`AcceptorStage::name`](super::AcceptorStage::name)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandshakeError {
    /// The peer sent bytes that are not a valid frame (including another wire version).
    Wire {
        /// The stage.
        stage: &'static str,
        /// What was wrong with the bytes.
        error: WireError,
    },
    /// The deadline passed before the handshake completed.
    Timeout {
        /// The stage.
        stage: &'static str,
        /// Time from the machine's creation to the [`handle_timeout`](super::Connector::handle_timeout)
        /// call that noticed.
        waited: Duration,
    },
    /// The peer closed the socket before the handshake completed.
    PeerClosed {
        /// The stage.
        stage: &'static str,
        /// Bytes of an incomplete frame received before the close (0 if none).
        partial: usize,
    },
    /// The peer sent a [`Reject`](crate::wire::Reject).
    Rejected {
        /// The stage.
        stage: &'static str,
        /// The peer's reason.
        reason: RejectReason,
    },
    /// The driver rejected the peer (`reject`); a Reject frame was queued.
    RejectedLocally {
        /// The stage.
        stage: &'static str,
        /// The driver's reason.
        reason: RejectReason,
    },
    /// A connect request carried another listen id: the connector's handle is stale or was meant
    /// for another listen comm.
    WrongListener {
        /// This acceptor's listen id.
        expected: u64,
        /// The connect request's listen id.
        found: u64,
    },
    /// The peer sent a valid message that is not allowed at this stage.
    Protocol {
        /// The stage.
        stage: &'static str,
        /// What happened.
        what: &'static str,
    },
    /// The two ends cannot be connected.
    Incompatible {
        /// The stage.
        stage: &'static str,
        /// Why.
        what: Incompatibility,
    },
    /// The endpoint info the driver supplied for this end is invalid.
    InvalidLocalInfo {
        /// The stage.
        stage: &'static str,
        /// The invalid field.
        error: WireError,
    },
    /// The driver called the machine out of order (a bug in the driver).
    Misuse {
        /// The stage.
        stage: &'static str,
        /// What was called.
        what: &'static str,
    },
}

impl HandshakeError {
    /// The Reject reason to send the peer when failing with this error, if one should be sent:
    /// not when the peer rejected or closed, nor for a driver bug.
    pub(crate) fn reject_reason(&self) -> Option<RejectReason> {
        match self {
            Self::Wire {
                error: WireError::VersionMismatch { .. },
                ..
            } => Some(RejectReason::WireVersion),
            Self::Wire { .. } | Self::Protocol { .. } => Some(RejectReason::Malformed),
            Self::Timeout { .. } => Some(RejectReason::TimedOut),
            Self::WrongListener { .. } => Some(RejectReason::WrongListener),
            Self::Incompatible {
                what: Incompatibility::LinkLayer { .. },
                ..
            } => Some(RejectReason::LinkLayerMismatch),
            Self::InvalidLocalInfo { .. } => Some(RejectReason::SetupFailed),
            Self::RejectedLocally { reason, .. } => Some(*reason),
            Self::PeerClosed { .. } | Self::Rejected { .. } | Self::Misuse { .. } => None,
        }
    }
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Wire { stage, error } => write!(f, "handshake failed while {stage}: {error}"),
            Self::Timeout { stage, waited } => {
                write!(f, "handshake timed out after {waited} while {stage}")
            }
            Self::PeerClosed { stage, partial: 0 } => {
                write!(f, "peer closed the connection while {stage}")
            }
            Self::PeerClosed { stage, partial } => write!(
                f,
                "peer closed the connection while {stage}, {partial} bytes into a message"
            ),
            Self::Rejected { stage, reason } => {
                write!(f, "peer rejected the connection while {stage}: {reason}")
            }
            Self::RejectedLocally { stage, reason } => {
                write!(f, "rejected the peer while {stage}: {reason}")
            }
            Self::WrongListener { expected, found } => write!(
                f,
                "connect request names listen id {found:#018x}, this listener is {expected:#018x} (stale or misrouted handle)"
            ),
            Self::Protocol { stage, what } => {
                write!(f, "protocol violation while {stage}: {what}")
            }
            Self::Incompatible { stage, what } => {
                write!(f, "incompatible peer while {stage}: {what}")
            }
            Self::InvalidLocalInfo { stage, error } => {
                write!(f, "our own endpoint info is invalid while {stage}: {error}")
            }
            Self::Misuse { stage, what } => {
                write!(
                    f,
                    "driver called the handshake out of order while {stage}: {what}"
                )
            }
        }
    }
}

impl core::error::Error for HandshakeError {}
