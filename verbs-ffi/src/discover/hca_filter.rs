//! The `NCCL_IB_HCA` device filter: parsing and matching (pure, no IO).
//!
//! Syntax (NCCL `parseStringList`/`matchIfList`): an optional leading `^` excludes the listed
//! devices instead of selecting them; a following `=` makes names match exactly instead of as
//! prefixes (`^=` combines both). Entries are comma-separated `name[:port[:rail[:plane]]]`; an empty
//! or absent port matches every port. Without `=`, `mlx5_1` also matches `mlx5_10` … `mlx5_19`.

use std::fmt;

/// Most entries NCCL accepts in one list.
pub const MAX_ENTRIES: usize = 32;

/// One `name[:port[:rail[:plane]]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HcaEntry {
    /// Device name or name prefix.
    pub name: String,
    /// Port number; `None` matches every port.
    pub port: Option<u32>,
    /// Rail id (carried through for the plugin's properties; not used in matching).
    pub rail: Option<i32>,
    /// Plane id (carried through; not used in matching).
    pub plane: Option<i32>,
}

/// A parsed `NCCL_IB_HCA` value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HcaFilter {
    /// `^`: the entries name ports to leave out.
    pub exclude: bool,
    /// `=`: names match exactly rather than by prefix.
    pub exact: bool,
    /// The entries; empty means "every port".
    pub entries: Vec<HcaEntry>,
}

/// Why an `NCCL_IB_HCA` value could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HcaFilterError {
    /// More than [`MAX_ENTRIES`] entries.
    TooManyEntries {
        /// How many were given.
        count: usize,
    },
    /// An entry has no device name (e.g. `:1`).
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

impl fmt::Display for HcaFilterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooManyEntries { count } => {
                write!(
                    f,
                    "NCCL_IB_HCA has {count} entries; at most {MAX_ENTRIES} are allowed"
                )
            }
            Self::EmptyName { entry } => {
                write!(f, "NCCL_IB_HCA entry {entry:?} has no device name")
            }
            Self::BadNumber { entry, field } => {
                write!(f, "NCCL_IB_HCA entry {entry:?}: {field} is not a number")
            }
            Self::TooManyFields { entry } => {
                write!(
                    f,
                    "NCCL_IB_HCA entry {entry:?}: expected name[:port[:rail[:plane]]]"
                )
            }
        }
    }
}

impl std::error::Error for HcaFilterError {}

impl HcaFilter {
    /// A filter that keeps every port.
    pub fn all() -> Self {
        Self::default()
    }

    /// Parses an `NCCL_IB_HCA` value. Whitespace around entries is ignored; empty entries are skipped.
    pub fn parse(spec: &str) -> Result<Self, HcaFilterError> {
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
            return Err(HcaFilterError::TooManyEntries {
                count: entries.len(),
            });
        }
        Ok(Self {
            exclude,
            exact,
            entries,
        })
    }

    /// Whether port `port` of device `device` passes the filter.
    pub fn keeps(&self, device: &str, port: u32) -> bool {
        if self.entries.is_empty() {
            return true;
        }
        let listed = self
            .entries
            .iter()
            .any(|e| self.entry_matches(e, device, port));
        listed != self.exclude
    }

    /// The entry that selects this port (for rail/plane), if the filter is a selection list.
    pub fn entry_for(&self, device: &str, port: u32) -> Option<&HcaEntry> {
        if self.exclude {
            return None;
        }
        self.entries
            .iter()
            .find(|e| self.entry_matches(e, device, port))
    }

    fn entry_matches(&self, entry: &HcaEntry, device: &str, port: u32) -> bool {
        if entry.port.is_some_and(|p| p != port) {
            return false;
        }
        if self.exact {
            device == entry.name
        } else {
            device.starts_with(entry.name.as_str())
        }
    }
}

impl fmt::Display for HcaFilter {
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

fn parse_entry(entry: &str) -> Result<HcaEntry, HcaFilterError> {
    let mut fields = entry.split(':');
    let name = fields.next().unwrap_or("").trim();
    if name.is_empty() {
        return Err(HcaFilterError::EmptyName {
            entry: entry.to_owned(),
        });
    }
    let mut number = |field: &'static str| -> Result<Option<i64>, HcaFilterError> {
        match fields.next().map(str::trim) {
            None | Some("") => Ok(None),
            Some(text) => text
                .parse::<i64>()
                .map(Some)
                .map_err(|_| HcaFilterError::BadNumber {
                    entry: entry.to_owned(),
                    field,
                }),
        }
    };
    let port = number("port")?;
    let rail = number("rail")?;
    let plane = number("plane")?;
    if fields.next().is_some() {
        return Err(HcaFilterError::TooManyFields {
            entry: entry.to_owned(),
        });
    }
    let bad = |field| HcaFilterError::BadNumber {
        entry: entry.to_owned(),
        field,
    };
    Ok(HcaEntry {
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
        HcaFilter::parse(spec).unwrap().keeps(device, port)
    }

    #[test]
    fn empty_spec_keeps_everything() {
        assert_eq!(HcaFilter::parse("").unwrap(), HcaFilter::all());
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
        let f = HcaFilter::parse("mlx5_0, =rxe0 ,mlx5_3:1").unwrap();
        assert_eq!(f.entries.len(), 3);
        assert_eq!(f.entries[1].name, "=rxe0", "only a leading = counts");
        assert!(f.keeps("mlx5_0", 2));
        assert!(f.keeps("mlx5_3", 1));
        assert!(!f.keeps("mlx5_3", 2));
        assert!(!f.keeps("rxe0", 1));
    }

    #[test]
    fn rail_and_plane_are_parsed() {
        let f = HcaFilter::parse("mlx5_0:1:3:0,mlx5_1::2").unwrap();
        assert_eq!(
            f.entries[0],
            HcaEntry {
                name: "mlx5_0".into(),
                port: Some(1),
                rail: Some(3),
                plane: Some(0)
            }
        );
        assert_eq!(
            f.entries[1],
            HcaEntry {
                name: "mlx5_1".into(),
                port: None,
                rail: Some(2),
                plane: None
            }
        );
        assert_eq!(f.entry_for("mlx5_1", 7).and_then(|e| e.rail), Some(2));
        assert_eq!(
            HcaFilter::parse("^mlx5_1::2")
                .unwrap()
                .entry_for("mlx5_1", 1),
            None
        );
    }

    #[test]
    fn bad_specs_are_rejected() {
        assert!(matches!(
            HcaFilter::parse(":1"),
            Err(HcaFilterError::EmptyName { .. })
        ));
        assert!(matches!(
            HcaFilter::parse("mlx5_0:x"),
            Err(HcaFilterError::BadNumber { field: "port", .. })
        ));
        assert!(matches!(
            HcaFilter::parse("mlx5_0:1:2:3:4"),
            Err(HcaFilterError::TooManyFields { .. })
        ));
        let many = (0..33)
            .map(|i| format!("d{i}"))
            .collect::<Vec<_>>()
            .join(",");
        assert_eq!(
            HcaFilter::parse(&many),
            Err(HcaFilterError::TooManyEntries { count: 33 })
        );
        assert!(
            HcaFilter::parse(&many[..many.rfind(',').unwrap()]).is_ok(),
            "32 entries are fine"
        );
        let msg = HcaFilter::parse("mlx5_0:x").unwrap_err().to_string();
        assert!(msg.contains("port") && msg.contains("mlx5_0:x"), "{msg}");
    }

    #[test]
    fn display_round_trips() {
        for spec in ["^=mlx5_0:1,mlx5_1", "mlx5_0", "=rxe0:1"] {
            assert_eq!(HcaFilter::parse(spec).unwrap().to_string(), spec);
        }
    }
}
