//! The mesh address list: every RDMA address of a listening node, in bytes 80..128 of NCCL's
//! handle, so the connecting side can pick the local NIC that reaches one of them
//! ([`crate::mesh`]).

use super::bytes::Reader;
use super::crc::crc32c;
use super::{WIRE_VERSION, WireError};
use crate::mesh::MeshAddr;
use core::net::Ipv4Addr;

/// Where the list starts in NCCL's 128-byte handle (after the listen handle and the driver's
/// 16-byte connect token).
pub const MESH_LIST_AT: usize = 80;
/// Bytes the list occupies.
pub const MESH_LIST_LEN: usize = 48;
/// Most addresses one list carries.
pub const MAX_MESH_ADDRS: usize = 7;
/// The magic the list starts with.
pub const MESH_MAGIC: [u8; 4] = *b"RVTM";

const WHAT: &str = "mesh address list";
/// Magic, wire version, count, reserved.
const HEADER: usize = 8;
/// IPv4 address and prefix length.
const ENTRY: usize = 5;
const CHECKSUM_AT: usize = HEADER + MAX_MESH_ADDRS * ENTRY;

/// A node's RDMA addresses, in member order (index `i` is member `i` of the node's mesh device).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MeshList {
    addrs: [MeshAddr; MAX_MESH_ADDRS],
    len: u8,
}

impl MeshList {
    /// The list of `addrs`, or `None` when there are none or more than [`MAX_MESH_ADDRS`].
    pub fn new(addrs: &[MeshAddr]) -> Option<Self> {
        if addrs.is_empty() || addrs.len() > MAX_MESH_ADDRS {
            return None;
        }
        let mut list = Self {
            addrs: [MeshAddr::UNSPECIFIED; MAX_MESH_ADDRS],
            len: addrs.len() as u8,
        };
        list.addrs[..addrs.len()].copy_from_slice(addrs);
        Some(list)
    }

    /// The addresses.
    pub fn addrs(&self) -> &[MeshAddr] {
        &self.addrs[..usize::from(self.len)]
    }

    /// The [`MESH_LIST_LEN`] bytes to put at [`MESH_LIST_AT`].
    pub fn encode(&self) -> [u8; MESH_LIST_LEN] {
        let mut out = [0u8; MESH_LIST_LEN];
        out[..4].copy_from_slice(&MESH_MAGIC);
        out[4..6].copy_from_slice(&WIRE_VERSION.to_le_bytes());
        out[6] = self.len;
        for (i, a) in self.addrs().iter().enumerate() {
            let at = HEADER + i * ENTRY;
            out[at..at + 4].copy_from_slice(&a.ip.octets());
            out[at + 4] = a.prefix_len;
        }
        let crc = crc32c(&out[..CHECKSUM_AT]);
        out[CHECKSUM_AT..CHECKSUM_AT + 4].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decode the list from the first [`MESH_LIST_LEN`] bytes of `bytes`; `Ok(None)` when they
    /// hold no list (all zero: the listener is not a mesh device). Checks magic, checksum, wire
    /// version, count, every address (unicast, prefix 1..=32) and that unused bytes are zero.
    pub fn decode(bytes: &[u8]) -> Result<Option<Self>, WireError> {
        let bytes = bytes.get(..MESH_LIST_LEN).ok_or(WireError::Truncated {
            what: WHAT,
            needed: MESH_LIST_LEN,
            found: bytes.len(),
        })?;
        if bytes.iter().all(|&b| b == 0) {
            return Ok(None);
        }
        let mut r = Reader::new(bytes, WHAT);
        let magic = r.array::<4>()?;
        if magic != MESH_MAGIC {
            return Err(WireError::BadMagic {
                what: WHAT,
                expected: MESH_MAGIC,
                found: super::MagicBytes::new(&magic),
            });
        }
        let stored = u32::from_le_bytes([
            bytes[CHECKSUM_AT],
            bytes[CHECKSUM_AT + 1],
            bytes[CHECKSUM_AT + 2],
            bytes[CHECKSUM_AT + 3],
        ]);
        let computed = crc32c(&bytes[..CHECKSUM_AT]);
        if stored != computed {
            return Err(WireError::BadChecksum {
                found: stored,
                computed,
            });
        }
        let version = r.u16()?;
        if version != WIRE_VERSION {
            return Err(WireError::VersionMismatch {
                what: WHAT,
                ours: WIRE_VERSION,
                theirs: version,
                their_rivet: None,
            });
        }
        let len = r.u8()?;
        if !(1..=MAX_MESH_ADDRS as u8).contains(&len) {
            return Err(WireError::BadField {
                field: "mesh address count",
                value: len.into(),
                expected: "1..=7",
            });
        }
        r.reserved::<1>("mesh list reserved byte")?;
        let mut addrs = [MeshAddr::UNSPECIFIED; MAX_MESH_ADDRS];
        for (i, slot) in addrs.iter_mut().enumerate() {
            let ip = Ipv4Addr::from(r.array::<4>()?);
            let prefix_len = r.u8()?;
            if i < usize::from(len) {
                let addr = MeshAddr { ip, prefix_len };
                if !addr.is_valid() {
                    return Err(WireError::BadField {
                        field: "mesh address",
                        value: u64::from(u32::from(ip)) << 8 | u64::from(prefix_len),
                        expected: "a unicast IPv4 address with a prefix of 1..=32 bits",
                    });
                }
                *slot = addr;
            } else if ip != Ipv4Addr::UNSPECIFIED || prefix_len != 0 {
                return Err(WireError::BadField {
                    field: "unused mesh address slot",
                    value: u64::from(u32::from(ip)) << 8 | u64::from(prefix_len),
                    expected: "0",
                });
            }
        }
        let _checksum = r.u32()?;
        r.reserved::<1>("mesh list trailing byte")?;
        r.finish()?;
        Ok(Some(Self { addrs, len }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str, prefix_len: u8) -> MeshAddr {
        MeshAddr {
            ip: s.parse().unwrap(),
            prefix_len,
        }
    }

    #[test]
    fn round_trips_and_rejects_every_corruption() {
        let list = MeshList::new(&[addr("192.168.101.1", 24), addr("192.168.100.1", 24)]).unwrap();
        let bytes = list.encode();
        assert_eq!(MeshList::decode(&bytes), Ok(Some(list)));
        assert_eq!(MeshList::decode(&[0; MESH_LIST_LEN]), Ok(None));
        for i in 0..MESH_LIST_LEN {
            let mut bad = bytes;
            bad[i] ^= 0x10;
            assert!(
                MeshList::decode(&bad).is_err(),
                "byte {i} flipped was accepted"
            );
        }
        assert!(matches!(
            MeshList::decode(&bytes[..20]),
            Err(WireError::Truncated { .. })
        ));
    }

    #[test]
    fn refuses_counts_and_addresses_out_of_range() {
        assert!(MeshList::new(&[]).is_none());
        assert!(MeshList::new(&[addr("10.0.0.1", 8); 8]).is_none());
        let reencode = |mut bytes: [u8; MESH_LIST_LEN]| {
            let crc = crc32c(&bytes[..CHECKSUM_AT]);
            bytes[CHECKSUM_AT..CHECKSUM_AT + 4].copy_from_slice(&crc.to_le_bytes());
            bytes
        };
        let good = MeshList::new(&[addr("10.1.2.3", 24)]).unwrap().encode();
        let mut zero_count = good;
        zero_count[6] = 0;
        assert!(matches!(
            MeshList::decode(&reencode(zero_count)),
            Err(WireError::BadField {
                field: "mesh address count",
                ..
            })
        ));
        let mut prefix_33 = good;
        prefix_33[HEADER + 4] = 33;
        assert!(MeshList::decode(&reencode(prefix_33)).is_err());
        let mut multicast = good;
        multicast[HEADER] = 224;
        assert!(MeshList::decode(&reencode(multicast)).is_err());
        let mut unused = good;
        unused[HEADER + ENTRY] = 1;
        assert!(matches!(
            MeshList::decode(&reencode(unused)),
            Err(WireError::BadField {
                field: "unused mesh address slot",
                ..
            })
        ));
    }
}
