//! The mlx5 direct data path (reference verbs-mlx5dv §2): work queue entries written straight
//! into the send queue, doorbells rung through BlueFlame, completions read straight from the CQ
//! buffer, and a software model of the device that proves it.
//!
//! - [`wqe`], [`cqe`]: the wire formats (pure encoders and decoders, golden-tested).
//! - [`dv`]: `repr(C)` mirrors of the mlx5dv structs, layout-checked.
//! - [`direct`]: [`DirectQp`], posting and polling on plain memory plus a [`DoorbellRegister`].
//! - [`doorbell`]: the register seam; [`BlueFlame`] is the real MMIO one.
//! - [`barrier`]: rdma-core's device barriers per architecture.
//! - [`setup`]: bring-up on a real device (`mlx5dv_create_qp`, `mlx5dv_init_obj`).
//! - `model` (feature `mlx5-model`): the software device (test and bench support; never in the
//!   shipped plugin).

pub mod barrier;
pub mod cqe;
pub mod direct;
pub mod doorbell;
pub mod dv;
#[cfg(feature = "mlx5-model")]
pub mod model;
pub mod setup;
pub mod wqe;

pub use direct::{
    CompletedOp, DirectCompletion, DirectError, DirectOp, DirectQp, DirectWr, QueueLayout,
    WorkQueue, WqeData,
};
pub use doorbell::{BlueFlame, DoorbellRegister};
