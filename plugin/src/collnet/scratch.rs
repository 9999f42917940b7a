//! A CollNet group's scratch memory: one heap allocation, registered once, that the NIC writes
//! received chunks into (receive slots), the plugin stages non-contiguous sends in (send slots),
//! and the group setup exchanges its hellos through.
//!
//! Unsafe (opted in): the memory is shared with the NIC, so it is held as a raw allocation and
//! lent out as slices only for ranges no transfer is using (the callers' promise).

#![allow(unsafe_code)]

use crate::backend::OpenPort;
use crate::comm;
use crate::error::NetResult;
use crate::handle::Ptr;
use crate::sys::NCCL_PTR_HOST;
use std::sync::Arc;

/// The allocation. Never moves or grows while it lives.
#[derive(Debug)]
pub(crate) struct Scratch {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the allocation is plain bytes owned by this value; access to ranges is coordinated by
// the owning group's engine lock and the callers' promises on `bytes`/`bytes_mut`.
unsafe impl Send for Scratch {}
// SAFETY: as above; `&Scratch` only hands out addresses, slices need `unsafe` calls.
unsafe impl Sync for Scratch {}

impl Scratch {
    /// `len` zeroed bytes.
    pub(crate) fn new(len: usize) -> Self {
        let boxed = vec![0u8; len.max(1)].into_boxed_slice();
        let len = boxed.len();
        Self {
            ptr: Box::into_raw(boxed).cast::<u8>(),
            len,
        }
    }

    /// `len` zeroed bytes registered on `port` (a group's one registration of its scratch
    /// memory): the memory and its registration handle.
    pub(crate) fn registered(port: &Arc<OpenPort>, len: usize) -> NetResult<(Self, Ptr)> {
        let scratch = Self::new(len);
        let mh = comm::reg_mr_on_port(
            Arc::clone(port),
            scratch.addr(0) as Ptr,
            scratch.len(),
            NCCL_PTR_HOST,
            None,
            false,
        )?;
        Ok((scratch, mh))
    }

    /// The address of byte `offset` (for registration and the NIC).
    pub(crate) fn addr(&self, offset: usize) -> u64 {
        self.ptr as u64 + offset.min(self.len) as u64
    }

    /// Bytes in the allocation.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether `offset .. offset + len` lies inside.
    fn inside(&self, offset: usize, len: usize) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.len)
    }

    /// Read `len` bytes at `offset` (empty if out of range).
    ///
    /// # Safety
    /// No transfer may write the range, and no `bytes_mut` of it may be alive, while the slice is.
    pub(crate) unsafe fn bytes(&self, offset: usize, len: usize) -> &[u8] {
        if len == 0 || !self.inside(offset, len) {
            return &[];
        }
        // SAFETY: in range of the live allocation; the caller excludes concurrent writes.
        unsafe { core::slice::from_raw_parts(self.ptr.add(offset), len) }
    }

    /// Write access to `len` bytes at `offset` (empty if out of range).
    ///
    /// # Safety
    /// No transfer may read or write the range, and no other slice of it may be alive, while
    /// this one is.
    #[allow(clippy::mut_from_ref)] // the NIC shares the memory; the caller guarantees exclusivity
    pub(crate) unsafe fn bytes_mut(&self, offset: usize, len: usize) -> &mut [u8] {
        if len == 0 || !self.inside(offset, len) {
            return &mut [];
        }
        // SAFETY: in range of the live allocation; the caller guarantees exclusive access.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.add(offset), len) }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` came from `Box::into_raw` of a boxed slice of this length, freed
        // only here; the group deregistered it and closed its connections before dropping it.
        drop(unsafe { Box::from_raw(core::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}
