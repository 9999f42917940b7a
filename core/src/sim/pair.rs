//! A connected data-path pair on the simulated fabric: the harness of the pair tests, the
//! `data_ops` fuzzer and the `core_sim` bench.

use super::{EndpointId, Fabric, QpConfig, SimNic};
use crate::data::eager::{
    EAGER_MAX, RECV_INBOUND_EAGER_LEN, RECV_STAGING_EAGER_LEN, SEND_INBOUND_EAGER_LEN,
    SEND_STAGING_EAGER_LEN,
};
use crate::data::{
    CQ_DEPTH, RECV_INBOUND_LEN, RECV_QUEUE_DEPTH, RECV_STAGING_LEN, RecvBuf, RecvConn,
    SEND_INBOUND_LEN, SEND_QUEUE_DEPTH, SEND_STAGING_LEN, SendBuf, SendConn,
};

/// A sender and a receiver connected through one simulated RC queue-pair pair, with the queue
/// depths and region sizes the `data` module asks for.
#[derive(Debug)]
pub struct DataPair {
    /// The fabric (step it to deliver).
    pub fabric: Fabric,
    /// The sending endpoint.
    pub send_ep: EndpointId,
    /// The receiving endpoint.
    pub recv_ep: EndpointId,
    /// The sender's NIC.
    pub send_nic: SimNic,
    /// The receiver's NIC.
    pub recv_nic: SimNic,
    /// The sending machine.
    pub send: SendConn,
    /// The receiving machine.
    pub recv: RecvConn,
}

impl DataPair {
    /// A connected pair whose queue pairs allow `max_inline` inline bytes.
    pub fn new(max_inline: usize) -> Self {
        Self::connected(max_inline, None)
    }

    /// A connected pair with the eager path on both ends (data protocol 4's regions), sends of
    /// up to `threshold` bytes going eager.
    pub fn new_eager(max_inline: usize, threshold: u64) -> Self {
        Self::connected(max_inline, Some(threshold))
    }

    /// The pair, with the eager path's regions and the path turned on when `eager` gives a
    /// threshold.
    fn connected(max_inline: usize, eager: Option<u64>) -> Self {
        let fabric = Fabric::new();
        let send_ep = fabric.endpoint();
        let recv_ep = fabric.endpoint();
        let (mut send_config, mut recv_config) = qp_configs(max_inline);
        if eager.is_some() {
            send_config.inbound_len = SEND_INBOUND_EAGER_LEN;
            send_config.staging_len = SEND_STAGING_EAGER_LEN;
            recv_config.inbound_len = RECV_INBOUND_EAGER_LEN;
            recv_config.staging_len = RECV_STAGING_EAGER_LEN;
        }
        let (send_nic, mut recv_nic) = fabric.connect(send_ep, send_config, recv_ep, recv_config);
        let mut send = SendConn::new(recv_nic.inbound_region());
        send.set_inline_max(crate::nic::Nic::max_inline(&send_nic));
        let mut recv = RecvConn::new(send_nic.inbound_region());
        if let Some(threshold) = eager {
            assert_eq!(
                send.enable_eager(threshold),
                threshold.min(EAGER_MAX as u64)
            );
            assert_eq!(recv.enable_eager(&mut recv_nic), Ok(true));
        }
        Self {
            fabric,
            send_ep,
            recv_ep,
            send_nic,
            recv_nic,
            send,
            recv,
        }
    }

    /// The bytes of a host-memory send buffer, as the plugin hands them to an eager send.
    pub fn send_bytes(&self, buf: &SendBuf) -> std::vec::Vec<u8> {
        self.fabric.read(self.send_ep, buf.addr, buf.len as usize)
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
    pub fn received(&self, buf: &RecvBuf, len: usize) -> std::vec::Vec<u8> {
        self.fabric.read(self.recv_ep, buf.addr, len)
    }
}

/// The queue-pair configurations (sender, receiver) the `data` module asks for.
pub(super) fn qp_configs(max_inline: usize) -> (QpConfig, QpConfig) {
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
    (send_config, recv_config)
}

/// Allocate and register a buffer on `ep` holding `bytes`, to send from.
pub(super) fn send_buf(fabric: &Fabric, ep: EndpointId, bytes: &[u8]) -> SendBuf {
    let mr = fabric.alloc_registered(ep, bytes.len().max(1));
    fabric.write(ep, mr.addr, bytes);
    SendBuf {
        addr: mr.addr,
        len: bytes.len() as u64,
        lkey: mr.lkey,
    }
}

/// Allocate and register a zeroed buffer of `len` bytes on `ep`, to receive into.
pub(super) fn recv_buf(fabric: &Fabric, ep: EndpointId, len: usize) -> RecvBuf {
    let mr = fabric.alloc_registered(ep, len.max(1));
    RecvBuf {
        addr: mr.addr,
        len: len as u64,
        rkey: mr.rkey,
        host: true,
    }
}

impl super::suite::PairHarness for DataPair {
    type Nic = SimNic;

    fn new(max_inline: usize) -> Self {
        Self::new(max_inline)
    }
    fn send_side(&mut self) -> (&mut SendConn, &mut SimNic) {
        (&mut self.send, &mut self.send_nic)
    }
    fn recv_side(&mut self) -> (&mut RecvConn, &mut SimNic) {
        (&mut self.recv, &mut self.recv_nic)
    }
    fn sender(&self) -> &SendConn {
        &self.send
    }
    fn receiver(&self) -> &RecvConn {
        &self.recv
    }
    fn replace_conns(&mut self, send: SendConn, recv: RecvConn) {
        self.send = send;
        self.recv = recv;
    }
    fn step(&mut self) -> bool {
        self.fabric.step()
    }
    fn send_buf(&mut self, bytes: &[u8]) -> SendBuf {
        Self::send_buf(self, bytes)
    }
    fn recv_buf(&mut self, len: usize) -> RecvBuf {
        Self::recv_buf(self, len)
    }
    fn received(&self, buf: &RecvBuf, len: usize) -> std::vec::Vec<u8> {
        Self::received(self, buf, len)
    }
    fn write_cts_fifo(&mut self, offset: u64, bytes: &[u8]) {
        let fifo = self.send_nic.inbound_region();
        self.fabric.write(self.send_ep, fifo.addr + offset, bytes);
    }
    fn fault_qp_error(&mut self, end: super::suite::End) {
        let nic = match end {
            super::suite::End::Sender => &self.send_nic,
            super::suite::End::Receiver => &self.recv_nic,
        };
        self.fabric.fault_qp_error(nic);
    }
    fn deregister_receive_buffer(&mut self, rkey: u32) {
        self.fabric.deregister(self.recv_ep, rkey);
    }
    fn vanish(&mut self, end: super::suite::End) {
        let ep = match end {
            super::suite::End::Sender => self.send_ep,
            super::suite::End::Receiver => self.recv_ep,
        };
        self.fabric.vanish(ep);
    }
    fn set_split_placement(&mut self, on: bool) {
        self.fabric.set_split_placement(on);
    }
    fn sq_occupancy(&self, end: super::suite::End) -> usize {
        match end {
            super::suite::End::Sender => self.send_nic.sq_occupancy(),
            super::suite::End::Receiver => self.recv_nic.sq_occupancy(),
        }
    }
    fn cq_len(&self, end: super::suite::End) -> Option<usize> {
        Some(match end {
            super::suite::End::Sender => self.send_nic.cq_len(),
            super::suite::End::Receiver => self.recv_nic.cq_len(),
        })
    }
}
