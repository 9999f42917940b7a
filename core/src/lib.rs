//! rivet-core: every state machine of the Rivet NCCL net plugin, with no IO, no clock and no `unsafe`.
//!
//! The plugin crate is only a driver: it moves bytes between sockets and the handshake machines
//! ([`handshake`]), hands the data-path machines ([`data`]) a [`nic::Nic`] to post work requests on,
//! and passes the current time in as a [`time::Instant`].
#![no_std]
#![forbid(unsafe_code)]
#![cfg_attr(not(fuzzing), warn(missing_docs))]

extern crate alloc;
#[cfg(any(test, feature = "sim"))]
extern crate std;

pub mod collnet;
pub mod data;
pub mod event;
pub mod flush;
pub mod gdr;
pub mod handshake;
pub mod mesh;
pub mod nic;
pub mod regcache;
pub mod rma;
pub mod route;
#[cfg(any(test, feature = "sim"))]
pub mod sim;
pub mod time;
pub mod wire;
