//! Completion queues (`ibv_cq`) and polling them.
//!
//! Unsafe because it owns a raw `ibv_cq` (destroyed once, after the QPs that use it, which hold an
//! `Arc<CompletionQueue>`) and polls through the provider's `ops.poll_cq` slot: `ibv_poll_cq` is a
//! `static inline` in `verbs.h` with no symbol to `dlsym`.
#![allow(unsafe_code)]

use core::ffi::c_int;
use core::mem::MaybeUninit;
use core::ptr::{self, NonNull};
use std::sync::Arc;

use crate::context::Context;
use crate::error::{VerbsError, errno_after_null};
use crate::sys::{PollCqFn, ibv_cq, ibv_wc};

/// A completion queue; QPs using it keep it alive.
#[derive(Debug)]
pub struct CompletionQueue {
    ptr: NonNull<ibv_cq>,
    context: Arc<Context>,
    poll_cq: PollCqFn,
}

// SAFETY: providers serialise concurrent polls of one CQ internally (libibverbs' threading model);
// the handle itself is immutable.
unsafe impl Send for CompletionQueue {}
// SAFETY: as above.
unsafe impl Sync for CompletionQueue {}

impl CompletionQueue {
    /// `ibv_create_cq` with at least `depth` entries, no completion channel, vector 0.
    pub fn new(context: &Arc<Context>, depth: u32) -> Result<Arc<Self>, VerbsError> {
        let cqe =
            c_int::try_from(depth)
                .ok()
                .filter(|d| *d > 0)
                .ok_or(VerbsError::InvalidArgument {
                    what: "CQ depth must be 1..=i32::MAX",
                })?;
        // SAFETY: live context (ops are filled in by the provider at open and never change).
        let poll_cq =
            unsafe { (*context.as_ptr()).ops.poll_cq }.ok_or(VerbsError::Unsupported {
                what: "ops.poll_cq",
            })?;
        // SAFETY: live context; null cq_context and channel are allowed.
        let raw = unsafe {
            (context.verbs().create_cq)(context.as_ptr(), cqe, ptr::null_mut(), ptr::null_mut(), 0)
        };
        let ptr = NonNull::new(raw).ok_or(VerbsError::Call {
            call: "ibv_create_cq",
            errno: errno_after_null(),
        })?;
        Ok(Arc::new(Self {
            ptr,
            context: Arc::clone(context),
            poll_cq,
        }))
    }

    /// Entries the provider actually allocated (≥ the requested depth).
    pub fn capacity(&self) -> u32 {
        // SAFETY: live CQ; cqe changes only through ibv_resize_cq, which this crate never calls.
        u32::try_from(unsafe { (*self.ptr.as_ptr()).cqe }).unwrap_or(0)
    }

    /// Polls up to `wcs.len()` completions into `wcs` and returns how many were written.
    ///
    /// Does not allocate. Completions with a non-success status are returned like any other; the
    /// caller checks `status`.
    pub fn poll(&self, wcs: &mut [ibv_wc]) -> Result<usize, VerbsError> {
        let n = c_int::try_from(wcs.len()).unwrap_or(c_int::MAX);
        if n == 0 {
            return Ok(0);
        }
        // SAFETY: live CQ of this context's provider; wcs has room for n entries.
        let got = unsafe { (self.poll_cq)(self.ptr.as_ptr(), n, wcs.as_mut_ptr()) };
        // A negative return means the CQ is broken; providers do not set errno for it.
        usize::try_from(got).map_err(|_| VerbsError::Call {
            call: "ibv_poll_cq",
            errno: libc::EIO,
        })
    }

    /// Like [`Self::poll`], into uninitialised entries (no zeroing of an array that is mostly
    /// left unused on the data path); returns the completions polled.
    #[inline]
    pub fn poll_into<'a>(
        &self,
        wcs: &'a mut [MaybeUninit<ibv_wc>],
    ) -> Result<&'a [ibv_wc], VerbsError> {
        self.poll_wcs(wcs).ok_or_else(broken_cq)
    }

    /// [`Self::poll_into`] for the data path: `None` when the CQ is broken (a negative return;
    /// providers do not set errno for it). Two words where a `Result` with a [`VerbsError`]
    /// would be three, kept in registers by the caller.
    #[inline(always)]
    pub fn poll_wcs<'a>(&self, wcs: &'a mut [MaybeUninit<ibv_wc>]) -> Option<&'a [ibv_wc]> {
        let n = c_int::try_from(wcs.len()).unwrap_or(c_int::MAX);
        if n == 0 {
            return Some(&[]);
        }
        // SAFETY: live CQ of this context's provider; wcs has room for n entries
        // (`MaybeUninit<ibv_wc>` has `ibv_wc`'s layout).
        let got = unsafe { (self.poll_cq)(self.ptr.as_ptr(), n, wcs.as_mut_ptr().cast()) };
        let got = usize::try_from(got).ok()?.min(wcs.len());
        // SAFETY: ibv_poll_cq wrote the first `got` entries.
        Some(unsafe { &*(ptr::from_ref(&wcs[..got]) as *const [ibv_wc]) })
    }

    /// The context it belongs to.
    pub fn context(&self) -> &Arc<Context> {
        &self.context
    }

    /// The raw CQ (for mlx5dv); valid while `self` lives.
    pub fn as_ptr(&self) -> *mut ibv_cq {
        self.ptr.as_ptr()
    }
}

/// The error of a negative `ibv_poll_cq` return (out of line: the data path inlines the poll).
#[cold]
#[inline(never)]
fn broken_cq() -> VerbsError {
    VerbsError::Call {
        call: "ibv_poll_cq",
        errno: libc::EIO,
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: every QP using this CQ holds an Arc to it, so none is left; destroyed exactly once.
        unsafe { (self.context.verbs().destroy_cq)(self.ptr.as_ptr()) };
    }
}
