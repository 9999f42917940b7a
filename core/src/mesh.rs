//! Direct-connect meshes: which local NIC talks to which peer address.
//!
//! In a switchless cluster every node has one NIC per peer and every link is its own subnet
//! (A–B 192.168.101.0/24, A–C 192.168.100.0/24, B–C 192.168.102.0/24). NCCL assumes any NIC
//! reaches any NIC, so Rivet shows such a node to NCCL as one *mesh device* whose members are its
//! NICs, and chooses the member per connection:
//!
//! - the listener puts every member's address in its handle ([`crate::wire::MeshList`]);
//! - the connector takes, in its own member order, the first local member that shares a subnet
//!   with one of the listener's addresses (both ends' prefixes must contain the other's address);
//! - failing that, the first listener address the host's routing table reaches through one of its
//!   members (RoCE v2 is routable; the driver asks the kernel which source address it would use);
//! - failing that, nothing reaches: [`MeshError::Unreachable`] names both sides' addresses;
//! - the listener serves each connection on the member whose address the connector reached
//!   ([`arrival_member`]): the handshake travels over the same link as the data.
//!
//! Every decision here is pure; the driver supplies addresses and route lookups.

use core::fmt;
use core::net::Ipv4Addr;

/// One NIC's address in a mesh: its IPv4 address (the RoCE v2 GID's) and its subnet prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MeshAddr {
    /// The address.
    pub ip: Ipv4Addr,
    /// Bits of the subnet prefix, 1..=32.
    pub prefix_len: u8,
}

impl MeshAddr {
    /// The all-zero placeholder of unused slots.
    pub const UNSPECIFIED: Self = Self {
        ip: Ipv4Addr::UNSPECIFIED,
        prefix_len: 0,
    };

    /// A unicast address with a prefix of 1..=32 bits.
    pub fn is_valid(&self) -> bool {
        (1..=32).contains(&self.prefix_len)
            && !self.ip.is_unspecified()
            && !self.ip.is_multicast()
            && !self.ip.is_broadcast()
            && !self.ip.is_loopback()
    }

    fn mask(&self) -> u32 {
        match self.prefix_len {
            0 => 0,
            n => u32::MAX << (32 - u32::from(n.min(32))),
        }
    }

    /// Whether `ip` lies in this address's subnet.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        (u32::from(self.ip) ^ u32::from(ip)) & self.mask() == 0
    }

    /// Whether the two addresses are on one link: each one's subnet contains the other.
    pub fn same_subnet(&self, other: &Self) -> bool {
        self.contains(other.ip) && other.contains(self.ip)
    }
}

impl fmt::Display for MeshAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.ip, self.prefix_len)
    }
}

/// How the chosen pair reaches each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// Both addresses on one subnet: the direct link.
    Subnet,
    /// Through the host's routing table (RoCE v2 routed by IP).
    Routed,
}

/// The pair a connection uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MeshChoice {
    /// Index of the local member.
    pub local: usize,
    /// Index of the peer's address in its list.
    pub peer: usize,
    /// Why this pair.
    pub reach: Reach,
}

/// Why no pair was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MeshError {
    /// No local member shares a subnet with, or routes to, any of the peer's addresses.
    Unreachable {
        /// The local members' addresses.
        local: AddrList,
        /// The peer's addresses.
        peer: AddrList,
    },
}

impl fmt::Display for MeshError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unreachable { local, peer } => write!(
                f,
                "no local NIC reaches the peer: this node has {local}, the peer {peer}; no pair \
                 shares a subnet and the routing table reaches none of the peer's addresses \
                 through a local NIC (check the cabling and each NIC's address)"
            ),
        }
    }
}

/// Up to 8 addresses, for messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddrList {
    addrs: [MeshAddr; 8],
    len: usize,
}

impl AddrList {
    fn of(addrs: &[MeshAddr]) -> Self {
        let mut list = Self {
            addrs: [MeshAddr::UNSPECIFIED; 8],
            len: addrs.len().min(8),
        };
        list.addrs[..list.len].copy_from_slice(&addrs[..list.len]);
        list
    }
}

impl fmt::Display for AddrList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.len == 0 {
            return f.write_str("no address");
        }
        for (i, a) in self.addrs[..self.len].iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{a}")?;
        }
        Ok(())
    }
}

/// Choose the pair for a connection from `local` (this node's members, in order) to a listener
/// with addresses `peer`. `route_source(i)` is the source address the host would use towards
/// `peer[i]`, if it has a route (only asked when no subnet is shared).
pub fn choose(
    local: &[MeshAddr],
    peer: &[MeshAddr],
    mut route_source: impl FnMut(usize) -> Option<Ipv4Addr>,
) -> Result<MeshChoice, MeshError> {
    for (l, mine) in local.iter().enumerate() {
        if let Some(p) = peer.iter().position(|theirs| mine.same_subnet(theirs)) {
            return Ok(MeshChoice {
                local: l,
                peer: p,
                reach: Reach::Subnet,
            });
        }
    }
    for p in 0..peer.len() {
        if let Some(source) = route_source(p)
            && let Some(l) = local.iter().position(|mine| mine.ip == source)
        {
            return Ok(MeshChoice {
                local: l,
                peer: p,
                reach: Reach::Routed,
            });
        }
    }
    Err(MeshError::Unreachable {
        local: AddrList::of(local),
        peer: AddrList::of(peer),
    })
}

/// The member a connection that arrived on local address `arrived_on` belongs to.
pub fn arrival_member(local: &[MeshAddr], arrived_on: Ipv4Addr) -> Option<usize> {
    local.iter().position(|a| a.ip == arrived_on)
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    fn a(s: &str) -> MeshAddr {
        let (ip, len) = s.split_once('/').unwrap();
        MeshAddr {
            ip: ip.parse().unwrap(),
            prefix_len: len.parse().unwrap(),
        }
    }

    /// The triangle of the rig: A–B 192.168.101, A–C 192.168.100, B–C 192.168.102.
    fn triangle() -> [[MeshAddr; 2]; 3] {
        [
            [a("192.168.101.1/24"), a("192.168.100.1/24")],
            [a("192.168.101.2/24"), a("192.168.102.2/24")],
            [a("192.168.100.3/24"), a("192.168.102.3/24")],
        ]
    }

    #[test]
    fn every_pair_of_the_triangle_uses_its_own_link_in_both_directions() {
        let t = triangle();
        let no_route = |_| None;
        for (x, from) in t.iter().enumerate() {
            for (y, to) in t.iter().enumerate() {
                if x == y {
                    continue;
                }
                let c = choose(from, to, no_route).unwrap();
                assert_eq!(c.reach, Reach::Subnet);
                assert!(from[c.local].same_subnet(&to[c.peer]), "{x}->{y}: {c:?}");
                // The listener serves it on the member the connector reached.
                assert_eq!(arrival_member(to, to[c.peer].ip), Some(c.peer));
            }
        }
    }

    #[test]
    fn no_shared_subnet_falls_back_to_a_route_through_a_member() {
        let local = [a("10.0.1.1/24"), a("10.0.2.1/24")];
        let peer = [a("10.9.9.9/24")];
        let routed = choose(&local, &peer, |_| Some("10.0.2.1".parse().unwrap())).unwrap();
        assert_eq!(
            routed,
            MeshChoice {
                local: 1,
                peer: 0,
                reach: Reach::Routed
            }
        );
        // A route whose source is not a member (the management interface) does not count.
        let err = choose(&local, &peer, |_| Some("172.16.0.5".parse().unwrap())).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("10.0.1.1/24, 10.0.2.1/24") && text.contains("the peer 10.9.9.9/24"),
            "{text}"
        );
    }

    #[test]
    fn subnets_must_contain_each_other() {
        // A /16 that contains a /24 peer's address, but not the other way round: not one link.
        assert!(!a("10.1.0.1/16").same_subnet(&a("10.1.5.2/24")));
        assert!(a("10.1.5.1/24").same_subnet(&a("10.1.5.2/24")));
        assert!(a("10.1.5.1/32").contains("10.1.5.1".parse().unwrap()));
        assert!(!a("10.1.5.1/32").contains("10.1.5.2".parse().unwrap()));
        assert!(!MeshAddr::UNSPECIFIED.is_valid());
        assert!(!a("224.0.0.1/24").is_valid());
        assert!(!a("10.0.0.1/33").is_valid());
    }
}
