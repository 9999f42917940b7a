//! The mlx5 direct data path: [`endpoint::Mlx5Endpoint`] drives rivet-verbs-ffi's
//! [`DirectQp`](rivet_verbs_ffi::mlx5::DirectQp) (WQEs in the send queue, BlueFlame doorbells,
//! CQEs read from the CQ buffer) behind the same [`Nic`](rivet_core::nic::Nic) the libibverbs
//! backend implements. Proven against the software mlx5 model (`pair_tests`); no mlx5 hardware
//! was available when it was written.
//!
//! - `nic`: the translation between core work requests/completions and direct ones.
//! - `model`: control regions in model memory and a direct NIC on a model QP.
//! - `endpoint`: the endpoint, generic over what keeps its queues alive (`Attachment`): a
//!   device (`new`).
//! - `pair`: the endpoint on the model (its `OnModel` attachment) and a connected pair of them.
//!
//! `model` (also included by the `mlx5_model` bench), `pair` and `pair_tests` are test support;
//! the plugin itself never builds them.

pub(crate) mod endpoint;
#[cfg(test)]
pub(crate) mod model;
pub(crate) mod nic;
#[cfg(test)]
mod pair;
#[cfg(test)]
mod pair_tests;
