//! Hand-written `#[repr(C)]` mirrors of the libibverbs structs this crate touches (x86-64 / LP64).
//!
//! Every type has compile-time asserts on its size, alignment and field offsets (the numbers come from
//! rdma-core 44 and HEAD `verbs.h`, which agree on all of them), collected in [`LAYOUTS`]; the test
//! `tests/layout.rs` also compares them with what bindgen computes from the system `verbs.h`.
//!
//! C unions are kept as Rust `union`s where callers pick a member (`ibv_send_wr::wr`,
//! `ibv_async_event::element`) and flattened to one member where all members are the same bytes
//! (`ibv_gid`, `ibv_wc::imm_data`, `ibv_send_wr::imm_data`). Members nobody here uses (memory-window bind,
//! TSO, mutexes) are opaque byte blocks of the right size and alignment.
#![allow(non_camel_case_types)]

use core::ffi::{c_char, c_int, c_uint, c_void};
use core::mem::{align_of, offset_of, size_of};
use core::ptr;

/// `pthread_mutex_t` (40 bytes on glibc and musl x86-64); never touched from Rust.
pub type pthread_mutex_t = [u64; 5];
/// `pthread_cond_t` (48 bytes); never touched from Rust.
pub type pthread_cond_t = [u64; 6];

/// A context-ops slot this crate never calls; only its size (one function pointer) matters.
pub type UnusedOp = Option<unsafe extern "C" fn()>;

/// `ibv_context_ops.poll_cq`: `int (*)(struct ibv_cq *, int num_entries, struct ibv_wc *)`.
pub type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
/// `ibv_context_ops.req_notify_cq`: `int (*)(struct ibv_cq *, int solicited_only)`.
pub type ReqNotifyCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
/// `ibv_context_ops.post_send`.
pub type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
/// `ibv_context_ops.post_recv`.
pub type PostRecvFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
/// `ibv_context_ops.post_srq_recv` (the SRQ type is left opaque).
pub type PostSrqRecvFn =
    unsafe extern "C" fn(*mut c_void, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;

/// `struct ibv_device` (664 bytes). Owned by libibverbs; reached through `ibv_get_device_list`.
#[repr(C)]
#[derive(Debug)]
pub struct ibv_device {
    /// `struct _ibv_device_ops` (two obsolete function pointers).
    pub _ops: [*mut c_void; 2],
    /// `enum ibv_node_type`.
    pub node_type: c_int,
    /// `enum ibv_transport_type`.
    pub transport_type: c_int,
    /// Kernel device name, e.g. `mlx5_0`, `rxe0` (NUL-terminated).
    pub name: [c_char; 64],
    /// uverbs device name, e.g. `uverbs0`.
    pub dev_name: [c_char; 64],
    /// `/sys/class/infiniband_verbs/uverbs0`.
    pub dev_path: [c_char; 256],
    /// `/sys/class/infiniband/mlx5_0`.
    pub ibdev_path: [c_char; 256],
}

/// `struct ibv_context_ops` (32 function pointers). Only the data-path slots are typed: they are the
/// `static inline` verbs (`ibv_poll_cq`, `ibv_post_send`, ...) that have no exported symbol.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_context_ops {
    /// Slot 0.
    pub _compat_query_device: UnusedOp,
    /// Slot 1.
    pub _compat_query_port: UnusedOp,
    /// Slot 2.
    pub _compat_alloc_pd: UnusedOp,
    /// Slot 3.
    pub _compat_dealloc_pd: UnusedOp,
    /// Slot 4.
    pub _compat_reg_mr: UnusedOp,
    /// Slot 5.
    pub _compat_rereg_mr: UnusedOp,
    /// Slot 6.
    pub _compat_dereg_mr: UnusedOp,
    /// Slot 7.
    pub alloc_mw: UnusedOp,
    /// Slot 8.
    pub bind_mw: UnusedOp,
    /// Slot 9.
    pub dealloc_mw: UnusedOp,
    /// Slot 10.
    pub _compat_create_cq: UnusedOp,
    /// Slot 11: `ibv_poll_cq`.
    pub poll_cq: Option<PollCqFn>,
    /// Slot 12: `ibv_req_notify_cq`.
    pub req_notify_cq: Option<ReqNotifyCqFn>,
    /// Slot 13.
    pub _compat_cq_event: UnusedOp,
    /// Slot 14.
    pub _compat_resize_cq: UnusedOp,
    /// Slot 15.
    pub _compat_destroy_cq: UnusedOp,
    /// Slot 16.
    pub _compat_create_srq: UnusedOp,
    /// Slot 17.
    pub _compat_modify_srq: UnusedOp,
    /// Slot 18.
    pub _compat_query_srq: UnusedOp,
    /// Slot 19.
    pub _compat_destroy_srq: UnusedOp,
    /// Slot 20: `ibv_post_srq_recv`.
    pub post_srq_recv: Option<PostSrqRecvFn>,
    /// Slot 21.
    pub _compat_create_qp: UnusedOp,
    /// Slot 22.
    pub _compat_query_qp: UnusedOp,
    /// Slot 23.
    pub _compat_modify_qp: UnusedOp,
    /// Slot 24.
    pub _compat_destroy_qp: UnusedOp,
    /// Slot 25: `ibv_post_send`.
    pub post_send: Option<PostSendFn>,
    /// Slot 26: `ibv_post_recv`.
    pub post_recv: Option<PostRecvFn>,
    /// Slot 27.
    pub _compat_create_ah: UnusedOp,
    /// Slot 28.
    pub _compat_destroy_ah: UnusedOp,
    /// Slot 29.
    pub _compat_attach_mcast: UnusedOp,
    /// Slot 30.
    pub _compat_detach_mcast: UnusedOp,
    /// Slot 31.
    pub _compat_async_event: UnusedOp,
}

/// `struct ibv_context` (328 bytes): an open device.
#[repr(C)]
#[derive(Debug)]
pub struct ibv_context {
    /// The device this context was opened on.
    pub device: *mut ibv_device,
    /// Provider entry points, including the data path.
    pub ops: ibv_context_ops,
    /// uverbs command file descriptor.
    pub cmd_fd: c_int,
    /// Async event file descriptor (`ibv_get_async_event` reads it).
    pub async_fd: c_int,
    /// Number of completion vectors.
    pub num_comp_vectors: c_int,
    /// Library-internal lock.
    pub mutex: pthread_mutex_t,
    /// `(void*)UINTPTR_MAX` when the context is a `verbs_context` (extended ops lie before it).
    pub abi_compat: *mut c_void,
}

/// `struct ibv_pd` (16 bytes).
#[repr(C)]
#[derive(Debug)]
pub struct ibv_pd {
    /// Owning context.
    pub context: *mut ibv_context,
    /// Kernel handle.
    pub handle: u32,
}

/// `struct ibv_cq` (128 bytes).
#[repr(C)]
#[derive(Debug)]
pub struct ibv_cq {
    /// Owning context (its `ops.poll_cq` polls this CQ).
    pub context: *mut ibv_context,
    /// Completion channel, if any.
    pub channel: *mut c_void,
    /// User pointer given at creation.
    pub cq_context: *mut c_void,
    /// Kernel handle.
    pub handle: u32,
    /// Usable entries (may exceed what was asked for).
    pub cqe: c_int,
    /// Library-internal lock.
    pub mutex: pthread_mutex_t,
    /// Library-internal condition variable.
    pub cond: pthread_cond_t,
    /// Completion events acked.
    pub comp_events_completed: u32,
    /// Async events acked.
    pub async_events_completed: u32,
}

/// `struct ibv_qp` (160 bytes).
#[repr(C)]
#[derive(Debug)]
pub struct ibv_qp {
    /// Owning context (its `ops.post_send`/`post_recv` post to this QP).
    pub context: *mut ibv_context,
    /// User pointer given at creation.
    pub qp_context: *mut c_void,
    /// Protection domain.
    pub pd: *mut ibv_pd,
    /// Send CQ.
    pub send_cq: *mut ibv_cq,
    /// Receive CQ.
    pub recv_cq: *mut ibv_cq,
    /// Shared receive queue, if any.
    pub srq: *mut c_void,
    /// Kernel handle.
    pub handle: u32,
    /// QP number, exchanged with the peer.
    pub qp_num: u32,
    /// Last known `enum ibv_qp_state`.
    pub state: u32,
    /// `enum ibv_qp_type`.
    pub qp_type: u32,
    /// Library-internal lock.
    pub mutex: pthread_mutex_t,
    /// Library-internal condition variable.
    pub cond: pthread_cond_t,
    /// Async events acked.
    pub events_completed: u32,
}

/// `struct ibv_mr` (48 bytes).
#[repr(C)]
#[derive(Debug)]
pub struct ibv_mr {
    /// Owning context.
    pub context: *mut ibv_context,
    /// Protection domain.
    pub pd: *mut ibv_pd,
    /// Start address.
    pub addr: *mut c_void,
    /// Length in bytes.
    pub length: usize,
    /// Kernel handle.
    pub handle: u32,
    /// Local key (for `ibv_sge::lkey`).
    pub lkey: u32,
    /// Remote key (given to peers).
    pub rkey: u32,
}

/// `struct ibv_sge` (16 bytes): one gather/scatter element.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ibv_sge {
    /// Start address (inside the MR of `lkey`).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the MR.
    pub lkey: u32,
}

/// `ibv_send_wr.wr.rdma`: target of RDMA WRITE / READ.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ibv_rdma_wr {
    /// Remote virtual address.
    pub remote_addr: u64,
    /// Remote key.
    pub rkey: u32,
}

/// `ibv_send_wr.wr.atomic`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ibv_atomic_wr {
    /// Remote virtual address (8-byte aligned).
    pub remote_addr: u64,
    /// Compare value (CAS) or addend (FAA).
    pub compare_add: u64,
    /// Swap value (CAS).
    pub swap: u64,
    /// Remote key.
    pub rkey: u32,
}

/// `ibv_send_wr.wr.ud`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_ud_wr {
    /// Address handle (`struct ibv_ah *`).
    pub ah: *mut c_void,
    /// Remote QP number.
    pub remote_qpn: u32,
    /// Remote Q_Key.
    pub remote_qkey: u32,
}

/// The `wr` union of `struct ibv_send_wr` (32 bytes). Writing a member is safe; reading one is not.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_wr {
    /// RDMA WRITE / READ target.
    pub rdma: ibv_rdma_wr,
    /// Atomic target.
    pub atomic: ibv_atomic_wr,
    /// UD destination.
    pub ud: ibv_ud_wr,
}

impl Default for ibv_send_wr_wr {
    fn default() -> Self {
        // The atomic member spans all 32 bytes, so this zeroes the whole union.
        Self {
            atomic: ibv_atomic_wr::default(),
        }
    }
}

impl core::fmt::Debug for ibv_send_wr_wr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("ibv_send_wr_wr { .. }")
    }
}

/// `struct ibv_send_wr` (128 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_send_wr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Next WR of the chain, or null.
    pub next: *mut Self,
    /// Gather list.
    pub sg_list: *mut ibv_sge,
    /// Entries in `sg_list`.
    pub num_sge: c_int,
    /// `enum ibv_wr_opcode` (see [`crate::sys::wr_opcode`]).
    pub opcode: u32,
    /// [`crate::sys::send_flags`] bits.
    pub send_flags: c_uint,
    /// Immediate data in network byte order (C union with `invalidate_rkey`).
    pub imm_data: u32,
    /// Per-opcode target.
    pub wr: ibv_send_wr_wr,
    /// `qp_type.xrc.remote_srqn` (XRC only).
    pub xrc_remote_srqn: u32,
    /// The `bind_mw` / `tso` union (48 bytes), unused here.
    pub bind_mw_or_tso: [u64; 6],
}

impl Default for ibv_send_wr {
    fn default() -> Self {
        Self {
            wr_id: 0,
            next: ptr::null_mut(),
            sg_list: ptr::null_mut(),
            num_sge: 0,
            opcode: 0,
            send_flags: 0,
            imm_data: 0,
            wr: ibv_send_wr_wr::default(),
            xrc_remote_srqn: 0,
            bind_mw_or_tso: [0; 6],
        }
    }
}

/// `struct ibv_recv_wr` (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_recv_wr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Next WR of the chain, or null.
    pub next: *mut Self,
    /// Scatter list (may be null with `num_sge == 0`, e.g. for RDMA WRITE WITH IMM).
    pub sg_list: *mut ibv_sge,
    /// Entries in `sg_list`.
    pub num_sge: c_int,
}

impl Default for ibv_recv_wr {
    fn default() -> Self {
        Self {
            wr_id: 0,
            next: ptr::null_mut(),
            sg_list: ptr::null_mut(),
            num_sge: 0,
        }
    }
}

/// `struct ibv_wc` (48 bytes): one work completion.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ibv_wc {
    /// The WR's `wr_id`.
    pub wr_id: u64,
    /// [`crate::sys::wc_status`].
    pub status: u32,
    /// [`crate::sys::wc_opcode`].
    pub opcode: u32,
    /// Vendor syndrome on error.
    pub vendor_err: u32,
    /// Bytes received (receive completions and RDMA READ).
    pub byte_len: u32,
    /// Immediate data, network byte order (C union with `invalidated_rkey`); valid with `WITH_IMM`.
    pub imm_data: u32,
    /// Local QP number.
    pub qp_num: u32,
    /// Source QP (UD).
    pub src_qp: u32,
    /// [`crate::sys::wc_flags`] bits.
    pub wc_flags: c_uint,
    /// P_Key index (GSI).
    pub pkey_index: u16,
    /// Source LID.
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// Destination LID path bits.
    pub dlid_path_bits: u8,
}

/// `union ibv_gid` (16 bytes, 8-aligned): the raw bytes, network order.
#[repr(C, align(8))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ibv_gid {
    /// The 128-bit GID (subnet prefix then interface id, big-endian).
    pub raw: [u8; 16],
}

/// `struct ibv_gid_entry` (32 bytes), filled by `_ibv_query_gid_ex`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ibv_gid_entry {
    /// The GID.
    pub gid: ibv_gid,
    /// Table index.
    pub gid_index: u32,
    /// Port number.
    pub port_num: u32,
    /// [`crate::sys::gid_type`].
    pub gid_type: u32,
    /// Netdev ifindex (RoCE), 0 otherwise.
    pub ndev_ifindex: u32,
}

/// `struct ibv_global_route` (24 bytes): the GRH part of an address vector.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ibv_global_route {
    /// Destination GID.
    pub dgid: ibv_gid,
    /// IPv6 flow label.
    pub flow_label: u32,
    /// Source GID index.
    pub sgid_index: u8,
    /// Hop limit (TTL).
    pub hop_limit: u8,
    /// Traffic class (DSCP << 2 | ECN on RoCE).
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr` (32 bytes): an address vector.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ibv_ah_attr {
    /// Global route (used when `is_global`).
    pub grh: ibv_global_route,
    /// Destination LID (IB).
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits.
    pub src_path_bits: u8,
    /// Static rate.
    pub static_rate: u8,
    /// 1 when `grh` is valid (always on RoCE).
    pub is_global: u8,
    /// Local port number.
    pub port_num: u8,
}

/// `struct ibv_qp_cap` (20 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ibv_qp_cap {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Inline bytes per send WR.
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr` (64 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_qp_init_attr {
    /// User pointer stored in `ibv_qp::qp_context`.
    pub qp_context: *mut c_void,
    /// Send CQ.
    pub send_cq: *mut ibv_cq,
    /// Receive CQ.
    pub recv_cq: *mut ibv_cq,
    /// Shared receive queue or null.
    pub srq: *mut c_void,
    /// Requested caps in; granted caps out.
    pub cap: ibv_qp_cap,
    /// [`crate::sys::qp_type`].
    pub qp_type: u32,
    /// Nonzero: every send WR generates a completion.
    pub sq_sig_all: c_int,
}

impl Default for ibv_qp_init_attr {
    fn default() -> Self {
        Self {
            qp_context: ptr::null_mut(),
            send_cq: ptr::null_mut(),
            recv_cq: ptr::null_mut(),
            srq: ptr::null_mut(),
            cap: ibv_qp_cap::default(),
            qp_type: 0,
            sq_sig_all: 0,
        }
    }
}

/// `struct ibv_qp_attr` (144 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ibv_qp_attr {
    /// Target state.
    pub qp_state: u32,
    /// Current state.
    pub cur_qp_state: u32,
    /// [`crate::sys::mtu`] code.
    pub path_mtu: u32,
    /// `enum ibv_mig_state`.
    pub path_mig_state: u32,
    /// Q_Key (UD).
    pub qkey: u32,
    /// Receive PSN.
    pub rq_psn: u32,
    /// Send PSN.
    pub sq_psn: u32,
    /// Remote QP number.
    pub dest_qp_num: u32,
    /// [`crate::sys::access`] bits for remote access.
    pub qp_access_flags: c_uint,
    /// Capabilities.
    pub cap: ibv_qp_cap,
    /// Primary address vector.
    pub ah_attr: ibv_ah_attr,
    /// Alternate address vector.
    pub alt_ah_attr: ibv_ah_attr,
    /// P_Key index.
    pub pkey_index: u16,
    /// Alternate P_Key index.
    pub alt_pkey_index: u16,
    /// SQD async notification.
    pub en_sqd_async_notify: u8,
    /// SQ draining (query only).
    pub sq_draining: u8,
    /// Outstanding RDMA READ / atomics as initiator.
    pub max_rd_atomic: u8,
    /// Outstanding RDMA READ / atomics as responder.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code.
    pub min_rnr_timer: u8,
    /// Local port.
    pub port_num: u8,
    /// Local ACK timeout (4.096 us * 2^timeout).
    pub timeout: u8,
    /// Transport retry count.
    pub retry_cnt: u8,
    /// RNR retry count (7 = infinite).
    pub rnr_retry: u8,
    /// Alternate port.
    pub alt_port_num: u8,
    /// Alternate timeout.
    pub alt_timeout: u8,
    /// Rate limit (kbps).
    pub rate_limit: u32,
}

/// `struct ibv_port_attr`, in its largest known form (56 bytes, rdma-core v49+).
///
/// The exported compat `ibv_query_port` fills only bytes `0..48`
/// ([`COMPAT_PORT_ATTR_LEN`]): zero the struct first and do not trust `port_cap_flags2` or
/// `active_speed_ex` from it.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ibv_port_attr {
    /// [`crate::sys::port_state`].
    pub state: u32,
    /// Largest supported MTU code.
    pub max_mtu: u32,
    /// Active MTU code.
    pub active_mtu: u32,
    /// GID table length.
    pub gid_tbl_len: c_int,
    /// Capability flags.
    pub port_cap_flags: u32,
    /// Largest message size.
    pub max_msg_sz: u32,
    /// Bad P_Key counter.
    pub bad_pkey_cntr: u32,
    /// Q_Key violation counter.
    pub qkey_viol_cntr: u32,
    /// P_Key table length.
    pub pkey_tbl_len: u16,
    /// Base LID (IB).
    pub lid: u16,
    /// Subnet manager LID.
    pub sm_lid: u16,
    /// LID mask control.
    pub lmc: u8,
    /// Virtual lanes.
    pub max_vl_num: u8,
    /// Subnet manager SL.
    pub sm_sl: u8,
    /// Subnet timeout.
    pub subnet_timeout: u8,
    /// Init type reply.
    pub init_type_reply: u8,
    /// Active width bits (1 = 1x, 2 = 4x, 4 = 8x, 8 = 12x, 16 = 2x).
    pub active_width: u8,
    /// Active lane speed bits (1 SDR .. 128 NDR).
    pub active_speed: u8,
    /// Physical state.
    pub phys_state: u8,
    /// [`crate::sys::link_layer`].
    pub link_layer: u8,
    /// [`crate::sys::port_flags`].
    pub flags: u8,
    /// Capability flags 2 (not filled by the compat `ibv_query_port`).
    pub port_cap_flags2: u16,
    /// Extended speed (v49+; not filled by the compat `ibv_query_port`).
    pub active_speed_ex: u32,
}

/// Bytes of [`ibv_port_attr`] that the exported compat `ibv_query_port` writes.
pub const COMPAT_PORT_ATTR_LEN: usize = 48;

/// `struct ibv_device_attr` (232 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ibv_device_attr {
    /// Firmware version string.
    pub fw_ver: [c_char; 64],
    /// Node GUID (big-endian value as stored).
    pub node_guid: u64,
    /// System image GUID (big-endian value as stored); equal on all ports of one NIC.
    pub sys_image_guid: u64,
    /// Largest MR.
    pub max_mr_size: u64,
    /// Supported page sizes.
    pub page_size_cap: u64,
    /// IEEE vendor id.
    pub vendor_id: u32,
    /// Vendor part id.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// Max QPs.
    pub max_qp: c_int,
    /// Max WRs per QP.
    pub max_qp_wr: c_int,
    /// Capability flags.
    pub device_cap_flags: c_uint,
    /// Max SGEs per WR.
    pub max_sge: c_int,
    /// Max SGEs per RDMA READ.
    pub max_sge_rd: c_int,
    /// Max CQs.
    pub max_cq: c_int,
    /// Max CQEs per CQ.
    pub max_cqe: c_int,
    /// Max MRs.
    pub max_mr: c_int,
    /// Max PDs.
    pub max_pd: c_int,
    /// Max outstanding RDMA READ / atomics per QP as responder.
    pub max_qp_rd_atom: c_int,
    /// EE equivalent.
    pub max_ee_rd_atom: c_int,
    /// Device-wide responder resources.
    pub max_res_rd_atom: c_int,
    /// Max outstanding RDMA READ / atomics per QP as initiator.
    pub max_qp_init_rd_atom: c_int,
    /// EE equivalent.
    pub max_ee_init_rd_atom: c_int,
    /// `enum ibv_atomic_cap`.
    pub atomic_cap: u32,
    /// Max EE contexts.
    pub max_ee: c_int,
    /// Max RDDs.
    pub max_rdd: c_int,
    /// Max memory windows.
    pub max_mw: c_int,
    /// Max raw IPv6 QPs.
    pub max_raw_ipv6_qp: c_int,
    /// Max raw Ethertype QPs.
    pub max_raw_ethy_qp: c_int,
    /// Max multicast groups.
    pub max_mcast_grp: c_int,
    /// Max QPs per multicast group.
    pub max_mcast_qp_attach: c_int,
    /// Max total multicast attachments.
    pub max_total_mcast_qp_attach: c_int,
    /// Max address handles.
    pub max_ah: c_int,
    /// Max FMRs.
    pub max_fmr: c_int,
    /// Max maps per FMR.
    pub max_map_per_fmr: c_int,
    /// Max SRQs.
    pub max_srq: c_int,
    /// Max WRs per SRQ.
    pub max_srq_wr: c_int,
    /// Max SGEs per SRQ WR.
    pub max_srq_sge: c_int,
    /// Max P_Keys.
    pub max_pkeys: u16,
    /// Local CA ACK delay.
    pub local_ca_ack_delay: u8,
    /// Number of physical ports (numbered from 1).
    pub phys_port_cnt: u8,
}

impl Default for ibv_device_attr {
    fn default() -> Self {
        Self {
            fw_ver: [0; 64],
            node_guid: 0,
            sys_image_guid: 0,
            max_mr_size: 0,
            page_size_cap: 0,
            vendor_id: 0,
            vendor_part_id: 0,
            hw_ver: 0,
            max_qp: 0,
            max_qp_wr: 0,
            device_cap_flags: 0,
            max_sge: 0,
            max_sge_rd: 0,
            max_cq: 0,
            max_cqe: 0,
            max_mr: 0,
            max_pd: 0,
            max_qp_rd_atom: 0,
            max_ee_rd_atom: 0,
            max_res_rd_atom: 0,
            max_qp_init_rd_atom: 0,
            max_ee_init_rd_atom: 0,
            atomic_cap: 0,
            max_ee: 0,
            max_rdd: 0,
            max_mw: 0,
            max_raw_ipv6_qp: 0,
            max_raw_ethy_qp: 0,
            max_mcast_grp: 0,
            max_mcast_qp_attach: 0,
            max_total_mcast_qp_attach: 0,
            max_ah: 0,
            max_fmr: 0,
            max_map_per_fmr: 0,
            max_srq: 0,
            max_srq_wr: 0,
            max_srq_sge: 0,
            max_pkeys: 0,
            local_ca_ack_delay: 0,
            phys_port_cnt: 0,
        }
    }
}

/// The `element` union of `struct ibv_async_event`: which object the event is about.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_async_element {
    /// CQ events.
    pub cq: *mut ibv_cq,
    /// QP events.
    pub qp: *mut ibv_qp,
    /// SRQ events.
    pub srq: *mut c_void,
    /// WQ events.
    pub wq: *mut c_void,
    /// Port events.
    pub port_num: c_int,
}

impl core::fmt::Debug for ibv_async_element {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("ibv_async_element { .. }")
    }
}

/// `struct ibv_async_event` (16 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_async_event {
    /// The object concerned.
    pub element: ibv_async_element,
    /// [`crate::sys::event_type`].
    pub event_type: u32,
}

impl Default for ibv_async_event {
    fn default() -> Self {
        Self {
            element: ibv_async_element {
                cq: ptr::null_mut(),
            },
            event_type: 0,
        }
    }
}

/// `struct ibv_ece` (12 bytes): enhanced connection establishment options.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ibv_ece {
    /// Vendor id (0 = none).
    pub vendor_id: u32,
    /// Vendor-specific options.
    pub options: u32,
    /// Reserved.
    pub comp_mask: u32,
}

/// One field of a checked layout: its Rust name and offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldLayout {
    /// The Rust field name.
    pub name: &'static str,
    /// Its byte offset.
    pub offset: usize,
}

/// The checked layout of one hand-written `repr(C)` type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TypeLayout {
    /// The Rust type name.
    pub name: &'static str,
    /// `size_of`.
    pub size: usize,
    /// `align_of`.
    pub align: usize,
    /// Every field, in declaration order.
    pub fields: &'static [FieldLayout],
}

/// Asserts a type's layout at compile time against the given numbers and yields its [`TypeLayout`].
/// The one layout macro of the crate (the verbs mirrors here, the mlx5dv ones in `mlx5::dv`).
macro_rules! checked_layout {
    ($ty:ident, size $size:literal, align $align:literal { $($field:ident @ $off:literal),* $(,)? }) => {{
        const _: () = {
            assert!(size_of::<$ty>() == $size);
            assert!(align_of::<$ty>() == $align);
            $(assert!(offset_of!($ty, $field) == $off);)*
        };
        TypeLayout {
            name: stringify!($ty),
            size: size_of::<$ty>(),
            align: align_of::<$ty>(),
            fields: &[$(FieldLayout { name: stringify!($field), offset: offset_of!($ty, $field) }),*],
        }
    }};
}
pub(crate) use checked_layout;

/// Layouts of every type above; each entry is also a set of compile-time asserts.
pub static LAYOUTS: &[TypeLayout] = &[
    checked_layout!(ibv_device, size 664, align 8 {
        _ops @ 0, node_type @ 16, transport_type @ 20, name @ 24, dev_name @ 88, dev_path @ 152, ibdev_path @ 408,
    }),
    checked_layout!(ibv_context_ops, size 256, align 8 {
        _compat_query_device @ 0, _compat_query_port @ 8, _compat_alloc_pd @ 16, _compat_dealloc_pd @ 24,
        _compat_reg_mr @ 32, _compat_rereg_mr @ 40, _compat_dereg_mr @ 48, alloc_mw @ 56, bind_mw @ 64,
        dealloc_mw @ 72, _compat_create_cq @ 80, poll_cq @ 88, req_notify_cq @ 96, _compat_cq_event @ 104,
        _compat_resize_cq @ 112, _compat_destroy_cq @ 120, _compat_create_srq @ 128, _compat_modify_srq @ 136,
        _compat_query_srq @ 144, _compat_destroy_srq @ 152, post_srq_recv @ 160, _compat_create_qp @ 168,
        _compat_query_qp @ 176, _compat_modify_qp @ 184, _compat_destroy_qp @ 192, post_send @ 200,
        post_recv @ 208, _compat_create_ah @ 216, _compat_destroy_ah @ 224, _compat_attach_mcast @ 232,
        _compat_detach_mcast @ 240, _compat_async_event @ 248,
    }),
    checked_layout!(ibv_context, size 328, align 8 {
        device @ 0, ops @ 8, cmd_fd @ 264, async_fd @ 268, num_comp_vectors @ 272, mutex @ 280, abi_compat @ 320,
    }),
    checked_layout!(ibv_pd, size 16, align 8 { context @ 0, handle @ 8 }),
    checked_layout!(ibv_cq, size 128, align 8 {
        context @ 0, channel @ 8, cq_context @ 16, handle @ 24, cqe @ 28, mutex @ 32, cond @ 72,
        comp_events_completed @ 120, async_events_completed @ 124,
    }),
    checked_layout!(ibv_qp, size 160, align 8 {
        context @ 0, qp_context @ 8, pd @ 16, send_cq @ 24, recv_cq @ 32, srq @ 40, handle @ 48, qp_num @ 52,
        state @ 56, qp_type @ 60, mutex @ 64, cond @ 104, events_completed @ 152,
    }),
    checked_layout!(ibv_mr, size 48, align 8 {
        context @ 0, pd @ 8, addr @ 16, length @ 24, handle @ 32, lkey @ 36, rkey @ 40,
    }),
    checked_layout!(ibv_sge, size 16, align 8 { addr @ 0, length @ 8, lkey @ 12 }),
    checked_layout!(ibv_rdma_wr, size 16, align 8 { remote_addr @ 0, rkey @ 8 }),
    checked_layout!(ibv_atomic_wr, size 32, align 8 { remote_addr @ 0, compare_add @ 8, swap @ 16, rkey @ 24 }),
    checked_layout!(ibv_ud_wr, size 16, align 8 { ah @ 0, remote_qpn @ 8, remote_qkey @ 12 }),
    checked_layout!(ibv_send_wr_wr, size 32, align 8 { rdma @ 0, atomic @ 0, ud @ 0 }),
    checked_layout!(ibv_send_wr, size 128, align 8 {
        wr_id @ 0, next @ 8, sg_list @ 16, num_sge @ 24, opcode @ 28, send_flags @ 32, imm_data @ 36, wr @ 40,
        xrc_remote_srqn @ 72, bind_mw_or_tso @ 80,
    }),
    checked_layout!(ibv_recv_wr, size 32, align 8 { wr_id @ 0, next @ 8, sg_list @ 16, num_sge @ 24 }),
    checked_layout!(ibv_wc, size 48, align 8 {
        wr_id @ 0, status @ 8, opcode @ 12, vendor_err @ 16, byte_len @ 20, imm_data @ 24, qp_num @ 28,
        src_qp @ 32, wc_flags @ 36, pkey_index @ 40, slid @ 42, sl @ 44, dlid_path_bits @ 45,
    }),
    checked_layout!(ibv_gid, size 16, align 8 { raw @ 0 }),
    checked_layout!(ibv_gid_entry, size 32, align 8 {
        gid @ 0, gid_index @ 16, port_num @ 20, gid_type @ 24, ndev_ifindex @ 28,
    }),
    checked_layout!(ibv_global_route, size 24, align 8 {
        dgid @ 0, flow_label @ 16, sgid_index @ 20, hop_limit @ 21, traffic_class @ 22,
    }),
    checked_layout!(ibv_ah_attr, size 32, align 8 {
        grh @ 0, dlid @ 24, sl @ 26, src_path_bits @ 27, static_rate @ 28, is_global @ 29, port_num @ 30,
    }),
    checked_layout!(ibv_qp_cap, size 20, align 4 {
        max_send_wr @ 0, max_recv_wr @ 4, max_send_sge @ 8, max_recv_sge @ 12, max_inline_data @ 16,
    }),
    checked_layout!(ibv_qp_init_attr, size 64, align 8 {
        qp_context @ 0, send_cq @ 8, recv_cq @ 16, srq @ 24, cap @ 32, qp_type @ 52, sq_sig_all @ 56,
    }),
    checked_layout!(ibv_qp_attr, size 144, align 8 {
        qp_state @ 0, cur_qp_state @ 4, path_mtu @ 8, path_mig_state @ 12, qkey @ 16, rq_psn @ 20, sq_psn @ 24,
        dest_qp_num @ 28, qp_access_flags @ 32, cap @ 36, ah_attr @ 56, alt_ah_attr @ 88, pkey_index @ 120,
        alt_pkey_index @ 122, en_sqd_async_notify @ 124, sq_draining @ 125, max_rd_atomic @ 126,
        max_dest_rd_atomic @ 127, min_rnr_timer @ 128, port_num @ 129, timeout @ 130, retry_cnt @ 131,
        rnr_retry @ 132, alt_port_num @ 133, alt_timeout @ 134, rate_limit @ 136,
    }),
    checked_layout!(ibv_port_attr, size 56, align 4 {
        state @ 0, max_mtu @ 4, active_mtu @ 8, gid_tbl_len @ 12, port_cap_flags @ 16, max_msg_sz @ 20,
        bad_pkey_cntr @ 24, qkey_viol_cntr @ 28, pkey_tbl_len @ 32, lid @ 34, sm_lid @ 36, lmc @ 38,
        max_vl_num @ 39, sm_sl @ 40, subnet_timeout @ 41, init_type_reply @ 42, active_width @ 43,
        active_speed @ 44, phys_state @ 45, link_layer @ 46, flags @ 47, port_cap_flags2 @ 48,
        active_speed_ex @ 52,
    }),
    checked_layout!(ibv_device_attr, size 232, align 8 {
        fw_ver @ 0, node_guid @ 64, sys_image_guid @ 72, max_mr_size @ 80, page_size_cap @ 88, vendor_id @ 96,
        vendor_part_id @ 100, hw_ver @ 104, max_qp @ 108, max_qp_wr @ 112, device_cap_flags @ 116, max_sge @ 120,
        max_sge_rd @ 124, max_cq @ 128, max_cqe @ 132, max_mr @ 136, max_pd @ 140, max_qp_rd_atom @ 144,
        max_ee_rd_atom @ 148, max_res_rd_atom @ 152, max_qp_init_rd_atom @ 156, max_ee_init_rd_atom @ 160,
        atomic_cap @ 164, max_ee @ 168, max_rdd @ 172, max_mw @ 176, max_raw_ipv6_qp @ 180,
        max_raw_ethy_qp @ 184, max_mcast_grp @ 188, max_mcast_qp_attach @ 192,
        max_total_mcast_qp_attach @ 196, max_ah @ 200, max_fmr @ 204, max_map_per_fmr @ 208, max_srq @ 212,
        max_srq_wr @ 216, max_srq_sge @ 220, max_pkeys @ 224, local_ca_ack_delay @ 226, phys_port_cnt @ 227,
    }),
    checked_layout!(ibv_async_element, size 8, align 8 { cq @ 0, qp @ 0, srq @ 0, wq @ 0, port_num @ 0 }),
    checked_layout!(ibv_async_event, size 16, align 8 { element @ 0, event_type @ 8 }),
    checked_layout!(ibv_ece, size 12, align 4 { vendor_id @ 0, options @ 4, comp_mask @ 8 }),
];

/// Byte offsets from an `ibv_context` that the inline data-path verbs read (reference §0).
pub const CONTEXT_OPS_POLL_CQ: usize =
    offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, poll_cq);
/// See [`CONTEXT_OPS_POLL_CQ`].
pub const CONTEXT_OPS_POST_SEND: usize =
    offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_send);
/// See [`CONTEXT_OPS_POLL_CQ`].
pub const CONTEXT_OPS_POST_RECV: usize =
    offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_recv);
const _: () = {
    assert!(CONTEXT_OPS_POLL_CQ == 96);
    assert!(CONTEXT_OPS_POST_SEND == 208);
    assert!(CONTEXT_OPS_POST_RECV == 216);
    assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, req_notify_cq) == 104);
    assert!(COMPAT_PORT_ATTR_LEN == offset_of!(ibv_port_attr, port_cap_flags2));
};

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(name: &str) -> &'static TypeLayout {
        LAYOUTS
            .iter()
            .find(|l| l.name == name)
            .unwrap_or_else(|| panic!("no layout for {name}"))
    }

    fn offset(ty: &str, field: &str) -> usize {
        layout(ty)
            .fields
            .iter()
            .find(|f| f.name == field)
            .unwrap_or_else(|| panic!("no field {ty}::{field}"))
            .offset
    }

    #[test]
    fn sizes_match_the_reference_table() {
        let expected = [
            ("ibv_context", 328),
            ("ibv_context_ops", 256),
            ("ibv_qp", 160),
            ("ibv_cq", 128),
            ("ibv_mr", 48),
            ("ibv_sge", 16),
            ("ibv_send_wr", 128),
            ("ibv_recv_wr", 32),
            ("ibv_wc", 48),
            ("ibv_qp_attr", 144),
            ("ibv_qp_init_attr", 64),
            ("ibv_qp_cap", 20),
            ("ibv_ah_attr", 32),
            ("ibv_global_route", 24),
            ("ibv_gid", 16),
            ("ibv_gid_entry", 32),
            ("ibv_device_attr", 232),
            ("ibv_port_attr", 56),
            ("ibv_async_event", 16),
            ("ibv_ece", 12),
            ("ibv_pd", 16),
            ("ibv_device", 664),
        ];
        for (name, size) in expected {
            assert_eq!(layout(name).size, size, "{name}");
        }
    }

    #[test]
    fn key_offsets_match_the_reference_table() {
        assert_eq!(offset("ibv_qp", "qp_num"), 52);
        assert_eq!(offset("ibv_mr", "lkey"), 36);
        assert_eq!(offset("ibv_mr", "rkey"), 40);
        assert_eq!(offset("ibv_cq", "cqe"), 28);
        assert_eq!(offset("ibv_port_attr", "link_layer"), 46);
        assert_eq!(offset("ibv_send_wr", "wr"), 40);
        assert_eq!(offset("ibv_wc", "imm_data"), 24);
        assert_eq!(offset("ibv_context", "async_fd"), 268);
        assert_eq!(
            offset("ibv_context", "ops") + offset("ibv_context_ops", "poll_cq"),
            96
        );
        assert_eq!(
            offset("ibv_context", "ops") + offset("ibv_context_ops", "post_send"),
            208
        );
        assert_eq!(
            offset("ibv_context", "ops") + offset("ibv_context_ops", "post_recv"),
            216
        );
    }

    #[test]
    fn fields_are_in_order_and_inside_the_type() {
        for l in LAYOUTS {
            assert!(!l.fields.is_empty(), "{}", l.name);
            for pair in l.fields.windows(2) {
                assert!(
                    pair[0].offset <= pair[1].offset,
                    "{}: {} after {}",
                    l.name,
                    pair[1].name,
                    pair[0].name
                );
            }
            assert!(l.fields.iter().all(|f| f.offset < l.size), "{}", l.name);
            assert_eq!(l.size % l.align, 0, "{}", l.name);
        }
    }

    #[test]
    fn ops_table_has_32_slots() {
        assert_eq!(layout("ibv_context_ops").fields.len(), 32);
        assert_eq!(size_of::<Option<PollCqFn>>(), size_of::<*const c_void>());
    }

    #[test]
    fn mtu_codes_convert_to_bytes() {
        use crate::sys::mtu;
        assert_eq!(mtu::bytes(mtu::MTU_256), Some(256));
        assert_eq!(mtu::bytes(mtu::MTU_1024), Some(1024));
        assert_eq!(mtu::bytes(mtu::MTU_4096), Some(4096));
        assert_eq!(mtu::bytes(0), None);
        assert_eq!(mtu::bytes(6), None);
    }
}
