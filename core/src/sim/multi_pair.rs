//! A multi-QP connection on the simulated fabric: `qps` queue-pair pairs between two endpoints,
//! driven by [`MultiSend`] and [`MultiRecv`]. The harness of the multi-QP tests and fuzz target.

use std::vec::Vec;

use super::pair::{qp_configs, recv_buf, send_buf};
use super::{EndpointId, Fabric, SimNic};
use crate::data::multi::{MultiRecv, MultiSend, QpPolicy};
use crate::data::{RecvBuf, RecvConn, SendBuf, SendConn};

/// A sender and a receiver joined by `policy.qps()` simulated RC queue pairs.
#[derive(Debug)]
pub struct MultiPair {
    /// The fabric (step it, or one queue pair with [`Fabric::step_qp`], to deliver).
    pub fabric: Fabric,
    /// The sending endpoint.
    pub send_ep: EndpointId,
    /// The receiving endpoint.
    pub recv_ep: EndpointId,
    /// The sender's NICs, one per queue pair.
    pub send_nics: Vec<SimNic>,
    /// The receiver's NICs, one per queue pair.
    pub recv_nics: Vec<SimNic>,
    /// The sending machine.
    pub send: MultiSend,
    /// The receiving machine.
    pub recv: MultiRecv,
}

impl MultiPair {
    /// A connected pair using its queue pairs as `policy` says.
    pub fn new(max_inline: usize, policy: QpPolicy) -> Self {
        let width = if policy.split() { policy.qps() } else { 1 };
        Self::with_width(max_inline, policy.qps(), width, policy.ar_threshold())
    }

    /// A connected pair of `qps` queue pairs cutting each message over `width` of them (a
    /// fused device's stripes), adaptive routing above `ar_threshold`.
    pub fn with_width(
        max_inline: usize,
        qps: usize,
        width: usize,
        ar_threshold: Option<u64>,
    ) -> Self {
        let fabric = Fabric::new();
        let send_ep = fabric.endpoint();
        let recv_ep = fabric.endpoint();
        let (send_config, recv_config) = qp_configs(max_inline);
        let mut send_nics = Vec::new();
        let mut recv_nics = Vec::new();
        let mut sends = Vec::new();
        let mut recvs = Vec::new();
        for _ in 0..qps {
            let (send_nic, recv_nic) = fabric.connect(send_ep, send_config, recv_ep, recv_config);
            sends.push(SendConn::new(recv_nic.inbound_region()));
            recvs.push(RecvConn::new(send_nic.inbound_region()));
            send_nics.push(send_nic);
            recv_nics.push(recv_nic);
        }
        Self {
            send: MultiSend::with_width(sends, width, ar_threshold),
            recv: MultiRecv::with_width(recvs, width),
            fabric,
            send_ep,
            recv_ep,
            send_nics,
            recv_nics,
        }
    }

    /// Allocate and register a send buffer holding `bytes`.
    pub fn send_buf(&self, bytes: &[u8]) -> SendBuf {
        send_buf(&self.fabric, self.send_ep, bytes)
    }

    /// Allocate and register a zeroed receive buffer of `len` bytes.
    pub fn recv_buf(&self, len: usize) -> RecvBuf {
        recv_buf(&self.fabric, self.recv_ep, len)
    }

    /// The first `len` bytes of a receive buffer.
    pub fn received(&self, buf: &RecvBuf, len: usize) -> Vec<u8> {
        self.fabric.read(self.recv_ep, buf.addr, len)
    }
}
