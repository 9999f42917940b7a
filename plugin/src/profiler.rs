//! NCCL profiler events for network work (ABI v10+), in the layout NCCL's IB transport uses, so
//! profiler plugins that decode IB events (`NCCL_PROFILER_NET_TYPE_IB`, descriptor version 1)
//! show Rivet's traffic.
//!
//! Unsafe: calls NCCL's profiler callback, a C function pointer, with pointers to an event
//! handle and a descriptor that live for the duration of the call, and reads NCCL's array of
//! `pHandle`s.
//!
//! As NCCL's IB transport does, each work request gets a start event when it is posted (with the
//! `pHandle` NCCL passed to `isend`/`irecv`) and a stop event when `test` reports the request
//! done. Rivet writes one RDMA WRITE WITH IMMEDIATE per send and completes each receive with it,
//! so there is one event per send and one per receive buffer. `device` is the index within the
//! comm's devices, always 0, as NCCL reports for a single-NIC comm.
//!
//! **Events live with their request's comm** ([`Events`], in the comm's state, under the comm's
//! one-thread cell): no table is shared between comms or threads, and no lock is taken. NCCL
//! always passes its callback to `init` and a non-NULL `pHandle` for every request; without a
//! profiler plugin its callback returns without an event handle (NCCL's `ncclProfilerCallback`
//! does nothing when no profiler is loaded). So a comm asks the callback at its first post, and
//! when no handle comes back it lets the next [`PROBE_EVERY`] posts pass without asking (a
//! decrement and a branch each) before it asks again; `test` costs one branch on the comm's open
//! events (none). With a profiler that returns handles, every post asks and a request's handles
//! are kept beside its id in its comm until `test` reports it done; after
//! `MISSES_BEFORE_QUIET` posts in a row without a handle the comm goes back to asking every
//! [`PROBE_EVERY`] posts. The price: a profiler that starts recording a comm's network events in
//! the middle of a run misses at most that comm's next [`PROBE_EVERY`] requests.
//!
//! The callback `init` received is kept by the entry points (`abi/shims.rs`: `set_profiler`,
//! `profiler_callback`), which pass it down with the `pHandle`s ([`Starts`]). Built without the
//! `profiler` feature, the callback reads as a constant `None`: nothing is passed, nothing starts.

#![allow(unsafe_code)]
// Without the `profiler` feature the descriptor and its constants are never built.
#![cfg_attr(not(feature = "profiler"), allow(dead_code))]

use core::ffi::{c_int, c_void};

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

/// What a post passes down for its start events: NCCL's callback and its `pHandle` array.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Starts {
    callback: Callback,
    p_handles: *const *mut c_void,
}

impl Starts {
    /// The start events of a post NCCL made with `callback` and `p_handles` (one per buffer);
    /// `None` when NCCL passed no array.
    ///
    /// # Safety
    /// `p_handles` must be NULL or hold as many readable elements as the post has buffers, for
    /// as long as the post's call lasts.
    #[inline(always)]
    pub(crate) unsafe fn new(callback: Callback, p_handles: *const *mut c_void) -> Option<Self> {
        (!p_handles.is_null()).then_some(Self {
            callback,
            p_handles,
        })
    }
}

/// A comm's open events: `(request id, event handle)`, and the callback to stop them with.
/// Empty (no allocation) until a profiler returns a handle.
#[cfg(feature = "profiler")]
#[derive(Debug)]
pub(crate) struct Events {
    open: Vec<(u32, usize)>,
    callback: Option<Callback>,
    /// Posts until the one that asks the callback, that one counted: 1 asks at the next post.
    /// Set to [`PROBE_EVERY`] + 1 when the callback gave no handle, to 1 after every other
    /// start. Never 0 between posts (a start always sets it), so the countdown never wraps.
    until_ask: u32,
    /// Posts in a row whose start gave no handle while the profiler was giving them.
    misses: u32,
}

/// How many posts of a comm pass without a start event after the callback returned no handle
/// (no profiler plugin, or one that does not record network events for this comm): NCCL's
/// callback then does nothing, so asking it at every post would only cost. A profiler that
/// starts recording later is asked again within this many posts.
#[cfg(feature = "profiler")]
pub(crate) const PROBE_EVERY: u32 = 1024;
/// Starts in a row without a handle after which a comm whose profiler gave handles goes back to
/// asking every [`PROBE_EVERY`] posts.
#[cfg(feature = "profiler")]
const MISSES_BEFORE_QUIET: u32 = 64;

/// Without the `profiler` feature no event ever starts: nothing to keep, and `test`'s question
/// is a constant.
#[cfg(not(feature = "profiler"))]
#[derive(Debug)]
pub(crate) struct Events;

#[cfg(not(feature = "profiler"))]
impl Events {
    pub(crate) const fn new() -> Self {
        Self
    }

    #[inline(always)]
    pub(crate) fn is_empty(&self) -> bool {
        true
    }

    #[inline(always)]
    pub(crate) fn due(&mut self) -> bool {
        false
    }

    #[inline(always)]
    pub(crate) fn start(&mut self, _: Starts, _: *mut c_void, _: u32, _: u32, _: i32, _: &[usize]) {
    }

    #[inline(always)]
    pub(crate) fn stop(&mut self, _: u32) {}
}

#[cfg(feature = "profiler")]
impl Events {
    /// None open, asking the callback at the next post.
    pub(crate) const fn new() -> Self {
        Self {
            open: Vec::new(),
            callback: None,
            until_ask: 1,
            misses: 0,
        }
    }

    /// No events open: what `test` asks before looking for its request's events.
    #[inline(always)]
    pub(crate) fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// Whether this post asks the callback for its start events (see [`PROBE_EVERY`]): a
    /// decrement and a branch on zero (two instructions on x86-64), whether quiet or not.
    #[inline(always)]
    pub(crate) fn due(&mut self) -> bool {
        self.until_ask = self.until_ask.wrapping_sub(1);
        self.until_ask == 0
    }

    /// Start one event per buffer of the request `id` (NCCL's handle `request`), posted on queue
    /// pair `qp_num` with `opcode`, buffer `i` of `sizes[i]` bytes under `starts`' `pHandle[i]`
    /// (skipped when that is NULL, as NCCL does).
    #[inline(never)]
    pub(crate) fn start(
        &mut self,
        starts: Starts,
        request: *mut c_void,
        id: u32,
        qp_num: u32,
        opcode: i32,
        sizes: &[usize],
    ) {
        // The next post asks again, unless a start below lets the comm go quiet.
        self.until_ask = 1;
        for (i, &length) in sizes.iter().enumerate() {
            // SAFETY: `Starts::new`'s caller promised one element per buffer.
            let p_handle = unsafe { starts.p_handles.add(i).read() };
            if p_handle.is_null() {
                continue;
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
            // SAFETY: NCCL's callback takes an out-pointer for the event handle and a descriptor
            // it copies before returning; both live on this stack frame for the call.
            let rc = unsafe {
                (starts.callback)(
                    &mut handle,
                    EVENT_START,
                    p_handle,
                    NET_TYPE_IB | NET_IB_VER,
                    (&raw mut descr).cast(),
                )
            };
            if rc == 0 && !handle.is_null() {
                self.open.push((id, handle as usize));
                self.callback = Some(starts.callback);
                self.misses = 0;
            } else if self.callback.is_none() || self.misses >= MISSES_BEFORE_QUIET {
                // No profiler records this comm's network events (or none does any more); the
                // misses stay counted, so a later probe that misses too goes quiet at once.
                self.until_ask = PROBE_EVERY + 1;
                self.misses = MISSES_BEFORE_QUIET;
            } else {
                self.misses += 1;
            }
        }
    }

    /// Stop every event of request `id`, which `test` reported done.
    #[cold]
    #[inline(never)]
    pub(crate) fn stop(&mut self, id: u32) {
        let Some(callback) = self.callback else {
            return;
        };
        let mut i = 0;
        while i < self.open.len() {
            if self.open[i].0 == id {
                let (_, handle) = self.open.swap_remove(i);
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
}

#[cfg(all(test, feature = "profiler"))]
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
        let p_handles = [0x99usize as *mut c_void, core::ptr::null_mut()];
        let mut events = Events::new();
        assert!(events.is_empty());
        // SAFETY: two elements, as many as the sizes below.
        let starts = unsafe { Starts::new(recorder, p_handles.as_ptr()) }.unwrap();
        // The second buffer has no pHandle: NCCL did not ask for its event.
        events.start(starts, request, 1, 17, OPCODE_SEND, &[4096, 7]);
        events.start(starts, other, 2, 17, OPCODE_SEND, &[1]);
        assert_eq!(STARTED_LEN.load(Ordering::Relaxed), 4097);
        assert!(!events.is_empty());
        events.stop(1);
        assert_eq!(STOPPED.load(Ordering::Relaxed), 1);
        events.stop(1);
        assert_eq!(
            STOPPED.load(Ordering::Relaxed),
            1,
            "a request's events stop once"
        );
        events.stop(2);
        assert_eq!(STOPPED.load(Ordering::Relaxed), 2);
        assert!(events.is_empty());
        // SAFETY: NULL: no array.
        assert!(unsafe { Starts::new(recorder, core::ptr::null()) }.is_none());
    }

    /// NCCL's callback without a profiler plugin: returns at once, no handle.
    ///
    /// # Safety
    /// Reads and writes nothing: any arguments.
    unsafe extern "C" fn no_profiler(
        _: *mut *mut c_void,
        _: c_int,
        _: *mut c_void,
        _: i64,
        _: *mut c_void,
    ) -> NcclResult {
        0
    }

    #[test]
    fn without_a_profiler_nothing_is_kept() {
        let mut events = Events::new();
        let p_handles = [0x99usize as *mut c_void];
        // SAFETY: one element.
        let starts = unsafe { Starts::new(no_profiler, p_handles.as_ptr()) }.unwrap();
        events.start(starts, 0x10usize as *mut c_void, 3, 5, OPCODE_RECV, &[8]);
        assert!(
            events.is_empty(),
            "no handle came back: test has nothing to stop"
        );
        assert_eq!(events.open.capacity(), 0, "and nothing was allocated");
        // The next PROBE_EVERY posts do not ask; the one after asks again.
        for _ in 0..PROBE_EVERY {
            assert!(!events.due());
        }
        assert!(events.due());
    }

    /// A profiler that gives every start a handle and counts nothing.
    ///
    /// # Safety
    /// `e_handle` is valid for a write of a pointer at a start, as `Events::start` passes it.
    unsafe extern "C" fn gives_handles(
        e_handle: *mut *mut c_void,
        kind: c_int,
        _: *mut c_void,
        _: i64,
        _: *mut c_void,
    ) -> NcclResult {
        if kind == EVENT_START {
            // SAFETY: out-pointer from `start`.
            unsafe { e_handle.write((&raw const HANDLE).cast_mut().cast()) };
        }
        0
    }

    #[test]
    fn a_profiler_that_gives_handles_is_asked_at_every_post() {
        let mut events = Events::new();
        let p_handles = [0x99usize as *mut c_void];
        // SAFETY: one element.
        let starts = unsafe { Starts::new(gives_handles, p_handles.as_ptr()) }.unwrap();
        for id in 0..3000 {
            assert!(events.due(), "post {id} asks");
            events.start(starts, 0x20usize as *mut c_void, id, 17, OPCODE_SEND, &[1]);
        }
        assert_eq!(events.open.len(), 3000);
        // It stops giving handles (its mask changed): after a few misses the comm goes quiet.
        // SAFETY: one element.
        let quiet = unsafe { Starts::new(no_profiler, p_handles.as_ptr()) }.unwrap();
        let mut asked = 0;
        for id in 0..2 * PROBE_EVERY {
            if events.due() {
                asked += 1;
                events.start(quiet, 0x20usize as *mut c_void, id, 17, OPCODE_SEND, &[1]);
            }
        }
        // MISSES_BEFORE_QUIET + 1 in a row, then one probe per PROBE_EVERY posts.
        assert_eq!(asked, MISSES_BEFORE_QUIET + 1 + 1, "asked {asked} times");
    }
}
