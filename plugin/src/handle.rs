//! The one typed handle layer: tables of live objects handed to NCCL as opaque handles.
//!
//! NCCL stores our comm, memory-region, context and request handles as `void*` and passes them
//! back. A handle here is not a pointer: it packs a table index, a generation and a kind tag into
//! the pointer-sized value, so a NULL, stale (closed) or bogus handle is recognised and answered
//! with an error instead of being dereferenced. Each kind of object has its own
//! [`Registry<T>`], so a lookup is typed the way rustls-ffi's `Castable` types each pointer: the
//! table checks the kind tag and the generation and hands back a `&T` or the error naming the
//! call and argument ([`Registry::lookup`]), in one decode. Request handles reuse their comm's
//! index and generation and carry the request id in place of the kind tag
//! ([`Handle::request_ptr`], [`Registry::lookup_request`]).
//!
//! Unsafe (this module opts in): the tables hold raw pointers from `Box::into_raw`, and a lookup
//! turns one into a reference without a lock. The reference stays valid until the object is
//! removed; [`Registry::remove`] is therefore `unsafe`, and its callers (the close entry points)
//! promise that no reference to the object is in use, which NCCL's contract gives them: a close
//! is the last call on an object, after every other call on it returned.
//!
//! **Slots.** A table has one slot for each of the [`MAX_ENTRIES`] indices a 16-bit handle index
//! addresses, in one array, so a lookup indexes it directly: no bounds check (every `u16` is in
//! it) and no directory. Each table's slots are a static of its own ([`registry!`] declares both),
//! zero words (empty slots) in `.bss`: address space, not file size, and memory only for the
//! pages of slots written (512 slots a page: the free-slot search covers the slots used so far and
//! widens by [`CHUNK`] when they are all in use, so it stays in the first pages). Nothing is
//! allocated for them, so nothing is left behind when NCCL unloads the library. Insertion and
//! removal are control-path operations serialised by a mutex.
//!
//! **A slot is one atomic word**: the slot's generation in bits 48–63 (where a handle carries
//! its generation too) and the object's address in bits 0–47 (0 while the slot is empty). A
//! lookup is two loads (the table's slots pointer, the slot word): the handle's generation bits
//! XORed into the word leave exactly the address when the generations agree and the slot is
//! occupied, and a value with any of bits 48–63 set (another generation) or 0 (an empty slot)
//! otherwise, so one compare decides. Address and generation come from the same load, so a
//! lookup never pairs one incarnation's generation with another's object. A live slot's
//! generation is never 0 (generations start at 1 and skip 0 when they wrap), so NULL never names
//! an object. Insertion refuses an object whose address does not fit in 48 bits (user-space
//! addresses on Linux do unless a program maps above them on purpose, or the allocator tags its
//! pointers): it is never stored truncated.
//!
//! **Why a lock-free lookup is sound.** A slot word is written only under the writer mutex:
//! `insert` stores `generation | address` (release, after the object was written), `remove`
//! stores `next generation | 0`. A lookup that reads a word (acquire) either sees an older or
//! newer generation, or an empty slot, and answers "not live", or sees this handle's generation
//! with an address, and then the object was published before that store and is not freed until
//! a `remove`, which its callers promise happens only when no reference from a lookup is in use.
//! The slots are statics: a stale handle may be looked up (lock-free) at any time, also while the
//! last `finalize` tears objects down, and the slots it reads exist as long as the code reading
//! them. They are reused by later objects.

#![allow(unsafe_code)]

use crate::error::{NetError, NetResult};
use core::ffi::c_void;
use core::marker::PhantomData;
use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

/// A handle as NCCL holds it: an opaque pointer-sized value.
pub(crate) type Ptr = *mut c_void;

/// Slots the free-slot search widens by when every slot it covers is in use.
pub(crate) const CHUNK: usize = 256;
/// Most entries a table holds: every value of the 16-bit handle index.
pub(crate) const MAX_ENTRIES: usize = 1 << 16;

/// Bits 48–63 of a handle and of a slot word: the generation.
const GENERATION_BITS: u64 = 0xffff << 48;
/// Bits 0–47 of a slot word: the object's address.
const ADDRESS_BITS: u64 = (1 << 48) - 1;

/// A decoded handle: bits 48–63 the generation of its slot, 32–47 the slot index, 0–31 the
/// table's kind tag (object handles) or a request id (request handles). Never 0: generations
/// start at 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Handle(u64);

impl Handle {
    fn new(index: u16, generation: u16, low: u32) -> Self {
        Self(u64::from(generation) << 48 | u64::from(index) << 32 | u64::from(low))
    }

    /// Slot index.
    fn index(self) -> u16 {
        (self.0 >> 32) as u16
    }

    /// Incarnation of the slot; bumped on every removal.
    #[cfg(test)]
    fn generation(self) -> u16 {
        (self.0 >> 48) as u16
    }

    /// The table's kind tag for object handles, or a request id for request handles.
    fn low(self) -> u32 {
        self.0 as u32
    }

    /// Pack into the pointer-sized value NCCL stores.
    pub(crate) fn to_ptr(self) -> Ptr {
        self.0 as usize as Ptr
    }

    /// A request handle of this object handle's object: its index and generation, and request
    /// `id` (non-zero) in place of the kind tag; [`Registry::lookup_request`] resolves it.
    pub(crate) fn request_ptr(self, id: u32) -> Ptr {
        Self(self.0 & !u64::from(u32::MAX) | u64::from(id)).to_ptr()
    }

    /// Unpack; `None` for NULL.
    fn from_ptr(ptr: Ptr) -> Option<Self> {
        let bits = ptr as usize as u64;
        (bits != 0).then_some(Self(bits))
    }
}

/// The error for a handle that is NULL or not a live object of the expected kind.
#[cold]
#[inline(never)]
pub(crate) fn unknown(call: &str, what: &str, ptr: Ptr) -> NetError {
    if ptr.is_null() {
        NetError::misuse(format!("{call}: {what} is NULL"))
    } else {
        NetError::misuse(format!(
            "{call}: {what} {ptr:p} is not a live Rivet object (closed, or never created)"
        ))
    }
}

/// Why [`Registry::insert`] refused an object. The text names the limit, for NCCL's log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The table is at its limit.
    Full {
        /// What the table holds ("live connections").
        what: &'static str,
        /// How many it holds at most.
        capacity: usize,
    },
    /// The object's address does not fit a slot's 48 address bits.
    Unaddressable {
        /// What the table holds.
        what: &'static str,
        /// The address.
        address: usize,
    },
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Full { what, capacity } => write!(
                f,
                "Rivet's limit of {capacity} {what} per process is reached; close some first"
            ),
            Self::Unaddressable { what, address } => write!(
                f,
                "Rivet's table of {what} holds 48-bit addresses and the allocator returned \
                 {address:#x}"
            ),
        }
    }
}

/// Every slot of a table: one word each, generation and address (see the module documentation).
pub(crate) type Slots = [AtomicU64; MAX_ENTRIES];

/// A static table of `T`s, `static COMMS: Registry<DataComm> = registry!(0xda7a, "live
/// connections");`, with slots of its own: a static of zero words (every slot empty), so in
/// `.bss`, which costs the library address space, not file size, and memory only for the pages
/// of slots written.
macro_rules! registry {
    ($kind:expr, $what:expr) => {{
        static SLOTS: $crate::handle::Slots =
            [const { ::std::sync::atomic::AtomicU64::new(0) }; $crate::handle::MAX_ENTRIES];
        $crate::handle::Registry::new($kind, $what, &SLOTS)
    }};
}
pub(crate) use registry;

/// The writer's view: where to look for a free slot next, and how many slots the search covers.
struct Cursor {
    next: usize,
    len: usize,
}

/// A table of boxed `T`s addressed by [`Handle`]s.
pub(crate) struct Registry<T> {
    /// The table's slots: a static of its own ([`registry!`]), never freed, so a lookup of any
    /// handle may read them at any time while the library is loaded.
    slots: &'static Slots,
    kind: u32,
    capacity: usize,
    what: &'static str,
    /// Serialises insert/remove.
    writer: Mutex<Cursor>,
    /// The slots address boxed `T`s; the marker keeps the auto traits of the table of
    /// `AtomicPtr<T>` slots this layout replaced.
    holds: PhantomData<AtomicPtr<T>>,
}

impl<T> Registry<T> {
    /// An empty table of up to [`MAX_ENTRIES`] `what`s in `slots` (all empty, used by no other
    /// table) whose handles carry `kind` in their low bits. `kind` must be non-zero. Statics are
    /// declared with [`registry!`].
    pub(crate) const fn new(kind: u32, what: &'static str, slots: &'static Slots) -> Self {
        Self::with_capacity(kind, what, MAX_ENTRIES, slots)
    }

    /// As [`Registry::new`], holding at most `capacity` (≤ [`MAX_ENTRIES`]) objects.
    pub(crate) const fn with_capacity(
        kind: u32,
        what: &'static str,
        capacity: usize,
        slots: &'static Slots,
    ) -> Self {
        assert!(kind != 0 && capacity <= MAX_ENTRIES);
        Self {
            slots,
            kind,
            capacity,
            what,
            writer: Mutex::new(Cursor { next: 0, len: 0 }),
            holds: PhantomData,
        }
    }

    /// Slot `index`; any `u16` index is in the table.
    #[inline(always)]
    fn slot(&self, index: u16) -> &AtomicU64 {
        &self.slots[usize::from(index)]
    }

    /// Store `value` in a free slot, widening the search by [`CHUNK`] slots when every slot it
    /// covers is in use; [`Refused`] at the capacity (or for an address a slot cannot hold).
    pub(crate) fn insert(&self, value: Box<T>) -> Result<Handle, Refused> {
        let mut cursor = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let slots = self.slots;
        let free = (0..cursor.len)
            .map(|step| (cursor.next + step) % cursor.len)
            .find(|&index| slots[index].load(Ordering::Relaxed) & ADDRESS_BITS == 0);
        let index = match free {
            Some(index) => index,
            None if cursor.len < self.capacity => {
                let first_new = cursor.len;
                cursor.len = (cursor.len + CHUNK).min(self.capacity);
                first_new
            }
            None => {
                return Err(Refused::Full {
                    what: self.what,
                    capacity: self.capacity,
                });
            }
        };
        let address = Box::into_raw(value);
        if address as usize as u64 & !ADDRESS_BITS != 0 {
            // SAFETY: just detached from its box above and stored nowhere.
            drop(unsafe { Box::from_raw(address) });
            return Err(Refused::Unaddressable {
                what: self.what,
                address: address as usize,
            });
        }
        // Generation 0 is never live (a slot not yet used has it): NULL never names an object.
        let generation = (slots[index].load(Ordering::Relaxed) >> 48).max(1);
        slots[index].store(
            generation << 48 | address as usize as u64,
            Ordering::Release,
        );
        cursor.next = (index + 1) % cursor.len;
        Ok(Handle::new(index as u16, generation as u16, self.kind))
    }

    /// The address of the object in the slot `bits` (a handle's) names, if the slot is occupied
    /// in the handle's generation, whatever the low bits; `None` otherwise (also for NULL: no
    /// slot has generation 0).
    #[inline(always)]
    fn address(&self, bits: u64) -> Option<usize> {
        let word = self.slot((bits >> 32) as u16).load(Ordering::Acquire);
        // The address when the generations agree and the slot is occupied; otherwise 0 or a
        // value with a generation bit set.
        let address = word ^ (bits & GENERATION_BITS);
        if address.wrapping_sub(1) >= ADDRESS_BITS {
            return None;
        }
        Some(address as usize)
    }

    /// The object at `address`, from [`Registry::address`].
    #[inline(always)]
    fn object(&self, address: usize) -> &T {
        // SAFETY: `address` (non-zero: `Registry::address` refuses 0) came from a slot of the
        // handle's generation, so from `Box::into_raw` in `insert`, published by the release
        // store the slot load acquired; it stays valid until `remove`, whose callers promise no
        // reference from here is still in use.
        unsafe {
            core::hint::assert_unchecked(address != 0);
            &*(address as *const T)
        }
    }

    /// The object in `handle`'s slot if the generation matches, whatever the low bits.
    fn live(&self, handle: Handle) -> Option<&T> {
        self.address(handle.0).map(|address| self.object(address))
    }

    /// Decode `ptr` as a handle of this table: `None` for NULL or another kind of handle.
    pub(crate) fn decode(&self, ptr: Ptr) -> Option<Handle> {
        Handle::from_ptr(ptr).filter(|h| h.low() == self.kind)
    }

    /// The object behind a handle of this table, if it is still live (generation check).
    pub(crate) fn find(&self, handle: Handle) -> Option<&T> {
        if handle.low() != self.kind {
            return None;
        }
        self.live(handle)
    }

    /// The live object behind the handle NCCL passed to `call` as argument `what`, or the
    /// error naming both: kind check (which refuses NULL too: kinds are non-zero), then the
    /// generation and occupancy check of [`Registry::address`].
    #[inline]
    pub(crate) fn lookup(&self, call: &str, what: &str, ptr: Ptr) -> NetResult<(Handle, &T)> {
        let bits = ptr as usize as u64;
        if bits as u32 == self.kind
            && let Some(address) = self.address(bits)
        {
            return Ok((Handle(bits), self.object(address)));
        }
        Err(unknown(call, what, ptr))
    }

    /// The live object a request handle belongs to, and the request id it carries.
    #[inline]
    pub(crate) fn lookup_request(&self, call: &str, what: &str, ptr: Ptr) -> NetResult<(&T, u32)> {
        let bits = ptr as usize as u64;
        match self.address(bits) {
            Some(address) => Ok((self.object(address), bits as u32)),
            None => Err(unknown(call, what, ptr)),
        }
    }

    /// Call `f` with every live object, holding the writer's lock (so none is removed meanwhile,
    /// and inserts and removes of other threads wait). Off the data path: port failover to
    /// another device looks up the registrations of a connection's buffers with it.
    #[cfg_attr(not(feature = "failover"), allow(dead_code))]
    pub(crate) fn for_each(&self, mut f: impl FnMut(&T)) {
        let cursor = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        for slot in &self.slots[..cursor.len] {
            let address = slot.load(Ordering::Acquire) & ADDRESS_BITS;
            if address != 0 {
                f(self.object(address as usize));
            }
        }
    }

    /// Take the object out; the handle (and any copy of it) becomes stale.
    ///
    /// # Safety
    /// No reference to the object obtained from [`Registry::find`], [`Registry::lookup`] or
    /// [`Registry::lookup_request`] may be in use, on any thread, from this call on. NCCL's
    /// contract gives that to the close entry points: a close is the last call on an object.
    pub(crate) unsafe fn remove(&self, handle: Handle) -> Option<Box<T>> {
        let _writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let slot = self.slot(handle.index());
        let word = slot.load(Ordering::Relaxed);
        let address = word ^ (handle.0 & GENERATION_BITS);
        if address.wrapping_sub(1) >= ADDRESS_BITS {
            return None;
        }
        let mut next = (word >> 48).wrapping_add(1) & 0xffff;
        if next == 0 {
            next = 1;
        }
        slot.store(next << 48, Ordering::Release);
        // SAFETY: the address came from `Box::into_raw` in `insert` and was just detached from
        // the slot, so this is its only owner.
        Some(unsafe { Box::from_raw(address as usize as *mut T) })
    }
}

impl<T> Drop for Registry<T> {
    /// Only tables that are not statics are ever dropped (tests); the exported ones live as long
    /// as the library.
    fn drop(&mut self) {
        for slot in self.slots {
            let address = slot.swap(0, Ordering::Relaxed) & ADDRESS_BITS;
            if address != 0 {
                // SAFETY: a non-zero slot address came from `Box::into_raw` in `insert` and was
                // never removed; the table is being dropped, so this is its last owner.
                drop(unsafe { Box::from_raw(address as usize as *mut T) });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slots for a test's table: zeroed, leaked (a test's tables are dropped, their slots not).
    fn test_slots() -> &'static Slots {
        Box::leak(
            (0..MAX_ENTRIES)
                .map(|_| AtomicU64::new(0))
                .collect::<Box<[_]>>()
                .try_into()
                .expect("MAX_ENTRIES slots"),
        )
    }

    /// Remove in a test that holds no reference into the table.
    fn remove<T>(table: &Registry<T>, handle: Handle) -> Option<Box<T>> {
        // SAFETY: the tests keep no reference from `find` across a removal.
        unsafe { table.remove(handle) }
    }

    #[test]
    fn insert_get_remove_round_trip() {
        let table: Registry<u32> = Registry::with_capacity(7, "numbers", 4, test_slots());
        let h = table.insert(Box::new(42)).expect("room");
        let p = h.to_ptr();
        let back = Handle::from_ptr(p).expect("non-null");
        assert_eq!(back, h);
        assert_eq!(table.find(back).copied(), Some(42));
        assert_eq!(remove(&table, back).map(|b| *b), Some(42));
        let stale = table.find(back);
        assert!(stale.is_none(), "stale handle must not resolve");
        assert!(
            remove(&table, back).is_none(),
            "double close must be rejected"
        );
    }

    #[test]
    fn reused_slot_gets_new_generation() {
        let table: Registry<u32> = Registry::with_capacity(1, "numbers", 1, test_slots());
        let first = table.insert(Box::new(1)).expect("room");
        assert!(table.insert(Box::new(2)).is_err(), "full table refuses");
        drop(remove(&table, first));
        let second = table.insert(Box::new(3)).expect("room again");
        assert_eq!(first.index(), second.index());
        assert_ne!(first.generation(), second.generation());
        assert!(table.find(first).is_none());
        assert_eq!(table.find(second).copied(), Some(3));
    }

    #[test]
    fn null_and_bogus_handles_do_not_resolve() {
        let table: Registry<u32> = Registry::with_capacity(3, "numbers", 8, test_slots());
        assert!(Handle::from_ptr(core::ptr::null_mut()).is_none());
        let bogus = Handle::from_ptr(0xdead_beef_usize as *mut _).expect("non-null");
        assert!(table.find(bogus).is_none());
        let out_of_range = Handle::new(9999, 1, 3);
        assert!(table.find(out_of_range).is_none());
    }

    /// A slot word holds generation and address together: a handle of the slot's current
    /// generation resolves only while the slot is occupied, and one of any other generation
    /// (0 included, which no live slot has) never does.
    #[test]
    fn generation_and_occupancy_are_decided_by_one_word() {
        let table: Registry<u32> = Registry::with_capacity(4, "numbers", 2, test_slots());
        let h = table.insert(Box::new(8)).expect("room");
        let index = h.index();
        for generation in [0, 2, u16::MAX] {
            assert!(table.find(Handle::new(index, generation, 4)).is_none());
        }
        assert_eq!(table.find(h).copied(), Some(8));
        drop(remove(&table, h));
        // The slot is empty in generation 2 now: that generation's handle finds nothing either.
        assert!(table.find(Handle::new(index, 2, 4)).is_none());
        assert!(remove(&table, Handle::new(index, 2, 4)).is_none());
        // A slot never handed out (generation 0, address 0), in any generation.
        for generation in [0, 1] {
            assert!(table.find(Handle::new(index + 1, generation, 4)).is_none());
        }
    }

    /// Lookups of stale handles on one thread while another keeps inserting into and removing
    /// from the same slots: a stale handle never resolves, whichever incarnation the slot holds.
    /// (Only stale handles: a live one may not be looked up across its removal.)
    #[test]
    fn stale_handles_never_resolve_while_slots_are_reused() {
        let table: Registry<u64> = Registry::with_capacity(6, "numbers", 2, test_slots());
        std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::channel::<Handle>();
            let table = &table;
            scope.spawn(move || {
                for n in 0..5_000u64 {
                    let h = table.insert(Box::new(n)).expect("room");
                    drop(remove(table, h));
                    tx.send(h).expect("reader alive");
                }
            });
            let mut seen = Vec::new();
            for h in rx {
                seen.push(h);
                for stale in seen.iter().rev().take(8) {
                    assert!(table.find(*stale).is_none());
                }
            }
        });
    }

    /// The table takes its slots at the first insertion and fills them up to the capacity,
    /// every object stays reachable, and the refusal at the capacity names the limit.
    #[test]
    fn fills_up_to_the_capacity_and_names_the_limit() {
        let capacity = 2 * CHUNK + 3;
        let table: Registry<usize> =
            Registry::with_capacity(5, "live things", capacity, test_slots());
        let handles: Vec<Handle> = (0..capacity)
            .map(|i| table.insert(Box::new(i)).expect("room below the capacity"))
            .collect();
        for (i, h) in handles.iter().enumerate() {
            assert_eq!(table.find(*h).copied(), Some(i));
        }
        let full = table.insert(Box::new(0)).expect_err("at the capacity");
        assert_eq!(
            full,
            Refused::Full {
                what: "live things",
                capacity
            }
        );
        let text = full.to_string();
        assert!(text.contains("515 live things"), "{text}");
        // A freed slot in the middle is found again, with a new generation.
        let middle = handles[CHUNK + 7];
        assert_eq!(remove(&table, middle).map(|b| *b), Some(CHUNK + 7));
        let again = table.insert(Box::new(77)).expect("a slot was freed");
        assert_eq!(again.index(), middle.index());
        assert_ne!(again.generation(), middle.generation());
        assert!(table.find(middle).is_none(), "stale after reuse");
    }

    /// The production tables hold every index a handle can carry (the fixed connection table
    /// held 16 384), and allocate nothing until used.
    #[test]
    fn production_capacity_is_the_whole_index_space() {
        let table: Registry<u8> = Registry::new(9, "bytes", test_slots());
        assert_eq!(table.capacity, usize::from(u16::MAX) + 1);
        let last = Handle::new(u16::MAX, 1, 9);
        let found = table.find(last);
        assert!(found.is_none(), "an empty slot: no object");
    }

    /// The typed lookup answers NULL, another table's handle, a stale handle and a request
    /// handle with the error naming call and argument, and resolves request handles to their
    /// object with the id they carry.
    #[test]
    fn typed_lookup_checks_kind_and_generation() {
        let comms: Registry<u32> = Registry::with_capacity(0xda7a, "comms", 4, test_slots());
        let others: Registry<u32> = Registry::with_capacity(0x3e3e, "others", 4, test_slots());
        let h = comms.insert(Box::new(5)).expect("room");
        let other = others.insert(Box::new(6)).expect("room");
        let (found, value) = comms.lookup("isend", "sendComm", h.to_ptr()).expect("live");
        assert_eq!((found, *value), (h, 5));

        let null = comms.lookup("isend", "sendComm", core::ptr::null_mut());
        assert!(
            null.expect_err("NULL")
                .message()
                .contains("isend: sendComm is NULL")
        );
        let wrong_kind = comms.lookup("isend", "sendComm", other.to_ptr());
        assert!(
            wrong_kind
                .expect_err("another table's")
                .message()
                .contains("not a live Rivet object")
        );

        let request = h.request_ptr(77);
        assert!(
            comms.lookup("isend", "sendComm", request).is_err(),
            "a request is no comm"
        );
        let (owner, id) = comms
            .lookup_request("test", "request", request)
            .expect("live comm");
        assert!(
            comms
                .lookup_request("test", "request", core::ptr::null_mut())
                .expect_err("NULL, with an object in slot 0")
                .message()
                .contains("test: request is NULL")
        );
        assert_eq!((*owner, id), (5, 77));

        assert_eq!(remove(&comms, h).map(|b| *b), Some(5));
        assert!(
            comms.lookup("isend", "sendComm", h.to_ptr()).is_err(),
            "stale comm"
        );
        let stale = comms.lookup_request("test", "request", request);
        assert!(
            stale
                .expect_err("stale request")
                .message()
                .contains("test: request")
        );
    }
}
