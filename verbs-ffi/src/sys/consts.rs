//! Constant values of the libibverbs C enums (rdma-core `verbs.h`), as plain integers.
//!
//! C enums are `int`-sized; the struct fields that hold them are `u32` in [`super::types`].

/// `enum ibv_wr_opcode`: what a send work request does.
pub mod wr_opcode {
    /// RDMA WRITE.
    pub const RDMA_WRITE: u32 = 0;
    /// RDMA WRITE that also consumes a receive WR at the peer and carries 32 bits of immediate data.
    pub const RDMA_WRITE_WITH_IMM: u32 = 1;
    /// SEND.
    pub const SEND: u32 = 2;
    /// SEND with immediate data.
    pub const SEND_WITH_IMM: u32 = 3;
    /// RDMA READ.
    pub const RDMA_READ: u32 = 4;
    /// 64-bit atomic compare and swap.
    pub const ATOMIC_CMP_AND_SWP: u32 = 5;
    /// 64-bit atomic fetch and add.
    pub const ATOMIC_FETCH_AND_ADD: u32 = 6;
    /// Local invalidate.
    pub const LOCAL_INV: u32 = 7;
    /// Bind a memory window.
    pub const BIND_MW: u32 = 8;
    /// SEND with remote invalidate.
    pub const SEND_WITH_INV: u32 = 9;
}

/// `enum ibv_send_flags`: bits of `ibv_send_wr::send_flags`.
pub mod send_flags {
    /// Wait for earlier RDMA READ / atomic WRs to finish first.
    pub const FENCE: u32 = 1;
    /// Generate a completion for this WR (the QP is created with `sq_sig_all = 0`).
    pub const SIGNALED: u32 = 2;
    /// Set the solicited-event bit.
    pub const SOLICITED: u32 = 4;
    /// Copy the payload into the WQE; the buffers need no MR and may be reused at once.
    pub const INLINE: u32 = 8;
    /// Offload the IP checksum (raw packet QPs only).
    pub const IP_CSUM: u32 = 16;
}

/// `enum ibv_access_flags`: memory region and QP access rights.
pub mod access {
    /// The local HCA may write (required by `REMOTE_WRITE` and `REMOTE_ATOMIC`).
    pub const LOCAL_WRITE: u32 = 1;
    /// Peers may RDMA WRITE.
    pub const REMOTE_WRITE: u32 = 2;
    /// Peers may RDMA READ.
    pub const REMOTE_READ: u32 = 4;
    /// Peers may run atomics.
    pub const REMOTE_ATOMIC: u32 = 8;
    /// Memory windows may be bound.
    pub const MW_BIND: u32 = 0x10;
    /// Zero-based addressing.
    pub const ZERO_BASED: u32 = 0x20;
    /// On-demand paging.
    pub const ON_DEMAND: u32 = 0x40;
    /// Huge-page backed.
    pub const HUGETLB: u32 = 0x80;
    /// PCIe relaxed ordering (an "optional" access bit: ignored where unsupported).
    pub const RELAXED_ORDERING: u32 = 0x10_0000;
    /// All optional access bits (`IBV_ACCESS_OPTIONAL_RANGE`, bits 20..=29).
    pub const OPTIONAL_RANGE: u32 = 0x3ff0_0000;
}

/// `enum ibv_qp_state`.
pub mod qp_state {
    /// RESET.
    pub const RESET: u32 = 0;
    /// INIT.
    pub const INIT: u32 = 1;
    /// Ready to receive.
    pub const RTR: u32 = 2;
    /// Ready to send.
    pub const RTS: u32 = 3;
    /// Send queue drained.
    pub const SQD: u32 = 4;
    /// Send queue error.
    pub const SQE: u32 = 5;
    /// Error.
    pub const ERR: u32 = 6;
    /// Unknown.
    pub const UNKNOWN: u32 = 7;
}

/// `enum ibv_qp_attr_mask`: which `ibv_qp_attr` fields `ibv_modify_qp` applies.
pub mod qp_attr_mask {
    /// `qp_state`.
    pub const STATE: i32 = 1 << 0;
    /// `cur_qp_state`.
    pub const CUR_STATE: i32 = 1 << 1;
    /// `en_sqd_async_notify`.
    pub const EN_SQD_ASYNC_NOTIFY: i32 = 1 << 2;
    /// `qp_access_flags`.
    pub const ACCESS_FLAGS: i32 = 1 << 3;
    /// `pkey_index`.
    pub const PKEY_INDEX: i32 = 1 << 4;
    /// `port_num`.
    pub const PORT: i32 = 1 << 5;
    /// `qkey`.
    pub const QKEY: i32 = 1 << 6;
    /// `ah_attr` (address vector).
    pub const AV: i32 = 1 << 7;
    /// `path_mtu`.
    pub const PATH_MTU: i32 = 1 << 8;
    /// `timeout`.
    pub const TIMEOUT: i32 = 1 << 9;
    /// `retry_cnt`.
    pub const RETRY_CNT: i32 = 1 << 10;
    /// `rnr_retry`.
    pub const RNR_RETRY: i32 = 1 << 11;
    /// `rq_psn`.
    pub const RQ_PSN: i32 = 1 << 12;
    /// `max_rd_atomic`.
    pub const MAX_QP_RD_ATOMIC: i32 = 1 << 13;
    /// Alternate path.
    pub const ALT_PATH: i32 = 1 << 14;
    /// `min_rnr_timer`.
    pub const MIN_RNR_TIMER: i32 = 1 << 15;
    /// `sq_psn`.
    pub const SQ_PSN: i32 = 1 << 16;
    /// `max_dest_rd_atomic`.
    pub const MAX_DEST_RD_ATOMIC: i32 = 1 << 17;
    /// `path_mig_state`.
    pub const PATH_MIG_STATE: i32 = 1 << 18;
    /// `cap`.
    pub const CAP: i32 = 1 << 19;
    /// `dest_qp_num`.
    pub const DEST_QPN: i32 = 1 << 20;
    /// `rate_limit`.
    pub const RATE_LIMIT: i32 = 1 << 25;
}

/// `enum ibv_qp_type`.
pub mod qp_type {
    /// Reliable connected.
    pub const RC: u32 = 2;
    /// Unreliable connected.
    pub const UC: u32 = 3;
    /// Unreliable datagram.
    pub const UD: u32 = 4;
}

/// `enum ibv_wc_status`: `ibv_wc::status`.
pub mod wc_status {
    /// Success.
    pub const SUCCESS: u32 = 0;
    /// Local length error.
    pub const LOC_LEN_ERR: u32 = 1;
    /// Local QP operation error.
    pub const LOC_QP_OP_ERR: u32 = 2;
    /// Local EE context operation error.
    pub const LOC_EEC_OP_ERR: u32 = 3;
    /// Local protection error (bad lkey or address outside the MR).
    pub const LOC_PROT_ERR: u32 = 4;
    /// Flushed because the QP went to the error state.
    pub const WR_FLUSH_ERR: u32 = 5;
    /// Memory window bind error.
    pub const MW_BIND_ERR: u32 = 6;
    /// Bad response.
    pub const BAD_RESP_ERR: u32 = 7;
    /// Local access error.
    pub const LOC_ACCESS_ERR: u32 = 8;
    /// Remote invalid request.
    pub const REM_INV_REQ_ERR: u32 = 9;
    /// Remote access error (bad rkey or range).
    pub const REM_ACCESS_ERR: u32 = 10;
    /// Remote operation error.
    pub const REM_OP_ERR: u32 = 11;
    /// Transport retry counter exceeded.
    pub const RETRY_EXC_ERR: u32 = 12;
    /// RNR retry counter exceeded.
    pub const RNR_RETRY_EXC_ERR: u32 = 13;
    /// Local RDD violation.
    pub const LOC_RDD_VIOL_ERR: u32 = 14;
    /// Remote invalid RD request.
    pub const REM_INV_RD_REQ_ERR: u32 = 15;
    /// Remote aborted.
    pub const REM_ABORT_ERR: u32 = 16;
    /// Invalid EE context number.
    pub const INV_EECN_ERR: u32 = 17;
    /// Invalid EE context state.
    pub const INV_EEC_STATE_ERR: u32 = 18;
    /// Fatal error.
    pub const FATAL_ERR: u32 = 19;
    /// Response timeout.
    pub const RESP_TIMEOUT_ERR: u32 = 20;
    /// General error.
    pub const GENERAL_ERR: u32 = 21;
}

/// `enum ibv_wc_opcode`: `ibv_wc::opcode`.
pub mod wc_opcode {
    /// SEND completed.
    pub const SEND: u32 = 0;
    /// RDMA WRITE (with or without immediate) completed.
    pub const RDMA_WRITE: u32 = 1;
    /// RDMA READ completed.
    pub const RDMA_READ: u32 = 2;
    /// Compare and swap completed.
    pub const COMP_SWAP: u32 = 3;
    /// Fetch and add completed.
    pub const FETCH_ADD: u32 = 4;
    /// Memory window bound.
    pub const BIND_MW: u32 = 5;
    /// Local invalidate completed.
    pub const LOCAL_INV: u32 = 6;
    /// A receive WR consumed by a SEND.
    pub const RECV: u32 = 128;
    /// A receive WR consumed by an RDMA WRITE WITH IMM.
    pub const RECV_RDMA_WITH_IMM: u32 = 129;
}

/// `enum ibv_wc_flags`: bits of `ibv_wc::wc_flags`.
pub mod wc_flags {
    /// A GRH is present (UD).
    pub const GRH: u32 = 1;
    /// `imm_data` is valid.
    pub const WITH_IMM: u32 = 2;
    /// IP checksum verified.
    pub const IP_CSUM_OK: u32 = 4;
    /// `imm_data` holds an invalidated rkey.
    pub const WITH_INV: u32 = 8;
}

/// `enum ibv_mtu`: path and port MTU codes.
pub mod mtu {
    /// 256 bytes.
    pub const MTU_256: u32 = 1;
    /// 512 bytes.
    pub const MTU_512: u32 = 2;
    /// 1024 bytes.
    pub const MTU_1024: u32 = 3;
    /// 2048 bytes.
    pub const MTU_2048: u32 = 4;
    /// 4096 bytes.
    pub const MTU_4096: u32 = 5;

    /// The MTU in bytes for an `ibv_mtu` code, or `None` for an unknown code.
    pub const fn bytes(code: u32) -> Option<u32> {
        match code {
            MTU_256..=MTU_4096 => Some(128 << code),
            _ => None,
        }
    }
}

/// `enum ibv_port_state`.
pub mod port_state {
    /// No state change.
    pub const NOP: u32 = 0;
    /// Down.
    pub const DOWN: u32 = 1;
    /// Initializing.
    pub const INIT: u32 = 2;
    /// Armed.
    pub const ARMED: u32 = 3;
    /// Active: the only state in which the port carries traffic.
    pub const ACTIVE: u32 = 4;
    /// Active, deferred.
    pub const ACTIVE_DEFER: u32 = 5;
}

/// `IBV_LINK_LAYER_*`: `ibv_port_attr::link_layer`.
pub mod link_layer {
    /// Unspecified (old kernels: InfiniBand).
    pub const UNSPECIFIED: u8 = 0;
    /// InfiniBand.
    pub const INFINIBAND: u8 = 1;
    /// Ethernet (RoCE).
    pub const ETHERNET: u8 = 2;
}

/// `enum ibv_gid_type` as returned in `ibv_gid_entry::gid_type`.
pub mod gid_type {
    /// InfiniBand GID.
    pub const IB: u32 = 0;
    /// RoCE v1.
    pub const ROCE_V1: u32 = 1;
    /// RoCE v2 (routable, UDP/IP encapsulated).
    pub const ROCE_V2: u32 = 2;
}

/// `IBV_QPF_*`: `ibv_port_attr::flags`.
pub mod port_flags {
    /// The port requires a GRH on every packet.
    pub const GRH_REQUIRED: u8 = 1;
}

/// `enum ibv_event_type`: `ibv_async_event::event_type`.
pub mod event_type {
    /// CQ overrun or error.
    pub const CQ_ERR: u32 = 0;
    /// QP fatal error.
    pub const QP_FATAL: u32 = 1;
    /// Invalid request on a QP.
    pub const QP_REQ_ERR: u32 = 2;
    /// Access violation on a QP.
    pub const QP_ACCESS_ERR: u32 = 3;
    /// Communication established.
    pub const COMM_EST: u32 = 4;
    /// Send queue drained.
    pub const SQ_DRAINED: u32 = 5;
    /// Path migrated.
    pub const PATH_MIG: u32 = 6;
    /// Path migration error.
    pub const PATH_MIG_ERR: u32 = 7;
    /// Device fatal error.
    pub const DEVICE_FATAL: u32 = 8;
    /// Port became active.
    pub const PORT_ACTIVE: u32 = 9;
    /// Port error (went down).
    pub const PORT_ERR: u32 = 10;
    /// LID changed.
    pub const LID_CHANGE: u32 = 11;
    /// P_Key table changed.
    pub const PKEY_CHANGE: u32 = 12;
    /// Subnet manager changed.
    pub const SM_CHANGE: u32 = 13;
    /// SRQ error.
    pub const SRQ_ERR: u32 = 14;
    /// SRQ limit reached.
    pub const SRQ_LIMIT_REACHED: u32 = 15;
    /// Last WQE reached.
    pub const QP_LAST_WQE_REACHED: u32 = 16;
    /// Client re-register.
    pub const CLIENT_REREGISTER: u32 = 17;
    /// GID table changed (RoCE address change).
    pub const GID_CHANGE: u32 = 18;
    /// WQ fatal error.
    pub const WQ_FATAL: u32 = 19;
}

/// `enum ibv_fork_status`: what `ibv_is_fork_initialized` reports.
pub mod fork_status {
    /// Fork protection is off.
    pub const DISABLED: i32 = 0;
    /// Fork protection is on.
    pub const ENABLED: i32 = 1;
    /// The kernel pins pages safely; no fork protection is needed.
    pub const UNNEEDED: i32 = 2;
}
