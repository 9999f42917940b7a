//! Comms and memory registrations as NCCL sees them: objects behind typed handles
//! ([`crate::handle`]), and the entry points the ABI shims call.
//!
//! Bottom to top (each file imports only the ones before it):
//! - [`mr`]: memory registrations and their table.
//! - [`flush`]: a receive comm's GPU flush (`iflush`).
//! - [`path`]: a connection of one queue pair or of several, behind one interface (the traits
//!   and the multi-lane shapes).
//! - [`data`]: established send/receive comms and the data path (isend/irecv/test), with what
//!   only it runs written beside it: the one-thread-at-a-time cell a comm's state lives in
//!   (`data::exclusive`), the single-queue-pair drivers that post what the core decided, and a
//!   registration's range checks.
//! - [`listen`]: listen comms and `accept` (one handshake machine per incoming TCP connection).
//! - [`connect`]: `connect`, resumable across NCCL's polling calls.
//!
//! This file only re-exports them, and joins `regMr`/`deregMr` (a registration) to the comm
//! whose port they use (a data comm), so neither of `mr` and `data` imports the other both ways.

mod connect;
mod data;
#[cfg(feature = "failover")]
mod failover;
mod flush;
mod listen;
mod mr;
#[cfg(test)]
mod multi_device_tests;
mod path;

use crate::backend::OpenPort;
use crate::error::NetResult;
use crate::handle::Ptr;
use core::ffi::c_int;
use std::sync::Arc;

pub(crate) use connect::connect;
pub(crate) use data::RecvArgs;
pub(crate) use data::{close_recv, close_send, iflush, irecv, irecv_one, isend, test};
pub(crate) use flush::FlushArgs;
pub(crate) use listen::{accept, close_listen, listen};

/// `isend`, `irecv` and `test` for Rivet's own users of comms (CollNet), out of line: the C entry
/// points inline the three, and an inlined copy at every internal call site would only grow the
/// library (by ~10 KB when CollNet's five call sites each had one).
#[cfg(feature = "collnet")]
pub(crate) mod internal {
    use crate::comm::data::{self, RecvArgs};
    use crate::error::NetResult;
    use crate::handle::Ptr;
    use core::ffi::c_int;
    use rivet_core::data::{CollectSizes, Completed};

    /// [`isend`](data::isend).
    #[inline(never)]
    pub(crate) fn isend(comm: Ptr, buf: Ptr, size: usize, tag: c_int, mh: Ptr) -> NetResult<Ptr> {
        data::isend(comm, buf, size, tag, mh, None)
    }

    /// [`irecv`](data::irecv).
    #[inline(never)]
    pub(crate) fn irecv(comm: Ptr, args: &RecvArgs) -> NetResult<Ptr> {
        data::irecv(comm, args, None)
    }

    /// [`test`](data::test), the answer as one value.
    #[inline(never)]
    pub(crate) fn test(request: Ptr) -> NetResult<Completed> {
        let mut sizes = CollectSizes::default();
        let done = data::test(request, &mut sizes)?;
        Ok(sizes.completed(done))
    }
}

/// `regMr`/`regMrDmaBuf` on the port of data comm `comm`.
pub(crate) fn reg_mr(
    comm: Ptr,
    data: Ptr,
    size: usize,
    kind: c_int,
    dmabuf: Option<(u64, c_int)>,
) -> NetResult<Ptr> {
    mr::reg_mr_on(
        data::ports_of("regMr", comm)?,
        data,
        size,
        kind,
        dmabuf,
        false,
    )
}

/// `deregMr` of a registration on the port of data comm `comm`.
pub(crate) fn dereg_mr(comm: Ptr, mh: Ptr) -> NetResult<()> {
    mr::dereg_mr(&data::port_of("deregMr", comm)?, mh)
}

/// `regMr` on an opened port rather than through a data comm: a CollNet group registers once for
/// all of its connections (they share the port's protection domain).
#[cfg_attr(not(feature = "collnet"), allow(dead_code))] // only CollNet calls it
pub(crate) fn reg_mr_on_port(
    port: Arc<OpenPort>,
    data: Ptr,
    size: usize,
    kind: c_int,
    dmabuf: Option<(u64, c_int)>,
    strong_order: bool,
) -> NetResult<Ptr> {
    mr::reg_mr(port, data, size, kind, dmabuf, strong_order)
}

/// The local and remote keys of registration `mh` (0 for a zero-length one), for RMA windows
/// whose keys every rank learns.
#[cfg(feature = "rma")]
pub(crate) fn keys_of(call: &str, mh: Ptr) -> NetResult<(u32, u32)> {
    mr::lookup(call, mh).map(|mr| (mr.lkey, mr.rkey))
}

/// `deregMr` of a registration made with [`reg_mr_on_port`].
#[cfg_attr(not(feature = "collnet"), allow(dead_code))] // only CollNet calls it
pub(crate) fn dereg_mr_on_port(port: &Arc<OpenPort>, mh: Ptr) -> NetResult<()> {
    mr::dereg_mr(port, mh)
}

/// Check that `addr .. addr + len` lies inside registration `mh` (CollNet reads and writes
/// registered buffers with the CPU).
#[cfg_attr(not(feature = "collnet"), allow(dead_code))] // only CollNet calls it
pub(crate) fn check_registered(call: &str, mh: Ptr, addr: u64, len: u64) -> NetResult<()> {
    mr::lookup(call, mh)?.lkey_for(addr, len).map(drop)
}
