//! What this build is: the crate version, the commit (`plugin/build.rs`), the ABI versions the
//! library exports, the wire version it speaks and the optional parts built in. `rivet version`,
//! `rivet info`, `rivet doctor` and the library's INFO line at `init` all print [`line()`].

use core::fmt;
use core::ops::RangeInclusive;

/// The crate version (`Cargo.toml`).
pub const CRATE_VERSION: &str = env!("CARGO_PKG_VERSION");
/// The commit the library was built from, or why it is not known.
pub const COMMIT: &str = env!("RIVET_COMMIT");
/// The `ncclNetPlugin_vN` tables exported (`abi::tables`).
pub const NET_ABI: RangeInclusive<u32> = 6..=12;
/// The `ncclCollNetPlugin_vN` tables exported (`abi::collnet_tables`); none without the
/// `collnet` feature.
pub const COLLNET_ABI: Option<RangeInclusive<u32>> = if cfg!(feature = "collnet") {
    Some(6..=12)
} else {
    None
};
/// The `ncclRmaPlugin_vN` tables exported (`abi::rma_tables`); none without the `rma` feature.
pub const RMA_ABI: Option<RangeInclusive<u32>> = if cfg!(feature = "rma") {
    Some(13..=16)
} else {
    None
};
/// The version of every Rivet wire format (handles, handshake, data protocol).
pub const WIRE_VERSION: u16 = rivet_core::wire::WIRE_VERSION;

/// The optional cargo features this library was built with.
pub fn features() -> impl Iterator<Item = &'static str> {
    [
        ("collnet", cfg!(feature = "collnet")),
        ("mesh", cfg!(feature = "mesh")),
        ("profiler", cfg!(feature = "profiler")),
        ("rma", cfg!(feature = "rma")),
    ]
    .into_iter()
    .filter_map(|(name, on)| on.then_some(name))
}

/// The one-line description, e.g. `Rivet 0.1.0 commit 0123456789ab, net ABI v6-v12, CollNet ABI
/// v6-v12, RMA ABI v13-v16, wire v3, features collnet mesh profiler rma`.
pub fn line() -> impl fmt::Display {
    Line
}

struct Line;

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Rivet {CRATE_VERSION} commit {COMMIT}, net ABI v{}-v{}, ",
            NET_ABI.start(),
            NET_ABI.end()
        )?;
        match &COLLNET_ABI {
            Some(v) => write!(f, "CollNet ABI v{}-v{}", v.start(), v.end())?,
            None => f.write_str("CollNet ABI none")?,
        }
        match &RMA_ABI {
            Some(v) => write!(f, ", RMA ABI v{}-v{}", v.start(), v.end())?,
            None => f.write_str(", RMA ABI none")?,
        }
        write!(
            f,
            ", wire v{WIRE_VERSION}, data v{}, features",
            rivet_core::data::eager::DATA_VERSION
        )?;
        let mut any = false;
        for name in features() {
            write!(f, " {name}")?;
            any = true;
        }
        if !any {
            f.write_str(" none (minimal build)")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_names_every_part() {
        let text = line().to_string();
        assert!(text.starts_with(&format!("Rivet {} commit ", env!("CARGO_PKG_VERSION"))));
        assert!(text.contains(&format!("wire v{}", rivet_core::wire::WIRE_VERSION)));
        assert!(text.contains("net ABI v6-v12"), "{text}");
        assert_eq!(
            text.contains("CollNet ABI v6-v12"),
            cfg!(feature = "collnet"),
            "{text}"
        );
        assert_eq!(
            text.contains("RMA ABI v13-v16"),
            cfg!(feature = "rma"),
            "{text}"
        );
        assert!(!COMMIT.is_empty());
    }
}
