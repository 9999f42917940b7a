//! An open device (`ibv_context`): queries and async events.
//!
//! Unsafe because it calls libibverbs through function pointers on a raw context that this type
//! owns and closes exactly once, after every child object (which hold an `Arc<Context>`) is gone.
#![allow(unsafe_code)]

use core::ffi::c_int;
use core::ptr::NonNull;
use std::os::fd::RawFd;
use std::sync::Arc;

use crate::error::{VerbsError, check, errno_after_null, last_errno};
use crate::loader::Verbs;
use crate::sys::{
    event_type, ibv_async_event, ibv_context, ibv_device, ibv_device_attr, ibv_gid, ibv_gid_entry,
    ibv_port_attr,
};

/// `verbs_context.query_port`: `int (*)(ctx, uint8_t port, struct ibv_port_attr *, size_t len)`.
type QueryPortExFn = unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, usize) -> c_int;
/// Bytes from an `ibv_context` back to `verbs_context.sz` (reference §0; same in v44 and HEAD).
const VERBS_CONTEXT_SZ_BACK: usize = 8;
/// Bytes from an `ibv_context` back to `verbs_context.query_port`.
const VERBS_CONTEXT_QUERY_PORT_BACK: usize = 320;
/// `sizeof(ibv_context) + 320`: the smallest `sz` whose verbs_context contains `query_port`.
const VERBS_CONTEXT_MIN_SZ_FOR_QUERY_PORT: usize = 648;
const _: () = assert!(
    VERBS_CONTEXT_MIN_SZ_FOR_QUERY_PORT == size_of::<ibv_context>() + VERBS_CONTEXT_QUERY_PORT_BACK
);

/// An open RDMA device. Shared with `Arc` by the PDs and CQs created on it; closed when the last one
/// goes.
#[derive(Debug)]
pub struct Context {
    verbs: &'static Verbs,
    ptr: NonNull<ibv_context>,
    name: String,
}

// SAFETY: libibverbs contexts are thread-safe (the library and providers lock internally); this type
// only hands out shared access.
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl Context {
    pub(crate) fn open(
        verbs: &'static Verbs,
        device: NonNull<ibv_device>,
        name: String,
    ) -> Result<Arc<Self>, VerbsError> {
        // SAFETY: device is a live entry of a device list borrowed by the caller.
        let raw = unsafe { (verbs.open_device)(device.as_ptr()) };
        let ptr = NonNull::new(raw).ok_or(VerbsError::Call {
            call: "ibv_open_device",
            errno: errno_after_null(),
        })?;
        let context = Self { verbs, ptr, name };
        context.set_async_nonblocking()?;
        Ok(Arc::new(context))
    }

    fn set_async_nonblocking(&self) -> Result<(), VerbsError> {
        let fd = self.async_fd();
        // SAFETY: fcntl on a descriptor owned by the open context; F_GETFL takes no argument.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 {
            return Err(VerbsError::Call {
                call: "fcntl(F_GETFL)",
                errno: last_errno(),
            });
        }
        // SAFETY: as above; F_SETFL takes an int.
        if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(VerbsError::Call {
                call: "fcntl(F_SETFL)",
                errno: last_errno(),
            });
        }
        Ok(())
    }

    /// The device name it was opened from.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The raw context (for mlx5dv calls); valid while `self` lives.
    pub fn as_ptr(&self) -> *mut ibv_context {
        self.ptr.as_ptr()
    }

    /// The libibverbs table this context was opened with.
    pub fn verbs(&self) -> &'static Verbs {
        self.verbs
    }

    /// The async-event file descriptor (non-blocking), for `poll(2)`/epoll.
    pub fn async_fd(&self) -> RawFd {
        // SAFETY: the context is live; async_fd is set at open and never changes.
        unsafe { (*self.ptr.as_ptr()).async_fd }
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> Result<ibv_device_attr, VerbsError> {
        let mut attr = ibv_device_attr::default();
        // SAFETY: live context, valid out-pointer of the C struct's size.
        check("ibv_query_device", unsafe {
            (self.verbs.query_device)(self.ptr.as_ptr(), &mut attr)
        })?;
        Ok(attr)
    }

    /// `ibv_query_port` (compat symbol): bytes `0..48` are filled, `port_cap_flags2` and
    /// `active_speed_ex` stay 0.
    pub fn query_port(&self, port: u8) -> Result<ibv_port_attr, VerbsError> {
        if port == 0 {
            return Err(VerbsError::InvalidArgument {
                what: "port numbers start at 1",
            });
        }
        // Zeroed first: the compat symbol writes only the first 48 bytes.
        let mut attr = ibv_port_attr::default();
        // SAFETY: live context; the buffer is 56 bytes, larger than the 48 the symbol writes.
        check("ibv_query_port", unsafe {
            (self.verbs.query_port)(self.ptr.as_ptr(), port, &mut attr)
        })?;
        Ok(attr)
    }

    /// Port attributes including the fields the compat symbol leaves out (`port_cap_flags2`,
    /// `active_speed_ex`), the way `verbs.h`'s inline `ibv_query_port` gets them: through the
    /// extended `verbs_context.query_port` op. Falls back to [`Self::query_port`] when the context is
    /// not extended or the op is absent.
    pub fn query_port_ex(&self, port: u8) -> Result<ibv_port_attr, VerbsError> {
        let Some(query) = self.extended_query_port() else {
            return self.query_port(port);
        };
        if port == 0 {
            return Err(VerbsError::InvalidArgument {
                what: "port numbers start at 1",
            });
        }
        let mut attr = ibv_port_attr::default();
        // SAFETY: live context; the library clears `len` bytes and lets the provider fill at most
        // min(len, its own struct size) of them, so a 56-byte buffer is always large enough.
        let ret = unsafe {
            query(
                self.ptr.as_ptr(),
                port,
                &mut attr,
                size_of::<ibv_port_attr>(),
            )
        };
        check("ibv_query_port", ret)?;
        Ok(attr)
    }

    /// `verbs_get_ctx_op(ctx, query_port)`: the extended op, if this context has it.
    fn extended_query_port(&self) -> Option<QueryPortExFn> {
        let ctx = self.ptr.as_ptr();
        // SAFETY: live context; abi_compat is set at open.
        let abi_compat = unsafe { (*ctx).abi_compat };
        if abi_compat as usize != usize::MAX {
            return None;
        }
        let base = ctx.cast::<u8>();
        // SAFETY: abi_compat == UINTPTR_MAX means the context is the last member of a
        // `struct verbs_context`, whose `size_t sz` sits right before it; the allocation covers it.
        let sz = unsafe { base.sub(VERBS_CONTEXT_SZ_BACK).cast::<usize>().read() };
        if sz < VERBS_CONTEXT_MIN_SZ_FOR_QUERY_PORT {
            return None;
        }
        // SAFETY: sz says the (backwards-growing) verbs_context reaches the query_port slot, a
        // pointer-aligned function pointer (or NULL) at a fixed distance before the context.
        unsafe {
            base.sub(VERBS_CONTEXT_QUERY_PORT_BACK)
                .cast::<Option<QueryPortExFn>>()
                .read()
        }
    }

    /// `ibv_query_gid`. An empty table entry is returned as an all-zero GID.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<ibv_gid, VerbsError> {
        let index = c_int::try_from(index).map_err(|_| VerbsError::InvalidArgument {
            what: "GID index > i32::MAX",
        })?;
        let mut gid = ibv_gid::default();
        // SAFETY: live context, valid out-pointer.
        check("ibv_query_gid", unsafe {
            (self.verbs.query_gid)(self.ptr.as_ptr(), port, index, &mut gid)
        })?;
        Ok(gid)
    }

    /// `_ibv_query_gid_ex`: the GID with its type (IB / RoCE v1 / RoCE v2).
    ///
    /// `Err(Unsupported)` when the library predates rdma-core v32; `Err(Call{errno: ENODATA})` for an
    /// empty entry.
    pub fn query_gid_ex(&self, port: u8, index: u32) -> Result<ibv_gid_entry, VerbsError> {
        let query = self.verbs.query_gid_ex.ok_or(VerbsError::Unsupported {
            what: "_ibv_query_gid_ex",
        })?;
        let mut entry = ibv_gid_entry::default();
        // SAFETY: live context, valid out-pointer whose size is passed as entry_size; flags must be 0.
        let ret = unsafe {
            query(
                self.ptr.as_ptr(),
                u32::from(port),
                index,
                &mut entry,
                0,
                size_of::<ibv_gid_entry>(),
            )
        };
        check("_ibv_query_gid_ex", ret)?;
        Ok(entry)
    }

    /// The next pending async event, or `None` when none is pending (never blocks).
    ///
    /// The event is acknowledged when the returned value is dropped (or by [`AsyncEvent::ack`]);
    /// destroying the object it names waits for that acknowledgement.
    pub fn get_async_event(&self) -> Result<Option<AsyncEvent<'_>>, VerbsError> {
        let mut raw = ibv_async_event::default();
        // SAFETY: live context whose async fd is non-blocking, so this returns at once; valid out-pointer.
        let ret = unsafe { (self.verbs.get_async_event)(self.ptr.as_ptr(), &mut raw) };
        if ret == 0 {
            return Ok(Some(AsyncEvent {
                context: self,
                raw,
                acked: false,
            }));
        }
        match last_errno() {
            libc::EAGAIN | libc::EINTR => Ok(None),
            errno => Err(VerbsError::Call {
                call: "ibv_get_async_event",
                errno,
            }),
        }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every PD/CQ/QP/MR holds an Arc to this context (directly or through its parent), so
        // none is left; the context is closed exactly once. A failure cannot be reported from Drop.
        unsafe { (self.verbs.close_device)(self.ptr.as_ptr()) };
    }
}

/// One async event from [`Context::get_async_event`]; acknowledged on drop.
#[derive(Debug)]
pub struct AsyncEvent<'ctx> {
    context: &'ctx Context,
    raw: ibv_async_event,
    acked: bool,
}

impl AsyncEvent<'_> {
    /// [`crate::sys::event_type`] value.
    pub fn event_type(&self) -> u32 {
        self.raw.event_type
    }

    /// The library's name for the event type, e.g. `"local work queue catastrophic error"`.
    pub fn name(&self) -> &'static str {
        self.context.verbs.event_type_name(self.raw.event_type)
    }

    /// Whether the event means the device, a QP or a CQ can no longer be used.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self.raw.event_type,
            event_type::DEVICE_FATAL
                | event_type::CQ_ERR
                | event_type::QP_FATAL
                | event_type::QP_REQ_ERR
                | event_type::QP_ACCESS_ERR
                | event_type::WQ_FATAL
        )
    }

    /// The QP number, for QP events.
    pub fn qp_num(&self) -> Option<u32> {
        match self.raw.event_type {
            event_type::QP_FATAL
            | event_type::QP_REQ_ERR
            | event_type::QP_ACCESS_ERR
            | event_type::COMM_EST
            | event_type::SQ_DRAINED
            | event_type::PATH_MIG
            | event_type::PATH_MIG_ERR
            | event_type::QP_LAST_WQE_REACHED => {
                // SAFETY: for QP events the element is the QP pointer, and the QP cannot be destroyed
                // before this event is acknowledged (ibv_destroy_qp waits for it).
                let qp = unsafe { self.raw.element.qp };
                // SAFETY: non-null QP pointers here point at a live ibv_qp (see above).
                (!qp.is_null()).then(|| unsafe { (*qp).qp_num })
            }
            _ => None,
        }
    }

    /// The completion queue's address, for CQ events (`CQ_ERR`): identifies the CQ among the live
    /// ones (an address is reused only after its CQ is destroyed).
    pub fn cq_addr(&self) -> Option<usize> {
        match self.raw.event_type {
            // SAFETY: for CQ events the element is the CQ pointer; only its value is read.
            event_type::CQ_ERR => Some(unsafe { self.raw.element.cq } as usize),
            _ => None,
        }
    }

    /// The port number, for port events.
    pub fn port_num(&self) -> Option<u32> {
        match self.raw.event_type {
            event_type::PORT_ACTIVE
            | event_type::PORT_ERR
            | event_type::LID_CHANGE
            | event_type::PKEY_CHANGE
            | event_type::SM_CHANGE
            | event_type::CLIENT_REREGISTER
            | event_type::GID_CHANGE => {
                // SAFETY: for port events the element is the port number.
                u32::try_from(unsafe { self.raw.element.port_num }).ok()
            }
            _ => None,
        }
    }

    /// The raw event.
    pub fn raw(&self) -> &ibv_async_event {
        &self.raw
    }

    /// Acknowledges the event now (dropping it does the same).
    pub fn ack(mut self) {
        self.ack_once();
    }

    fn ack_once(&mut self) {
        if !self.acked {
            self.acked = true;
            // SAFETY: raw came from ibv_get_async_event on this live context and is acked exactly once.
            unsafe { (self.context.verbs.ack_async_event)(&mut self.raw) };
        }
    }
}

impl Drop for AsyncEvent<'_> {
    fn drop(&mut self) {
        self.ack_once();
    }
}
