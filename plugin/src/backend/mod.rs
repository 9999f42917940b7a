//! The libibverbs backend: opened devices, registered control regions, and the per-connection
//! endpoint that implements `rivet_core::nic::Nic` on a real RC queue pair.

pub(crate) mod any;
pub(crate) mod device;
pub(crate) mod endpoint;
pub(crate) mod flush;
pub(crate) mod mlx5;
pub(crate) mod mr_cache;
pub(crate) mod qp_params;
pub(crate) mod region;
