//! Tables of live objects handed to NCCL as opaque handles.
//!
//! NCCL stores our comm, memory-region and request handles as `void*` and passes them back. A
//! handle here is not a pointer: it packs a table index, a generation and a kind tag into the
//! pointer-sized value, so a NULL, stale (closed) or bogus handle is recognised and answered with
//! an error instead of being dereferenced.
//!
//! Each table grows on the control path, in chunks of [`CHUNK`] slots allocated when the slots so
//! far are all in use, up to [`MAX_ENTRIES`] (the most a 16-bit index addresses). The static part
//! is a directory of chunk pointers that starts all-NULL, so the tables cost the library no
//! initialised data. Lookups are lock-free: three atomic loads (chunk, generation, object), no
//! allocation. Insertion and removal are control-path operations serialised by a mutex.
//!
//! Chunks are never freed: a stale handle may be looked up (lock-free) at any time, also while
//! the last `finalize` tears objects down, and only a chunk that stays allocated makes that lookup
//! safe without a lock. The memory is bounded by the peak number of live objects (16 bytes a
//! slot, at most 1 MiB a table) and is reused by later objects; on `dlclose` it stays behind as
//! an unreachable allocation, which frees nothing twice and leaves no thread or destructor that
//! could run into unmapped code.

use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

/// Slots per chunk (a 4 KiB allocation for 16-byte slots).
pub(crate) const CHUNK: usize = 256;
/// Most entries a table holds: every value of the 16-bit handle index.
pub(crate) const MAX_ENTRIES: usize = 1 << 16;
const MAX_CHUNKS: usize = MAX_ENTRIES / CHUNK;

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

/// A table is at its limit. The text names the limit, for NCCL's log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TableFull {
    /// What the table holds ("live connections").
    pub(crate) what: &'static str,
    /// How many it holds at most.
    pub(crate) capacity: usize,
}

impl fmt::Display for TableFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Rivet's limit of {} {} per process is reached; close some first",
            self.capacity, self.what
        )
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

struct Chunk<T> {
    slots: [Slot<T>; CHUNK],
}

/// The writer's view: where to look for a free slot next, and how many slots exist.
struct Cursor {
    next: usize,
    len: usize,
}

/// A growable table of boxed `T`s addressed by [`Handle`]s.
pub(crate) struct Registry<T> {
    /// Chunk `i` holds slots `i * CHUNK ..`; NULL until first needed, then never changed.
    chunks: [AtomicPtr<Chunk<T>>; MAX_CHUNKS],
    kind: u32,
    capacity: usize,
    what: &'static str,
    /// Serialises insert/remove.
    writer: Mutex<Cursor>,
}

impl<T> Registry<T> {
    /// An empty table of up to [`MAX_ENTRIES`] `what`s whose handles carry `kind` in their low
    /// bits. `kind` must be non-zero.
    pub(crate) const fn new(kind: u32, what: &'static str) -> Self {
        Self::with_capacity(kind, what, MAX_ENTRIES)
    }

    /// As [`Registry::new`], holding at most `capacity` (≤ [`MAX_ENTRIES`]) objects.
    pub(crate) const fn with_capacity(kind: u32, what: &'static str, capacity: usize) -> Self {
        assert!(kind != 0 && capacity <= MAX_ENTRIES);
        Self {
            chunks: [const { AtomicPtr::new(core::ptr::null_mut()) }; MAX_CHUNKS],
            kind,
            capacity,
            what,
            writer: Mutex::new(Cursor { next: 0, len: 0 }),
        }
    }

    fn slot(&self, index: usize) -> Option<&Slot<T>> {
        let chunk = self.chunks.get(index / CHUNK)?.load(Ordering::Acquire);
        // SAFETY: a non-null chunk pointer came from `Box::into_raw` in `grow` and is freed only
        // by `drop`, which has the table exclusively.
        let chunk = unsafe { chunk.as_ref() }?;
        chunk.slots.get(index % CHUNK)
    }

    /// Allocate the chunk holding slot `len` (the first slot past the existing ones).
    fn grow(&self, cursor: &mut Cursor) {
        let chunk = Box::new(Chunk {
            slots: [const { Slot::empty() }; CHUNK],
        });
        self.chunks[cursor.len / CHUNK].store(Box::into_raw(chunk), Ordering::Release);
        cursor.len = (cursor.len + CHUNK).min(self.capacity);
    }

    /// Store `value`, growing the table if every existing slot is in use; [`TableFull`] at the
    /// capacity.
    pub(crate) fn insert(&self, value: Box<T>) -> Result<Handle, TableFull> {
        let mut cursor = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let free = (0..cursor.len)
            .map(|step| (cursor.next + step) % cursor.len)
            .find(|&index| {
                self.slot(index)
                    .is_some_and(|slot| slot.value.load(Ordering::Relaxed).is_null())
            });
        let index = match free {
            Some(index) => index,
            None if cursor.len < self.capacity => {
                let first_new = cursor.len;
                self.grow(&mut cursor);
                first_new
            }
            None => {
                return Err(TableFull {
                    what: self.what,
                    capacity: self.capacity,
                });
            }
        };
        let Some(slot) = self.slot(index) else {
            unreachable!("slot {index} below the table length has a chunk");
        };
        let generation = slot.generation.load(Ordering::Relaxed) as u16;
        slot.value.store(Box::into_raw(value), Ordering::Release);
        cursor.next = (index + 1) % cursor.len;
        Ok(Handle {
            index: index as u16,
            generation,
            low: self.kind,
        })
    }

    /// The object behind `handle`, if the handle is live and belongs to this table.
    ///
    /// # Safety
    /// The returned reference is valid until [`Registry::remove`] is called for the same handle.
    /// The caller must guarantee that does not happen while the reference is in use: NCCL's
    /// contract makes a close the last call on a comm, so entry points may rely on it.
    pub(crate) unsafe fn get(&self, handle: Handle) -> Option<&T> {
        let slot = self.slot(usize::from(handle.index))?;
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
        let slot = self.slot(usize::from(handle.index))?;
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
}

impl<T> Drop for Registry<T> {
    /// Only tables that are not statics are ever dropped (tests); the exported ones live as long
    /// as the library.
    fn drop(&mut self) {
        for chunk in &mut self.chunks {
            let chunk = core::mem::replace(chunk.get_mut(), core::ptr::null_mut());
            if chunk.is_null() {
                continue;
            }
            // SAFETY: the pointer came from `Box::into_raw` in `grow`; `&mut self` means no
            // reference into it is alive, and it was just detached from the table.
            let chunk = unsafe { Box::from_raw(chunk) };
            for slot in &chunk.slots {
                let value = slot.value.load(Ordering::Relaxed);
                if !value.is_null() {
                    // SAFETY: a non-null slot value came from `Box::into_raw` in `insert` and
                    // was never removed; the table is being dropped, so this is its last owner.
                    drop(unsafe { Box::from_raw(value) });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_get_remove_round_trip() {
        let table: Registry<u32> = Registry::with_capacity(7, "numbers", 4);
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
        let table: Registry<u32> = Registry::with_capacity(1, "numbers", 1);
        let first = table.insert(Box::new(1)).expect("room");
        assert!(table.insert(Box::new(2)).is_err(), "full table refuses");
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
        let table: Registry<u32> = Registry::with_capacity(3, "numbers", 8);
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

    /// The table grows past its first chunks on demand, every object stays reachable, and the
    /// refusal at the capacity names the limit.
    #[test]
    fn grows_in_chunks_up_to_the_capacity_and_names_the_limit() {
        let capacity = 2 * CHUNK + 3;
        let table: Registry<usize> = Registry::with_capacity(5, "live things", capacity);
        let handles: Vec<Handle> = (0..capacity)
            .map(|i| table.insert(Box::new(i)).expect("room below the capacity"))
            .collect();
        assert_eq!(
            table
                .chunks
                .iter()
                .filter(|c| !c.load(Ordering::Relaxed).is_null())
                .count(),
            3,
            "chunks are allocated only as needed"
        );
        for (i, h) in handles.iter().enumerate() {
            // SAFETY: nothing removes entries concurrently in this test.
            assert_eq!(unsafe { table.get(*h) }.copied(), Some(i));
        }
        let full = table.insert(Box::new(0)).expect_err("at the capacity");
        assert_eq!(full.capacity, capacity);
        let text = full.to_string();
        assert!(text.contains("515 live things"), "{text}");
        // A freed slot in the middle is found again, with a new generation.
        let middle = handles[CHUNK + 7];
        assert_eq!(table.remove(middle).map(|b| *b), Some(CHUNK + 7));
        let again = table.insert(Box::new(77)).expect("a slot was freed");
        assert_eq!(again.index, middle.index);
        assert_ne!(again.generation, middle.generation);
        // SAFETY: as above.
        assert!(unsafe { table.get(middle) }.is_none(), "stale after reuse");
    }

    /// The production tables hold every index a handle can carry (the fixed connection table
    /// held 16 384), and allocate nothing until used.
    #[test]
    fn production_capacity_is_the_whole_index_space() {
        let table: Registry<u8> = Registry::new(9, "bytes");
        assert_eq!(table.capacity, usize::from(u16::MAX) + 1);
        let last = Handle {
            index: u16::MAX,
            generation: 1,
            low: 9,
        };
        // SAFETY: nothing is removed concurrently.
        let found = unsafe { table.get(last) };
        assert!(found.is_none(), "no chunk yet: no object");
    }
}
