//! The memory barriers of rdma-core's `util/udma_barrier.h`, per architecture (reference
//! verbs-mlx5dv §2.5): the data path must order its stores to host memory the device reads (WQEs,
//! doorbell records) and its loads of memory the device writes (CQEs) in the device's view, which
//! a Rust atomic fence alone does not promise on weakly ordered CPUs (it orders only between CPUs:
//! `dmb ish` on aarch64, where the device needs the outer-shareable `dmb osh*`).
//!
//! Unsafe: inline assembly for the barrier instructions.
#![allow(unsafe_code)]

/// `udma_to_device_barrier`: stores before it reach memory before stores after it, as the device
/// sees them (WQE bytes before the doorbell record; receive WQE before the receive counter).
#[inline(always)]
pub fn to_device() {
    #[cfg(target_arch = "x86_64")]
    core::sync::atomic::compiler_fence(core::sync::atomic::Ordering::SeqCst); // x86 keeps stores to write-back memory in order
    #[cfg(target_arch = "aarch64")]
    // SAFETY: a barrier instruction; no memory operands, no other effect.
    unsafe {
        core::arch::asm!("dmb oshst", options(nostack, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
}

/// `udma_from_device_barrier`: loads after it (the CQE body) are not satisfied before the load
/// before it (the ownership byte).
#[inline(always)]
pub fn from_device() {
    #[cfg(target_arch = "x86_64")]
    core::sync::atomic::compiler_fence(core::sync::atomic::Ordering::SeqCst); // x86 does not reorder loads with older loads (TSO)
    #[cfg(target_arch = "aarch64")]
    // SAFETY: a barrier instruction; no memory operands, no other effect.
    unsafe {
        core::arch::asm!("dmb oshld", options(nostack, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
}

/// `mmio_flush_writes` (also `mmio_wc_start`): earlier stores, write-combined MMIO included,
/// are globally visible before later ones.
#[inline(always)]
pub fn wc_flush() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` has no preconditions; SSE is part of the x86-64 baseline.
    unsafe {
        core::arch::x86_64::_mm_sfence()
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: a barrier instruction; no memory operands, no other effect.
    unsafe {
        core::arch::asm!("dsb st", options(nostack, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
}
