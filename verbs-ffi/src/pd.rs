//! Protection domains (`ibv_pd`).
//!
//! Unsafe because it owns a raw `ibv_pd` and frees it exactly once, after every MR and QP on it
//! (which hold an `Arc<ProtectionDomain>`) is gone.
#![allow(unsafe_code)]

use core::ptr::NonNull;
use std::sync::Arc;

use crate::context::Context;
use crate::error::{VerbsError, errno_after_null};
use crate::sys::ibv_pd;

/// A protection domain; MRs and QPs on it keep it (and its context) alive.
#[derive(Debug)]
pub struct ProtectionDomain {
    ptr: NonNull<ibv_pd>,
    context: Arc<Context>,
}

// SAFETY: a PD is an immutable kernel handle; libibverbs allows its use from any thread.
unsafe impl Send for ProtectionDomain {}
// SAFETY: as above.
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    /// `ibv_alloc_pd`.
    pub fn new(context: &Arc<Context>) -> Result<Arc<Self>, VerbsError> {
        // SAFETY: live context.
        let raw = unsafe { (context.verbs().alloc_pd)(context.as_ptr()) };
        let ptr = NonNull::new(raw).ok_or(VerbsError::Call {
            call: "ibv_alloc_pd",
            errno: errno_after_null(),
        })?;
        Ok(Arc::new(Self {
            ptr,
            context: Arc::clone(context),
        }))
    }

    /// The context it belongs to.
    pub fn context(&self) -> &Arc<Context> {
        &self.context
    }

    /// The raw PD; valid while `self` lives.
    pub fn as_ptr(&self) -> *mut ibv_pd {
        self.ptr.as_ptr()
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: MRs and QPs hold an Arc to this PD, so none is left; freed exactly once.
        unsafe { (self.context.verbs().dealloc_pd)(self.ptr.as_ptr()) };
    }
}
