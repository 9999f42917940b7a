//! Page-aligned, zeroed memory registered with the NIC: the control regions of a connection.
//!
//! Unsafe: the memory is allocated with `std::alloc` and handed to the NIC by address; the NIC
//! (or the peer's NIC) writes it behind the compiler's back, so reads go through volatile loads.

#![allow(unsafe_code)]

use rivet_verbs_ffi::{MemoryRegion, ProtectionDomain, VerbsError};
use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};

const PAGE: usize = 4096;

/// A registered, page-aligned, zero-initialised buffer owned by one connection.
#[derive(Debug)]
pub(crate) struct Region {
    /// Declared before `ptr`'s owner logic: the MR is deregistered (dropped) before the memory is
    /// freed in `Drop`.
    mr: Option<MemoryRegion>,
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the buffer is owned exclusively by this value; concurrent access is only by the NIC.
unsafe impl Send for Region {}
// SAFETY: shared access only reads through volatile loads or the NIC; writes need `&mut self`.
unsafe impl Sync for Region {}

impl Region {
    /// Allocate `len` zeroed bytes (rounded up to whole pages) and register them with `access`.
    pub(crate) fn new(
        pd: &Arc<ProtectionDomain>,
        len: usize,
        access: u32,
    ) -> Result<Self, VerbsError> {
        let size = len.max(1).div_ceil(PAGE) * PAGE;
        let layout =
            Layout::from_size_align(size, PAGE).map_err(|_| VerbsError::InvalidArgument {
                what: "region size",
            })?;
        // SAFETY: the layout has a non-zero size.
        let ptr =
            NonNull::new(unsafe { alloc_zeroed(layout) }).ok_or(VerbsError::InvalidArgument {
                what: "out of memory for a control region",
            })?;
        let mut region = Self {
            mr: None,
            ptr,
            layout,
        };
        // SAFETY: the memory is valid for `size` bytes and lives until `Drop`, after the MR is gone.
        region.mr = Some(unsafe { MemoryRegion::register(pd, ptr.as_ptr(), size, access) }?);
        Ok(region)
    }

    fn mr(&self) -> &MemoryRegion {
        self.mr
            .as_ref()
            .unwrap_or_else(|| unreachable!("registered in new"))
    }

    /// Address of the first byte.
    pub(crate) fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Usable length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.layout.size()
    }

    /// Local key.
    pub(crate) fn lkey(&self) -> u32 {
        self.mr().lkey()
    }

    /// Remote key.
    pub(crate) fn rkey(&self) -> u32 {
        self.mr().rkey()
    }

    /// Whether `len` bytes at `offset` lie inside the region.
    #[inline(always)]
    fn contains(&self, offset: usize, len: usize) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.len())
    }

    /// Copy `out.len()` bytes at `offset` out with volatile loads, then an acquire fence so later
    /// reads are not hoisted above them. Out-of-range reads yield zeroes (never panic).
    #[inline(always)]
    pub(crate) fn read_volatile(&self, offset: usize, out: &mut [u8]) {
        if !self.contains(offset, out.len()) {
            out.fill(0);
            return;
        }
        // SAFETY: the range was just checked to lie inside the region, whose start is a page.
        unsafe { copy_volatile(self.ptr.as_ptr(), offset, out) };
        fence(Ordering::Acquire);
    }

    /// The `N`-byte entry at `offset` whose last four bytes are its stamp: the stamp read first,
    /// then (after an acquire fence) the whole entry, as two [`Self::read_volatile`]s would, under
    /// one bounds check: the stamp lies inside the entry. Out of range, both are zeroes.
    #[inline(always)]
    pub(crate) fn read_stamped<const N: usize>(&self, offset: usize) -> (u32, [u8; N]) {
        const { assert!(N >= 4, "an entry ends with its 4-byte stamp") };
        let mut stamp = [0u8; 4];
        let mut entry = [0u8; N];
        if self.contains(offset, N) {
            // Loaded once, before the fences: a fence would have the field loaded again.
            let base = self.ptr.as_ptr();
            // SAFETY: the entry's range was just checked to lie inside the region, and the stamp
            // is its last four bytes; the region's start is a page.
            unsafe { copy_volatile(base, offset + (N - 4), &mut stamp) };
            fence(Ordering::Acquire);
            // SAFETY: as above, the entry's range.
            unsafe { copy_volatile(base, offset, &mut entry) };
            fence(Ordering::Acquire);
        }
        (u32::from_le_bytes(stamp), entry)
    }

    /// Copy `bytes` in at `offset`; out-of-range writes are refused (returns false).
    pub(crate) fn write(&mut self, offset: usize, bytes: &[u8]) -> bool {
        let Some(end) = offset
            .checked_add(bytes.len())
            .filter(|end| *end <= self.len())
        else {
            return false;
        };
        debug_assert!(end <= self.len());
        // SAFETY: the destination range is inside the allocation; `&mut self` excludes other CPU
        // writers, and the NIC only reads staging memory after a later post.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.ptr.as_ptr().add(offset),
                bytes.len(),
            )
        };
        true
    }
}

/// Copy `out.len()` bytes at `base + offset` out with volatile loads (no fence).
///
/// Whole aligned words where it can (a clear-to-send entry is four), then a 4-byte word (an
/// entry's stamp), bytes for the rest: byte-wise volatile reads were a visible share of the
/// instructions per message. The address is as aligned as `offset`, which the core's call sites
/// know: the alignment checks fold away.
///
/// # Safety
///
/// `base` must be 8-aligned and `base + offset .. base + offset + out.len()` must lie inside one
/// live allocation (memory the NIC may write concurrently, hence the volatile loads).
#[inline(always)]
unsafe fn copy_volatile(base: *const u8, offset: usize, out: &mut [u8]) {
    let mut done = 0;
    if offset % 8 == 0 {
        for chunk in out.chunks_exact_mut(8) {
            // SAFETY: `offset + done + 8 <= offset + out.len()`, inside the allocation (the
            // caller's promise), and 8-aligned (`base` 8-aligned, `offset` checked above, `done`
            // steps by 8).
            let word = unsafe { base.add(offset + done).cast::<u64>().read_volatile() };
            chunk.copy_from_slice(&word.to_ne_bytes());
            done += 8;
        }
    }
    if out.len() - done >= 4 && (offset + done) % 4 == 0 {
        // SAFETY: `offset + done + 4 <= offset + out.len()`, inside the allocation, and 4-aligned
        // (`base` 8-aligned, `offset + done` checked just above).
        let word = unsafe { base.add(offset + done).cast::<u32>().read_volatile() };
        out[done..done + 4].copy_from_slice(&word.to_ne_bytes());
        done += 4;
    }
    for (i, byte) in out.iter_mut().enumerate().skip(done) {
        // SAFETY: `offset + i < offset + out.len()`, inside the allocation.
        *byte = unsafe { base.add(offset + i).read_volatile() };
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // Deregister first: the NIC must not hold the pages when they return to the allocator.
        drop(self.mr.take());
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

#[cfg(test)]
mod tests {
    use super::copy_volatile;

    /// Every length and offset the word, half-word and byte steps meet, against a plain copy.
    #[test]
    fn copy_volatile_matches_a_plain_copy() {
        let mut words = [0u64; 8];
        for (i, word) in words.iter_mut().enumerate() {
            *word = u64::from_ne_bytes(core::array::from_fn(|b| (i * 8 + b) as u8));
        }
        let base = words.as_ptr().cast::<u8>();
        // SAFETY: `words` is 64 initialised bytes.
        let plain = unsafe { core::slice::from_raw_parts(base, 64) };
        for offset in 0..64 {
            for len in 0..=64 - offset {
                let mut out = [0xFFu8; 64];
                // SAFETY: `words` is 8-aligned and `offset + len <= 64`.
                unsafe { copy_volatile(base, offset, &mut out[..len]) };
                assert_eq!(out[..len], plain[offset..offset + len], "{offset} {len}");
            }
        }
    }
}
