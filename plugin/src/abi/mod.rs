//! The top layer, what NCCL sees: the exported tables ([`tables`]), the per-version
//! `extern "C"` entry points they point at (`shims`, with the boundary every entry runs its body
//! through, `shims::guard`: no panic and no Rust error crosses into C) and the per-version device
//! properties ([`props`]). The C layouts they fill are in [`crate::sys`], at the bottom. The
//! CollNet tables ([`collnet_tables`]) and their shims (`collnet_shims`) sit beside the net ones
//! (feature `collnet`: without it the library exports the net tables alone), and so do the RMA
//! tables ([`rma_tables`], `rma_shims`; feature `rma`).

#[cfg(feature = "collnet")]
mod collnet_shims;
#[cfg(feature = "collnet")]
pub mod collnet_tables;
#[cfg(test)]
mod export_tests;
pub mod props;
#[cfg(feature = "rma")]
mod rma_shims;
#[cfg(feature = "rma")]
pub mod rma_tables;
mod shims;
pub mod tables;
#[cfg(test)]
mod vdevice_replay;
