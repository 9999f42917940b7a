//! Reliable-connected queue pairs (`ibv_qp`): creation, the RESET → INIT → RTR → RTS transitions, and
//! posting work requests.
//!
//! Unsafe because it owns a raw `ibv_qp` (destroyed once, before its CQs and PD, which it keeps alive
//! through `Arc`s), and because posting hands caller-built work requests full of raw pointers to the
//! provider through `ops.post_send`/`ops.post_recv` (`static inline` in `verbs.h`, no symbol).
#![allow(unsafe_code)]

use core::ffi::c_int;
use core::mem::MaybeUninit;
use core::ptr::{self, NonNull};
use std::sync::Arc;

use crate::cq::CompletionQueue;
use crate::error::{VerbsError, check, errno_after_null};
use crate::pd::ProtectionDomain;
use crate::sys::{
    PostRecvFn, PostSendFn, ibv_ece, ibv_gid, ibv_qp, ibv_qp_attr, ibv_qp_cap, ibv_qp_init_attr,
    ibv_recv_wr, ibv_send_wr, qp_attr_mask as mask, qp_state, qp_type,
};

/// Queue sizes: requested on creation, granted values reported back by [`QueuePair::caps`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Inline bytes per send WR (the provider may grant more than asked).
    pub max_inline_data: u32,
}

impl From<QpCaps> for ibv_qp_cap {
    fn from(c: QpCaps) -> Self {
        Self {
            max_send_wr: c.max_send_wr,
            max_recv_wr: c.max_recv_wr,
            max_send_sge: c.max_send_sge,
            max_recv_sge: c.max_recv_sge,
            max_inline_data: c.max_inline_data,
        }
    }
}

impl From<ibv_qp_cap> for QpCaps {
    fn from(c: ibv_qp_cap) -> Self {
        Self {
            max_send_wr: c.max_send_wr,
            max_recv_wr: c.max_recv_wr,
            max_send_sge: c.max_send_sge,
            max_recv_sge: c.max_recv_sge,
            max_inline_data: c.max_inline_data,
        }
    }
}

/// What INIT → RTR needs: the peer's address and QP, and the path settings.
///
/// [`Default`] gives NCCL's choices for everything that is not peer-specific (reference
/// nccl-net-api §2.5): `min_rnr_timer` 12, `max_dest_rd_atomic` 1, `hop_limit` 255, MTU 1024.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtrParams {
    /// Peer QP number.
    pub remote_qpn: u32,
    /// Peer's initial send PSN (our receive PSN).
    pub remote_psn: u32,
    /// [`crate::sys::mtu`] code: the smaller of the two ports' `active_mtu`.
    pub path_mtu: u32,
    /// Peer GID (used when `is_global`; always on RoCE).
    pub dest_gid: ibv_gid,
    /// Peer LID (InfiniBand without GRH).
    pub dest_lid: u16,
    /// Our GID index.
    pub sgid_index: u8,
    /// Use a GRH: true on RoCE, and on IB across subnets or when the port requires it.
    pub is_global: bool,
    /// GRH traffic class.
    pub traffic_class: u8,
    /// GRH flow label.
    pub flow_label: u32,
    /// Service level.
    pub sl: u8,
    /// Our (local) port number for the address vector.
    pub port: u8,
    /// GRH hop limit.
    pub hop_limit: u8,
    /// RNR NAK timer code.
    pub min_rnr_timer: u8,
    /// Outstanding RDMA READ / atomics we serve.
    pub max_dest_rd_atomic: u8,
}

impl Default for RtrParams {
    fn default() -> Self {
        Self {
            remote_qpn: 0,
            remote_psn: 0,
            path_mtu: crate::sys::mtu::MTU_1024,
            dest_gid: ibv_gid::default(),
            dest_lid: 0,
            sgid_index: 0,
            is_global: false,
            traffic_class: 0,
            flow_label: 0,
            sl: 0,
            port: 1,
            hop_limit: 255,
            min_rnr_timer: 12,
            max_dest_rd_atomic: 1,
        }
    }
}

/// What RTR → RTS needs. [`Default`] is NCCL's: timeout 20, retry 7, RNR retry 7, PSN 0, 1 read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtsParams {
    /// Local ACK timeout code (4.096 µs × 2^timeout).
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries (7 = infinite).
    pub rnr_retry: u8,
    /// Our initial send PSN (the peer's `remote_psn`).
    pub sq_psn: u32,
    /// Outstanding RDMA READ / atomics we initiate.
    pub max_rd_atomic: u8,
}

impl Default for RtsParams {
    fn default() -> Self {
        Self {
            timeout: 20,
            retry_cnt: 7,
            rnr_retry: 7,
            sq_psn: 0,
            max_rd_atomic: 1,
        }
    }
}

impl RtrParams {
    /// The `ibv_modify_qp` attributes and mask of INIT → RTR (shared by every QP flavour).
    pub(crate) fn attr(&self) -> (ibv_qp_attr, i32) {
        let mut attr = ibv_qp_attr {
            qp_state: qp_state::RTR,
            path_mtu: self.path_mtu,
            dest_qp_num: self.remote_qpn,
            rq_psn: self.remote_psn,
            max_dest_rd_atomic: self.max_dest_rd_atomic,
            min_rnr_timer: self.min_rnr_timer,
            ..ibv_qp_attr::default()
        };
        attr.ah_attr.dlid = self.dest_lid;
        attr.ah_attr.sl = self.sl;
        attr.ah_attr.src_path_bits = 0;
        attr.ah_attr.port_num = self.port;
        if self.is_global {
            attr.ah_attr.is_global = 1;
            attr.ah_attr.grh.dgid = self.dest_gid;
            attr.ah_attr.grh.flow_label = self.flow_label;
            attr.ah_attr.grh.sgid_index = self.sgid_index;
            attr.ah_attr.grh.hop_limit = self.hop_limit;
            attr.ah_attr.grh.traffic_class = self.traffic_class;
        }
        let mask = mask::STATE
            | mask::AV
            | mask::PATH_MTU
            | mask::DEST_QPN
            | mask::RQ_PSN
            | mask::MAX_DEST_RD_ATOMIC
            | mask::MIN_RNR_TIMER;
        (attr, mask)
    }
}

impl RtsParams {
    /// The `ibv_modify_qp` attributes and mask of RTR → RTS (shared by every QP flavour).
    pub(crate) fn attr(&self) -> (ibv_qp_attr, i32) {
        let attr = ibv_qp_attr {
            qp_state: qp_state::RTS,
            timeout: self.timeout,
            retry_cnt: self.retry_cnt,
            rnr_retry: self.rnr_retry,
            sq_psn: self.sq_psn,
            max_rd_atomic: self.max_rd_atomic,
            ..ibv_qp_attr::default()
        };
        let mask = mask::STATE
            | mask::TIMEOUT
            | mask::RETRY_CNT
            | mask::RNR_RETRY
            | mask::SQ_PSN
            | mask::MAX_QP_RD_ATOMIC;
        (attr, mask)
    }
}

/// The state transitions of an RC queue pair, made the same way by every QP flavour
/// ([`QueuePair`], and the mlx5 direct path's `DirectQueuePair`).
///
/// # Safety
/// `raw_qp` must return a live QP of `protection_domain()`'s context for as long as `self` lives.
pub unsafe trait RcTransitions {
    /// The QP.
    fn raw_qp(&self) -> NonNull<ibv_qp>;
    /// The protection domain the QP was created in.
    fn protection_domain(&self) -> &Arc<ProtectionDomain>;

    /// `ibv_modify_qp` with `attr` read according to `attr_mask`.
    fn modify(&self, attr: &mut ibv_qp_attr, attr_mask: c_int) -> Result<(), VerbsError> {
        let verbs = self.protection_domain().context().verbs();
        // SAFETY: the trait's contract makes the QP live; attr is valid and read per attr_mask.
        check("ibv_modify_qp", unsafe {
            (verbs.modify_qp)(self.raw_qp().as_ptr(), attr, attr_mask)
        })
    }

    /// RESET → INIT on local `port`, with `pkey_index` and remote `access` rights
    /// ([`crate::sys::access`] bits, e.g. `REMOTE_WRITE | REMOTE_READ`).
    fn modify_to_init(&self, port: u8, pkey_index: u16, access: u32) -> Result<(), VerbsError> {
        let mut attr = ibv_qp_attr {
            qp_state: qp_state::INIT,
            pkey_index,
            port_num: port,
            qp_access_flags: access,
            ..ibv_qp_attr::default()
        };
        self.modify(
            &mut attr,
            mask::STATE | mask::PKEY_INDEX | mask::PORT | mask::ACCESS_FLAGS,
        )
    }

    /// INIT → RTR towards the peer described by `params`.
    fn modify_to_rtr(&self, params: &RtrParams) -> Result<(), VerbsError> {
        let (mut attr, mask) = params.attr();
        self.modify(&mut attr, mask)
    }

    /// RTR → RTS.
    fn modify_to_rts(&self, params: &RtsParams) -> Result<(), VerbsError> {
        let (mut attr, mask) = params.attr();
        self.modify(&mut attr, mask)
    }
}

// SAFETY: `ptr` is the QP this value created and destroys only in `Drop`; `pd` is its PD.
unsafe impl RcTransitions for QueuePair {
    fn raw_qp(&self) -> NonNull<ibv_qp> {
        self.ptr
    }
    fn protection_domain(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }
}

/// An RC queue pair; destroyed on drop, before the CQs and PD it keeps alive.
#[derive(Debug)]
pub struct QueuePair {
    ptr: NonNull<ibv_qp>,
    caps: QpCaps,
    post_send_fn: PostSendFn,
    post_recv_fn: PostRecvFn,
    // Dropped after the QP is destroyed (fields drop after Drop::drop).
    pd: Arc<ProtectionDomain>,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
}

// SAFETY: libibverbs QPs may be used from several threads (providers lock each queue); the handle
// and cached fields are immutable.
unsafe impl Send for QueuePair {}
// SAFETY: as above.
unsafe impl Sync for QueuePair {}

impl QueuePair {
    /// `ibv_create_qp`: an RC QP with `sq_sig_all = 0` (only WRs with `SIGNALED` complete).
    ///
    /// The CQs must belong to the PD's context.
    pub fn new_rc(
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        caps: QpCaps,
    ) -> Result<Self, VerbsError> {
        let context = pd.context();
        if !Arc::ptr_eq(send_cq.context(), context) || !Arc::ptr_eq(recv_cq.context(), context) {
            return Err(VerbsError::InvalidArgument {
                what: "CQs and PD belong to different contexts",
            });
        }
        // SAFETY: live context; ops are fixed after open.
        let ops = unsafe { (*context.as_ptr()).ops };
        let post_send_fn = ops.post_send.ok_or(VerbsError::Unsupported {
            what: "ops.post_send",
        })?;
        let post_recv_fn = ops.post_recv.ok_or(VerbsError::Unsupported {
            what: "ops.post_recv",
        })?;
        let mut attr = ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: send_cq.as_ptr(),
            recv_cq: recv_cq.as_ptr(),
            srq: ptr::null_mut(),
            cap: caps.into(),
            qp_type: qp_type::RC,
            sq_sig_all: 0,
        };
        // SAFETY: live PD and CQs of one context; attr is a valid in/out struct.
        let raw = unsafe { (context.verbs().create_qp)(pd.as_ptr(), &mut attr) };
        let ptr = NonNull::new(raw).ok_or(VerbsError::Call {
            call: "ibv_create_qp",
            errno: errno_after_null(),
        })?;
        Ok(Self {
            ptr,
            caps: attr.cap.into(),
            post_send_fn,
            post_recv_fn,
            pd: Arc::clone(pd),
            send_cq: Arc::clone(send_cq),
            recv_cq: Arc::clone(recv_cq),
        })
    }

    /// The QP number to give the peer.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: live QP; qp_num is immutable.
        unsafe { (*self.ptr.as_ptr()).qp_num }
    }

    /// Capacities granted by the provider (including the real `max_inline_data`).
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    /// The PD.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// The send CQ.
    pub fn send_cq(&self) -> &Arc<CompletionQueue> {
        &self.send_cq
    }

    /// The receive CQ.
    pub fn recv_cq(&self) -> &Arc<CompletionQueue> {
        &self.recv_cq
    }

    /// The raw QP (for mlx5dv); valid while `self` lives.
    pub fn as_ptr(&self) -> *mut ibv_qp {
        self.ptr.as_ptr()
    }

    /// Any state → ERR: outstanding WRs complete with `WR_FLUSH_ERR`.
    pub fn modify_to_error(&self) -> Result<(), VerbsError> {
        let mut attr = ibv_qp_attr {
            qp_state: qp_state::ERR,
            ..ibv_qp_attr::default()
        };
        self.modify(&mut attr, mask::STATE)
    }

    /// The current state ([`crate::sys::qp_state`]) from `ibv_query_qp`.
    pub fn state(&self) -> Result<u32, VerbsError> {
        let mut attr = ibv_qp_attr::default();
        let mut init = ibv_qp_init_attr::default();
        let verbs = self.pd.context().verbs();
        // SAFETY: live QP; valid out-structs.
        check("ibv_query_qp", unsafe {
            (verbs.query_qp)(self.ptr.as_ptr(), &mut attr, mask::STATE, &mut init)
        })?;
        Ok(attr.qp_state)
    }

    /// `ibv_query_ece`: this QP's enhanced-connection-establishment options.
    pub fn query_ece(&self) -> Result<ibv_ece, VerbsError> {
        let query = self
            .pd
            .context()
            .verbs()
            .query_ece
            .ok_or(VerbsError::Unsupported {
                what: "ibv_query_ece",
            })?;
        let mut ece = ibv_ece::default();
        // SAFETY: live QP, valid out-pointer.
        check("ibv_query_ece", unsafe {
            query(self.ptr.as_ptr(), &mut ece)
        })?;
        Ok(ece)
    }

    /// `ibv_set_ece`: options agreed with the peer (before RTR).
    pub fn set_ece(&self, ece: &ibv_ece) -> Result<(), VerbsError> {
        let set = self
            .pd
            .context()
            .verbs()
            .set_ece
            .ok_or(VerbsError::Unsupported {
                what: "ibv_set_ece",
            })?;
        let mut ece = *ece;
        // SAFETY: live QP, valid pointer (the library only reads it).
        check("ibv_set_ece", unsafe { set(self.ptr.as_ptr(), &mut ece) })
    }

    /// Posts `wrs` as one chain: each WR's `next` is overwritten to point at the following element
    /// (the last at null), so no allocation is needed. An empty slice posts nothing.
    ///
    /// On error, WRs before `bad_index` were posted and the rest were not.
    ///
    /// # Safety
    /// For the duration of the call every `sg_list` must point at `num_sge` valid `ibv_sge`s. Each
    /// SGE must lie in memory registered on this QP's PD with that `lkey` (or, with `INLINE`, be
    /// readable memory of at most `caps().max_inline_data` bytes in total), and non-inline buffers must
    /// stay valid until the WR's completion (or the completion of a later signaled WR) is polled.
    /// Remote addresses and keys are checked by the hardware.
    #[inline]
    pub unsafe fn post_send(&self, wrs: &mut [ibv_send_wr]) -> Result<(), VerbsError> {
        let Some(first) = link_chain(wrs, |wr, next| wr.next = next) else {
            return Ok(());
        };
        let mut bad: *mut ibv_send_wr = ptr::null_mut();
        // SAFETY: live QP of this provider; the chain is well-formed and lives in `wrs` (caller's
        // contract covers what the WRs point at).
        let ret = unsafe { (self.post_send_fn)(self.ptr.as_ptr(), first, &mut bad) };
        if ret == 0 {
            return Ok(());
        }
        Err(post_error("ibv_post_send", ret, index_of(wrs, bad)))
    }

    /// Posts receive WRs as one chain, linking `next` like [`Self::post_send`].
    ///
    /// # Safety
    /// For the duration of the call every `sg_list` must point at `num_sge` valid `ibv_sge`s (or be
    /// null with `num_sge == 0`), and each SGE's memory must be registered on this QP's PD and stay
    /// valid until its completion is polled.
    #[inline]
    pub unsafe fn post_recv(&self, wrs: &mut [ibv_recv_wr]) -> Result<(), VerbsError> {
        let Some(first) = link_chain(wrs, |wr, next| wr.next = next) else {
            return Ok(());
        };
        let mut bad: *mut ibv_recv_wr = ptr::null_mut();
        // SAFETY: as for post_send.
        let ret = unsafe { (self.post_recv_fn)(self.ptr.as_ptr(), first, &mut bad) };
        if ret == 0 {
            return Ok(());
        }
        Err(post_error("ibv_post_recv", ret, index_of(wrs, bad)))
    }
}

impl QueuePair {
    /// Posts the one work request `wr`: [`Self::post_send`] without the chain. A failure reports
    /// `bad_index` 0, the only request, which was not posted.
    ///
    /// # Safety
    /// As for [`Self::post_send`], and `wr.next` must be null (the provider walks it): a caller
    /// that keeps a request to post again leaves it null once, not at every post.
    #[inline]
    pub unsafe fn post_send_one(&self, wr: &mut ibv_send_wr) -> Result<(), VerbsError> {
        debug_assert!(wr.next.is_null(), "post_send_one posts a chain of one");
        // Written by the provider on failure only, and not read: the request is the first.
        let mut bad = MaybeUninit::<*mut ibv_send_wr>::uninit();
        // SAFETY: live QP of this provider; a chain of one (`next` null, and the caller's
        // contract covers what the WR points at); `bad` is writable.
        let ret = unsafe { (self.post_send_fn)(self.ptr.as_ptr(), wr, bad.as_mut_ptr()) };
        if ret == 0 {
            return Ok(());
        }
        Err(post_error("ibv_post_send", ret, Some(0)))
    }

    /// Posts the one receive work request `wr`, like [`Self::post_send_one`].
    ///
    /// # Safety
    /// As for [`Self::post_recv`], and `wr.next` must be null.
    #[inline]
    pub unsafe fn post_recv_one(&self, wr: &mut ibv_recv_wr) -> Result<(), VerbsError> {
        debug_assert!(wr.next.is_null(), "post_recv_one posts a chain of one");
        // As in post_send_one: written on failure only, not read.
        let mut bad = MaybeUninit::<*mut ibv_recv_wr>::uninit();
        // SAFETY: as for post_send_one.
        let ret = unsafe { (self.post_recv_fn)(self.ptr.as_ptr(), wr, bad.as_mut_ptr()) };
        if ret == 0 {
            return Ok(());
        }
        Err(post_error("ibv_post_recv", ret, Some(0)))
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: created by us and destroyed exactly once, before the Arcs to the CQs and PD drop.
        // Outstanding async events for the QP must be acked first (AsyncEvent acks on drop).
        unsafe { (self.pd.context().verbs().destroy_qp)(self.ptr.as_ptr()) };
    }
}

/// The error of a failed post (out of line: the data path inlines the posts, not their failure).
#[cold]
#[inline(never)]
fn post_error(call: &'static str, ret: c_int, bad_index: Option<usize>) -> VerbsError {
    VerbsError::Post {
        call,
        errno: post_errno(ret),
        bad_index,
    }
}

/// Links `items[i].next = &items[i+1]` (last → null) and returns the head, or `None` if empty.
#[inline]
fn link_chain<T>(items: &mut [T], mut set_next: impl FnMut(&mut T, *mut T)) -> Option<*mut T> {
    let len = items.len();
    if len == 0 {
        return None;
    }
    let base = items.as_mut_ptr();
    for (i, item) in items.iter_mut().enumerate() {
        // wrapping_add keeps this free of unsafe; i + 1 <= len stays inside or one past the slice.
        let next = if i + 1 < len {
            base.wrapping_add(i + 1)
        } else {
            ptr::null_mut()
        };
        set_next(item, next);
    }
    Some(base)
}

/// Position of `bad` in `items`, if it points at one of them.
#[inline]
fn index_of<T>(items: &[T], bad: *const T) -> Option<usize> {
    let start = items.as_ptr() as usize;
    let offset = (bad as usize).checked_sub(start)?;
    let index = offset / size_of::<T>();
    (offset % size_of::<T>() == 0 && index < items.len()).then_some(index)
}

/// Providers return the errno directly (positive) or -1 with errno set.
fn post_errno(ret: c_int) -> i32 {
    if ret > 0 {
        ret
    } else {
        crate::error::last_errno().max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_chain_links_in_order_and_terminates() {
        let mut wrs = [ibv_send_wr::default(); 3];
        for (i, wr) in wrs.iter_mut().enumerate() {
            wr.wr_id = i as u64;
            wr.next = NonNull::dangling().as_ptr();
        }
        let head = link_chain(&mut wrs, |wr, next| wr.next = next).unwrap();
        assert_eq!(head, wrs.as_mut_ptr());
        let base = wrs.as_mut_ptr();
        assert_eq!(wrs[0].next, base.wrapping_add(1));
        assert_eq!(wrs[1].next, base.wrapping_add(2));
        assert!(wrs[2].next.is_null());
        assert!(link_chain(&mut [] as &mut [ibv_recv_wr], |wr, next| wr.next = next).is_none());
    }

    #[test]
    fn index_of_finds_members_only() {
        let wrs = [ibv_recv_wr::default(); 4];
        assert_eq!(index_of(&wrs, &wrs[2]), Some(2));
        assert_eq!(index_of(&wrs, ptr::null()), None);
        assert_eq!(index_of(&wrs, wrs.as_ptr().wrapping_add(4)), None);
        assert_eq!(
            index_of(&wrs, (wrs.as_ptr() as usize + 1) as *const ibv_recv_wr),
            None
        );
    }

    #[test]
    fn defaults_follow_nccl() {
        let rts = RtsParams::default();
        assert_eq!(
            (rts.timeout, rts.retry_cnt, rts.rnr_retry, rts.max_rd_atomic),
            (20, 7, 7, 1)
        );
        let rtr = RtrParams::default();
        assert_eq!(
            (rtr.hop_limit, rtr.min_rnr_timer, rtr.max_dest_rd_atomic),
            (255, 12, 1)
        );
    }

    #[test]
    fn caps_round_trip_through_the_c_struct() {
        let caps = QpCaps {
            max_send_wr: 512,
            max_recv_wr: 256,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 64,
        };
        assert_eq!(QpCaps::from(ibv_qp_cap::from(caps)), caps);
    }
}
