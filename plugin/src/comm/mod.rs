//! Comms and memory registrations as NCCL sees them: opaque handles resolved through registries,
//! and the entry points the ABI shims call.
//!
//! - [`listen`]: listen comms and `accept` (one handshake machine per incoming TCP connection).
//! - [`connect`]: `connect`, resumable across NCCL's polling calls.
//! - [`data`]: established send/receive comms and the data path (isend/irecv/test).
//! - [`mr`]: memory registrations.

mod connect;
mod data;
mod listen;
mod mr;

use crate::error::{NetError, NetResult};
use crate::handle::Handle;
use core::ffi::{c_int, c_void};

pub(crate) use connect::connect;
pub(crate) use data::local_qp;
pub(crate) use data::{close_recv, close_send, iflush, irecv, isend, test};
pub(crate) use listen::{accept, close_listen, listen};
pub(crate) use mr::{dereg_mr, reg_mr};

type Ptr = *mut c_void;

/// The arguments of one `irecv`, copied out of NCCL's arrays.
#[derive(Debug)]
pub(crate) struct RecvArgs {
    /// Number of buffers (1..=8).
    pub(crate) n: usize,
    /// Buffer addresses.
    pub(crate) data: [Ptr; 8],
    /// Buffer sizes.
    pub(crate) sizes: [usize; 8],
    /// Tags.
    pub(crate) tags: [c_int; 8],
    /// Memory handles from `regMr`.
    pub(crate) mhandles: [Ptr; 8],
}

/// What `test` reports for a finished request.
#[derive(Debug)]
pub(crate) struct Finished {
    /// Number of buffers.
    pub(crate) n: usize,
    /// Bytes per buffer.
    pub(crate) sizes: [u64; 8],
}

/// The error for a handle that is NULL or not a live object of the expected kind.
fn unknown(call: &str, what: &str, ptr: Ptr) -> NetError {
    if ptr.is_null() {
        NetError::misuse(format!("{call}: {what} is NULL"))
    } else {
        NetError::misuse(format!(
            "{call}: {what} {ptr:p} is not a live Rivet object (closed, or never created)"
        ))
    }
}

/// Decode a handle NCCL passed back, or fail naming the call and argument.
fn decode(call: &str, what: &str, ptr: Ptr) -> NetResult<Handle> {
    Handle::from_ptr(ptr).ok_or_else(|| unknown(call, what, ptr))
}
