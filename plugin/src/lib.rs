//! The Rivet NCCL net plugin: the C tables `ncclNetPlugin_v6` … `ncclNetPlugin_v12` over one
//! implementation that drives `rivet-core` with the libibverbs backend.
//!
//! Module map: [`abi`] (C types, tables, per-version shims) → `net` (lifecycle, devices) and
//! `comm` (listen/connect/accept, registrations, data path) → `rivet-core` machines.

pub mod abi;
mod backend;
mod clock;
mod comm;
mod config;
pub mod devices;
pub mod diag;
mod error;
mod handle;
mod log;
mod net;
mod oob;
mod profiler;
mod random;
pub mod sys;

pub use error::{ErrorClass, NetError};
