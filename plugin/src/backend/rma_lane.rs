//! The queue pairs of an RMA context (`ncclRmaPlugin`'s `createContext`): one RC queue pair per
//! (context index, peer) — a *lane* — all completing into one completion queue, and a small
//! landing region for what atomics and flush reads return (nobody reads it).
//!
//! The lanes post what `rivet_core::rma` planned, nothing else: RDMA WRITEs (inline or from a
//! registered window), a 64-bit fetch-and-add, RDMA READs; only an operation's last work request
//! is signaled. They are libibverbs queue pairs on both data paths (the mlx5 direct path only
//! replaces how a p2p connection's queue pair posts).
//!
//! Unsafe (opted in): posting hands the NIC local addresses (a window NCCL registered, checked by
//! the core against the registration; inline bytes the CPU copies from host memory NCCL
//! registered; this module's landing region) and remote ones (checked by the core against the
//! peer's window; the peer's NIC checks them against its key).

#![allow(unsafe_code)]

use super::device::OpenPort;
use super::endpoint::region::Region;
use super::port_device::PortDevice;
use super::qp_params;
use crate::config::QpSettings;
use rivet_core::nic::WcStatus;
use rivet_core::rma::{LANE_QUEUE_DEPTH, Plan, RequestId};
use rivet_core::wire::EndpointInfo;
use rivet_verbs_ffi::sys::{
    access, ibv_atomic_wr, ibv_rdma_wr, ibv_send_wr, ibv_send_wr_wr, ibv_sge, ibv_wc, send_flags,
    wr_opcode,
};
use rivet_verbs_ffi::{CompletionQueue, QpCaps, QueuePair, RcTransitions, VerbsError};
use std::mem::MaybeUninit;
use std::sync::Arc;

/// Inline sizes tried when creating a lane, largest first.
const INLINE_CHOICES: [u32; 3] = [256, 64, 0];
/// Outstanding RDMA READs and atomics per lane, each way (fewer where the device refuses).
const RD_ATOMIC: u8 = 16;
/// Completions polled per call.
pub(crate) const MAX_POLL: usize = 32;

/// The completion queue and landing region every lane of one RMA context shares.
#[derive(Debug)]
pub(crate) struct LaneShared {
    cq: Arc<CompletionQueue>,
    landing: Region,
}

impl LaneShared {
    /// A completion queue of `depth` entries on `port`, and the landing region.
    pub(crate) fn new<D: PortDevice>(
        port: &Arc<OpenPort<D>>,
        depth: u32,
    ) -> Result<Self, VerbsError> {
        let verbs = port.device.verbs();
        let cq = CompletionQueue::new(&verbs.context, depth)?;
        let landing = Region::new(&verbs.pd, 16, access::LOCAL_WRITE)?;
        Ok(Self { cq, landing })
    }

    /// The completion queue's depth (the provider may round it up).
    pub(crate) fn depth(&self) -> u32 {
        self.cq.capacity()
    }

    /// Poll completions into `out` as (wr_id, status); how many.
    pub(crate) fn poll(&self, out: &mut [(u64, WcStatus); MAX_POLL]) -> Result<usize, i32> {
        let mut wcs = [MaybeUninit::<ibv_wc>::uninit(); MAX_POLL];
        let polled = self
            .cq
            .poll_into(&mut wcs)
            .map_err(|e| e.errno().unwrap_or(libc::EIO))?;
        for (slot, wc) in out.iter_mut().zip(polled) {
            *slot = (wc.wr_id, WcStatus(wc.status));
        }
        Ok(polled.len())
    }
}

/// One lane's queue pair.
#[derive(Debug)]
pub(crate) struct Lane {
    qp: QueuePair,
    psn: u32,
    max_inline: u32,
}

impl Lane {
    /// Create the queue pair (at INIT) on `port`, completing into `shared`'s queue.
    pub(crate) fn new<D: PortDevice>(
        port: &Arc<OpenPort<D>>,
        shared: &LaneShared,
    ) -> Result<Self, VerbsError> {
        let verbs = port.device.verbs();
        let mut last = None;
        for inline in INLINE_CHOICES {
            let caps = QpCaps {
                max_send_wr: LANE_QUEUE_DEPTH,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: inline,
            };
            match QueuePair::new_rc(&verbs.pd, &shared.cq, &shared.cq, caps) {
                Ok(qp) => {
                    qp.modify_to_init(
                        port.info.port,
                        0,
                        access::LOCAL_WRITE
                            | access::REMOTE_WRITE
                            | access::REMOTE_READ
                            | access::REMOTE_ATOMIC,
                    )?;
                    let max_inline = qp.caps().max_inline_data;
                    return Ok(Self {
                        qp,
                        psn: qp_params::random_psn(),
                        max_inline,
                    });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or(VerbsError::InvalidArgument {
            what: "no QP configuration accepted",
        }))
    }

    /// What the peer needs to connect its lane to this one.
    pub(crate) fn local_info<D: PortDevice>(
        &self,
        port: &OpenPort<D>,
        shared: &LaneShared,
        settings: &QpSettings,
    ) -> EndpointInfo {
        qp_params::endpoint_info(
            &port.info,
            self.qp.qp_num(),
            self.psn,
            &shared.landing,
            settings,
        )
    }

    /// Move to RTR and RTS towards `remote` (this lane's own description for the lane to the own
    /// rank), with several reads and atomics outstanding where the device allows.
    pub(crate) fn connect<D: PortDevice>(
        &self,
        port: &OpenPort<D>,
        remote: &EndpointInfo,
        settings: &QpSettings,
    ) -> Result<(), VerbsError> {
        let mut rtr = qp_params::rtr(&port.info, remote, settings);
        rtr.max_dest_rd_atomic = RD_ATOMIC;
        if self.qp.modify_to_rtr(&rtr).is_err() {
            rtr.max_dest_rd_atomic = 1;
            self.qp.modify_to_rtr(&rtr)?;
        }
        let mut rts = qp_params::rts(settings, self.psn);
        rts.max_rd_atomic = RD_ATOMIC;
        if self.qp.modify_to_rts(&rts).is_err() {
            rts.max_rd_atomic = 1;
            self.qp.modify_to_rts(&rts)?;
        }
        Ok(())
    }

    /// Bytes a put may carry inline.
    pub(crate) fn max_inline(&self) -> u32 {
        self.max_inline
    }

    /// The queue pair number (for log lines).
    pub(crate) fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }

    /// Post `plan` for request `id`: its work requests in order, the last one signaled. An
    /// errno when the provider refused (nothing of a refused chain was posted past the refused
    /// request; the core withdraws the request).
    pub(crate) fn post(&self, shared: &LaneShared, id: RequestId, plan: &Plan) -> Result<(), i32> {
        // Most operations are one or two work requests (a put, a put and its signal): built in
        // line with exactly as many on the stack; longer ones out of line.
        match plan.work_requests() {
            0 | 1 => self.post_in::<1>(shared, id, plan),
            2 => self.post_in::<2>(shared, id, plan),
            _ => self.post_long(shared, id, plan),
        }
    }

    /// Operations of three or more work requests (transfers over 1 GiB): out of line, posted
    /// two at a time ([`Chain`]).
    #[inline(never)]
    fn post_long(&self, shared: &LaneShared, id: RequestId, plan: &Plan) -> Result<(), i32> {
        let mut chain = Chain::new(self, id);
        each_work_request(plan, shared, |sge, opcode, flags, wr| {
            chain.push(sge, opcode, flags, wr)
        })?;
        chain.finish()
    }

    /// Post an operation of at most `N` work requests in one chain.
    #[inline(always)]
    fn post_in<const N: usize>(
        &self,
        shared: &LaneShared,
        id: RequestId,
        plan: &Plan,
    ) -> Result<(), i32> {
        let mut sges = [ibv_sge::default(); N];
        let mut wrs = [ibv_send_wr::default(); N];
        let mut n = 0;
        each_work_request(plan, shared, |sge, opcode, flags, wr| {
            if n == N {
                return Err(libc::E2BIG);
            }
            sges[n] = sge;
            wrs[n] = work_request(id, sge, opcode, flags, wr);
            n += 1;
            Ok(())
        })?;
        if n == 0 {
            return Ok(());
        }
        // The last request is the signaled one, with the request's own wr_id; `post_send` links
        // the chain.
        for (wr, sge) in wrs.iter_mut().zip(sges.iter_mut()).take(n) {
            wr.sg_list = sge;
        }
        let last = &mut wrs[n - 1];
        last.wr_id = id.wr_id();
        last.send_flags |= send_flags::SIGNALED;
        // SAFETY: as in `Chain::post`: every SGE is inline host bytes of a registered window,
        // registered window memory (both checked by the core), or the landing region; remote
        // addresses were checked against the peer's window and are checked again by its NIC.
        // `wrs` and `sges` outlive the call.
        unsafe { self.qp.post_send(&mut wrs[..n]) }.map_err(|e| e.errno().unwrap_or(libc::EINVAL))
    }

    /// Move the queue pair to the error state (every outstanding request completes flushed).
    pub(crate) fn fail(&self) {
        let _ = self.qp.modify_to_error();
    }
}

/// Hand `f` the work requests of `plan` in order, each as (scatter entry, opcode, flags, remote
/// part): the writes or reads of its transfer's pieces, a flush's 1-byte read, then a signal's
/// fetch-and-add. The one translation of a plan into verbs; the posts differ only in how they
/// batch.
#[inline(always)]
fn each_work_request(
    plan: &Plan,
    shared: &LaneShared,
    mut f: impl FnMut(ibv_sge, u32, u32, ibv_send_wr_wr) -> Result<(), i32>,
) -> Result<(), i32> {
    let rdma = |remote_addr, rkey| ibv_send_wr_wr {
        rdma: ibv_rdma_wr { remote_addr, rkey },
    };
    match *plan {
        Plan::Nothing => return Ok(()),
        Plan::Put(t) | Plan::PutSignal(Some(t), _) => {
            let inline = if t.inline { send_flags::INLINE } else { 0 };
            for p in t.pieces() {
                let sge = ibv_sge {
                    addr: p.local,
                    length: p.len,
                    lkey: if t.inline { 0 } else { t.lkey },
                };
                f(sge, wr_opcode::RDMA_WRITE, inline, rdma(p.remote, t.rkey))?;
            }
        }
        Plan::Get(t) => {
            for p in t.pieces() {
                let sge = ibv_sge {
                    addr: p.local,
                    length: p.len,
                    lkey: t.lkey,
                };
                f(sge, wr_opcode::RDMA_READ, 0, rdma(p.remote, t.rkey))?;
            }
        }
        Plan::PutSignal(None, _) => {}
        Plan::FlushRead { remote, rkey } => {
            let sge = ibv_sge {
                addr: shared.landing.addr() + 8,
                length: 1,
                lkey: shared.landing.lkey(),
            };
            f(sge, wr_opcode::RDMA_READ, 0, rdma(remote, rkey))?;
        }
    }
    if let Plan::PutSignal(_, s) = *plan {
        let sge = ibv_sge {
            addr: shared.landing.addr(),
            length: 8,
            lkey: shared.landing.lkey(),
        };
        let atomic = ibv_send_wr_wr {
            atomic: ibv_atomic_wr {
                remote_addr: s.remote,
                compare_add: s.add,
                swap: 0,
                rkey: s.rkey,
            },
        };
        f(sge, wr_opcode::ATOMIC_FETCH_AND_ADD, 0, atomic)?;
    }
    Ok(())
}

/// One unsignaled work request of request `id` (its piece mark in the `wr_id`; the last of an
/// operation is made signaled, with the request's own `wr_id`, when posted).
#[inline(always)]
fn work_request(
    id: RequestId,
    sge: ibv_sge,
    opcode: u32,
    flags: u32,
    wr: ibv_send_wr_wr,
) -> ibv_send_wr {
    ibv_send_wr {
        wr_id: id.piece_wr_id(),
        num_sge: i32::from(sge.length > 0),
        opcode,
        send_flags: flags,
        wr,
        ..ibv_send_wr::default()
    }
}

/// The work requests of one operation, posted two at a time: most operations are one or two (a
/// put, a put and its signal) and go in one post; the pieces of a transfer over 2 GiB go in
/// several, which RC keeps in order on the queue pair. Only the last is signaled, with the
/// request's own `wr_id`; the others carry its piece mark.
struct Chain<'a> {
    lane: &'a Lane,
    id: RequestId,
    wrs: [ibv_send_wr; 2],
    sges: [ibv_sge; 2],
    n: usize,
}

impl<'a> Chain<'a> {
    #[inline(always)]
    fn new(lane: &'a Lane, id: RequestId) -> Self {
        Self {
            lane,
            id,
            wrs: [ibv_send_wr::default(); 2],
            sges: [ibv_sge::default(); 2],
            n: 0,
        }
    }

    /// Add a work request; post the two before it first when the chain is full (they are not the
    /// operation's last).
    #[inline(always)]
    fn push(
        &mut self,
        sge: ibv_sge,
        opcode: u32,
        flags: u32,
        wr: ibv_send_wr_wr,
    ) -> Result<(), i32> {
        if self.n == self.wrs.len() {
            self.post()?;
        }
        self.sges[self.n] = sge;
        self.wrs[self.n] = work_request(self.id, sge, opcode, flags, wr);
        self.n += 1;
        Ok(())
    }

    /// Post the last ones, the last of all signaled.
    #[inline(always)]
    fn finish(mut self) -> Result<(), i32> {
        let Some(last) = self.n.checked_sub(1) else {
            return Ok(());
        };
        let wr = &mut self.wrs[last];
        wr.wr_id = self.id.wr_id();
        wr.send_flags |= send_flags::SIGNALED;
        self.post()
    }

    #[inline(always)]
    fn post(&mut self) -> Result<(), i32> {
        let n = core::mem::take(&mut self.n);
        for (wr, sge) in self.wrs.iter_mut().zip(self.sges.iter_mut()).take(n) {
            wr.sg_list = sge;
        }
        // SAFETY: every SGE is either inline host bytes of a window NCCL registered and keeps
        // mapped (the core checked the range against the registration), registered window memory
        // (checked likewise; the NIC checks the key), or this context's landing region; remote
        // addresses were checked against the peer's window and are checked again by its NIC.
        // `wrs` and `sges` outlive the call.
        unsafe { self.lane.qp.post_send(&mut self.wrs[..n]) }
            .map_err(|e| e.errno().unwrap_or(libc::EINVAL))
    }
}
