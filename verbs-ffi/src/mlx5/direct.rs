//! The mlx5 direct data path of one RC queue pair: work queue entries built in the send-queue
//! buffer, doorbell records, BlueFlame, and completions read straight from the CQ buffer
//! (reference verbs-mlx5dv §2.4–§2.9). No libibverbs call happens here.
//!
//! The code only touches plain memory ([`QueueLayout`]) and a [`DoorbellRegister`], so the same
//! code drives a ConnectX device (layout from `mlx5dv_init_obj`, [`super::BlueFlame`]) and the
//! software model (`mlx5::model`, feature `mlx5-model`), which owns those buffers and checks every byte.
//!
//! Send queue: the ring is addressed in 16-byte units, so a WQE may straddle the end and wraps
//! unit by unit (inline payload included), as rdma-core and UCX do. The post is on every
//! message's path (issue #30), so a WQE is written as 64-bit words built once per WQE, straight
//! into its blocks when it does not straddle the end (every one-block WQE), otherwise into a
//! scratch WQE that is then copied in unit by unit. Each WQE records its
//! `wr_id` and the producer index after it in a side table indexed by its first basic block; a
//! requester CQE's `wqe_counter` finds the entry, completes it and everything before it
//! (selective signaling), and frees the ring up to it.
//!
//! Unsafe: every access goes through raw pointers into queue memory the device (or the model)
//! reads and writes concurrently; [`DirectQp::new`]'s contract makes them valid.
#![allow(unsafe_code)]

use core::fmt;
use core::ptr::NonNull;

use super::barrier;
use super::cqe::{self, CQE64_LEN, sw_owns, syndrome_status};
use super::doorbell::DoorbellRegister;
use super::dv::{MLX5_CQ_SET_CI, MLX5_RCV_DBR, MLX5_SND_DBR, mlx5dv_cq, mlx5dv_qp};
use super::wqe::{
    self, DS_UNIT, INLINE_SEG, MAX_DS, RECV_TERMINATOR, SEND_WQE_BB, ctrl_qpn_ds, ctrl_words,
    data_words, fm_ce_se, inline_ds, raddr_words, wqe_bbs,
};

/// Largest send queue (in basic blocks) the 16-bit producer index can address unambiguously.
pub const MAX_SQ_BBS: u32 = 1 << 15;

/// Where one QP's queues and its (shared send/receive) CQ live.
#[derive(Clone, Copy, Debug)]
pub struct QueueLayout {
    /// QP number (goes into every control segment).
    pub qpn: u32,
    /// Send queue buffer.
    pub sq_buf: NonNull<u8>,
    /// Send queue size in 64-byte basic blocks (a power of two).
    pub sq_wqe_cnt: u32,
    /// Receive queue buffer.
    pub rq_buf: NonNull<u8>,
    /// Receive WQEs (a power of two).
    pub rq_wqe_cnt: u32,
    /// Bytes per receive WQE (a power of two, at least 16).
    pub rq_stride: u32,
    /// The QP doorbell record (`__be32[2]`).
    pub qp_dbrec: NonNull<u32>,
    /// CQ buffer.
    pub cq_buf: NonNull<u8>,
    /// CQEs (a power of two).
    pub cqe_cnt: u32,
    /// Bytes per CQE (64 or 128).
    pub cqe_size: u32,
    /// The CQ doorbell record (`__be32[2]`).
    pub cq_dbrec: NonNull<u32>,
}

impl QueueLayout {
    /// The layout `mlx5dv_init_obj` reported, checked.
    pub fn from_dv(qpn: u32, qp: &mlx5dv_qp, cq: &mlx5dv_cq) -> Result<Self, DirectError> {
        let bad = |what| DirectError::Layout { what };
        let layout = Self {
            qpn,
            sq_buf: NonNull::new(qp.sq.buf.cast()).ok_or(bad("null send queue"))?,
            sq_wqe_cnt: qp.sq.wqe_cnt,
            rq_buf: NonNull::new(qp.rq.buf.cast()).ok_or(bad("null receive queue"))?,
            rq_wqe_cnt: qp.rq.wqe_cnt,
            rq_stride: qp.rq.stride,
            qp_dbrec: NonNull::new(qp.dbrec).ok_or(bad("null QP doorbell record"))?,
            cq_buf: NonNull::new(cq.buf.cast()).ok_or(bad("null CQ buffer"))?,
            cqe_cnt: cq.cqe_cnt,
            cqe_size: cq.cqe_size,
            cq_dbrec: NonNull::new(cq.dbrec).ok_or(bad("null CQ doorbell record"))?,
        };
        if qp.sq.stride != SEND_WQE_BB as u32 {
            return Err(bad("send queue stride is not 64"));
        }
        layout.check()?;
        Ok(layout)
    }

    /// Check the geometry rules the posting and polling code relies on.
    pub fn check(&self) -> Result<(), DirectError> {
        let bad = |what| Err(DirectError::Layout { what });
        if !self.sq_wqe_cnt.is_power_of_two() || self.sq_wqe_cnt > MAX_SQ_BBS {
            return bad("send queue size is not a power of two up to 32768 basic blocks");
        }
        if !self.rq_wqe_cnt.is_power_of_two() || self.rq_wqe_cnt > MAX_SQ_BBS {
            return bad("receive queue size is not a power of two up to 32768");
        }
        if !self.rq_stride.is_power_of_two() || self.rq_stride < DS_UNIT as u32 {
            return bad("receive stride is not a power of two of at least 16");
        }
        if !self.cqe_cnt.is_power_of_two() || self.cqe_cnt > 1 << 23 {
            return bad("CQ size is not a power of two");
        }
        if self.cqe_size != 64 && self.cqe_size != 128 {
            return bad("CQE size is neither 64 nor 128");
        }
        if self.qpn > 0x00ff_ffff {
            return bad("QP number wider than 24 bits");
        }
        Ok(())
    }
}

/// What a send work request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirectOp {
    /// RDMA WRITE.
    Write,
    /// RDMA WRITE WITH IMMEDIATE; the immediate in host order (sent in network order).
    WriteImm(u32),
    /// RDMA READ into the local gather entry.
    Read,
}

/// The local side of a send work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WqeData<'a> {
    /// No bytes.
    None,
    /// Bytes copied into the WQE.
    Inline(&'a [u8]),
    /// Registered local memory.
    Gather {
        /// First byte.
        addr: u64,
        /// Length.
        len: u32,
        /// Local key.
        lkey: u32,
    },
}

/// One send work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirectWr<'a> {
    /// Returned in its completion.
    pub wr_id: u64,
    /// Operation.
    pub op: DirectOp,
    /// Local data.
    pub data: WqeData<'a>,
    /// Remote address.
    pub remote_addr: u64,
    /// Remote key.
    pub rkey: u32,
    /// Generate a completion on success (`CQ_UPDATE`).
    pub signaled: bool,
}

/// Which work queue a completion belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkQueue {
    /// The send queue.
    Send,
    /// The receive queue.
    Recv,
}

/// What completed, as decoded from the CQE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompletedOp {
    /// RDMA WRITE (requester).
    Write,
    /// RDMA WRITE WITH IMMEDIATE (requester).
    WriteImm,
    /// RDMA READ (requester).
    Read,
    /// Another requester opcode (the WQE opcode byte).
    OtherSend(u8),
    /// An RDMA WRITE WITH IMMEDIATE consumed a receive.
    RecvWriteImm,
    /// A SEND (with or without immediate or invalidate) consumed a receive.
    RecvSend,
    /// An error completion (the status says which).
    Failed,
}

/// One polled completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirectCompletion {
    /// The work request's `wr_id`.
    pub wr_id: u64,
    /// `ibv_wc_status` value (0 = success).
    pub status: u32,
    /// Vendor syndrome of an error CQE.
    pub vendor_err: u32,
    /// Send or receive queue.
    pub queue: WorkQueue,
    /// What completed.
    pub op: CompletedOp,
    /// Immediate in host order, when the CQE carries one.
    pub imm: Option<u32>,
    /// Bytes (RDMA READ, and writes with immediate on the responder).
    pub byte_len: u32,
}

/// Why posting or polling on the direct path failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirectError {
    /// The queue geometry is unusable.
    Layout {
        /// Which rule it breaks.
        what: &'static str,
    },
    /// The send queue lacks room for the chain.
    SendQueueFull {
        /// Basic blocks needed.
        need: u32,
        /// Basic blocks free.
        free: u32,
    },
    /// The receive queue is full.
    RecvQueueFull,
    /// An inline payload exceeds the QP's inline limit.
    InlineTooLong {
        /// Bytes asked for.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A work request that cannot be expressed (e.g. inline RDMA READ).
    Malformed {
        /// What is wrong.
        what: &'static str,
    },
    /// A CQE the path cannot handle (compressed, unknown opcode).
    UnexpectedCqe {
        /// Its `op_own` byte.
        op_own: u8,
    },
    /// A requester CQE names a WQE that is not outstanding.
    UnknownWqe {
        /// The CQE's `wqe_counter`.
        wqe_counter: u16,
    },
    /// A responder CQE arrived with no receive posted.
    NoReceivePosted,
}

impl DirectError {
    /// The errno a verbs provider would report for the same condition.
    pub fn errno(&self) -> i32 {
        match self {
            Self::SendQueueFull { .. } | Self::RecvQueueFull => libc::ENOMEM,
            Self::InlineTooLong { .. } | Self::Malformed { .. } | Self::Layout { .. } => {
                libc::EINVAL
            }
            Self::UnexpectedCqe { .. } | Self::UnknownWqe { .. } | Self::NoReceivePosted => {
                libc::EIO
            }
        }
    }
}

impl fmt::Display for DirectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Layout { what } => write!(f, "unusable mlx5 queue layout: {what}"),
            Self::SendQueueFull { need, free } => {
                write!(
                    f,
                    "mlx5 send queue full: {need} basic blocks needed, {free} free"
                )
            }
            Self::RecvQueueFull => f.write_str("mlx5 receive queue full"),
            Self::InlineTooLong { len, max } => {
                write!(
                    f,
                    "inline payload of {len} bytes exceeds the {max}-byte limit"
                )
            }
            Self::Malformed { what } => write!(f, "malformed work request: {what}"),
            Self::UnexpectedCqe { op_own } => {
                write!(f, "unexpected mlx5 CQE (op_own {op_own:#04x})")
            }
            Self::UnknownWqe { wqe_counter } => {
                write!(
                    f,
                    "mlx5 CQE for WQE {wqe_counter}, which is not outstanding"
                )
            }
            Self::NoReceivePosted => f.write_str("mlx5 responder CQE with no receive posted"),
        }
    }
}

impl std::error::Error for DirectError {}

/// Write an inline segment of `bytes` (not empty) at `dst`: the header word, the bytes, zeros to
/// the end of its last 16-byte unit, nothing past it. Up to 32 bytes go as (overlapping) word
/// moves, longer payloads through `copy_nonoverlapping`.
///
/// # Safety
/// `dst` must be valid for writes of `inline_ds(bytes.len()) * 16` bytes.
#[inline(always)]
unsafe fn write_inline(dst: *mut u8, bytes: &[u8]) {
    let len = bytes.len();
    let src = bytes.as_ptr();
    // SAFETY: every store is inside `dst .. dst + inline_ds(len) * 16` (the caller's promise):
    // the last unit starts at `(inline_ds(len) - 1) * 16`, the header at 0, the payload at
    // `4 .. 4 + len`; the loads are inside `bytes`.
    unsafe {
        let last = dst.add((inline_ds(len) - 1) * DS_UNIT).cast::<u64>();
        last.write_unaligned(0);
        last.add(1).write_unaligned(0);
        dst.cast::<u32>()
            .write_unaligned((len as u32 | INLINE_SEG).to_be());
        let data = dst.add(4);
        if (16..=32).contains(&len) {
            let head = src.cast::<[u64; 2]>().read_unaligned();
            let tail = src.add(len - 16).cast::<[u64; 2]>().read_unaligned();
            data.cast::<[u64; 2]>().write_unaligned(head);
            data.add(len - 16).cast::<[u64; 2]>().write_unaligned(tail);
        } else if (8..16).contains(&len) {
            let head = src.cast::<u64>().read_unaligned();
            let tail = src.add(len - 8).cast::<u64>().read_unaligned();
            data.cast::<u64>().write_unaligned(head);
            data.add(len - 8).cast::<u64>().write_unaligned(tail);
        } else if (4..8).contains(&len) {
            let head = src.cast::<u32>().read_unaligned();
            let tail = src.add(len - 4).cast::<u32>().read_unaligned();
            data.cast::<u32>().write_unaligned(head);
            data.add(len - 4).cast::<u32>().write_unaligned(tail);
        } else {
            core::ptr::copy_nonoverlapping(src, data, len);
        }
    }
}

/// Side-table entry of a posted WQE, at the index of its first basic block.
#[derive(Clone, Copy, Debug, Default)]
struct SqEntry {
    wr_id: u64,
    /// Producer index after this WQE.
    next_pi: u16,
    /// WQEs posted up to and including this one.
    posted: u32,
}

/// The direct data path of one QP and its CQ.
#[derive(Debug)]
pub struct DirectQp<D: DoorbellRegister> {
    layout: QueueLayout,
    doorbell: D,
    max_inline: usize,
    /// Send producer index (basic blocks, free-running 16 bits).
    sq_pi: u16,
    /// Send consumer index: everything before it has completed.
    sq_ci: u16,
    /// Offset of the BlueFlame half the next doorbell goes to.
    bf_offset: usize,
    /// The control segment's `qpn << 8` (the WQE's `ds` is or-ed in).
    ctrl_qpn: u32,
    /// Where a WQE that straddles the ring end is built before it is copied in, unit by unit
    /// (`MAX_DS` units).
    sq_scratch: Box<[u64]>,
    sq_entries: Box<[SqEntry]>,
    /// WQEs ever posted, and ever completed (both wrapping).
    sq_posted: u32,
    sq_completed: u32,
    rq_head: u32,
    rq_tail: u32,
    rq_wr_ids: Box<[u64]>,
    cq_ci: u32,
}

// SAFETY: the queue memory is owned by this QP's device objects (or the model) and touched by
// this value only under `&mut self`; the doorbell is Send when its register is.
unsafe impl<D: DoorbellRegister + Send> Send for DirectQp<D> {}

impl<D: DoorbellRegister> DirectQp<D> {
    /// Take over the queues described by `layout`.
    ///
    /// # Safety
    /// Every buffer and doorbell record in `layout` must be valid for reads and writes of its full
    /// size for the life of the returned value, used by no one but it and the device (no
    /// `ibv_post_*`/`ibv_poll_cq` on these objects any more), the send queue may hold no
    /// outstanding WQE, the CQ must be freshly created (every CQE `op_own` = `0xF0` or otherwise
    /// hardware-owned for pass 0) and the receive queue empty.
    pub unsafe fn new(
        layout: QueueLayout,
        doorbell: D,
        max_inline: usize,
    ) -> Result<Self, DirectError> {
        layout.check()?;
        if inline_ds(max_inline) + 2 > MAX_DS {
            return Err(DirectError::Layout {
                what: "inline limit beyond 63 ds units",
            });
        }
        Ok(Self {
            layout,
            doorbell,
            max_inline,
            sq_pi: 0,
            sq_ci: 0,
            bf_offset: 0,
            ctrl_qpn: ctrl_qpn_ds(layout.qpn, 0),
            sq_scratch: vec![0; 2 * MAX_DS].into_boxed_slice(),
            sq_entries: vec![SqEntry::default(); layout.sq_wqe_cnt as usize].into_boxed_slice(),
            sq_posted: 0,
            sq_completed: 0,
            rq_head: 0,
            rq_tail: 0,
            rq_wr_ids: vec![0; layout.rq_wqe_cnt as usize].into_boxed_slice(),
            cq_ci: 0,
        })
    }

    /// The queue layout.
    pub fn layout(&self) -> &QueueLayout {
        &self.layout
    }

    /// The inline limit.
    pub fn max_inline(&self) -> usize {
        self.max_inline
    }

    /// Basic blocks of the send queue in use (posted and not yet known complete).
    pub fn sq_outstanding(&self) -> u32 {
        u32::from(self.sq_pi.wrapping_sub(self.sq_ci))
    }

    /// Send WQEs posted and not yet known complete.
    pub fn sq_outstanding_wqes(&self) -> u32 {
        self.sq_posted.wrapping_sub(self.sq_completed)
    }

    /// Receive WQEs posted and not yet completed.
    pub fn rq_outstanding(&self) -> u32 {
        self.rq_head.wrapping_sub(self.rq_tail)
    }

    /// The CQ consumer index.
    pub fn cq_consumer_index(&self) -> u32 {
        self.cq_ci
    }

    /// `ds` units of `wr`, validated.
    fn wqe_ds(&self, wr: &DirectWr<'_>) -> Result<usize, DirectError> {
        let data = match (wr.op, wr.data) {
            (DirectOp::Read, WqeData::Inline(_)) => {
                return Err(DirectError::Malformed {
                    what: "inline RDMA READ",
                });
            }
            (_, WqeData::None) => 0,
            (_, WqeData::Inline([])) => 0,
            (_, WqeData::Inline(bytes)) => {
                if bytes.len() > self.max_inline {
                    return Err(DirectError::InlineTooLong {
                        len: bytes.len(),
                        max: self.max_inline,
                    });
                }
                inline_ds(bytes.len())
            }
            // A zero byte count means 2 GiB to the device: leave the segment out.
            (_, WqeData::Gather { len: 0, .. }) => 0,
            (_, WqeData::Gather { .. }) => 1,
        };
        Ok(2 + data)
    }

    /// Post `chain` in order and ring the doorbell once. All or nothing: when a WQE does not
    /// fit or is malformed, nothing of the chain is posted.
    pub fn post_send(&mut self, chain: &[DirectWr<'_>]) -> Result<(), DirectError> {
        self.post_send_with(chain.len(), |i| Ok(chain[i]))
    }

    /// Post the `n` work requests `wr(0) .. wr(n - 1)` in order and ring the doorbell once, all or
    /// nothing. Lets a caller translate its own work requests without building an array.
    ///
    /// WQEs are written straight into free ring space; on an error the producer index is rolled
    /// back before the doorbell record moves, so the device never sees them.
    ///
    /// Always in line, with [`post_one`](Self::post_one): a caller's one-request post then folds
    /// what it fixes (the chain length, the payload's kind, an inline length) into the stores.
    #[inline(always)]
    pub fn post_send_with<'a>(
        &mut self,
        n: usize,
        mut wr: impl FnMut(usize) -> Result<DirectWr<'a>, DirectError>,
    ) -> Result<(), DirectError> {
        match n {
            0 => Ok(()),
            1 => self.post_one(&wr(0)?),
            _ => self.post_chain(n, wr),
        }
    }

    /// Post one work request and ring the doorbell (a chain of one, without the chain's
    /// bookkeeping: nothing is written before every check has passed).
    #[inline(always)]
    pub fn post_one(&mut self, wr: &DirectWr<'_>) -> Result<(), DirectError> {
        let ds = self.wqe_ds(wr)?;
        let free = self.layout.sq_wqe_cnt - self.sq_outstanding();
        let need = wqe_bbs(ds) as u32;
        if need > free {
            return Err(DirectError::SendQueueFull { need, free });
        }
        let pi = self.sq_pi;
        self.write_wqe(wr, ds);
        self.ring(1, pi, ds);
        Ok(())
    }

    fn post_chain<'a>(
        &mut self,
        n: usize,
        mut wr: impl FnMut(usize) -> Result<DirectWr<'a>, DirectError>,
    ) -> Result<(), DirectError> {
        let (start_pi, start_posted) = (self.sq_pi, self.sq_posted);
        let free = self.layout.sq_wqe_cnt - self.sq_outstanding();
        let mut last = (0u16, 0usize);
        for i in 0..n {
            let step = wr(i).and_then(|wr| {
                let ds = self.wqe_ds(&wr)?;
                let used = u32::from(self.sq_pi.wrapping_sub(start_pi));
                let need = used + wqe_bbs(ds) as u32;
                if need > free {
                    return Err(DirectError::SendQueueFull { need, free });
                }
                last = (self.sq_pi, ds);
                self.write_wqe(&wr, ds);
                Ok(())
            });
            if let Err(e) = step {
                self.sq_pi = start_pi;
                self.sq_posted = start_posted;
                return Err(e);
            }
        }
        self.ring(n, last.0, last.1);
        Ok(())
    }

    /// Write one 16-byte unit of the send queue, `unit` counted from the ring start (wrapping).
    #[inline(always)]
    fn write_sq_unit(&mut self, unit: u32, bytes: &[u8; 16]) {
        let units = self.layout.sq_wqe_cnt * (SEND_WQE_BB / DS_UNIT) as u32;
        let at = (unit & (units - 1)) as usize * DS_UNIT;
        // SAFETY: `at + 16 <= sq_wqe_cnt * 64`, inside the send queue (`new`'s contract); the unit
        // belongs to a WQE the device has completed (room was checked), so only we touch it.
        unsafe {
            self.layout
                .sq_buf
                .add(at)
                .cast::<[u8; 16]>()
                .write_unaligned(*bytes)
        };
    }

    /// The first byte of basic block `bb` (wrapping).
    #[inline(always)]
    fn sq_bb(&self, bb: u16) -> NonNull<u8> {
        let at = (u32::from(bb) & (self.layout.sq_wqe_cnt - 1)) as usize * SEND_WQE_BB;
        // SAFETY: `at + 64 <= sq_wqe_cnt * 64`: inside the send queue (`new`'s contract).
        unsafe { self.layout.sq_buf.add(at) }
    }

    /// Write the WQE of `wr` (`ds` units, room checked) at the producer index and advance it.
    ///
    /// A WQE that does not straddle the ring end (every one-block WQE) is written as 64-bit words
    /// straight into its blocks; one that does is written the same way into the scratch WQE and
    /// copied in 16-byte unit by unit. Either way the ring gets the same bytes: the segments' `ds`
    /// units, an inline payload zero-padded to its last unit, nothing past it.
    #[inline(always)]
    fn write_wqe(&mut self, wr: &DirectWr<'_>, ds: usize) {
        let pi = self.sq_pi;
        let (opcode, imm) = match wr.op {
            DirectOp::Write => (wqe::opcode::RDMA_WRITE, 0),
            DirectOp::WriteImm(imm) => (wqe::opcode::RDMA_WRITE_IMM, imm),
            DirectOp::Read => (wqe::opcode::RDMA_READ, 0),
        };
        let fm_ce_se = if wr.signaled { fm_ce_se::CQ_UPDATE } else { 0 };
        let ctrl = ctrl_words(pi, opcode, self.ctrl_qpn | ds as u32, fm_ce_se, imm);
        let raddr = raddr_words(wr.remote_addr, wr.rkey);
        let bbs = wqe_bbs(ds) as u16;
        let slot = u32::from(pi) & (self.layout.sq_wqe_cnt - 1);
        let contiguous = slot + u32::from(bbs) <= self.layout.sq_wqe_cnt;
        let wqe = if contiguous {
            self.sq_bb(pi).cast::<u64>()
        } else {
            NonNull::from(&mut self.sq_scratch[..]).cast::<u64>()
        };
        // SAFETY: `wqe` is either the WQE's `bbs` blocks in the send queue, which do not wrap
        // (tested just above) and are free (room was checked), so only we touch them, or the
        // scratch WQE (`MAX_DS` units); every store below stays inside the WQE's `ds` units.
        unsafe {
            wqe.write_unaligned(ctrl[0]);
            wqe.add(1).write_unaligned(ctrl[1]);
            wqe.add(2).write_unaligned(raddr[0]);
            wqe.add(3).write_unaligned(raddr[1]);
            match wr.data {
                WqeData::Gather { addr, len, lkey } if len > 0 => {
                    let data = data_words(len, lkey, addr);
                    wqe.add(4).write_unaligned(data[0]);
                    wqe.add(5).write_unaligned(data[1]);
                }
                WqeData::Inline(bytes) if !bytes.is_empty() => {
                    write_inline(wqe.add(4).cast::<u8>().as_ptr(), bytes);
                }
                _ => {}
            }
        }
        if !contiguous {
            self.copy_wrapping(pi, ds);
        }
        // The WQE's first block, masked above: masking `pi` again here would load the queue size
        // again (for the compiler, the WQE stores may have changed the layout).
        let index = slot as usize;
        self.sq_posted = self.sq_posted.wrapping_add(1);
        let entry = SqEntry {
            wr_id: wr.wr_id,
            next_pi: pi.wrapping_add(bbs),
            posted: self.sq_posted,
        };
        // SAFETY: `sq_entries` has `sq_wqe_cnt` (a power of two) entries and `index` is masked
        // below it.
        unsafe { *self.sq_entries.get_unchecked_mut(index) = entry };
        self.sq_pi = pi.wrapping_add(bbs);
    }

    /// Copy the `ds` units of the scratch WQE to the ring from producer index `pi` on, 16-byte
    /// unit by unit, wrapping at the ring end (a WQE that straddles it).
    #[cold]
    #[inline(never)]
    fn copy_wrapping(&mut self, pi: u16, ds: usize) {
        let first_unit = u32::from(pi) * (SEND_WQE_BB / DS_UNIT) as u32;
        for unit in 0..ds {
            let mut bytes = [0u8; 16];
            bytes[..8].copy_from_slice(&self.sq_scratch[2 * unit].to_ne_bytes());
            bytes[8..].copy_from_slice(&self.sq_scratch[2 * unit + 1].to_ne_bytes());
            self.write_sq_unit(first_unit + unit as u32, &bytes);
        }
    }

    /// Doorbell record, then BlueFlame copy (one WQE that fits a half) or the 8-byte doorbell of
    /// the last WQE's control segment; then flip to the other half.
    #[inline(always)]
    fn ring(&mut self, nreq: usize, last_pi: u16, last_ds: usize) {
        // The WQEs are in memory before the record says so.
        barrier::to_device();
        // SAFETY: the doorbell record is valid for the QP's life (`new`'s contract).
        unsafe {
            self.layout
                .qp_dbrec
                .add(MLX5_SND_DBR)
                .write_volatile((u32::from(self.sq_pi)).to_be())
        };
        self.doorbell.wc_start();
        let bf_size = self.doorbell.bf_size() as usize;
        let mut offset = self.bf_offset;
        if nreq == 1 && bf_size > 0 && last_ds * DS_UNIT <= bf_size {
            // Whole basic blocks, as they are in the ring (a block's unused tail included).
            let bbs = wqe_bbs(last_ds) as u16;
            let first = u32::from(last_pi) & (self.layout.sq_wqe_cnt - 1);
            if first + u32::from(bbs) <= self.layout.sq_wqe_cnt {
                // Not wrapping: one pointer walks the blocks.
                let mut words = self.sq_bb(last_pi).cast::<u64>();
                for _ in 0..bbs {
                    // SAFETY: one of the WQE's blocks, which lie in the send queue without
                    // wrapping (tested above) and which this value just wrote.
                    unsafe { self.doorbell.store_bb(offset, words) };
                    offset += SEND_WQE_BB;
                    // SAFETY: at most one past the WQE's last block, still inside (or one past
                    // the end of) the send queue.
                    words = unsafe { words.add(SEND_WQE_BB / 8) };
                }
            } else {
                for bb in 0..bbs {
                    let words = self.sq_bb(last_pi.wrapping_add(bb)).cast::<u64>();
                    // SAFETY: the block `sq_bb` found in the send queue, which this value just
                    // wrote.
                    unsafe { self.doorbell.store_bb(offset, words) };
                    offset += SEND_WQE_BB;
                }
            }
        } else {
            // SAFETY: the control segment's first 8 bytes, in the send queue.
            let value = unsafe { self.sq_bb(last_pi).cast::<u64>().read_unaligned() };
            self.doorbell.store64(offset, value);
        }
        self.doorbell.wc_flush();
        self.bf_offset ^= bf_size;
    }

    /// Post one receive WQE with no scatter entry and update the receive doorbell record.
    pub fn post_recv(&mut self, wr_id: u64) -> Result<(), DirectError> {
        if self.rq_outstanding() >= self.layout.rq_wqe_cnt {
            return Err(DirectError::RecvQueueFull);
        }
        let index = self.rq_head & (self.layout.rq_wqe_cnt - 1);
        let at = index as usize * self.layout.rq_stride as usize;
        // SAFETY: `at + 16 <= rq_wqe_cnt * rq_stride`, inside the receive queue; the slot's previous
        // WQE has completed (occupancy checked), so the device no longer reads it.
        unsafe {
            self.layout
                .rq_buf
                .add(at)
                .cast::<[u8; 16]>()
                .write_unaligned(RECV_TERMINATOR)
        };
        self.rq_wr_ids[index as usize] = wr_id;
        self.rq_head = self.rq_head.wrapping_add(1);
        barrier::to_device();
        // SAFETY: the QP doorbell record is valid for the QP's life.
        unsafe {
            self.layout
                .qp_dbrec
                .add(MLX5_RCV_DBR)
                .write_volatile((self.rq_head & 0xffff).to_be())
        };
        Ok(())
    }

    /// Poll up to `max` completions, handing each to `sink`; returns how many. The CQ doorbell
    /// record is updated once per call.
    #[inline]
    pub fn poll(
        &mut self,
        max: usize,
        mut sink: impl FnMut(DirectCompletion),
    ) -> Result<usize, DirectError> {
        let start = self.poll_start();
        let mut got = 0;
        let mut result = Ok(());
        while got < max {
            match self.poll_next() {
                Ok(Some(c)) => {
                    sink(c);
                    got += 1;
                }
                Ok(None) => break,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        self.poll_end(start);
        result.map(|()| got)
    }

    /// Begin a poll made of [`poll_next`](Self::poll_next) calls: what to hand to
    /// [`poll_end`](Self::poll_end) after them. For a caller that handles each completion in line
    /// (no sink closure holding its state by reference).
    #[inline(always)]
    pub fn poll_start(&self) -> u32 {
        self.cq_ci
    }

    /// The next completion the device has handed over (`None`: the CQ holds no more). CQEs to
    /// skip are skipped; an error consumes the CQE it is about.
    #[inline(always)]
    pub fn poll_next(&mut self) -> Result<Option<DirectCompletion>, DirectError> {
        let mask = self.layout.cqe_cnt - 1;
        let stride = self.layout.cqe_size as usize;
        let tail = stride - CQE64_LEN;
        loop {
            let slot = (self.cq_ci & mask) as usize * stride + tail;
            // SAFETY: the slot lies inside the CQ buffer (`new`'s contract); the device writes it
            // concurrently, hence the volatile read of the ownership byte.
            let cqe_ptr = unsafe { self.layout.cq_buf.add(slot) };
            // SAFETY: as above.
            let op_own = unsafe { cqe_ptr.add(cqe::offset::OP_OWN).read_volatile() };
            if !sw_owns(op_own, self.cq_ci, self.layout.cqe_cnt) {
                return Ok(None);
            }
            // The body is read only after ownership is seen.
            barrier::from_device();
            self.cq_ci = self.cq_ci.wrapping_add(1);
            // SAFETY: a software-owned CQE the device no longer writes (ownership was seen before
            // the fence); `complete_at` reads its fields with plain loads (rdma-core reads it the
            // same way).
            if let Some(c) = unsafe { self.complete_at(cqe_ptr, op_own) }? {
                return Ok(Some(c));
            }
        }
    }

    /// End a poll begun at `start` ([`poll_start`](Self::poll_start)): when CQEs were consumed,
    /// the CQ doorbell record says so.
    #[inline(always)]
    pub fn poll_end(&mut self, start: u32) {
        if self.cq_ci != start {
            // The CQEs were read before the device may reuse their slots.
            barrier::to_device();
            // SAFETY: the CQ doorbell record is valid for the CQ's life.
            unsafe {
                self.layout
                    .cq_dbrec
                    .add(MLX5_CQ_SET_CI)
                    .write_volatile((self.cq_ci & 0x00ff_ffff).to_be())
            };
        }
    }

    /// Turn the software-owned CQE at `cqe` (its 64-byte format) into a completion (None for CQEs
    /// to skip), reading only the fields that completion needs; [`cqe::Cqe::decode`]'s meaning.
    ///
    /// # Safety
    /// `cqe` must point at 64 readable bytes of a CQE the device no longer writes.
    #[inline(always)]
    unsafe fn complete_at(
        &mut self,
        cqe: NonNull<u8>,
        op_own: u8,
    ) -> Result<Option<DirectCompletion>, DirectError> {
        // SAFETY: the caller's promise.
        let read = unsafe { OwnedCqe::new(cqe) };
        let opcode = op_own >> 4;
        if (op_own >> 2) & 3 == 3 {
            // As `complete` reports it: opcode, format and owner (the solicited bit dropped).
            return Err(DirectError::UnexpectedCqe {
                op_own: op_own & !2,
            });
        }
        // The two completions of every message (a requester's, a write with immediate's) are
        // tested for first, each as a range of `op_own` (as tests of `opcode` the compiler would
        // fold them into one table with the rest); each decoder has one call site, so the poll,
        // in line wherever it is used, carries one copy of each.
        if op_own < (cqe::opcode::REQ + 1) << 4 || opcode == cqe::opcode::REQ_ERR {
            return self.complete_send(read, opcode);
        }
        if op_own & 0xf0 == cqe::opcode::RESP_WR_IMM << 4
            || matches!(
                opcode,
                cqe::opcode::RESP_SEND
                    | cqe::opcode::RESP_SEND_IMM
                    | cqe::opcode::RESP_SEND_INV
                    | cqe::opcode::RESP_ERR
            )
        {
            return self.complete_recv(read, opcode);
        }
        match opcode {
            cqe::opcode::RESIZE_CQ => Ok(None),
            _ => Err(DirectError::UnexpectedCqe {
                op_own: op_own & !2,
            }),
        }
    }

    /// A requester CQE ([`cqe::opcode::REQ`] or [`cqe::opcode::REQ_ERR`]) as a completion.
    #[inline(always)]
    fn complete_send(
        &mut self,
        cqe: OwnedCqe,
        opcode: u8,
    ) -> Result<Option<DirectCompletion>, DirectError> {
        let wqe_counter = u16::from_be_bytes(cqe.bytes::<{ cqe::offset::WQE_COUNTER }, 2>());
        let outstanding = self.sq_outstanding();
        if u32::from(wqe_counter.wrapping_sub(self.sq_ci)) >= outstanding {
            return Err(DirectError::UnknownWqe { wqe_counter });
        }
        let index = usize::from(wqe_counter) & (self.layout.sq_wqe_cnt as usize - 1);
        // SAFETY: `sq_entries` has `sq_wqe_cnt` (a power of two) entries and `index` is
        // masked below it.
        let entry = unsafe { *self.sq_entries.get_unchecked(index) };
        self.sq_ci = entry.next_pi;
        self.sq_completed = entry.posted;
        let (status, vendor_err, op) = if opcode == cqe::opcode::REQ {
            let op = match cqe.bytes::<{ cqe::offset::SOP_DROP_QPN }, 1>()[0] {
                wqe::opcode::RDMA_WRITE => CompletedOp::Write,
                wqe::opcode::RDMA_WRITE_IMM => CompletedOp::WriteImm,
                wqe::opcode::RDMA_READ => CompletedOp::Read,
                other => CompletedOp::OtherSend(other),
            };
            (0, 0, op)
        } else {
            let (status, vendor_err) = cqe.error();
            (status, vendor_err, CompletedOp::Failed)
        };
        Ok(Some(DirectCompletion {
            wr_id: entry.wr_id,
            status,
            vendor_err,
            queue: WorkQueue::Send,
            op,
            imm: None,
            byte_len: if op == CompletedOp::Read {
                cqe.byte_cnt()
            } else {
                0
            },
        }))
    }

    /// A responder CQE (the `RESP_*` opcodes) as a completion.
    #[inline(always)]
    fn complete_recv(
        &mut self,
        cqe: OwnedCqe,
        opcode: u8,
    ) -> Result<Option<DirectCompletion>, DirectError> {
        if self.rq_outstanding() == 0 {
            return Err(DirectError::NoReceivePosted);
        }
        // RC receives complete in order: the oldest posted one (rdma-core uses its tail too).
        let index = (self.rq_tail & (self.layout.rq_wqe_cnt - 1)) as usize;
        self.rq_tail = self.rq_tail.wrapping_add(1);
        // SAFETY: `rq_wr_ids` has `rq_wqe_cnt` (a power of two) entries and `index` is
        // masked below it.
        let wr_id = unsafe { *self.rq_wr_ids.get_unchecked(index) };
        let (status, vendor_err, op, imm) = match opcode {
            cqe::opcode::RESP_WR_IMM => (0, 0, CompletedOp::RecvWriteImm, Some(cqe.imm())),
            cqe::opcode::RESP_SEND_IMM => (0, 0, CompletedOp::RecvSend, Some(cqe.imm())),
            cqe::opcode::RESP_SEND | cqe::opcode::RESP_SEND_INV => {
                (0, 0, CompletedOp::RecvSend, None)
            }
            _ => {
                let (status, vendor_err) = cqe.error();
                (status, vendor_err, CompletedOp::Failed, None)
            }
        };
        Ok(Some(DirectCompletion {
            wr_id,
            status,
            vendor_err,
            queue: WorkQueue::Recv,
            op,
            imm,
            byte_len: if status == 0 { cqe.byte_cnt() } else { 0 },
        }))
    }
}

/// A software-owned CQE (its ownership seen, then the fence: the device no longer writes it),
/// read field by field with plain loads, as rdma-core reads it. Offsets are constants checked at
/// compile time against the 64-byte format, so the reads need no promise beyond the one made
/// when the reader is built.
#[derive(Clone, Copy)]
struct OwnedCqe(NonNull<u8>);

impl OwnedCqe {
    /// # Safety
    /// `cqe` must point at the 64 readable bytes of a CQE the device no longer writes, for as long
    /// as the reader is used.
    #[inline(always)]
    unsafe fn new(cqe: NonNull<u8>) -> Self {
        Self(cqe)
    }

    /// The `N` bytes at offset `AT`.
    #[inline(always)]
    fn bytes<const AT: usize, const N: usize>(self) -> [u8; N] {
        const { assert!(AT + N <= CQE64_LEN) };
        // SAFETY: `AT + N` is inside the 64 bytes `new`'s caller vouched for.
        unsafe { self.0.add(AT).cast::<[u8; N]>().read_unaligned() }
    }

    /// The immediate (big-endian on the wire).
    #[inline(always)]
    fn imm(self) -> u32 {
        u32::from_be_bytes(self.bytes::<{ cqe::offset::IMM_INVAL_PKEY }, 4>())
    }

    /// The byte count (big-endian on the wire).
    #[inline(always)]
    fn byte_cnt(self) -> u32 {
        u32::from_be_bytes(self.bytes::<{ cqe::offset::BYTE_CNT }, 4>())
    }

    /// An error CQE's work-completion status (from its syndrome) and vendor syndrome.
    #[inline(always)]
    fn error(self) -> (u32, u32) {
        (
            syndrome_status(self.bytes::<{ cqe::offset::SYNDROME }, 1>()[0]),
            u32::from(self.bytes::<{ cqe::offset::VENDOR_ERR_SYND }, 1>()[0]),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mlx5::wqe::inline_header;

    #[test]
    fn inline_segments_of_every_length_are_header_bytes_and_zero_padding_only() {
        for len in 1..=220usize {
            let bytes: Vec<u8> = (0..len).map(|i| 0x40u8.wrapping_add(i as u8)).collect();
            let mut buf = [0xeeu8; 256];
            // SAFETY: `inline_ds(220) * 16 = 224 <= 256` bytes of `buf`.
            unsafe { write_inline(buf.as_mut_ptr(), &bytes) };
            let end = inline_ds(len) * DS_UNIT;
            let mut want = vec![0u8; end];
            want[..4].copy_from_slice(&inline_header(len as u32));
            want[4..4 + len].copy_from_slice(&bytes);
            assert_eq!(&buf[..end], &want[..], "{len} bytes");
            assert!(
                buf[end..].iter().all(|&b| b == 0xee),
                "{len}: past the segment"
            );
        }
    }
}
