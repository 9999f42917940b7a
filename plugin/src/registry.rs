//! Tables of live objects handed to NCCL as opaque handles.
//!
//! NCCL stores our comm, memory-region and request handles as `void*` and passes them back. A
//! handle here is not a pointer: it packs a table index, a generation and a kind tag into the
//! pointer-sized value, so a NULL, stale (closed) or bogus handle is recognised and answered with
//! an error instead of being dereferenced.
//!
//! Each table is a fixed array in the library's static memory (no heap, nothing left behind when
//! NCCL `dlclose`s the plugin). Lookups are lock-free: two atomic loads. Insertion and removal are
//! control-path operations serialised by a mutex.

use std::sync::Mutex;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

/// A decoded handle: which table slot, which incarnation of it, and which table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Handle {
    /// Slot index.
    pub(crate) index: u16,
    /// Incarnation of the slot; bumped on every removal.
    pub(crate) generation: u16,
    /// Low 32 bits: the table's kind tag for object handles, or a request id for request handles.
    pub(crate) low: u32,
}

impl Handle {
    /// Pack into the pointer-sized value NCCL stores. Never NULL: generations start at 1.
    pub(crate) fn to_ptr(self) -> *mut core::ffi::c_void {
        let bits = (u64::from(self.generation) << 48)
            | (u64::from(self.index) << 32)
            | u64::from(self.low);
        bits as usize as *mut core::ffi::c_void
    }

    /// Unpack; `None` for NULL.
    pub(crate) fn from_ptr(ptr: *mut core::ffi::c_void) -> Option<Self> {
        let bits = ptr as usize as u64;
        if bits == 0 {
            return None;
        }
        Some(Self {
            index: (bits >> 32) as u16,
            generation: (bits >> 48) as u16,
            low: bits as u32,
        })
    }
}

struct Slot<T> {
    value: AtomicPtr<T>,
    /// Current generation (1..=u16::MAX, wrapping past 0).
    generation: AtomicU32,
}

impl<T> Slot<T> {
    const fn empty() -> Self {
        Self {
            value: AtomicPtr::new(core::ptr::null_mut()),
            generation: AtomicU32::new(1),
        }
    }
}

/// A fixed-capacity table of boxed `T`s addressed by [`Handle`]s.
pub(crate) struct Registry<T, const N: usize> {
    slots: [Slot<T>; N],
    kind: u32,
    /// Serialises insert/remove; holds the next slot to try.
    writer: Mutex<usize>,
}

impl<T, const N: usize> Registry<T, N> {
    /// An empty table whose handles carry `kind` in their low bits. `kind` must be non-zero.
    pub(crate) const fn new(kind: u32) -> Self {
        assert!(kind != 0 && N <= u16::MAX as usize);
        Self {
            slots: [const { Slot::empty() }; N],
            kind,
            writer: Mutex::new(0),
        }
    }

    /// Store `value`; `None` when the table is full.
    pub(crate) fn insert(&self, value: Box<T>) -> Option<Handle> {
        let mut next = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        for step in 0..N {
            let index = (*next + step) % N;
            let slot = &self.slots[index];
            if slot.value.load(Ordering::Relaxed).is_null() {
                let generation = slot.generation.load(Ordering::Relaxed) as u16;
                slot.value.store(Box::into_raw(value), Ordering::Release);
                *next = (index + 1) % N;
                return Some(Handle {
                    index: index as u16,
                    generation,
                    low: self.kind,
                });
            }
        }
        None
    }

    /// The object behind `handle`, if the handle is live and belongs to this table.
    ///
    /// # Safety
    /// The returned reference is valid until [`Registry::remove`] is called for the same handle.
    /// The caller must guarantee that does not happen while the reference is in use: NCCL's
    /// contract makes a close the last call on a comm, so entry points may rely on it.
    pub(crate) unsafe fn get(&self, handle: Handle) -> Option<&T> {
        let slot = self.slots.get(usize::from(handle.index))?;
        if slot.generation.load(Ordering::Acquire) as u16 != handle.generation {
            return None;
        }
        let ptr = slot.value.load(Ordering::Acquire);
        // SAFETY: a non-null pointer in a slot came from `Box::into_raw` in `insert` and stays
        // valid until `remove`, which the caller promises does not run concurrently.
        unsafe { ptr.as_ref() }
    }

    /// Whether `handle` is an object handle of this table (kind tag matches).
    pub(crate) fn is_own_kind(&self, handle: Handle) -> bool {
        handle.low == self.kind
    }

    /// Take the object out; the handle (and any copy of it) becomes stale.
    pub(crate) fn remove(&self, handle: Handle) -> Option<Box<T>> {
        let _writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let slot = self.slots.get(usize::from(handle.index))?;
        if slot.generation.load(Ordering::Relaxed) as u16 != handle.generation {
            return None;
        }
        let ptr = slot.value.swap(core::ptr::null_mut(), Ordering::AcqRel);
        if ptr.is_null() {
            return None;
        }
        let mut next = slot.generation.load(Ordering::Relaxed).wrapping_add(1) & 0xffff;
        if next == 0 {
            next = 1;
        }
        slot.generation.store(next, Ordering::Release);
        // SAFETY: the pointer came from `Box::into_raw` in `insert` and was just detached from
        // the slot, so this is its only owner.
        Some(unsafe { Box::from_raw(ptr) })
    }

    /// Remove and drop every object (used when the last `finalize` tears the plugin down).
    pub(crate) fn clear(&self) {
        for index in 0..N {
            let generation = self.slots[index].generation.load(Ordering::Relaxed) as u16;
            drop(self.remove(Handle {
                index: index as u16,
                generation,
                low: self.kind,
            }));
        }
    }
}

impl<T, const N: usize> Drop for Registry<T, N> {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_get_remove_round_trip() {
        let table: Registry<u32, 4> = Registry::new(7);
        let h = table.insert(Box::new(42)).expect("room");
        let p = h.to_ptr();
        let back = Handle::from_ptr(p).expect("non-null");
        assert_eq!(back, h);
        // SAFETY: nothing removes the entry while the reference is used.
        assert_eq!(unsafe { table.get(back) }.copied(), Some(42));
        assert_eq!(table.remove(back).map(|b| *b), Some(42));
        // SAFETY: as above.
        let stale = unsafe { table.get(back) };
        assert!(stale.is_none(), "stale handle must not resolve");
        assert!(
            table.remove(back).is_none(),
            "double close must be rejected"
        );
    }

    #[test]
    fn reused_slot_gets_new_generation() {
        let table: Registry<u32, 1> = Registry::new(1);
        let first = table.insert(Box::new(1)).expect("room");
        assert!(table.insert(Box::new(2)).is_none(), "full table refuses");
        drop(table.remove(first));
        let second = table.insert(Box::new(3)).expect("room again");
        assert_eq!(first.index, second.index);
        assert_ne!(first.generation, second.generation);
        // SAFETY: nothing removes entries concurrently in this test.
        assert!(unsafe { table.get(first) }.is_none());
        // SAFETY: as above.
        assert_eq!(unsafe { table.get(second) }.copied(), Some(3));
    }

    #[test]
    fn null_and_bogus_handles_do_not_resolve() {
        let table: Registry<u32, 8> = Registry::new(3);
        assert!(Handle::from_ptr(core::ptr::null_mut()).is_none());
        let bogus = Handle::from_ptr(0xdead_beef_usize as *mut _).expect("non-null");
        // SAFETY: nothing is removed concurrently.
        assert!(unsafe { table.get(bogus) }.is_none());
        let out_of_range = Handle {
            index: 9999,
            generation: 1,
            low: 3,
        };
        // SAFETY: as above.
        assert!(unsafe { table.get(out_of_range) }.is_none());
    }
}
