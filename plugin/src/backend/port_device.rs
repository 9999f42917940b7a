//! The device under an opened port, as the rest of the backend uses it: its verbs objects (for
//! queue pairs and regions), memory registration and asynchronous events. The library has one
//! kind, [`VerbsDevice`]; the unit tests add the simulated port's (`backend::sim`) through the
//! backend's one seam (`backend::DataEndpoint`), so no code here knows of it.
//!
//! Unsafe (opted in): registering memory by address hands the NIC the caller's pages; the
//! caller (the registration cache, for `regMr`) promises they stay mapped.

#![allow(unsafe_code)]

use rivet_verbs_ffi::{AsyncEvent, Context, MemoryRegion, ProtectionDomain, VerbsError};
use std::fmt::Debug;
use std::os::fd::RawFd;
use std::sync::Arc;

/// What an opened port's device does for the backend.
pub(crate) trait PortDevice:
    Debug + Clone + Send + Sync + From<VerbsDevice> + 'static
{
    /// One registration of memory with the device (dropping it deregisters).
    type Registration: Debug + Send;

    /// The verbs objects queue pairs and control regions are created with.
    fn verbs(&self) -> &VerbsDevice;

    /// Register `size` bytes at address `start`: process memory, or with `dmabuf` (fd, offset of
    /// `start`'s byte in it) a dma-buf.
    ///
    /// # Safety
    /// Without `dmabuf`, `start..start+size` must stay mapped in this process until the
    /// registration is dropped.
    unsafe fn register(
        &self,
        start: u64,
        size: usize,
        dmabuf: Option<(RawFd, u64)>,
        access: u32,
    ) -> Result<Self::Registration, VerbsError>;

    /// A registration's (local key, remote key).
    fn keys(registration: &Self::Registration) -> (u32, u32);

    /// The next asynchronous event, without blocking (`None`: none is pending).
    fn next_async_event(&self) -> Result<Option<AsyncEvent<'_>>, VerbsError>;
}

/// A verbs device: the context and the port's protection domain.
#[derive(Debug, Clone)]
pub(crate) struct VerbsDevice {
    /// The device context.
    pub(crate) context: Arc<Context>,
    /// Protection domain all of the port's QPs and memory registrations share.
    pub(crate) pd: Arc<ProtectionDomain>,
}

impl PortDevice for VerbsDevice {
    type Registration = MemoryRegion;

    #[inline]
    fn verbs(&self) -> &VerbsDevice {
        self
    }

    /// Register with `ibv_reg_mr` (process memory) or `ibv_reg_dmabuf_mr`.
    ///
    /// # Safety
    /// As [`PortDevice::register`]: without `dmabuf`, the memory stays mapped while the
    /// registration lives.
    unsafe fn register(
        &self,
        start: u64,
        size: usize,
        dmabuf: Option<(RawFd, u64)>,
        access: u32,
    ) -> Result<MemoryRegion, VerbsError> {
        match dmabuf {
            // SAFETY: `start..start+size` stays mapped while the region lives (the function's
            // contract).
            None => unsafe { MemoryRegion::register(&self.pd, start as *mut u8, size, access) },
            Some((fd, offset)) => {
                MemoryRegion::register_dmabuf(&self.pd, offset, size, start, fd, access)
            }
        }
    }

    fn keys(registration: &MemoryRegion) -> (u32, u32) {
        (registration.lkey(), registration.rkey())
    }

    fn next_async_event(&self) -> Result<Option<AsyncEvent<'_>>, VerbsError> {
        self.context.get_async_event()
    }
}
