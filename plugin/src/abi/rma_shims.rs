//! Per-version `extern "C"` entry points of the RMA tables: check pointers, convert C types,
//! then call [`crate::rma`]. One body per call; the versions differ only in arguments:
//! v13's `createContext` hands out a device handle and `regMrSym` a GIN handle, v14 adds the
//! strong/weak signal flag (every Rivet signal is strong: it travels after its put on one queue
//! pair), v15 the `optFlags` hint (accepted and not needed: each operation is posted as one chain
//! at once), v16 `getRmaProperties`.
//!
//! Unsafe: these functions receive raw pointers from NCCL; each is checked for NULL before use,
//! and arrays are trusted to hold the number of elements the ABI documents.

#![allow(unsafe_code)]

use super::props::VersionedProps;
use super::shims::guard::ffi_call;
use super::shims::put;
use crate::error::NetError;
use crate::log;
use crate::rma::{self, ContextConfig, Op};
use crate::sys::*;
use core::ffi::{c_int, c_void};

type Ptr = *mut c_void;

// ---- lifecycle ----

/// `init(&ctx, commId, logger)`.
///
/// # Safety
/// `ctx` is NULL or valid for a write of a pointer; `logger` is NULL or a function that stays
/// callable while the plugin is loaded.
pub(super) unsafe extern "C" fn init(
    ctx: *mut Ptr,
    comm_id: u64,
    logger: NcclDebugLogger,
) -> NcclResult {
    log::set_logger(logger);
    ffi_call("RMA init", || {
        if ctx.is_null() {
            return Err(NetError::misuse("RMA init: ctx out-pointer is NULL"));
        }
        let handle = rma::init(comm_id)?;
        // SAFETY: checked non-null above.
        unsafe { put(ctx, handle, "RMA init: ctx") }
    })
}

/// `finalize(ctx)`.
///
/// # Safety
/// Handles may be any value: the handle layer checks them.
pub(super) unsafe extern "C" fn finalize(ctx: Ptr) -> NcclResult {
    ffi_call("RMA finalize", || rma::finalize(ctx))
}

/// `getProperties(dev, props)`: the net table's v12 properties, as a GIN proxy device.
///
/// # Safety
/// `props` is NULL or points to an `ncclNetProperties_v12_t`.
pub(super) unsafe extern "C" fn get_properties(
    dev: c_int,
    props: *mut NcclNetPropertiesV12,
) -> NcclResult {
    ffi_call("RMA getProperties", || {
        let (p, device_type) = rma::properties(dev)?;
        let mut v12 = NcclNetPropertiesV12::from_props(&p);
        v12.net_device_type = device_type;
        // SAFETY: as the caller guarantees; NULL is refused by `put`.
        unsafe { put(props, v12, "RMA getProperties: props") }
    })
}

/// v16's `getRmaProperties(collComm, props)`.
///
/// # Safety
/// `props` is NULL or points to an `ncclRmaProperties_v16_t`.
pub(super) unsafe extern "C" fn get_rma_properties(
    coll: Ptr,
    props: *mut NcclRmaPropertiesV16,
) -> NcclResult {
    ffi_call("getRmaProperties", || {
        let flushes = rma::flushes_all_puts_on_any_signal(coll)?;
        let value = NcclRmaPropertiesV16 {
            flushes_all_puts_on_any_signal: flushes,
        };
        // SAFETY: as the caller guarantees; NULL is refused by `put`.
        unsafe { put(props, value, "getRmaProperties: props") }
    })
}

// ---- group ----

/// `listen(ctx, dev, handle, &listenComm)`: a listen comm as a CollNet group's.
///
/// # Safety
/// `handle` is NULL or points to `NCCL_NET_HANDLE_MAXSIZE` writable bytes; `listen_comm` is
/// NULL or valid for a write of a pointer.
pub(super) unsafe extern "C" fn listen(
    ctx: Ptr,
    dev: c_int,
    handle: Ptr,
    listen_comm: *mut Ptr,
) -> NcclResult {
    // SAFETY: forwarded unchanged.
    unsafe { super::collnet_shims::listen_common("RMA listen", ctx, dev, handle, listen_comm) }
}

/// `connect(ctx, handles[], nranks, rank, listenComm, &collComm)`. `ctx` is NCCL's net plugin
/// context, not ours: never looked at.
///
/// # Safety
/// `handles` is NULL or an array of `nranks` pointers, each NULL or to a 128-byte handle;
/// `coll_comm` is NULL or valid for a write of a pointer.
pub(super) unsafe extern "C" fn connect(
    _ctx: Ptr,
    handles: *mut Ptr,
    nranks: c_int,
    rank: c_int,
    listen_comm: Ptr,
    coll_comm: *mut Ptr,
) -> NcclResult {
    ffi_call("RMA connect", || {
        let n = usize::try_from(nranks)
            .ok()
            .filter(|&n| (1..=rma::MAX_RANKS as usize).contains(&n))
            .ok_or_else(|| {
                NetError::invalid_argument(format!(
                    "RMA connect: nranks {nranks} (Rivet: 1..={})",
                    rma::MAX_RANKS
                ))
            })?;
        if handles.is_null() {
            return Err(NetError::misuse("RMA connect: handles is NULL"));
        }
        // SAFETY: NCCL passes an array of `nranks` handle pointers (checked non-null).
        let ptrs = unsafe { core::slice::from_raw_parts(handles, n) };
        let mut all = Vec::with_capacity(n);
        for (r, &h) in ptrs.iter().enumerate() {
            // SAFETY: each points to a 128-byte handle NCCL gathered (NULL refused).
            let h = unsafe { h.cast::<[u8; NCCL_NET_HANDLE_MAXSIZE]>().as_ref() }
                .ok_or_else(|| NetError::misuse(format!("RMA connect: handle {r} is NULL")))?;
            all.push(*h);
        }
        let comm = rma::connect(all, rank, listen_comm)?;
        // SAFETY: NCCL passes a valid out-pointer (NULL rejected).
        unsafe { put(coll_comm, comm, "RMA connect: collComm") }
    })
}

/// `closeColl`.
///
/// # Safety
/// Handles may be any value: the handle layer checks them.
pub(super) unsafe extern "C" fn close_coll(coll: Ptr) -> NcclResult {
    ffi_call("RMA closeColl", || rma::close_coll(coll))
}

/// `closeListen`.
///
/// # Safety
/// Handles may be any value: the handle layer checks them.
pub(super) unsafe extern "C" fn close_listen(listen: Ptr) -> NcclResult {
    ffi_call("RMA closeListen", || rma::close_listen(listen))
}

// ---- contexts ----

/// `createContext(collComm, config, &rmaCtx)` of v14+.
///
/// # Safety
/// `config` is NULL or points to an `ncclRmaConfig_v14_t`; `rma_ctx` is NULL or valid for a
/// write of a pointer.
pub(super) unsafe extern "C" fn create_context(
    coll: Ptr,
    config: *mut NcclRmaConfigV14,
    rma_ctx: *mut Ptr,
) -> NcclResult {
    ffi_call("createContext", || {
        // SAFETY: as the caller guarantees (NULL refused).
        let c = unsafe { config.as_ref() }
            .ok_or_else(|| NetError::misuse("createContext: config is NULL"))?;
        let ctx = rma::create_context(
            coll,
            ContextConfig {
                contexts: c.n_contexts,
                traffic_class: c.traffic_class,
                rank_stride: c.rank_stride,
            },
        )?;
        // SAFETY: as the caller guarantees (NULL refused).
        unsafe { put(rma_ctx, ctx, "createContext: rmaCtx") }
    })
}

/// `createContext(collComm, config, &ginCtx, &devHandle)` of v13: the device handle says GIN
/// proxy, progress by the proxy.
///
/// # Safety
/// `config` is NULL or points to an `ncclGinConfig_v13_t`; `rma_ctx` and `dev_handle` are NULL
/// or valid for a write of a pointer.
pub(super) unsafe extern "C" fn create_context_v13(
    coll: Ptr,
    config: *mut NcclGinConfigV13,
    rma_ctx: *mut Ptr,
    dev_handle: *mut *mut NcclNetDeviceHandle,
) -> NcclResult {
    ffi_call("createContext", || {
        // SAFETY: as the caller guarantees (NULL refused).
        let c = unsafe { config.as_ref() }
            .ok_or_else(|| NetError::misuse("createContext: config is NULL"))?;
        if dev_handle.is_null() {
            return Err(NetError::misuse("createContext: devHandle is NULL"));
        }
        let ctx = rma::create_context(
            coll,
            ContextConfig {
                contexts: c.n_contexts,
                traffic_class: c.traffic_class,
                rank_stride: 1,
            },
        )?;
        let handle = rma::device_handle(ctx)?;
        // SAFETY: as the caller guarantees (NULL refused).
        unsafe { put(dev_handle, handle, "createContext: devHandle")? };
        // SAFETY: as the caller guarantees (NULL refused).
        unsafe { put(rma_ctx, ctx, "createContext: ginCtx") }
    })
}

/// `destroyContext`.
///
/// # Safety
/// Handles may be any value: the handle layer checks them.
pub(super) unsafe extern "C" fn destroy_context(rma_ctx: Ptr) -> NcclResult {
    ffi_call("destroyContext", || rma::destroy_context(rma_ctx))
}

// ---- windows ----

fn strong(mr_flags: u64) -> bool {
    mr_flags & NCCL_NET_MR_FLAG_FORCE_SO != 0
}

/// `regMrSym(collComm, data, size, type, mrFlags, &mhandle)` of v14+.
///
/// # Safety
/// `mhandle` is NULL or valid for a write of a pointer; `data..data+size` is NCCL's memory.
pub(super) unsafe extern "C" fn reg_mr_sym(
    coll: Ptr,
    data: Ptr,
    size: usize,
    kind: c_int,
    mr_flags: u64,
    mhandle: *mut Ptr,
) -> NcclResult {
    ffi_call("regMrSym", || {
        let mh = rma::reg_mr_sym(coll, data, size, kind, None, strong(mr_flags))?;
        // SAFETY: as the caller guarantees (NULL refused).
        unsafe { put(mhandle, mh, "regMrSym: mhandle") }
    })
}

/// `regMrSymDmaBuf(collComm, data, size, type, offset, fd, mrFlags, &mhandle)` of v14+.
///
/// # Safety
/// As [`reg_mr_sym`]; `fd` is a dma-buf of the memory.
#[allow(clippy::too_many_arguments)] // the C signature
pub(super) unsafe extern "C" fn reg_mr_sym_dma_buf(
    coll: Ptr,
    data: Ptr,
    size: usize,
    kind: c_int,
    offset: u64,
    fd: c_int,
    mr_flags: u64,
    mhandle: *mut Ptr,
) -> NcclResult {
    ffi_call("regMrSymDmaBuf", || {
        let mh = rma::reg_mr_sym(coll, data, size, kind, Some((offset, fd)), strong(mr_flags))?;
        // SAFETY: as the caller guarantees (NULL refused).
        unsafe { put(mhandle, mh, "regMrSymDmaBuf: mhandle") }
    })
}

/// `regMrSym(…, &mhandle, &ginHandle)` of v13: a proxy backend has no GIN handle (NULL).
///
/// # Safety
/// As [`reg_mr_sym`]; `gin_handle` is NULL or valid for a write of a pointer.
#[allow(clippy::too_many_arguments)] // the C signature
pub(super) unsafe extern "C" fn reg_mr_sym_v13(
    coll: Ptr,
    data: Ptr,
    size: usize,
    kind: c_int,
    mr_flags: u64,
    mhandle: *mut Ptr,
    gin_handle: *mut Ptr,
) -> NcclResult {
    if !gin_handle.is_null() {
        // SAFETY: non-null; as the caller guarantees.
        unsafe { gin_handle.write(core::ptr::null_mut()) };
    }
    // SAFETY: the same contract.
    unsafe { reg_mr_sym(coll, data, size, kind, mr_flags, mhandle) }
}

/// `regMrSymDmaBuf(…, &mhandle, &ginHandle)` of v13.
///
/// # Safety
/// As [`reg_mr_sym_dma_buf`]; `gin_handle` is NULL or valid for a write of a pointer.
#[allow(clippy::too_many_arguments)] // the C signature
pub(super) unsafe extern "C" fn reg_mr_sym_dma_buf_v13(
    coll: Ptr,
    data: Ptr,
    size: usize,
    kind: c_int,
    offset: u64,
    fd: c_int,
    mr_flags: u64,
    mhandle: *mut Ptr,
    gin_handle: *mut Ptr,
) -> NcclResult {
    if !gin_handle.is_null() {
        // SAFETY: non-null; as the caller guarantees.
        unsafe { gin_handle.write(core::ptr::null_mut()) };
    }
    // SAFETY: the same contract.
    unsafe { reg_mr_sym_dma_buf(coll, data, size, kind, offset, fd, mr_flags, mhandle) }
}

/// `deregMrSym`.
///
/// # Safety
/// Handles may be any value: the handle layer checks them.
pub(super) unsafe extern "C" fn dereg_mr_sym(coll: Ptr, mhandle: Ptr) -> NcclResult {
    ffi_call("deregMrSym", || rma::dereg_mr_sym(coll, mhandle))
}

// ---- operations ----

/// Issue `op` and write its request, or NULL when it fails.
///
/// # Safety
/// `request` is NULL or valid for a write of a pointer.
unsafe fn issue(
    name: &'static str,
    rma_ctx: Ptr,
    context: c_int,
    rank: u32,
    op: Op,
    request: *mut Ptr,
) -> NcclResult {
    if request.is_null() {
        return ffi_call(name, || {
            Err(NetError::misuse(format!("{name}: request is NULL")))
        });
    }
    // SAFETY: checked non-null; as the caller guarantees. NULL until the operation is issued.
    unsafe { request.write(core::ptr::null_mut()) };
    ffi_call(name, || {
        let r = rma::issue(rma_ctx, context, rank, op)?;
        // SAFETY: as above.
        unsafe { request.write(r) };
        Ok(())
    })
}

/// `iput` of v13 and v14.
///
/// # Safety
/// `request` is NULL or valid for a write of a pointer; handles are checked.
#[allow(clippy::too_many_arguments)] // the C signature
pub(super) unsafe extern "C" fn iput(
    rma_ctx: Ptr,
    context: c_int,
    src_off: u64,
    src: Ptr,
    size: usize,
    dst_off: u64,
    dst: Ptr,
    rank: u32,
    request: *mut Ptr,
) -> NcclResult {
    let op = Op::Put {
        src_off,
        src,
        size: size as u64,
        dst_off,
        dst,
    };
    // SAFETY: the caller's contract.
    unsafe { issue("iput", rma_ctx, context, rank, op, request) }
}

/// `iput` of v15+ (`optFlags`: a hint that changes nothing here).
///
/// # Safety
/// As [`iput`].
#[allow(clippy::too_many_arguments)] // the C signature
pub(super) unsafe extern "C" fn iput_opt(
    rma_ctx: Ptr,
    context: c_int,
    src_off: u64,
    src: Ptr,
    size: usize,
    dst_off: u64,
    dst: Ptr,
    rank: u32,
    _opt_flags: u32,
    request: *mut Ptr,
) -> NcclResult {
    // SAFETY: the caller's contract.
    unsafe {
        iput(
            rma_ctx, context, src_off, src, size, dst_off, dst, rank, request,
        )
    }
}

/// `iputSignal` of v14 (`isStrongSignal`: every Rivet signal is strong).
///
/// # Safety
/// As [`iput`].
#[allow(clippy::too_many_arguments)] // the C signature
pub(super) unsafe extern "C" fn iput_signal(
    rma_ctx: Ptr,
    context: c_int,
    src_off: u64,
    src: Ptr,
    size: usize,
    dst_off: u64,
    dst: Ptr,
    rank: u32,
    signal_off: u64,
    signal: Ptr,
    value: u64,
    op: u32,
    _strong: bool,
    request: *mut Ptr,
) -> NcclResult {
    let op = Op::PutSignal {
        src_off,
        src,
        size: size as u64,
        dst_off,
        dst,
        signal_off,
        signal,
        value,
        op,
    };
    // SAFETY: the caller's contract.
    unsafe { issue("iputSignal", rma_ctx, context, rank, op, request) }
}

/// `iputSignal` of v13 (no strong/weak flag: strong).
///
/// # Safety
/// As [`iput`].
#[allow(clippy::too_many_arguments)] // the C signature
pub(super) unsafe extern "C" fn iput_signal_v13(
    rma_ctx: Ptr,
    context: c_int,
    src_off: u64,
    src: Ptr,
    size: usize,
    dst_off: u64,
    dst: Ptr,
    rank: u32,
    signal_off: u64,
    signal: Ptr,
    value: u64,
    op: u32,
    request: *mut Ptr,
) -> NcclResult {
    // SAFETY: the caller's contract.
    unsafe {
        iput_signal(
            rma_ctx, context, src_off, src, size, dst_off, dst, rank, signal_off, signal, value,
            op, true, request,
        )
    }
}

/// `iputSignal` of v15+.
///
/// # Safety
/// As [`iput`].
#[allow(clippy::too_many_arguments)] // the C signature
pub(super) unsafe extern "C" fn iput_signal_opt(
    rma_ctx: Ptr,
    context: c_int,
    src_off: u64,
    src: Ptr,
    size: usize,
    dst_off: u64,
    dst: Ptr,
    rank: u32,
    signal_off: u64,
    signal: Ptr,
    value: u64,
    op: u32,
    strong: bool,
    _opt_flags: u32,
    request: *mut Ptr,
) -> NcclResult {
    // SAFETY: the caller's contract.
    unsafe {
        iput_signal(
            rma_ctx, context, src_off, src, size, dst_off, dst, rank, signal_off, signal, value,
            op, strong, request,
        )
    }
}

/// `iget` of v13 and v14.
///
/// # Safety
/// As [`iput`].
#[allow(clippy::too_many_arguments)] // the C signature
pub(super) unsafe extern "C" fn iget(
    rma_ctx: Ptr,
    context: c_int,
    remote_off: u64,
    remote: Ptr,
    size: usize,
    local_off: u64,
    local: Ptr,
    rank: u32,
    request: *mut Ptr,
) -> NcclResult {
    let op = Op::Get {
        remote_off,
        remote,
        size: size as u64,
        local_off,
        local,
    };
    // SAFETY: the caller's contract.
    unsafe { issue("iget", rma_ctx, context, rank, op, request) }
}

/// `iget` of v15+.
///
/// # Safety
/// As [`iput`].
#[allow(clippy::too_many_arguments)] // the C signature
pub(super) unsafe extern "C" fn iget_opt(
    rma_ctx: Ptr,
    context: c_int,
    remote_off: u64,
    remote: Ptr,
    size: usize,
    local_off: u64,
    local: Ptr,
    rank: u32,
    _opt_flags: u32,
    request: *mut Ptr,
) -> NcclResult {
    // SAFETY: the caller's contract.
    unsafe {
        iget(
            rma_ctx, context, remote_off, remote, size, local_off, local, rank, request,
        )
    }
}

/// `iflush(rmaCtx, context, mhandle, rank, &request)`.
///
/// # Safety
/// As [`iput`].
pub(super) unsafe extern "C" fn iflush(
    rma_ctx: Ptr,
    context: c_int,
    mhandle: Ptr,
    rank: u32,
    request: *mut Ptr,
) -> NcclResult {
    let op = Op::Flush { window: mhandle };
    // SAFETY: the caller's contract.
    unsafe { issue("RMA iflush", rma_ctx, context, rank, op, request) }
}

/// `test(collComm, request, &done)`.
///
/// # Safety
/// `done` is NULL or valid for a write of an `int`; handles are checked.
pub(super) unsafe extern "C" fn test(coll: Ptr, request: Ptr, done: *mut c_int) -> NcclResult {
    ffi_call("RMA test", || {
        if done.is_null() {
            return Err(NetError::misuse("RMA test: done is NULL"));
        }
        // SAFETY: checked non-null; as the caller guarantees.
        unsafe { done.write(0) };
        let finished = rma::test(coll, request)?;
        // SAFETY: as above.
        unsafe { done.write(c_int::from(finished)) };
        Ok(())
    })
}

/// `rmaProgress(rmaCtx)`.
///
/// # Safety
/// Handles may be any value: the handle layer checks them.
pub(super) unsafe extern "C" fn progress(rma_ctx: Ptr) -> NcclResult {
    ffi_call("rmaProgress", || rma::progress(rma_ctx))
}

/// `queryLastError(rmaCtx, &hasError)`.
///
/// # Safety
/// `has_error` is NULL or valid for a write of a `bool`.
pub(super) unsafe extern "C" fn query_last_error(rma_ctx: Ptr, has_error: *mut bool) -> NcclResult {
    ffi_call("queryLastError", || {
        let e = rma::query_last_error(rma_ctx)?;
        // SAFETY: as the caller guarantees (NULL refused).
        unsafe { put(has_error, e, "queryLastError: hasError") }
    })
}
