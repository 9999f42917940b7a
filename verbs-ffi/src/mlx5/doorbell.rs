//! Ringing a send queue's doorbell: the 64-bit stores into the BlueFlame/UAR page and the
//! write-combining barriers around them (reference verbs-mlx5dv §2.5).
//!
//! [`DoorbellRegister`] is the seam between the posting code and the device: [`BlueFlame`]
//! performs real MMIO stores, the software model ([`super::model`]) records and checks them. The
//! posting code decides everything else (offset toggling, BlueFlame copy or 8-byte doorbell), so
//! the same decisions are exercised on hardware and on the model.
//!
//! Unsafe: [`BlueFlame`] writes through a raw pointer into the device's UAR mapping.
#![allow(unsafe_code)]

use core::ptr::NonNull;

/// A BlueFlame register pair as the posting code sees it.
pub trait DoorbellRegister {
    /// Bytes of one BlueFlame half; 0 when the register has no BlueFlame buffer (8-byte
    /// doorbells only).
    fn bf_size(&self) -> u32;
    /// `mmio_wc_start`: order the doorbell-record store before the MMIO stores that follow.
    fn wc_start(&mut self);
    /// One 64-bit store of `value` (already in wire byte order) at `offset` from the register base.
    fn store64(&mut self, offset: usize, value: u64);
    /// `mmio_flush_writes`: push the write-combining buffer out.
    fn wc_flush(&mut self);
}

/// The real BlueFlame register of a QP (`mlx5dv_qp.bf`).
#[derive(Debug)]
pub struct BlueFlame {
    reg: NonNull<u64>,
    size: u32,
}

// SAFETY: the register is a device mapping owned by the QP's provider state; this value is its only
// writer (one per QP, driven under `&mut`), so moving it to another thread is fine.
unsafe impl Send for BlueFlame {}

impl BlueFlame {
    /// Wrap `mlx5dv_qp.bf`.
    ///
    /// # Safety
    /// `reg` must be the QP's BlueFlame/UAR register base from `mlx5dv_init_obj`, mapped for at
    /// least `2 * size` bytes (8 when `size` is 0) for as long as this value lives, and no one
    /// else may ring this register (dedicated low-latency bfreg, or callers serialise).
    pub unsafe fn new(reg: NonNull<u64>, size: u32) -> Self {
        Self { reg, size }
    }
}

#[inline(always)]
fn sfence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` has no preconditions; SSE is part of the x86-64 baseline.
    unsafe {
        core::arch::x86_64::_mm_sfence()
    };
    #[cfg(not(target_arch = "x86_64"))]
    core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
}

impl DoorbellRegister for BlueFlame {
    fn bf_size(&self) -> u32 {
        self.size
    }

    #[inline(always)]
    fn wc_start(&mut self) {
        sfence();
    }

    #[inline(always)]
    fn store64(&mut self, offset: usize, value: u64) {
        debug_assert!(offset % 8 == 0 && offset + 8 <= (2 * self.size as usize).max(8));
        // SAFETY: the posting code keeps `offset + 8` within the two halves (or the 8-byte doorbell
        // when there is no BlueFlame), inside the mapping `new` was promised; volatile because it
        // is MMIO and every store must reach the device in program order.
        unsafe { self.reg.byte_add(offset).write_volatile(value) };
    }

    #[inline(always)]
    fn wc_flush(&mut self) {
        sfence();
    }
}
