//! The loopback queue pair that flushes GPU receives: an RC queue pair connected to itself, on the
//! port of a receive comm, posting the 1-byte RDMA READs `rivet_core::flush` decides.
//!
//! It is a libibverbs queue pair on both data paths: the mlx5 direct path only replaces how a
//! connection's own queue pair posts, and a flush needs no speed of its own (one READ per
//! received message, polled when NCCL tests the flush).
//!
//! Unsafe (opted in): posting a READ hands the NIC a remote address (a receive buffer NCCL
//! registered; the core chose it among the buffers `test` reported) and a local one (this
//! module's own 4-byte landing region).

#![allow(unsafe_code)]

use super::device::OpenPort;
use super::endpoint::region::Region;
use super::port_device::PortDevice;
use super::qp_params;
use crate::config::QpSettings;
use rivet_core::flush::MAX_FLUSHES;
use rivet_core::nic::WcStatus;
use rivet_verbs_ffi::sys::{
    access, ibv_rdma_wr, ibv_send_wr, ibv_send_wr_wr, ibv_sge, ibv_wc, send_flags, wr_opcode,
};
use rivet_verbs_ffi::{CompletionQueue, QpCaps, QueuePair, RcTransitions, VerbsError};
use std::mem::MaybeUninit;
use std::sync::Arc;

/// A receive comm's flush queue pair.
#[derive(Debug)]
pub(crate) struct FlushQp {
    // Field order is drop order: the QP before its CQ and the region it reads into.
    qp: QueuePair,
    cq: Arc<CompletionQueue>,
    landing: Region,
}

impl FlushQp {
    /// Create the queue pair on `port` and connect it to itself.
    pub(crate) fn new<D: PortDevice>(
        port: &Arc<OpenPort<D>>,
        settings: &QpSettings,
    ) -> Result<Self, VerbsError> {
        let verbs = port.device.verbs();
        // The READ's 1 byte lands here (NCCL reads into a 4-byte host buffer); nothing reads it.
        let landing = Region::new(&verbs.pd, 4, access::LOCAL_WRITE)?;
        let depth = MAX_FLUSHES as u32;
        let cq = CompletionQueue::new(&verbs.context, depth)?;
        let caps = QpCaps {
            max_send_wr: depth,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = QueuePair::new_rc(&verbs.pd, &cq, &cq, caps)?;
        // The READ targets the receive buffers through this same queue pair as responder.
        qp.modify_to_init(port.info.port, 0, access::LOCAL_WRITE | access::REMOTE_READ)?;
        let psn = qp_params::random_psn();
        let me = qp_params::endpoint_info(&port.info, qp.qp_num(), psn, &landing, settings);
        qp.modify_to_rtr(&qp_params::rtr(&port.info, &me, settings))?;
        qp.modify_to_rts(&qp_params::rts(settings, psn))?;
        Ok(Self { qp, cq, landing })
    }

    /// Post a signaled 1-byte RDMA READ of `remote_addr` (registered under `rkey` on this port).
    pub(crate) fn post_read(&self, wr_id: u64, remote_addr: u64, rkey: u32) -> Result<(), i32> {
        let mut sge = ibv_sge {
            addr: self.landing.addr(),
            length: 1,
            lkey: self.landing.lkey(),
        };
        let mut wr = [ibv_send_wr {
            wr_id,
            next: core::ptr::null_mut(),
            sg_list: &raw mut sge,
            num_sge: 1,
            opcode: wr_opcode::RDMA_READ,
            send_flags: send_flags::SIGNALED,
            imm_data: 0,
            wr: ibv_send_wr_wr {
                rdma: ibv_rdma_wr { remote_addr, rkey },
            },
            xrc_remote_srqn: 0,
            bind_mw_or_tso: [0; 6],
        }];
        // SAFETY: the SGE is this queue pair's own registered landing region (1 of its bytes);
        // the remote side is a buffer NCCL registered on this port, which the NIC checks against
        // `rkey`. `sge` outlives the post.
        unsafe { self.qp.post_send(&mut wr) }.map_err(|e| e.errno().unwrap_or(libc::EINVAL))
    }

    /// Poll completions into `out` as (wr_id, status); returns how many.
    pub(crate) fn poll(&self, out: &mut [(u64, WcStatus)]) -> Result<usize, i32> {
        let mut wcs = [MaybeUninit::<ibv_wc>::uninit(); 8];
        let want = out.len().min(wcs.len());
        let polled = self
            .cq
            .poll_into(&mut wcs[..want])
            .map_err(|e| e.errno().unwrap_or(libc::EIO))?;
        for (slot, wc) in out.iter_mut().zip(polled) {
            *slot = (wc.wr_id, WcStatus(wc.status));
        }
        Ok(polled.len())
    }

    /// The queue pair number, for log lines.
    pub(crate) fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }
}
