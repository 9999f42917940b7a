//! A sender and a receiver on the software mlx5 model, driven by rivet-core's data-path machines:
//! the mlx5 twin of `rivet_core::sim::DataPair`. Their endpoints are the plugin's
//! [`Mlx5Endpoint`] with the model as its attachment ([`OnModel`], defined here: test support,
//! the library never builds it).

use rivet_core::data::{RecvBuf, RecvConn, SendBuf, SendConn};
use rivet_core::nic::RemoteRegion;
use rivet_verbs_ffi::VerbsError;
use rivet_verbs_ffi::mlx5::model::{Model, ModelDoorbell, ModelPd, ModelQp, ModelQpConfig};
use rivet_verbs_ffi::sys::access;

use super::endpoint::{Attachment, Mlx5Endpoint};
use super::model::{ModelRegions, model_nic};
use crate::backend::endpoint::Role;

/// The software model as an endpoint's attachment.
#[derive(Debug)]
pub(super) struct OnModel {
    qp: ModelQp,
}

impl Attachment for OnModel {
    type Doorbell = ModelDoorbell;
    type Regions = ModelRegions;
}

impl Mlx5Endpoint<OnModel> {
    /// The endpoint on the software model: a model QP in `pd` with `config` geometry, the
    /// control regions for `role` in model memory, `max_inline` inline bytes. Connect two with
    /// [`Self::connect_on_model`].
    pub(super) fn on_model(
        model: &Model,
        pd: ModelPd,
        role: Role,
        max_inline: usize,
        config: ModelQpConfig,
    ) -> Result<Self, VerbsError> {
        let (inbound_len, staging_len, _) = role.regions();
        let (qp, nic) = model_nic(model, pd, inbound_len, staging_len, max_inline, config)
            .map_err(|_| VerbsError::InvalidArgument {
                what: "model queue layout unusable by the direct path",
            })?;
        Ok(Self {
            attachment: OnModel { qp },
            nic,
        })
    }

    /// Connect to `peer` on the same model.
    pub(super) fn connect_on_model(&self, peer: &Self) {
        self.attachment
            .qp
            .model()
            .connect(&self.attachment.qp, &peer.attachment.qp);
    }

    /// The model QP (for fault injection).
    pub(super) fn model_qp(&self) -> &ModelQp {
        &self.attachment.qp
    }

    /// The inbound region as the peer addresses it.
    pub(super) fn inbound_region(&self) -> RemoteRegion {
        self.nic.regions.inbound_region()
    }

    /// The QP number.
    pub(super) fn qp_num(&self) -> u32 {
        self.attachment.qp.qpn()
    }

    /// Send WQEs posted and not yet known complete.
    pub(super) fn sq_outstanding_wqes(&self) -> u32 {
        self.nic.qp.sq_outstanding_wqes()
    }
}

/// Access rights of user buffers.
const USER: u32 = access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ;

/// A connected pair of model endpoints and the core machines on them.
pub(super) struct ModelPair {
    pub(super) model: Model,
    pub(super) send_pd: ModelPd,
    pub(super) recv_pd: ModelPd,
    pub(super) send_nic: Mlx5Endpoint<OnModel>,
    pub(super) recv_nic: Mlx5Endpoint<OnModel>,
    pub(super) send: SendConn,
    pub(super) recv: RecvConn,
}

impl ModelPair {
    /// A pair whose QPs allow `max_inline` inline bytes, with a ConnectX-like geometry.
    pub(super) fn new(max_inline: usize) -> Self {
        Self::with_config(max_inline, ModelQpConfig::default())
    }

    pub(super) fn with_config(max_inline: usize, config: ModelQpConfig) -> Self {
        let model = Model::new();
        let send_pd = model.pd();
        let recv_pd = model.pd();
        let send_nic =
            Mlx5Endpoint::on_model(&model, send_pd, Role::Sender, max_inline, config).unwrap();
        let recv_nic =
            Mlx5Endpoint::on_model(&model, recv_pd, Role::Receiver, max_inline, config).unwrap();
        send_nic.connect_on_model(&recv_nic);
        let send = SendConn::new(recv_nic.inbound_region());
        let recv = RecvConn::new(send_nic.inbound_region());
        Self {
            model,
            send_pd,
            recv_pd,
            send_nic,
            recv_nic,
            send,
            recv,
        }
    }

    /// Execute one queued WQE; false when none was queued.
    pub(super) fn step(&self) -> bool {
        self.model.step()
    }

    /// Allocate and register a send buffer holding `bytes`.
    pub(super) fn send_buf(&self, bytes: &[u8]) -> SendBuf {
        let mr = self
            .model
            .alloc_registered(self.send_pd, bytes.len().max(1), USER);
        self.model.write(mr.addr, bytes);
        SendBuf {
            addr: mr.addr,
            len: bytes.len() as u64,
            lkey: mr.lkey,
        }
    }

    /// Allocate and register a zeroed receive buffer of `len` bytes.
    pub(super) fn recv_buf(&self, len: usize) -> RecvBuf {
        let mr = self.model.alloc_registered(self.recv_pd, len.max(1), USER);
        RecvBuf {
            addr: mr.addr,
            len: len as u64,
            rkey: mr.rkey,
            host: false,
        }
    }

    /// The first `len` bytes of a receive buffer.
    pub(super) fn received(&self, buf: &RecvBuf, len: usize) -> Vec<u8> {
        self.model.read(buf.addr, len)
    }
}
