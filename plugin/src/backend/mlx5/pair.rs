//! A sender and a receiver on the software mlx5 model, driven by rivet-core's data-path machines:
//! the mlx5 twin of `rivet_core::sim::DataPair`.

use rivet_core::data::{RecvBuf, RecvConn, SendBuf, SendConn};
use rivet_verbs_ffi::mlx5::model::{Model, ModelPd, ModelQpConfig};
use rivet_verbs_ffi::sys::access;

use super::endpoint::{Mlx5Endpoint, OnModel};
use crate::backend::endpoint::Role;

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
        }
    }

    /// The first `len` bytes of a receive buffer.
    pub(super) fn received(&self, buf: &RecvBuf, len: usize) -> Vec<u8> {
        self.model.read(buf.addr, len)
    }
}
