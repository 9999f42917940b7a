//! Established comms and the data path: `isend`, `irecv`, `test`, `iflush`, `closeSend`,
//! `closeRecv`.
//!
//! Each comm's protocol state (`rivet-core`'s `SendConn`/`RecvConn` plus the verbs endpoint it
//! drives) sits in an [`Exclusive`] cell that is only ever found busy when NCCL breaks its own
//! contract (two threads on one comm): that is answered with an error instead of a wait (or,
//! without the flag, a data race). Entering is one compare-exchange and leaving one store, less
//! than a `std::sync::Mutex` used through `try_lock` costs per call.
//!
//! Unsafe (opted in): `closeSend`/`closeRecv` remove the comm from its handle table, which
//! [`crate::handle`] makes `unsafe` (no reference to it may be in use; NCCL's contract guarantees
//! it); and a small host-memory send's bytes are read as a slice (`host_bytes`), for the NIC to
//! copy inline or the eager path to copy into the ring (the range checked against its
//! registration; NCCL keeps the buffer unchanged until the request completes).

#![allow(unsafe_code)]

use super::flush::{FlushArgs, GpuFlush};
use super::mr;
use super::path::{Nics, Path, RecvPath, SendPath};
use crate::backend::DataEndpoint as Endpoint;
use crate::backend::OpenPort;
use crate::clock;
use crate::error::{NetError, NetResult};
use crate::handle::{Handle, Ptr, Registry, registry, unknown};
use crate::log::{INIT_NET, info, warn};
use crate::oob::socket::{self, Liveness};
use crate::profiler::{self, Events, Starts};
use core::ffi::c_int;
use exclusive::{Busy, Exclusive, Guard};
use rivet_core::data::codec::CTS_ENTRY_LEN;
use rivet_core::data::multi::{MultiRecv, MultiSend};
use rivet_core::data::{
    DataError, OneRecv, OneSend, RecvBuf, RecvConn, RequestId, SendBuf, SendConn, SizesOut,
};
use rivet_core::event::WatchId;
use rivet_core::flush::FlushId;
use rivet_core::nic::Nic;
use rivet_core::time::{Duration, Instant};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

/// The arguments of one `irecv`, copied out of NCCL's arrays.
#[derive(Debug)]
pub(crate) struct RecvArgs {
    /// Number of buffers (1..=8).
    pub(crate) n: usize,
    /// Buffer addresses.
    pub(crate) data: [Ptr; 8],
    /// Buffer sizes.
    pub(crate) sizes: [usize; 8],
    /// Tags.
    pub(crate) tags: [c_int; 8],
    /// Memory handles from `regMr`.
    pub(crate) mhandles: [Ptr; 8],
}

/// A send or receive comm. Each lives in its own heap box inside the registry, so the size
/// difference between the variants costs nothing.
///
/// `repr(u8)`: the variant is a byte of its own at the start, so a `match` is one byte load and
/// compare, not the arithmetic a discriminant kept in a field's unused values needs.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
#[repr(u8)]
pub(crate) enum DataComm {
    /// From `connect`.
    Send(Side<SendConn>),
    /// From `accept`.
    Recv(Side<RecvConn>),
    /// From `connect`, with several queue pairs (`NCCL_IB_QPS_PER_CONNECTION`).
    SendMulti(Side<MultiSend>),
    /// From `accept`, with several queue pairs.
    RecvMulti(Side<MultiRecv>),
}

/// One established direction of a connection.
#[derive(Debug)]
pub(crate) struct Side<Conn: Path> {
    state: Exclusive<State<Conn>>,
    port: Arc<OpenPort>,
    /// Every port the lanes are on, `port` first (one but on a fused device).
    ports: Vec<Arc<OpenPort>>,
    /// The peer, for log lines: "10.0.2.15:41234 (rxe0 qp 17)".
    peer: String,
    /// Whether this comm's failure was already logged (errors are sticky; log the first only).
    warned: AtomicBool,
    /// A receive comm's GPU flush (`None`: `iflush` has nothing to do on this port).
    flush: Option<Mutex<GpuFlush>>,
    /// The endpoint's inline limit, fixed with its queue pair: asked of the endpoint, it is a
    /// dispatch over the backends on every receive.
    max_inline: usize,
}

#[derive(Debug)]
struct State<Conn: Path> {
    conn: Conn,
    /// The queue pair, or the lanes, the connection drives.
    endpoint: Conn::Nics,
    watch: Watch,
    /// Profiler events of this comm's requests (empty unless a profiler returns handles).
    events: Events,
}

/// How often (in data-path calls that found nothing to complete) the peer and the port are checked.
const CHECK_EVERY_CALLS: u32 = 64;
/// Least time between two checks.
const CHECK_INTERVAL: Duration = Duration::from_millis(100);
/// How long a peer's EOF may precede the failure: completions the peer caused before it closed
/// are still being drained from the completion queue meanwhile.
const EOF_GRACE: Duration = Duration::from_millis(200);

/// Watches what RDMA alone cannot report promptly: the peer process dying while nothing is
/// outstanding on the queue pair (its out-of-band socket reaches EOF), and asynchronous device
/// events (port down, QP or device fatal). Checked from the data path, rate-limited; no thread.
#[derive(Debug)]
struct Watch {
    /// The handshake socket, kept open for the life of the comm.
    socket: TcpStream,
    /// The port whose asynchronous events it reads: lane 0's (it follows lane 0 when port
    /// failover moves it to another device).
    port: Arc<OpenPort>,
    /// This connection's registration for the port's asynchronous events.
    events: WatchId,
    calls: u32,
    next_check: Instant,
    eof_since: Option<Instant>,
}

impl Watch {
    fn new(socket: TcpStream, port: Arc<OpenPort>, events: WatchId) -> Self {
        // Keepalive failing to switch on leaves process death (EOF) detection intact.
        let _ = socket::keepalive(&socket);
        Self {
            socket,
            port,
            events,
            calls: 0,
            next_check: Instant::from_nanos(0),
            eof_since: None,
        }
    }

    /// Port failover replaced lane 0's queue pair: watch the new one's events instead (on its
    /// port, which may be another device's).
    #[cold]
    fn follow(&mut self, endpoint: &impl Nics) {
        self.port.unwatch(self.events);
        self.port = Arc::clone(endpoint.port());
        self.events = self.port.watch(endpoint.qp_num(), endpoint.cq_addr());
    }

    /// Whether the peer's end of the handshake socket is closed now (no rate limit, no grace:
    /// for naming the cause of a failure already seen).
    fn peer_gone(&self) -> bool {
        matches!(socket::liveness(&self.socket), Liveness::Gone)
    }

    /// A fatal error to inject into the connection, if the peer or the port is gone.
    fn check(&mut self) -> Option<DataError> {
        self.calls = self.calls.wrapping_add(1);
        if self.calls % CHECK_EVERY_CALLS != 0 {
            return None;
        }
        let now = clock::now();
        if now < self.next_check {
            return None;
        }
        self.next_check = now + CHECK_INTERVAL;
        if let Some(err) = self.port.fatal_event_for(self.events) {
            return Some(err);
        }
        match socket::liveness(&self.socket) {
            Liveness::Alive => {
                self.eof_since = None;
                None
            }
            Liveness::Gone => {
                let since = *self.eof_since.get_or_insert(now);
                (now.saturating_duration_since(since) >= EOF_GRACE).then_some(DataError::PeerLost)
            }
        }
    }
}

impl<Conn: Path> Side<Conn> {
    /// Wrap an established connection. The event watch covers lane 0's queue pair (a port event
    /// concerns every lane; another lane's queue-pair error reaches its completion queue).
    pub(crate) fn new(conn: Conn, endpoint: Conn::Nics, socket: TcpStream, peer: String) -> Self {
        let port = Arc::clone(endpoint.port());
        let ports = endpoint.ports();
        let events = port.watch(endpoint.qp_num(), endpoint.cq_addr());
        let watch = Watch::new(socket, Arc::clone(&port), events);
        let max_inline = endpoint.max_inline();
        Self {
            state: Exclusive::new(State {
                conn,
                endpoint,
                watch,
                events: Events::new(),
            }),
            port,
            ports,
            peer,
            warned: AtomicBool::new(false),
            flush: None,
            max_inline,
        }
    }

    /// Give the comm a GPU flush queue pair.
    pub(crate) fn with_flush(mut self, flush: GpuFlush) -> Self {
        self.flush = Some(Mutex::new(flush));
        self
    }

    fn flush(&self, call: &str) -> NetResult<Option<MutexGuard<'_, GpuFlush>>> {
        let Some(flush) = &self.flush else {
            return Ok(None);
        };
        match flush.try_lock() {
            Ok(guard) => Ok(Some(guard)),
            Err(TryLockError::WouldBlock) => Err(NetError::misuse(format!(
                "{call}: another thread is flushing this comm at the same time"
            ))),
            Err(TryLockError::Poisoned(_)) => Err(NetError::misuse(format!(
                "{call}: this comm's flush is unusable after an earlier internal error"
            ))),
        }
    }

    /// The port the comm runs on.
    pub(crate) fn port(&self) -> &Arc<OpenPort> {
        &self.port
    }

    #[inline(always)]
    fn lock(&self, call: &'static str) -> NetResult<Guard<'_, State<Conn>>> {
        self.state
            .try_enter()
            .map_err(|busy| busy_error(call, busy))
    }

    /// Turn a data-path error into the NCCL error, logging the first one of this comm.
    #[cold]
    #[inline(never)]
    fn fail(&self, call: &str, qpn: u32, err: &DataError) -> NetError {
        let message = format!(
            "{call}: connection with {} (local QP {qpn}) failed: {err}",
            self.peer
        );
        let error = match err {
            DataError::InvalidRequest { .. } => NetError::misuse(message),
            DataError::InvalidArgument(_) => NetError::invalid_argument(message),
            DataError::SizeMismatch { .. } => NetError::invalid_usage(message),
            DataError::Nic(_) => NetError::system(message),
            _ => NetError::remote(message),
        };
        if self.warned.swap(true, Ordering::Relaxed) {
            error.logged()
        } else {
            error
        }
    }
}

/// The error for a comm found busy (another thread inside) or poisoned (a panic inside earlier).
#[cold]
#[inline(never)]
fn busy_error(call: &str, busy: Busy) -> NetError {
    match busy {
        Busy::InUse => NetError::misuse(format!(
            "{call}: another thread is using this comm at the same time (NCCL drives a comm from one thread)"
        )),
        Busy::Poisoned => NetError::misuse(format!(
            "{call}: this comm is unusable after an earlier internal error"
        )),
    }
}

impl<Conn: Path> Drop for Side<Conn> {
    fn drop(&mut self) {
        // Before the endpoint (QP and CQ) is destroyed: a later connection may get its numbers.
        let watch = &self.state.get_mut().watch;
        watch.port.unwatch(watch.events);
    }
}

/// How long `closeSend`/`closeRecv` wait for work already posted on the connection to make
/// progress before its queue pair is destroyed anyway (see [`Side::drain_before_close`]): a peer
/// that is still sending keeps the wait going, one that stopped ends it after this.
const CLOSE_IDLE: Duration = Duration::from_secs(2);
/// The longest `closeSend`/`closeRecv` wait in any case.
const CLOSE_MAX: Duration = Duration::from_secs(10);

/// How a close went, for its log line.
enum Drained {
    /// Nothing was left, or all of it finished.
    Clean,
    /// The connection had failed, or the peer closed or died: nothing more could finish.
    PeerGone,
    /// The deadline passed with work outstanding.
    TimedOut,
}

impl<Conn: Path> Side<Conn> {
    /// Before the queue pair is destroyed, let what is already posted finish: a receiver waits
    /// until the data of every receive the sender was granted has arrived, a sender until every
    /// posted send has completed (`rivet_core`'s `drain`). Bounded by [`CLOSE_IDLE`] without
    /// progress and [`CLOSE_MAX`] in all, and cut short when the connection fails or the peer's socket reaches EOF (it closed its end or
    /// died: nothing more will come). NCCL may close with requests outstanding; destroying the
    /// queue pair at once would cut off clear-to-send writes still queued and the peer's writes
    /// for receives it was granted, failing (or stalling) the peer's sends although this side
    /// posted their receives.
    fn drain_before_close(&self, call: &str) {
        // A close goes ahead even after an earlier internal error poisoned the cell.
        let mut state = self.state.enter_anyway();
        let State {
            conn,
            endpoint,
            watch,
            events: _,
        } = &mut *state;
        let outstanding = conn.outstanding();
        let start = clock::now();
        let mut idle_until = start + CLOSE_IDLE;
        let mut left_before = usize::MAX;
        let drained = loop {
            let left = match conn.drain(endpoint) {
                Ok(0) => break Drained::Clean,
                Err(_) => break Drained::PeerGone,
                Ok(left) => left,
            };
            let now = clock::now();
            if left < left_before {
                left_before = left;
                idle_until = now + CLOSE_IDLE;
            }
            if socket::liveness(&watch.socket) == Liveness::Gone
                || watch.port.fatal_event_for(watch.events).is_some()
            {
                break Drained::PeerGone;
            }
            if now >= idle_until || now >= start + CLOSE_MAX {
                break Drained::TimedOut;
            }
            std::thread::yield_now();
        };
        let waited = clock::now().saturating_duration_since(start);
        let qpn = endpoint.qp_num();
        match drained {
            Drained::TimedOut => warn!(
                "{call}: connection with {} (local QP {qpn}): work posted before the close had not \
                 finished after {waited} (no progress for {CLOSE_IDLE}, or {CLOSE_MAX} in all); \
                 closing anyway ({outstanding} request(s) never tested)",
                self.peer
            ),
            _ if outstanding > 0 => info!(
                INIT_NET,
                "{call}: connection with {} (local QP {qpn}) closed with {outstanding} request(s) \
                 never tested; posted work {} after {waited}",
                self.peer,
                if matches!(drained, Drained::Clean) {
                    "finished"
                } else {
                    "was abandoned (the connection had failed or the peer is gone)"
                }
            ),
            _ => {}
        }
    }

    #[inline(always)]
    fn test(&self, req: RequestId, sizes: &mut impl SizesOut) -> NetResult<bool> {
        let mut state = self.lock("test")?;
        let State {
            conn,
            endpoint,
            watch,
            events,
        } = &mut *state;
        let tested = conn.test(endpoint, req, sizes);
        if conn.progress_failover(endpoint, &watch.socket) {
            watch.follow(endpoint);
        }
        match tested {
            Ok(false) => match watch.check() {
                None => {
                    state.leave();
                    Ok(false)
                }
                Some(err) => {
                    conn.handle_fatal(err);
                    Err(self.fail("test", endpoint.qp_num(), &err))
                }
            },
            Ok(done) => {
                // One branch on the comm's open events: none unless a profiler returned handles.
                if !events.is_empty() {
                    events.stop(req.to_bits());
                }
                state.leave();
                Ok(done)
            }
            Err(e) => Err(self.fail("test", endpoint.qp_num(), &root_cause(e, watch))),
        }
    }
}

/// The cause to report for a connection failure `e`: when a work request failed and the peer's
/// socket says it closed or died, that is the cause (a write to a peer that has gone fails
/// with the NIC's retry error, which hides it).
#[cold]
fn root_cause(e: DataError, watch: &Watch) -> DataError {
    match e {
        DataError::Completion { .. } if watch.peer_gone() => DataError::PeerLost,
        _ => e,
    }
}

static COMMS: Registry<DataComm> = registry!(0xda7a, "live connections (send and receive comms)");

/// Register an established comm and return NCCL's handle for it.
pub(crate) fn insert(comm: DataComm) -> NetResult<Ptr> {
    COMMS
        .insert(Box::new(comm))
        .map(Handle::to_ptr)
        // The guard prefixes the call (connect or accept).
        .map_err(|full| NetError::system(full.to_string()))
}

/// The ports of data comm `comm` (lane 0's first), for `regMr`.
pub(crate) fn ports_of(call: &str, comm: Ptr) -> NetResult<Vec<Arc<OpenPort>>> {
    let (_, entry) = COMMS.lookup(call, "comm", comm)?;
    Ok(match entry {
        DataComm::Send(side) => vec![Arc::clone(side.port())],
        DataComm::Recv(side) => vec![Arc::clone(side.port())],
        DataComm::SendMulti(side) => side.ports.clone(),
        DataComm::RecvMulti(side) => side.ports.clone(),
    })
}

/// The port of data comm `comm` (lane 0's), for `deregMr`.
pub(crate) fn port_of(call: &str, comm: Ptr) -> NetResult<Arc<OpenPort>> {
    // The memory layer's errors name the argument "comm" (it may be either direction).
    let (_, entry) = COMMS.lookup(call, "comm", comm)?;
    Ok(match entry {
        DataComm::Send(side) => Arc::clone(side.port()),
        DataComm::Recv(side) => Arc::clone(side.port()),
        DataComm::SendMulti(side) => Arc::clone(side.port()),
        DataComm::RecvMulti(side) => Arc::clone(side.port()),
    })
}

// The single-queue-pair drivers: they post what the core decided (`SendConn::isend_one`,
// `RecvConn::irecv_one`), so they are written here, beside the entries that call them; the
// traits and the multi-lane shapes are in `path.rs`.
impl SendPath for SendConn {
    /// The one-buffer send decided by the core from the entry this side reads, and posted here
    /// (`SendConn::isend_one`); the core's general `isend` for everything else.
    #[inline(always)]
    fn isend(
        &mut self,
        nic: &mut Endpoint,
        buf: SendBuf,
        host_memory: bool,
        tag: u32,
    ) -> Result<Option<RequestId>, DataError> {
        if let Some(offset) = self.head_entry() {
            // The stamp first, then the entry (`read_inbound_stamped` orders the reads): a stamp
            // seen fresh is never paired with fields older than it.
            let (stamp, entry) = nic.read_inbound_stamped::<CTS_ENTRY_LEN>(offset);
            // A host-memory send's bytes: the core sends the small ones inline.
            let host = (host_memory && buf.len != 0)
                // SAFETY: as `host_bytes` asks: `Side::isend` checked the range against the
                // send's host-memory registration; the slice lives until the post copied it.
                .then(|| unsafe { host_bytes(buf) });
            match self.isend_one(stamp, &entry, buf, tag, host)? {
                OneSend::Post { req, wr } => {
                    return match nic.post_send(&[wr]) {
                        Ok(()) => Ok(Some(req)),
                        Err(err) => Err(self.post_failed(req, err)),
                    };
                }
                OneSend::NotYet => return Ok(None),
                OneSend::General => {}
            }
        }
        isend_general(self, nic, buf, host_memory, tag)
    }
}

/// The core's general `isend`, handed the send's bytes when the eager path may copy them: host
/// memory, at most the eager threshold.
#[inline(never)]
fn isend_general(
    conn: &mut SendConn,
    nic: &mut Endpoint,
    buf: SendBuf,
    host_memory: bool,
    tag: u32,
) -> Result<Option<RequestId>, DataError> {
    let host = (host_memory && buf.len <= conn.eager_threshold())
        // SAFETY: as `host_bytes` asks: `Side::isend` checked the range against the send's
        // host-memory registration; the slice lives only for this call (the eager path copies
        // from it here).
        .then(|| unsafe { host_bytes(buf) });
    conn.isend_host(nic, buf, host, tag)
}

/// The bytes of a host-memory send, for the NIC or the eager path to copy.
///
/// # Safety
/// `buf.addr..buf.addr + buf.len` must lie inside a registration NCCL made of host memory
/// (`NCCL_PTR_HOST`; `Side::isend` checks the range), and the slice must not outlive the call
/// that copies it: NCCL keeps a send buffer alive and unchanged until its request completes.
#[inline(always)]
unsafe fn host_bytes<'a>(buf: SendBuf) -> &'a [u8] {
    if buf.len == 0 {
        &[]
    } else {
        // SAFETY: the caller's promise above: the range is live, readable host memory.
        unsafe { core::slice::from_raw_parts(buf.addr as usize as *const u8, buf.len as usize) }
    }
}

impl RecvPath for RecvConn {
    fn irecv(
        &mut self,
        nic: &mut Endpoint,
        bufs: &[RecvBuf],
        tags: &[u32],
    ) -> Result<Option<RequestId>, DataError> {
        Self::irecv(self, nic, bufs, tags)
    }

    /// The receive decided by the core and posted here (`RecvConn::irecv_one`: the empty
    /// receive, then the clear-to-send write); the core's general `irecv` when it declines.
    #[inline(always)]
    fn irecv_one(
        &mut self,
        nic: &mut Endpoint,
        buf: RecvBuf,
        tag: u32,
        max_inline: usize,
    ) -> Result<Option<RequestId>, DataError> {
        match self.irecv_one(buf, tag, max_inline)? {
            OneRecv::Post { req, recv, cts } => {
                if let Err(err) = nic.post_recv(recv) {
                    return Err(self.post_failed(req, err));
                }
                // Built after the receive's post, not kept across it.
                let cts = self.one_cts_write(cts);
                match nic.post_send(&[cts]) {
                    Ok(()) => Ok(Some(req)),
                    Err(err) => Err(self.post_failed(req, err)),
                }
            }
            OneRecv::General => Self::irecv(self, nic, &[buf], &[tag]),
        }
    }
}

/// A registration's range checks, written here with the data path that runs them on every
/// `isend`/`irecv` (the registration itself is [`mr`]'s).
impl mr::UserMr {
    /// The local key, after checking `addr..addr+len` lies inside the registration.
    pub(crate) fn lkey_for(&self, addr: u64, len: u64) -> NetResult<u32> {
        self.check(addr, len).map(|()| self.lkey)
    }

    /// The remote key, after the same check.
    pub(crate) fn rkey_for(&self, addr: u64, len: u64) -> NetResult<u32> {
        self.check(addr, len).map(|()| self.rkey)
    }

    pub(super) fn check(&self, addr: u64, len: u64) -> NetResult<()> {
        // Against what NCCL registered, not the (page-rounded, possibly shared) registration:
        // a buffer outside the handle's own range is NCCL's bug even where the NIC would take it.
        // `offset` wraps above `self.len` for an `addr` below the range (which does not wrap:
        // `reg_mr_on` refuses one that would), so two comparisons cover both ends.
        let offset = addr.wrapping_sub(self.addr);
        if len == 0 || (offset <= self.len && len <= self.len - offset) {
            return Ok(());
        }
        Err(self.outside(addr, len))
    }

    #[cold]
    #[inline(never)]
    fn outside(&self, addr: u64, len: u64) -> NetError {
        NetError::invalid_argument(format!(
            "buffer {addr:#x}+{len} is not inside its registration {:#x}+{}",
            self.addr, self.len
        ))
    }
}

/// `isend`: the request, or NULL ("try later"). Inlined into the C entry point, like `irecv` and
/// `test`: the result is then built where the shim reads it, not copied up through each layer.
#[inline(always)]
pub(crate) fn isend(
    comm: Ptr,
    data: Ptr,
    size: usize,
    tag: c_int,
    mh: Ptr,
    starts: Option<Starts>,
) -> NetResult<Ptr> {
    let (handle, entry) = COMMS.lookup("isend", "sendComm", comm)?;
    match entry {
        DataComm::Send(side) => side.isend(handle, data, size, tag, mh, starts),
        DataComm::SendMulti(side) => isend_lanes(side, handle, data, size, tag, mh, starts),
        // A default arm, not the two receive variants: two compares instead of a jump table.
        _ => Err(NetError::misuse("isend on a receive comm")),
    }
}

/// The profiler events a post starts once it made a request: NCCL's callback and `pHandle`s,
/// the work request's opcode, each buffer's size.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EventStart<'a> {
    starts: Starts,
    opcode: i32,
    sizes: &'a [usize],
}

impl<'a> EventStart<'a> {
    /// The events of a post of `sizes` (one per buffer) with `opcode`, if NCCL asked for them.
    #[inline(always)]
    fn of(starts: Option<Starts>, opcode: i32, sizes: &'a [usize]) -> Option<Self> {
        starts.map(|starts| Self {
            starts,
            opcode,
            sizes,
        })
    }
}

impl<Conn: Path> Guard<'_, State<Conn>> {
    /// The C answer to a post (`isend`/`irecv`): the request; NULL to try later, unless the peer or
    /// the port has failed the connection meanwhile; or the comm's failure. Leaves the cell.
    #[inline(always)]
    fn answer(
        mut self,
        side: &Side<Conn>,
        call: &'static str,
        handle: Handle,
        posted: Result<Option<RequestId>, DataError>,
        events: Option<EventStart<'_>>,
    ) -> NetResult<Ptr> {
        let State {
            conn,
            endpoint,
            watch,
            ..
        } = &mut *self;
        if conn.progress_failover(endpoint, &watch.socket) {
            watch.follow(endpoint);
        }
        let answer = match posted {
            Ok(Some(req)) => {
                let request = handle.request_ptr(req.to_bits());
                if let Some(e) = events
                    && self.events.due()
                {
                    let qpn = self.endpoint.qp_num();
                    self.events
                        .start(e.starts, request, req.to_bits(), qpn, e.opcode, e.sizes);
                }
                Ok(request)
            }
            Ok(None) => match self.watch.check() {
                None => Ok(core::ptr::null_mut()),
                Some(err) => {
                    self.conn.handle_fatal(err);
                    Err(side.fail(call, self.endpoint.qp_num(), &err))
                }
            },
            Err(e) => Err(side.fail(call, self.endpoint.qp_num(), &e)),
        };
        self.leave();
        answer
    }
}

impl<Conn: SendPath> Side<Conn> {
    #[inline(always)]
    fn isend(
        &self,
        handle: Handle,
        data: Ptr,
        size: usize,
        tag: c_int,
        mh: Ptr,
        starts: Option<Starts>,
    ) -> NetResult<Ptr> {
        let side = self;
        let len = size as u64;
        let mr = if size == 0 && mh.is_null() {
            None
        } else {
            Some(mr::lookup("isend", mh)?)
        };
        let lkey = match mr {
            Some(mr) => mr.lkey_for(data as u64, len)?,
            None => 0,
        };
        let mut state = side.lock("isend")?;
        let State {
            conn,
            endpoint,
            watch: _,
            events: _,
        } = &mut *state;
        let buf = SendBuf {
            addr: data as u64,
            len,
            lkey,
        };
        let posted = if endpoint.devices() > 1 {
            let keys = device_keys("isend", mr, buf.addr, len, false, endpoint.devices())?;
            conn.isend_keyed(endpoint, buf, &keys[..endpoint.devices()], tag as u32)
        } else {
            conn.isend(endpoint, buf, mr.is_some_and(|mr| mr.host), tag as u32)
        };
        let events = EventStart::of(starts, profiler::OPCODE_SEND, core::slice::from_ref(&size));
        state.answer(side, "isend", handle, posted, events)
    }
}

// The several-lane paths out of line: inlined like the one-queue-pair path they would grow the C
// entry points by a copy each, which the one-lane path pays for in its own calls.
#[inline(never)]
fn isend_lanes<Conn: SendPath>(
    side: &Side<Conn>,
    handle: Handle,
    data: Ptr,
    size: usize,
    tag: c_int,
    mh: Ptr,
    starts: Option<Starts>,
) -> NetResult<Ptr> {
    side.isend(handle, data, size, tag, mh, starts)
}

#[inline(never)]
fn irecv_lanes<Conn: RecvPath>(
    side: &Side<Conn>,
    handle: Handle,
    args: &RecvArgs,
    starts: Option<Starts>,
) -> NetResult<Ptr> {
    side.irecv(handle, args, starts)
}

#[inline(never)]
fn test_lanes(entry: &DataComm, req: RequestId, sizes: &mut impl SizesOut) -> NetResult<bool> {
    match entry {
        DataComm::SendMulti(side) => side.test(req, sizes),
        DataComm::RecvMulti(side) => side.test(req, sizes),
        DataComm::Send(side) => side.test(req, sizes),
        DataComm::Recv(side) => side.test(req, sizes),
    }
}

/// Post the receive of `bufs` on a fused device, with each buffer's key on every port (the
/// registration must cover them all).
#[inline(never)]
fn irecv_keyed<Conn: RecvPath>(
    conn: &mut Conn,
    endpoint: &mut Conn::Nics,
    bufs: &[RecvBuf],
    mrs: &[Option<&mr::UserMr>],
    tags: &[u32],
) -> NetResult<Result<Option<RequestId>, DataError>> {
    let devices = endpoint.devices();
    // rkeys[d][b]: buffer b's key on port d.
    let mut rkeys = [[0u32; 8]; 8];
    for (b, (buf, mr)) in bufs.iter().zip(mrs).enumerate() {
        let keys = device_keys("irecv", *mr, buf.addr, buf.len, true, devices)?;
        for (d, key) in keys[..devices].iter().enumerate() {
            rkeys[d][b] = *key;
        }
    }
    Ok(conn.irecv_keyed(endpoint, bufs, &rkeys[..devices], tags))
}

/// `irecv`: the request, or NULL ("try later").
#[inline]
pub(crate) fn irecv(comm: Ptr, args: &RecvArgs, starts: Option<Starts>) -> NetResult<Ptr> {
    let (handle, entry) = COMMS.lookup("irecv", "recvComm", comm)?;
    match entry {
        DataComm::Recv(side) => side.irecv(handle, args, starts),
        DataComm::RecvMulti(side) => irecv_lanes(side, handle, args, starts),
        _ => Err(NetError::misuse("irecv on a send comm")),
    }
}

/// `irecv` of one buffer (NCCL's point-to-point receive): the request, or NULL ("try later").
#[inline(always)]
pub(crate) fn irecv_one(
    comm: Ptr,
    data: Ptr,
    size: usize,
    tag: c_int,
    mh: Ptr,
    starts: Option<Starts>,
) -> NetResult<Ptr> {
    let (handle, entry) = COMMS.lookup("irecv", "recvComm", comm)?;
    match entry {
        DataComm::Recv(side) => side.post_recv_one(handle, data, size, mh, tag as u32, starts),
        DataComm::RecvMulti(side) => {
            irecv_one_lanes(side, handle, data, size, mh, tag as u32, starts)
        }
        // As in `isend`: a default arm for both send kinds.
        _ => Err(NetError::misuse("irecv on a send comm")),
    }
}

#[inline(never)]
fn irecv_one_lanes<Conn: RecvPath>(
    side: &Side<Conn>,
    handle: Handle,
    data: Ptr,
    size: usize,
    mh: Ptr,
    tag: u32,
    starts: Option<Starts>,
) -> NetResult<Ptr> {
    side.post_recv_one(handle, data, size, mh, tag, starts)
}

impl<Conn: RecvPath> Side<Conn> {
    #[inline(always)]
    fn irecv(&self, handle: Handle, args: &RecvArgs, starts: Option<Starts>) -> NetResult<Ptr> {
        if args.n == 1 {
            // One-entry arrays, not eight.
            let (data, size, mh) = (args.data[0], args.sizes[0], args.mhandles[0]);
            return self.post_recv_one(handle, data, size, mh, args.tags[0] as u32, starts);
        }
        let mut bufs = [RecvBuf {
            addr: 0,
            len: 0,
            rkey: 0,
            host: false,
        }; 8];
        let mut tags = [0u32; 8];
        let mut mrs = [None; 8];
        for i in 0..args.n {
            (bufs[i], mrs[i]) = recv_buf(args.data[i], args.sizes[i], args.mhandles[i])?;
            tags[i] = args.tags[i] as u32;
        }
        let n = args.n;
        let events = EventStart::of(starts, profiler::OPCODE_RECV, &args.sizes[..n]);
        self.post_recv(handle, &bufs[..n], &mrs[..n], &tags[..n], events)
    }

    /// Post the receive of `bufs` (registered as `mrs`, tagged `tags`): on a fused device with
    /// each buffer's key on every port.
    #[inline(always)]
    fn post_recv(
        &self,
        handle: Handle,
        bufs: &[RecvBuf],
        mrs: &[Option<&mr::UserMr>],
        tags: &[u32],
        events: Option<EventStart<'_>>,
    ) -> NetResult<Ptr> {
        let mut state = self.lock("irecv")?;
        let State {
            conn,
            endpoint,
            watch: _,
            events: _,
        } = &mut *state;
        let posted = if endpoint.devices() > 1 {
            irecv_keyed(conn, endpoint, bufs, mrs, tags)?
        } else {
            conn.irecv(endpoint, bufs, tags)
        };
        state.answer(self, "irecv", handle, posted, events)
    }

    /// [`post_recv`](Self::post_recv) of one buffer (`data`, `size` bytes, registered as `mh`),
    /// by value. Its registration is looked up and checked once the comm is entered: before, its
    /// key and range were held (in memory) across the entry.
    #[inline(always)]
    fn post_recv_one(
        &self,
        handle: Handle,
        data: Ptr,
        size: usize,
        mh: Ptr,
        tag: u32,
        starts: Option<Starts>,
    ) -> NetResult<Ptr> {
        let mut state = self.lock("irecv")?;
        let (buf, mr) = recv_buf(data, size, mh)?;
        let State {
            conn,
            endpoint,
            watch: _,
            events: _,
        } = &mut *state;
        let posted = if endpoint.devices() > 1 {
            irecv_keyed(conn, endpoint, &[buf], &[mr], &[tag])?
        } else {
            conn.irecv_one(endpoint, buf, tag, self.max_inline)
        };
        let events = EventStart::of(starts, profiler::OPCODE_RECV, core::slice::from_ref(&size));
        state.answer(self, "irecv", handle, posted, events)
    }

    /// `iflush` on this receive comm (`None`: nothing to flush).
    fn iflush(&self, handle: Handle, args: &FlushArgs) -> NetResult<Option<Ptr>> {
        let Some(mut flush) = self.flush("iflush")? else {
            return Ok(None);
        };
        Ok(flush
            .start(args)?
            .map(|id| handle.request_ptr(id.to_bits())))
    }

    /// `test` of a flush request of this receive comm.
    /// `Ok(true)` when it finished (a flush has no sizes).
    fn test_flush(&self, request: Ptr, flush_id: FlushId) -> NetResult<bool> {
        let mut flush = self
            .flush("test")?
            .ok_or_else(|| unknown("test", "request", request))?;
        flush.test(flush_id)
    }
}

/// `iflush`: `None` (a NULL request, "done") when there is nothing to flush.
pub(crate) fn iflush(comm: Ptr, args: &FlushArgs) -> NetResult<Option<Ptr>> {
    let (handle, entry) = COMMS.lookup("iflush", "recvComm", comm)?;
    match entry {
        DataComm::Recv(side) => side.iflush(handle, args),
        DataComm::RecvMulti(side) => side.iflush(handle, args),
        DataComm::Send(_) | DataComm::SendMulti(_) => {
            Err(NetError::misuse("iflush on a send comm"))
        }
    }
}

/// Receive buffer `data` of `size` bytes with its remote key, and its registration `mh` (none
/// for an empty buffer passed without one).
#[inline(always)]
fn recv_buf(data: Ptr, size: usize, mh: Ptr) -> NetResult<(RecvBuf, Option<&'static mr::UserMr>)> {
    let (addr, len) = (data as u64, size as u64);
    if len == 0 && mh.is_null() {
        return Ok((
            RecvBuf {
                addr,
                len,
                rkey: 0,
                host: false,
            },
            None,
        ));
    }
    let mr = mr::lookup("irecv", mh)?;
    let rkey = mr.rkey_for(addr, len)?;
    let host = mr.host;
    Ok((
        RecvBuf {
            addr,
            len,
            rkey,
            host,
        },
        Some(mr),
    ))
}

/// A buffer's keys on every port of a fused device (member order); the registration must have
/// been made on all of them (a `regMr` on this comm is).
fn device_keys(
    call: &str,
    mr: Option<&mr::UserMr>,
    addr: u64,
    len: u64,
    remote: bool,
    devices: usize,
) -> NetResult<[u32; 8]> {
    let mut keys = [0u32; 8];
    let Some(mr) = mr else {
        return Ok(keys);
    };
    let n = mr.keys_for(addr, len, remote, &mut keys)?;
    if n < devices {
        return Err(NetError::invalid_usage(format!(
            "{call}: the buffer is registered on {n} of the {devices} ports of this fused device \
             (register it with regMr on this comm)"
        )));
    }
    Ok(keys)
}

/// `test`: `Ok(false)` pending, `Ok(true)` finished with its sizes written to `sizes` (the
/// request is gone; a flush writes none).
#[inline(always)]
pub(crate) fn test(request: Ptr, sizes: &mut impl SizesOut) -> NetResult<bool> {
    let (entry, id) = COMMS.lookup_request("test", "request", request)?;
    // A data request first (the common case); a flush id never unpacks as one (its mark is a
    // bit a request id keeps zero).
    let Some(req) = RequestId::from_bits(id) else {
        return test_other(entry, request, id);
    };
    // Three arms, the several-lane comms behind one: a compare or two, not a jump table.
    match entry {
        DataComm::Send(side) => side.test(req, sizes),
        DataComm::Recv(side) => side.test(req, sizes),
        lanes => test_lanes(lanes, req, sizes),
    }
}

/// `test` of a request that is not a data request: a flush, or an unknown request.
#[inline(never)]
fn test_other(entry: &DataComm, request: Ptr, id: u32) -> NetResult<bool> {
    let Some(flush_id) = FlushId::from_bits(id) else {
        return Err(unknown("test", "request", request));
    };
    match entry {
        DataComm::Recv(side) => side.test_flush(request, flush_id),
        DataComm::RecvMulti(side) => side.test_flush(request, flush_id),
        DataComm::Send(_) | DataComm::SendMulti(_) => Err(unknown("test", "request", request)),
    }
}

fn close(call: &str, comm: Ptr, want_send: bool) -> NetResult<()> {
    let what = if want_send { "sendComm" } else { "recvComm" };
    let (handle, entry) = COMMS.lookup(call, what, comm)?;
    if matches!(entry, DataComm::Send(_) | DataComm::SendMulti(_)) != want_send {
        return Err(unknown(call, what, comm));
    }
    // SAFETY: a close is NCCL's last call on a comm, after every other call on it returned; this
    // thread's `entry` is not used past here.
    let comm = unsafe { COMMS.remove(handle) }.ok_or_else(|| unknown(call, what, comm))?;
    match &*comm {
        DataComm::Send(side) => side.drain_before_close(call),
        DataComm::Recv(side) => side.drain_before_close(call),
        DataComm::SendMulti(side) => side.drain_before_close(call),
        DataComm::RecvMulti(side) => side.drain_before_close(call),
    }
    drop(comm);
    Ok(())
}

pub(crate) fn close_send(comm: Ptr) -> NetResult<()> {
    close("closeSend", comm, true)
}

pub(crate) fn close_recv(comm: Ptr) -> NetResult<()> {
    close("closeRecv", comm, false)
}

mod exclusive {
    //! A cell one thread uses at a time, for a comm's data-path state: NCCL drives each comm from one
    //! thread, so a second thread arriving while the first is inside is NCCL's misuse, answered with
    //! an error ([`Busy::InUse`]) instead of a wait or a data race.
    //!
    //! It replaces a `std::sync::Mutex` used only through `try_lock`: entering is one
    //! compare-exchange and leaving one store, with no waiter bookkeeping (nobody ever waits on the
    //! data path). A panic inside leaves the cell poisoned ([`Busy::Poisoned`]), as a mutex would be:
    //! the state it guards may be half-updated, so later calls on the comm fail.
    //!
    //! Leaving: [`Guard::leave`] on the normal path is the one store; dropping a guard (the path an
    //! unwinding panic takes, and any early return) asks `std::thread::panicking()` first, to free or
    //! poison. The data path leaves explicitly, so only the unwinding path and the cold early
    //! returns pay for the question; a path that drops its guard instead is just as correct.
    //!
    //! Unsafe (opted in): the cell hands out `&mut T` from `&self`; the flag makes that reference
    //! unique (only the thread whose compare-exchange won holds a guard).

    #![allow(unsafe_code)]

    use core::cell::UnsafeCell;
    use core::fmt;
    use core::ops::{Deref, DerefMut};
    use core::sync::atomic::{AtomicU8, Ordering};

    const FREE: u8 = 0;
    const BUSY: u8 = 1;
    const POISONED: u8 = 2;

    /// Why [`Exclusive::try_enter`] refused.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(crate) enum Busy {
        /// Another thread is inside.
        InUse,
        /// A call panicked inside; the state may be inconsistent.
        Poisoned,
    }

    /// A `T` entered by one thread at a time.
    pub(crate) struct Exclusive<T> {
        state: AtomicU8,
        value: UnsafeCell<T>,
    }

    // SAFETY: the value is only reached through a guard, and at most one guard exists at a time
    // (the compare-exchange from FREE to BUSY succeeds for one thread); moving `T` between threads
    // that way needs `T: Send`, exactly as for `Mutex<T>`.
    unsafe impl<T: Send> Sync for Exclusive<T> {}

    impl<T> Exclusive<T> {
        /// A free cell holding `value`.
        pub(crate) const fn new(value: T) -> Self {
            Self {
                state: AtomicU8::new(FREE),
                value: UnsafeCell::new(value),
            }
        }

        /// Enter, or say why not: never waits.
        #[inline(always)]
        pub(crate) fn try_enter(&self) -> Result<Guard<'_, T>, Busy> {
            match self
                .state
                .compare_exchange(FREE, BUSY, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => Ok(Guard { cell: self }),
                Err(POISONED) => Err(Busy::Poisoned),
                Err(_) => Err(Busy::InUse),
            }
        }

        /// Enter even if poisoned, yielding while another thread is inside (close, which NCCL calls
        /// after every other call on the comm returned, so the wait never happens under the contract).
        pub(crate) fn enter_anyway(&self) -> Guard<'_, T> {
            loop {
                for from in [FREE, POISONED] {
                    if self
                        .state
                        .compare_exchange(from, BUSY, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                    {
                        return Guard { cell: self };
                    }
                }
                std::thread::yield_now();
            }
        }

        /// The value, through exclusive ownership of the cell (no flag needed).
        pub(crate) fn get_mut(&mut self) -> &mut T {
            self.value.get_mut()
        }
    }

    impl<T> fmt::Debug for Exclusive<T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let state = match self.state.load(Ordering::Relaxed) {
                FREE => "free",
                BUSY => "in use",
                _ => "poisoned",
            };
            f.debug_struct("Exclusive").field("state", &state).finish()
        }
    }

    /// Proof of being inside an [`Exclusive`]; leaving (drop) frees it, or poisons it when the
    /// thread is unwinding from a panic.
    pub(crate) struct Guard<'a, T> {
        cell: &'a Exclusive<T>,
    }

    impl<T> Deref for Guard<'_, T> {
        type Target = T;
        #[inline(always)]
        fn deref(&self) -> &T {
            // SAFETY: this guard is the only one (see `Exclusive`), so no `&mut T` exists elsewhere.
            unsafe { &*self.cell.value.get() }
        }
    }

    impl<T> DerefMut for Guard<'_, T> {
        #[inline(always)]
        fn deref_mut(&mut self) -> &mut T {
            // SAFETY: this guard is the only one, and `&mut self` makes this reference unique.
            unsafe { &mut *self.cell.value.get() }
        }
    }

    impl<T> Guard<'_, T> {
        /// Leave on the normal path: free the cell. A call, never made from a destructor, so the
        /// thread is not unwinding and there is nothing to ask.
        #[inline(always)]
        pub(crate) fn leave(self) {
            let cell = self.cell;
            core::mem::forget(self);
            cell.state.store(FREE, Ordering::Release);
        }
    }

    impl<T> Drop for Guard<'_, T> {
        #[inline(always)]
        fn drop(&mut self) {
            let next = if std::thread::panicking() {
                POISONED
            } else {
                FREE
            };
            self.cell.state.store(next, Ordering::Release);
        }
    }

    impl<T> fmt::Debug for Guard<'_, T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("Guard")
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use std::sync::Arc;
        use std::sync::atomic::AtomicBool;

        #[test]
        fn a_second_entry_is_refused_until_the_first_leaves() {
            let cell = Exclusive::new(5u32);
            let mut first = cell.try_enter().expect("free");
            *first += 1;
            assert_eq!(cell.try_enter().err(), Some(Busy::InUse));
            drop(first);
            assert_eq!(*cell.try_enter().expect("free again"), 6);
            let second = cell.try_enter().expect("free");
            assert_eq!(cell.try_enter().err(), Some(Busy::InUse));
            second.leave();
            assert_eq!(*cell.try_enter().expect("left: free again"), 6);
        }

        #[test]
        fn a_panic_inside_poisons_until_entered_anyway() {
            let cell = Exclusive::new(Vec::<u8>::new());
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let mut inside = cell.try_enter().expect("free");
                inside.push(1);
                panic!("inside");
            }));
            assert!(caught.is_err());
            assert_eq!(cell.try_enter().err(), Some(Busy::Poisoned));
            assert_eq!(
                *cell.enter_anyway(),
                vec![1],
                "close still reaches the state"
            );
        }

        /// Two threads hammering one cell: every entry either gets the cell alone or is refused
        /// with `InUse`; never are both inside (the data race a missing check would allow).
        #[test]
        fn two_threads_never_are_inside_together() {
            let cell = Arc::new(Exclusive::new(0u64));
            let inside = Arc::new(AtomicBool::new(false));
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let (cell, inside) = (Arc::clone(&cell), Arc::clone(&inside));
                    std::thread::spawn(move || {
                        let (mut entered, mut refused) = (0u64, 0u64);
                        for _ in 0..200_000 {
                            match cell.try_enter() {
                                Ok(mut guard) => {
                                    assert!(!inside.swap(true, Ordering::SeqCst), "both inside");
                                    *guard += 1;
                                    inside.store(false, Ordering::SeqCst);
                                    entered += 1;
                                }
                                Err(busy) => {
                                    assert_eq!(busy, Busy::InUse);
                                    refused += 1;
                                }
                            }
                        }
                        (entered, refused)
                    })
                })
                .collect();
            let entered: u64 = threads
                .into_iter()
                .map(|t| t.join().expect("no panic").0)
                .sum();
            assert_eq!(*cell.try_enter().expect("free at the end"), entered);
        }
    }
}
