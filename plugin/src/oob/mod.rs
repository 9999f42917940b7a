//! Out-of-band TCP: the socket each connection's handshake runs over.
//!
//! - [`iface`]: which local address to listen on (`NCCL_SOCKET_IFNAME`).
//! - [`socket`]: non-blocking listen, connect and accept.
//! - [`pump`]: moves bytes between a socket and a `rivet-core` handshake machine.

pub(crate) mod iface;
pub(crate) mod pump;
pub(crate) mod socket;
