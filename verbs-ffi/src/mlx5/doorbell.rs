//! Ringing a send queue's doorbell: the 64-bit stores into the BlueFlame/UAR page and the
//! write-combining barriers around them (reference verbs-mlx5dv §2.5).
//!
//! [`DoorbellRegister`] is the seam between the posting code and the device: [`BlueFlame`]
//! performs real MMIO stores, the software model (`mlx5::model`, feature `mlx5-model`) records and checks them. The
//! posting code decides everything else (offset toggling, BlueFlame copy or 8-byte doorbell), so
//! the same decisions are exercised on hardware and on the model.
//!
//! Shared registers: the kernel gives the first QPs of a context dedicated ("low-latency")
//! BlueFlame registers and lets later ones share ("medium") registers, which the provider guards
//! with a lock. Two write-combined 64-byte bursts into one register from two threads would mix, so
//! a register that more than one of our QPs uses is rung with 8-byte doorbells only (an aligned
//! 64-bit store is atomic), decided per ring with one relaxed load. `MLX5_SHUT_UP_BF=1` turns
//! BlueFlame off altogether, as it does in the provider.
//!
//! Unsafe: [`BlueFlame`] writes through a raw pointer into the device's UAR mapping.
#![allow(unsafe_code)]

use core::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A BlueFlame register pair as the posting code sees it.
pub trait DoorbellRegister {
    /// Bytes of one BlueFlame half; 0 when the register has no BlueFlame buffer (8-byte
    /// doorbells only).
    fn bf_size(&self) -> u32;
    /// `mmio_wc_start`: order the doorbell-record store before the MMIO stores that follow.
    fn wc_start(&mut self);
    /// One 64-bit store of `value` (already in wire byte order) at `offset` from the register base.
    fn store64(&mut self, offset: usize, value: u64);
    /// The BlueFlame copy of one 64-byte basic block: the eight words at `src`, in order, as
    /// [`store64`](Self::store64)s at `offset`, `offset + 8`, ... `offset + 56`. The provided
    /// method is exactly that; a register whose stores are not plain inlined moves (the model's
    /// recording ones) takes the block in one call.
    ///
    /// # Safety
    /// `src` must be valid for reads of 64 bytes (no alignment needed).
    #[inline(always)]
    unsafe fn store_bb(&mut self, offset: usize, src: NonNull<u64>) {
        for word in 0..8 {
            // SAFETY: `word < 8`: inside the 64 bytes the caller promised.
            let value = unsafe { src.add(word).read_unaligned() };
            self.store64(offset + 8 * word, value);
        }
    }
    /// `mmio_flush_writes`: push the write-combining buffer out.
    fn wc_flush(&mut self);
}

/// The real BlueFlame register of a QP (`mlx5dv_qp.bf`).
#[derive(Debug)]
pub struct BlueFlame {
    reg: NonNull<u64>,
    size: u32,
    /// How many of this process's QPs ring the same register.
    users: Arc<AtomicUsize>,
}

/// Registers in use, by base address (setup and teardown only; never on the data path).
static REGISTERS: Mutex<Vec<(usize, Arc<AtomicUsize>)>> = Mutex::new(Vec::new());

/// Base of the register pair `reg` lies in (either half of a pair names the same register).
fn register_base(reg: usize, size: u32) -> usize {
    if size == 0 {
        reg
    } else {
        reg & !(2 * size as usize - 1)
    }
}

/// Whether `MLX5_SHUT_UP_BF` asks for no BlueFlame (read as the provider reads it: set to `1`).
fn shut_up_bf() -> bool {
    std::env::var("MLX5_SHUT_UP_BF").is_ok_and(|v| v.trim() == "1")
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
        let size = if shut_up_bf() || !size.is_power_of_two() {
            0
        } else {
            size
        };
        let base = register_base(reg.as_ptr() as usize, size);
        let users = {
            let mut registers = REGISTERS.lock().unwrap_or_else(|e| e.into_inner());
            match registers.iter().find(|(b, _)| *b == base) {
                Some((_, users)) => Arc::clone(users),
                None => {
                    let users = Arc::new(AtomicUsize::new(0));
                    registers.push((base, Arc::clone(&users)));
                    users
                }
            }
        };
        users.fetch_add(1, Ordering::Relaxed);
        Self { reg, size, users }
    }

    /// Whether another of this process's QPs rings the same register (BlueFlame is then off).
    pub fn shared(&self) -> bool {
        self.users.load(Ordering::Relaxed) > 1
    }
}

impl Drop for BlueFlame {
    fn drop(&mut self) {
        let mut registers = REGISTERS.lock().unwrap_or_else(|e| e.into_inner());
        if self.users.fetch_sub(1, Ordering::Relaxed) == 1 {
            registers.retain(|(_, users)| !Arc::ptr_eq(users, &self.users));
        }
    }
}

impl DoorbellRegister for BlueFlame {
    #[inline(always)]
    fn bf_size(&self) -> u32 {
        if self.shared() { 0 } else { self.size }
    }

    #[inline(always)]
    fn wc_start(&mut self) {
        super::barrier::wc_flush();
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
        super::barrier::wc_flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Host memory standing in for a register pair (the stores are plain volatile writes),
    /// aligned like one.
    #[repr(align(512))]
    struct Pair([u64; 64]);

    #[test]
    fn blueflame_stores_land_at_the_offset_and_sharing_turns_it_off() {
        let mut page = Box::new(Pair([0; 64]));
        let base = NonNull::new(page.0.as_mut_ptr()).unwrap();
        // SAFETY: 512 bytes of owned memory stand in for the register pair; nothing else rings it
        // but the values made here.
        let mut first = unsafe { BlueFlame::new(base, 256) };
        assert_eq!(first.bf_size(), if shut_up_bf() { 0 } else { 256 });
        first.wc_start();
        first.store64(256 + 8, 0x1122_3344_5566_7788);
        first.wc_flush();
        // The other half of the same pair is the same register.
        // SAFETY: as above; `add(32)` (256 bytes) stays inside the pair.
        let second = unsafe { BlueFlame::new(base.add(32), 256) };
        assert!(first.shared() && second.shared());
        assert_eq!(
            (first.bf_size(), second.bf_size()),
            (0, 0),
            "8-byte doorbells only"
        );
        drop(second);
        assert!(!first.shared());
        drop(first);
        assert_eq!(page.0[33], 0x1122_3344_5566_7788);
    }

    #[test]
    fn register_base_ignores_the_half() {
        assert_eq!(register_base(0x7000_0800, 256), 0x7000_0800);
        assert_eq!(register_base(0x7000_0900, 256), 0x7000_0800);
        assert_eq!(register_base(0x7000_0904, 0), 0x7000_0904);
    }
}
