//! Memory regions (`ibv_mr`): registering host memory or a dma-buf with the HCA.
//!
//! Unsafe because registration hands raw memory to the device, which may then read or write it
//! through DMA at any time until the region is deregistered; the caller of
//! [`MemoryRegion::register`] promises the memory outlives the region.
#![allow(unsafe_code)]

use core::ffi::{c_int, c_void};
use core::ptr::NonNull;
use std::os::fd::RawFd;
use std::sync::Arc;

use crate::error::{VerbsError, errno_after_null, last_errno};
use crate::pd::ProtectionDomain;
use crate::sys::{access, ibv_mr};

/// A registered memory region; deregistered on drop.
#[derive(Debug)]
pub struct MemoryRegion {
    ptr: NonNull<ibv_mr>,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: an MR is an immutable kernel handle plus keys; libibverbs allows dereg from any thread.
unsafe impl Send for MemoryRegion {}
// SAFETY: all accessors read immutable fields.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    /// Registers `len` bytes at `addr` with `access` ([`crate::sys::access`] bits).
    ///
    /// Uses `ibv_reg_mr_iova2(pd, addr, len, addr, access)` when the library has it (rdma-core v28+;
    /// it drops optional bits such as `RELAXED_ORDERING` that the kernel does not support); otherwise
    /// the exported `ibv_reg_mr` with the optional bits (≥ `1 << 20`) stripped, because older
    /// `ibv_reg_mr` passes them to the provider unmasked.
    ///
    /// # Safety
    /// `addr..addr+len` must be memory of this process that stays allocated (and is not handed to
    /// anything that assumes exclusive access, such as `&mut` borrows, while the HCA may write it)
    /// until this region is dropped.
    pub unsafe fn register(
        pd: &Arc<ProtectionDomain>,
        addr: *mut u8,
        len: usize,
        access_flags: u32,
    ) -> Result<Self, VerbsError> {
        if len == 0 {
            return Err(VerbsError::InvalidArgument {
                what: "memory region length is 0",
            });
        }
        let verbs = pd.context().verbs();
        let (call, raw) = match verbs.reg_mr_iova2 {
            Some(reg) => {
                // SAFETY: live PD; the memory contract is the caller's; iova = addr as NCCL does.
                ("ibv_reg_mr_iova2", unsafe {
                    reg(
                        pd.as_ptr(),
                        addr.cast::<c_void>(),
                        len,
                        addr as u64,
                        access_flags,
                    )
                })
            }
            None => {
                let flags = c_int::try_from(access_flags & !access::OPTIONAL_RANGE & 0xf_ffff)
                    .map_err(|_| VerbsError::InvalidArgument {
                        what: "access flags",
                    })?;
                // SAFETY: as above.
                ("ibv_reg_mr", unsafe {
                    (verbs.reg_mr)(pd.as_ptr(), addr.cast::<c_void>(), len, flags)
                })
            }
        };
        let ptr = NonNull::new(raw).ok_or(VerbsError::Register {
            call,
            errno: errno_after_null(),
            len,
        })?;
        Ok(Self {
            ptr,
            pd: Arc::clone(pd),
        })
    }

    /// Registers `len` bytes at `offset` of the dma-buf `fd` (e.g. GPU memory), addressed by peers
    /// as `iova`. The kernel takes its own reference on the dma-buf: `fd` may be closed afterwards.
    ///
    /// `Err(Unsupported)` when the library has no `ibv_reg_dmabuf_mr` (rdma-core < v34).
    pub fn register_dmabuf(
        pd: &Arc<ProtectionDomain>,
        offset: u64,
        len: usize,
        iova: u64,
        fd: RawFd,
        access_flags: u32,
    ) -> Result<Self, VerbsError> {
        let raw = dmabuf_register(pd, offset, len, iova, fd, access_flags)?;
        let ptr = NonNull::new(raw).ok_or(VerbsError::Register {
            call: "ibv_reg_dmabuf_mr",
            errno: errno_after_null(),
            len,
        })?;
        Ok(Self {
            ptr,
            pd: Arc::clone(pd),
        })
    }

    /// Local key, for `ibv_sge::lkey`.
    pub fn lkey(&self) -> u32 {
        // SAFETY: live MR; lkey is immutable.
        unsafe { (*self.ptr.as_ptr()).lkey }
    }

    /// Remote key, for peers.
    pub fn rkey(&self) -> u32 {
        // SAFETY: live MR; rkey is immutable.
        unsafe { (*self.ptr.as_ptr()).rkey }
    }

    /// Start address as registered.
    pub fn addr(&self) -> u64 {
        // SAFETY: live MR; addr is immutable.
        unsafe { (*self.ptr.as_ptr()).addr as u64 }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        // SAFETY: live MR; length is immutable.
        unsafe { (*self.ptr.as_ptr()).length }
    }

    /// Whether the region is empty (never, for a successful registration).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The PD it belongs to.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// The raw MR; valid while `self` lives.
    pub fn as_ptr(&self) -> *mut ibv_mr {
        self.ptr.as_ptr()
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: registered by us, deregistered exactly once. A failure cannot be reported from Drop.
        unsafe { (self.pd.context().verbs().dereg_mr)(self.ptr.as_ptr()) };
    }
}

fn dmabuf_register(
    pd: &ProtectionDomain,
    offset: u64,
    len: usize,
    iova: u64,
    fd: RawFd,
    access_flags: u32,
) -> Result<*mut ibv_mr, VerbsError> {
    let reg = pd
        .context()
        .verbs()
        .reg_dmabuf_mr
        .ok_or(VerbsError::Unsupported {
            what: "ibv_reg_dmabuf_mr",
        })?;
    let flags = c_int::try_from(access_flags).map_err(|_| VerbsError::InvalidArgument {
        what: "access flags",
    })?;
    // SAFETY: live PD; the kernel validates fd, offset and length, and maps no process memory.
    Ok(unsafe { reg(pd.as_ptr(), offset, len, iova, fd, flags) })
}

/// What the dma-buf registration probe found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DmaBufProbe {
    /// libibverbs has no `ibv_reg_dmabuf_mr` (rdma-core < 34).
    NoSymbol,
    /// The probe registration failed with this errno (`0` if it unexpectedly succeeded).
    Answered(i32),
    /// Not probed (no protection domain could be allocated).
    NotProbed,
}

impl DmaBufProbe {
    /// Whether the answer means the kernel and provider take dma-buf registrations: the call got
    /// through to the fd check (any errno but `EOPNOTSUPP`/`EPROTONOSUPPORT`, normally `EBADF`).
    pub fn accepted(self) -> bool {
        matches!(self, Self::Answered(e) if e != libc::EOPNOTSUPP && e != libc::EPROTONOSUPPORT)
    }
}

/// Probe whether the device behind `pd` accepts dma-buf registrations, the way NCCL does: register
/// with `fd = -1` and length 0, and report the errno (`EOPNOTSUPP`/`EPROTONOSUPPORT` mean no, any
/// other outcome, normally `EBADF`, means the kernel and provider support it: see
/// [`DmaBufProbe::accepted`]; whether it is advertised is `rivet_core::gdr`'s decision).
pub fn dmabuf_probe(pd: &ProtectionDomain) -> DmaBufProbe {
    match dmabuf_register(pd, 0, 0, 0, -1, 0) {
        Err(_) => DmaBufProbe::NoSymbol,
        Ok(raw) if raw.is_null() => DmaBufProbe::Answered(last_errno()),
        Ok(raw) => {
            // SAFETY: an (unexpected) successful registration is ours to release.
            unsafe { (pd.context().verbs().dereg_mr)(raw) };
            DmaBufProbe::Answered(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::DmaBufProbe;

    #[test]
    fn dmabuf_probe_accepts_any_errno_but_not_supported() {
        for (e, yes) in [
            (libc::EPROTONOSUPPORT, false),
            (libc::EOPNOTSUPP, false),
            (libc::EBADF, true),
            (libc::EINVAL, true),
            (0, true),
        ] {
            assert_eq!(DmaBufProbe::Answered(e).accepted(), yes, "errno {e}");
        }
        assert!(!DmaBufProbe::NoSymbol.accepted());
        assert!(!DmaBufProbe::NotProbed.accepted());
    }
}
