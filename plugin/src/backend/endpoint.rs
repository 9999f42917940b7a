//! One connection's RC queue pair, completion queue and control regions, driven by the core
//! through the [`Nic`] trait.
//!
//! Unsafe: posting work requests hands raw addresses (control regions, user buffers, inline
//! bytes) to the NIC; each is checked against the region it must lie in first. The endpoint's
//! send template holds raw pointers, so its `Send`/`Sync` are asserted by hand.
//!
//! Two inline modules complete the backend's part of the data path in this one file: [`region`]
//! (the registered control regions both endpoints read and write) and [`any`] (the dispatch
//! between the mlx5 direct endpoint and this one, chosen per port).

#![allow(unsafe_code)]

use super::device::OpenPort;
use super::port_device::{PortDevice, VerbsDevice};
use super::qp_params;
use crate::config::QpSettings;
use region::Region;
use rivet_core::data::classify;
use rivet_core::nic::{
    Completion, Nic, NicError, Payload, RawCompletion, RawOp, SendOp, SendWr, WcStatus,
};
use rivet_core::wire::EndpointInfo;
use rivet_verbs_ffi::sys::{
    access, ibv_rdma_wr, ibv_recv_wr, ibv_send_wr, ibv_send_wr_wr, ibv_sge, ibv_wc, send_flags,
    wc_opcode, wr_opcode,
};
use rivet_verbs_ffi::{CompletionQueue, QpCaps, QueuePair, RcTransitions, VerbsError};
use std::mem::MaybeUninit;
use std::sync::Arc;

/// Which end of a connection an endpoint serves; it decides region sizes and queue depths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// `connect` side: inbound CTS FIFO, no receives.
    Sender,
    /// `accept` side: inbound completion records, one receive per outstanding slot.
    Receiver,
    /// A sender that takes part in the eager path (`rivet_core::data::eager`): the credit word
    /// after its FIFO, the ring's staging copy after its records' staging.
    EagerSender,
    /// A receiver that takes eager messages: the ring after its records, the credit word's
    /// staging after its entries'.
    EagerReceiver,
}

impl Role {
    /// Inbound and staging region lengths and receive-queue depth (both data paths size their
    /// endpoints by it).
    pub(crate) fn regions(self) -> (usize, usize, u32) {
        use rivet_core::data::eager::{
            RECV_INBOUND_EAGER_LEN, RECV_STAGING_EAGER_LEN, SEND_INBOUND_EAGER_LEN,
            SEND_STAGING_EAGER_LEN,
        };
        use rivet_core::data::{
            RECV_INBOUND_LEN, RECV_QUEUE_DEPTH, RECV_STAGING_LEN, SEND_INBOUND_LEN,
            SEND_STAGING_LEN,
        };
        let depth = RECV_QUEUE_DEPTH as u32;
        match self {
            Self::Sender => (SEND_INBOUND_LEN, SEND_STAGING_LEN, 1),
            Self::Receiver => (RECV_INBOUND_LEN, RECV_STAGING_LEN, depth),
            Self::EagerSender => (SEND_INBOUND_EAGER_LEN, SEND_STAGING_EAGER_LEN, 1),
            Self::EagerReceiver => (RECV_INBOUND_EAGER_LEN, RECV_STAGING_EAGER_LEN, depth),
        }
    }

    /// The role of a sender (`receiver` false) or receiver, with the eager path's regions or not.
    pub(crate) fn of(receiver: bool, eager: bool) -> Self {
        match (receiver, eager) {
            (false, false) => Self::Sender,
            (true, false) => Self::Receiver,
            (false, true) => Self::EagerSender,
            (true, true) => Self::EagerReceiver,
        }
    }
}

/// Largest chain posted with one `ibv_post_send` (the core's chains are shorter; longer ones are
/// posted in pieces, which RC orders the same way).
const MAX_CHAIN: usize = 16;
/// Most completions polled per call.
const MAX_POLL: usize = 16;
/// The control regions' access: the peer writes the inbound one; the staging one is only read by
/// this end's NIC.
const INBOUND_ACCESS: u32 = access::LOCAL_WRITE | access::REMOTE_WRITE;
const STAGING_ACCESS: u32 = access::LOCAL_WRITE;
/// Inline sizes tried when creating the QP, largest first (providers refuse what they cannot do).
const INLINE_CHOICES: [u32; 3] = [256, 64, 0];

/// A connection's queue pair and regions, on a port of device `D`.
#[derive(Debug)]
pub(crate) struct Endpoint<D: PortDevice = VerbsDevice> {
    // Field order is drop order: the QP goes before its CQ and the regions it may still address.
    qp: QueuePair,
    cq: Arc<CompletionQueue>,
    inbound: Region,
    staging: Region,
    max_inline: usize,
    posts: Box<Templates>,
    port: Arc<OpenPort<D>>,
    psn: u32,
}

/// The work requests of one-request posts, kept in the endpoint and initialised once (zeroed):
/// a post writes only the fields that change (the rest of the 128-byte `ibv_send_wr` stays zero,
/// `next` included, as the one-request posts require), instead of building a whole request on
/// the stack. Boxed: it would more than double the
/// endpoint (and the enums holding it).
#[derive(Debug, Default)]
struct Templates {
    /// A send request and its one scatter entry.
    send: ibv_send_wr,
    sge: ibv_sge,
    /// An empty receive (no scatter entry): only `wr_id` changes.
    recv: ibv_recv_wr,
}

// SAFETY: the raw pointers in the templates (`next`, `sg_list`) are written by each post, under
// `&mut Endpoint`, just before the request is handed to the provider, and are read by nobody
// else; between posts no one dereferences them.
unsafe impl Send for Templates {}
// SAFETY: as above; a shared reference never reads through them.
unsafe impl Sync for Templates {}

impl<D: PortDevice> Endpoint<D> {
    /// Create the queue pair (at INIT) and register the control regions for `role`.
    pub(crate) fn new(port: &Arc<OpenPort<D>>, role: Role) -> Result<Self, VerbsError> {
        let (inbound_len, staging_len, recv_depth) = role.regions();
        let verbs = port.device.verbs();
        let inbound = Region::new(&verbs.pd, inbound_len, INBOUND_ACCESS)?;
        let staging = Region::new(&verbs.pd, staging_len, STAGING_ACCESS)?;
        let (qp, cq) = Self::queue_pair(port, recv_depth)?;
        Ok(Self {
            max_inline: qp.caps().max_inline_data as usize,
            qp,
            cq,
            inbound,
            staging,
            posts: Box::default(),
            port: Arc::clone(port),
            psn: qp_params::random_psn(),
        })
    }

    /// A completion queue and a queue pair on `port`, at INIT, with the largest inline size the
    /// provider accepts.
    fn queue_pair(
        port: &Arc<OpenPort<D>>,
        recv_depth: u32,
    ) -> Result<(QueuePair, Arc<CompletionQueue>), VerbsError> {
        use rivet_core::data::{CQ_DEPTH, SEND_QUEUE_DEPTH};
        let verbs = port.device.verbs();
        let cq = CompletionQueue::new(&verbs.context, CQ_DEPTH as u32)?;
        let mut last_err = None;
        for inline in INLINE_CHOICES {
            let caps = QpCaps {
                max_send_wr: SEND_QUEUE_DEPTH as u32,
                max_recv_wr: recv_depth,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: inline,
            };
            match QueuePair::new_rc(&verbs.pd, &cq, &cq, caps) {
                Ok(qp) => {
                    qp.modify_to_init(
                        port.info.port,
                        0,
                        access::LOCAL_WRITE | access::REMOTE_WRITE,
                    )?;
                    return Ok((qp, cq));
                }
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or(VerbsError::InvalidArgument {
            what: "no QP configuration accepted",
        }))
    }

    /// Port failover (issue #39): move the queue pair to the error state (nothing more lands
    /// through it; what is posted flushes).
    #[cfg_attr(not(feature = "failover"), allow(dead_code))]
    pub(crate) fn fail_queue_pair(&self) -> Result<(), VerbsError> {
        self.qp.modify_to_error()
    }

    /// Port failover (issue #39): a new queue pair and completion queue on `port` (the queue
    /// pair at INIT, to be connected like a new one), in place of this endpoint's failed ones,
    /// which are destroyed. The control regions stay, with their contents (the lane's state).
    /// On another port of the same device ([`OpenPort::same_domain`]) their keys stay too; on a
    /// port of another device they are registered in its protection domain anew (new keys, which
    /// [`local_info`](Self::local_info) then carries to the peer). `role` is the endpoint's, as
    /// at creation.
    #[cfg_attr(not(feature = "failover"), allow(dead_code))]
    pub(crate) fn move_to(
        &mut self,
        port: &Arc<OpenPort<D>>,
        role: Role,
    ) -> Result<(), VerbsError> {
        let (_, _, recv_depth) = role.regions();
        let (qp, cq) = Self::queue_pair(port, recv_depth)?;
        let pd = &port.device.verbs().pd;
        if !Arc::ptr_eq(self.qp.pd(), pd) {
            // The old queue pair is in error; its regions' registrations go before it does.
            self.inbound.register_in(pd, INBOUND_ACCESS)?;
            self.staging.register_in(pd, STAGING_ACCESS)?;
        }
        // The old queue pair goes before its completion queue (as in `Drop`'s field order).
        self.max_inline = qp.caps().max_inline_data as usize;
        self.qp = qp;
        self.cq = cq;
        self.port = Arc::clone(port);
        self.psn = qp_params::random_psn();
        Ok(())
    }

    /// What the peer needs to reach this endpoint.
    pub(crate) fn local_info(&self, settings: &QpSettings) -> EndpointInfo {
        qp_params::endpoint_info(
            &self.port.info,
            self.qp.qp_num(),
            self.psn,
            &self.inbound,
            settings,
        )
    }

    /// Move the queue pair to RTR and RTS towards `remote`.
    pub(crate) fn connect(
        &self,
        remote: &EndpointInfo,
        settings: &QpSettings,
    ) -> Result<(), VerbsError> {
        self.qp
            .modify_to_rtr(&qp_params::rtr(&self.port.info, remote, settings))?;
        self.qp.modify_to_rts(&qp_params::rts(settings, self.psn))
    }

    /// The port this endpoint lives on.
    pub(crate) fn port(&self) -> &Arc<OpenPort<D>> {
        &self.port
    }

    /// The QP number (for log lines).
    pub(crate) fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }

    /// The CQ's address, as `CQ_ERR` events name it.
    pub(crate) fn cq_addr(&self) -> usize {
        self.cq.as_ptr() as usize
    }
}

impl<D: PortDevice> Endpoint<D> {
    /// The scatter entry of `payload` (zeroes for none), how many entries that is (0 or 1) and
    /// the `INLINE` flag where it is inline. Inline bytes must fit `max_inline`, staged bytes the
    /// staging region.
    #[inline(always)]
    fn scatter(&self, payload: &Payload<'_>) -> Result<(ibv_sge, i32, u32), NicError> {
        Ok(match *payload {
            Payload::Empty => (ibv_sge::default(), 0, 0),
            Payload::Inline(bytes) => {
                if bytes.len() > self.max_inline {
                    return Err(NicError::Post {
                        errno: libc::EINVAL,
                    });
                }
                let sge = ibv_sge {
                    addr: bytes.as_ptr() as u64,
                    length: bytes.len() as u32,
                    lkey: 0,
                };
                (sge, 1, send_flags::INLINE)
            }
            Payload::Local(sge) => {
                let sge = ibv_sge {
                    addr: sge.addr,
                    length: sge.len,
                    lkey: sge.lkey,
                };
                (sge, 1, 0)
            }
            Payload::Staged { offset, len } => {
                let end = u64::from(offset) + u64::from(len);
                if end > self.staging.len() as u64 {
                    return Err(NicError::Post {
                        errno: libc::EINVAL,
                    });
                }
                let sge = ibv_sge {
                    addr: self.staging.addr() + u64::from(offset),
                    length: len,
                    lkey: self.staging.lkey(),
                };
                (sge, 1, 0)
            }
        })
    }

    /// The verbs work request for `wr`, its scatter entry (if any) written to `sge`, which must
    /// stay in place until the post.
    #[inline(always)]
    fn ibv_wr(
        &self,
        wr: &SendWr<'_>,
        sge: &mut MaybeUninit<ibv_sge>,
    ) -> Result<ibv_send_wr, NicError> {
        let (entry, num_sge, inline) = self.scatter(&wr.payload)?;
        let sg_list = if num_sge == 0 {
            core::ptr::null_mut()
        } else {
            sge.write(entry) as *mut ibv_sge
        };
        let (opcode, imm_data) = wr_op(wr.op);
        Ok(ibv_send_wr {
            wr_id: wr.wr_id,
            next: core::ptr::null_mut(),
            sg_list,
            num_sge,
            opcode,
            send_flags: inline | if wr.signaled { send_flags::SIGNALED } else { 0 },
            imm_data,
            wr: ibv_send_wr_wr {
                rdma: ibv_rdma_wr {
                    remote_addr: wr.remote_addr,
                    rkey: wr.rkey,
                },
            },
            xrc_remote_srqn: 0,
            bind_mw_or_tso: [0; 6],
        })
    }

    /// Post one work request through the endpoint's template: the fields [`Self::ibv_wr`] sets,
    /// written in place, after the same checks.
    #[inline(always)]
    fn post_one(&mut self, wr: &SendWr<'_>) -> Result<(), NicError> {
        let (entry, num_sge, inline) = self.scatter(&wr.payload)?;
        let (opcode, imm_data) = wr_op(wr.op);
        let t = &mut *self.posts;
        t.sge = entry;
        // Set at every post, from this borrow of the template (it is not read between posts).
        // With `num_sge` 0 the provider reads no entry.
        t.send.sg_list = &raw mut t.sge;
        t.send.num_sge = num_sge;
        t.send.wr_id = wr.wr_id;
        t.send.opcode = opcode;
        t.send.send_flags = inline | if wr.signaled { send_flags::SIGNALED } else { 0 };
        t.send.imm_data = imm_data;
        t.send.wr.rdma = ibv_rdma_wr {
            remote_addr: wr.remote_addr,
            rkey: wr.rkey,
        };
        // SAFETY: as for the chain in `post_chain`; the SGE lives in the template, which
        // `&mut self` keeps in place for the call; `next` is null since the template was made
        // (nothing writes it).
        unsafe { self.qp.post_send_one(&mut t.send) }.map_err(post_failed)
    }
}

/// The verbs opcode and immediate (network order) of `op`.
#[inline(always)]
fn wr_op(op: SendOp) -> (u32, u32) {
    match op {
        SendOp::Write => (wr_opcode::RDMA_WRITE, 0),
        SendOp::WriteImm(imm) => (wr_opcode::RDMA_WRITE_WITH_IMM, imm.to_be()),
    }
}

impl<D: PortDevice> Endpoint<D> {
    /// Post a chain of several work requests, in pieces of [`MAX_CHAIN`]. Out of line: the
    /// chain arrays would otherwise widen the frame of every one-request post.
    #[inline(never)]
    fn post_chain(&mut self, chain: &[SendWr<'_>]) -> Result<(), NicError> {
        for piece in chain.chunks(MAX_CHAIN) {
            // Only the entries this call posts are written, not whole arrays.
            let mut sges = [MaybeUninit::<ibv_sge>::uninit(); MAX_CHAIN];
            let mut wrs = [MaybeUninit::<ibv_send_wr>::uninit(); MAX_CHAIN];
            for ((wr, out), sge) in piece.iter().zip(&mut wrs).zip(&mut sges) {
                out.write(self.ibv_wr(wr, sge)?);
            }
            let posted = &mut wrs[..piece.len()];
            // SAFETY: the loop above wrote every one of the first `piece.len()` entries, and
            // `MaybeUninit<T>` has `T`'s layout.
            let posted = unsafe { &mut *(core::ptr::from_mut(posted) as *mut [ibv_send_wr]) };
            // SAFETY: every SGE points at memory the core vouches for (user buffers registered
            // under their lkey, inline bytes borrowed for this call, staging bounds-checked in
            // `ibv_wr`); `sges` outlives the post, and inline bytes are copied by the provider
            // during it.
            unsafe { self.qp.post_send(posted) }.map_err(post_failed)?;
        }
        Ok(())
    }
}

/// The core's error for a failed post (out of line: only the failure needs it).
#[cold]
#[inline(never)]
fn post_failed(err: VerbsError) -> NicError {
    NicError::Post {
        errno: post_errno(&err),
    }
}

/// The core's error for a completion queue whose poll failed (a negative `ibv_poll_cq`; out of
/// line, like [`post_failed`]).
#[cold]
#[inline(never)]
fn cq_broken() -> NicError {
    NicError::Poll { code: libc::EIO }
}

fn post_errno(err: &VerbsError) -> i32 {
    err.errno().unwrap_or(libc::EINVAL)
}

/// The core's view of a verbs work completion.
#[inline(always)]
fn completion(wc: &ibv_wc) -> Completion {
    let status = WcStatus(wc.status);
    // Failed completions carry no valid opcode: the core tells them apart by wr_id.
    let op = if !status.is_success() {
        RawOp::Unknown
    } else if wc.opcode == wc_opcode::RECV_RDMA_WITH_IMM {
        RawOp::RecvWriteImm {
            imm: u32::from_be(wc.imm_data),
        }
    } else if wc.opcode & wc_opcode::RECV != 0 {
        RawOp::RecvOther
    } else {
        RawOp::Send
    };
    classify(&RawCompletion {
        wr_id: wc.wr_id,
        status,
        vendor_err: wc.vendor_err,
        op,
        byte_len: wc.byte_len,
        queue: None,
    })
}

impl<D: PortDevice> Endpoint<D> {
    /// The verbs poll behind [`Nic::poll_take`]: with `ONE`, the common case (one completion,
    /// taken) returns constants of its own, which the caller's poll loop folds (it stops: fewer
    /// than it asked for, none left over); that path is a second inlined copy of `take`, so
    /// only the receive fast path asks for it.
    #[inline(always)]
    fn poll_take_with<const ONE: bool>(
        &mut self,
        out: &mut [Completion],
        mut take: impl FnMut(&Completion) -> bool,
    ) -> Result<(usize, usize), NicError> {
        let mut wcs = [MaybeUninit::<ibv_wc>::uninit(); MAX_POLL];
        let want = out.len().min(MAX_POLL);
        let Some(polled) = self.cq.poll_wcs(&mut wcs[..want]) else {
            return Err(cq_broken());
        };
        let rest = match polled {
            [only] if ONE => {
                if take(&completion(only)) {
                    return Ok((1, 0));
                }
                polled
            }
            [first, after @ ..] if take(&completion(first)) => after,
            _ => polled,
        };
        for (slot, wc) in out.iter_mut().zip(rest) {
            *slot = completion(wc);
        }
        Ok((polled.len(), rest.len()))
    }
}

impl<D: PortDevice> Nic for Endpoint<D> {
    fn max_inline(&self) -> usize {
        self.max_inline
    }

    // The data path's three calls (post_send, post_recv, poll) are inlined into the core's
    // callers through AnyEndpoint: a call, its frame and its saved registers cost more than the
    // work of a one-request post or a one-completion poll (docs/datapath.md has the figures).
    #[inline(always)]
    fn post_send(&mut self, chain: &[SendWr<'_>]) -> Result<(), NicError> {
        // One work request (every post of a single-buffer send, and most clear-to-send writes):
        // the endpoint's template, no chain arrays.
        if let [wr] = chain {
            return self.post_one(wr);
        }
        self.post_chain(chain)
    }

    #[inline(always)]
    fn post_recv(&mut self, wr_id: u64) -> Result<(), NicError> {
        let wr = &mut self.posts.recv;
        wr.wr_id = wr_id;
        // SAFETY: an empty receive (no scatter entry, `num_sge` 0 since the template was made):
        // nothing for the NIC to write but the CQE; `next` null since then too.
        unsafe { self.qp.post_recv_one(wr) }.map_err(post_failed)
    }

    #[inline(always)]
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize, NicError> {
        self.poll_take(out, |_| false).map(|(got, _)| got)
    }

    /// The first work completion (the only one, in the common case) is converted and offered
    /// to `take` as it is, in registers; the rest, or all of them after a refusal, are stored to
    /// `out`.
    #[inline(always)]
    fn poll_take(
        &mut self,
        out: &mut [Completion],
        take: impl FnMut(&Completion) -> bool,
    ) -> Result<(usize, usize), NicError> {
        self.poll_take_with::<false>(out, take)
    }

    /// [`poll_take`](Nic::poll_take) with a path of its own for one completion, taken.
    #[inline(always)]
    fn poll_take_expect_one(
        &mut self,
        out: &mut [Completion],
        take: impl FnMut(&Completion) -> bool,
    ) -> Result<(usize, usize), NicError> {
        self.poll_take_with::<true>(out, take)
    }

    #[inline(always)]
    fn read_inbound(&self, offset: usize, out: &mut [u8]) {
        self.inbound.read_volatile(offset, out);
    }

    #[inline(always)]
    fn read_inbound_stamped<const N: usize>(&self, offset: usize) -> (u32, [u8; N]) {
        self.inbound.read_stamped(offset)
    }

    fn write_staging(&mut self, offset: usize, bytes: &[u8]) {
        // The core only stages inside the region it sized; a refusal here would surface as a
        // protocol error when the peer validates what arrives.
        let _ = self.staging.write(offset, bytes);
    }

    fn deliver_inbound(&mut self, offset: usize, len: usize, dst: u64) {
        self.inbound.deliver(offset, len, dst);
    }

    fn write_inbound(&mut self, offset: usize, bytes: &[u8]) {
        // Only on a queue pair in the error state (port failover): the NIC writes there no more.
        let _ = self.inbound.write(offset, bytes);
    }
}

pub(crate) mod region {
    //! Page-aligned, zeroed memory registered with the NIC: the control regions of a connection.
    //!
    //! Unsafe: the memory is allocated with `std::alloc` and handed to the NIC by address; the NIC
    //! (or the peer's NIC) writes it behind the compiler's back, so reads go through volatile loads.

    #![allow(unsafe_code)]

    use rivet_verbs_ffi::{MemoryRegion, ProtectionDomain, VerbsError};
    use std::alloc::{Layout, alloc_zeroed, dealloc};
    use std::ptr::NonNull;
    use std::sync::Arc;
    use std::sync::atomic::{Ordering, fence};

    const PAGE: usize = 4096;

    /// A registered, page-aligned, zero-initialised buffer owned by one connection.
    #[derive(Debug)]
    pub(crate) struct Region {
        /// Declared before `ptr`'s owner logic: the MR is deregistered (dropped) before the memory is
        /// freed in `Drop`.
        mr: Option<MemoryRegion>,
        ptr: NonNull<u8>,
        layout: Layout,
    }

    // SAFETY: the buffer is owned exclusively by this value; concurrent access is only by the NIC.
    unsafe impl Send for Region {}
    // SAFETY: shared access only reads through volatile loads or the NIC; writes need `&mut self`.
    unsafe impl Sync for Region {}

    impl Region {
        /// Allocate `len` zeroed bytes (rounded up to whole pages) and register them with `access`.
        pub(crate) fn new(
            pd: &Arc<ProtectionDomain>,
            len: usize,
            access: u32,
        ) -> Result<Self, VerbsError> {
            let size = len.max(1).div_ceil(PAGE) * PAGE;
            let layout =
                Layout::from_size_align(size, PAGE).map_err(|_| VerbsError::InvalidArgument {
                    what: "region size",
                })?;
            // SAFETY: the layout has a non-zero size.
            let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).ok_or(
                VerbsError::InvalidArgument {
                    what: "out of memory for a control region",
                },
            )?;
            let mut region = Self {
                mr: None,
                ptr,
                layout,
            };
            // SAFETY: the memory is valid for `size` bytes and lives until `Drop`, after the MR is gone.
            region.mr = Some(unsafe { MemoryRegion::register(pd, ptr.as_ptr(), size, access) }?);
            Ok(region)
        }

        /// Register the same memory (contents kept) in `pd` instead, with `access`: port
        /// failover to a port of another device. The old registration is dropped once the new
        /// one exists (on failure the region keeps the old one).
        #[cfg_attr(not(feature = "failover"), allow(dead_code))]
        pub(crate) fn register_in(
            &mut self,
            pd: &Arc<ProtectionDomain>,
            access: u32,
        ) -> Result<(), VerbsError> {
            // SAFETY: the memory is valid for its layout's size and lives until `Drop`, after the
            // MR is gone (as in `new`).
            let mr = unsafe {
                MemoryRegion::register(pd, self.ptr.as_ptr(), self.layout.size(), access)
            }?;
            self.mr = Some(mr);
            Ok(())
        }

        fn mr(&self) -> &MemoryRegion {
            self.mr
                .as_ref()
                .unwrap_or_else(|| unreachable!("registered in new"))
        }

        /// Address of the first byte.
        pub(crate) fn addr(&self) -> u64 {
            self.ptr.as_ptr() as u64
        }

        /// Usable length in bytes.
        pub(crate) fn len(&self) -> usize {
            self.layout.size()
        }

        /// Local key.
        pub(crate) fn lkey(&self) -> u32 {
            self.mr().lkey()
        }

        /// Remote key.
        pub(crate) fn rkey(&self) -> u32 {
            self.mr().rkey()
        }

        /// Whether `len` bytes at `offset` lie inside the region.
        #[inline(always)]
        fn contains(&self, offset: usize, len: usize) -> bool {
            offset.checked_add(len).is_some_and(|end| end <= self.len())
        }

        /// Copy `out.len()` bytes at `offset` out with volatile loads, then an acquire fence so later
        /// reads are not hoisted above them. Out-of-range reads yield zeroes (never panic).
        #[inline(always)]
        pub(crate) fn read_volatile(&self, offset: usize, out: &mut [u8]) {
            if !self.contains(offset, out.len()) {
                out.fill(0);
                return;
            }
            // SAFETY: the range was just checked to lie inside the region, whose start is a page.
            unsafe { copy_volatile(self.ptr.as_ptr(), offset, out) };
            fence(Ordering::Acquire);
        }

        /// The `N`-byte entry at `offset` whose last four bytes are its stamp: the stamp read first,
        /// then (after an acquire fence) the whole entry, as two [`Self::read_volatile`]s would, under
        /// one bounds check: the stamp lies inside the entry. Out of range, both are zeroes.
        #[inline(always)]
        pub(crate) fn read_stamped<const N: usize>(&self, offset: usize) -> (u32, [u8; N]) {
            const { assert!(N >= 4, "an entry ends with its 4-byte stamp") };
            let mut stamp = [0u8; 4];
            let mut entry = [0u8; N];
            if self.contains(offset, N) {
                // Loaded once, before the fences: a fence would have the field loaded again.
                let base = self.ptr.as_ptr();
                // SAFETY: the entry's range was just checked to lie inside the region, and the stamp
                // is its last four bytes; the region's start is a page.
                unsafe { copy_volatile(base, offset + (N - 4), &mut stamp) };
                fence(Ordering::Acquire);
                // SAFETY: as above, the entry's range.
                unsafe { copy_volatile(base, offset, &mut entry) };
                fence(Ordering::Acquire);
            }
            (u32::from_le_bytes(stamp), entry)
        }

        /// Copy the `len` bytes at `offset` (an eager message, its write completed) into the
        /// receive buffer at `dst`; an out-of-range `offset` copies nothing.
        ///
        /// `dst` comes from the core only as the address of a receive buffer the data path handed
        /// it as host memory (`RecvBuf::host`), which it had checked lies with its `len` bytes
        /// inside NCCL's registration of host memory (`UserMr::rkey_for`, `UserMr::host`); the core
        /// copies at most that buffer's capacity (`rivet_core::data::eager::accepts`).
        pub(crate) fn deliver(&self, offset: usize, len: usize, dst: u64) {
            if !self.contains(offset, len) || len == 0 {
                return;
            }
            // The write-with-immediate's completion was polled before: its bytes are visible.
            fence(Ordering::Acquire);
            // SAFETY: the source range was just checked to lie inside the region; the destination
            // is `len` bytes of registered host memory NCCL lent to this receive (see above),
            // which no Rust reference covers and which cannot overlap the region (the region is
            // this connection's own allocation).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.ptr.as_ptr().add(offset),
                    dst as usize as *mut u8,
                    len,
                )
            };
        }

        /// Copy `bytes` in at `offset`; out-of-range writes are refused (returns false).
        pub(crate) fn write(&mut self, offset: usize, bytes: &[u8]) -> bool {
            let Some(end) = offset
                .checked_add(bytes.len())
                .filter(|end| *end <= self.len())
            else {
                return false;
            };
            debug_assert!(end <= self.len());
            // SAFETY: the destination range is inside the allocation; `&mut self` excludes other CPU
            // writers. The NIC reads staging memory only after a later post, and writes inbound
            // memory only through a queue pair that works: an inbound region is written here only
            // once its queue pair is in the error state (port failover).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    bytes.as_ptr(),
                    self.ptr.as_ptr().add(offset),
                    bytes.len(),
                )
            };
            true
        }
    }

    /// Copy `out.len()` bytes at `base + offset` out with volatile loads (no fence).
    ///
    /// Whole aligned words where it can (a clear-to-send entry is four), then a 4-byte word (an
    /// entry's stamp), bytes for the rest: byte-wise volatile reads were a visible share of the
    /// instructions per message. The address is as aligned as `offset`, which the core's call sites
    /// know: the alignment checks fold away.
    ///
    /// # Safety
    ///
    /// `base` must be 8-aligned and `base + offset .. base + offset + out.len()` must lie inside one
    /// live allocation (memory the NIC may write concurrently, hence the volatile loads).
    #[inline(always)]
    unsafe fn copy_volatile(base: *const u8, offset: usize, out: &mut [u8]) {
        let mut done = 0;
        if offset % 8 == 0 {
            for chunk in out.chunks_exact_mut(8) {
                // SAFETY: `offset + done + 8 <= offset + out.len()`, inside the allocation (the
                // caller's promise), and 8-aligned (`base` 8-aligned, `offset` checked above, `done`
                // steps by 8).
                let word = unsafe { base.add(offset + done).cast::<u64>().read_volatile() };
                chunk.copy_from_slice(&word.to_ne_bytes());
                done += 8;
            }
        }
        if out.len() - done >= 4 && (offset + done) % 4 == 0 {
            // SAFETY: `offset + done + 4 <= offset + out.len()`, inside the allocation, and 4-aligned
            // (`base` 8-aligned, `offset + done` checked just above).
            let word = unsafe { base.add(offset + done).cast::<u32>().read_volatile() };
            out[done..done + 4].copy_from_slice(&word.to_ne_bytes());
            done += 4;
        }
        for (i, byte) in out.iter_mut().enumerate().skip(done) {
            // SAFETY: `offset + i < offset + out.len()`, inside the allocation.
            *byte = unsafe { base.add(offset + i).read_volatile() };
        }
    }

    impl Drop for Region {
        fn drop(&mut self) {
            // Deregister first: the NIC must not hold the pages when they return to the allocator.
            drop(self.mr.take());
            // SAFETY: allocated in `new` with this layout, freed once.
            unsafe { dealloc(self.ptr.as_ptr(), self.layout) };
        }
    }

    #[cfg(test)]
    mod tests {
        use super::copy_volatile;

        /// Every length and offset the word, half-word and byte steps meet, against a plain copy.
        #[test]
        fn copy_volatile_matches_a_plain_copy() {
            let mut words = [0u64; 8];
            for (i, word) in words.iter_mut().enumerate() {
                *word = u64::from_ne_bytes(core::array::from_fn(|b| (i * 8 + b) as u8));
            }
            let base = words.as_ptr().cast::<u8>();
            // SAFETY: `words` is 64 initialised bytes.
            let plain = unsafe { core::slice::from_raw_parts(base, 64) };
            for offset in 0..64 {
                for len in 0..=64 - offset {
                    let mut out = [0xFFu8; 64];
                    // SAFETY: `words` is 8-aligned and `offset + len <= 64`.
                    unsafe { copy_volatile(base, offset, &mut out[..len]) };
                    assert_eq!(out[..len], plain[offset..offset + len], "{offset} {len}");
                }
            }
        }
    }
}

pub(crate) mod any {
    //! The data path a connection uses: mlx5 direct (WQEs and CQEs handled by Rivet) on mlx5 devices,
    //! libibverbs everywhere else, chosen per port when it is opened.

    use crate::backend::conn_endpoint::ConnEndpoint;
    use crate::backend::device::OpenPort;
    use crate::backend::endpoint::{Endpoint, Role};
    use crate::backend::mlx5::endpoint::{Device, Mlx5Endpoint};
    use crate::backend::port_device::{PortDevice, VerbsDevice};
    use crate::config::QpSettings;
    use crate::log::{INIT_NET, info};
    use rivet_core::nic::{Completion, Nic, NicError, SendWr};
    use rivet_core::wire::EndpointInfo;
    use rivet_verbs_ffi::VerbsError;
    use std::sync::Arc;

    /// One connection's endpoint on either data path, on a port of device `D`.
    #[derive(Debug)]
    pub(crate) enum AnyEndpoint<D: PortDevice = VerbsDevice> {
        /// libibverbs post/poll through the provider's ops table.
        Verbs(Endpoint<D>),
        /// mlx5 direct: Rivet writes WQEs, rings doorbells and reads CQEs itself.
        Mlx5(Box<Mlx5Endpoint<Device<D>>>),
    }

    impl<D: PortDevice> ConnEndpoint for AnyEndpoint<D> {
        type Device = D;

        /// An endpoint on the port's data path. A failure to set up the direct path falls back to
        /// libibverbs with one INFO line; the port then stays on libibverbs.
        fn new(port: &Arc<OpenPort<D>>, role: Role) -> Result<Self, VerbsError> {
            if port.direct_path() {
                match Mlx5Endpoint::new(port, role) {
                    Ok(endpoint) => return Ok(Self::Mlx5(Box::new(endpoint))),
                    Err(e) => {
                        port.disable_direct_path();
                        info!(
                            INIT_NET,
                            "{} port {}: mlx5 direct path setup failed ({e}); using libibverbs",
                            port.info.name,
                            port.info.port
                        );
                    }
                }
            }
            Endpoint::new(port, role).map(Self::Verbs)
        }

        fn local_info(&self, settings: &QpSettings) -> EndpointInfo {
            match self {
                Self::Verbs(e) => e.local_info(settings),
                Self::Mlx5(e) => e.local_info(settings),
            }
        }

        fn connect(&self, remote: &EndpointInfo, settings: &QpSettings) -> Result<(), VerbsError> {
            match self {
                Self::Verbs(e) => e.connect(remote, settings),
                Self::Mlx5(e) => e.connect(remote, settings),
            }
        }

        fn port(&self) -> &Arc<OpenPort<D>> {
            match self {
                Self::Verbs(e) => e.port(),
                Self::Mlx5(e) => e.port(),
            }
        }

        fn qp_num(&self) -> u32 {
            match self {
                Self::Verbs(e) => e.qp_num(),
                Self::Mlx5(e) => e.qp_num(),
            }
        }

        fn cq_addr(&self) -> usize {
            match self {
                Self::Verbs(e) => e.cq_addr(),
                Self::Mlx5(e) => e.cq_addr(),
            }
        }

        fn fail_queue_pair(&self) -> Result<(), VerbsError> {
            match self {
                Self::Verbs(e) => e.fail_queue_pair(),
                Self::Mlx5(_) => Err(MLX5_NO_FAILOVER),
            }
        }

        fn move_to(&mut self, port: &Arc<OpenPort<D>>, role: Role) -> Result<(), VerbsError> {
            match self {
                Self::Verbs(e) => e.move_to(port, role),
                Self::Mlx5(_) => Err(MLX5_NO_FAILOVER),
            }
        }
    }

    /// The mlx5 direct path's queue pairs are not failed over (not built: the model has no
    /// second port); its connections fail as without failover.
    #[cfg_attr(not(feature = "failover"), allow(dead_code))]
    const MLX5_NO_FAILOVER: VerbsError = VerbsError::InvalidArgument {
        what: "port failover on the mlx5 direct path",
    };

    impl<D: PortDevice> Nic for AnyEndpoint<D> {
        #[inline]
        fn max_inline(&self) -> usize {
            match self {
                Self::Verbs(e) => e.max_inline(),
                Self::Mlx5(e) => e.max_inline(),
            }
        }

        #[inline(always)]
        fn post_send(&mut self, chain: &[SendWr<'_>]) -> Result<(), NicError> {
            match self {
                Self::Verbs(e) => e.post_send(chain),
                // A one-request chain is copied in this arm and the copy handed on: the mlx5 post
                // takes the request by address, and were that the caller's array, the request
                // would be written to memory before the match, for the verbs arm too (which reads
                // its fields from registers; the figure says so, also with the post in line). Its result is taken apart (`?`) and
                // `Ok(())` built here: returned as it is, the out-of-line call would write it straight
                // into the caller's result, which then lives in memory for the verbs arm too.
                Self::Mlx5(e) => {
                    match chain {
                        [wr] => {
                            let wr = *wr;
                            e.post_send(core::slice::from_ref(&wr))?;
                        }
                        _ => e.post_send(chain)?,
                    }
                    Ok(())
                }
            }
        }

        #[inline(always)]
        fn post_recv(&mut self, wr_id: u64) -> Result<(), NicError> {
            match self {
                Self::Verbs(e) => e.post_recv(wr_id),
                Self::Mlx5(e) => e.post_recv(wr_id),
            }
        }

        #[inline(always)]
        fn poll(&mut self, out: &mut [Completion]) -> Result<usize, NicError> {
            match self {
                Self::Verbs(e) => e.poll(out),
                Self::Mlx5(e) => e.poll(out),
            }
        }

        #[inline(always)]
        fn poll_take(
            &mut self,
            out: &mut [Completion],
            take: impl FnMut(&Completion) -> bool,
        ) -> Result<(usize, usize), NicError> {
            match self {
                Self::Verbs(e) => e.poll_take(out, take),
                // Inlined down to the CQE decode, as the verbs arm is: passed on to an out-of-line
                // call, `take`'s captures would be built in memory before the match, for both arms.
                Self::Mlx5(e) => e.poll_take(out, take),
            }
        }

        #[inline(always)]
        fn poll_take_expect_one(
            &mut self,
            out: &mut [Completion],
            take: impl FnMut(&Completion) -> bool,
        ) -> Result<(usize, usize), NicError> {
            match self {
                Self::Verbs(e) => e.poll_take_expect_one(out, take),
                Self::Mlx5(e) => e.poll_take(out, take),
            }
        }

        // Always: the reads' lengths and offsets are constants at the core's call sites, and
        // `Region::read_volatile` folds to one or a few word loads with them.
        #[inline(always)]
        fn read_inbound(&self, offset: usize, out: &mut [u8]) {
            match self {
                Self::Verbs(e) => e.read_inbound(offset, out),
                Self::Mlx5(e) => e.read_inbound(offset, out),
            }
        }

        // One match for both reads: after the first read's fence the variant would be loaded and
        // tested again.
        #[inline(always)]
        fn read_inbound_stamped<const N: usize>(&self, offset: usize) -> (u32, [u8; N]) {
            match self {
                Self::Verbs(e) => e.read_inbound_stamped(offset),
                Self::Mlx5(e) => e.read_inbound_stamped(offset),
            }
        }

        #[inline]
        fn write_staging(&mut self, offset: usize, bytes: &[u8]) {
            match self {
                Self::Verbs(e) => e.write_staging(offset, bytes),
                Self::Mlx5(e) => e.write_staging(offset, bytes),
            }
        }

        fn deliver_inbound(&mut self, offset: usize, len: usize, dst: u64) {
            match self {
                Self::Verbs(e) => e.deliver_inbound(offset, len, dst),
                Self::Mlx5(e) => e.deliver_inbound(offset, len, dst),
            }
        }

        fn write_inbound(&mut self, offset: usize, bytes: &[u8]) {
            match self {
                Self::Verbs(e) => e.write_inbound(offset, bytes),
                Self::Mlx5(e) => e.write_inbound(offset, bytes),
            }
        }
    }
}
