//! Send and receive work-queue-entry segments of mlx5 (reference verbs-mlx5dv §0, §2.4, §2.7):
//! pure encoders into byte arrays and the decoders the software model validates with.
//!
//! Every multi-byte field is big-endian on the wire. A send WQE is a control segment followed by
//! optional segments, counted in 16-byte units (`ds`), occupying `ceil(ds / 4)` 64-byte basic
//! blocks of the send queue.

/// Bytes of a send-queue basic block (`MLX5_SEND_WQE_BB`).
pub const SEND_WQE_BB: usize = 64;
/// Bytes of one `ds` unit.
pub const DS_UNIT: usize = 16;
/// Largest `ds` the 6-bit field holds.
pub const MAX_DS: usize = 63;
/// `MLX5_INLINE_SEG`: bit 31 of an inline segment's length word.
pub const INLINE_SEG: u32 = 0x8000_0000;
/// `MLX5_INVALID_LKEY`: terminates a receive WQE's scatter list early.
pub const INVALID_LKEY: u32 = 0x100;

/// mlx5 send opcodes (`MLX5_OPCODE_*`), bits 7:0 of the control segment's first word.
pub mod opcode {
    /// No operation.
    pub const NOP: u8 = 0x00;
    /// RDMA WRITE.
    pub const RDMA_WRITE: u8 = 0x08;
    /// RDMA WRITE WITH IMMEDIATE.
    pub const RDMA_WRITE_IMM: u8 = 0x09;
    /// SEND.
    pub const SEND: u8 = 0x0a;
    /// SEND WITH IMMEDIATE.
    pub const SEND_IMM: u8 = 0x0b;
    /// RDMA READ.
    pub const RDMA_READ: u8 = 0x10;
}

/// Bits of the control segment's `fm_ce_se` byte.
pub mod fm_ce_se {
    /// `MLX5_WQE_CTRL_CQ_UPDATE`: generate a CQE (a signaled WQE).
    pub const CQ_UPDATE: u8 = 0x08;
    /// `MLX5_WQE_CTRL_SOLICITED`.
    pub const SOLICITED: u8 = 0x02;
    /// `MLX5_WQE_CTRL_FENCE` (what rdma-core uses for `IBV_SEND_FENCE`).
    pub const FENCE: u8 = 0x80;
}

/// The control segment (`struct mlx5_wqe_ctrl_seg`, 16 bytes, packed).
///
/// | offset | bytes | field |
/// |---|---|---|
/// | 0 | 4 | BE `opmod << 24 \| wqe_index << 8 \| opcode` |
/// | 4 | 4 | BE `qpn << 8 \| ds` |
/// | 8 | 1 | `signature` |
/// | 9 | 2 | `dci_stream_channel_id` (zero) |
/// | 11 | 1 | `fm_ce_se` |
/// | 12 | 4 | `imm`, already in network order |
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtrlSeg {
    /// Opcode modifier (zero for the operations used here).
    pub opmod: u8,
    /// Producer index of the WQE's first basic block (low 16 bits).
    pub wqe_index: u16,
    /// [`opcode`] value.
    pub opcode: u8,
    /// QP number (24 bits).
    pub qpn: u32,
    /// Size in 16-byte units (6 bits).
    pub ds: u8,
    /// [`fm_ce_se`] bits.
    pub fm_ce_se: u8,
    /// Immediate as its four wire bytes (network order).
    pub imm: [u8; 4],
}

impl CtrlSeg {
    /// Encode into the 16 wire bytes.
    pub fn encode(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        let word0 =
            u32::from(self.opmod) << 24 | u32::from(self.wqe_index) << 8 | u32::from(self.opcode);
        let word1 = (self.qpn & 0x00ff_ffff) << 8 | u32::from(self.ds & 0x3f);
        out[0..4].copy_from_slice(&word0.to_be_bytes());
        out[4..8].copy_from_slice(&word1.to_be_bytes());
        out[11] = self.fm_ce_se;
        out[12..16].copy_from_slice(&self.imm);
        out
    }

    /// Decode 16 wire bytes; also returns the `signature` and channel-id bytes (9..11), which
    /// the model insists are zero.
    pub fn decode(bytes: &[u8; 16]) -> (Self, [u8; 3]) {
        let word0 = be32(bytes, 0);
        let word1 = be32(bytes, 4);
        let seg = Self {
            opmod: (word0 >> 24) as u8,
            wqe_index: (word0 >> 8) as u16,
            opcode: word0 as u8,
            qpn: word1 >> 8,
            ds: (word1 & 0xff) as u8,
            fm_ce_se: bytes[11],
            imm: [bytes[12], bytes[13], bytes[14], bytes[15]],
        };
        (seg, [bytes[8], bytes[9], bytes[10]])
    }
}

/// The remote-address segment (`struct mlx5_wqe_raddr_seg`): BE64 `raddr` @0, BE32 `rkey` @8,
/// reserved @12.
pub fn raddr_seg(raddr: u64, rkey: u32) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[0..8].copy_from_slice(&raddr.to_be_bytes());
    out[8..12].copy_from_slice(&rkey.to_be_bytes());
    out
}

/// The control segment as two 64-bit words in wire byte order (store them natively): the bytes
/// [`CtrlSeg::encode`] writes for `opmod` 0. `qpn_ds` is [`ctrl_qpn_ds`] of the QP and the WQE's
/// `ds`, `imm` the immediate in host order.
#[inline(always)]
pub const fn ctrl_words(
    wqe_index: u16,
    opcode: u8,
    qpn_ds: u32,
    fm_ce_se: u8,
    imm: u32,
) -> [u64; 2] {
    let word0 = (wqe_index as u64) << 40 | (opcode as u64) << 32 | qpn_ds as u64;
    let word1 = (fm_ce_se as u64) << 32 | imm as u64;
    [word0.to_be(), word1.to_be()]
}

/// The control segment's second 32-bit field, `qpn << 8 | ds` (host order).
#[inline(always)]
pub const fn ctrl_qpn_ds(qpn: u32, ds: u8) -> u32 {
    (qpn & 0x00ff_ffff) << 8 | (ds & 0x3f) as u32
}

/// [`raddr_seg`] as two 64-bit words in wire byte order.
#[inline(always)]
pub const fn raddr_words(raddr: u64, rkey: u32) -> [u64; 2] {
    [raddr.to_be(), ((rkey as u64) << 32).to_be()]
}

/// [`data_seg`] as two 64-bit words in wire byte order.
#[inline(always)]
pub const fn data_words(byte_count: u32, lkey: u32, addr: u64) -> [u64; 2] {
    [
        ((byte_count as u64) << 32 | lkey as u64).to_be(),
        addr.to_be(),
    ]
}

/// Decode a remote-address segment: `(raddr, rkey, reserved word)`.
pub fn decode_raddr_seg(bytes: &[u8; 16]) -> (u64, u32, u32) {
    (be64(bytes, 0), be32(bytes, 8), be32(bytes, 12))
}

/// The data (pointer) segment (`struct mlx5_wqe_data_seg`): BE32 `byte_count` @0, BE32 `lkey` @4,
/// BE64 `addr` @8. A `byte_count` of 0 means 2 GiB to the hardware, so zero-length gathers are
/// left out of a WQE instead.
pub fn data_seg(byte_count: u32, lkey: u32, addr: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[0..4].copy_from_slice(&byte_count.to_be_bytes());
    out[4..8].copy_from_slice(&lkey.to_be_bytes());
    out[8..16].copy_from_slice(&addr.to_be_bytes());
    out
}

/// Decode a data segment: `(byte_count, lkey, addr)`.
pub fn decode_data_seg(bytes: &[u8; 16]) -> (u32, u32, u64) {
    (be32(bytes, 0), be32(bytes, 4), be64(bytes, 8))
}

/// The receive-WQE terminator: a data segment `{0, MLX5_INVALID_LKEY, 0}`.
pub const RECV_TERMINATOR: [u8; 16] = [0, 0, 0, 0, 0, 0, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0];

/// The 4-byte header of an inline segment: BE32 `len | MLX5_INLINE_SEG`; the bytes follow.
pub fn inline_header(len: u32) -> [u8; 4] {
    (len | INLINE_SEG).to_be_bytes()
}

/// `ds` units an inline segment of `len` bytes occupies (header included, padded to 16).
#[allow(clippy::manual_div_ceil)]
pub const fn inline_ds(len: usize) -> usize {
    // `(4 + len).div_ceil(DS_UNIT)` as an add and a shift (no remainder test); `len` is at most
    // an inline limit, far from overflowing.
    (4 + len + DS_UNIT - 1) / DS_UNIT
}

/// Basic blocks a WQE of `ds` units occupies.
#[allow(clippy::manual_div_ceil)]
pub const fn wqe_bbs(ds: usize) -> usize {
    // `(ds * DS_UNIT).div_ceil(SEND_WQE_BB)` as an add and a shift; `ds` is at most `MAX_DS`.
    (ds * DS_UNIT + SEND_WQE_BB - 1) / SEND_WQE_BB
}

pub(crate) fn be32(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

pub(crate) fn be16(bytes: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([bytes[at], bytes[at + 1]])
}

pub(crate) fn be64(bytes: &[u8], at: usize) -> u64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&bytes[at..at + 8]);
    u64::from_be_bytes(raw)
}
