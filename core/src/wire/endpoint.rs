//! What one end tells the other about its queue pair: enough to move the peer's QP to RTR/RTS and
//! to RDMA-write into this end's inbound control region.

use alloc::vec::Vec;

use super::DeviceName;
use super::WireError;
use super::bytes::Reader;
use crate::nic::RemoteRegion;

/// Encoded size of an [`EndpointInfo`].
pub const ENDPOINT_INFO_LEN: usize = 80;

/// Largest QP number and PSN, plus one: both are 24-bit quantities.
const LIMIT_24_BITS: u32 = 1 << 24;

/// The link layer of a port (`ibv_port_attr.link_layer`). Both ends must use the same one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinkLayer {
    /// InfiniBand: addressed by LID, GRH optional.
    Infiniband,
    /// Ethernet (RoCE): addressed by GID, always with a GRH.
    Ethernet,
}

impl LinkLayer {
    /// The verbs code (`IBV_LINK_LAYER_INFINIBAND` = 1, `IBV_LINK_LAYER_ETHERNET` = 2).
    pub fn code(self) -> u8 {
        match self {
            Self::Infiniband => 1,
            Self::Ethernet => 2,
        }
    }

    /// The link layer with verbs code `code`, if there is one.
    pub fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Self::Infiniband),
            2 => Some(Self::Ethernet),
            _ => None,
        }
    }

    /// Human name for messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Infiniband => "InfiniBand",
            Self::Ethernet => "Ethernet (RoCE)",
        }
    }
}

impl core::fmt::Display for LinkLayer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// One end of a connection: its port, its queue pair, and the region the peer may write into.
///
/// Construct it from the device and QP attributes, then check it with [`validate`](Self::validate)
/// (the handshake machines do that for the local end; [`decode`](Self::decode) does it for the
/// peer's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointInfo {
    /// The port's GID (the one selected by the GID index; all zero is allowed only on InfiniBand).
    /// On InfiniBand its subnet prefix and FLID decide how the peer addresses this end
    /// ([`crate::route`]).
    pub gid: [u8; 16],
    /// The port's LID: 1..=0xBFFF (unicast) on InfiniBand, 0 on Ethernet.
    pub lid: u16,
    /// The port number on the device, 1..=254.
    pub port_num: u8,
    /// The port's active MTU as the `ibv_mtu` enum numbers it: 1 (256 B) ..= 5 (4096 B).
    pub mtu: u8,
    /// The port's link layer.
    pub link_layer: LinkLayer,
    /// The QP number, < 2^24.
    pub qpn: u32,
    /// The first packet sequence number this end sends, < 2^24.
    pub psn: u32,
    /// The region the peer may RDMA-write into. Not empty, and `addr + len` must not overflow.
    pub inbound: RemoteRegion,
    /// The traffic class for the GRH.
    pub traffic_class: u8,
    /// The service level, 0..=15.
    pub service_level: u8,
    /// The NIC's name, for log lines.
    pub device_name: DeviceName,
}

impl EndpointInfo {
    /// Checks every field against its range (see the field docs).
    pub fn validate(&self) -> Result<(), WireError> {
        let bad = |field, value: u64, expected| {
            Err(WireError::BadField {
                field,
                value,
                expected,
            })
        };
        if !(1..=254).contains(&self.port_num) {
            return bad("port number", self.port_num.into(), "1..=254");
        }
        if !(1..=5).contains(&self.mtu) {
            return bad("mtu", self.mtu.into(), "1..=5 (ibv_mtu 256..4096)");
        }
        if self.service_level > 15 {
            return bad("service level", self.service_level.into(), "0..=15");
        }
        if self.qpn >= LIMIT_24_BITS {
            return bad("qpn", self.qpn.into(), "< 2^24");
        }
        if self.psn >= LIMIT_24_BITS {
            return bad("psn", self.psn.into(), "< 2^24");
        }
        match self.link_layer {
            LinkLayer::Infiniband if !(1..=0xBFFF).contains(&self.lid) => {
                return bad(
                    "lid",
                    self.lid.into(),
                    "a unicast LID 1..=0xBFFF on InfiniBand",
                );
            }
            LinkLayer::Ethernet if self.lid != 0 => {
                return bad("lid", self.lid.into(), "0 on Ethernet (RoCE)");
            }
            LinkLayer::Ethernet if self.gid == [0; 16] => {
                return bad("gid", 0, "a non-zero GID on Ethernet (RoCE)");
            }
            _ => {}
        }
        if self.inbound.len == 0 {
            return bad("inbound region length", 0, "a non-empty region");
        }
        if self
            .inbound
            .addr
            .checked_add(self.inbound.len.into())
            .is_none()
        {
            return bad(
                "inbound region address",
                self.inbound.addr,
                "an address + length that does not overflow 64 bits",
            );
        }
        Ok(())
    }

    /// Appends the [`ENDPOINT_INFO_LEN`] encoded bytes. Does not validate: encode only values
    /// that passed [`validate`](Self::validate), or the peer will reject them.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.gid);
        out.extend_from_slice(&self.lid.to_le_bytes());
        out.push(self.port_num);
        out.push(self.mtu);
        out.push(self.link_layer.code());
        out.push(self.traffic_class);
        out.push(self.service_level);
        out.push(self.device_name.wire_len());
        out.extend_from_slice(&self.qpn.to_le_bytes());
        out.extend_from_slice(&self.psn.to_le_bytes());
        out.extend_from_slice(&self.inbound.addr.to_le_bytes());
        out.extend_from_slice(&self.inbound.rkey.to_le_bytes());
        out.extend_from_slice(&self.inbound.len.to_le_bytes());
        out.extend_from_slice(self.device_name.wire_bytes());
    }

    /// Decodes exactly [`ENDPOINT_INFO_LEN`] bytes and validates every field.
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(bytes, "endpoint info");
        let info = Self::read(&mut r)?;
        r.finish()?;
        Ok(info)
    }

    /// Reads and validates one endpoint info from `r`.
    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let gid = r.array::<16>()?;
        let lid = r.u16()?;
        let port_num = r.u8()?;
        let mtu = r.u8()?;
        let link_code = r.u8()?;
        let link_layer = LinkLayer::from_code(link_code).ok_or(WireError::BadField {
            field: "link layer",
            value: link_code.into(),
            expected: "1 (InfiniBand) or 2 (Ethernet)",
        })?;
        let traffic_class = r.u8()?;
        let service_level = r.u8()?;
        let name_len = r.u8()?;
        let qpn = r.u32()?;
        let psn = r.u32()?;
        let inbound = RemoteRegion {
            addr: r.u64()?,
            rkey: r.u32()?,
            len: r.u32()?,
        };
        let device_name = DeviceName::from_wire(name_len, r.array()?)?;
        let info = Self {
            gid,
            lid,
            port_num,
            mtu,
            link_layer,
            qpn,
            psn,
            inbound,
            traffic_class,
            service_level,
            device_name,
        };
        info.validate()?;
        Ok(info)
    }
}
