//! Comms and memory registrations as NCCL sees them: opaque handles resolved through registries.

use crate::error::{NetError, NetResult};
use crate::net::{self, NetContext};
use core::ffi::{c_int, c_void};

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

pub(crate) fn listen(
    _ctx: Option<&NetContext>,
    dev: c_int,
    _handle: &mut [u8; 128],
) -> NetResult<Ptr> {
    net::properties(dev)?;
    Err(NetError::system(
        "listen: connections are not implemented yet",
    ))
}

pub(crate) fn connect(
    _ctx: Option<&NetContext>,
    dev: c_int,
    _tc: Option<i32>,
    _handle: &mut [u8; 128],
) -> NetResult<Option<Ptr>> {
    net::properties(dev)?;
    Err(NetError::system(
        "connect: connections are not implemented yet",
    ))
}

fn unknown(call: &str, what: &str, ptr: Ptr) -> NetError {
    if ptr.is_null() {
        NetError::misuse(format!("{call}: {what} is NULL"))
    } else {
        NetError::misuse(format!("{call}: {what} {ptr:p} is not a live Rivet object"))
    }
}

pub(crate) fn accept(listen: Ptr) -> NetResult<Option<Ptr>> {
    Err(unknown("accept", "listenComm", listen))
}
pub(crate) fn reg_mr(
    comm: Ptr,
    _data: Ptr,
    _size: usize,
    _kind: c_int,
    _dmabuf: Option<(u64, c_int)>,
) -> NetResult<Ptr> {
    Err(unknown("regMr", "comm", comm))
}
pub(crate) fn dereg_mr(comm: Ptr, _mh: Ptr) -> NetResult<()> {
    Err(unknown("deregMr", "comm", comm))
}
pub(crate) fn isend(
    comm: Ptr,
    _data: Ptr,
    _size: usize,
    _tag: c_int,
    _mh: Ptr,
) -> NetResult<Option<Ptr>> {
    Err(unknown("isend", "sendComm", comm))
}
pub(crate) fn irecv(comm: Ptr, args: &RecvArgs) -> NetResult<Option<Ptr>> {
    Err(unknown(
        &format!("irecv of {} buffer(s)", args.n),
        "recvComm",
        comm,
    ))
}
pub(crate) fn iflush(comm: Ptr, _n: c_int) -> NetResult<()> {
    Err(unknown("iflush", "recvComm", comm))
}
pub(crate) fn test(request: Ptr) -> NetResult<Option<Finished>> {
    Err(unknown("test", "request", request))
}
pub(crate) fn close_send(comm: Ptr) -> NetResult<()> {
    Err(unknown("closeSend", "sendComm", comm))
}
pub(crate) fn close_recv(comm: Ptr) -> NetResult<()> {
    Err(unknown("closeRecv", "recvComm", comm))
}
pub(crate) fn close_listen(comm: Ptr) -> NetResult<()> {
    Err(unknown("closeListen", "listenComm", comm))
}
