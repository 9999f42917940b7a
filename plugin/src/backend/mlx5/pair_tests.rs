//! The shared data-path pair tests (`rivet_core::sim::suite`) on the mlx5 direct path over the
//! software mlx5 model: two [`Mlx5Endpoint`]s driven by `SendConn` and `RecvConn`, byte for byte,
//! with the same faults the simulator injects and the same completion statuses expected. Then
//! the model-only checks: rings small enough to wrap, and every inline boundary.
//!
//! [`Mlx5Endpoint`]: super::endpoint::Mlx5Endpoint

use rivet_core::data::{RecvBuf, RecvConn, SendBuf, SendConn};
use rivet_core::sim::suite::{
    End, PairHarness, done_sizes, finish_recv, finish_send, irecv, isend, isend_bytes, pattern,
};
use rivet_verbs_ffi::mlx5::model::ModelQpConfig;

use super::endpoint::Mlx5Endpoint;
use super::pair::{ModelPair, OnModel};

impl PairHarness for ModelPair {
    type Nic = Mlx5Endpoint<OnModel>;

    fn new(max_inline: usize) -> Self {
        Self::new(max_inline)
    }
    fn send_side(&mut self) -> (&mut SendConn, &mut Self::Nic) {
        (&mut self.send, &mut self.send_nic)
    }
    fn recv_side(&mut self) -> (&mut RecvConn, &mut Self::Nic) {
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
        Self::step(self)
    }
    fn send_buf(&mut self, bytes: &[u8]) -> SendBuf {
        Self::send_buf(self, bytes)
    }
    fn recv_buf(&mut self, len: usize) -> RecvBuf {
        Self::recv_buf(self, len)
    }
    fn received(&self, buf: &RecvBuf, len: usize) -> Vec<u8> {
        Self::received(self, buf, len)
    }
    fn write_cts_fifo(&mut self, offset: u64, bytes: &[u8]) {
        let fifo = self.send_nic.inbound_region();
        self.model.write(fifo.addr + offset, bytes);
    }
    fn fault_qp_error(&mut self, end: End) {
        let qp = match end {
            End::Sender => self.send_nic.model_qp(),
            End::Receiver => self.recv_nic.model_qp(),
        };
        self.model.fault_qp_error(qp);
    }
    fn deregister_receive_buffer(&mut self, rkey: u32) {
        self.model.deregister(self.recv_pd, rkey);
    }
    fn vanish(&mut self, end: End) {
        let qp = match end {
            End::Sender => self.send_nic.model_qp(),
            End::Receiver => self.recv_nic.model_qp(),
        };
        self.model.vanish(qp);
    }
    fn set_split_placement(&mut self, on: bool) {
        self.model.set_split_placement(on);
    }
    fn sq_occupancy(&self, end: End) -> usize {
        match end {
            End::Sender => self.send_nic.sq_outstanding_wqes() as usize,
            End::Receiver => self.recv_nic.sq_outstanding_wqes() as usize,
        }
    }
    fn cq_len(&self, _end: End) -> Option<usize> {
        // A CQ overrun makes the model panic; it keeps no separate count.
        None
    }
}

rivet_core::data_pair_tests!(ModelPair);

#[test]
fn stream_through_minimal_rings_wraps_send_receive_and_completion_queues() {
    // 512 WQEs of at most 2 basic blocks (inline ≤ 64) need 1024 BBs; 768 CQEs need 1024.
    let config = ModelQpConfig {
        sq_wqe_cnt: 1024,
        rq_wqe_cnt: 256,
        rq_stride: 16,
        cqe_cnt: 1024,
        cqe_size: 64,
        bf_size: 256,
    };
    let mut p = ModelPair::with_config(64, config);
    let rbuf = p.recv_buf(64);
    let sbuf = p.send_buf(&pattern(3, 64));
    for i in 0..3000u32 {
        let r = irecv(&mut p, &[rbuf], &[i]);
        let s = isend(&mut p, sbuf, i);
        finish_send(&mut p, s).unwrap();
        assert_eq!(done_sizes(finish_recv(&mut p, r).unwrap()), [64]);
    }
    assert_eq!(p.received(&rbuf, 64), pattern(3, 64));
    let stats = p.model.stats();
    // Every message is a CTS write and a write-with-immediate: 6000 WQEs through 1024-BB rings,
    // 3000 receives through a 256-entry receive queue.
    assert_eq!(stats.recvs, 3000);
    assert!(stats.wqes >= 6000, "{stats:?}");
    assert!(stats.bf_copies > 0, "single WQEs go by BlueFlame");
}

#[test]
fn sixty_four_kib_and_zero_bytes_byte_for_byte() {
    for (max_inline, bf_size) in [(0, 0), (220, 256)] {
        let config = ModelQpConfig {
            bf_size,
            ..ModelQpConfig::default()
        };
        let mut p = ModelPair::with_config(max_inline, config);
        for len in [0usize, 1, 7, 8, 9, 63, 64, 65, 220, 221, 4096, 65536] {
            let data = pattern(len as u64 + 11, len);
            let rbuf = p.recv_buf(len);
            let r = irecv(&mut p, &[rbuf], &[1]);
            let s = isend_bytes(&mut p, &data, 1);
            assert_eq!(done_sizes(finish_send(&mut p, s).unwrap()), [len as u64]);
            assert_eq!(done_sizes(finish_recv(&mut p, r).unwrap()), [len as u64]);
            assert_eq!(p.received(&rbuf, len), data, "{len} bytes");
        }
        let stats = p.model.stats();
        if bf_size == 0 {
            assert_eq!(
                stats.bf_copies, 0,
                "no BlueFlame without a BlueFlame register"
            );
        }
    }
}

#[test]
fn model_endpoint_has_the_protocol_regions() {
    use crate::backend::endpoint::Role;
    use rivet_core::nic::Nic;
    use rivet_verbs_ffi::mlx5::model::Model;
    let model = Model::new();
    let pd = model.pd();
    let sender =
        Mlx5Endpoint::on_model(&model, pd, Role::Sender, 64, ModelQpConfig::default()).unwrap();
    let receiver =
        Mlx5Endpoint::on_model(&model, pd, Role::Receiver, 64, ModelQpConfig::default()).unwrap();
    assert_eq!(
        sender.inbound_region().len as usize,
        rivet_core::data::SEND_INBOUND_LEN
    );
    assert_eq!(
        receiver.inbound_region().len as usize,
        rivet_core::data::RECV_INBOUND_LEN
    );
    assert_ne!(sender.qp_num(), receiver.qp_num());
    assert_eq!(sender.max_inline(), 64);
}
