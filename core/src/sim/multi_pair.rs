//! A multi-QP connection on the simulated fabric: `qps` queue-pair pairs between two endpoints,
//! driven by [`MultiSend`] and [`MultiRecv`]. The harness of the multi-QP tests and fuzz target.

use std::vec::Vec;

use super::{EndpointId, Fabric, QpConfig, SimNic};
use crate::data::multi::{MultiRecv, MultiSend, QpPolicy};
use crate::data::{
    CQ_DEPTH, RECV_INBOUND_LEN, RECV_QUEUE_DEPTH, RECV_STAGING_LEN, RecvBuf, RecvConn,
    SEND_INBOUND_LEN, SEND_QUEUE_DEPTH, SEND_STAGING_LEN, SendBuf, SendConn,
};

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
        let fabric = Fabric::new();
        let send_ep = fabric.endpoint();
        let recv_ep = fabric.endpoint();
        let send_config = QpConfig {
            max_inline,
            sq_depth: SEND_QUEUE_DEPTH,
            rq_depth: RECV_QUEUE_DEPTH,
            cq_depth: CQ_DEPTH,
            inbound_len: SEND_INBOUND_LEN,
            staging_len: SEND_STAGING_LEN,
        };
        let recv_config = QpConfig {
            inbound_len: RECV_INBOUND_LEN,
            staging_len: RECV_STAGING_LEN,
            ..send_config
        };
        let mut send_nics = Vec::new();
        let mut recv_nics = Vec::new();
        let mut sends = Vec::new();
        let mut recvs = Vec::new();
        for _ in 0..policy.qps() {
            let (send_nic, recv_nic) = fabric.connect(send_ep, send_config, recv_ep, recv_config);
            sends.push(SendConn::new(recv_nic.inbound_region()));
            recvs.push(RecvConn::new(send_nic.inbound_region()));
            send_nics.push(send_nic);
            recv_nics.push(recv_nic);
        }
        Self {
            send: MultiSend::new(sends, policy),
            recv: MultiRecv::new(recvs, policy),
            fabric,
            send_ep,
            recv_ep,
            send_nics,
            recv_nics,
        }
    }

    /// Allocate and register a send buffer holding `bytes`.
    pub fn send_buf(&self, bytes: &[u8]) -> SendBuf {
        let mr = self
            .fabric
            .alloc_registered(self.send_ep, bytes.len().max(1));
        self.fabric.write(self.send_ep, mr.addr, bytes);
        SendBuf {
            addr: mr.addr,
            len: bytes.len() as u64,
            lkey: mr.lkey,
        }
    }

    /// Allocate and register a zeroed receive buffer of `len` bytes.
    pub fn recv_buf(&self, len: usize) -> RecvBuf {
        let mr = self.fabric.alloc_registered(self.recv_ep, len.max(1));
        RecvBuf {
            addr: mr.addr,
            len: len as u64,
            rkey: mr.rkey,
        }
    }

    /// The first `len` bytes of a receive buffer.
    pub fn received(&self, buf: &RecvBuf, len: usize) -> Vec<u8> {
        self.fabric.read(self.recv_ep, buf.addr, len)
    }
}
