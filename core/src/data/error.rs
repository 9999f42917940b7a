//! Errors of the data path.

use core::fmt;

use super::codec::{DecodeError, WrKind};
use crate::nic::{NicError, WcStatus};

/// An error of a data-path call.
///
/// Connection errors ([`Completion`](Self::Completion), [`Nic`](Self::Nic),
/// [`Protocol`](Self::Protocol), [`PeerRegion`](Self::PeerRegion), [`PeerLost`](Self::PeerLost))
/// are sticky: once one happened, every outstanding request and every later call returns it.
/// Request errors ([`SizeMismatch`](Self::SizeMismatch)) fail one request only, and argument
/// errors ([`InvalidRequest`](Self::InvalidRequest), [`InvalidArgument`](Self::InvalidArgument))
/// change nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataError {
    /// A work request completed with an error status.
    Completion {
        /// The completion status.
        status: WcStatus,
        /// The vendor error syndrome.
        vendor_err: u32,
        /// What the failed work request was for (`None` when its `wr_id` was not ours).
        wr: Option<WrKind>,
    },
    /// Posting or polling failed, or the device reported a fatal event.
    Nic(NicError),
    /// The peer (or the NIC) broke the data protocol.
    Protocol(ProtocolError),
    /// The peer's control region is smaller than the protocol needs.
    PeerRegion {
        /// Length the peer announced.
        len: u32,
        /// Length the protocol needs.
        need: usize,
    },
    /// The driver reported that the peer closed the connection or died.
    PeerLost,
    /// A send did not fit the receive buffer it matched; nothing was written (no truncation).
    /// Reported by both the send and the receive request.
    SizeMismatch {
        /// Position of the buffer within the receive group.
        index: usize,
        /// Bytes the sender tried to send.
        sent: u64,
        /// Capacity of the receive buffer.
        capacity: u64,
    },
    /// The request id is unknown, of the other direction, or already completed.
    InvalidRequest {
        /// The id as passed in.
        bits: u32,
    },
    /// The arguments of a call are invalid.
    InvalidArgument(&'static str),
}

impl DataError {
    /// [`SizeMismatch`](Self::SizeMismatch) from the compact fields a request state keeps.
    pub(super) fn size_mismatch(index: u8, sent: u32, capacity: u64) -> Self {
        Self::SizeMismatch {
            index: usize::from(index),
            sent: u64::from(sent),
            capacity,
        }
    }

    /// True when the error fails the whole connection (and is returned by every later call).
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            Self::Completion { .. }
                | Self::Nic(_)
                | Self::Protocol(_)
                | Self::PeerRegion { .. }
                | Self::PeerLost
        )
    }
}

impl fmt::Display for DataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Completion {
                status,
                vendor_err,
                wr,
            } => {
                match wr {
                    Some(kind) => write!(f, "{kind} failed: ")?,
                    None => f.write_str("a work request failed: ")?,
                }
                write!(
                    f,
                    "{} (status {}, vendor error {vendor_err:#x}); {}",
                    status.name(),
                    status.0,
                    status.hint()
                )
            }
            Self::Nic(err) => write!(f, "NIC error: {err}"),
            Self::Protocol(err) => write!(f, "peer violated the data protocol: {err}"),
            Self::PeerRegion { len, need } => write!(
                f,
                "the peer's control region is {len} bytes, the data protocol needs {need}"
            ),
            Self::PeerLost => f.write_str("the peer closed the connection or died"),
            Self::SizeMismatch {
                index,
                sent,
                capacity,
            } => write!(
                f,
                "a {sent}-byte send does not fit receive buffer {index} of {capacity} bytes \
                 (refused, not truncated)"
            ),
            Self::InvalidRequest { bits } => {
                write!(f, "request {bits:#x} is unknown or already completed")
            }
            Self::InvalidArgument(what) => write!(f, "invalid argument: {what}"),
        }
    }
}

impl From<NicError> for DataError {
    fn from(err: NicError) -> Self {
        Self::Nic(err)
    }
}

impl From<ProtocolError> for DataError {
    fn from(err: ProtocolError) -> Self {
        Self::Protocol(err)
    }
}

/// How the peer (or a completion) broke the data protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProtocolError {
    /// A fresh clear-to-send entry is malformed.
    CtsEntry {
        /// FIFO slot.
        slot: u16,
        /// Entry within the slot.
        entry: u8,
        /// What is wrong.
        err: DecodeError,
    },
    /// The entries of one slot disagree on the group size.
    CtsGroup {
        /// FIFO slot.
        slot: u16,
    },
    /// An immediate is malformed.
    Immediate {
        /// The immediate in host order.
        imm: u32,
        /// What is wrong.
        err: DecodeError,
    },
    /// A completion record is malformed.
    Record(DecodeError),
    /// A completion's `wr_id` is not one the core posted.
    WrId {
        /// The `wr_id` as polled.
        wr_id: u64,
        /// What is wrong.
        err: DecodeError,
    },
    /// A completion arrived that no outstanding work request or receive expects.
    UnexpectedCompletion {
        /// What the completion claims to be for.
        wr: WrKind,
    },
    /// A receive completion's sequence number is not the oldest outstanding receive's.
    Sequence {
        /// Low 16 bits expected.
        expected: u16,
        /// Low 16 bits received.
        got: u16,
    },
    /// A receive completion's group size differs from the receive's.
    GroupSize {
        /// Group size of the receive.
        expected: u8,
        /// Group size in the immediate.
        got: u8,
    },
    /// The peer reported more bytes than the receive buffer holds.
    Overflow {
        /// Buffer within the group.
        index: usize,
        /// Bytes reported.
        size: u64,
        /// Capacity of the buffer.
        capacity: u64,
    },
    /// The peer flagged a size mismatch but its record shows none.
    BogusMismatch,
    /// More eager messages arrived than the ring holds (the sender ignored its credits).
    RingOverrun,
    /// An eager message's header is malformed.
    EagerHeader(DecodeError),
    /// The receiver's credit word went back, or past the eager messages sent.
    Credits {
        /// The count read.
        freed: u64,
    },
    /// The peer's port-failover report is malformed or cannot be true
    /// ([`failover`](super::failover)).
    FailoverReport,
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::CtsEntry { slot, entry, err } => {
                write!(f, "clear-to-send entry {entry} of slot {slot}: {err}")
            }
            Self::CtsGroup { slot } => {
                write!(
                    f,
                    "clear-to-send entries of slot {slot} disagree on the group size"
                )
            }
            Self::Immediate { imm, err } => write!(f, "immediate {imm:#010x}: {err}"),
            Self::Record(err) => write!(f, "completion record: {err}"),
            Self::WrId { wr_id, err } => write!(f, "completion wr_id {wr_id:#x}: {err}"),
            Self::UnexpectedCompletion { wr } => write!(f, "unexpected completion of a {wr}"),
            Self::Sequence { expected, got } => write!(
                f,
                "completion for receive sequence {got} while {expected} is the oldest outstanding"
            ),
            Self::GroupSize { expected, got } => write!(
                f,
                "completion for a group of {got} buffers, the receive has {expected}"
            ),
            Self::Overflow {
                index,
                size,
                capacity,
            } => write!(
                f,
                "{size} bytes reported for receive buffer {index} of {capacity} bytes"
            ),
            Self::BogusMismatch => {
                f.write_str("size mismatch flagged but no size exceeds its buffer")
            }
            Self::RingOverrun => f.write_str("more eager messages arrived than the ring holds"),
            Self::EagerHeader(err) => write!(f, "eager message header: {err}"),
            Self::Credits { freed } => write!(
                f,
                "credit word {freed} went back or past the eager messages sent"
            ),
            Self::FailoverReport => f.write_str("port-failover report is malformed or untrue"),
        }
    }
}
