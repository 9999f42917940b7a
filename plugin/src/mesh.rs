//! The mesh device (`RIVET_MESH=1`): every local port behind one NCCL device, the port chosen per
//! connection by the peer's addresses (`rivet_core::mesh` decides; this module gathers the
//! addresses and asks the kernel for routes).
//!
//! Why one device: on a direct-connect mesh each NIC reaches one peer only, and NCCL assigns
//! channels to NICs without knowing that; with a single device NCCL can never pick a NIC that
//! cannot reach the peer. Off by default: a rail-optimised fabric (one subnet per rail) looks the
//! same from inside one node, and there the NICs must stay separate devices.
//!
//! Unsafe (opted in): the device's properties hold C-string pointers NCCL reads, so it is marked
//! `Send`/`Sync` by hand, as `devices::Port` is.

#![allow(unsafe_code)]

use crate::devices::{DeviceProps, Port, PropString};
use crate::oob::iface::IfAddr;
use core::ffi::c_int;
use rivet_core::mesh::MeshAddr;
use rivet_core::wire::MAX_MESH_ADDRS;
use rivet_verbs_ffi::discover::gid::is_ipv4_mapped;
use std::ffi::CString;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};

/// One port of the mesh device.
#[derive(Debug, Clone)]
pub(crate) struct Member {
    /// Index of the port in the discovered list.
    pub(crate) port: usize,
    /// The port's RoCE v2 address and its subnet.
    pub(crate) addr: MeshAddr,
    /// The port's name, for messages (`rxe1:1`).
    pub(crate) name: String,
}

/// The mesh device NCCL sees as device 0.
#[derive(Debug)]
pub(crate) struct MeshDevice {
    /// The ports, in discovery order.
    pub(crate) members: Vec<Member>,
    /// What `getProperties(0)` reports (its name points into `_name`).
    pub(crate) props: DeviceProps,
    _name: PropString,
}

// SAFETY: `props` points only into the string this value owns (held by raw pointer, never written,
// freed on drop) and into the ports' strings, which live as long as the process state.
unsafe impl Send for MeshDevice {}
// SAFETY: as above; nothing is mutable.
unsafe impl Sync for MeshDevice {}

/// The IPv4 address of a RoCE v2 IPv4-mapped GID (`::ffff:a.b.c.d`).
fn ipv4_of_gid(gid: &[u8; 16]) -> Option<Ipv4Addr> {
    is_ipv4_mapped(gid).then(|| Ipv4Addr::new(gid[12], gid[13], gid[14], gid[15]))
}

fn prefix_len(netmask: Option<IpAddr>) -> Option<u8> {
    match netmask? {
        IpAddr::V4(m) => {
            let bits = u32::from(m);
            // A contiguous mask only.
            (bits.leading_ones() + bits.trailing_zeros() == 32).then(|| bits.leading_ones() as u8)
        }
        IpAddr::V6(_) => None,
    }
}

/// Build the mesh device over `ports`, with subnets from the interface list `ifaddrs`. Ports
/// without an IPv4 RoCE v2 address on an interface that is up are left out (the returned notes
/// say why); `Err` when none is left.
pub(crate) fn build(
    ports: &[Port],
    ifaddrs: &[IfAddr],
) -> Result<(MeshDevice, Vec<String>), String> {
    let mut members = Vec::new();
    let mut notes = Vec::new();
    for (index, port) in ports.iter().enumerate() {
        let name = format!("{}:{}", port.info.name, port.info.port);
        let Some(ip) = ipv4_of_gid(&port.info.gid) else {
            notes.push(format!(
                "{name} left out of the mesh device: its GID {} is not an IPv4 RoCE v2 address",
                port.info.gid_string
            ));
            continue;
        };
        let Some(prefix) = ifaddrs
            .iter()
            .find(|a| a.addr.ip() == IpAddr::V4(ip))
            .and_then(|a| prefix_len(a.netmask))
        else {
            notes.push(format!(
                "{name} left out of the mesh device: no interface that is up holds {ip} with a netmask"
            ));
            continue;
        };
        if members.len() == MAX_MESH_ADDRS {
            notes.push(format!(
                "{name} left out of the mesh device: it takes at most {MAX_MESH_ADDRS} ports"
            ));
            continue;
        }
        members.push(Member {
            port: index,
            addr: MeshAddr {
                ip,
                prefix_len: prefix,
            },
            name,
        });
    }
    let first = members.first().ok_or_else(|| {
        format!(
            "RIVET_MESH=1: no port has an IPv4 RoCE v2 address on an interface that is up ({})",
            notes.join("; ")
        )
    })?;
    let base = ports[first.port].props;
    let joined = members
        .iter()
        .map(|m| ports[m.port].info.name.as_str())
        .collect::<Vec<_>>()
        .join("+");
    let name = PropString::new(
        CString::new(format!("mesh({joined})").replace('\0', "")).unwrap_or_default(),
    );
    let member_props = || members.iter().map(|m| ports[m.port].props);
    let mut props = DeviceProps {
        name: name.as_ptr(),
        // One link at a time serves a pair: a member's speed, not the sum.
        speed_mbps: member_props()
            .map(|p| p.speed_mbps)
            .max()
            .unwrap_or(base.speed_mbps),
        ptr_support: member_props().fold(base.ptr_support, |acc, p| acc & p.ptr_support),
        max_comms: member_props()
            .map(|p| p.max_comms)
            .min()
            .unwrap_or(base.max_comms),
        // Comms of one NCCL device sit on different ports (protection domains): a registration
        // serves only comms of its own port, so NCCL must register per comm.
        reg_is_global: 0,
        ..base
    };
    props.members = [0; 8];
    props.member_count = 1;
    Ok((
        MeshDevice {
            members,
            props,
            _name: name,
        },
        notes,
    ))
}

impl MeshDevice {
    /// The members' addresses, in order.
    pub(crate) fn addrs(&self) -> Vec<MeshAddr> {
        self.members.iter().map(|m| m.addr).collect()
    }

    /// The device's number of members as NCCL's `c_int`.
    pub(crate) fn len(&self) -> c_int {
        c_int::try_from(self.members.len()).unwrap_or(c_int::MAX)
    }
}

/// The source address the kernel would use towards `ip` (no packet is sent: a UDP socket's
/// `connect` only looks up the route), or `None` when it has no route.
pub(crate) fn route_source(ip: Ipv4Addr) -> Option<Ipv4Addr> {
    let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).ok()?;
    socket.connect(SocketAddr::from((ip, 9))).ok()?;
    match socket.local_addr().ok()?.ip() {
        IpAddr::V4(source) if !source.is_unspecified() => Some(source),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gid_and_netmask_give_the_mesh_address() {
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&[192, 168, 101, 1]);
        assert_eq!(ipv4_of_gid(&gid), Some(Ipv4Addr::new(192, 168, 101, 1)));
        gid[0] = 0xfe;
        assert_eq!(
            ipv4_of_gid(&gid),
            None,
            "a link-local GID is not an IPv4 address"
        );
        let mask = |s: &str| Some(IpAddr::V4(s.parse().unwrap()));
        assert_eq!(prefix_len(mask("255.255.255.0")), Some(24));
        assert_eq!(prefix_len(mask("255.255.255.255")), Some(32));
        assert_eq!(prefix_len(mask("255.0.255.0")), None);
        assert_eq!(prefix_len(None), None);
    }

    #[test]
    fn the_route_to_loopback_leaves_from_loopback() {
        assert_eq!(route_source(Ipv4Addr::LOCALHOST), Some(Ipv4Addr::LOCALHOST));
    }
}
