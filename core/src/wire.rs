//! Wire formats of the connection handshake: the listen handle NCCL carries between ranks, and
//! the framed messages the two ends exchange over the out-of-band TCP socket.
//!
//! # Design
//!
//! Both ends always run Rivet, so the formats are our own, not NCCL's. Every format is
//! *versioned*, *magic-tagged* and *fully validated*:
//!
//! - Everything is encoded explicitly, little-endian, field by field; nothing is transmuted.
//! - Every reserved or padding byte must be zero, every enumeration must hold a known code, every
//!   number must be in its range. A decoder accepts exactly the canonical encodings of valid
//!   values, so `encode(decode(x)) == x` for every `x` it accepts.
//! - Every format begins with a 4-byte magic and the little-endian `u16` [`WIRE_VERSION`]. That
//!   prefix is permanent: no later version may move it, so a mismatch is always recognised from the
//!   first six bytes and reported as [`WireError::VersionMismatch`] instead of as garbage.
//!
//! # Listen handle ([`ListenHandle`], [`HANDLE_LEN`] = 64 bytes)
//!
//! NCCL's handle is 128 bytes; bytes 64..128 belong to the driver (it keeps its connect-retry
//! state there), so [`ListenHandle::decode`] reads only the first 64 bytes.
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 4 | magic `"RVTH"` |
//! | 4 | 2 | wire version |
//! | 6 | 1 | Rivet version length, 1..=16 |
//! | 7 | 16 | Rivet version (printable ASCII, zero padded) |
//! | 23 | 1 | address family: 4 or 6 |
//! | 24 | 16 | IP address (IPv4 in the first 4 bytes, the rest zero) |
//! | 40 | 2 | TCP port, not 0 |
//! | 42 | 2 | reserved, zero |
//! | 44 | 4 | IPv6 flow info (zero for IPv4) |
//! | 48 | 4 | IPv6 scope id (zero for IPv4) |
//! | 52 | 8 | listen id (a random nonce of the listen comm) |
//! | 60 | 4 | CRC-32C of bytes 0..60 |
//!
//! Bytes 0..23 (magic, wire version, Rivet version) and the checksum position are permanent, so a
//! handle from another wire version names the Rivet release that wrote it.
//!
//! # Mesh address list ([`MeshList`], [`MESH_LIST_LEN`] = 48 bytes at [`MESH_LIST_AT`] = 80)
//!
//! Only in handles of a mesh device's listen comm ([`crate::mesh`]); all zero otherwise.
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 4 | magic `"RVTM"` |
//! | 4 | 2 | wire version |
//! | 6 | 1 | address count, 1..=7 |
//! | 7 | 1 | reserved, zero |
//! | 8 | 35 | 7 × (IPv4 address, prefix length 1..=32); unused slots zero |
//! | 43 | 4 | CRC-32C of bytes 0..43 |
//! | 47 | 1 | reserved, zero |
//!
//! # Frames ([`Message`])
//!
//! Every message is a 12-byte [`FrameHeader`] followed by a body of exactly the length its kind
//! prescribes (and never more than [`MAX_BODY_LEN`]):
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 4 | magic `"RVTF"` |
//! | 4 | 2 | wire version |
//! | 6 | 1 | message kind ([`MessageKind`]) |
//! | 7 | 1 | flags, zero |
//! | 8 | 4 | body length |
//!
//! | kind | code | body |
//! |---|---:|---|
//! | [`ConnectRequest`] | 1 | listen id `u64` @0, Rivet version length @8, Rivet version (16 bytes) @9, [`Lanes`] count − 1 (0..=127) @25, width − 1 (0..count) @26, options @27 (0, or 1: port failover asked), sender [`EndpointInfo`] (lane 0) @28; 108 bytes |
//! | [`AcceptReply`] | 2 | receiver [`EndpointInfo`]; 80 bytes |
//! | `Ready` | 3 | empty |
//! | [`Reject`] | 4 | reason code `u16` @0, reserved zero `u16` @2; 4 bytes |
//! | `Lane` | 5 | one more [`EndpointInfo`] of a connection with several lanes; 80 bytes |
//! | `Failover` | 6 | the acceptor's port failover, 0 off or 1 on, @0, reserved zero @1..4; 4 bytes |
//!
//! A connection with `count` lanes sends `count - 1` Lane frames right after the connect request
//! (the connector's lanes 1.., in order) and `count - 1` right after the accept reply (the
//! acceptor's). Lane bytes were reserved zero before lanes existed, so a one-lane request is
//! byte for byte what earlier releases of this wire version send.
//!
//! A connector with port failover on (`NCCL_IB_RESILIENCY_PORT_FAILOVER`, issue #39) sets the
//! request's option byte to 1, and the acceptor then answers with one Failover frame after its
//! lanes (whether it has failover on too); a connection fails over only when both have it. The
//! option byte was reserved zero before, so a connector without failover sends byte for byte what
//! earlier releases of this wire version send, and an earlier acceptor refuses a request with it
//! (a clear handshake error on both ends rather than a connection whose ends disagree).
//!
//! # Endpoint info ([`EndpointInfo`], [`ENDPOINT_INFO_LEN`] = 80 bytes)
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 16 | GID |
//! | 16 | 2 | LID |
//! | 18 | 1 | port number, 1..=254 |
//! | 19 | 1 | MTU (`ibv_mtu`), 1..=5 |
//! | 20 | 1 | link layer: 1 InfiniBand, 2 Ethernet |
//! | 21 | 1 | traffic class |
//! | 22 | 1 | service level, 0..=15 |
//! | 23 | 1 | device name length, 1..=32 |
//! | 24 | 4 | QP number, < 2^24 |
//! | 28 | 4 | first PSN, < 2^24 |
//! | 32 | 8 | inbound region address |
//! | 40 | 4 | inbound region rkey |
//! | 44 | 4 | inbound region length, not 0, address + length must not overflow |
//! | 48 | 32 | device name (printable ASCII, zero padded) |
//!
//! InfiniBand endpoints carry a unicast LID (1..=0xBFFF); Ethernet (RoCE) endpoints carry LID 0
//! and a non-zero GID.

mod ascii;
mod bytes;
mod crc;
mod endpoint;
mod error;
mod handle;
mod mesh;
mod message;
#[cfg(test)]
pub(crate) mod tests;

pub use ascii::{DeviceName, RivetVersion};
pub use endpoint::{ENDPOINT_INFO_LEN, EndpointInfo, LinkLayer};
pub use error::{MagicBytes, WireError};
pub use handle::{HANDLE_LEN, HANDLE_MAGIC, ListenHandle};
pub use mesh::{MAX_MESH_ADDRS, MESH_LIST_AT, MESH_LIST_LEN, MESH_MAGIC, MeshList};
pub use message::{
    AcceptReply, ConnectRequest, FRAME_MAGIC, FrameHeader, HEADER_LEN, Lanes, MAX_BODY_LEN,
    MAX_FRAME_LEN, MAX_LANES, Message, MessageKind, Reject, RejectReason,
};

/// The version of every format in this module. Both ends of a connection must speak the same one.
pub const WIRE_VERSION: u16 = 3;
