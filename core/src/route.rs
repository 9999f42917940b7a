//! How a queue pair addresses its peer in INIT → RTR: by LID alone, or with a global route header
//! (GRH) carrying the peer's GID. NCCL's rule (`net_ib/connect.cc ncclIbQpRtr`):
//!
//! - Ethernet (RoCE): always a GRH; there are no LIDs.
//! - InfiniBand: the peer's LID, no GRH, unless the peer is in another subnet (the low 16 bits of
//!   the GIDs' subnet prefixes differ) or the local port requires a GRH (`IBV_QPF_GRH_REQUIRED`).
//!   Across subnets the destination LID is the peer's FLID (bits 32..48 of its GID, set by routers
//!   that support it); a zero FLID falls back to the peer's LID.
//!
//! The subnet prefix travels in the GID each end sends in its [`EndpointInfo`] (bytes 0..8).

use crate::wire::{EndpointInfo, LinkLayer};

/// `IBV_QPF_GRH_REQUIRED`: the bit of `ibv_port_attr::flags` saying every packet needs a GRH.
pub const PORT_FLAG_GRH_REQUIRED: u8 = 1;

/// What the decision needs to know about the local port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalPort {
    /// The port's link layer.
    pub link_layer: LinkLayer,
    /// The GID at the port's source GID index (its subnet prefix is compared with the peer's).
    pub gid: [u8; 16],
    /// `ibv_port_attr::flags` ([`PORT_FLAG_GRH_REQUIRED`]).
    pub port_flags: u8,
}

/// Why the address vector carries a GRH.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrhReason {
    /// RoCE addresses by GID only.
    Ethernet,
    /// InfiniBand, peer in another subnet; the destination LID is the peer's FLID.
    OtherSubnet,
    /// InfiniBand, peer in another subnet but its GID carries no FLID: the destination LID falls
    /// back to the peer's LID (NCCL warns, and so should the caller), which a router may not
    /// forward.
    OtherSubnetWithoutFlid,
    /// InfiniBand, same subnet, but the local port requires a GRH.
    PortRequiresGrh,
}

/// The address vector of INIT → RTR towards one peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// Destination LID (0 on Ethernet).
    pub dlid: u16,
    /// With a GRH: its destination GID (the peer's) and why it is there; `None` for LID-only
    /// addressing inside one InfiniBand subnet.
    pub grh: Option<([u8; 16], GrhReason)>,
}

impl Route {
    /// Whether the address vector is global (`ah_attr.is_global`).
    pub fn is_global(&self) -> bool {
        self.grh.is_some()
    }
}

/// The low 16 bits of the GID's subnet prefix (bytes 6..8, big-endian): what NCCL compares to
/// tell whether two InfiniBand ports share a subnet.
pub fn subnet_id(gid: &[u8; 16]) -> u16 {
    u16::from_be_bytes([gid[6], gid[7]])
}

/// The FLID carried in a routable GID (bytes 4..6, big-endian); 0 when there is none.
pub fn flid(gid: &[u8; 16]) -> u16 {
    u16::from_be_bytes([gid[4], gid[5]])
}

/// How to address `remote` from `local` (see the module docs for the rule).
pub fn route(local: &LocalPort, remote: &EndpointInfo) -> Route {
    if local.link_layer == LinkLayer::Ethernet {
        return Route {
            dlid: 0,
            grh: Some((remote.gid, GrhReason::Ethernet)),
        };
    }
    if subnet_id(&local.gid) != subnet_id(&remote.gid) {
        return match flid(&remote.gid) {
            0 => Route {
                dlid: remote.lid,
                grh: Some((remote.gid, GrhReason::OtherSubnetWithoutFlid)),
            },
            flid => Route {
                dlid: flid,
                grh: Some((remote.gid, GrhReason::OtherSubnet)),
            },
        };
    }
    if local.port_flags & PORT_FLAG_GRH_REQUIRED != 0 {
        return Route {
            dlid: remote.lid,
            grh: Some((remote.gid, GrhReason::PortRequiresGrh)),
        };
    }
    Route {
        dlid: remote.lid,
        grh: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::tests::{ib_endpoint, roce_endpoint};

    /// An InfiniBand GID: subnet prefix `fe80:0000:<flid>:<subnet>` and a port GUID.
    fn ib_gid(flid: u16, subnet: u16) -> [u8; 16] {
        let mut gid = [0u8; 16];
        gid[..2].copy_from_slice(&[0xfe, 0x80]);
        gid[4..6].copy_from_slice(&flid.to_be_bytes());
        gid[6..8].copy_from_slice(&subnet.to_be_bytes());
        gid[8..].copy_from_slice(&[0x0c, 0x42, 0xa1, 0x03, 0x00, 0x9b, 0x7f, 0x10]);
        gid
    }

    /// The InfiniBand test endpoint, with `gid` and `lid`.
    fn remote(gid: [u8; 16], lid: u16) -> EndpointInfo {
        EndpointInfo {
            gid,
            lid,
            ..ib_endpoint()
        }
    }

    fn ib_local(subnet: u16, port_flags: u8) -> LocalPort {
        LocalPort {
            link_layer: LinkLayer::Infiniband,
            gid: ib_gid(0, subnet),
            port_flags,
        }
    }

    #[test]
    fn same_infiniband_subnet_uses_the_lid_alone() {
        let peer = remote(ib_gid(0, 0x0001), 0x42);
        let r = route(&ib_local(0x0001, 0), &peer);
        assert_eq!(
            r,
            Route {
                dlid: 0x42,
                grh: None
            }
        );
        assert!(!r.is_global());
        // Only the low 16 bits of the prefix count, as in NCCL.
        let mut gid = ib_gid(0, 0x0001);
        gid[2] = 0x99;
        let r = route(&ib_local(0x0001, 0), &remote(gid, 0x42));
        assert!(!r.is_global());
    }

    #[test]
    fn another_subnet_gets_a_grh_and_the_peers_flid() {
        let gid = ib_gid(0x0203, 0x0002);
        let r = route(&ib_local(0x0001, 0), &remote(gid, 0x42));
        assert_eq!(
            r,
            Route {
                dlid: 0x0203,
                grh: Some((gid, GrhReason::OtherSubnet))
            }
        );
    }

    #[test]
    fn another_subnet_without_flid_falls_back_to_the_lid() {
        let gid = ib_gid(0, 0x0002);
        let r = route(&ib_local(0x0001, 0), &remote(gid, 0x42));
        assert_eq!(
            r,
            Route {
                dlid: 0x42,
                grh: Some((gid, GrhReason::OtherSubnetWithoutFlid))
            }
        );
    }

    #[test]
    fn a_port_that_requires_a_grh_gets_one_in_its_own_subnet() {
        let gid = ib_gid(0x0203, 0x0001);
        let r = route(
            &ib_local(0x0001, PORT_FLAG_GRH_REQUIRED),
            &remote(gid, 0x42),
        );
        // Same subnet: the LID, not the FLID.
        assert_eq!(
            r,
            Route {
                dlid: 0x42,
                grh: Some((gid, GrhReason::PortRequiresGrh))
            }
        );
        // Other flag bits do not ask for a GRH.
        let r = route(&ib_local(0x0001, 0x80), &remote(gid, 0x42));
        assert!(!r.is_global());
    }

    #[test]
    fn ethernet_always_gets_a_grh() {
        let peer = roce_endpoint();
        let mut gid = peer.gid;
        gid[15] = 1;
        // Same "subnet id" bytes as the peer, and a flag that would not matter: GRH regardless.
        let local = LocalPort {
            link_layer: LinkLayer::Ethernet,
            gid,
            port_flags: 0,
        };
        assert_eq!(
            route(&local, &peer),
            Route {
                dlid: 0,
                grh: Some((peer.gid, GrhReason::Ethernet))
            }
        );
    }
}
