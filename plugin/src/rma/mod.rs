//! One-sided RMA: the entry points of NCCL's `ncclRmaPlugin` tables (NCCL 2.30.7+: the one-sided
//! host APIs, the GIN proxy behind the Device API, zero-SM collectives), over RC queue pairs of
//! Rivet's own. The decisions (window checks, what each operation posts, when a request is done,
//! what a failure does) are `rivet_core::rma`'s; this module owns the objects NCCL holds.
//!
//! - `init`: a Rivet context (the net table's [`net::init_context`]); `finalize` drops it.
//! - `listen`: a p2p listen comm; its 128-byte handle is the RMA handle.
//! - `connect(handles[], nranks, rank, listenComm)`: the group forms as a CollNet group does
//!   ([`crate::collnet::group`]): a connection to and from every other rank. They carry only the
//!   collective calls' control messages ([`control`]). The `ctx` NCCL passes here is its *net*
//!   plugin's context (perhaps another plugin's): it is not used; the listen comm's is.
//! - `createContext(config)`: [`RmaContext`]: `nContexts` × `nranks` lanes
//!   ([`crate::backend::rma_lane`]; the lane to the own rank is connected to itself), connected
//!   through one exchange of queue pair descriptions and a barrier.
//! - `regMrSym`: a registration on the group's port (remote atomics allowed) and one exchange of
//!   (address, length, key): the [`SymWindow`] knows every rank's part.
//! - `iput`, `iputSignal`, `iget`, `iflush`: checked and planned by the core, posted on the lane;
//!   `test`, `rmaProgress`, `queryLastError` poll the context's completion queue.
//!
//! Locking: a context's lanes and request machine sit behind one mutex of the context (NCCL's
//! proxy drives a context from one thread, so it is never contended; it keeps a second thread
//! correct rather than refused). The collective calls serialise on the group's control mutex.
//!
//! Unsafe (opted in): closing, destroying and deregistering remove objects from their handle
//! tables, which [`crate::handle`] makes `unsafe` (no reference may be in use; NCCL's contract
//! gives that: a close is the last call on an object).

#![allow(unsafe_code)]

pub(crate) mod control;

use crate::backend::OpenPort;
use crate::backend::rma_lane::{Lane, LaneShared, MAX_POLL};
use crate::collnet::group;
use crate::collnet::scratch::Scratch;
use crate::comm;
use crate::config::QpSettings;
use crate::devices::DeviceProps;
use crate::error::{ErrorClass, NetError, NetResult};
use crate::handle::{Handle, Ptr, Registry, registry, unknown};
use crate::log::{INIT_NET, info, warn};
use crate::net;
use crate::sys::{NCCL_PTR_HOST, NcclNetDeviceHandle};
use control::{Control, Kind};
use core::ffi::c_int;
use rivet_core::nic::WcStatus;
use rivet_core::rma::{self, Plan, RequestId, Requests, RmaError, Tested, Window, WindowEntry};
use rivet_core::wire::{ENDPOINT_INFO_LEN, EndpointInfo};
use std::sync::{Arc, Mutex, MutexGuard};

/// Context indices per RMA context at most (a control message carries one queue pair description
/// per index).
pub(crate) const MAX_CONTEXTS: u32 = (control::MAX_PAYLOAD / ENDPOINT_INFO_LEN) as u32;
/// Ranks of a group at most (queue pairs: contexts × ranks per rank).
pub(crate) const MAX_RANKS: u32 = 4096;
/// `NCCL_NET_DEVICE_GIN_PROXY`.
const GIN_PROXY: c_int = crate::sys::NCCL_NET_DEVICE_GIN_PROXY;

/// An RMA group (`collComm`).
#[derive(Debug)]
pub(crate) struct Group {
    nranks: u32,
    rank: u32,
    port: Arc<OpenPort>,
    ctx: Ptr,
    control: Mutex<Control>,
}

// SAFETY: `ctx` is an opaque handle; the control channel is behind its mutex.
unsafe impl Send for Group {}
// SAFETY: as above.
unsafe impl Sync for Group {}

/// A symmetric registration (`regMrSym`'s handle).
#[derive(Debug)]
pub(crate) struct SymWindow {
    /// The group it belongs to (handle bits).
    group: Ptr,
    /// The own registration (a registration handle of the comm layer).
    mr: Ptr,
    window: Window,
}

// SAFETY: opaque handles, never dereferenced.
unsafe impl Send for SymWindow {}
// SAFETY: as above.
unsafe impl Sync for SymWindow {}

/// An RMA context (`createContext`'s handle).
#[derive(Debug)]
pub(crate) struct RmaContext {
    group: Ptr,
    rank: u32,
    state: Mutex<Lanes>,
    /// What v13's `createContext` hands out: a GIN proxy device handle.
    dev_handle: Box<NcclNetDeviceHandle>,
}

// SAFETY: `group` is an opaque handle; the lanes are behind the mutex; the device handle is
// plain data NCCL only reads.
unsafe impl Send for RmaContext {}
// SAFETY: as above.
unsafe impl Sync for RmaContext {}

/// A context's lanes and request machine.
#[derive(Debug)]
struct Lanes {
    // Field order is drop order: the queue pairs before the completion queue they use.
    lanes: Vec<Option<Lane>>,
    shared: LaneShared,
    requests: Requests,
    /// Lanes whose failure was seen (their queue pair moved to the error state).
    seen: Vec<bool>,
    /// Peers whose failure was reported with a WARN.
    warned_peers: Vec<bool>,
    /// `requests.failed_lanes()` when the lanes were last looked at.
    failed_seen: u32,
    max_inline: u32,
    /// By request slot: the call that issued the request (for the WARN naming the operation that
    /// failed first).
    ops: Vec<&'static str>,
    /// By peer: the operation whose failure was seen first.
    first_failed: Vec<Option<&'static str>>,
}

static GROUPS: Registry<Group> = registry!(0x5a11_c033, "live RMA groups");
static WINDOWS: Registry<SymWindow> = registry!(0x5a11_3e3e, "live RMA windows");
static CONTEXTS: Registry<RmaContext> = registry!(0x5a11_c7c7, "live RMA contexts");

// ---- lifecycle ----

/// `init(&ctx, commId, logger)`: a context of the net layer (devices opened on first use).
pub(crate) fn init(comm_id: u64) -> NetResult<Ptr> {
    net::init_context(comm_id, None)
}

/// `finalize(ctx)`.
pub(crate) fn finalize(ctx: Ptr) -> NetResult<()> {
    net::finalize(ctx)
}

/// `getProperties`: the net table's, as a GIN proxy device (NCCL keeps an RMA table only when
/// its device reports that type).
pub(crate) fn properties(dev: c_int) -> NetResult<(DeviceProps, c_int)> {
    Ok((net::properties(dev)?, GIN_PROXY))
}

// ---- group ----

/// `closeListen`: a listen comm is a CollNet group's (a p2p listen comm whose 128-byte handle is
/// the group's; `listen` goes straight to CollNet's).
pub(crate) use crate::collnet::close_listen;

/// `connect(ctx, handles, nranks, rank, listenComm, &collComm)`: blocks until the group formed
/// or failed (bounded by the handshake deadline). NCCL's `ctx` here is not used (see the module
/// text).
pub(crate) fn connect(handles: Vec<[u8; 128]>, rank: c_int, listen: Ptr) -> NetResult<Ptr> {
    let nranks = handles.len();
    let rank = u32::try_from(rank)
        .ok()
        .filter(|&r| (r as usize) < nranks)
        .ok_or_else(|| {
            NetError::invalid_argument(format!("RMA connect: rank {rank} of {nranks}"))
        })?;
    if nranks == 0 || nranks > MAX_RANKS as usize {
        return Err(NetError::invalid_usage(format!(
            "RMA connect: a group of {nranks} rank(s); Rivet forms groups of 1..={MAX_RANKS}"
        )));
    }
    let nranks = nranks as u32;
    let (p2p, dev, ctx) = crate::collnet::listen_parts("RMA connect", listen)?;
    let port = net::open_port(dev)?;
    let hello_at = control::area(nranks);
    let (scratch, mh) = Scratch::registered(&port, hello_at + group::hello_area(nranks))?;
    let (sends, recvs) = if nranks == 1 {
        (vec![core::ptr::null_mut()], vec![core::ptr::null_mut()])
    } else {
        match group::establish(ctx, dev, p2p, handles, rank, &scratch, hello_at, mh) {
            Ok(c) => (c.sends, c.recvs),
            Err(e) => {
                let _ = comm::dereg_mr_on_port(&port, mh);
                return Err(e);
            }
        }
    };
    info!(
        INIT_NET,
        "RMA: rank {rank} of {nranks} connected on {} port {}", port.info.name, port.info.port
    );
    let control = Control::new(nranks, rank, sends, recvs, scratch, mh);
    GROUPS
        .insert(Box::new(Group {
            nranks,
            rank,
            port,
            ctx,
            control: Mutex::new(control),
        }))
        .map(Handle::to_ptr)
        .map_err(|full| NetError::system(format!("RMA connect: {full}")))
}

fn group(call: &str, coll: Ptr) -> NetResult<&'static Group> {
    GROUPS.lookup(call, "collComm", coll).map(|(_, g)| g)
}

fn control(g: &Group) -> MutexGuard<'_, Control> {
    g.control.lock().unwrap_or_else(|e| e.into_inner())
}

/// `closeColl`: close the group's connections.
pub(crate) fn close_coll(coll: Ptr) -> NetResult<()> {
    let (handle, _) = GROUPS.lookup("RMA closeColl", "collComm", coll)?;
    // SAFETY: a close is NCCL's last call on the group, after every other call returned.
    let g = unsafe { GROUPS.remove(handle) }
        .ok_or_else(|| unknown("RMA closeColl", "collComm", coll))?;
    let c = g.control.into_inner().unwrap_or_else(|e| e.into_inner());
    for &p in c.sends.iter().filter(|p| !p.is_null()) {
        let _ = comm::close_send(p);
    }
    for &p in c.recvs.iter().filter(|p| !p.is_null()) {
        let _ = comm::close_recv(p);
    }
    comm::dereg_mr_on_port(&g.port, c.mh)
}

/// v16's `getRmaProperties`: puts are not flushed by a signal from another peer (each peer's
/// operations travel on their own queue pair).
pub(crate) fn flushes_all_puts_on_any_signal(coll: Ptr) -> NetResult<bool> {
    group("getRmaProperties", coll).map(|_| false)
}

// ---- windows ----

/// `regMrSym`/`regMrSymDmaBuf`: register the own part and learn every rank's (collective).
pub(crate) fn reg_mr_sym(
    coll: Ptr,
    data: Ptr,
    size: usize,
    kind: c_int,
    dmabuf: Option<(u64, c_int)>,
    strong_order: bool,
) -> NetResult<Ptr> {
    let g = group("regMrSym", coll)?;
    let mr = comm::reg_mr_on_port(g.port.clone(), data, size, kind, dmabuf, strong_order)?;
    let (lkey, rkey) = comm::keys_of("regMrSym", mr)?;
    let mut mine = Vec::with_capacity(20);
    mine.extend_from_slice(&(data as u64).to_le_bytes());
    mine.extend_from_slice(&(size as u64).to_le_bytes());
    mine.extend_from_slice(&rkey.to_le_bytes());
    let all = control(g).exchange("regMrSym", Kind::Window, &|_| mine.clone());
    let entries = all.and_then(|all| {
        all.iter()
            .enumerate()
            .map(|(q, m)| decode_entry(m).ok_or_else(|| bad_message("regMrSym", q)))
            .collect::<NetResult<Vec<WindowEntry>>>()
    });
    let entries = match entries {
        Ok(e) => e,
        Err(e) => {
            let _ = comm::dereg_mr_on_port(&g.port, mr);
            return Err(e);
        }
    };
    let window = Window {
        entries,
        rank: g.rank,
        lkey,
        host: kind == NCCL_PTR_HOST && dmabuf.is_none(),
    };
    WINDOWS
        .insert(Box::new(SymWindow {
            group: coll,
            mr,
            window,
        }))
        .map(Handle::to_ptr)
        .map_err(|full| {
            let _ = comm::dereg_mr_on_port(&g.port, mr);
            NetError::system(format!("regMrSym: {full}"))
        })
}

fn decode_entry(m: &[u8]) -> Option<WindowEntry> {
    let base = u64::from_le_bytes(m.get(0..8)?.try_into().ok()?);
    let len = u64::from_le_bytes(m.get(8..16)?.try_into().ok()?);
    let rkey = u32::from_le_bytes(m.get(16..20)?.try_into().ok()?);
    base.checked_add(len)?;
    Some(WindowEntry { base, len, rkey })
}

fn bad_message(call: &str, q: usize) -> NetError {
    NetError::remote(format!("{call}: rank {q} sent a malformed control message"))
}

/// `deregMrSym`.
pub(crate) fn dereg_mr_sym(coll: Ptr, mh: Ptr) -> NetResult<()> {
    let g = group("deregMrSym", coll)?;
    let (handle, w) = WINDOWS.lookup("deregMrSym", "mhandle", mh)?;
    if w.group != coll {
        return Err(unknown("deregMrSym", "mhandle", mh));
    }
    // SAFETY: NCCL deregisters a window after the operations using it completed, and never
    // concurrently with a call using it.
    let w =
        unsafe { WINDOWS.remove(handle) }.ok_or_else(|| unknown("deregMrSym", "mhandle", mh))?;
    comm::dereg_mr_on_port(&g.port, w.mr)
}

// ---- contexts ----

/// What `createContext`'s config says.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ContextConfig {
    pub(crate) contexts: c_int,
    /// Traffic class, if set (NCCL passes `INT_MIN` or -1 for unset).
    pub(crate) traffic_class: c_int,
    pub(crate) rank_stride: c_int,
}

/// `createContext(collComm, config, &rmaCtx)` (collective): the lanes, connected.
pub(crate) fn create_context(coll: Ptr, config: ContextConfig) -> NetResult<Ptr> {
    let g = group("createContext", coll)?;
    let contexts = u32::try_from(config.contexts)
        .ok()
        .filter(|c| (1..=MAX_CONTEXTS).contains(c))
        .ok_or_else(|| {
            NetError::invalid_argument(format!(
                "createContext: nContexts {} (Rivet: 1..={MAX_CONTEXTS})",
                config.contexts
            ))
        })?;
    let stride = u32::try_from(config.rank_stride)
        .ok()
        .filter(|&s| s >= 1)
        .ok_or_else(|| {
            NetError::invalid_argument(format!("createContext: rankStride {}", config.rank_stride))
        })?;
    let tc = (0..=255)
        .contains(&config.traffic_class)
        .then_some(config.traffic_class)
        .or_else(|| {
            net::context(g.ctx)
                .ok()
                .flatten()
                .and_then(|c| c.traffic_class)
        });
    let settings = net::config()?.qp_settings(tc);
    let n = g.nranks;
    let lanes_total = contexts * n;
    let depth = (lanes_total * 2 * rma::MAX_REQUESTS_PER_LANE).clamp(1024, 32767);
    let shared = LaneShared::new(&g.port, depth).map_err(|e| verbs_error("createContext", &e))?;
    // The request machine also says which lanes the stride connects.
    let requests = Requests::new(contexts, n, g.rank, stride, shared.depth());
    let mut lanes: Vec<Option<Lane>> = Vec::with_capacity(lanes_total as usize);
    for l in 0..lanes_total {
        let peer = l % n;
        lanes.push(if requests.is_connected(peer) {
            Some(Lane::new(&g.port, &shared).map_err(|e| verbs_error("createContext", &e))?)
        } else {
            None
        });
    }
    let info = |l: u32| -> Option<EndpointInfo> {
        lanes[l as usize]
            .as_ref()
            .map(|lane| lane.local_info(&g.port, &shared, &settings))
    };
    // To each peer: the descriptions of the lanes towards it, one per context index.
    let outgoing = |q: u32| -> Vec<u8> {
        let mut m = Vec::new();
        for c in 0..contexts {
            if let Some(i) = info(c * n + q) {
                i.encode_into(&mut m);
            }
        }
        m
    };
    let mut ctl = control(g);
    let all = ctl.exchange("createContext", Kind::Lanes, &outgoing)?;
    for (q, m) in all.iter().enumerate() {
        let q = q as u32;
        if !requests.is_connected(q) {
            continue;
        }
        if m.len() != contexts as usize * ENDPOINT_INFO_LEN {
            return Err(bad_message("createContext", q as usize));
        }
        for c in 0..contexts {
            let at = c as usize * ENDPOINT_INFO_LEN;
            let remote = EndpointInfo::decode(&m[at..at + ENDPOINT_INFO_LEN])
                .map_err(|e| NetError::remote(format!("createContext: rank {q}: {e}")))?;
            if let Some(lane) = &lanes[(c * n + q) as usize] {
                connect_lane(lane, &g.port, &remote, &settings, q)?;
            }
        }
    }
    // Every lane of every rank is connected before any rank posts.
    ctl.exchange("createContext", Kind::Ready, &|_| Vec::new())?;
    drop(ctl);
    let max_inline = lanes
        .iter()
        .flatten()
        .map(Lane::max_inline)
        .min()
        .unwrap_or(0);
    info!(
        INIT_NET,
        "RMA: context of {contexts} x {n} lane(s) ready on {} port {} (rank {}, stride {stride}, \
         {max_inline} B inline)",
        g.port.info.name,
        g.port.info.port,
        g.rank
    );
    let ctx = RmaContext {
        group: coll,
        rank: g.rank,
        state: Mutex::new(Lanes {
            seen: vec![false; lanes.len()],
            warned_peers: vec![false; n as usize],
            failed_seen: 0,
            ops: Vec::new(),
            first_failed: vec![None; n as usize],
            lanes,
            shared,
            requests,
            max_inline,
        }),
        dev_handle: Box::new(NcclNetDeviceHandle {
            net_device_type: GIN_PROXY,
            net_device_version: 0,
            handle: core::ptr::null_mut(),
            size: 0,
            needs_proxy_progress: 1,
        }),
    };
    CONTEXTS
        .insert(Box::new(ctx))
        .map(Handle::to_ptr)
        .map_err(|full| NetError::system(format!("createContext: {full}")))
}

fn connect_lane(
    lane: &Lane,
    port: &OpenPort,
    remote: &EndpointInfo,
    settings: &QpSettings,
    peer: u32,
) -> NetResult<()> {
    lane.connect(port, remote, settings).map_err(|e| {
        NetError::system(format!(
            "createContext: connecting queue pair {} to rank {peer}: {e}",
            lane.qp_num()
        ))
    })
}

fn verbs_error(call: &str, e: &rivet_verbs_ffi::VerbsError) -> NetError {
    NetError::system(format!("{call}: {e}"))
}

/// v13's device handle of a context.
pub(crate) fn device_handle(rma_ctx: Ptr) -> NetResult<*mut NcclNetDeviceHandle> {
    let (_, c) = CONTEXTS.lookup("createContext", "rmaCtx", rma_ctx)?;
    Ok(core::ptr::from_ref::<NcclNetDeviceHandle>(&c.dev_handle).cast_mut())
}

/// `destroyContext`: the lanes go (outstanding operations are abandoned).
pub(crate) fn destroy_context(rma_ctx: Ptr) -> NetResult<()> {
    let (handle, _) = CONTEXTS.lookup("destroyContext", "rmaCtx", rma_ctx)?;
    // SAFETY: NCCL destroys a context after its last operation call returned.
    let c = unsafe { CONTEXTS.remove(handle) }
        .ok_or_else(|| unknown("destroyContext", "rmaCtx", rma_ctx))?;
    let state = c.state.into_inner().unwrap_or_else(|e| e.into_inner());
    let abandoned = state.requests.outstanding();
    if abandoned > 0 {
        info!(
            INIT_NET,
            "RMA destroyContext: {abandoned} request(s) not tested to completion are abandoned"
        );
    }
    Ok(())
}

// ---- operations ----

/// An operation as NCCL names it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Op {
    /// `iput(srcOff, srcMh, size, dstOff, dstMh)`.
    Put {
        src_off: u64,
        src: Ptr,
        size: u64,
        dst_off: u64,
        dst: Ptr,
    },
    /// `iputSignal(…, signalOff, signalMh, value, op)`.
    PutSignal {
        src_off: u64,
        src: Ptr,
        size: u64,
        dst_off: u64,
        dst: Ptr,
        signal_off: u64,
        signal: Ptr,
        value: u64,
        op: u32,
    },
    /// `iget(remoteOff, remoteMh, size, localOff, localMh)`.
    Get {
        remote_off: u64,
        remote: Ptr,
        size: u64,
        local_off: u64,
        local: Ptr,
    },
    /// `iflush(mhandle)`.
    Flush { window: Ptr },
}

impl Op {
    fn call(&self) -> &'static str {
        match self {
            Self::Put { .. } => "iput",
            Self::PutSignal { .. } => "iputSignal",
            Self::Get { .. } => "iget",
            Self::Flush { .. } => "RMA iflush",
        }
    }
}

#[inline(always)]
fn window(call: &str, what: &str, mh: Ptr, group: Ptr) -> NetResult<&'static Window> {
    let (_, w) = WINDOWS.lookup(call, what, mh)?;
    if w.group != group {
        return Err(other_group(call, what, mh));
    }
    Ok(&w.window)
}

#[cold]
#[inline(never)]
fn other_group(call: &str, what: &str, mh: Ptr) -> NetError {
    NetError::invalid_argument(format!(
        "{call}: {what} {mh:p} belongs to another RMA group"
    ))
}

/// Issue `op` towards `rank` on context index `context`; the request handle.
pub(crate) fn issue(rma_ctx: Ptr, context: c_int, rank: u32, op: Op) -> NetResult<Ptr> {
    let call = op.call();
    let (handle, c) = CONTEXTS.lookup(call, "rmaCtx", rma_ctx)?;
    let mut guard = c.state.lock().unwrap_or_else(|e| e.into_inner());
    let st = &mut *guard;
    // A flush reads the own memory over the lane to the own rank, whatever rank NCCL named
    // (that rank is still checked).
    let lane = st
        .requests
        .lane(context, rank)
        .map_err(|e| rma_error(call, e))?;
    let lane = match op {
        Op::Flush { .. } => st
            .requests
            .lane(context, c.rank)
            .map_err(|e| rma_error(call, e))?,
        _ => lane,
    };
    let plan = plan(c, &op, rank, st.max_inline).map_err(|e| match e {
        Planned::Rma(e) => rma_error(call, e),
        Planned::Net(e) => e,
    })?;
    let id = st
        .requests
        .begin(lane, plan.work_requests())
        .map_err(|e| rma_error(call, e))?;
    let slot = slot_of(id.wr_id());
    if st.ops.len() <= slot {
        st.ops.resize(slot + 1, "");
    }
    st.ops[slot] = call;
    if plan != Plan::Nothing {
        let posted = match &st.lanes[lane as usize] {
            Some(l) => l.post(&st.shared, id, &plan),
            None => Err(libc::ENOTCONN),
        };
        if let Err(errno) = posted {
            let e = st.requests.abandon(id, errno);
            return Err(rma_error(call, e));
        }
    }
    Ok(handle.request_ptr(id.to_bits()))
}

enum Planned {
    Rma(RmaError),
    Net(NetError),
}

fn plan(c: &RmaContext, op: &Op, rank: u32, max_inline: u32) -> Result<Plan, Planned> {
    let call = op.call();
    let win = |what, mh| window(call, what, mh, c.group).map_err(Planned::Net);
    let r = match *op {
        Op::Put {
            src_off,
            src,
            size,
            dst_off,
            dst,
        } => rma::plan_put(
            win("srcMhandle", src)?,
            src_off,
            size,
            win("dstMhandle", dst)?,
            dst_off,
            rank,
            max_inline,
        ),
        Op::PutSignal {
            src_off,
            src,
            size,
            dst_off,
            dst,
            signal_off,
            signal,
            value,
            op,
        } => {
            let put = if size == 0 && (src.is_null() || dst.is_null()) {
                None
            } else {
                Some((
                    win("srcMhandle", src)?,
                    src_off,
                    win("dstMhandle", dst)?,
                    dst_off,
                ))
            };
            rma::plan_put_signal(
                put,
                size,
                rank,
                win("signalMhandle", signal)?,
                signal_off,
                op,
                value,
                max_inline,
            )
        }
        Op::Get {
            remote_off,
            remote,
            size,
            local_off,
            local,
        } => rma::plan_get(
            win("remoteMhandle", remote)?,
            remote_off,
            size,
            win("localMhandle", local)?,
            local_off,
            rank,
        ),
        Op::Flush { window } => rma::plan_flush(win("mhandle", window)?),
    };
    r.map_err(Planned::Rma)
}

/// Take every completion of the context's queue into the request machine.
fn poll(st: &mut Lanes, call: &str) -> NetResult<()> {
    let mut out = [(0u64, WcStatus::SUCCESS); MAX_POLL];
    loop {
        let n = st.shared.poll(&mut out).map_err(|errno| {
            NetError::system(format!(
                "{call}: polling the completion queue failed (errno {errno})"
            ))
        })?;
        for &(wr_id, status) in &out[..n] {
            if !status.is_success() {
                note_failed_op(st, wr_id);
            }
            st.requests.handle_completion(wr_id, status);
        }
        if n < MAX_POLL {
            return Ok(());
        }
    }
}

/// The slot of the request a `wr_id` names (its piece mark and generation dropped).
fn slot_of(wr_id: u64) -> usize {
    (wr_id & !rma::PIECE_MARK) as usize & (rma::MAX_SLOTS - 1)
}

/// Remember which operation failed first towards its peer.
#[cold]
#[inline(never)]
fn note_failed_op(st: &mut Lanes, wr_id: u64) {
    let Some(id) = u32::try_from(wr_id & !rma::PIECE_MARK)
        .ok()
        .and_then(RequestId::from_bits)
    else {
        return;
    };
    let (Some(&op), Some(peer)) = (st.ops.get(slot_of(wr_id)), st.requests.peer_of_request(id))
    else {
        return;
    };
    if let Some(first) = st.first_failed.get_mut(peer as usize)
        && first.is_none()
    {
        *first = Some(op);
    }
}

/// Move every newly failed lane's queue pair to the error state (what is still outstanding on it
/// completes flushed now), with one WARN per peer, naming it and the call that saw it.
fn warn_failures(st: &mut Lanes, call: &str) {
    let failed = st.requests.failed_lanes();
    if failed == st.failed_seen {
        return;
    }
    st.failed_seen = failed;
    let n = st.warned_peers.len().max(1);
    for lane in 0..st.seen.len() {
        if st.seen[lane] {
            continue;
        }
        let Some(e) = st.requests.lane_failure(lane as u32) else {
            continue;
        };
        st.seen[lane] = true;
        if let Some(l) = &st.lanes[lane] {
            l.fail();
        }
        let peer = lane % n;
        if !st.warned_peers[peer] {
            st.warned_peers[peer] = true;
            let op = st.first_failed[peer].unwrap_or("an operation");
            let why = match e {
                RmaError::PeerFailed {
                    context, status, ..
                } => format!("queue pair of context {context}: {status}"),
                other => other.to_string(),
            };
            warn!(
                "RMA: {op} to rank {peer} failed ({why}; seen by {call}); its requests fail, \
                 later ones to that rank are refused, other ranks keep working"
            );
        }
    }
}

/// `test(collComm, request, &done)`.
pub(crate) fn test(coll: Ptr, request: Ptr) -> NetResult<bool> {
    let (c, bits) = CONTEXTS.lookup_request("RMA test", "request", request)?;
    if c.group != coll {
        return Err(NetError::misuse(format!(
            "RMA test: request {request:p} belongs to another group than collComm {coll:p}"
        )));
    }
    let id = RequestId::from_bits(bits).ok_or_else(|| unknown("RMA test", "request", request))?;
    let mut guard = c.state.lock().unwrap_or_else(|e| e.into_inner());
    let st = &mut *guard;
    poll(st, "test")?;
    warn_failures(st, "test");
    match st.requests.test(id) {
        Ok(Tested::Done) => Ok(true),
        Ok(Tested::Pending) => Ok(false),
        Err(e) => Err(rma_error("RMA test", e)),
    }
}

/// `rmaProgress(rmaCtx)`.
pub(crate) fn progress(rma_ctx: Ptr) -> NetResult<()> {
    let (_, c) = CONTEXTS.lookup("rmaProgress", "rmaCtx", rma_ctx)?;
    let mut guard = c.state.lock().unwrap_or_else(|e| e.into_inner());
    poll(&mut guard, "rmaProgress")?;
    warn_failures(&mut guard, "rmaProgress");
    Ok(())
}

/// `queryLastError(rmaCtx, &hasError)`.
pub(crate) fn query_last_error(rma_ctx: Ptr) -> NetResult<bool> {
    let (_, c) = CONTEXTS.lookup("queryLastError", "rmaCtx", rma_ctx)?;
    let mut guard = c.state.lock().unwrap_or_else(|e| e.into_inner());
    poll(&mut guard, "queryLastError")?;
    warn_failures(&mut guard, "queryLastError");
    Ok(guard.requests.has_error())
}

#[cold]
#[inline(never)]
fn rma_error(call: &str, e: RmaError) -> NetError {
    let class = match e {
        RmaError::OutOfWindow { .. }
        | RmaError::MisalignedSignal { .. }
        | RmaError::BadSignalOp(_)
        | RmaError::BadContext { .. }
        | RmaError::BadRank { .. }
        | RmaError::NotConnected { .. } => ErrorClass::InvalidArgument,
        RmaError::PeerFailed { .. } => ErrorClass::Remote,
        RmaError::LaneFull { .. } | RmaError::QueueFull { .. } => ErrorClass::InvalidUsage,
        RmaError::UnknownRequest => ErrorClass::Internal,
        RmaError::Post { .. } => ErrorClass::System,
    };
    let err = NetError::new(class, format!("{call}: {e}"));
    // A failed lane had its one WARN when the failure was seen (`warn_failures`); the requests
    // and calls it fails afterwards say nothing more.
    if matches!(e, RmaError::PeerFailed { .. }) {
        err.logged()
    } else {
        err
    }
}
