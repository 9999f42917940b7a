//! The direct path on the software mlx5 model ([`rivet_verbs_ffi::mlx5::model`]): control regions
//! in model memory and a [`DirectNic`] built on a model QP.
//!
//! Like `nic.rs`, this file depends only on rivet-core, rivet-verbs-ffi and its sibling `nic`, so
//! `benches/mlx5_model.rs` can include it.

use rivet_core::nic::RemoteRegion;
use rivet_verbs_ffi::mlx5::DirectError;
use rivet_verbs_ffi::mlx5::model::{
    Model, ModelDoorbell, ModelMr, ModelPd, ModelQp, ModelQpConfig,
};
use rivet_verbs_ffi::sys::access;

use super::nic::{ControlRegions, DirectNic};

/// Control regions in model memory.
#[derive(Debug)]
pub(crate) struct ModelRegions {
    model: Model,
    inbound: ModelMr,
    staging: ModelMr,
}

impl ModelRegions {
    /// The inbound region as the peer addresses it.
    pub(crate) fn inbound_region(&self) -> RemoteRegion {
        RemoteRegion {
            addr: self.inbound.addr,
            rkey: self.inbound.rkey,
            len: self.inbound.len as u32,
        }
    }
}

impl ControlRegions for ModelRegions {
    fn read_inbound(&self, offset: usize, out: &mut [u8]) {
        match offset.checked_add(out.len()) {
            Some(end) if end as u64 <= self.inbound.len => {
                self.model.read_into(self.inbound.addr + offset as u64, out);
                std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
            }
            // The core promises in-range reads; the simulator panics, so does the model path.
            _ => panic!(
                "mlx5 model: inbound read at {offset}+{} outside the region",
                out.len()
            ),
        }
    }

    fn write_staging(&mut self, offset: usize, bytes: &[u8]) -> bool {
        match offset.checked_add(bytes.len()) {
            Some(end) if end as u64 <= self.staging.len => {
                self.model.write(self.staging.addr + offset as u64, bytes);
                true
            }
            _ => false,
        }
    }

    fn staging(&self) -> (u64, u32, usize) {
        (
            self.staging.addr,
            self.staging.lkey,
            self.staging.len as usize,
        )
    }

    fn write_inbound(&mut self, offset: usize, bytes: &[u8]) -> bool {
        match offset.checked_add(bytes.len()) {
            Some(end) if end as u64 <= self.inbound.len => {
                self.model.write(self.inbound.addr + offset as u64, bytes);
                true
            }
            _ => false,
        }
    }

    fn deliver_inbound(&mut self, offset: usize, len: usize, dst: u64) {
        let mut bytes = vec![0u8; len];
        self.read_inbound(offset, &mut bytes);
        self.model.write(dst, &bytes);
    }
}

/// A direct NIC on the model.
pub(crate) type ModelNic = DirectNic<ModelDoorbell, ModelRegions>;

/// Create a model QP in `pd` with control regions of the given sizes, and the direct NIC on it.
pub(crate) fn model_nic(
    model: &Model,
    pd: ModelPd,
    inbound_len: usize,
    staging_len: usize,
    max_inline: usize,
    config: ModelQpConfig,
) -> Result<(ModelQp, ModelNic), DirectError> {
    let inbound =
        model.alloc_registered(pd, inbound_len, access::LOCAL_WRITE | access::REMOTE_WRITE);
    let staging = model.alloc_registered(pd, staging_len, access::LOCAL_WRITE);
    let qp = model.create_qp(pd, config);
    let direct = qp.direct_qp(max_inline)?;
    let regions = ModelRegions {
        model: model.clone(),
        inbound,
        staging,
    };
    Ok((
        qp,
        DirectNic {
            qp: direct,
            regions,
        },
    ))
}
