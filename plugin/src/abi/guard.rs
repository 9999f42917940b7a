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
