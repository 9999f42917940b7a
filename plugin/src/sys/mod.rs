//! C mirrors of NCCL's net plugin ABI, at the bottom of the crate (like rivet-verbs-ffi's
//! `sys`): every `#[repr(C)]` type the plugin exchanges with NCCL, and nothing else. Everything
//! here has const asserts on its layout; `tests/abi_loader.rs` checks the same numbers from C.
//!
//! - [`types`]: result codes, logger and profiler callbacks, property and config structs.
//! - [`tables`]: the function tables `ncclNet_v6_t` … `ncclNet_v11_t`.

pub mod tables;
pub mod types;

pub use tables::*;
pub use types::*;
