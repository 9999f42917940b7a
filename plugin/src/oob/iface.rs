//! Choosing the local address the out-of-band listen socket binds to, as NCCL chooses its own
//! (`ncclFindInterfaces`, `src/misc/socket.cc`), so Rivet advertises the address NCCL would.
//!
//! Unsafe: `getifaddrs`/`freeifaddrs` walk a C linked list of interface records.
//!
//! The rules ([`choose`], pure, tested over fake interface lists):
//! - candidates are the addresses of interfaces that are up, in `getifaddrs` order (IPv4 before
//!   IPv6 there), less IPv6 loopback (`::1`), less the other family when `NCCL_SOCKET_FAMILY` is
//!   `AF_INET` or `AF_INET6`; an interface is represented by its first candidate address;
//! - `NCCL_SOCKET_IFNAME` (longer than one character, NCCL's own rule) names the interfaces in
//!   NCCL's list syntax (`rivet_verbs_ffi::name_list`: `^` excludes, `=` exact, else prefixes): the first
//!   interface it keeps, or none (an error naming the variable);
//! - otherwise, the first interface of the first of these that finds one: `ib*`; the interface on
//!   the subnet of `NCCL_COMM_ID`'s address, when that is set; anything but `docker*`, `lo*`,
//!   `virbr*`; `docker*`; `lo*`; `virbr*`.
//!
//! IPv6 addresses keep their scope id, so a link-local address can be listened on and reached.

#![allow(unsafe_code)]

use rivet_verbs_ffi::name_list::NameList;
use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// One address of a local interface that is up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct IfAddr {
    /// Interface name, e.g. `eth0`.
    pub(crate) name: String,
    /// Its address, port 0 (IPv6 with the interface's scope id).
    pub(crate) addr: SocketAddr,
    /// Its netmask, when the system reports one (for the `NCCL_COMM_ID` subnet match).
    pub(crate) netmask: Option<IpAddr>,
}

/// `NCCL_SOCKET_FAMILY`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) enum Family {
    /// Unset: both.
    #[default]
    Any,
    /// `AF_INET`.
    V4,
    /// `AF_INET6`.
    V6,
}

impl Family {
    /// Parse NCCL's values; `None` for anything else (NCCL ignores it with a warning).
    pub(crate) fn parse(value: &str) -> Option<Self> {
        match value {
            "AF_INET" => Some(Self::V4),
            "AF_INET6" => Some(Self::V6),
            _ => None,
        }
    }

    fn admits(self, addr: &SocketAddr) -> bool {
        match self {
            Self::Any => true,
            Self::V4 => addr.is_ipv4(),
            Self::V6 => addr.is_ipv6(),
        }
    }
}

/// What the choice depends on besides the interface list.
#[derive(Clone, Debug, Default)]
pub(crate) struct IfRules {
    /// `NCCL_SOCKET_IFNAME`, parsed.
    pub(crate) ifname: Option<NameList>,
    /// `NCCL_SOCKET_FAMILY`.
    pub(crate) family: Family,
    /// The address in `NCCL_COMM_ID`, when it is set and numeric.
    pub(crate) comm_id: Option<IpAddr>,
}

/// NCCL's automatic order after `ib*` and the `NCCL_COMM_ID` subnet (`ncclFindInterfaces`).
const FALLBACK_LISTS: [&str; 4] = ["^docker,lo,virbr", "docker", "lo", "virbr"];

/// Pick the address to listen on from `candidates` (in `getifaddrs` order), by the rules in the
/// module documentation. `None` when no interface qualifies.
pub(crate) fn choose(candidates: &[IfAddr], rules: &IfRules) -> Option<IfAddr> {
    let usable: Vec<&IfAddr> = candidates
        .iter()
        .filter(|c| rules.family.admits(&c.addr))
        .filter(|c| !matches!(c.addr.ip(), IpAddr::V6(ip) if ip.is_loopback()))
        .collect();
    let first_kept = |list: &NameList| usable.iter().find(|c| list.keeps(&c.name, None)).copied();
    if let Some(list) = &rules.ifname {
        return first_kept(list).cloned();
    }
    let builtin = |spec: &str| NameList::parse(spec).ok();
    builtin("ib")
        .and_then(|ib| first_kept(&ib))
        .or_else(|| {
            let target = rules.comm_id?;
            usable
                .iter()
                .find(|c| same_subnet(c.addr.ip(), c.netmask, target))
                .copied()
        })
        .or_else(|| {
            FALLBACK_LISTS
                .iter()
                .filter_map(|spec| builtin(spec))
                .find_map(|list| first_kept(&list))
        })
        .cloned()
}

/// Whether `remote` lies in the subnet of `local`/`netmask` (same family only).
fn same_subnet(local: IpAddr, netmask: Option<IpAddr>, remote: IpAddr) -> bool {
    match (local, netmask, remote) {
        (IpAddr::V4(l), Some(IpAddr::V4(m)), IpAddr::V4(r)) => {
            let m = u32::from(m);
            u32::from(l) & m == u32::from(r) & m
        }
        (IpAddr::V6(l), Some(IpAddr::V6(m)), IpAddr::V6(r)) => {
            let m = u128::from(m);
            u128::from(l) & m == u128::from(r) & m
        }
        _ => false,
    }
}

/// The IP address of an `NCCL_COMM_ID` value (`ip:port` or `[ipv6]:port`); `None` for a host
/// name (Rivet resolves no names) or a malformed value.
pub(crate) fn comm_id_address(value: &str) -> Option<IpAddr> {
    value.parse::<SocketAddr>().ok().map(|a| a.ip())
}

/// Every address of every interface that is up.
pub(crate) fn local_addresses() -> std::io::Result<Vec<IfAddr>> {
    let mut list: *mut libc::ifaddrs = core::ptr::null_mut();
    // SAFETY: `getifaddrs` writes a list head we free below with `freeifaddrs`.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cursor = list;
    while !cursor.is_null() {
        // SAFETY: `cursor` is a node of the list `getifaddrs` returned, not yet freed.
        let entry = unsafe { &*cursor };
        cursor = entry.ifa_next;
        let up = entry.ifa_flags & libc::IFF_UP as u32 != 0;
        if !up || entry.ifa_addr.is_null() || entry.ifa_name.is_null() {
            continue;
        }
        // SAFETY: non-null `ifa_addr` points to a sockaddr whose family tells its real type.
        let family = i32::from(unsafe { (*entry.ifa_addr).sa_family });
        // SAFETY: non-null `ifa_addr` points to a sockaddr of its own family.
        let Some(addr) = (unsafe { socket_address(entry.ifa_addr, family) }) else {
            continue;
        };
        let netmask = if entry.ifa_netmask.is_null() {
            None
        } else {
            // SAFETY: a non-null netmask is a sockaddr of the address's family.
            unsafe { socket_address(entry.ifa_netmask, family) }.map(|m| m.ip())
        };
        // SAFETY: `ifa_name` is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(entry.ifa_name) }
            .to_string_lossy()
            .into_owned();
        out.push(IfAddr {
            name,
            addr,
            netmask,
        });
    }
    // SAFETY: `list` came from `getifaddrs` and is freed exactly once.
    unsafe { libc::freeifaddrs(list) };
    Ok(out)
}

/// The address in `sa` (port 0; an IPv6 address keeps its scope id).
///
/// # Safety
/// `sa` must point to a `sockaddr_in` when `family` is `AF_INET` and to a `sockaddr_in6` when it
/// is `AF_INET6`; other families are not read.
unsafe fn socket_address(sa: *const libc::sockaddr, family: i32) -> Option<SocketAddr> {
    match family {
        libc::AF_INET => {
            // SAFETY: AF_INET addresses are `sockaddr_in` (caller's guarantee).
            let sin = unsafe { &*sa.cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(ip, 0)))
        }
        libc::AF_INET6 => {
            // SAFETY: AF_INET6 addresses are `sockaddr_in6` (caller's guarantee).
            let sin6 = unsafe { &*sa.cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                0,
                0,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An interface address as `getifaddrs` would list it; `ip` may carry `%scope` for IPv6.
    fn addr(name: &str, ip: &str) -> IfAddr {
        let (ip, scope) = ip.split_once('%').unwrap_or((ip, "0"));
        let ip: IpAddr = ip.parse().expect("ip");
        let addr = match ip {
            IpAddr::V4(v4) => SocketAddr::V4(SocketAddrV4::new(v4, 0)),
            IpAddr::V6(v6) => SocketAddr::V6(SocketAddrV6::new(v6, 0, 0, scope.parse().unwrap())),
        };
        let netmask = match ip {
            IpAddr::V4(_) => "255.255.255.0".parse().ok(),
            IpAddr::V6(_) => "ffff:ffff:ffff:ffff::".parse().ok(),
        };
        IfAddr {
            name: name.into(),
            addr,
            netmask,
        }
    }

    fn chosen(list: &[IfAddr], rules: &IfRules) -> Option<String> {
        choose(list, rules).map(|a| format!("{} {}", a.name, a.addr))
    }

    fn ifname(spec: &str) -> IfRules {
        IfRules {
            ifname: Some(NameList::parse(spec).expect("list")),
            ..IfRules::default()
        }
    }

    #[test]
    fn a_bridge_listed_first_is_passed_over() {
        // getifaddrs order: IPv4 of every interface first, then IPv6.
        let list = [
            addr("lo", "127.0.0.1"),
            addr("docker0", "172.17.0.1"),
            addr("virbr0", "192.168.122.1"),
            addr("eth0", "10.0.0.5"),
            addr("lo", "::1"),
        ];
        let rules = IfRules::default();
        assert_eq!(chosen(&list, &rules).as_deref(), Some("eth0 10.0.0.5:0"));
    }

    #[test]
    fn infiniband_interfaces_come_first() {
        let list = [
            addr("eth0", "10.0.0.5"),
            addr("ib0", "10.1.0.5"),
            addr("ib1", "10.2.0.5"),
        ];
        assert_eq!(
            chosen(&list, &IfRules::default()).as_deref(),
            Some("ib0 10.1.0.5:0")
        );
    }

    #[test]
    fn docker_then_loopback_then_virbr_when_nothing_else() {
        let mut list = vec![
            addr("virbr0", "192.168.122.1"),
            addr("lo", "127.0.0.1"),
            addr("docker0", "172.17.0.1"),
        ];
        let rules = IfRules::default();
        assert_eq!(
            chosen(&list, &rules).as_deref(),
            Some("docker0 172.17.0.1:0")
        );
        list.retain(|a| a.name != "docker0");
        assert_eq!(chosen(&list, &rules).as_deref(), Some("lo 127.0.0.1:0"));
        list.retain(|a| a.name != "lo");
        assert_eq!(
            chosen(&list, &rules).as_deref(),
            Some("virbr0 192.168.122.1:0")
        );
        assert_eq!(chosen(&[], &rules), None);
    }

    #[test]
    fn family_is_honoured_and_ipv6_keeps_its_scope() {
        let list = [
            addr("eth0", "10.0.0.5"),
            addr("eth0", "fe80::1%2"),
            addr("lo", "::1"),
        ];
        let v6 = IfRules {
            family: Family::V6,
            ..IfRules::default()
        };
        let a = choose(&list, &v6).expect("an IPv6 address");
        assert_eq!(a.name, "eth0");
        assert_eq!(a.addr.to_string(), "[fe80::1%2]:0", "scope id kept");
        let v4 = IfRules {
            family: Family::V4,
            ..IfRules::default()
        };
        assert_eq!(chosen(&list, &v4).as_deref(), Some("eth0 10.0.0.5:0"));
        // IPv6 loopback is never a candidate, even when nothing else is left.
        assert_eq!(choose(&[addr("lo", "::1")], &v6), None);
        assert_eq!(Family::parse("AF_INET6"), Some(Family::V6));
        assert_eq!(Family::parse("inet"), None);
    }

    #[test]
    fn the_first_address_of_an_interface_represents_it() {
        // An interface with only IPv6 sorts after every IPv4 address in getifaddrs order.
        let list = [addr("eth1", "10.0.1.5"), addr("eth0", "2001:db8::5")];
        assert_eq!(
            chosen(&list, &IfRules::default()).as_deref(),
            Some("eth1 10.0.1.5:0")
        );
        assert_eq!(
            chosen(&list, &ifname("eth0")).as_deref(),
            Some("eth0 [2001:db8::5]:0")
        );
    }

    #[test]
    fn socket_ifname_prefix_exact_and_exclude() {
        let list = [
            addr("eth1", "10.0.0.2"),
            addr("eth10", "10.0.0.3"),
            addr("lo", "127.0.0.1"),
        ];
        assert_eq!(
            chosen(&list, &ifname("eth1")).as_deref(),
            Some("eth1 10.0.0.2:0")
        );
        assert_eq!(
            chosen(&list, &ifname("=eth10")).as_deref(),
            Some("eth10 10.0.0.3:0")
        );
        assert_eq!(
            chosen(&list, &ifname("^eth")).as_deref(),
            Some("lo 127.0.0.1:0")
        );
        assert_eq!(
            chosen(&list, &ifname("^=eth1")).as_deref(),
            Some("eth10 10.0.0.3:0")
        );
        assert_eq!(chosen(&list, &ifname("ib")), None, "named but absent: none");
    }

    #[test]
    fn comm_id_subnet_picks_the_interface_before_the_fallbacks() {
        let list = [addr("eth0", "10.0.0.5"), addr("eth1", "192.168.7.5")];
        let rules = IfRules {
            comm_id: comm_id_address("192.168.7.200:12345"),
            ..IfRules::default()
        };
        assert_eq!(chosen(&list, &rules).as_deref(), Some("eth1 192.168.7.5:0"));
        let elsewhere = IfRules {
            comm_id: comm_id_address("172.16.0.1:12345"),
            ..IfRules::default()
        };
        assert_eq!(
            chosen(&list, &elsewhere).as_deref(),
            Some("eth0 10.0.0.5:0")
        );
        assert_eq!(comm_id_address("[fe80::1]:80"), "fe80::1".parse().ok());
        assert_eq!(comm_id_address("host:80"), None);
    }

    #[test]
    fn this_machine_has_some_address() {
        let list = local_addresses().expect("getifaddrs");
        assert!(
            choose(&list, &IfRules::default()).is_some(),
            "no usable address among {list:?}"
        );
    }
}
