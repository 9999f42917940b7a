//! Choosing the local GID for a port (pure, no IO).
//!
//! InfiniBand ports use index 0. RoCE ports, unless an index is forced, take the first table entry
//! that is valid (not all-zero, not link-local `fe80::/64`), has the wanted RoCE version (default 2)
//! and the wanted address family (default IPv4, i.e. an IPv4-mapped `::ffff:a.b.c.d` GID), like
//! NCCL's `ncclIbGetGidIndex`.

use std::fmt;
use std::net::Ipv6Addr;

/// Address family of a RoCE GID (`NCCL_IB_ADDR_FAMILY`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AddrFamily {
    /// IPv4-mapped GIDs (`AF_INET`, the default).
    #[default]
    Ipv4,
    /// Other (true IPv6) GIDs (`AF_INET6`).
    Ipv6,
}

impl AddrFamily {
    /// Parses `AF_INET` / `AF_INET6` (NCCL's spelling; `inet`, `ipv4`, `4` and the 6 forms too).
    pub fn parse(text: &str) -> Option<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "af_inet" | "inet" | "ipv4" | "4" => Some(Self::Ipv4),
            "af_inet6" | "inet6" | "ipv6" | "6" => Some(Self::Ipv6),
            _ => None,
        }
    }

    /// The family of a GID.
    pub fn of(gid: &[u8; 16]) -> Self {
        if is_ipv4_mapped(gid) {
            Self::Ipv4
        } else {
            Self::Ipv6
        }
    }
}

impl fmt::Display for AddrFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Ipv4 => "IPv4",
            Self::Ipv6 => "IPv6",
        })
    }
}

/// How to choose the GID on a RoCE port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidPolicy {
    /// A forced index (`NCCL_IB_GID_INDEX`); `None` = automatic.
    pub index: Option<u32>,
    /// Wanted RoCE version (`NCCL_IB_ROCE_VERSION_NUM`), 1 or 2.
    pub roce_version: u8,
    /// Wanted address family (`NCCL_IB_ADDR_FAMILY`).
    pub family: AddrFamily,
}

impl Default for GidPolicy {
    fn default() -> Self {
        Self {
            index: None,
            roce_version: 2,
            family: AddrFamily::Ipv4,
        }
    }
}

/// One GID table entry as read from the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidCandidate {
    /// Table index.
    pub index: u32,
    /// The GID bytes.
    pub gid: [u8; 16],
    /// RoCE version (1 or 2), `None` when unknown.
    pub roce_version: Option<u8>,
}

/// The chosen GID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidChoice {
    /// Table index (the `sgid_index` for QPs).
    pub index: u32,
    /// The GID bytes.
    pub gid: [u8; 16],
    /// RoCE version, when known.
    pub roce_version: Option<u8>,
    /// A short reason for the choice.
    pub why: String,
}

/// No GID fits the policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GidError {
    /// The forced index is not in the table or its entry is empty.
    ForcedIndexUnusable {
        /// The index.
        index: u32,
        /// Why.
        reason: String,
    },
    /// No entry matched; one reason per entry looked at.
    NoMatch {
        /// The policy that was applied.
        wanted: String,
        /// `index: reason` for each entry.
        rejected: Vec<String>,
    },
}

impl fmt::Display for GidError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ForcedIndexUnusable { index, reason } => {
                write!(f, "GID index {index} cannot be used: {reason}")
            }
            Self::NoMatch { wanted, rejected } => {
                write!(f, "no {wanted} GID")?;
                if rejected.is_empty() {
                    f.write_str(" (the GID table is empty)")
                } else {
                    write!(f, " (rejected: {})", rejected.join("; "))
                }
            }
        }
    }
}

impl std::error::Error for GidError {}

/// All-zero GID (an empty table entry).
pub fn is_zero(gid: &[u8; 16]) -> bool {
    gid.iter().all(|b| *b == 0)
}

/// Link-local `fe80::/64` (the RoCE GID derived from the MAC; not routable).
pub fn is_link_local(gid: &[u8; 16]) -> bool {
    gid[..8] == [0xfe, 0x80, 0, 0, 0, 0, 0, 0]
}

/// IPv4-mapped `::ffff:a.b.c.d`.
pub fn is_ipv4_mapped(gid: &[u8; 16]) -> bool {
    gid[..10].iter().all(|b| *b == 0) && gid[10] == 0xff && gid[11] == 0xff
}

/// Human form: `::ffff:10.0.0.1` for IPv4-mapped GIDs, RFC 5952 IPv6 text otherwise.
pub fn gid_to_string(gid: &[u8; 16]) -> String {
    if is_ipv4_mapped(gid) {
        format!("::ffff:{}.{}.{}.{}", gid[12], gid[13], gid[14], gid[15])
    } else {
        Ipv6Addr::from(*gid).to_string()
    }
}

/// Parses a sysfs `gid_attrs/types/<idx>` file: `"RoCE v2"` → 2, `"IB/RoCE v1"` or `"RoCE v1"` → 1.
pub fn parse_gid_type(text: &str) -> Option<u8> {
    match text.trim() {
        "RoCE v2" => Some(2),
        "IB/RoCE v1" | "RoCE v1" => Some(1),
        _ => None,
    }
}

/// The GID index NCCL's IB transport gives a routed InfiniBand fabric (its
/// `NCCL_IB_ROUTABLE_FLID_GID_INDEX` default): the entry that carries the port's FLID.
pub const IB_ROUTABLE_GID_INDEX: u32 = 1;

/// Whether an InfiniBand GID is a routable one: it carries a FLID (bytes 4..6, the field
/// `rivet_core::route::flid` reads on the peer's side to address the port across subnets).
pub fn has_flid(gid: &[u8; 16]) -> bool {
    gid[4..6] != [0, 0]
}

/// Picks the GID index of an InfiniBand port as NCCL does: [`IB_ROUTABLE_GID_INDEX`] when that
/// entry (`routable`, `None` if the table is shorter) carries a FLID, so peers in other subnets
/// can address this port through routers; otherwise index 0.
pub fn choose_ib_gid_index(routable: Option<&[u8; 16]>) -> (u32, &'static str) {
    match routable {
        Some(gid) if has_flid(gid) => (
            IB_ROUTABLE_GID_INDEX,
            "InfiniBand: GID index 1 carries a routable FLID",
        ),
        _ => (0, "InfiniBand: GID index 0"),
    }
}

/// Picks the GID for a RoCE port from its table.
pub fn choose_roce_gid(table: &[GidCandidate], policy: &GidPolicy) -> Result<GidChoice, GidError> {
    if let Some(index) = policy.index {
        let entry = table.iter().find(|c| c.index == index).ok_or_else(|| {
            GidError::ForcedIndexUnusable {
                index,
                reason: format!("the table has {} entries", table.len()),
            }
        })?;
        if is_zero(&entry.gid) {
            return Err(GidError::ForcedIndexUnusable {
                index,
                reason: "the entry is empty".into(),
            });
        }
        return Ok(GidChoice {
            index,
            gid: entry.gid,
            roce_version: entry.roce_version,
            why: format!("GID index {index} was requested"),
        });
    }
    let mut rejected = Vec::new();
    for c in table {
        let reason = if is_zero(&c.gid) {
            None // empty slots are not worth reporting
        } else if is_link_local(&c.gid) {
            Some("link-local".to_owned())
        } else if AddrFamily::of(&c.gid) != policy.family {
            Some(format!("{}", AddrFamily::of(&c.gid)))
        } else if c.roce_version != Some(policy.roce_version) {
            Some(match c.roce_version {
                Some(v) => format!("RoCE v{v}"),
                None => "unknown RoCE version".to_owned(),
            })
        } else {
            let mut why = format!("first RoCE v{} {} GID", policy.roce_version, policy.family);
            if !rejected.is_empty() {
                why.push_str(&format!(" (skipped {})", rejected.join(", ")));
            }
            return Ok(GidChoice {
                index: c.index,
                gid: c.gid,
                roce_version: c.roce_version,
                why,
            });
        };
        if let Some(reason) = reason {
            rejected.push(format!("{}: {reason}", c.index));
        }
    }
    Err(GidError::NoMatch {
        wanted: format!("RoCE v{} {}", policy.roce_version, policy.family),
        rejected,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn infiniband_prefers_the_gid_with_a_flid() {
        let mut routable = [0u8; 16];
        routable[0] = 0xfe;
        routable[1] = 0x80;
        routable[7] = 0x02; // subnet id alone is not a FLID
        assert_eq!(choose_ib_gid_index(Some(&routable)).0, 0);
        routable[4..6].copy_from_slice(&0x0c01u16.to_be_bytes());
        assert_eq!(
            choose_ib_gid_index(Some(&routable)).0,
            IB_ROUTABLE_GID_INDEX
        );
        assert_eq!(choose_ib_gid_index(None).0, 0);
    }

    fn v4(a: u8, b: u8, c: u8, d: u8) -> [u8; 16] {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&[a, b, c, d]);
        g
    }

    fn link_local() -> [u8; 16] {
        let mut g = [0u8; 16];
        g[0] = 0xfe;
        g[1] = 0x80;
        g[8..].copy_from_slice(&[0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55]);
        g
    }

    fn global_v6() -> [u8; 16] {
        "fd00::1".parse::<Ipv6Addr>().unwrap().octets()
    }

    fn cand(index: u32, gid: [u8; 16], v: Option<u8>) -> GidCandidate {
        GidCandidate {
            index,
            gid,
            roce_version: v,
        }
    }

    /// A typical RoCE table: the MAC-derived link-local pair, then the IPv4 pair, then IPv6.
    fn table() -> Vec<GidCandidate> {
        vec![
            cand(0, link_local(), Some(1)),
            cand(1, link_local(), Some(2)),
            cand(2, v4(10, 0, 0, 1), Some(1)),
            cand(3, v4(10, 0, 0, 1), Some(2)),
            cand(4, global_v6(), Some(1)),
            cand(5, global_v6(), Some(2)),
            cand(6, [0; 16], None),
        ]
    }

    #[test]
    fn default_policy_picks_roce_v2_ipv4() {
        let c = choose_roce_gid(&table(), &GidPolicy::default()).unwrap();
        assert_eq!(c.index, 3);
        assert_eq!(gid_to_string(&c.gid), "::ffff:10.0.0.1");
        assert_eq!(c.roce_version, Some(2));
        assert!(
            c.why.contains("RoCE v2 IPv4")
                && c.why.contains("0: link-local")
                && c.why.contains("2: RoCE v1")
        );
    }

    #[test]
    fn family_and_version_are_configurable() {
        let v6 = GidPolicy {
            family: AddrFamily::Ipv6,
            ..GidPolicy::default()
        };
        assert_eq!(choose_roce_gid(&table(), &v6).unwrap().index, 5);
        let v1 = GidPolicy {
            roce_version: 1,
            ..GidPolicy::default()
        };
        assert_eq!(choose_roce_gid(&table(), &v1).unwrap().index, 2);
    }

    #[test]
    fn never_picks_zero_or_link_local() {
        let t = vec![cand(0, [0; 16], Some(2)), cand(1, link_local(), Some(2))];
        let v6 = GidPolicy {
            family: AddrFamily::Ipv6,
            ..GidPolicy::default()
        };
        let err = choose_roce_gid(&t, &v6).unwrap_err();
        assert_eq!(
            err,
            GidError::NoMatch {
                wanted: "RoCE v2 IPv6".into(),
                rejected: vec!["1: link-local".into()]
            }
        );
        assert!(err.to_string().contains("1: link-local"));
        assert!(
            choose_roce_gid(&[], &GidPolicy::default())
                .unwrap_err()
                .to_string()
                .contains("empty")
        );
    }

    #[test]
    fn unknown_version_is_not_taken_for_v2() {
        let t = vec![cand(0, v4(192, 168, 1, 2), None)];
        assert!(choose_roce_gid(&t, &GidPolicy::default()).is_err());
    }

    #[test]
    fn forced_index_is_used_as_is_if_present() {
        let p = GidPolicy {
            index: Some(0),
            ..GidPolicy::default()
        };
        let c = choose_roce_gid(&table(), &p).unwrap();
        assert_eq!(c.index, 0);
        assert!(c.why.contains("requested"));
        let p = GidPolicy {
            index: Some(6),
            ..GidPolicy::default()
        };
        assert!(matches!(
            choose_roce_gid(&table(), &p),
            Err(GidError::ForcedIndexUnusable { index: 6, .. })
        ));
        let p = GidPolicy {
            index: Some(60),
            ..GidPolicy::default()
        };
        assert!(matches!(
            choose_roce_gid(&table(), &p),
            Err(GidError::ForcedIndexUnusable { index: 60, .. })
        ));
    }

    #[test]
    fn classifies_and_formats_gids() {
        assert!(is_ipv4_mapped(&v4(1, 2, 3, 4)));
        assert!(!is_ipv4_mapped(&global_v6()));
        assert!(is_link_local(&link_local()));
        assert!(!is_link_local(&v4(1, 2, 3, 4)));
        assert!(is_zero(&[0; 16]));
        assert_eq!(gid_to_string(&global_v6()), "fd00::1");
        assert_eq!(gid_to_string(&link_local()), "fe80::211:22ff:fe33:4455");
        assert_eq!(AddrFamily::parse("AF_INET6"), Some(AddrFamily::Ipv6));
        assert_eq!(AddrFamily::parse("AF_INET"), Some(AddrFamily::Ipv4));
        assert_eq!(AddrFamily::parse("AF_UNIX"), None);
    }

    #[test]
    fn parses_sysfs_gid_types() {
        assert_eq!(parse_gid_type("RoCE v2\n"), Some(2));
        assert_eq!(parse_gid_type("IB/RoCE v1\n"), Some(1));
        assert_eq!(parse_gid_type("RoCE v1"), Some(1));
        assert_eq!(parse_gid_type(""), None);
        assert_eq!(parse_gid_type("InfiniBand"), None);
    }
}
