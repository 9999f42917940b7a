//! Per-version `extern "C"` entry points: check pointers, convert C types (int vs size_t sizes,
//! versioned property structs, config and context arguments), then call the one implementation.
//!
//! Unsafe: these functions receive raw pointers from NCCL. Each one is checked for NULL before
//! use; buffers NCCL passes (`handle`, arrays of `n` elements) are trusted to have the sizes the
//! ABI documents, as NCCL's own transports do.

#![allow(unsafe_code)]

use crate::abi::props::{MAX_MESSAGE_BYTES, MAX_RECVS, VDeviceRequest, VersionedProps};
use crate::comm;
use crate::error::{NetError, NetResult};
use crate::log;
use crate::net;
use crate::profiler::{Callback, Starts};
use crate::sys::*;
use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicUsize, Ordering};
use guard::ffi_call;
use rivet_core::data::SizesOut;

type Ptr = *mut c_void;

// The profiler callback `init` received, kept here where every entry point reads it (the
// event code is `crate::profiler`'s).

/// The callback `init` received (0 = none).
static CALLBACK: AtomicUsize = AtomicUsize::new(0);

/// Remember (or forget, with `None`) the profiler callback `init` received.
pub(super) fn set_profiler(callback: NcclProfilerCallback) {
    if !cfg!(feature = "profiler") {
        return;
    }
    CALLBACK.store(callback.map_or(0, |f| f as usize), Ordering::Relaxed);
}

/// The callback, if a profiler is attached: the one branch on the data path.
#[inline(always)]
pub(super) fn profiler_callback() -> Option<Callback> {
    // Without the feature this is a constant `None`: the call sites stay as they are and the
    // event code is compiled out behind them.
    if !cfg!(feature = "profiler") {
        return None;
    }
    match CALLBACK.load(Ordering::Relaxed) {
        0 => None,
        // SAFETY: the value was stored from a `Callback` by `set_profiler`.
        f => Some(unsafe { core::mem::transmute::<usize, Callback>(f) }),
    }
}

/// Write `value` through the out-pointer `out`, or fail with a misuse error naming `what`.
///
/// # Safety
/// `out` must be NULL or valid for a write of `T`.
pub(super) unsafe fn put<T>(out: *mut T, value: T, what: &'static str) -> NetResult<()> {
    if out.is_null() {
        return Err(null_out(what));
    }
    // SAFETY: non-null, and the caller guarantees it is valid for writes.
    unsafe { out.write(value) };
    Ok(())
}

/// View NCCL's 128-byte connection handle.
///
/// # Safety
/// `handle` must be NULL or point to `NCCL_NET_HANDLE_MAXSIZE` writable bytes.
unsafe fn handle_bytes<'a>(handle: Ptr) -> NetResult<&'a mut [u8; NCCL_NET_HANDLE_MAXSIZE]> {
    // SAFETY: NCCL's handles are `char[NCCL_NET_HANDLE_MAXSIZE]` buffers (caller's guarantee).
    unsafe { handle.cast::<[u8; NCCL_NET_HANDLE_MAXSIZE]>().as_mut() }
        .ok_or_else(|| NetError::misuse("connection handle is NULL"))
}

fn size_from_int(size: c_int, what: &str) -> NetResult<usize> {
    usize::try_from(size)
        .map_err(|_| NetError::invalid_argument(format!("{what}: negative size {size}")))
}

/// The error of a NULL out-pointer. Out of line, taking the name by value: formatted in the
/// caller, the name's `&str` was stored to the stack on every call, error or not.
#[cold]
#[inline(never)]
fn null_out(what: &'static str) -> NetError {
    NetError::misuse(format!("{what} is NULL"))
}

fn size_checked(size: usize, what: &'static str) -> NetResult<usize> {
    if size > MAX_MESSAGE_BYTES {
        return Err(size_too_large(size, what));
    }
    Ok(size)
}

/// The error of a size above the largest message; out of line for the reason of [`null_out`].
#[cold]
#[inline(never)]
fn size_too_large(size: usize, what: &'static str) -> NetError {
    NetError::invalid_argument(format!(
        "{what}: size {size} exceeds the largest message Rivet advertises ({MAX_MESSAGE_BYTES} bytes, maxP2pBytes)"
    ))
}

fn traffic_class(config: *const NcclNetCommConfig) -> Option<i32> {
    // SAFETY: NCCL passes NULL or a valid config for the duration of the call.
    let tc = unsafe { config.as_ref() }?.traffic_class;
    (tc != NCCL_NET_TRAFFIC_CLASS_UNDEF).then_some(tc)
}

// ---- lifecycle ----

/// `init` as NCCL's table calls it.
///
/// # Safety
/// NCCL calls it as its ABI documents.
/// - `logger` is NULL or a function that stays callable while the plugin is loaded.
pub(super) unsafe extern "C" fn init_v6(logger: NcclDebugLogger) -> NcclResult {
    log::set_logger(logger);
    ffi_call("init", net::init)
}

/// `init` as NCCL's table calls it.
///
/// # Safety
/// NCCL calls it as its ABI documents.
/// - `logger` is NULL or a function that stays callable while the plugin is loaded.
/// - `profiler` is NULL or a function that stays callable while the plugin is loaded.
pub(super) unsafe extern "C" fn init_v10(
    logger: NcclDebugLogger,
    profiler: NcclProfilerCallback,
) -> NcclResult {
    log::set_logger(logger);
    set_profiler(profiler);
    ffi_call("init", net::init)
}

/// `init` as NCCL's table calls it.
///
/// # Safety
/// NCCL calls it as its ABI documents.
/// - `ctx` is NULL or valid for a write of a pointer.
/// - `config` is NULL or points to an `ncclNetCommConfig_t` readable for the call.
/// - `logger` is NULL or a function that stays callable while the plugin is loaded.
/// - `profiler` is NULL or a function that stays callable while the plugin is loaded.
pub(super) unsafe extern "C" fn init_v11(
    ctx: *mut Ptr,
    comm_id: u64,
    config: *mut NcclNetCommConfig,
    logger: NcclDebugLogger,
    profiler: NcclProfilerCallback,
) -> NcclResult {
    log::set_logger(logger);
    set_profiler(profiler);
    ffi_call("init", || {
        if ctx.is_null() {
            return Err(NetError::misuse("init: ctx out-pointer is NULL"));
        }
        let handle = net::init_context(comm_id, traffic_class(config))?;
        // SAFETY: checked non-null above; NCCL passes `&comm->netContext`.
        unsafe { put(ctx, handle, "init: ctx") }
    })
}

/// `finalize` as NCCL's table calls it.
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`ctx`) may be any value: the handle layer checks
/// them and never dereferences them.
pub(super) unsafe extern "C" fn finalize(ctx: Ptr) -> NcclResult {
    ffi_call("finalize", || net::finalize(ctx))
}

/// `setNetAttr` as NCCL's table calls it.
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`ctx`) may be any value: the handle layer checks
/// them and never dereferences them. Never read: `_attr`.
pub(super) unsafe extern "C" fn set_net_attr(ctx: Ptr, _attr: *mut NcclNetAttr) -> NcclResult {
    // The hints describe NCCL's traffic pattern; Rivet's protocol does not use them yet.
    ffi_call("setNetAttr", || net::context(ctx).map(drop))
}

// ---- devices ----

/// `devices` as NCCL's table calls it.
///
/// # Safety
/// NCCL calls it as its ABI documents.
/// - `ndev` is NULL or valid for a write of an `int`.
pub(super) unsafe extern "C" fn devices(ndev: *mut c_int) -> NcclResult {
    // SAFETY: NCCL passes a valid `int*` (NULL is rejected by `put`).
    ffi_call("devices", || unsafe {
        put(ndev, net::devices()?, "devices: ndev")
    })
}

/// `getProperties` as NCCL's table calls it.
///
/// # Safety
/// NCCL calls it as its ABI documents.
/// - `props` is NULL or valid for a write of the version's `ncclNetProperties_vN_t`.
pub(super) unsafe extern "C" fn get_properties<P: VersionedProps>(
    dev: c_int,
    props: *mut P,
) -> NcclResult {
    ffi_call("getProperties", || {
        let p = net::properties(dev)?;
        // SAFETY: NCCL passes a pointer to its `ncclNetProperties_vN_t` matching this table's version.
        unsafe { put(props, P::from_props(&p), "getProperties: props") }
    })
}

/// `makeVDevice(&d, props)` of v9 – v12: fuse the listed physical devices into a new one.
///
/// # Safety
/// As NCCL calls it: `d` is NULL or valid for a write of an `int`; `props` is NULL or points to
/// a readable request of the table's version.
pub(super) unsafe extern "C" fn make_vdevice<V: VDeviceRequest>(
    d: *mut c_int,
    props: *mut V,
) -> NcclResult {
    ffi_call("makeVDevice", || {
        // SAFETY: NCCL passes its request struct of this table's version (NULL rejected).
        let request = unsafe { props.as_ref() }
            .ok_or_else(|| NetError::misuse("makeVDevice: props is NULL"))?;
        let members = request.members().ok_or_else(|| {
            NetError::invalid_argument(
                "makeVDevice: ndevs is outside 1..=NCCL_NET_MAX_DEVS_PER_NIC".to_owned(),
            )
        })?;
        let index = net::make_vdevice(members)?;
        // SAFETY: NCCL passes a valid out-pointer (NULL rejected).
        unsafe { put(d, index, "makeVDevice: d") }
    })
}

// ---- connection setup ----

/// `listen` of every version (`ctx` NULL before v11).
///
/// # Safety
/// As the `listen` entries: `handle` is NULL or points to `NCCL_NET_HANDLE_MAXSIZE` writable
/// bytes, `listen_comm` is NULL or valid for a write of a pointer; `ctx` is a handle (checked).
unsafe fn listen_common(ctx: Ptr, dev: c_int, handle: Ptr, listen_comm: *mut Ptr) -> NcclResult {
    ffi_call("listen", || {
        let ctx = net::context(ctx)?;
        // SAFETY: NCCL's handle buffer is NCCL_NET_HANDLE_MAXSIZE bytes.
        let handle = unsafe { handle_bytes(handle) }?;
        let comm = comm::listen(ctx, dev, handle)?;
        // SAFETY: NCCL passes a valid out-pointer (NULL rejected).
        unsafe { put(listen_comm, comm, "listen: listenComm") }
    })
}

/// `listen` as NCCL's table calls it.
///
/// # Safety
/// NCCL calls it as its ABI documents.
/// - `handle` is NULL or points to `NCCL_NET_HANDLE_MAXSIZE` bytes, readable and writable for the
///   call.
/// - `listen_comm` is NULL or valid for a write of a pointer.
pub(super) unsafe extern "C" fn listen_v6(
    dev: c_int,
    handle: Ptr,
    listen_comm: *mut Ptr,
) -> NcclResult {
    // SAFETY: forwarded unchanged.
    unsafe { listen_common(core::ptr::null_mut(), dev, handle, listen_comm) }
}

/// `listen` as NCCL's table calls it.
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`ctx`) may be any value: the handle layer checks
/// them and never dereferences them.
/// - `handle` is NULL or points to `NCCL_NET_HANDLE_MAXSIZE` bytes, readable and writable for the
///   call.
/// - `listen_comm` is NULL or valid for a write of a pointer.
pub(super) unsafe extern "C" fn listen_v11(
    ctx: Ptr,
    dev: c_int,
    handle: Ptr,
    listen_comm: *mut Ptr,
) -> NcclResult {
    // SAFETY: forwarded unchanged.
    unsafe { listen_common(ctx, dev, handle, listen_comm) }
}

/// `connect` of every version (`ctx` NULL before v11).
///
/// # Safety
/// As the `connect` entries: `handle` is NULL or points to `NCCL_NET_HANDLE_MAXSIZE` readable
/// and writable bytes, `send_comm` is NULL or valid for a write of a pointer; `ctx` is a handle
/// (checked).
unsafe fn connect_common(
    ctx: Ptr,
    dev: c_int,
    tc: Option<i32>,
    handle: Ptr,
    send_comm: *mut Ptr,
) -> NcclResult {
    ffi_call("connect", || {
        let ctx = net::context(ctx)?;
        let tc = tc.or_else(|| ctx.and_then(|c| c.traffic_class));
        // SAFETY: NCCL's handle buffer is NCCL_NET_HANDLE_MAXSIZE bytes.
        let handle = unsafe { handle_bytes(handle) }?;
        let comm = comm::connect(ctx, dev, tc, handle)?;
        // NULL until the connection is established: NCCL polls again with the same handle.
        // SAFETY: NCCL passes a valid out-pointer (NULL rejected).
        unsafe {
            put(
                send_comm,
                comm.unwrap_or(core::ptr::null_mut()),
                "connect: sendComm",
            )
        }
    })
}

/// `connect` as NCCL's table calls it.
///
/// # Safety
/// NCCL calls it as its ABI documents.
/// - `handle` is NULL or points to `NCCL_NET_HANDLE_MAXSIZE` bytes, readable and writable for the
///   call.
/// - `send_comm` is NULL or valid for a write of a pointer.
pub(super) unsafe extern "C" fn connect_v6(
    dev: c_int,
    handle: Ptr,
    send_comm: *mut Ptr,
) -> NcclResult {
    // SAFETY: forwarded unchanged.
    unsafe { connect_common(core::ptr::null_mut(), dev, None, handle, send_comm) }
}

/// v7–v9: the device-handle out-parameter is left untouched (a host plugin has none).
///
/// # Safety
/// NCCL calls it as its ABI documents. Never read: `_dev_comm`.
/// - `handle` is NULL or points to `NCCL_NET_HANDLE_MAXSIZE` bytes, readable and writable for the
///   call.
/// - `send_comm` is NULL or valid for a write of a pointer.
pub(super) unsafe extern "C" fn connect_v7(
    dev: c_int,
    handle: Ptr,
    send_comm: *mut Ptr,
    _dev_comm: *mut *mut NcclNetDeviceHandle,
) -> NcclResult {
    // SAFETY: forwarded unchanged.
    unsafe { connect_common(core::ptr::null_mut(), dev, None, handle, send_comm) }
}

/// `connect` as NCCL's table calls it.
///
/// # Safety
/// NCCL calls it as its ABI documents. Never read: `_dev_comm`.
/// - `config` is NULL or points to an `ncclNetCommConfig_t` readable for the call.
/// - `handle` is NULL or points to `NCCL_NET_HANDLE_MAXSIZE` bytes, readable and writable for the
///   call.
/// - `send_comm` is NULL or valid for a write of a pointer.
pub(super) unsafe extern "C" fn connect_v10(
    dev: c_int,
    config: *mut NcclNetCommConfig,
    handle: Ptr,
    send_comm: *mut Ptr,
    _dev_comm: *mut *mut NcclNetDeviceHandle,
) -> NcclResult {
    // SAFETY: forwarded unchanged; `config` is NULL or valid for the call.
    unsafe {
        connect_common(
            core::ptr::null_mut(),
            dev,
            traffic_class(config),
            handle,
            send_comm,
        )
    }
}

/// `connect` as NCCL's table calls it.
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`ctx`) may be any value: the handle layer checks
/// them and never dereferences them. Never read: `_dev_comm`.
/// - `handle` is NULL or points to `NCCL_NET_HANDLE_MAXSIZE` bytes, readable and writable for the
///   call.
/// - `send_comm` is NULL or valid for a write of a pointer.
pub(super) unsafe extern "C" fn connect_v11(
    ctx: Ptr,
    dev: c_int,
    handle: Ptr,
    send_comm: *mut Ptr,
    _dev_comm: *mut *mut NcclNetDeviceHandle,
) -> NcclResult {
    // SAFETY: forwarded unchanged.
    unsafe { connect_common(ctx, dev, None, handle, send_comm) }
}

/// `accept` as NCCL's table calls it.
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`listen_comm`) may be any value: the handle layer
/// checks them and never dereferences them.
/// - `recv_comm` is NULL or valid for a write of a pointer.
pub(super) unsafe extern "C" fn accept_v6(listen_comm: Ptr, recv_comm: *mut Ptr) -> NcclResult {
    ffi_call("accept", || {
        let comm = comm::accept(listen_comm)?;
        // SAFETY: NCCL passes a valid out-pointer (NULL rejected).
        unsafe {
            put(
                recv_comm,
                comm.unwrap_or(core::ptr::null_mut()),
                "accept: recvComm",
            )
        }
    })
}

/// `accept` as NCCL's table calls it.
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`listen_comm`) may be any value: the handle layer
/// checks them and never dereferences them. Never read: `_dev_comm`.
/// - `recv_comm` is NULL or valid for a write of a pointer.
pub(super) unsafe extern "C" fn accept_v7(
    listen_comm: Ptr,
    recv_comm: *mut Ptr,
    _dev_comm: *mut *mut NcclNetDeviceHandle,
) -> NcclResult {
    // SAFETY: forwarded unchanged.
    unsafe { accept_v6(listen_comm, recv_comm) }
}

// ---- memory registration ----

/// `regMr`/`regMrDmaBuf` of every version.
///
/// # Safety
/// As the `regMr` entries: `mh` is NULL or valid for a write of a pointer; `data` .. `data +
/// size` is NCCL's memory (or the DMA-BUF's), which the kernel checks; `comm` is a handle.
unsafe fn reg_common(
    comm: Ptr,
    data: Ptr,
    size: usize,
    kind: c_int,
    dmabuf: Option<(u64, c_int)>,
    mh: *mut Ptr,
) -> NcclResult {
    ffi_call("regMr", || {
        let handle = comm::reg_mr(comm, data, size, kind, dmabuf)?;
        // SAFETY: NCCL passes a valid out-pointer (NULL rejected).
        unsafe { put(mh, handle, "regMr: mhandle") }
    })
}

/// `regMr` as NCCL's table calls it.
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`comm`) may be any value: the handle layer checks
/// them and never dereferences them.
/// - `data` .. `data + size` is memory of this process that stays mapped until `deregMr` (the
///   kernel refuses what is not mapped; the CPU never reads or writes it).
/// - `mh` is NULL or valid for a write of a pointer.
pub(super) unsafe extern "C" fn reg_mr_int(
    comm: Ptr,
    data: Ptr,
    size: c_int,
    kind: c_int,
    mh: *mut Ptr,
) -> NcclResult {
    match size_from_int(size, "regMr") {
        // SAFETY: forwarded unchanged.
        Ok(size) => unsafe { reg_common(comm, data, size, kind, None, mh) },
        Err(e) => ffi_call("regMr", || Err(e)),
    }
}

/// `regMr` as NCCL's table calls it.
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`comm`) may be any value: the handle layer checks
/// them and never dereferences them.
/// - `data` .. `data + size` is memory of this process that stays mapped until `deregMr` (the
///   kernel refuses what is not mapped; the CPU never reads or writes it).
/// - `mh` is NULL or valid for a write of a pointer.
pub(super) unsafe extern "C" fn reg_mr(
    comm: Ptr,
    data: Ptr,
    size: usize,
    kind: c_int,
    mh: *mut Ptr,
) -> NcclResult {
    // SAFETY: forwarded unchanged.
    unsafe { reg_common(comm, data, size, kind, None, mh) }
}

/// `regMrDmaBuf` as NCCL's table calls it.
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`comm`) may be any value: the handle layer checks
/// them and never dereferences them.
/// - `data` is the address the DMA-BUF `fd` maps at `offset` (the kernel checks the fd and the
///   range; the CPU never touches `data`).
/// - `mh` is NULL or valid for a write of a pointer.
pub(super) unsafe extern "C" fn reg_mr_dma_buf(
    comm: Ptr,
    data: Ptr,
    size: usize,
    kind: c_int,
    offset: u64,
    fd: c_int,
    mh: *mut Ptr,
) -> NcclResult {
    let dmabuf = (fd >= 0).then_some((offset, fd));
    // SAFETY: forwarded unchanged.
    unsafe { reg_common(comm, data, size, kind, dmabuf, mh) }
}

/// `deregMr` as NCCL's table calls it.
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`comm`, `mh`) may be any value: the handle layer
/// checks them and never dereferences them.
pub(super) unsafe extern "C" fn dereg_mr(comm: Ptr, mh: Ptr) -> NcclResult {
    ffi_call("deregMr", || comm::dereg_mr(comm, mh))
}

// ---- data path ----

/// The v10 entries' size conversion (none: `size_t` already). A function of its own, not the
/// `Ok` that the v9 entries pass: `isend_common` and `irecv_common` (and their catch frames) are
/// then instantiated for `isend_v10` and `irecv_v10` alone, with one caller each, and built into
/// them; shared by two entries, they were called, with their arguments and result passed through
/// memory.
fn size_t_v10(size: usize) -> NetResult<usize> {
    Ok(size)
}

/// `isend` of every version, with the size's C type converted by `size_of`.
///
/// # Safety
/// As the `isend` entries: `request` is NULL or valid for a write of a pointer; `comm` and `mh`
/// are handles (checked); `data` is only handed to the NIC, inside the checked registration.
#[allow(clippy::too_many_arguments)] // the C signature plus a size converter and the events
unsafe fn isend_common<S>(
    comm: Ptr,
    data: Ptr,
    size: S,
    tag: c_int,
    mh: Ptr,
    request: *mut Ptr,
    size_of: impl FnOnce(S) -> NetResult<usize>,
    starts: Option<Starts>,
) -> NcclResult {
    ffi_call("isend", move || {
        let size = size_checked(size_of(size)?, "isend")?;
        // Refused before anything is posted: a send taken (an eager one needs no receive) whose
        // request NCCL never learns of would be matched and never tested.
        if request.is_null() {
            return Err(null_out("isend: request"));
        }
        let req = comm::isend(comm, data, size, tag, mh, starts)?;
        // SAFETY: NCCL passes a valid out-pointer, and it is not NULL (checked above).
        unsafe { request.write(req) };
        Ok(())
    })
}

/// `isend` as NCCL's table calls it.
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`comm`, `mh`) may be any value: the handle layer
/// checks them and never dereferences them.
/// - `data` .. `data + size` lies inside the registration `mh` (checked; the CPU never reads or
///   writes it).
/// - `request` is NULL or valid for a write of a pointer.
pub(super) unsafe extern "C" fn isend_int(
    comm: Ptr,
    data: Ptr,
    size: c_int,
    tag: c_int,
    mh: Ptr,
    request: *mut Ptr,
) -> NcclResult {
    // The `int` size widened, then the v9 entry: one body for both (the minimal build's size).
    match size_from_int(size, "isend") {
        // SAFETY: forwarded unchanged but for the size's type.
        Ok(size) => unsafe { isend_v9(comm, data, size, tag, mh, request) },
        Err(err) => ffi_call("isend", || Err(err)),
    }
}

/// `isend` as NCCL's table calls it.
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`comm`, `mh`) may be any value: the handle layer
/// checks them and never dereferences them.
/// - `data` .. `data + size` lies inside the registration `mh` (checked; the CPU never reads or
///   writes it).
/// - `request` is NULL or valid for a write of a pointer.
#[inline(never)] // `isend_int` calls it rather than carrying a copy
pub(super) unsafe extern "C" fn isend_v9(
    comm: Ptr,
    data: Ptr,
    size: usize,
    tag: c_int,
    mh: Ptr,
    request: *mut Ptr,
) -> NcclResult {
    // SAFETY: forwarded unchanged.
    unsafe { isend_common(comm, data, size, tag, mh, request, Ok, None) }
}

/// `isend` as NCCL's table calls it.
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`comm`, `mh`) may be any value: the handle layer
/// checks them and never dereferences them.
/// - `data` .. `data + size` lies inside the registration `mh` (checked; the CPU never reads or
///   writes it).
/// - `phandle` is NCCL's profiler handle, passed back to its callback unread.
/// - `request` is NULL or valid for a write of a pointer.
pub(super) unsafe extern "C" fn isend_v10(
    comm: Ptr,
    data: Ptr,
    size: usize,
    tag: c_int,
    mh: Ptr,
    phandle: Ptr,
    request: *mut Ptr,
) -> NcclResult {
    // The profiler's events start with the request, in its comm; `phandle` lives for the call.
    // SAFETY: a one-element array.
    let starts = profiler_callback().and_then(|cb| unsafe { Starts::new(cb, &raw const phandle) });
    // SAFETY: forwarded unchanged.
    unsafe { isend_common(comm, data, size, tag, mh, request, size_t_v10, starts) }
}

/// Copy NCCL's `n`-element arrays into `args`'s fixed arrays (no allocation), validating `n`
/// first. Out of line and filling the caller's `RecvArgs` in place: inlined (or returning it by
/// value), the arrays were split into scalars and the copy unrolled once per `n`, or the whole
/// struct was copied out (benches/callgrind_pingpong.sh).
///
/// # Safety
/// Each non-NULL pointer must point to at least `n` elements.
#[inline(never)]
unsafe fn recv_arrays<S: Copy>(
    args: &mut comm::RecvArgs,
    n: c_int,
    data: *mut Ptr,
    sizes: *mut S,
    tags: *mut c_int,
    mhs: *mut Ptr,
    size_of: impl Fn(S) -> NetResult<usize>,
) -> NetResult<()> {
    let n = usize::try_from(n)
        .ok()
        .filter(|n| (1..=MAX_RECVS as usize).contains(n))
        .ok_or_else(|| {
            NetError::invalid_argument(format!("irecv: n = {n} outside 1..={MAX_RECVS}"))
        })?;
    if data.is_null() || sizes.is_null() || tags.is_null() || mhs.is_null() {
        return Err(NetError::misuse(
            "irecv: NULL data, sizes, tags or mhandles array",
        ));
    }
    for i in 0..n {
        // SAFETY: the arrays hold `n` elements (caller's guarantee) and `i < n`.
        unsafe {
            args.data[i] = *data.add(i);
            args.sizes[i] = size_checked(size_of(*sizes.add(i))?, "irecv")?;
            args.tags[i] = *tags.add(i);
            args.mhandles[i] = *mhs.add(i);
        }
    }
    args.n = n;
    Ok(())
}

/// `irecv` of every version, with the sizes' C type converted by `size_of`.
///
/// # Safety
/// As the `irecv` entries: `data`, `sizes`, `tags` and `mhs` are NULL or arrays of `n` elements
/// readable for the call; `request` is NULL or valid for a write of a pointer; `comm` is a handle.
#[allow(clippy::too_many_arguments)] // mirrors the C signature plus a size converter and the events
unsafe fn irecv_common<S: Copy>(
    comm: Ptr,
    n: c_int,
    data: *mut Ptr,
    sizes: *mut S,
    tags: *mut c_int,
    mhs: *mut Ptr,
    request: *mut Ptr,
    size_of: impl Fn(S) -> NetResult<usize>,
    starts: Option<Starts>,
) -> NcclResult {
    ffi_call("irecv", move || {
        // Refused before anything is posted (a receive NCCL cannot test would take a send).
        if request.is_null() {
            return Err(null_out("irecv: request"));
        }
        if n == 1 && !(data.is_null() || sizes.is_null() || tags.is_null() || mhs.is_null()) {
            // NCCL's point-to-point receive: its one buffer straight through, no arrays of eight.
            // SAFETY: NCCL's arrays hold `n` = 1 element each (non-NULL, checked).
            let (ptr, size, tag, mh) = unsafe { (*data, *sizes, *tags, *mhs) };
            let size = size_checked(size_of(size)?, "irecv")?;
            let req = comm::irecv_one(comm, ptr, size, tag, mh, starts)?;
            // SAFETY: NCCL passes a valid out-pointer, and it is not NULL (checked above).
            unsafe { request.write(req) };
            return Ok(());
        }
        let mut args = comm::RecvArgs {
            n: 0,
            data: [core::ptr::null_mut(); 8],
            sizes: [0; 8],
            tags: [0; 8],
            mhandles: [core::ptr::null_mut(); 8],
        };
        // SAFETY: NCCL's arrays hold `n` elements.
        unsafe { recv_arrays(&mut args, n, data, sizes, tags, mhs, size_of) }?;
        // `*request` may hold the NCCL_NET_OPTIONAL_RECV_COMPLETION hint on input; Rivet always
        // completes receives normally (allowed by the contract) and overwrites it.
        let req = comm::irecv(comm, &args, starts)?;
        // SAFETY: NCCL passes a valid out-pointer, and it is not NULL (checked above).
        unsafe { request.write(req) };
        Ok(())
    })
}

/// `irecv` as NCCL's table calls it.
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`comm`) may be any value: the handle layer checks
/// them and never dereferences them.
/// - `data` is NULL or an array of `n` pointers readable for the call.
/// - `sizes` is NULL or an array of `n` elements readable for the call.
/// - `tags` is NULL or an array of `n` elements readable for the call.
/// - `mhs` is NULL or an array of `n` pointers readable for the call.
/// - `request` is NULL or valid for a write of a pointer.
pub(super) unsafe extern "C" fn irecv_int(
    comm: Ptr,
    n: c_int,
    data: *mut Ptr,
    sizes: *mut c_int,
    tags: *mut c_int,
    mhs: *mut Ptr,
    request: *mut Ptr,
) -> NcclResult {
    // The `int` sizes widened into `size_t`s, then the v9 entry: one body for both (the minimal
    // build's size). Converted only when the v9 entry would read them (`n` in range, no NULL
    // array); otherwise it reports what is wrong with its own message.
    let mut wide = [0usize; MAX_RECVS as usize];
    let mut wide_sizes: *mut usize = core::ptr::null_mut();
    let readable = !(data.is_null() || sizes.is_null() || tags.is_null() || mhs.is_null());
    if let Ok(count) = usize::try_from(n)
        && readable
        && (1..=MAX_RECVS as usize).contains(&count)
    {
        for (i, slot) in wide[..count].iter_mut().enumerate() {
            // SAFETY: NCCL's `sizes` holds `n` elements (non-NULL, checked) and `i < n`.
            match size_from_int(unsafe { *sizes.add(i) }, "irecv") {
                Ok(size) => *slot = size,
                Err(err) => return ffi_call("irecv", || Err(err)),
            }
        }
        wide_sizes = wide.as_mut_ptr();
    }
    // SAFETY: forwarded unchanged but for the sizes, `n` of them in `wide` when they are read.
    unsafe { irecv_v9(comm, n, data, wide_sizes, tags, mhs, request) }
}

/// `irecv` as NCCL's table calls it.
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`comm`) may be any value: the handle layer checks
/// them and never dereferences them.
/// - `data` is NULL or an array of `n` pointers readable for the call.
/// - `sizes` is NULL or an array of `n` elements readable for the call.
/// - `tags` is NULL or an array of `n` elements readable for the call.
/// - `mhs` is NULL or an array of `n` pointers readable for the call.
/// - `request` is NULL or valid for a write of a pointer.
#[inline(never)] // `irecv_int` calls it rather than carrying a copy
pub(super) unsafe extern "C" fn irecv_v9(
    comm: Ptr,
    n: c_int,
    data: *mut Ptr,
    sizes: *mut usize,
    tags: *mut c_int,
    mhs: *mut Ptr,
    request: *mut Ptr,
) -> NcclResult {
    // SAFETY: forwarded unchanged.
    unsafe { irecv_common(comm, n, data, sizes, tags, mhs, request, Ok, None) }
}

#[allow(clippy::too_many_arguments)] // the C signature
/// `irecv` as NCCL's table calls it.
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`comm`) may be any value: the handle layer checks
/// them and never dereferences them.
/// - `data` is NULL or an array of `n` pointers readable for the call.
/// - `sizes` is NULL or an array of `n` elements readable for the call.
/// - `tags` is NULL or an array of `n` elements readable for the call.
/// - `mhs` is NULL or an array of `n` pointers readable for the call.
/// - `phandles` is NULL or an array of `n` pointers readable for the call.
/// - `request` is NULL or valid for a write of a pointer.
pub(super) unsafe extern "C" fn irecv_v10(
    comm: Ptr,
    n: c_int,
    data: *mut Ptr,
    sizes: *mut usize,
    tags: *mut c_int,
    mhs: *mut Ptr,
    phandles: *mut Ptr,
    request: *mut Ptr,
) -> NcclResult {
    // SAFETY: NCCL's `phandles` holds `n` elements (or is NULL) for the call.
    let starts = profiler_callback().and_then(|cb| unsafe { Starts::new(cb, phandles) });
    // SAFETY: forwarded unchanged.
    unsafe { irecv_common(comm, n, data, sizes, tags, mhs, request, size_t_v10, starts) }
}

/// `iflush` as NCCL's table calls it.
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`comm`) may be any value: the handle layer checks
/// them and never dereferences them.
/// - `data`, `sizes` and `mhs` are NULL or arrays of `n` elements readable for the call.
/// - `request` is NULL or valid for a write of a pointer.
pub(super) unsafe extern "C" fn iflush(
    comm: Ptr,
    n: c_int,
    data: *mut Ptr,
    sizes: *mut c_int,
    mhs: *mut Ptr,
    request: *mut Ptr,
) -> NcclResult {
    ffi_call("iflush", || {
        let n = usize::try_from(n)
            .ok()
            .filter(|n| (1..=MAX_RECVS as usize).contains(n))
            .ok_or_else(|| {
                NetError::invalid_argument(format!("iflush: n = {n} outside 1..={MAX_RECVS}"))
            })?;
        if data.is_null() || sizes.is_null() || mhs.is_null() {
            return Err(NetError::misuse(
                "iflush: NULL data, sizes or mhandles array",
            ));
        }
        let mut args = comm::FlushArgs {
            n,
            data: [core::ptr::null_mut(); 8],
            sizes: [0; 8],
            mhandles: [core::ptr::null_mut(); 8],
        };
        for i in 0..n {
            // SAFETY: the arrays hold `n` elements (NCCL's contract) and `i < n`.
            let (ptr, size, mh) = unsafe { (*data.add(i), *sizes.add(i), *mhs.add(i)) };
            args.data[i] = ptr;
            args.sizes[i] = u64::try_from(size).map_err(|_| {
                NetError::invalid_argument(format!("iflush: size {size} of buffer {i} is negative"))
            })?;
            args.mhandles[i] = mh;
        }
        // NULL when there is nothing to flush (host memory, or nothing received): done.
        let req = comm::iflush(comm, &args)?;
        // SAFETY: NCCL passes a valid out-pointer (NULL rejected).
        unsafe {
            put(
                request,
                req.unwrap_or(core::ptr::null_mut()),
                "iflush: request",
            )
        }
    })
}

/// `test`'s `sizes` argument: NCCL's array of one `int` per buffer of the request (or NULL,
/// when NCCL does not want them). The core writes each size straight into it, clamped to
/// `INT_MAX`.
struct NcclSizes(*mut c_int);

impl SizesOut for NcclSizes {
    #[inline(always)]
    fn put(&mut self, index: usize, size: u32) {
        if !self.0.is_null() {
            // SAFETY: NCCL passes an array with one entry per buffer of the request, and the
            // core names only those (`index` below the request's buffer count).
            unsafe {
                self.0
                    .add(index)
                    .write(c_int::try_from(size).unwrap_or(c_int::MAX))
            };
        }
    }
}

/// `test` as NCCL's table calls it.
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`request`) may be any value: the handle layer
/// checks them and never dereferences them.
/// - `done` is NULL or valid for a write of an `int`.
/// - `sizes` is NULL or valid for writes of as many `int`s as the request has buffers (at most 8).
pub(super) unsafe extern "C" fn test(
    request: Ptr,
    done: *mut c_int,
    sizes: *mut c_int,
) -> NcclResult {
    ffi_call("test", || {
        if done.is_null() {
            return Err(NetError::misuse("test: done is NULL"));
        }
        // SAFETY: non-null; NCCL passes a valid `int*`.
        unsafe { done.write(0) };
        if comm::test(request, &mut NcclSizes(sizes))? {
            // SAFETY: non-null (checked above).
            unsafe { done.write(1) };
        }
        Ok(())
    })
}

/// `closeSend` as NCCL's table calls it.
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`comm`) may be any value: the handle layer checks
/// them and never dereferences them.
pub(super) unsafe extern "C" fn close_send(comm: Ptr) -> NcclResult {
    ffi_call("closeSend", || comm::close_send(comm))
}

/// `closeRecv` as NCCL's table calls it.
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`comm`) may be any value: the handle layer checks
/// them and never dereferences them.
pub(super) unsafe extern "C" fn close_recv(comm: Ptr) -> NcclResult {
    ffi_call("closeRecv", || comm::close_recv(comm))
}

/// `closeListen` as NCCL's table calls it.
///
/// # Safety
/// NCCL calls it as its ABI documents. Handles (`comm`) may be any value: the handle layer checks
/// them and never dereferences them.
pub(super) unsafe extern "C" fn close_listen(comm: Ptr) -> NcclResult {
    ffi_call("closeListen", || comm::close_listen(comm))
}

pub(super) mod guard {
    //! The C boundary guard: no panic and no Rust error crosses into NCCL.
    //!
    //! Every exported function runs its body through [`ffi_call`], which catches unwinding panics
    //! (turning them into `ncclInternalError` plus one WARN line) and maps [`NetError`] onto
    //! `ncclResult_t`, logging it once.

    use crate::error::{NetError, NetResult};
    use crate::log::warn;
    use crate::sys::{NCCL_INTERNAL_ERROR, NCCL_SUCCESS, NcclResult};
    use std::any::Any;
    use std::panic::{AssertUnwindSafe, catch_unwind};

    /// Run `body` for the exported function `name` and convert the outcome to `ncclResult_t`.
    ///
    /// Inlined into each entry point, with the error and panic reports out of line (cold): the
    /// success path is the catch frame and one test.
    #[inline(always)]
    pub(crate) fn ffi_call(name: &'static str, body: impl FnOnce() -> NetResult<()>) -> NcclResult {
        // AssertUnwindSafe: after a panic the plugin reports an internal error; state touched by the
        // panicking call is inside a comm whose cell is poisoned, and later calls on it fail.
        match catch_unwind(AssertUnwindSafe(body)) {
            Ok(Ok(())) => NCCL_SUCCESS,
            Ok(Err(err)) => failed(name, &err),
            Err(payload) => panicked(name, &*payload),
        }
    }

    /// Log `err` (unless it was logged where it happened) and return its `ncclResult_t`.
    #[cold]
    #[inline(never)]
    fn failed(name: &str, err: &NetError) -> NcclResult {
        if !err.was_logged() {
            // Most messages already start with the call's name; do not say it twice.
            if err.message().starts_with(name) {
                warn!("{err}");
            } else {
                warn!("{name}: {err}");
            }
        }
        err.class().code()
    }

    /// Log a panic caught at the boundary.
    #[cold]
    #[inline(never)]
    fn panicked(name: &str, payload: &(dyn Any + Send)) -> NcclResult {
        let what = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("(no message)");
        warn!("{name}: internal error: a panic was caught at the C boundary: {what}");
        NCCL_INTERNAL_ERROR
    }
}
