//! NCCL's name lists: the one parser and matcher for `NCCL_IB_HCA` (RDMA ports) and
//! `NCCL_SOCKET_IFNAME` (network interfaces), and for the lists NCCL itself uses when it picks an
//! interface (`ib`, `^docker,lo,virbr`, …).
//!
//! Syntax (NCCL `parseStringList`/`matchIfList`, `src/misc/utils.cc`): an optional leading `^`
//! excludes the listed names instead of selecting them; a following `=` makes names match exactly
//! instead of as prefixes (`^=` combines both). Entries are comma-separated
//! `name[:port[:rail[:plane]]]`; an empty, negative or absent port matches every port, and a name
//! matched without a port (an interface) matches every entry's port. Without `=`, `mlx5_1` also
//! matches `mlx5_10` … `mlx5_19`, and `eth1` matches `eth10`.

use std::fmt;

/// Most entries NCCL accepts in one list.
pub const MAX_ENTRIES: usize = 32;

/// One `name[:port[:rail[:plane]]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameEntry {
    /// Device or interface name, or a prefix of it.
    pub name: String,
    /// Port number; `None` matches every port.
    pub port: Option<u32>,
    /// Rail id (carried through for the plugin's properties; not used in matching).
    pub rail: Option<i32>,
    /// Plane id (carried through; not used in matching).
    pub plane: Option<i32>,
}

/// A parsed NCCL name list (`NCCL_IB_HCA`, `NCCL_SOCKET_IFNAME`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NameList {
    /// `^`: the entries name ports to leave out.
    pub exclude: bool,
    /// `=`: names match exactly rather than by prefix.
    pub exact: bool,
    /// The entries; empty means "every port".
    pub entries: Vec<NameEntry>,
}

/// Why a name list could not be parsed. The message does not name the variable: the caller does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameListError {
    /// More than [`MAX_ENTRIES`] entries.
    TooManyEntries {
        /// How many were given.
        count: usize,
    },
    /// An entry has no name (e.g. `:1`).
    EmptyName {
        /// The entry as written.
        entry: String,
    },
    /// A port, rail or plane field is not a number.
    BadNumber {
        /// The entry as written.
        entry: String,
        /// Which field.
        field: &'static str,
    },
    /// An entry has more than four `:`-separated fields.
    TooManyFields {
        /// The entry as written.
        entry: String,
    },
}

impl fmt::Display for NameListError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooManyEntries { count } => {
                write!(
                    f,
                    "the list has {count} entries; at most {MAX_ENTRIES} are allowed"
                )
            }
            Self::EmptyName { entry } => {
                write!(f, "entry {entry:?} has no name")
            }
            Self::BadNumber { entry, field } => {
                write!(f, "entry {entry:?}: {field} is not a number")
            }
            Self::TooManyFields { entry } => {
                write!(f, "entry {entry:?}: expected name[:port[:rail[:plane]]]")
            }
        }
    }
}

impl std::error::Error for NameListError {}

impl NameList {
    /// A filter that keeps every port.
    pub fn all() -> Self {
        Self::default()
    }

    /// Parses a list. Whitespace around entries is ignored; empty entries are skipped.
    pub fn parse(spec: &str) -> Result<Self, NameListError> {
        let mut rest = spec.trim();
        let exclude = rest.starts_with('^');
        if exclude {
            rest = &rest[1..];
        }
        let exact = rest.starts_with('=');
        if exact {
            rest = &rest[1..];
        }
        let entries = rest
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(parse_entry)
            .collect::<Result<Vec<_>, _>>()?;
        if entries.len() > MAX_ENTRIES {
            return Err(NameListError::TooManyEntries {
                count: entries.len(),
            });
        }
        Ok(Self {
            exclude,
            exact,
            entries,
        })
    }

    /// Whether `name` (with `port` for an RDMA port, `None` for a network interface) passes the
    /// list. An empty list keeps everything.
    pub fn keeps(&self, name: &str, port: Option<u32>) -> bool {
        if self.entries.is_empty() {
            return true;
        }
        let listed = self
            .entries
            .iter()
            .any(|e| self.entry_matches(e, name, port));
        listed != self.exclude
    }

    /// The entry that selects this port (for rail/plane), if the filter is a selection list.
    pub fn entry_for(&self, device: &str, port: u32) -> Option<&NameEntry> {
        if self.exclude {
            return None;
        }
        self.entries
            .iter()
            .find(|e| self.entry_matches(e, device, Some(port)))
    }

    fn entry_matches(&self, entry: &NameEntry, name: &str, port: Option<u32>) -> bool {
        if let (Some(want), Some(port)) = (entry.port, port) {
            if want != port {
                return false;
            }
        }
        if self.exact {
            name == entry.name
        } else {
            name.starts_with(entry.name.as_str())
        }
    }
}

impl fmt::Display for NameList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.exclude {
            f.write_str("^")?;
        }
        if self.exact {
            f.write_str("=")?;
        }
        for (i, e) in self.entries.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(&e.name)?;
            if let Some(p) = e.port {
                write!(f, ":{p}")?;
            }
        }
        Ok(())
    }
}

fn parse_entry(entry: &str) -> Result<NameEntry, NameListError> {
    let mut fields = entry.split(':');
    let name = fields.next().unwrap_or("").trim();
    if name.is_empty() {
        return Err(NameListError::EmptyName {
            entry: entry.to_owned(),
        });
    }
    let mut number = |field: &'static str| -> Result<Option<i64>, NameListError> {
        match fields.next().map(str::trim) {
            None | Some("") => Ok(None),
            Some(text) => text
                .parse::<i64>()
                .map(Some)
                .map_err(|_| NameListError::BadNumber {
                    entry: entry.to_owned(),
                    field,
                }),
        }
    };
    let port = number("port")?;
    let rail = number("rail")?;
    let plane = number("plane")?;
    if fields.next().is_some() {
        return Err(NameListError::TooManyFields {
            entry: entry.to_owned(),
        });
    }
    let bad = |field| NameListError::BadNumber {
        entry: entry.to_owned(),
        field,
    };
    Ok(NameEntry {
        name: name.to_owned(),
        // NCCL treats a negative port as "any port".
        port: match port {
            Some(p) if p >= 0 => Some(u32::try_from(p).map_err(|_| bad("port"))?),
            _ => None,
        },
        rail: rail
            .map(|r| i32::try_from(r).map_err(|_| bad("rail")))
            .transpose()?,
        plane: plane
            .map(|p| i32::try_from(p).map_err(|_| bad("plane")))
            .transpose()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keeps(spec: &str, device: &str, port: u32) -> bool {
        NameList::parse(spec).unwrap().keeps(device, Some(port))
    }

    #[test]
    fn empty_spec_keeps_everything() {
        assert_eq!(NameList::parse("").unwrap(), NameList::all());
        assert!(keeps("", "mlx5_0", 1));
        assert!(keeps("  ", "rxe0", 2));
    }

    #[test]
    fn prefix_match_includes_longer_names() {
        assert!(keeps("mlx5_1", "mlx5_1", 1));
        assert!(keeps("mlx5_1", "mlx5_10", 1));
        assert!(keeps("mlx5_1", "mlx5_19", 2));
        assert!(!keeps("mlx5_1", "mlx5_2", 1));
        assert!(!keeps("mlx5_10", "mlx5_1", 1));
        assert!(keeps("mlx5", "mlx5_7", 1));
    }

    #[test]
    fn exact_match_excludes_longer_names() {
        assert!(keeps("=mlx5_1", "mlx5_1", 1));
        assert!(!keeps("=mlx5_1", "mlx5_10", 1));
        assert!(!keeps("=mlx5", "mlx5_0", 1));
    }

    #[test]
    fn exclusion_inverts_the_match() {
        assert!(!keeps("^mlx5_1", "mlx5_1", 1));
        assert!(!keeps("^mlx5_1", "mlx5_10", 1));
        assert!(keeps("^mlx5_1", "mlx5_2", 1));
        assert!(!keeps("^=mlx5_1", "mlx5_1", 1));
        assert!(keeps("^=mlx5_1", "mlx5_10", 1));
    }

    #[test]
    fn ports_restrict_entries() {
        assert!(keeps("mlx5_0:1", "mlx5_0", 1));
        assert!(!keeps("mlx5_0:1", "mlx5_0", 2));
        assert!(keeps("mlx5_0:1,mlx5_0:2", "mlx5_0", 2));
        assert!(keeps("^mlx5_0:1", "mlx5_0", 2));
        assert!(!keeps("^mlx5_0:1", "mlx5_0", 1));
        assert!(keeps("mlx5_0:", "mlx5_0", 3), "empty port matches any port");
        assert!(
            keeps("mlx5_0:-1", "mlx5_0", 3),
            "negative port matches any port"
        );
    }

    #[test]
    fn lists_match_any_entry() {
        let f = NameList::parse("mlx5_0, =rxe0 ,mlx5_3:1").unwrap();
        assert_eq!(f.entries.len(), 3);
        assert_eq!(f.entries[1].name, "=rxe0", "only a leading = counts");
        assert!(f.keeps("mlx5_0", Some(2)));
        assert!(f.keeps("mlx5_3", Some(1)));
        assert!(!f.keeps("mlx5_3", Some(2)));
        assert!(!f.keeps("rxe0", Some(1)));
    }

    #[test]
    fn rail_and_plane_are_parsed() {
        let f = NameList::parse("mlx5_0:1:3:0,mlx5_1::2").unwrap();
        assert_eq!(
            f.entries[0],
            NameEntry {
                name: "mlx5_0".into(),
                port: Some(1),
                rail: Some(3),
                plane: Some(0)
            }
        );
        assert_eq!(
            f.entries[1],
            NameEntry {
                name: "mlx5_1".into(),
                port: None,
                rail: Some(2),
                plane: None
            }
        );
        assert_eq!(f.entry_for("mlx5_1", 7).and_then(|e| e.rail), Some(2));
        assert_eq!(
            NameList::parse("^mlx5_1::2")
                .unwrap()
                .entry_for("mlx5_1", 1),
            None
        );
    }

    #[test]
    fn bad_specs_are_rejected() {
        assert!(matches!(
            NameList::parse(":1"),
            Err(NameListError::EmptyName { .. })
        ));
        assert!(matches!(
            NameList::parse("mlx5_0:x"),
            Err(NameListError::BadNumber { field: "port", .. })
        ));
        assert!(matches!(
            NameList::parse("mlx5_0:1:2:3:4"),
            Err(NameListError::TooManyFields { .. })
        ));
        let many = (0..33)
            .map(|i| format!("d{i}"))
            .collect::<Vec<_>>()
            .join(",");
        assert_eq!(
            NameList::parse(&many),
            Err(NameListError::TooManyEntries { count: 33 })
        );
        assert!(
            NameList::parse(&many[..many.rfind(',').unwrap()]).is_ok(),
            "32 entries are fine"
        );
        let msg = NameList::parse("mlx5_0:x").unwrap_err().to_string();
        assert!(msg.contains("port") && msg.contains("mlx5_0:x"), "{msg}");
    }

    #[test]
    fn an_interface_matches_entries_with_or_without_a_port() {
        // NCCL matches interface names with port -1, which every entry's port accepts.
        let list = NameList::parse("eth1:1,ib").unwrap();
        assert!(list.keeps("eth10", None));
        assert!(list.keeps("ib0", None));
        assert!(!list.keeps("docker0", None));
        let excluded = NameList::parse("^docker,lo,virbr").unwrap();
        assert!(!excluded.keeps("docker0", None) && !excluded.keeps("lo", None));
        assert!(!excluded.keeps("virbr0", None) && excluded.keeps("eth0", None));
    }

    #[test]
    fn display_round_trips() {
        for spec in ["^=mlx5_0:1,mlx5_1", "mlx5_0", "=rxe0:1"] {
            assert_eq!(NameList::parse(spec).unwrap().to_string(), spec);
        }
    }
}
