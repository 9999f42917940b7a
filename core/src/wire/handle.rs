//! The listen handle: what the receiver's `listen` gives NCCL to pass to the sender's `connect`.

use alloc::vec::Vec;
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use super::bytes::Reader;
use super::crc::crc32c;
use super::{RivetVersion, WIRE_VERSION, WireError};

/// Bytes of NCCL's 128-byte handle that belong to the listen handle. The rest belong to the driver.
pub const HANDLE_LEN: usize = 64;

/// The magic a listen handle starts with.
pub const HANDLE_MAGIC: [u8; 4] = *b"RVTH";

/// Offset of the checksum, which covers every byte before it.
const CHECKSUM_AT: usize = 60;

const WHAT: &str = "listen handle";

/// Where and how to reach a listening Rivet receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenHandle {
    /// The listening TCP socket's address (not unspecified, port not 0).
    pub addr: SocketAddr,
    /// A random nonce of the listen comm; the acceptor rejects a connector that presents another,
    /// so a handle to a stale or different listen comm fails cleanly.
    pub listen_id: u64,
    /// The Rivet release that wrote the handle.
    pub rivet_version: RivetVersion,
}

impl ListenHandle {
    /// A handle written by this release.
    pub fn new(addr: SocketAddr, listen_id: u64) -> Self {
        Self {
            addr,
            listen_id,
            rivet_version: RivetVersion::ours(),
        }
    }

    /// The [`HANDLE_LEN`] bytes to put at the start of NCCL's handle.
    pub fn encode(&self) -> [u8; HANDLE_LEN] {
        let mut v = Vec::with_capacity(HANDLE_LEN);
        v.extend_from_slice(&HANDLE_MAGIC);
        v.extend_from_slice(&WIRE_VERSION.to_le_bytes());
        v.push(self.rivet_version.wire_len());
        v.extend_from_slice(self.rivet_version.wire_bytes());
        let (family, ip, flowinfo, scope_id) = match self.addr {
            SocketAddr::V4(a) => {
                let mut ip = [0; 16];
                for (slot, byte) in ip.iter_mut().zip(a.ip().octets()) {
                    *slot = byte;
                }
                (4, ip, 0, 0)
            }
            SocketAddr::V6(a) => (6, a.ip().octets(), a.flowinfo(), a.scope_id()),
        };
        v.push(family);
        v.extend_from_slice(&ip);
        v.extend_from_slice(&self.addr.port().to_le_bytes());
        v.extend_from_slice(&[0, 0]);
        v.extend_from_slice(&flowinfo.to_le_bytes());
        v.extend_from_slice(&scope_id.to_le_bytes());
        v.extend_from_slice(&self.listen_id.to_le_bytes());
        v.extend_from_slice(&crc32c(&v).to_le_bytes());
        let mut out = [0; HANDLE_LEN];
        for (slot, byte) in out.iter_mut().zip(&v) {
            *slot = *byte;
        }
        out
    }

    /// Decodes the first [`HANDLE_LEN`] bytes of `bytes` (any bytes after them are the driver's and
    /// are not looked at). Checks, in order: length, magic, checksum, wire version, every field.
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let bytes = bytes.get(..HANDLE_LEN).ok_or(WireError::Truncated {
            what: WHAT,
            needed: HANDLE_LEN,
            found: bytes.len(),
        })?;
        let mut r = Reader::new(bytes, WHAT);
        let magic = r.array::<4>()?;
        if magic != HANDLE_MAGIC {
            return Err(WireError::BadMagic {
                what: WHAT,
                expected: HANDLE_MAGIC,
                found: super::MagicBytes::new(&magic),
            });
        }
        let (covered, stored) = bytes.split_at(CHECKSUM_AT);
        let found = u32::from_le_bytes(stored.try_into().map_err(|_| WireError::Truncated {
            what: WHAT,
            needed: HANDLE_LEN,
            found: bytes.len(),
        })?);
        let computed = crc32c(covered);
        if found != computed {
            return Err(WireError::BadChecksum { found, computed });
        }
        let version = r.u16()?;
        let version_len = r.u8()?;
        let version_bytes = r.array::<{ RivetVersion::MAX_LEN }>()?;
        if version != WIRE_VERSION {
            return Err(WireError::VersionMismatch {
                what: WHAT,
                ours: WIRE_VERSION,
                theirs: version,
                their_rivet: RivetVersion::from_wire(version_len, version_bytes).ok(),
            });
        }
        let rivet_version = RivetVersion::from_wire(version_len, version_bytes)?;
        let family = r.u8()?;
        let ip = r.array::<16>()?;
        let port = r.u16()?;
        r.reserved::<2>("listen handle reserved bytes")?;
        let flowinfo = r.u32()?;
        let scope_id = r.u32()?;
        let listen_id = r.u64()?;
        let _checksum = r.u32()?;
        r.finish()?;

        let addr = match family {
            4 => {
                let [a, b, c, d, rest @ ..] = ip;
                let mut padding = rest
                    .into_iter()
                    .chain(flowinfo.to_le_bytes())
                    .chain(scope_id.to_le_bytes());
                if let Some(byte) = padding.find(|&b| b != 0) {
                    return Err(WireError::BadField {
                        field: "IPv4 handle padding",
                        value: byte.into(),
                        expected: "0",
                    });
                }
                SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(a, b, c, d), port))
            }
            6 => SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(ip),
                port,
                flowinfo,
                scope_id,
            )),
            other => {
                return Err(WireError::BadField {
                    field: "address family",
                    value: other.into(),
                    expected: "4 or 6",
                });
            }
        };
        if port == 0 {
            return Err(WireError::BadField {
                field: "port",
                value: 0,
                expected: "1..=65535",
            });
        }
        let unspecified = match addr.ip() {
            IpAddr::V4(ip) => ip.is_unspecified(),
            IpAddr::V6(ip) => ip.is_unspecified(),
        };
        if unspecified {
            return Err(WireError::BadField {
                field: "IP address",
                value: 0,
                expected: "a specific address, not 0.0.0.0 or ::",
            });
        }
        Ok(Self {
            addr,
            listen_id,
            rivet_version,
        })
    }
}
