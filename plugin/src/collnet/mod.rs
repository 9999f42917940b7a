//! CollNet in software: the `ncclCollNet` entry points, served over Rivet's own p2p
//! connections with the reductions on the host CPU (no SHARP hardware or library).
//!
//! - `listen`: a p2p listen comm on the device; its 128-byte handle is the CollNet handle.
//! - `connect`: the group forms ([`group`]): a connection to and from every other member.
//! - `iallreduce`, `iallgather`, `ireducescatter`: queued on the group and run by its
//!   [`engine`] (the schedules of `rivet_core::collnet::schedule`), moved forward by `test`.
//! - `regMr`: one registration on the group's port serves every connection of the group.
//!
//! Bottom to top: [`scratch`] (the group's registered scratch memory) → [`engine`] (the data
//! path) → [`group`] (forming a group) → this file (entry points and handle tables).
//!
//! Unsafe (opted in): closing a listen comm or a group removes it from its handle table, which
//! [`crate::handle`] makes `unsafe` (no reference may be in use; NCCL's contract gives that).

#![allow(unsafe_code)]

mod engine;
pub(crate) mod group;
pub(crate) mod scratch;

use crate::comm;
use crate::devices::DeviceProps;
use crate::error::{NetError, NetResult};
use crate::handle::{Handle, Ptr, Registry, registry, unknown};
use crate::log::{INIT_NET, info};
use crate::net;
use crate::sys::NCCL_PTR_HOST;
use core::ffi::c_int;
use engine::{CollComm, Links, OpSpec, Part, Parts};
use rivet_core::collnet::layout::{MAX_RANKS, Regions};
use rivet_core::collnet::reduce::{DataType, RedOp, Reduction};
use scratch::Scratch;

pub(crate) use engine::MAX_PARTS;

/// A CollNet listen comm: the p2p listen comm members connect to, and where it lives.
#[derive(Debug)]
struct CollListen {
    p2p: Ptr,
    dev: c_int,
    ctx: Ptr,
}

// SAFETY: the pointers are opaque handles of other tables, never dereferenced.
unsafe impl Send for CollListen {}
// SAFETY: as above.
unsafe impl Sync for CollListen {}

static LISTENS: Registry<CollListen> = registry!(0xc011_157e, "live CollNet listen comms");
static GROUPS: Registry<CollComm> = registry!(0xc011_c033, "live CollNet groups");

/// `listen(ctx, dev, handle, &listenComm)`.
pub(crate) fn listen(ctx: Ptr, dev: c_int, handle: &mut [u8; 128]) -> NetResult<Ptr> {
    let p2p = comm::listen(net::context(ctx)?, dev, handle)?;
    LISTENS
        .insert(Box::new(CollListen { p2p, dev, ctx }))
        .map(Handle::to_ptr)
        .map_err(|full| {
            let _ = comm::close_listen(p2p);
            NetError::system(format!("listen: {full}"))
        })
}

/// The p2p listen comm, device and context behind a listen comm (for the RMA groups, which
/// listen the same way).
pub(crate) fn listen_parts(call: &str, listen: Ptr) -> NetResult<(Ptr, c_int, Ptr)> {
    let (_, l) = LISTENS.lookup(call, "listenComm", listen)?;
    Ok((l.p2p, l.dev, l.ctx))
}

/// `closeListen`.
pub(crate) fn close_listen(listen: Ptr) -> NetResult<()> {
    let (handle, _) = LISTENS.lookup("closeListen", "listenComm", listen)?;
    // SAFETY: NCCL closes a listen comm after its last `connect` returned; no reference is kept.
    let listen_comm = unsafe { LISTENS.remove(handle) }
        .ok_or_else(|| unknown("closeListen", "listenComm", listen))?;
    comm::close_listen(listen_comm.p2p)
}

/// `connect(handles, nranks, rank, listenComm, &collComm)`: blocks until the group formed or
/// failed (bounded by the handshake deadline).
pub(crate) fn connect(handles: Vec<[u8; 128]>, rank: c_int, listen: Ptr) -> NetResult<Ptr> {
    let nranks = handles.len();
    let rank = u32::try_from(rank)
        .ok()
        .filter(|&r| (r as usize) < nranks)
        .ok_or_else(|| {
            NetError::invalid_argument(format!("CollNet connect: rank {rank} of {nranks}"))
        })?;
    if !(2..=MAX_RANKS as usize).contains(&nranks) {
        return Err(NetError::invalid_usage(format!(
            "CollNet connect: a group of {nranks} rank(s); Rivet forms groups of 2..={MAX_RANKS}"
        )));
    }
    let nranks = nranks as u32;
    let (_, listen_comm) = LISTENS.lookup("connect", "listenComm", listen)?;
    let port = net::open_port(listen_comm.dev)?;
    let slots = engine::slot_area(nranks);
    let hello_at = 2 * slots;
    let (scratch, mh) = Scratch::registered(&port, hello_at + group::hello_area(nranks))?;
    let connections = match group::establish(
        listen_comm.ctx,
        listen_comm.dev,
        listen_comm.p2p,
        handles,
        rank,
        &scratch,
        hello_at,
        mh,
    ) {
        Ok(c) => c,
        Err(e) => {
            let _ = comm::dereg_mr_on_port(&port, mh);
            return Err(e);
        }
    };
    let links = Links {
        sends: connections.sends,
        recvs: connections.recvs,
    };
    let group = CollComm::new(nranks, rank, port, links, scratch, mh)?;
    info!(
        INIT_NET,
        "CollNet: rank {rank} of {nranks} ready ({} KiB messages, {} in flight per connection)",
        engine::chunk_for(nranks) >> 10,
        engine::DEPTH
    );
    GROUPS
        .insert(Box::new(group))
        .map(Handle::to_ptr)
        .map_err(|full| NetError::system(format!("connect: {full}")))
}

fn lookup(call: &str, coll: Ptr) -> NetResult<(Handle, &'static CollComm)> {
    GROUPS.lookup(call, "collComm", coll)
}

/// `closeColl`: close every connection of the group and free its memory.
pub(crate) fn close_coll(coll: Ptr) -> NetResult<()> {
    let (handle, _) = lookup("closeColl", coll)?;
    // SAFETY: a close is NCCL's last call on the group, after every other call returned.
    let group =
        unsafe { GROUPS.remove(handle) }.ok_or_else(|| unknown("closeColl", "collComm", coll))?;
    let abandoned = group.in_flight();
    if abandoned > 0 {
        info!(
            INIT_NET,
            "CollNet closeColl: {abandoned} transfer(s) still in flight are abandoned"
        );
    }
    for &c in group.links.sends.iter().filter(|c| !c.is_null()) {
        let _ = comm::close_send(c);
    }
    for &c in group.links.recvs.iter().filter(|c| !c.is_null()) {
        let _ = comm::close_recv(c);
    }
    // After the connections: no transfer can touch the scratch memory any more.
    comm::dereg_mr_on_port(&group.port, group.scratch_mh)
}

/// `getProperties` of the CollNet tables: the net table's, with host memory only. The
/// reductions run on the host CPU, which cannot read GPU memory; NCCL's CollNet transport stages
/// through host buffers when the device does not offer `NCCL_PTR_CUDA`/`NCCL_PTR_DMABUF`.
pub(crate) fn properties(dev: c_int) -> NetResult<DeviceProps> {
    let mut props = net::properties(dev)?;
    props.ptr_support = NCCL_PTR_HOST;
    Ok(props)
}

/// `regMr`/`regMrDmaBuf` on the group's port: host memory only (see [`properties`]).
pub(crate) fn reg_mr(
    coll: Ptr,
    data: Ptr,
    size: usize,
    kind: c_int,
    dmabuf: Option<(u64, c_int)>,
) -> NetResult<Ptr> {
    let (_, group) = lookup("regMr", coll)?;
    if kind != NCCL_PTR_HOST || dmabuf.is_some() {
        return Err(NetError::invalid_usage(format!(
            "CollNet regMr: memory of type {kind}{}: Rivet's CollNet reduces on the host CPU and \
             registers host memory only (its getProperties offers NCCL_PTR_HOST alone)",
            if dmabuf.is_some() { " (dma-buf)" } else { "" }
        )));
    }
    comm::reg_mr_on_port(group.port.clone(), data, size, kind, dmabuf, false)
}

/// `deregMr`.
pub(crate) fn dereg_mr(coll: Ptr, mh: Ptr) -> NetResult<()> {
    let (_, group) = lookup("deregMr", coll)?;
    comm::dereg_mr_on_port(&group.port, mh)
}

/// Whether `dtype` × `op` (NCCL's values) is implemented; `fp8` says whether the caller's NCCL
/// has the fp8 types (2.24+, ABI v9).
pub(crate) fn reduce_support(dtype: c_int, op: c_int, fp8: bool) -> bool {
    match (DataType::from_nccl(dtype), RedOp::from_nccl(op)) {
        (Some(d), Some(o)) => (fp8 || !d.is_fp8()) && rivet_core::collnet::reduce::supported(d, o),
        _ => false,
    }
}

fn reduction(call: &str, dtype: c_int, op: c_int) -> NetResult<Reduction> {
    let d = DataType::from_nccl(dtype)
        .ok_or_else(|| NetError::invalid_argument(format!("{call}: unknown data type {dtype}")))?;
    let o = RedOp::from_nccl(op).ok_or_else(|| {
        NetError::invalid_argument(format!(
            "{call}: reduction operation {op} is not built in (reduceSupport answers 0 for it)"
        ))
    })?;
    Ok(Reduction::new(d, o))
}

fn registered(call: &str, what: &str, addr: Ptr, len: u64, mh: Ptr) -> NetResult<Part> {
    if len > 0 {
        if addr.is_null() {
            return Err(NetError::invalid_argument(format!(
                "{call}: {what} is NULL"
            )));
        }
        comm::check_registered(call, mh, addr as u64, len)
            .map_err(|e| NetError::new(e.class(), format!("{call}: {what}: {e}")))?;
    }
    Ok(Part {
        addr: addr as u64,
        len,
        mh,
    })
}

fn request(handle: Handle, id: Option<u32>) -> Option<Ptr> {
    id.map(|id| handle.request_ptr(id))
}

/// `iallreduce`.
#[allow(clippy::too_many_arguments)] // the C signature
pub(crate) fn iallreduce(
    coll: Ptr,
    send: Ptr,
    recv: Ptr,
    count: usize,
    dtype: c_int,
    op: c_int,
    send_mh: Ptr,
    recv_mh: Ptr,
) -> NetResult<Option<Ptr>> {
    let call = "iallreduce";
    let (handle, group) = lookup(call, coll)?;
    let r = reduction(call, dtype, op)?;
    let bytes = (count as u64)
        .checked_mul(r.dtype.size() as u64)
        .ok_or_else(|| NetError::invalid_argument(format!("{call}: count {count} overflows")))?;
    let input = registered(call, "sendData", send, bytes, send_mh)?;
    let output = registered(call, "recvData", recv, bytes, recv_mh)?;
    if input.addr != output.addr
        && bytes > 0
        && input.addr < output.addr + bytes
        && output.addr < input.addr + bytes
    {
        return Err(NetError::invalid_argument(format!(
            "{call}: sendData and recvData overlap without being the same buffer"
        )));
    }
    let spec = OpSpec::allreduce(
        group.nranks,
        count as u64,
        r,
        Parts::one(input.addr, bytes, input.mh),
        Parts::one(output.addr, bytes, output.mh),
    );
    Ok(request(handle, group.post(spec)?))
}

/// A scatter-gather list NCCL passed: `(mhandle, address, size)` per part.
pub(crate) type SgeList<'a> = &'a [(Ptr, Ptr, u64)];

fn parts(call: &str, what: &str, list: SgeList<'_>, window_bytes: u64) -> NetResult<Parts> {
    let mut parts = Parts::empty();
    for &(mh, addr, size) in list {
        let part = registered(call, what, addr, size, mh)?;
        if !parts.push(part) {
            return Err(NetError::invalid_argument(format!(
                "{call}: more than {MAX_PARTS} {what}"
            )));
        }
    }
    if parts.total() != window_bytes {
        return Err(NetError::invalid_argument(format!(
            "{call}: the {what} hold {} bytes, the window {window_bytes}",
            parts.total()
        )));
    }
    Ok(parts)
}

fn window(
    call: &str,
    nranks: u32,
    bytes_per_rank: usize,
    window_offset: usize,
    window_bytes: usize,
    elem: usize,
) -> NetResult<Regions> {
    let total = (bytes_per_rank as u64).checked_mul(u64::from(nranks));
    let end = (window_offset as u64).checked_add(window_bytes as u64);
    match (total, end) {
        (Some(total), Some(end)) if end <= total => {}
        _ => {
            return Err(NetError::invalid_argument(format!(
                "{call}: window {window_offset}+{window_bytes} outside {nranks} x {bytes_per_rank} bytes"
            )));
        }
    }
    if bytes_per_rank % elem != 0 || window_offset % elem != 0 || window_bytes % elem != 0 {
        return Err(NetError::invalid_argument(format!(
            "{call}: bytesPerRank {bytes_per_rank}, windowOffset {window_offset} and windowBytes \
             {window_bytes} must be multiples of the {elem}-byte element"
        )));
    }
    Ok(Regions::PerRank {
        bytes_per_rank: bytes_per_rank as u64,
        window_offset: window_offset as u64,
        window_bytes: window_bytes as u64,
    })
}

/// `iallgather`: `send` holds this rank's bytes of the window (from the window's start or the
/// own part's start, whichever is later); the window lands in `recv_parts`.
#[allow(clippy::too_many_arguments)] // the C signature
pub(crate) fn iallgather(
    coll: Ptr,
    send: Ptr,
    recv_parts: SgeList<'_>,
    bytes_per_rank: usize,
    window_offset: usize,
    window_bytes: usize,
    send_mh: Ptr,
) -> NetResult<Option<Ptr>> {
    let call = "iallgather";
    let (handle, group) = lookup(call, coll)?;
    let regions = window(
        call,
        group.nranks,
        bytes_per_rank,
        window_offset,
        window_bytes,
        1,
    )?;
    let own = regions.region(group.nranks, group.rank).len;
    let input = registered(call, "sendData", send, own, send_mh)?;
    let output = parts(call, "recvParts", recv_parts, window_bytes as u64)?;
    let spec = OpSpec::windowed(
        group.nranks,
        regions,
        None,
        Parts::one(input.addr, own, input.mh),
        output,
        window_bytes as u64,
    );
    Ok(request(handle, group.post(spec)?))
}

/// `ireducescatter`: `send_parts` hold this rank's input for the window; the reduced bytes of
/// the own part of the window land in `recv`.
#[allow(clippy::too_many_arguments)] // the C signature
pub(crate) fn ireducescatter(
    coll: Ptr,
    send_parts: SgeList<'_>,
    recv: Ptr,
    bytes_per_rank: usize,
    window_offset: usize,
    window_bytes: usize,
    dtype: c_int,
    op: c_int,
    recv_mh: Ptr,
) -> NetResult<Option<Ptr>> {
    let call = "ireducescatter";
    let (handle, group) = lookup(call, coll)?;
    let r = reduction(call, dtype, op)?;
    let regions = window(
        call,
        group.nranks,
        bytes_per_rank,
        window_offset,
        window_bytes,
        r.dtype.size(),
    )?;
    let own = regions.region(group.nranks, group.rank).len;
    let input = parts(call, "sendParts", send_parts, window_bytes as u64)?;
    let output = registered(call, "recvData", recv, own, recv_mh)?;
    let spec = OpSpec::windowed(
        group.nranks,
        regions,
        Some(r),
        input,
        Parts::one(output.addr, own, output.mh),
        own,
    );
    Ok(request(handle, group.post(spec)?))
}

/// `iflush`: host memory never needs one (a NULL request); the group must exist.
pub(crate) fn iflush(coll: Ptr) -> NetResult<()> {
    lookup("iflush", coll).map(drop)
}

/// `test`: the bytes to report once the operation is done.
pub(crate) fn test(req: Ptr) -> NetResult<Option<u64>> {
    let (group, id) = GROUPS.lookup_request("test", "request", req)?;
    group.test(id)
}
