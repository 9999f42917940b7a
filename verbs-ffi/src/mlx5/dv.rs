//! Hand-written `#[repr(C)]` mirrors of the mlx5dv structs the direct data path exchanges with
//! libmlx5 (x86-64 / LP64; reference verbs-mlx5dv §0, §1.5, §2.1), plus `ibv_qp_init_attr_ex`
//! for `mlx5dv_create_qp`. Each has compile-time asserts on size, alignment and offsets, listed in
//! [`MLX5_LAYOUTS`]; `tests/mlx5_layout.rs` compares them with bindgen's view of the system
//! `mlx5dv.h`.
#![allow(non_camel_case_types)]

use core::ffi::c_void;
use core::mem::{align_of, offset_of, size_of};
use core::ptr;

use crate::sys::checked_layout;
use crate::sys::{FieldLayout, TypeLayout, ibv_cq, ibv_pd, ibv_qp, ibv_qp_cap};

/// `MLX5DV_OBJ_QP`.
pub const MLX5DV_OBJ_QP: u64 = 1 << 0;
/// `MLX5DV_OBJ_CQ`.
pub const MLX5DV_OBJ_CQ: u64 = 1 << 1;
/// `MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS`.
pub const MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS: u64 = 1 << 0;
/// `MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE` (rdma-core v21+).
pub const MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE: u32 = 1 << 3;
/// `IBV_QP_INIT_ATTR_PD`.
pub const IBV_QP_INIT_ATTR_PD: u32 = 1 << 0;
/// `MLX5_RCV_DBR`: index of the receive counter in a QP doorbell record.
pub const MLX5_RCV_DBR: usize = 0;
/// `MLX5_SND_DBR`: index of the send counter in a QP doorbell record.
pub const MLX5_SND_DBR: usize = 1;
/// `MLX5_CQ_SET_CI`: index of the consumer index in a CQ doorbell record.
pub const MLX5_CQ_SET_CI: usize = 0;

/// `mlx5dv_qp.sq` / `.rq` (anonymous in C).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct mlx5dv_qp_wq {
    /// First byte of the queue.
    pub buf: *mut c_void,
    /// Entries (send queue: 64-byte basic blocks).
    pub wqe_cnt: u32,
    /// Bytes per entry.
    pub stride: u32,
}

/// `mlx5dv_qp.bf` (anonymous in C).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct mlx5dv_qp_bf {
    /// Base of the BlueFlame register pair (UAR page offset).
    pub reg: *mut c_void,
    /// Bytes of one BlueFlame half; 0 = no BlueFlame (8-byte doorbells only).
    pub size: u32,
}

/// `struct mlx5dv_qp` (96 bytes): what `mlx5dv_init_obj` reports for a QP.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct mlx5dv_qp {
    /// `__be32 dbrec[2]`: receive counter, send counter.
    pub dbrec: *mut u32,
    /// Send queue.
    pub sq: mlx5dv_qp_wq,
    /// Receive queue.
    pub rq: mlx5dv_qp_wq,
    /// BlueFlame register.
    pub bf: mlx5dv_qp_bf,
    /// In: which optional outputs to fill (none here).
    pub comp_mask: u64,
    /// `off_t uar_mmap_offset`.
    pub uar_mmap_offset: i64,
    /// TIR number (raw packet QPs).
    pub tirn: u32,
    /// TIS number.
    pub tisn: u32,
    /// RQ number.
    pub rqn: u32,
    /// SQ number.
    pub sqn: u32,
    /// TIR ICM address.
    pub tir_icm_addr: u64,
}

/// `struct mlx5dv_cq` (48 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct mlx5dv_cq {
    /// First CQE.
    pub buf: *mut c_void,
    /// `__be32 dbrec[2]`: consumer index, arm.
    pub dbrec: *mut u32,
    /// Entries (a power of two).
    pub cqe_cnt: u32,
    /// Bytes per entry (64 or 128).
    pub cqe_size: u32,
    /// CQ UAR (arming only).
    pub cq_uar: *mut c_void,
    /// CQ number.
    pub cqn: u32,
    /// Output mask.
    pub comp_mask: u64,
}

/// One `{in, out}` pair of `struct mlx5dv_obj`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct mlx5dv_obj_pair {
    /// The verbs object.
    pub in_: *mut c_void,
    /// Where its mlx5dv description goes.
    pub out: *mut c_void,
}

/// `struct mlx5dv_obj`: 112 bytes in rdma-core 44 (qp, cq, srq, rwq, dm, ah, pd); HEAD adds a
/// `devx` pair, so this mirror carries one spare pair (128 bytes) that stays zero.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct mlx5dv_obj {
    /// QP in/out.
    pub qp: mlx5dv_obj_pair,
    /// CQ in/out.
    pub cq: mlx5dv_obj_pair,
    /// SRQ in/out.
    pub srq: mlx5dv_obj_pair,
    /// RWQ in/out.
    pub rwq: mlx5dv_obj_pair,
    /// DM in/out.
    pub dm: mlx5dv_obj_pair,
    /// AH in/out.
    pub ah: mlx5dv_obj_pair,
    /// PD in/out.
    pub pd: mlx5dv_obj_pair,
    /// HEAD's `devx` pair; zero.
    pub spare: mlx5dv_obj_pair,
}

impl mlx5dv_obj {
    /// A request for a QP and a CQ description.
    pub fn qp_cq(
        qp: *mut ibv_qp,
        qp_out: *mut mlx5dv_qp,
        cq: *mut ibv_cq,
        cq_out: *mut mlx5dv_cq,
    ) -> Self {
        let none = mlx5dv_obj_pair {
            in_: ptr::null_mut(),
            out: ptr::null_mut(),
        };
        Self {
            qp: mlx5dv_obj_pair {
                in_: qp.cast(),
                out: qp_out.cast(),
            },
            cq: mlx5dv_obj_pair {
                in_: cq.cast(),
                out: cq_out.cast(),
            },
            srq: none,
            rwq: none,
            dm: none,
            ah: none,
            pd: none,
            spare: none,
        }
    }
}

/// `struct mlx5dv_dc_init_attr` (16 bytes; unused for RC).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct mlx5dv_dc_init_attr {
    /// `enum mlx5dv_dc_type`.
    pub dc_type: u32,
    /// DCT access key.
    pub dct_access_key: u64,
}

/// `struct mlx5dv_qp_init_attr` (40 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct mlx5dv_qp_init_attr {
    /// `MLX5DV_QP_INIT_ATTR_MASK_*`.
    pub comp_mask: u64,
    /// `MLX5DV_QP_CREATE_*`.
    pub create_flags: u32,
    /// DC attributes.
    pub dc_init_attr: mlx5dv_dc_init_attr,
    /// `MLX5DV_QP_EX_WITH_*`.
    pub send_ops_flags: u64,
}

/// `struct ibv_rx_hash_conf` (24 bytes; unused for RC).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_rx_hash_conf {
    /// Hash function.
    pub rx_hash_function: u8,
    /// Key length.
    pub rx_hash_key_len: u8,
    /// Key.
    pub rx_hash_key: *mut u8,
    /// Fields mask.
    pub rx_hash_fields_mask: u64,
}

/// `struct ibv_qp_init_attr_ex` (136 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_qp_init_attr_ex {
    /// User pointer.
    pub qp_context: *mut c_void,
    /// Send CQ.
    pub send_cq: *mut ibv_cq,
    /// Receive CQ.
    pub recv_cq: *mut ibv_cq,
    /// SRQ or null.
    pub srq: *mut c_void,
    /// Requested caps in; granted caps out.
    pub cap: ibv_qp_cap,
    /// [`crate::sys::qp_type`].
    pub qp_type: u32,
    /// Nonzero: every send WR is signaled.
    pub sq_sig_all: i32,
    /// `IBV_QP_INIT_ATTR_*`.
    pub comp_mask: u32,
    /// Protection domain (with `IBV_QP_INIT_ATTR_PD`).
    pub pd: *mut ibv_pd,
    /// XRC domain.
    pub xrcd: *mut c_void,
    /// `IBV_QP_CREATE_*`.
    pub create_flags: u32,
    /// TSO header size.
    pub max_tso_header: u16,
    /// RWQ indirection table.
    pub rwq_ind_tbl: *mut c_void,
    /// RSS configuration.
    pub rx_hash_conf: ibv_rx_hash_conf,
    /// Source QPN.
    pub source_qpn: u32,
    /// `IBV_QP_EX_WITH_*`.
    pub send_ops_flags: u64,
}

impl Default for ibv_qp_init_attr_ex {
    fn default() -> Self {
        Self {
            qp_context: ptr::null_mut(),
            send_cq: ptr::null_mut(),
            recv_cq: ptr::null_mut(),
            srq: ptr::null_mut(),
            cap: ibv_qp_cap::default(),
            qp_type: 0,
            sq_sig_all: 0,
            comp_mask: 0,
            pd: ptr::null_mut(),
            xrcd: ptr::null_mut(),
            create_flags: 0,
            max_tso_header: 0,
            rwq_ind_tbl: ptr::null_mut(),
            rx_hash_conf: ibv_rx_hash_conf {
                rx_hash_function: 0,
                rx_hash_key_len: 0,
                rx_hash_key: ptr::null_mut(),
                rx_hash_fields_mask: 0,
            },
            source_qpn: 0,
            send_ops_flags: 0,
        }
    }
}

/// Layouts of every type above (each entry is also a set of compile-time asserts).
pub static MLX5_LAYOUTS: &[TypeLayout] = &[
    checked_layout!(mlx5dv_qp_wq, size 16, align 8 { buf @ 0, wqe_cnt @ 8, stride @ 12 }),
    checked_layout!(mlx5dv_qp_bf, size 16, align 8 { reg @ 0, size @ 8 }),
    checked_layout!(mlx5dv_qp, size 96, align 8 {
        dbrec @ 0, sq @ 8, rq @ 24, bf @ 40, comp_mask @ 56, uar_mmap_offset @ 64, tirn @ 72, tisn @ 76,
        rqn @ 80, sqn @ 84, tir_icm_addr @ 88,
    }),
    checked_layout!(mlx5dv_cq, size 48, align 8 {
        buf @ 0, dbrec @ 8, cqe_cnt @ 16, cqe_size @ 20, cq_uar @ 24, cqn @ 32, comp_mask @ 40,
    }),
    checked_layout!(mlx5dv_obj_pair, size 16, align 8 { in_ @ 0, out @ 8 }),
    checked_layout!(mlx5dv_obj, size 128, align 8 {
        qp @ 0, cq @ 16, srq @ 32, rwq @ 48, dm @ 64, ah @ 80, pd @ 96, spare @ 112,
    }),
    checked_layout!(mlx5dv_dc_init_attr, size 16, align 8 { dc_type @ 0, dct_access_key @ 8 }),
    checked_layout!(mlx5dv_qp_init_attr, size 40, align 8 {
        comp_mask @ 0, create_flags @ 8, dc_init_attr @ 16, send_ops_flags @ 32,
    }),
    checked_layout!(ibv_rx_hash_conf, size 24, align 8 {
        rx_hash_function @ 0, rx_hash_key_len @ 1, rx_hash_key @ 8, rx_hash_fields_mask @ 16,
    }),
    checked_layout!(ibv_qp_init_attr_ex, size 136, align 8 {
        qp_context @ 0, send_cq @ 8, recv_cq @ 16, srq @ 24, cap @ 32, qp_type @ 52, sq_sig_all @ 56,
        comp_mask @ 60, pd @ 64, xrcd @ 72, create_flags @ 80, max_tso_header @ 84, rwq_ind_tbl @ 88,
        rx_hash_conf @ 96, source_qpn @ 120, send_ops_flags @ 128,
    }),
];
