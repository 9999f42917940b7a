//! A loopback self-test: two RC QPs on one port, connected to each other, move a buffer with one
//! RDMA WRITE WITH IMM and the result is compared byte for byte.
//!
//! Unsafe because it registers its own heap buffers with the HCA and posts work requests that point
//! at them; both buffers outlive the MRs and every WR is complete before they are read or freed.
#![allow(unsafe_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cq::CompletionQueue;
use crate::device::DeviceList;
use crate::discover::{LinkLayer, PortInfo};
use crate::error::VerbsError;
use crate::mr::MemoryRegion;
use crate::pd::ProtectionDomain;
use crate::qp::{QpCaps, QueuePair, RcTransitions, RtrParams, RtsParams};
use crate::sys::{
    access, ibv_gid, ibv_recv_wr, ibv_send_wr, ibv_sge, ibv_wc, send_flags, wc_opcode, wc_status,
};

/// What the loopback test observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopbackReport {
    /// Bytes written.
    pub bytes: usize,
    /// Sender and receiver QP numbers.
    pub qp_nums: (u32, u32),
    /// Inline bytes the provider granted the sender QP.
    pub max_inline_data: u32,
    /// Time from post to both completions.
    pub elapsed: Duration,
}

/// Why the loopback test failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoopbackError {
    /// The named device is not in the device list.
    NoSuchDevice(String),
    /// A verbs call failed.
    Verbs(VerbsError),
    /// A completion carried an error status.
    Completion {
        /// Which side.
        side: &'static str,
        /// `ibv_wc_status_str` text.
        status: &'static str,
        /// Raw status.
        code: u32,
        /// Vendor syndrome.
        vendor_err: u32,
    },
    /// A completion had unexpected contents.
    Unexpected(String),
    /// No completion within the time limit.
    Timeout {
        /// Which side was still waiting.
        side: &'static str,
    },
    /// The destination differs from the source.
    Corrupt {
        /// First differing offset.
        first_bad: usize,
    },
}

impl std::fmt::Display for LoopbackError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoSuchDevice(name) => write!(f, "device {name} not found"),
            Self::Verbs(e) => e.fmt(f),
            Self::Completion {
                side,
                status,
                code,
                vendor_err,
            } => {
                write!(
                    f,
                    "{side} completion failed: {status} (status {code}, vendor error {vendor_err:#x})"
                )
            }
            Self::Unexpected(what) => f.write_str(what),
            Self::Timeout { side } => write!(f, "no {side} completion within the time limit"),
            Self::Corrupt { first_bad } => write!(
                f,
                "received data differs from sent data at byte {first_bad}"
            ),
        }
    }
}

impl std::error::Error for LoopbackError {}

impl From<VerbsError> for LoopbackError {
    fn from(e: VerbsError) -> Self {
        Self::Verbs(e)
    }
}

const IMM: u32 = 0x5256_4554; // "RVET"

/// Runs the loopback RDMA WRITE WITH IMM of `bytes` bytes on `port`, waiting at most `limit`.
pub fn loopback_write_imm(
    port: &PortInfo,
    bytes: usize,
    limit: Duration,
) -> Result<LoopbackReport, LoopbackError> {
    let len = u32::try_from(bytes)
        .map_err(|_| LoopbackError::Unexpected("size must fit in u32".into()))?;
    let list = DeviceList::new()?;
    let device = list
        .iter()
        .find(|d| d.name() == port.name)
        .ok_or(LoopbackError::NoSuchDevice(port.name.clone()))?;
    let context = device.open()?;
    drop(list);
    let pd = ProtectionDomain::new(&context)?;
    let send_cq = CompletionQueue::new(&context, 16)?;
    let recv_cq = CompletionQueue::new(&context, 16)?;
    let caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let sender = QueuePair::new_rc(&pd, &send_cq, &send_cq, caps)?;
    let receiver = QueuePair::new_rc(&pd, &recv_cq, &recv_cq, caps)?;

    let mut source: Vec<u8> = (0..bytes)
        .map(|i| (i as u8) ^ ((i >> 8) as u8).wrapping_mul(31))
        .collect();
    let mut target = vec![0u8; bytes];
    // SAFETY: both Vecs live until the end of this function, after the MRs are dropped (declared
    // later, so dropped earlier) and after every WR has completed or the QPs are destroyed.
    let source_mr =
        unsafe { MemoryRegion::register(&pd, source.as_mut_ptr(), bytes, access::LOCAL_WRITE) }?;
    // SAFETY: as above.
    let target_mr = unsafe {
        MemoryRegion::register(
            &pd,
            target.as_mut_ptr(),
            bytes,
            access::LOCAL_WRITE | access::REMOTE_WRITE,
        )
    }?;

    connect(&sender, &receiver, port)?;
    connect(&receiver, &sender, port)?;

    let start = Instant::now();
    let mut recv = [ibv_recv_wr {
        wr_id: 2,
        ..ibv_recv_wr::default()
    }];
    // SAFETY: a receive WR without SGEs (RDMA WRITE WITH IMM places no data in the RQ).
    unsafe { receiver.post_recv(&mut recv) }?;
    let mut sge = ibv_sge {
        addr: source_mr.addr(),
        length: len,
        lkey: source_mr.lkey(),
    };
    let mut send = [ibv_send_wr {
        wr_id: 1,
        sg_list: &mut sge,
        num_sge: 1,
        opcode: crate::sys::wr_opcode::RDMA_WRITE_WITH_IMM,
        send_flags: send_flags::SIGNALED,
        imm_data: IMM.to_be(),
        ..ibv_send_wr::default()
    }];
    send[0].wr.rdma = crate::sys::ibv_rdma_wr {
        remote_addr: target_mr.addr(),
        rkey: target_mr.rkey(),
    };
    // SAFETY: sge lives on this stack frame through the call and describes source_mr's memory, which
    // stays registered until the completion below is polled.
    unsafe { sender.post_send(&mut send) }?;

    let verbs = context.verbs();
    let sent = wait_one(&send_cq, "send", start, limit)?;
    check_wc(verbs, &sent, "send")?;
    if sent.opcode != wc_opcode::RDMA_WRITE || sent.wr_id != 1 {
        return Err(LoopbackError::Unexpected(format!(
            "send completion {sent:?}"
        )));
    }
    let got = wait_one(&recv_cq, "receive", start, limit)?;
    check_wc(verbs, &got, "receive")?;
    let elapsed = start.elapsed();
    if got.opcode != wc_opcode::RECV_RDMA_WITH_IMM
        || got.wr_id != 2
        || got.wc_flags & crate::sys::wc_flags::WITH_IMM == 0
        || u32::from_be(got.imm_data) != IMM
        || got.byte_len != len
    {
        return Err(LoopbackError::Unexpected(format!(
            "receive completion {got:?}"
        )));
    }
    let report = LoopbackReport {
        bytes,
        qp_nums: (sender.qp_num(), receiver.qp_num()),
        max_inline_data: sender.caps().max_inline_data,
        elapsed,
    };
    drop((sender, receiver, source_mr, target_mr));
    if let Some(first_bad) = source.iter().zip(&target).position(|(a, b)| a != b) {
        return Err(LoopbackError::Corrupt { first_bad });
    }
    Ok(report)
}

/// Brings `qp` to RTS towards `peer`, both on the same port.
fn connect(qp: &QueuePair, peer: &QueuePair, port: &PortInfo) -> Result<(), VerbsError> {
    qp.modify_to_init(port.port, 0, access::REMOTE_WRITE | access::REMOTE_READ)?;
    let sgid_index = u8::try_from(port.gid_index)
        .map_err(|_| VerbsError::InvalidArgument { what: "GID index" })?;
    qp.modify_to_rtr(&RtrParams {
        remote_qpn: peer.qp_num(),
        remote_psn: 0,
        path_mtu: port.active_mtu,
        dest_gid: ibv_gid { raw: port.gid },
        dest_lid: port.lid,
        sgid_index,
        is_global: port.link_layer == LinkLayer::Ethernet,
        port: port.port,
        ..RtrParams::default()
    })?;
    qp.modify_to_rts(&RtsParams::default())
}

fn wait_one(
    cq: &Arc<CompletionQueue>,
    side: &'static str,
    start: Instant,
    limit: Duration,
) -> Result<ibv_wc, LoopbackError> {
    let mut wc = [ibv_wc::default(); 1];
    loop {
        if cq.poll(&mut wc)? == 1 {
            return Ok(wc[0]);
        }
        if start.elapsed() > limit {
            return Err(LoopbackError::Timeout { side });
        }
        std::thread::yield_now();
    }
}

fn check_wc(
    verbs: &crate::loader::Verbs,
    wc: &ibv_wc,
    side: &'static str,
) -> Result<(), LoopbackError> {
    if wc.status == wc_status::SUCCESS {
        return Ok(());
    }
    Err(LoopbackError::Completion {
        side,
        status: verbs.wc_status_name(wc.status),
        code: wc.status,
        vendor_err: wc.vendor_err,
    })
}
