//! The two sans-IO machines of one connection's handshake: [`Connector`] (NCCL `connect`, the
//! sender) and [`Acceptor`] (NCCL `accept`, the receiver).
//!
//! # Design
//!
//! The driver owns a non-blocking out-of-band TCP socket per connection and moves bytes between it
//! and a machine; the machine owns every decision. The exchange (formats in [`crate::wire`]):
//!
//! ```text
//! Connector                                      Acceptor
//!   ConnectRequest {listen id, Rivet version, sender endpoint} ──▶
//!                                                  check listen id → Request event
//!                                                  driver: create QP, RTR, RTS → handle_local_ready
//!                    ◀── AcceptReply {receiver endpoint}
//!   BringUp event → driver: RTR, RTS → handle_qp_ready
//!   Ready ──▶
//!   Established (once Ready is written)            Established (once Ready is read)
//! ```
//!
//! Either end sends a `Reject` instead of its next message when it refuses the connection (wrong
//! listen id, another wire version, malformed input, link layer mismatch, set-up failure,
//! timeout); the other end then fails with [`HandshakeError::Rejected`] and a reason instead of
//! a bare EOF. The acceptor only reports `Established` after `Ready`, so it never writes to a QP
//! that is not yet at RTS — the same guarantee NCCL's final `ready` int gives.
//!
//! Rules both machines follow:
//!
//! - **Never block, never read a clock.** Time comes in as an [`Instant`]; one deadline, fixed at
//!   creation, covers the whole handshake (driver stages included), so a connection can never
//!   hang.
//! - **Write before read.** A machine asks for input only when it has nothing left to send, and
//!   then only for the rest of the current frame's header or body ([`Handshake::input_wanted`]).
//!   The driver never reads more than that, so no byte beyond a frame is ever swallowed, and a
//!   machine never needs more than [`MAX_FRAME_LEN`](crate::wire::MAX_FRAME_LEN) bytes at once.
//! - **Fail early.** The frame header is checked byte by byte: a wrong magic fails on the first
//!   wrong byte, another wire version as soon as its two bytes are there
//!   ([`WireError::VersionMismatch`](crate::wire::WireError::VersionMismatch), saying whose is
//!   newer), a bad length before any body byte is read.
//! - **Fail once.** The states are enums carrying only what each stage has; `Failed` is terminal,
//!   and every fallible call on a failed machine returns the same error. A call out of order is
//!   [`HandshakeError::Misuse`], never a panic. No input can make a machine panic.
//!
//! [`Handshake`] gathers the interface both machines share, for drivers and tests written once.

mod acceptor;
mod connector;
mod error;
mod io;
#[cfg(test)]
mod tests;

pub use acceptor::{Acceptor, AcceptorEvent, AcceptorStage};
pub use connector::{Connector, ConnectorEvent, ConnectorStage};
pub use error::{HandshakeError, Incompatibility};

use crate::time::Instant;

/// The byte, time and event interface [`Connector`] and [`Acceptor`] share. Each method forwards
/// to the inherent method of the same name; see [`Connector`] for the driving protocol.
pub trait Handshake {
    /// The machine's event type.
    type Event;

    /// Bytes to write to the socket now (possibly none).
    fn poll_transmit(&self) -> &[u8];
    /// The first `n` bytes of [`poll_transmit`](Self::poll_transmit) were written.
    fn handle_transmitted(&mut self, n: usize);
    /// The most bytes the machine takes now (0: read nothing).
    fn input_wanted(&self) -> usize;
    /// Bytes read from the socket, at most [`input_wanted`](Self::input_wanted).
    fn handle_input(&mut self, bytes: &[u8]) -> Result<(), HandshakeError>;
    /// The socket reached EOF.
    fn handle_peer_closed(&mut self) -> Result<(), HandshakeError>;
    /// The next event for the driver.
    fn poll_event(&mut self) -> Option<Self::Event>;
    /// When [`handle_timeout`](Self::handle_timeout) is due.
    fn poll_timeout(&self) -> Option<Instant>;
    /// The clock reached `now`.
    fn handle_timeout(&mut self, now: Instant);
    /// True once the handshake completed.
    fn is_established(&self) -> bool;
    /// The error, once failed.
    fn error(&self) -> Option<&HandshakeError>;
    /// The name of the current stage.
    fn stage_name(&self) -> &'static str;
}

macro_rules! forward_handshake {
    ($machine:ty, $event:ty) => {
        impl Handshake for $machine {
            type Event = $event;

            fn poll_transmit(&self) -> &[u8] {
                <$machine>::poll_transmit(self)
            }
            fn handle_transmitted(&mut self, n: usize) {
                <$machine>::handle_transmitted(self, n)
            }
            fn input_wanted(&self) -> usize {
                <$machine>::input_wanted(self)
            }
            fn handle_input(&mut self, bytes: &[u8]) -> Result<(), HandshakeError> {
                <$machine>::handle_input(self, bytes)
            }
            fn handle_peer_closed(&mut self) -> Result<(), HandshakeError> {
                <$machine>::handle_peer_closed(self)
            }
            fn poll_event(&mut self) -> Option<$event> {
                <$machine>::poll_event(self)
            }
            fn poll_timeout(&self) -> Option<Instant> {
                <$machine>::poll_timeout(self)
            }
            fn handle_timeout(&mut self, now: Instant) {
                <$machine>::handle_timeout(self, now)
            }
            fn is_established(&self) -> bool {
                <$machine>::is_established(self)
            }
            fn error(&self) -> Option<&HandshakeError> {
                <$machine>::error(self)
            }
            fn stage_name(&self) -> &'static str {
                self.stage().name()
            }
        }
    };
}

forward_handshake!(Connector, ConnectorEvent);
forward_handshake!(Acceptor, AcceptorEvent);
