//! The bodies of Rivet's cargo-fuzz targets and the models they check against.
//!
//! Each module is one target: `check` runs one input. The cargo-fuzz entry points in
//! `fuzz_targets/` only call `check`, and `tests/replay.rs` runs every committed seed
//! (`seeds/<target>/`) and every finding kept as a regression (`regressions/<target>/`) through
//! the same `check` in plain `cargo test`, deterministically, without libFuzzer.

pub mod collnet_decode;
pub mod data_decode;
pub mod data_ops;
pub mod eager_ops;
pub mod failover;
pub mod handshake_decode;
pub mod handshake_hostile;
pub mod multi_ops;
pub mod rma_ops;

use arbitrary::{Arbitrary, Unstructured};

/// Decodes libFuzzer's bytes into a typed input exactly as `fuzz_target!(|input: T| ...)`
/// does: too few bytes for the type's minimum is no input, otherwise `arbitrary_take_rest`.
pub fn typed_input<'a, T: Arbitrary<'a>>(bytes: &'a [u8]) -> Option<T> {
    if bytes.len() < T::size_hint(0).0 {
        return None;
    }
    T::arbitrary_take_rest(Unstructured::new(bytes)).ok()
}
