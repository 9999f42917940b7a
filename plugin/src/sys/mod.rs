//! C mirrors of NCCL's net plugin ABI, at the bottom of the crate (like rivet-verbs-ffi's
//! `sys`): every `#[repr(C)]` type the plugin exchanges with NCCL, and nothing else. Everything
//! here has const asserts on its layout; `tests/abi_loader.rs` checks the same numbers from C.
//!
//! - [`types`]: result codes, logger and profiler callbacks, property and config structs.
//! - [`tables`]: the function tables `ncclNet_v6_t` … `ncclNet_v11_t`.
//! - [`collnet`]: the CollNet tables `ncclCollNet_v6_t` … `ncclCollNet_v12_t` and `ncclNetSGE`.
//! - [`rma`]: the RMA tables `ncclRma_v13_t` … `ncclRma_v16_t`, their configs and properties.
//!
//! The per-version structs are written out one by one rather than generated from a shared
//! description: each then reads field for field like the NCCL header it mirrors, which is what a
//! reviewer checks it against, and the const asserts pin every layout either way.

pub mod collnet;
pub mod rma;
pub mod tables;
pub mod types;

pub use collnet::*;
pub use rma::*;
pub use tables::*;
pub use types::*;
