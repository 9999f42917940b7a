//! The NIC as the data-path machines see it: one reliable-connected queue pair of one connection,
//! its completion queue, and the two small control regions the protocol needs.
//!
//! Three implementations exist: the libibverbs backend and the mlx5 direct backend in the plugin
//! crate, and the simulated fabric used by tests, benches and the fuzzer.
//!
//! The trait is deliberately small. Everything the protocol decides — what to post, when to signal,
//! how many work requests fit — is decided by the core; an implementation only executes.

use core::fmt;

/// Gather entry pointing at registered local memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    /// Virtual address of the first byte.
    pub addr: u64,
    /// Length in bytes. The core never builds an SGE longer than [`MAX_WR_BYTES`].
    pub len: u32,
    /// Local key of the memory region that covers `addr..addr+len`.
    pub lkey: u32,
}

/// Largest payload the core places in one work request (1 GiB, NCCL's `MAX_NET_SIZE`).
pub const MAX_WR_BYTES: u32 = 1 << 30;

/// Where the bytes of a send work request come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Payload<'a> {
    /// No payload: a zero-length write (still delivers an immediate when it has one).
    Empty,
    /// Bytes copied into the work request itself (`IBV_SEND_INLINE`). Never longer than
    /// [`Nic::max_inline`].
    Inline(&'a [u8]),
    /// Registered local memory (a user buffer).
    Local(Sge),
    /// A range of the connection's outbound staging region, previously filled with
    /// [`Nic::write_staging`]. Used for control bytes that do not fit inline.
    Staged {
        /// Byte offset inside the staging region.
        offset: u32,
        /// Length in bytes.
        len: u32,
    },
}

impl Payload<'_> {
    /// Number of bytes the work request carries.
    pub fn len(&self) -> usize {
        match self {
            Self::Empty => 0,
            Self::Inline(bytes) => bytes.len(),
            Self::Local(sge) => sge.len as usize,
            Self::Staged { len, .. } => *len as usize,
        }
    }

    /// True when the work request carries no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The operation of a send work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// RDMA WRITE: place the payload at the remote address; the peer sees no completion.
    Write,
    /// RDMA WRITE WITH IMMEDIATE: as `Write`, then consume one posted receive at the peer and
    /// deliver the immediate. The value is the protocol's host-order number; the implementation
    /// carries it in network byte order on the wire (`htobe32` into `imm_data`, `be32toh` out of
    /// the completion), so both ends agree whatever their endianness.
    WriteImm(u32),
}

/// One send work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendWr<'a> {
    /// Returned unchanged in the completion of this work request (when signaled or failed).
    pub wr_id: u64,
    /// What to do.
    pub op: SendOp,
    /// What to send.
    pub payload: Payload<'a>,
    /// Remote virtual address.
    pub remote_addr: u64,
    /// Remote key of the peer's memory region.
    pub rkey: u32,
    /// Whether a successful completion is generated. Failed work requests always complete.
    pub signaled: bool,
}

/// Status of a completion, as the verbs `ibv_wc_status` enum numbers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WcStatus(pub u32);

impl WcStatus {
    /// The work request succeeded.
    pub const SUCCESS: Self = Self(0);
    /// Local protection error (bad lkey or address range).
    pub const LOC_PROT_ERR: Self = Self(4);
    /// The queue pair was in error; the work request was flushed.
    pub const WR_FLUSH_ERR: Self = Self(5);
    /// Remote access error (bad rkey or out-of-bounds remote write).
    pub const REM_ACCESS_ERR: Self = Self(10);
    /// Transport retry counter exceeded: the peer did not answer.
    pub const RETRY_EXC_ERR: Self = Self(12);
    /// RNR retry counter exceeded: the peer had no posted receive.
    pub const RNR_RETRY_EXC_ERR: Self = Self(13);
    /// Generic error.
    pub const GENERAL_ERR: Self = Self(21);

    /// True for a successful completion.
    pub fn is_success(self) -> bool {
        self == Self::SUCCESS
    }

    /// The verbs name of the status (`ibv_wc_status_str` spelling).
    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "success",
            1 => "local length error",
            2 => "local QP operation error",
            3 => "local EE context operation error",
            4 => "local protection error",
            5 => "Work Request Flushed Error",
            6 => "memory management operation error",
            7 => "bad response error",
            8 => "local access error",
            9 => "remote invalid request error",
            10 => "remote access error",
            11 => "remote operation error",
            12 => "transport retry counter exceeded",
            13 => "RNR retry counter exceeded",
            14 => "local RDD violation error",
            15 => "remote invalid RD request",
            16 => "operation aborted",
            17 => "invalid EE context number",
            18 => "invalid EE context state",
            19 => "fatal error",
            20 => "response timeout error",
            21 => "general error",
            _ => "unknown completion status",
        }
    }

    /// A hint for the usual causes of this status, for the one WARN line a failure produces.
    pub fn hint(self) -> &'static str {
        match self.0 {
            0 => "",
            4 | 8 => {
                "a buffer was not registered or was freed; with GPU memory check ACS/IOMMU settings and NCCL_NET_GDR_LEVEL"
            }
            5 => "the queue pair had already failed; look for the first error on this connection",
            10 => {
                "the peer rejected the access: its buffer was deregistered, too small, or the peer restarted"
            }
            12 => {
                "the peer stopped answering: it died, or the path is down (check the link, GID index, NCCL_IB_TIMEOUT)"
            }
            13 => "the peer had no receive posted in time",
            _ => "see the NIC's error counters and dmesg",
        }
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// What a completion reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompletionKind {
    /// A send work request (signaled, or failed) finished. All earlier send work requests of the
    /// same queue pair have finished too (RC ordering).
    Send,
    /// A posted receive was consumed by the peer's RDMA WRITE WITH IMMEDIATE.
    RecvWriteImm {
        /// The immediate in host order (see [`SendOp::WriteImm`]).
        imm: u32,
        /// Bytes the write placed in local memory.
        byte_len: u32,
    },
    /// A failed completion of a receive work request (a flush, after the queue pair failed).
    RecvFailed,
}

/// One completion polled from the connection's completion queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The `wr_id` of the work request this completion belongs to.
    pub wr_id: u64,
    /// Success or the error.
    pub status: WcStatus,
    /// Vendor-specific error syndrome, zero on success.
    pub vendor_err: u32,
    /// What completed.
    pub kind: CompletionKind,
}

/// What the hardware reported for one completion, before the core interprets it: the backends
/// (libibverbs, mlx5 direct) translate their completion formats into this, and
/// [`crate::data::classify`] — the core owns the work-request ids — turns it into a [`Completion`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawCompletion {
    /// The work request's id.
    pub wr_id: u64,
    /// Success or the error.
    pub status: WcStatus,
    /// Vendor-specific error syndrome.
    pub vendor_err: u32,
    /// The operation, where the hardware reports one (failed completions carry none).
    pub op: RawOp,
    /// Bytes placed in local memory (receives).
    pub byte_len: u32,
    /// The queue the work request was posted on, where the format says (mlx5 CQEs do; `ibv_wc`
    /// of a failed completion does not).
    pub queue: Option<Queue>,
}

/// The operation of a [`RawCompletion`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RawOp {
    /// A receive consumed by an RDMA WRITE WITH IMMEDIATE; the immediate in host order.
    RecvWriteImm {
        /// The immediate.
        imm: u32,
    },
    /// A receive consumed by something else (a SEND): never in this protocol.
    RecvOther,
    /// A send-queue operation.
    Send,
    /// Not reported (a failed completion).
    Unknown,
}

/// The two work queues of a queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queue {
    /// The send queue.
    Send,
    /// The receive queue.
    Recv,
}

/// An error raised by a NIC implementation while posting or polling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NicError {
    /// Posting failed with this errno (for example ENOMEM when a queue is full, EINVAL for a
    /// malformed request). The core's credit accounting means this indicates a bug or a dead device.
    Post {
        /// The errno the provider returned.
        errno: i32,
    },
    /// Polling the completion queue failed (the CQ overran or the device died).
    Poll {
        /// The errno or provider return code.
        code: i32,
    },
    /// The device reported a fatal asynchronous event (port or device down, QP fatal).
    Fatal {
        /// Short description of the event.
        event: &'static str,
    },
}

impl fmt::Display for NicError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Post { errno } => write!(f, "posting a work request failed (errno {errno})"),
            Self::Poll { code } => write!(f, "polling the completion queue failed ({code})"),
            Self::Fatal { event } => write!(f, "device reported a fatal event: {event}"),
        }
    }
}

/// One connection's queue pair, completion queue and control regions.
///
/// Control regions: each connection owns an *inbound* region the peer RDMA-writes into (the
/// sender's clear-to-send FIFO, the receiver's completion records) and an *outbound staging*
/// region holding control bytes that do not fit inline. Their sizes are fixed by the protocol
/// (see the `data` module's layout constants); the implementation allocates and registers them.
pub trait Nic {
    /// Largest inline payload the queue pair was granted (`max_inline_data` after create).
    fn max_inline(&self) -> usize;

    /// Post `chain` in order as one linked list of send work requests. Either all are posted or
    /// none is (an error). The core guarantees the send queue has room (credit accounting).
    fn post_send(&mut self, chain: &[SendWr<'_>]) -> Result<(), NicError>;

    /// Post one receive work request with no scatter entry (it is only consumed by WRITE WITH
    /// IMMEDIATE).
    fn post_recv(&mut self, wr_id: u64) -> Result<(), NicError>;

    /// Poll up to `out.len()` completions into `out`; return how many were written.
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize, NicError>;

    /// Poll up to `out.len()` completions. A backend that converts its own completion format
    /// may offer each, in order, to `take` as it converts it: those taken (`true`: handled) are
    /// done with. The first it refuses (`false`, which must leave the caller's state as it was)
    /// and every one after it, or all of them where the backend offers none, are written to the
    /// front of `out`, in order, for the caller to handle (its own fast path included). Returns
    /// how many were polled and how many of them were written to `out`.
    ///
    /// The provided method offers none: it is [`poll`](Self::poll).
    #[inline]
    fn poll_take(
        &mut self,
        out: &mut [Completion],
        take: impl FnMut(&Completion) -> bool,
    ) -> Result<(usize, usize), NicError> {
        let _ = take;
        let got = self.poll(out)?;
        Ok((got, got))
    }

    /// [`poll_take`](Self::poll_take) for a caller whose common case is one completion, taken
    /// (a receiver waiting for its next message): the same contract; a backend may give that
    /// case a path of its own (more code in this caller, fewer instructions per call).
    #[inline(always)]
    fn poll_take_expect_one(
        &mut self,
        out: &mut [Completion],
        take: impl FnMut(&Completion) -> bool,
    ) -> Result<(usize, usize), NicError> {
        self.poll_take(out, take)
    }

    /// Copy `out.len()` bytes at `offset` of the inbound control region into `out`. The peer's
    /// NIC writes that memory concurrently: the implementation reads it with volatile loads and
    /// an acquire fence after, so a later read is not reordered before an earlier one.
    fn read_inbound(&self, offset: usize, out: &mut [u8]);

    /// Read the `N`-byte entry at `offset` of the inbound control region whose last four bytes
    /// are its stamp: the stamp on its own first, then the whole entry, ordered after it as two
    /// [`read_inbound`](Self::read_inbound)s are (a stamp seen fresh is never paired with
    /// fields older than it). Returns the stamp as first read (little-endian) and the entry.
    ///
    /// The provided method is those two reads; a backend may do them under one bounds check.
    #[inline(always)]
    fn read_inbound_stamped<const N: usize>(&self, offset: usize) -> (u32, [u8; N]) {
        const { assert!(N >= 4, "an entry ends with its 4-byte stamp") };
        let mut stamp = [0u8; 4];
        self.read_inbound(offset + (N - 4), &mut stamp);
        let mut entry = [0u8; N];
        self.read_inbound(offset, &mut entry);
        (u32::from_le_bytes(stamp), entry)
    }

    /// Copy `bytes` into the outbound staging region at `offset`.
    fn write_staging(&mut self, offset: usize, bytes: &[u8]);

    /// Copy `len` bytes at `offset` of the inbound control region (an eager message the peer
    /// wrote, whose write-with-immediate completed) into the receive buffer at `dst`, which the
    /// driver handed to the core as host memory ([`RecvBuf::host`](crate::data::RecvBuf::host))
    /// after checking it lies in its registration, and `len` is at most that buffer's capacity.
    /// The core never names GPU memory here.
    fn deliver_inbound(&mut self, offset: usize, len: usize, dst: u64);

    /// Copy `bytes` into the inbound control region at `offset` (out of range: nothing). Only
    /// port failover calls it, on a lane whose queue pair is in the error state, so the peer's
    /// NIC no longer writes there: it invalidates clear-to-send entries that may carry the
    /// peer's memory keys of before the failover.
    fn write_inbound(&mut self, offset: usize, bytes: &[u8]);
}

/// A borrowed NIC is a NIC: a wrapper that owns its NIC (the failover
/// [`Guarded`](crate::data::failover::Guarded)) can wrap a borrow where the caller keeps the NIC.
/// Every method forwards, inlined, so the borrow costs nothing on the hot path.
impl<N: Nic + ?Sized> Nic for &mut N {
    #[inline(always)]
    fn max_inline(&self) -> usize {
        (**self).max_inline()
    }

    #[inline(always)]
    fn post_send(&mut self, chain: &[SendWr<'_>]) -> Result<(), NicError> {
        (**self).post_send(chain)
    }

    #[inline(always)]
    fn post_recv(&mut self, wr_id: u64) -> Result<(), NicError> {
        (**self).post_recv(wr_id)
    }

    #[inline(always)]
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize, NicError> {
        (**self).poll(out)
    }

    #[inline(always)]
    fn poll_take(
        &mut self,
        out: &mut [Completion],
        take: impl FnMut(&Completion) -> bool,
    ) -> Result<(usize, usize), NicError> {
        (**self).poll_take(out, take)
    }

    #[inline(always)]
    fn poll_take_expect_one(
        &mut self,
        out: &mut [Completion],
        take: impl FnMut(&Completion) -> bool,
    ) -> Result<(usize, usize), NicError> {
        (**self).poll_take_expect_one(out, take)
    }

    #[inline(always)]
    fn read_inbound(&self, offset: usize, out: &mut [u8]) {
        (**self).read_inbound(offset, out);
    }

    #[inline(always)]
    fn read_inbound_stamped<const M: usize>(&self, offset: usize) -> (u32, [u8; M]) {
        (**self).read_inbound_stamped::<M>(offset)
    }

    #[inline(always)]
    fn write_staging(&mut self, offset: usize, bytes: &[u8]) {
        (**self).write_staging(offset, bytes);
    }

    #[inline(always)]
    fn deliver_inbound(&mut self, offset: usize, len: usize, dst: u64) {
        (**self).deliver_inbound(offset, len, dst);
    }

    fn write_inbound(&mut self, offset: usize, bytes: &[u8]) {
        (**self).write_inbound(offset, bytes);
    }
}

/// A region of the peer's memory that this side may RDMA-write into: the peer's inbound
/// control region, learned during the handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RemoteRegion {
    /// Virtual address of the region's first byte in the peer's address space.
    pub addr: u64,
    /// Remote key the peer registered the region with.
    pub rkey: u32,
    /// Length of the region in bytes.
    pub len: u32,
}
