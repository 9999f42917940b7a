//! Bring-up of the direct data path on a real mlx5 device (reference verbs-mlx5dv §2.1, §2.2,
//! §2.13): check the device, create the RC QP with scatter-to-CQE disabled, move it through the
//! verbs state machine, and take its queues over with `mlx5dv_init_obj`.
//!
//! Scatter-to-CQE: `mlx5dv_create_qp` with `MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE` when libmlx5
//! has it; otherwise plain `ibv_create_qp`. The fallback is safe for this data path because
//! responder scatter only moves SEND payloads (the plugin posts none: RDMA WRITE WITH IMMEDIATE
//! places nothing in receive WQEs) and requester scatter needs `sq_sig_all` (always 0 here), so
//! no CQE ever carries data; the poller rejects a compressed CQE.
//!
//! Unsafe: calls libmlx5/libibverbs through raw pointers and owns the raw `ibv_qp`.
#![allow(unsafe_code)]

use core::ptr::NonNull;
use std::sync::Arc;

use super::direct::QueueLayout;
use super::doorbell::BlueFlame;
use super::dv::{
    IBV_QP_INIT_ATTR_PD, MLX5DV_OBJ_CQ, MLX5DV_OBJ_QP, MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE,
    MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS, ibv_qp_init_attr_ex, mlx5dv_cq, mlx5dv_obj,
    mlx5dv_qp, mlx5dv_qp_init_attr,
};
use crate::context::Context;
use crate::cq::CompletionQueue;
use crate::error::{VerbsError, check, errno_after_null};
use crate::pd::ProtectionDomain;
use crate::qp::{QpCaps, RcTransitions};
use crate::sys::{ibv_qp, ibv_qp_init_attr, qp_type};

/// Whether the device behind `context` is driven by libmlx5 (`mlx5dv_is_supported`). An error
/// when libmlx5 or the symbol is missing: without it, the direct path is not used.
pub fn device_supported(context: &Context) -> Result<bool, VerbsError> {
    let mlx5 = crate::loader::mlx5()?;
    let is_supported = mlx5.is_supported.ok_or(VerbsError::Unsupported {
        what: "mlx5dv_is_supported",
    })?;
    // SAFETY: live context; its `device` pointer is valid while the context is open.
    let device = unsafe { (*context.as_ptr()).device };
    // SAFETY: a device of this libibverbs; the call only inspects its ops table.
    Ok(unsafe { is_supported(device) })
}

/// An RC queue pair created for the direct path; destroyed on drop, before its CQ and PD.
#[derive(Debug)]
pub struct DirectQueuePair {
    ptr: NonNull<ibv_qp>,
    caps: QpCaps,
    scatter_to_cqe_disabled: bool,
    pd: Arc<ProtectionDomain>,
    cq: Arc<CompletionQueue>,
}

// SAFETY: the handle is only used for verbs control calls (modify, destroy), which libibverbs
// allows from any thread.
unsafe impl Send for DirectQueuePair {}
// SAFETY: as above; no interior mutation through `&self` on the Rust side.
unsafe impl Sync for DirectQueuePair {}

impl DirectQueuePair {
    /// Create an RC QP on `cq` (send and receive) with `sq_sig_all = 0`, preferring
    /// `mlx5dv_create_qp` with scatter-to-CQE disabled.
    pub fn new(
        pd: &Arc<ProtectionDomain>,
        cq: &Arc<CompletionQueue>,
        caps: QpCaps,
    ) -> Result<Self, VerbsError> {
        let context = pd.context();
        if !Arc::ptr_eq(cq.context(), context) {
            return Err(VerbsError::InvalidArgument {
                what: "CQ and PD belong to different contexts",
            });
        }
        let mlx5 = crate::loader::mlx5()?;
        if let Some(create) = mlx5.create_qp {
            let mut attr = ibv_qp_init_attr_ex {
                send_cq: cq.as_ptr(),
                recv_cq: cq.as_ptr(),
                cap: caps.into(),
                qp_type: qp_type::RC,
                sq_sig_all: 0,
                comp_mask: IBV_QP_INIT_ATTR_PD,
                pd: pd.as_ptr(),
                ..ibv_qp_init_attr_ex::default()
            };
            let mut dv = mlx5dv_qp_init_attr {
                comp_mask: MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS,
                create_flags: MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE,
                ..mlx5dv_qp_init_attr::default()
            };
            // SAFETY: live context, PD and CQ of one device; both attribute structs are valid
            // in/out structs of the layouts mlx5dv.h declares (checked in dv.rs).
            let raw = unsafe {
                create(
                    context.as_ptr(),
                    (&raw mut attr).cast(),
                    (&raw mut dv).cast(),
                )
            };
            if let Some(ptr) = NonNull::new(raw) {
                return Ok(Self::owned(ptr, attr.cap.into(), true, pd, cq));
            }
            // Old firmware or rdma-core without the flag: fall through to plain creation.
        }
        let mut attr = ibv_qp_init_attr {
            send_cq: cq.as_ptr(),
            recv_cq: cq.as_ptr(),
            cap: caps.into(),
            qp_type: qp_type::RC,
            sq_sig_all: 0,
            ..ibv_qp_init_attr::default()
        };
        // SAFETY: live PD and CQ of one context; attr is a valid in/out struct.
        let raw = unsafe { (context.verbs().create_qp)(pd.as_ptr(), &mut attr) };
        let ptr = NonNull::new(raw).ok_or(VerbsError::Call {
            call: "ibv_create_qp",
            errno: errno_after_null(),
        })?;
        Ok(Self::owned(ptr, attr.cap.into(), false, pd, cq))
    }

    fn owned(
        ptr: NonNull<ibv_qp>,
        caps: QpCaps,
        scatter_to_cqe_disabled: bool,
        pd: &Arc<ProtectionDomain>,
        cq: &Arc<CompletionQueue>,
    ) -> Self {
        Self {
            ptr,
            caps,
            scatter_to_cqe_disabled,
            pd: Arc::clone(pd),
            cq: Arc::clone(cq),
        }
    }

    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: live QP; qp_num is immutable.
        unsafe { (*self.ptr.as_ptr()).qp_num }
    }

    /// Granted capacities (`max_inline_data` included).
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    /// Whether `mlx5dv_create_qp` disabled scatter-to-CQE (false: created by `ibv_create_qp`).
    pub fn scatter_to_cqe_disabled(&self) -> bool {
        self.scatter_to_cqe_disabled
    }

    /// Take the queues over: `mlx5dv_init_obj(QP | CQ)`. After this, never call `ibv_post_*` or
    /// `ibv_poll_cq` on the QP or CQ. Returns the layout and the BlueFlame register.
    ///
    /// # Safety
    /// Call once, with no work request outstanding, before any receive is posted, and build at
    /// most one [`super::DirectQp`] from the result, dropped before `self`.
    pub unsafe fn take_over(&self) -> Result<(QueueLayout, BlueFlame), VerbsError> {
        let mlx5 = crate::loader::mlx5()?;
        // SAFETY: plain-data structs; all-zero is a valid value (null pointers, zero counts).
        let mut qp: mlx5dv_qp = unsafe { core::mem::zeroed() };
        // SAFETY: as above.
        let mut cq: mlx5dv_cq = unsafe { core::mem::zeroed() };
        let mut obj = mlx5dv_obj::qp_cq(self.ptr.as_ptr(), &mut qp, self.cq.as_ptr(), &mut cq);
        // SAFETY: live QP and CQ of an mlx5 device; `obj` points at valid out-structs and is sized
        // for HEAD's larger struct.
        let ret = unsafe { (mlx5.init_obj)((&raw mut obj).cast(), MLX5DV_OBJ_QP | MLX5DV_OBJ_CQ) };
        check("mlx5dv_init_obj", ret)?;
        let layout = QueueLayout::from_dv(self.qp_num(), &qp, &cq).map_err(|_| {
            VerbsError::InvalidArgument {
                what: "mlx5dv_init_obj reported an unusable queue layout",
            }
        })?;
        let reg = NonNull::new(qp.bf.reg.cast::<u64>()).ok_or(VerbsError::InvalidArgument {
            what: "mlx5dv_init_obj reported no doorbell register",
        })?;
        // A fresh CQ has every entry hardware-owned for pass 0 (op_own 0xF0, cq.c l.1935).
        for i in 0..layout.cqe_cnt as usize {
            let at = i * layout.cqe_size as usize + layout.cqe_size as usize - 1;
            // SAFETY: inside the CQ buffer just reported.
            let op_own = unsafe { layout.cq_buf.add(at).read_volatile() };
            if super::cqe::sw_owns(op_own, 0, layout.cqe_cnt) {
                return Err(VerbsError::InvalidArgument {
                    what: "CQ is not fresh: a CQE is already software-owned",
                });
            }
        }
        // SAFETY: the QP's own BlueFlame register, mapped for the QP's life; one DirectQp rings it.
        Ok((layout, unsafe { BlueFlame::new(reg, qp.bf.size) }))
    }
}

// SAFETY: `ptr` is the QP this value created and destroys only in `Drop`; `pd` is its PD.
unsafe impl RcTransitions for DirectQueuePair {
    fn raw_qp(&self) -> NonNull<ibv_qp> {
        self.ptr
    }
    fn protection_domain(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }
}

impl Drop for DirectQueuePair {
    fn drop(&mut self) {
        // SAFETY: created here, destroyed once, before the Arcs to the CQ and PD drop.
        unsafe { (self.pd.context().verbs().destroy_qp)(self.ptr.as_ptr()) };
    }
}
