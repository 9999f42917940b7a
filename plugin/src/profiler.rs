//! NCCL profiler events for network work (ABI v10+), in the layout NCCL's IB transport uses, so
//! profiler plugins that decode IB events (`NCCL_PROFILER_NET_TYPE_IB`, descriptor version 1)
//! show Rivet's traffic.
//!
//! Unsafe: calls NCCL's profiler callback, a C function pointer, with pointers to an event
//! handle and a descriptor that live for the duration of the call.
//!
//! As NCCL's IB transport does, each work request gets a start event when it is posted (with the
//! `pHandle` NCCL passed to `isend`/`irecv`) and a stop event when `test` reports the request
//! done. Rivet writes one RDMA WRITE WITH IMMEDIATE per send and completes each receive with it,
//! so there is one event per send and one per receive buffer. `device` is the index within the
//! comm's devices, always 0 (Rivet does not fuse NICs), as NCCL reports for a single-NIC comm.
//!
//! The callback `init` received is kept by the entry points (`abi/shims.rs`: `set_profiler`,
//! `profiler_callback`), which branch on it; this module builds and reports the events. Built
//! without the `profiler` feature, the callback is ignored and reads as a constant `None`, so the
//! data path's call sites are unchanged and carry no event code.
//!
//! Cost when no profiler is attached: the shims load the callback once (one relaxed atomic load)
//! and branch on it; nothing else runs. With a profiler the open events of live requests are kept
//! in a table behind a mutex (the profiler itself allocates and locks per event too).

#![allow(unsafe_code)]

use core::ffi::{c_int, c_void};
use std::sync::Mutex;

use crate::sys::NcclResult;

/// `NCCL_PROFILER_NET_TYPE_IB` (`1 << NCCL_PROFILER_NET_VER_BITS`, 16 bits of version).
pub(crate) const NET_TYPE_IB: i64 = 1 << 16;
/// `NCCL_PROFILER_NET_IB_VER`.
pub(crate) const NET_IB_VER: i64 = 1;
/// `ncclProfileQp`: the descriptor's `type`.
pub(crate) const PROFILE_QP: u8 = 1;
/// `ncclProfilerNetEventStart`.
const EVENT_START: c_int = 0;
/// `ncclProfilerNetEventStop`.
const EVENT_STOP: c_int = 1;
/// `IBV_WR_RDMA_WRITE_WITH_IMM`: what a send posts.
pub(crate) const OPCODE_SEND: i32 = 1;
/// `IBV_WC_RECV_RDMA_WITH_IMM`: what completes a receive.
pub(crate) const OPCODE_RECV: i32 = 129;

/// The `qp` member of `ncclProfilerNetIbDescr_v1_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct QpDescr {
    pub(crate) device: c_int,
    pub(crate) wr_id: u64,
    pub(crate) opcode: c_int,
    pub(crate) qp_num: c_int,
    pub(crate) length: usize,
}

/// `ncclProfilerNetIbDescr_v1_t` (its union has the one `qp` member).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct NetIbDescr {
    pub(crate) kind: u8,
    pub(crate) qp: QpDescr,
}

const _: () = {
    assert!(size_of::<QpDescr>() == 32);
    assert!(core::mem::offset_of!(QpDescr, wr_id) == 8);
    assert!(core::mem::offset_of!(QpDescr, opcode) == 16);
    assert!(core::mem::offset_of!(QpDescr, qp_num) == 20);
    assert!(core::mem::offset_of!(QpDescr, length) == 24);
    assert!(size_of::<NetIbDescr>() == 40);
    assert!(align_of::<NetIbDescr>() == 8);
    assert!(core::mem::offset_of!(NetIbDescr, qp) == 8);
};

pub(crate) type Callback =
    unsafe extern "C" fn(*mut *mut c_void, c_int, *mut c_void, i64, *mut c_void) -> NcclResult;

/// Open events: `(request, event handle)`.
static OPEN: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

/// Start one QP event for `request` under NCCL's `p_handle` (skipped when NULL, as NCCL does).
pub(crate) fn start(
    callback: Callback,
    p_handle: *mut c_void,
    request: *mut c_void,
    qp_num: u32,
    opcode: i32,
    length: usize,
) {
    if p_handle.is_null() || request.is_null() {
        return;
    }
    let mut descr = NetIbDescr {
        kind: PROFILE_QP,
        qp: QpDescr {
            device: 0,
            wr_id: request as u64,
            opcode,
            qp_num: c_int::try_from(qp_num).unwrap_or(c_int::MAX),
            length,
        },
    };
    let mut handle: *mut c_void = core::ptr::null_mut();
    // SAFETY: NCCL's callback takes an out-pointer for the event handle and a descriptor it
    // copies before returning; both live on this stack frame for the call.
    let rc = unsafe {
        callback(
            &mut handle,
            EVENT_START,
            p_handle,
            NET_TYPE_IB | NET_IB_VER,
            (&raw mut descr).cast(),
        )
    };
    if rc == 0 && !handle.is_null() {
        if let Ok(mut open) = OPEN.lock() {
            open.push((request as usize, handle as usize));
        }
    }
}

/// Stop every event of a request `test` reported done.
pub(crate) fn stop(callback: Callback, request: *mut c_void) {
    let Ok(mut open) = OPEN.lock() else {
        return;
    };
    let mut i = 0;
    while i < open.len() {
        if open[i].0 == request as usize {
            let (_, handle) = open.swap_remove(i);
            let mut handle = handle as *mut c_void;
            // SAFETY: `handle` is the event handle the callback returned at start.
            let _ = unsafe {
                callback(
                    &mut handle,
                    EVENT_STOP,
                    core::ptr::null_mut(),
                    0,
                    core::ptr::null_mut(),
                )
            };
        } else {
            i += 1;
        }
    }
}

/// After `isend` (v10+): start the send's event when it was accepted.
///
/// # Safety
/// `request` must be NULL or the out-pointer `isend` wrote.
pub(crate) unsafe fn on_isend(
    callback: Callback,
    rc: NcclResult,
    comm: *mut c_void,
    p_handle: *mut c_void,
    request: *mut *mut c_void,
    size: usize,
) {
    if rc != 0 || request.is_null() {
        return;
    }
    // SAFETY: per the contract above.
    let req = unsafe { request.read() };
    if let Some(qp) = crate::comm::local_qp(comm) {
        start(callback, p_handle, req, qp, OPCODE_SEND, size);
    }
}

/// After `irecv` (v10+): one event per receive buffer, under that buffer's `pHandle`.
///
/// # Safety
/// `p_handles` and `sizes` must be NULL or hold `n` elements; `request` as for [`on_isend`].
pub(crate) unsafe fn on_irecv(
    callback: Callback,
    rc: NcclResult,
    comm: *mut c_void,
    n: c_int,
    p_handles: *mut *mut c_void,
    sizes: *mut usize,
    request: *mut *mut c_void,
) {
    if rc != 0 || request.is_null() || p_handles.is_null() || sizes.is_null() {
        return;
    }
    // SAFETY: per the contract above.
    let req = unsafe { request.read() };
    let Some(qp) = crate::comm::local_qp(comm) else {
        return;
    };
    for i in 0..usize::try_from(n).unwrap_or(0) {
        // SAFETY: both arrays hold `n` elements.
        let (p_handle, size) = unsafe { (p_handles.add(i).read(), sizes.add(i).read()) };
        start(callback, p_handle, req, qp, OPCODE_RECV, size);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::sync::atomic::{AtomicI64, Ordering};

    static STARTED_LEN: AtomicI64 = AtomicI64::new(0);
    static STOPPED: AtomicI64 = AtomicI64::new(0);
    static HANDLE: u8 = 0;

    /// A profiler callback that records what the plugin reports.
    ///
    /// # Safety
    /// `ext` points to a `NetIbDescr` for a start event; `e_handle` is valid for a read and a
    /// write of a pointer, as the plugin's own `start`/`stop` pass them.
    unsafe extern "C" fn recorder(
        e_handle: *mut *mut c_void,
        kind: c_int,
        p_handle: *mut c_void,
        plugin_id: i64,
        ext: *mut c_void,
    ) -> NcclResult {
        if kind == EVENT_START {
            // SAFETY: `start` passes a valid descriptor.
            let d = unsafe { &*ext.cast::<NetIbDescr>() };
            assert_eq!(plugin_id, 0x1_0001);
            assert!(!p_handle.is_null());
            assert_eq!(
                (d.kind, d.qp.device, d.qp.opcode, d.qp.qp_num),
                (1, 0, OPCODE_SEND, 17)
            );
            STARTED_LEN.fetch_add(d.qp.length as i64, Ordering::Relaxed);
            // SAFETY: out-pointer from `start`.
            unsafe { e_handle.write((&raw const HANDLE).cast_mut().cast()) };
        } else {
            assert_eq!(kind, EVENT_STOP);
            // SAFETY: handle pointer from `stop`.
            let handle = unsafe { e_handle.read() };
            assert_eq!(handle, (&raw const HANDLE).cast_mut().cast());
            STOPPED.fetch_add(1, Ordering::Relaxed);
        }
        0
    }

    #[test]
    fn start_then_stop_pairs_events_per_request() {
        let request = 0x1234usize as *mut c_void;
        let other = 0x5678usize as *mut c_void;
        let p_handle = 0x99usize as *mut c_void;
        start(recorder, p_handle, request, 17, OPCODE_SEND, 4096);
        start(recorder, p_handle, other, 17, OPCODE_SEND, 1);
        // No pHandle: NCCL did not ask for this request's events.
        start(recorder, core::ptr::null_mut(), request, 17, OPCODE_SEND, 7);
        assert_eq!(STARTED_LEN.load(Ordering::Relaxed), 4097);
        stop(recorder, request);
        assert_eq!(STOPPED.load(Ordering::Relaxed), 1);
        stop(recorder, request);
        assert_eq!(
            STOPPED.load(Ordering::Relaxed),
            1,
            "a request's events stop once"
        );
        stop(recorder, other);
        assert_eq!(STOPPED.load(Ordering::Relaxed), 2);
    }
}
