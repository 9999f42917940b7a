//! Hand-written FFI to libibverbs (and the mlx5 direct-verbs entry points), loaded at run time with
//! `dlopen`, plus safe wrappers that own every verbs object and destroy it in order.
//!
//! - [`loader`]: `dlopen("libibverbs.so.1")` once per process ([`verbs()`]); `RIVET_IBVERBS_LIB`
//!   overrides the path. Optional symbols of newer rdma-core are `Option`s. [`mlx5()`] loads
//!   `libmlx5.so.1` on demand.
//! - [`sys`]: `repr(C)` structs with compile-time-checked layouts and the C enum values.
//! - Owners: [`DeviceList`] → [`Context`] → [`ProtectionDomain`] / [`CompletionQueue`] →
//!   [`MemoryRegion`] / [`QueuePair`]. Children hold an `Arc` to their parent, so a context is
//!   closed only after its PDs and CQs, and a PD/CQ only after its QPs.
//! - [`mod@discover`]: the usable ports, with GID, speed and PCI path, as an NCCL plugin reports them.
//! - [`name_list`]: NCCL's name-list syntax (`NCCL_IB_HCA`, `NCCL_SOCKET_IFNAME`), which discovery
//!   filters ports with.
//!
//! The crate depends on nothing of Rivet's (only `libc`): what discovery decides with lives here.
//!
//! Test support behind features, never in the shipped plugin: `mlx5-model` (the software mlx5
//! device, `mlx5::model`) and `loopback-check` (`selftest`, a two-QP loopback transfer).
//!
//! The data path (`post_send`, `post_recv`, `poll`) calls the provider's context ops directly
//! (these are `static inline` in C) and does not allocate.
#![deny(unsafe_code)]

pub mod context;
pub mod cq;
pub mod device;
pub mod discover;
mod error;
pub mod loader;
pub mod mlx5;
pub mod mr;
pub mod name_list;
pub mod pd;
pub mod qp;
#[cfg(feature = "loopback-check")]
pub mod selftest;
pub mod sys;

pub use context::{AsyncEvent, Context};
pub use cq::CompletionQueue;
pub use device::{Device, DeviceList};
pub use discover::{DiscoverError, DiscoverOptions, PortInfo, discover};
pub use error::VerbsError;
pub use loader::{Mlx5, Verbs, fork_init, fork_status, mlx5, verbs};
pub use mr::{MemoryRegion, dmabuf_probe};
pub use pd::ProtectionDomain;
pub use qp::{QpCaps, QueuePair, RcTransitions, RtrParams, RtsParams};
