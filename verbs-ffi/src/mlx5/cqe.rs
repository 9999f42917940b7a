//! mlx5 completion-queue entries (`struct mlx5_cqe64`, `struct mlx5_err_cqe`; reference
//! verbs-mlx5dv §0, §2.8): the decoder the poller uses, the encoder the software model writes
//! with, the ownership test, and the error-syndrome → `ibv_wc_status` mapping of rdma-core's
//! `mlx5_handle_error_cqe`.

use super::wqe::{be16, be32};
use crate::sys::wc_status;

/// Bytes of the 64-byte CQE format (a 128-byte CQE keeps it in its last 64 bytes).
pub const CQE64_LEN: usize = 64;

/// Byte offsets inside a 64-byte CQE.
pub mod offset {
    /// `flags_rqpn` (BE32): bits 23:0 the source QP of a responder CQE.
    pub const FLAGS_RQPN: usize = 24;
    /// `srqn_uidx` (BE32).
    pub const SRQN_UIDX: usize = 32;
    /// `imm_inval_pkey`: the immediate's wire bytes.
    pub const IMM_INVAL_PKEY: usize = 36;
    /// `byte_cnt` (BE32).
    pub const BYTE_CNT: usize = 44;
    /// `timestamp` (BE64).
    pub const TIMESTAMP: usize = 48;
    /// `vendor_err_synd` of an error CQE.
    pub const VENDOR_ERR_SYND: usize = 54;
    /// `syndrome` of an error CQE.
    pub const SYNDROME: usize = 55;
    /// `sop_drop_qpn` (BE32): bits 31:24 the WQE opcode (requester), 23:0 the QPN.
    pub const SOP_DROP_QPN: usize = 56;
    /// `wqe_counter` (BE16).
    pub const WQE_COUNTER: usize = 60;
    /// `signature`.
    pub const SIGNATURE: usize = 62;
    /// `op_own`: opcode 7:4, format 3:2, solicited 1, owner 0.
    pub const OP_OWN: usize = 63;
}

/// CQE opcodes (`op_own >> 4`).
pub mod opcode {
    /// Requester completion.
    pub const REQ: u8 = 0;
    /// Responder: RDMA WRITE WITH IMMEDIATE.
    pub const RESP_WR_IMM: u8 = 1;
    /// Responder: SEND.
    pub const RESP_SEND: u8 = 2;
    /// Responder: SEND WITH IMMEDIATE.
    pub const RESP_SEND_IMM: u8 = 3;
    /// Responder: SEND WITH INVALIDATE.
    pub const RESP_SEND_INV: u8 = 4;
    /// CQ resize marker (ignored).
    pub const RESIZE_CQ: u8 = 5;
    /// Tag-matching no-packet CQE.
    pub const NO_PACKET: u8 = 6;
    /// Signature error.
    pub const SIG_ERR: u8 = 12;
    /// Requester error.
    pub const REQ_ERR: u8 = 13;
    /// Responder error.
    pub const RESP_ERR: u8 = 14;
    /// Never written by hardware: how the provider initialises every CQE.
    pub const INVALID: u8 = 15;
}

/// Error syndromes (`MLX5_CQE_SYNDROME_*`).
pub mod syndrome {
    /// Local length error.
    pub const LOCAL_LENGTH_ERR: u8 = 0x01;
    /// Local QP operation error.
    pub const LOCAL_QP_OP_ERR: u8 = 0x02;
    /// Local protection error.
    pub const LOCAL_PROT_ERR: u8 = 0x04;
    /// Work request flushed.
    pub const WR_FLUSH_ERR: u8 = 0x05;
    /// Memory-window bind error.
    pub const MW_BIND_ERR: u8 = 0x06;
    /// Bad response.
    pub const BAD_RESP_ERR: u8 = 0x10;
    /// Local access error.
    pub const LOCAL_ACCESS_ERR: u8 = 0x11;
    /// Remote invalid request.
    pub const REMOTE_INVAL_REQ_ERR: u8 = 0x12;
    /// Remote access error.
    pub const REMOTE_ACCESS_ERR: u8 = 0x13;
    /// Remote operation error.
    pub const REMOTE_OP_ERR: u8 = 0x14;
    /// Transport retry counter exceeded.
    pub const TRANSPORT_RETRY_EXC_ERR: u8 = 0x15;
    /// RNR retry counter exceeded.
    pub const RNR_RETRY_EXC_ERR: u8 = 0x16;
    /// Remote abort.
    pub const REMOTE_ABORTED_ERR: u8 = 0x22;
}

/// `ibv_wc_status` of an error syndrome, as rdma-core's `mlx5_handle_error_cqe` maps it.
pub const fn syndrome_status(syndrome: u8) -> u32 {
    match syndrome {
        syndrome::LOCAL_LENGTH_ERR => wc_status::LOC_LEN_ERR,
        syndrome::LOCAL_QP_OP_ERR => wc_status::LOC_QP_OP_ERR,
        syndrome::LOCAL_PROT_ERR => wc_status::LOC_PROT_ERR,
        syndrome::WR_FLUSH_ERR => wc_status::WR_FLUSH_ERR,
        syndrome::MW_BIND_ERR => wc_status::MW_BIND_ERR,
        syndrome::BAD_RESP_ERR => wc_status::BAD_RESP_ERR,
        syndrome::LOCAL_ACCESS_ERR => wc_status::LOC_ACCESS_ERR,
        syndrome::REMOTE_INVAL_REQ_ERR => wc_status::REM_INV_REQ_ERR,
        syndrome::REMOTE_ACCESS_ERR => wc_status::REM_ACCESS_ERR,
        syndrome::REMOTE_OP_ERR => wc_status::REM_OP_ERR,
        syndrome::TRANSPORT_RETRY_EXC_ERR => wc_status::RETRY_EXC_ERR,
        syndrome::RNR_RETRY_EXC_ERR => wc_status::RNR_RETRY_EXC_ERR,
        syndrome::REMOTE_ABORTED_ERR => wc_status::REM_ABORT_ERR,
        _ => wc_status::GENERAL_ERR,
    }
}

/// Whether software owns the CQE at consumer index `ci` of a ring of `cqe_cnt` (a power of two)
/// entries: the owner bit equals the ring's pass parity and the opcode is not `INVALID`
/// (rdma-core `get_sw_cqe`).
pub const fn sw_owns(op_own: u8, ci: u32, cqe_cnt: u32) -> bool {
    op_own >> 4 != opcode::INVALID && (op_own & 1 != 0) == (ci & cqe_cnt != 0)
}

/// The fields of a CQE the data path reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Cqe {
    /// [`opcode`] (`op_own >> 4`).
    pub opcode: u8,
    /// Format (`op_own >> 2 & 3`): 0 normal, 1/2 inline scatter, 3 compressed.
    pub format: u8,
    /// Owner bit.
    pub owner: bool,
    /// Responder: source QP (`flags_rqpn & 0xffffff`).
    pub src_qp: u32,
    /// Immediate wire bytes (`imm_inval_pkey`).
    pub imm: [u8; 4],
    /// Bytes transferred (`byte_cnt`).
    pub byte_cnt: u32,
    /// Error CQE: vendor syndrome.
    pub vendor_err: u8,
    /// Error CQE: syndrome.
    pub syndrome: u8,
    /// Requester: the WQE's mlx5 opcode (`sop_drop_qpn >> 24`).
    pub wqe_opcode: u8,
    /// The QP number (`sop_drop_qpn & 0xffffff`).
    pub qpn: u32,
    /// Requester: first basic block of the WQE; responder: the receive WQE's counter.
    pub wqe_counter: u16,
}

impl Cqe {
    /// Decode the 64 bytes of a CQE (the body; call only after the ownership test).
    pub fn decode(bytes: &[u8; CQE64_LEN]) -> Self {
        let op_own = bytes[offset::OP_OWN];
        let sop = be32(bytes, offset::SOP_DROP_QPN);
        let imm = offset::IMM_INVAL_PKEY;
        Self {
            opcode: op_own >> 4,
            format: (op_own >> 2) & 3,
            owner: op_own & 1 != 0,
            src_qp: be32(bytes, offset::FLAGS_RQPN) & 0x00ff_ffff,
            imm: [bytes[imm], bytes[imm + 1], bytes[imm + 2], bytes[imm + 3]],
            byte_cnt: be32(bytes, offset::BYTE_CNT),
            vendor_err: bytes[offset::VENDOR_ERR_SYND],
            syndrome: bytes[offset::SYNDROME],
            wqe_opcode: (sop >> 24) as u8,
            qpn: sop & 0x00ff_ffff,
            wqe_counter: be16(bytes, offset::WQE_COUNTER),
        }
    }

    /// Encode as the hardware writes it (the software model's side). Error CQEs
    /// ([`opcode::REQ_ERR`], [`opcode::RESP_ERR`]) carry `syndrome`/`vendor_err` at 55/54 and no
    /// byte count or timestamp; normal CQEs leave those two bytes to the (zero) timestamp.
    pub fn encode(&self) -> [u8; CQE64_LEN] {
        let mut out = [0u8; CQE64_LEN];
        let is_err = matches!(self.opcode, opcode::REQ_ERR | opcode::RESP_ERR);
        out[offset::FLAGS_RQPN..offset::FLAGS_RQPN + 4]
            .copy_from_slice(&(self.src_qp & 0x00ff_ffff).to_be_bytes());
        out[offset::IMM_INVAL_PKEY..offset::IMM_INVAL_PKEY + 4].copy_from_slice(&self.imm);
        if is_err {
            out[offset::VENDOR_ERR_SYND] = self.vendor_err;
            out[offset::SYNDROME] = self.syndrome;
        } else {
            out[offset::BYTE_CNT..offset::BYTE_CNT + 4]
                .copy_from_slice(&self.byte_cnt.to_be_bytes());
        }
        let sop = u32::from(self.wqe_opcode) << 24 | (self.qpn & 0x00ff_ffff);
        out[offset::SOP_DROP_QPN..offset::SOP_DROP_QPN + 4].copy_from_slice(&sop.to_be_bytes());
        out[offset::WQE_COUNTER..offset::WQE_COUNTER + 2]
            .copy_from_slice(&self.wqe_counter.to_be_bytes());
        out[offset::OP_OWN] = self.opcode << 4 | (self.format & 3) << 2 | u8::from(self.owner);
        out
    }
}
