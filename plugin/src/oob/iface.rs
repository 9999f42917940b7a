//! Choosing the local IP address the out-of-band listen socket binds to.
//!
//! Unsafe: `getifaddrs`/`freeifaddrs` walk a C linked list of interface records.
//!
//! Follows NCCL's `NCCL_SOCKET_IFNAME` syntax: a comma-separated list of interface-name prefixes;
//! a leading `^` excludes the listed interfaces instead; a leading `=` (after any `^`) makes the
//! names exact instead of prefixes. Without it, the first interface that is up, not loopback and
//! has an address is used (IPv4 before IPv6), and loopback only when nothing else exists.

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// One usable local address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct IfAddr {
    /// Interface name, e.g. `eth0`.
    pub(crate) name: String,
    /// Its address.
    pub(crate) addr: IpAddr,
    /// Whether it is a loopback interface.
    pub(crate) loopback: bool,
}

/// A parsed `NCCL_SOCKET_IFNAME` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct IfFilter {
    exclude: bool,
    exact: bool,
    names: Vec<String>,
}

impl IfFilter {
    /// Parse the variable's value.
    pub(crate) fn parse(spec: &str) -> Self {
        let mut rest = spec.trim();
        let exclude = rest.starts_with('^');
        if exclude {
            rest = &rest[1..];
        }
        let exact = rest.starts_with('=');
        if exact {
            rest = &rest[1..];
        }
        let names = rest
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        Self {
            exclude,
            exact,
            names,
        }
    }

    /// Whether interface `name` passes the filter.
    pub(crate) fn matches(&self, name: &str) -> bool {
        let listed = self.names.iter().any(|n| {
            if self.exact {
                name == n
            } else {
                name.starts_with(n.as_str())
            }
        });
        listed != self.exclude
    }
}

/// Pick the address to listen on from `candidates`, honouring `filter`.
pub(crate) fn choose(candidates: &[IfAddr], filter: Option<&IfFilter>) -> Option<IfAddr> {
    let allowed: Vec<&IfAddr> = candidates
        .iter()
        .filter(|c| filter.is_none_or(|f| f.matches(&c.name)))
        .collect();
    if filter.is_some() {
        // The user named the interfaces: take the first listed one, loopback included.
        return allowed
            .iter()
            .find(|c| c.addr.is_ipv4())
            .or_else(|| allowed.first())
            .map(|c| (*c).clone());
    }
    let preferred = |v4: bool| {
        allowed
            .iter()
            .find(|c| !c.loopback && c.addr.is_ipv4() == v4 && !is_link_local(&c.addr))
    };
    preferred(true)
        .or_else(|| preferred(false))
        .or_else(|| allowed.iter().find(|c| c.loopback && c.addr.is_ipv4()))
        .map(|c| (*c).clone())
}

fn is_link_local(addr: &IpAddr) -> bool {
    match addr {
        IpAddr::V4(a) => a.is_link_local(),
        IpAddr::V6(a) => (a.segments()[0] & 0xffc0) == 0xfe80,
    }
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
        let addr = match family {
            libc::AF_INET => {
                // SAFETY: AF_INET addresses are `sockaddr_in`.
                let sin = unsafe { &*entry.ifa_addr.cast::<libc::sockaddr_in>() };
                IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
            }
            libc::AF_INET6 => {
                // SAFETY: AF_INET6 addresses are `sockaddr_in6`.
                let sin6 = unsafe { &*entry.ifa_addr.cast::<libc::sockaddr_in6>() };
                IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
            }
            _ => continue,
        };
        // SAFETY: `ifa_name` is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(entry.ifa_name) }
            .to_string_lossy()
            .into_owned();
        let loopback = entry.ifa_flags & libc::IFF_LOOPBACK as u32 != 0;
        out.push(IfAddr {
            name,
            addr,
            loopback,
        });
    }
    // SAFETY: `list` came from `getifaddrs` and is freed exactly once.
    unsafe { libc::freeifaddrs(list) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(name: &str, ip: &str, loopback: bool) -> IfAddr {
        IfAddr {
            name: name.into(),
            addr: ip.parse().expect("ip"),
            loopback,
        }
    }

    #[test]
    fn default_prefers_ipv4_non_loopback() {
        let list = [
            addr("lo", "127.0.0.1", true),
            addr("eth0", "fe80::1", false),
            addr("eth0", "10.0.2.15", false),
        ];
        assert_eq!(choose(&list, None).map(|a| a.name), Some("eth0".into()));
        assert_eq!(
            choose(&list, None).map(|a| a.addr.to_string()),
            Some("10.0.2.15".into())
        );
    }

    #[test]
    fn default_falls_back_to_loopback() {
        let list = [addr("lo", "127.0.0.1", true)];
        assert_eq!(
            choose(&list, None).map(|a| a.addr.to_string()),
            Some("127.0.0.1".into())
        );
    }

    #[test]
    fn prefix_exact_and_exclude() {
        let list = [
            addr("eth1", "10.0.0.2", false),
            addr("eth10", "10.0.0.3", false),
            addr("lo", "127.0.0.1", true),
        ];
        let prefix = IfFilter::parse("eth1");
        assert!(prefix.matches("eth1") && prefix.matches("eth10"));
        let exact = IfFilter::parse("=eth1");
        assert!(exact.matches("eth1") && !exact.matches("eth10"));
        let exclude = IfFilter::parse("^eth");
        assert_eq!(
            choose(&list, Some(&exclude)).map(|a| a.name),
            Some("lo".into())
        );
        let exclude_exact = IfFilter::parse("^=eth1");
        assert_eq!(
            choose(&list, Some(&exclude_exact)).map(|a| a.name),
            Some("eth10".into())
        );
        assert!(choose(&list, Some(&IfFilter::parse("ib"))).is_none());
    }

    #[test]
    fn this_machine_has_some_address() {
        let list = local_addresses().expect("getifaddrs");
        assert!(
            choose(&list, None).is_some(),
            "no usable address among {list:?}"
        );
    }
}
