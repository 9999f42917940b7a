//! Per-version `extern "C"` entry points of the CollNet tables: check pointers, convert C types
//! (`int` vs `size_t` counts and sizes, the two `ncclNetSGE` layouts, contexts), then call
//! [`crate::collnet`]. `init`, `devices` and `finalize` are the net table's own
//! ([`super::shims`]), so the two tables agree on devices; `getProperties` differs only in
//! offering host memory alone.
//!
//! Unsafe: these functions receive raw pointers from NCCL; each is checked for NULL before use,
//! and arrays are trusted to hold the number of elements the ABI documents.

#![allow(unsafe_code)]

use super::props::{MAX_MESSAGE_BYTES, VersionedProps};
use super::shims::guard::ffi_call;
use crate::collnet::{self, MAX_PARTS};
use crate::error::{NetError, NetResult};
use crate::log;
use crate::net;
use crate::sys::*;
use core::ffi::{c_int, c_void};
use rivet_core::collnet::reduce::DataType;

type Ptr = *mut c_void;

/// Write through an out-pointer, or fail naming `what`.
///
/// # Safety
/// `out` must be NULL or valid for a write of `T`.
unsafe fn put<T>(out: *mut T, value: T, what: &str) -> NetResult<()> {
    if out.is_null() {
        return Err(NetError::misuse(format!("{what} is NULL")));
    }
    // SAFETY: non-null; the caller guarantees validity.
    unsafe { out.write(value) };
    Ok(())
}

fn non_negative(value: c_int, what: &str) -> NetResult<usize> {
    usize::try_from(value)
        .map_err(|_| NetError::invalid_argument(format!("{what}: negative {value}")))
}

fn within_limit(bytes: Option<u64>, what: &str) -> NetResult<()> {
    match bytes {
        Some(b) if b <= MAX_MESSAGE_BYTES as u64 => Ok(()),
        _ => Err(NetError::invalid_argument(format!(
            "{what}: more than the {MAX_MESSAGE_BYTES} bytes Rivet advertises (maxCollBytes)"
        ))),
    }
}

// ---- lifecycle ----

/// `getProperties` of every version: the net table's, host memory only
/// ([`collnet::properties`]).
///
/// # Safety
/// NCCL passes a pointer to its `ncclNetProperties_vN_t` matching this table's version (NULL
/// is refused).
pub(super) unsafe extern "C" fn get_properties<P: VersionedProps>(
    dev: c_int,
    props: *mut P,
) -> NcclResult {
    ffi_call("CollNet getProperties", || {
        let p = collnet::properties(dev)?;
        // SAFETY: as the caller guarantees; NULL is refused by `put`.
        unsafe { put(props, P::from_props(&p), "getProperties: props") }
    })
}

/// `init(logger)` of v6 – v10.
///
/// # Safety
/// NCCL calls it as its ABI documents.
/// - `logger` is NULL or a function that stays callable while the plugin is loaded.
pub(super) unsafe extern "C" fn init_v6(logger: NcclDebugLogger) -> NcclResult {
    log::set_logger(logger);
    ffi_call("CollNet init", net::init)
}

/// `init(&ctx, commId, logger)` of v11+.
///
/// # Safety
/// NCCL calls it as its ABI documents.
/// - `ctx` is NULL or valid for a write of a pointer.
/// - `logger` is NULL or a function that stays callable while the plugin is loaded.
pub(super) unsafe extern "C" fn init_v11(
    ctx: *mut Ptr,
    comm_id: u64,
    logger: NcclDebugLogger,
) -> NcclResult {
    log::set_logger(logger);
    ffi_call("CollNet init", || {
        if ctx.is_null() {
            return Err(NetError::misuse("CollNet init: ctx out-pointer is NULL"));
        }
        let handle = net::init_context(comm_id, None)?;
        // SAFETY: checked non-null above.
        unsafe { put(ctx, handle, "CollNet init: ctx") }
    })
}

// ---- group setup ----

/// `listen` of every CollNet version and of the RMA tables (a group's listen comm is the same
/// for both); `name` is the call as its table names it, for the error.
///
/// # Safety
/// `handle` is NULL or points to `NCCL_NET_HANDLE_MAXSIZE` writable bytes; `listen_comm` is NULL
/// or valid for a write of a pointer; `ctx` is a handle (checked).
pub(super) unsafe fn listen_common(
    name: &'static str,
    ctx: Ptr,
    dev: c_int,
    handle: Ptr,
    listen_comm: *mut Ptr,
) -> NcclResult {
    ffi_call(name, || {
        // SAFETY: NCCL's handle is a `char[NCCL_NET_HANDLE_MAXSIZE]` buffer.
        let handle = unsafe { handle.cast::<[u8; NCCL_NET_HANDLE_MAXSIZE]>().as_mut() }
            .ok_or_else(|| NetError::misuse(format!("{name}: handle is NULL")))?;
        let comm = collnet::listen(ctx, dev, handle)?;
        // SAFETY: NCCL passes a valid out-pointer (NULL rejected).
        unsafe { put(listen_comm, comm, "listen: listenComm") }
    })
}

/// `listen(dev, handle, listenComm)` of v6 – v10.
///
/// # Safety
/// NCCL calls it as its ABI documents.
/// - `handle` is NULL or points to `NCCL_NET_HANDLE_MAXSIZE` bytes, writable for the call.
/// - `listen_comm` is NULL or valid for a write of a pointer.
pub(super) unsafe extern "C" fn listen_v6(
    dev: c_int,
    handle: Ptr,
    listen_comm: *mut Ptr,
) -> NcclResult {
    // SAFETY: forwarded unchanged.
    unsafe {
        listen_common(
            "CollNet listen",
            core::ptr::null_mut(),
            dev,
            handle,
            listen_comm,
        )
    }
}

/// `listen(ctx, dev, handle, listenComm)` of v11+.
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`ctx`) may be any value: the handle layer checks
/// them and never dereferences them.
/// - `handle` is NULL or points to `NCCL_NET_HANDLE_MAXSIZE` bytes, writable for the call.
/// - `listen_comm` is NULL or valid for a write of a pointer.
pub(super) unsafe extern "C" fn listen_v11(
    ctx: Ptr,
    dev: c_int,
    handle: Ptr,
    listen_comm: *mut Ptr,
) -> NcclResult {
    // SAFETY: forwarded unchanged.
    unsafe { listen_common("CollNet listen", ctx, dev, handle, listen_comm) }
}

/// `connect(handles[], nranks, rank, listenComm, collComm)` of every version.
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`listen_comm`) may be any value: the handle layer
/// checks them and never dereferences them.
/// - `handles` is NULL or an array of `nranks` pointers, each NULL or pointing to
///   `NCCL_NET_HANDLE_MAXSIZE` readable bytes.
/// - `coll_comm` is NULL or valid for a write of a pointer.
pub(super) unsafe extern "C" fn connect(
    handles: *mut Ptr,
    nranks: c_int,
    rank: c_int,
    listen_comm: Ptr,
    coll_comm: *mut Ptr,
) -> NcclResult {
    ffi_call("CollNet connect", || {
        let n = non_negative(nranks, "CollNet connect: nranks")?;
        if handles.is_null() {
            return Err(NetError::misuse("CollNet connect: handles is NULL"));
        }
        if n > 4096 {
            return Err(NetError::invalid_argument(format!(
                "CollNet connect: nranks {n}"
            )));
        }
        let mut copies = Vec::with_capacity(n);
        for i in 0..n {
            // SAFETY: NCCL's array holds `nranks` handle pointers.
            let h = unsafe { *handles.add(i) };
            // SAFETY: each points to a `collNetHandle_t` (NCCL_NET_HANDLE_MAXSIZE bytes).
            let bytes = unsafe { h.cast::<[u8; NCCL_NET_HANDLE_MAXSIZE]>().as_ref() }
                .ok_or_else(|| NetError::misuse(format!("CollNet connect: handle {i} is NULL")))?;
            copies.push(*bytes);
        }
        let comm = collnet::connect(copies, rank, listen_comm)?;
        // SAFETY: NCCL passes a valid out-pointer (NULL rejected).
        unsafe { put(coll_comm, comm, "CollNet connect: collComm") }
    })
}

/// `reduceSupport` of v6 – v8 (NCCL before 2.24 has no fp8 types).
///
/// # Safety
/// NCCL calls it as its ABI documents.
/// - `supported` is NULL or valid for a write of an `int`.
pub(super) unsafe extern "C" fn reduce_support_v6(
    dtype: c_int,
    op: c_int,
    supported: *mut c_int,
) -> NcclResult {
    let yes = collnet::reduce_support(dtype, op, false);
    // SAFETY: NCCL passes a valid `int*` (NULL rejected).
    ffi_call("CollNet reduceSupport", || unsafe {
        put(supported, c_int::from(yes), "reduceSupport: supported")
    })
}

/// `reduceSupport` of v9+ (fp8 included).
///
/// # Safety
/// NCCL calls it as its ABI documents.
/// - `supported` is NULL or valid for a write of an `int`.
pub(super) unsafe extern "C" fn reduce_support_v9(
    dtype: c_int,
    op: c_int,
    supported: *mut c_int,
) -> NcclResult {
    let yes = collnet::reduce_support(dtype, op, true);
    // SAFETY: NCCL passes a valid `int*` (NULL rejected).
    ffi_call("CollNet reduceSupport", || unsafe {
        put(supported, c_int::from(yes), "reduceSupport: supported")
    })
}

// ---- registration ----

/// # Safety
/// `mh` is NULL or valid for a write of a pointer; `coll` is a handle.
unsafe fn reg_common(
    coll: Ptr,
    data: Ptr,
    size: usize,
    kind: c_int,
    dmabuf: Option<(u64, c_int)>,
    mh: *mut Ptr,
) -> NcclResult {
    ffi_call("CollNet regMr", || {
        let handle = collnet::reg_mr(coll, data, size, kind, dmabuf)?;
        // SAFETY: NCCL passes a valid out-pointer (NULL rejected).
        unsafe { put(mh, handle, "CollNet regMr: mhandle") }
    })
}

/// `regMr` with an `int` size (v6, v7).
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`coll`) may be any value: the handle layer checks
/// them and never dereferences them.
/// - `data` .. `data + size` is memory of this process that stays mapped until `deregMr` (the
///   kernel refuses what is not mapped).
/// - `mh` is NULL or valid for a write of a pointer.
pub(super) unsafe extern "C" fn reg_mr_int(
    coll: Ptr,
    data: Ptr,
    size: c_int,
    kind: c_int,
    mh: *mut Ptr,
) -> NcclResult {
    match non_negative(size, "CollNet regMr: size") {
        // SAFETY: forwarded unchanged.
        Ok(size) => unsafe { reg_common(coll, data, size, kind, None, mh) },
        Err(e) => ffi_call("CollNet regMr", || Err(e)),
    }
}

/// `regMr` with a `size_t` size (v8+).
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`coll`) may be any value: the handle layer checks
/// them and never dereferences them.
/// - `data` .. `data + size` is memory of this process that stays mapped until `deregMr` (the
///   kernel refuses what is not mapped).
/// - `mh` is NULL or valid for a write of a pointer.
pub(super) unsafe extern "C" fn reg_mr(
    coll: Ptr,
    data: Ptr,
    size: usize,
    kind: c_int,
    mh: *mut Ptr,
) -> NcclResult {
    // SAFETY: forwarded unchanged.
    unsafe { reg_common(coll, data, size, kind, None, mh) }
}

/// `regMrDmaBuf`.
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`coll`) may be any value: the handle layer checks
/// them and never dereferences them.
/// - `data` is the address the DMA-BUF `fd` maps at `offset` (the kernel checks both).
/// - `mh` is NULL or valid for a write of a pointer.
pub(super) unsafe extern "C" fn reg_mr_dma_buf(
    coll: Ptr,
    data: Ptr,
    size: usize,
    kind: c_int,
    offset: u64,
    fd: c_int,
    mh: *mut Ptr,
) -> NcclResult {
    let dmabuf = (fd >= 0).then_some((offset, fd));
    // SAFETY: forwarded unchanged.
    unsafe { reg_common(coll, data, size, kind, dmabuf, mh) }
}

/// `deregMr`.
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`coll`, `mh`) may be any value: the handle layer
/// checks them and never dereferences them.
pub(super) unsafe extern "C" fn dereg_mr(coll: Ptr, mh: Ptr) -> NcclResult {
    ffi_call("CollNet deregMr", || collnet::dereg_mr(coll, mh))
}

// ---- operations ----

/// # Safety
/// `request` is NULL or valid for a write of a pointer; buffers are checked against their
/// registrations by [`collnet::iallreduce`].
#[allow(clippy::too_many_arguments)] // the C signature
unsafe fn iallreduce_common(
    coll: Ptr,
    send: Ptr,
    recv: Ptr,
    count: NetResult<usize>,
    dtype: c_int,
    op: c_int,
    send_mh: Ptr,
    recv_mh: Ptr,
    request: *mut Ptr,
) -> NcclResult {
    ffi_call("CollNet iallreduce", || {
        let count = count?;
        let elem = DataType::from_nccl(dtype).map_or(1, DataType::size);
        within_limit(
            (count as u64).checked_mul(elem as u64),
            "CollNet iallreduce: count",
        )?;
        let req = collnet::iallreduce(coll, send, recv, count, dtype, op, send_mh, recv_mh)?;
        // SAFETY: NCCL passes a valid out-pointer (NULL rejected).
        unsafe {
            put(
                request,
                req.unwrap_or(core::ptr::null_mut()),
                "CollNet iallreduce: request",
            )
        }
    })
}

/// `iallreduce` with an `int count` (v6 – v8).
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`coll`, `send_mh`, `recv_mh`) may be any value:
/// the handle layer checks them and never dereferences them.
/// - `send` and `recv` hold `count` elements each, inside their registrations (checked); NCCL
///   keeps them until `test` reports the operation done.
/// - `request` is NULL or valid for a write of a pointer.
#[allow(clippy::too_many_arguments)] // the C signature
pub(super) unsafe extern "C" fn iallreduce_int(
    coll: Ptr,
    send: Ptr,
    recv: Ptr,
    count: c_int,
    dtype: c_int,
    op: c_int,
    send_mh: Ptr,
    recv_mh: Ptr,
    request: *mut Ptr,
) -> NcclResult {
    let count = non_negative(count, "CollNet iallreduce: count");
    // SAFETY: forwarded unchanged.
    unsafe {
        iallreduce_common(
            coll, send, recv, count, dtype, op, send_mh, recv_mh, request,
        )
    }
}

/// `iallreduce` with a `size_t count` (v9+).
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`coll`, `send_mh`, `recv_mh`) may be any value:
/// the handle layer checks them and never dereferences them.
/// - `send` and `recv` hold `count` elements each, inside their registrations (checked); NCCL
///   keeps them until `test` reports the operation done.
/// - `request` is NULL or valid for a write of a pointer.
#[allow(clippy::too_many_arguments)] // the C signature
pub(super) unsafe extern "C" fn iallreduce(
    coll: Ptr,
    send: Ptr,
    recv: Ptr,
    count: usize,
    dtype: c_int,
    op: c_int,
    send_mh: Ptr,
    recv_mh: Ptr,
    request: *mut Ptr,
) -> NcclResult {
    // SAFETY: forwarded unchanged.
    unsafe {
        iallreduce_common(
            coll,
            send,
            recv,
            Ok(count),
            dtype,
            op,
            send_mh,
            recv_mh,
            request,
        )
    }
}

/// An SGE of either layout, as `(mhandle, address, size)`.
pub(super) trait Sge: Copy {
    fn parts(self) -> (Ptr, Ptr, u64);
}
impl Sge for NcclNetSgeV8 {
    fn parts(self) -> (Ptr, Ptr, u64) {
        (self.mhandle, self.address, u64::from(self.size))
    }
}
impl Sge for NcclNetSgeV9 {
    fn parts(self) -> (Ptr, Ptr, u64) {
        (self.mhandle, self.address, self.size as u64)
    }
}

/// Up to [`MAX_PARTS`] SGEs as `(mhandle, address, size)`.
type SgeArray = [(Ptr, Ptr, u64); MAX_PARTS];

/// Copy NCCL's SGE array (at most [`MAX_PARTS`] parts, checked first) into a fixed array.
///
/// # Safety
/// `list` is NULL or points to `n` elements.
unsafe fn sge_list<S: Sge>(n: c_int, list: *const S, what: &str) -> NetResult<(SgeArray, usize)> {
    let n = non_negative(n, what)?;
    if n == 0 || n > MAX_PARTS {
        return Err(NetError::invalid_argument(format!(
            "{what}: {n} parts (Rivet takes 1..={MAX_PARTS})"
        )));
    }
    if list.is_null() {
        return Err(NetError::misuse(format!("{what} is NULL")));
    }
    let mut out = [(core::ptr::null_mut(), core::ptr::null_mut(), 0); MAX_PARTS];
    for (i, slot) in out.iter_mut().enumerate().take(n) {
        // SAFETY: NCCL's array holds `n` elements and `i < n`.
        *slot = unsafe { *list.add(i) }.parts();
    }
    Ok((out, n))
}

/// `iallgather` of v8+, for the version's SGE layout `S` (32-bit sizes in v8).
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`coll`, `send_mh`, the parts' mhandles) may be
/// any value: the handle layer checks them and never dereferences them.
/// - `parts` is NULL or an array of `n_parts` SGEs, readable for the call; every part and
///   `send` lie inside their registrations (checked) and stay valid until the operation is done.
/// - `request` is NULL or valid for a write of a pointer.
#[allow(clippy::too_many_arguments)] // the C signature
pub(super) unsafe extern "C" fn iallgather<S: Sge>(
    coll: Ptr,
    send: Ptr,
    n_parts: c_int,
    parts: *mut S,
    bytes_per_rank: usize,
    window_offset: usize,
    window_bytes: usize,
    send_mh: Ptr,
    request: *mut Ptr,
) -> NcclResult {
    ffi_call("CollNet iallgather", || {
        within_limit(Some(window_bytes as u64), "CollNet iallgather: windowBytes")?;
        // SAFETY: NCCL's array holds `n_parts` elements.
        let (list, n) = unsafe { sge_list(n_parts, parts, "CollNet iallgather: recvParts") }?;
        let req = collnet::iallgather(
            coll,
            send,
            &list[..n],
            bytes_per_rank,
            window_offset,
            window_bytes,
            send_mh,
        )?;
        // SAFETY: NCCL passes a valid out-pointer (NULL rejected).
        unsafe {
            put(
                request,
                req.unwrap_or(core::ptr::null_mut()),
                "CollNet iallgather: request",
            )
        }
    })
}

/// `ireducescatter` of v8+, for the version's SGE layout `S` (32-bit sizes in v8).
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`coll`, `recv_mh`, the parts' mhandles) may be
/// any value: the handle layer checks them and never dereferences them.
/// - `parts` is NULL or an array of `n_parts` SGEs, readable for the call; every part and `recv`
///   lie inside their registrations (checked) and stay valid until the operation is done.
/// - `request` is NULL or valid for a write of a pointer.
#[allow(clippy::too_many_arguments)] // the C signature
pub(super) unsafe extern "C" fn ireducescatter<S: Sge>(
    coll: Ptr,
    n_parts: c_int,
    parts: *mut S,
    recv: Ptr,
    bytes_per_rank: usize,
    window_offset: usize,
    window_bytes: usize,
    dtype: c_int,
    op: c_int,
    recv_mh: Ptr,
    request: *mut Ptr,
) -> NcclResult {
    ffi_call("CollNet ireducescatter", || {
        within_limit(
            Some(window_bytes as u64),
            "CollNet ireducescatter: windowBytes",
        )?;
        // SAFETY: NCCL's array holds `n_parts` elements.
        let (list, n) = unsafe { sge_list(n_parts, parts, "CollNet ireducescatter: sendParts") }?;
        let req = collnet::ireducescatter(
            coll,
            &list[..n],
            recv,
            bytes_per_rank,
            window_offset,
            window_bytes,
            dtype,
            op,
            recv_mh,
        )?;
        // SAFETY: NCCL passes a valid out-pointer (NULL rejected).
        unsafe {
            put(
                request,
                req.unwrap_or(core::ptr::null_mut()),
                "CollNet ireducescatter: request",
            )
        }
    })
}

/// `iflush(collComm, data, size, mhandle, request)`: Rivet's CollNet works on host memory, so
/// there is never anything to flush: a NULL request says the flush is complete.
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`coll`) may be any value: the handle layer checks
/// them and never dereferences them. Never read: `_data`, `_mh`.
/// - `request` is NULL or valid for a write of a pointer.
pub(super) unsafe extern "C" fn iflush(
    coll: Ptr,
    _data: Ptr,
    size: c_int,
    _mh: Ptr,
    request: *mut Ptr,
) -> NcclResult {
    ffi_call("CollNet iflush", || {
        non_negative(size, "CollNet iflush: size")?;
        collnet::iflush(coll)?;
        // SAFETY: NCCL passes a valid out-pointer (NULL rejected).
        unsafe { put(request, core::ptr::null_mut(), "CollNet iflush: request") }
    })
}

/// `test(request, done, size)`.
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`request`) may be any value: the handle layer
/// checks them and never dereferences them.
/// - `done` is NULL or valid for a write of an `int`.
/// - `size` is NULL or valid for a write of an `int`.
pub(super) unsafe extern "C" fn test(
    request: Ptr,
    done: *mut c_int,
    size: *mut c_int,
) -> NcclResult {
    ffi_call("CollNet test", || {
        if done.is_null() {
            return Err(NetError::misuse("CollNet test: done is NULL"));
        }
        // SAFETY: non-null; NCCL passes a valid `int*`.
        unsafe { done.write(0) };
        if let Some(bytes) = collnet::test(request)? {
            if !size.is_null() {
                // SAFETY: non-null; NCCL passes a valid `int*`.
                unsafe { size.write(c_int::try_from(bytes).unwrap_or(c_int::MAX)) };
            }
            // SAFETY: non-null (checked above).
            unsafe { done.write(1) };
        }
        Ok(())
    })
}

/// `closeColl`.
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`coll`) may be any value: the handle layer checks
/// them and never dereferences them.
pub(super) unsafe extern "C" fn close_coll(coll: Ptr) -> NcclResult {
    ffi_call("CollNet closeColl", || collnet::close_coll(coll))
}

/// `closeListen`.
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`listen`) may be any value: the handle layer
/// checks them and never dereferences them.
pub(super) unsafe extern "C" fn close_listen(listen: Ptr) -> NcclResult {
    ffi_call("CollNet closeListen", || collnet::close_listen(listen))
}
