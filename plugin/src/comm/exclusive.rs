//! A cell one thread uses at a time, for a comm's data-path state: NCCL drives each comm from one
//! thread, so a second thread arriving while the first is inside is NCCL's misuse, answered with
//! an error ([`Busy::InUse`]) instead of a wait or a data race.
//!
//! It replaces a `std::sync::Mutex` used only through `try_lock`: entering is one
//! compare-exchange and leaving one store, with no waiter bookkeeping (nobody ever waits on the
//! data path). A panic inside leaves the cell poisoned ([`Busy::Poisoned`]), as a mutex would be:
//! the state it guards may be half-updated, so later calls on the comm fail.
//!
//! Leaving: [`Guard::leave`] on the normal path is the one store; dropping a guard (the path an
//! unwinding panic takes, and any early return) asks `std::thread::panicking()` first, to free or
//! poison. The data path leaves explicitly, so only the unwinding path and the cold early
//! returns pay for the question; a path that drops its guard instead is just as correct.
//!
//! Unsafe (opted in): the cell hands out `&mut T` from `&self`; the flag makes that reference
//! unique (only the thread whose compare-exchange won holds a guard).

#![allow(unsafe_code)]

use core::cell::UnsafeCell;
use core::fmt;
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{AtomicU8, Ordering};

const FREE: u8 = 0;
const BUSY: u8 = 1;
const POISONED: u8 = 2;

/// Why [`Exclusive::try_enter`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Busy {
    /// Another thread is inside.
    InUse,
    /// A call panicked inside; the state may be inconsistent.
    Poisoned,
}

/// A `T` entered by one thread at a time.
pub(crate) struct Exclusive<T> {
    state: AtomicU8,
    value: UnsafeCell<T>,
}

// SAFETY: the value is only reached through a guard, and at most one guard exists at a time
// (the compare-exchange from FREE to BUSY succeeds for one thread); moving `T` between threads
// that way needs `T: Send`, exactly as for `Mutex<T>`.
unsafe impl<T: Send> Sync for Exclusive<T> {}

impl<T> Exclusive<T> {
    /// A free cell holding `value`.
    pub(crate) const fn new(value: T) -> Self {
        Self {
            state: AtomicU8::new(FREE),
            value: UnsafeCell::new(value),
        }
    }

    /// Enter, or say why not: never waits.
    #[inline(always)]
    pub(crate) fn try_enter(&self) -> Result<Guard<'_, T>, Busy> {
        match self
            .state
            .compare_exchange(FREE, BUSY, Ordering::Acquire, Ordering::Relaxed)
        {
            Ok(_) => Ok(Guard { cell: self }),
            Err(POISONED) => Err(Busy::Poisoned),
            Err(_) => Err(Busy::InUse),
        }
    }

    /// Enter even if poisoned, yielding while another thread is inside (close, which NCCL calls
    /// after every other call on the comm returned, so the wait never happens under the contract).
    pub(crate) fn enter_anyway(&self) -> Guard<'_, T> {
        loop {
            for from in [FREE, POISONED] {
                if self
                    .state
                    .compare_exchange(from, BUSY, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    return Guard { cell: self };
                }
            }
            std::thread::yield_now();
        }
    }

    /// The value, through exclusive ownership of the cell (no flag needed).
    pub(crate) fn get_mut(&mut self) -> &mut T {
        self.value.get_mut()
    }
}

impl<T> fmt::Debug for Exclusive<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state.load(Ordering::Relaxed) {
            FREE => "free",
            BUSY => "in use",
            _ => "poisoned",
        };
        f.debug_struct("Exclusive").field("state", &state).finish()
    }
}

/// Proof of being inside an [`Exclusive`]; leaving (drop) frees it, or poisons it when the
/// thread is unwinding from a panic.
pub(crate) struct Guard<'a, T> {
    cell: &'a Exclusive<T>,
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;
    #[inline(always)]
    fn deref(&self) -> &T {
        // SAFETY: this guard is the only one (see `Exclusive`), so no `&mut T` exists elsewhere.
        unsafe { &*self.cell.value.get() }
    }
}

impl<T> DerefMut for Guard<'_, T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: this guard is the only one, and `&mut self` makes this reference unique.
        unsafe { &mut *self.cell.value.get() }
    }
}

impl<T> Guard<'_, T> {
    /// Leave on the normal path: free the cell. A call, never made from a destructor, so the
    /// thread is not unwinding and there is nothing to ask.
    #[inline(always)]
    pub(crate) fn leave(self) {
        let cell = self.cell;
        core::mem::forget(self);
        cell.state.store(FREE, Ordering::Release);
    }
}

impl<T> Drop for Guard<'_, T> {
    #[inline(always)]
    fn drop(&mut self) {
        let next = if std::thread::panicking() {
            POISONED
        } else {
            FREE
        };
        self.cell.state.store(next, Ordering::Release);
    }
}

impl<T> fmt::Debug for Guard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Guard")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn a_second_entry_is_refused_until_the_first_leaves() {
        let cell = Exclusive::new(5u32);
        let mut first = cell.try_enter().expect("free");
        *first += 1;
        assert_eq!(cell.try_enter().err(), Some(Busy::InUse));
        drop(first);
        assert_eq!(*cell.try_enter().expect("free again"), 6);
        let second = cell.try_enter().expect("free");
        assert_eq!(cell.try_enter().err(), Some(Busy::InUse));
        second.leave();
        assert_eq!(*cell.try_enter().expect("left: free again"), 6);
    }

    #[test]
    fn a_panic_inside_poisons_until_entered_anyway() {
        let cell = Exclusive::new(Vec::<u8>::new());
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut inside = cell.try_enter().expect("free");
            inside.push(1);
            panic!("inside");
        }));
        assert!(caught.is_err());
        assert_eq!(cell.try_enter().err(), Some(Busy::Poisoned));
        assert_eq!(
            *cell.enter_anyway(),
            vec![1],
            "close still reaches the state"
        );
    }

    /// Two threads hammering one cell: every entry either gets the cell alone or is refused
    /// with `InUse`; never are both inside (the data race a missing check would allow).
    #[test]
    fn two_threads_never_are_inside_together() {
        let cell = Arc::new(Exclusive::new(0u64));
        let inside = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (cell, inside) = (Arc::clone(&cell), Arc::clone(&inside));
                std::thread::spawn(move || {
                    let (mut entered, mut refused) = (0u64, 0u64);
                    for _ in 0..200_000 {
                        match cell.try_enter() {
                            Ok(mut guard) => {
                                assert!(!inside.swap(true, Ordering::SeqCst), "both inside");
                                *guard += 1;
                                inside.store(false, Ordering::SeqCst);
                                entered += 1;
                            }
                            Err(busy) => {
                                assert_eq!(busy, Busy::InUse);
                                refused += 1;
                            }
                        }
                    }
                    (entered, refused)
                })
            })
            .collect();
        let entered: u64 = threads
            .into_iter()
            .map(|t| t.join().expect("no panic").0)
            .sum();
        assert_eq!(*cell.try_enter().expect("free at the end"), entered);
    }
}
