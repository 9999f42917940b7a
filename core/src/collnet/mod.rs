//! CollNet in software: the arithmetic and the schedules behind Rivet's `ncclCollNet` tables.
//!
//! NCCL hands the inter-node part of a reduction to a CollNet plugin; with SHARP switches the
//! network reduces. Rivet serves the same tables over its own RDMA connections, with the
//! reductions on the host CPU. This module is the sans-IO part:
//!
//! - [`float`]: the narrow float formats (fp16, bf16, fp8), decoded and rounded exactly.
//! - [`reduce`]: every NCCL data type × operation over byte slices, and their definition.
//! - [`layout`]: who owns which bytes, the fold order, the group's id.
//! - [`schedule`]: which message to send, receive or fold next (the algorithms).
//! - [`hello`]: the first message on each of the group's connections.

pub mod float;
pub mod hello;
pub mod layout;
pub mod reduce;
pub mod schedule;
