//! The memory-registration cache of one protection domain: which page ranges are registered,
//! and how many `regMr` handles share each registration.
//!
//! NCCL registers the same buffers many times: once per comm (every channel, every peer), and
//! again after each `deregMr`/`regMr` cycle of a user buffer. Pinning each anew multiplies the
//! locked memory a process needs (a hard limit in containers) and the time a connection takes to
//! set up. NCCL's own IB transport keeps, per device, a sorted list of registered page ranges with
//! reference counts (`ncclIbMrCache` in `net_ib/reg.cc`); this is the same policy, kept free of IO
//! so it can be tested exhaustively:
//!
//! - a request covers the pages its bytes touch: `[addr rounded down, addr + len rounded up)`;
//! - it **hits** an entry whose page range contains the whole request: the entry's count goes up
//!   and its registration serves the request (a registration covering more memory than asked for
//!   is harmless: the keys only ever address the bytes NCCL names, which the plugin checks);
//! - otherwise it **misses**: the caller registers exactly the request's page range and
//!   [`RegCache::insert`]s it with a count of one. Partially overlapping ranges become separate
//!   entries, as in NCCL (merging would mean re-registering memory that is in use);
//! - [`RegCache::release`] takes a count back and hands the registration out for deregistration
//!   when the count reaches zero.
//!
//! The cache is generic over the registration `M` it stores (a verbs memory region in the plugin,
//! a plain token in tests). It is used on the control path only (`regMr`, `deregMr`): lookups are
//! a binary search, insertion is a sorted insert.

use alloc::vec::Vec;
use core::fmt;

/// A page-aligned byte range `[start, end)` that one registration covers; the key of an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PageRange {
    /// First byte (page-aligned).
    pub start: u64,
    /// One past the last byte (page-aligned).
    pub end: u64,
}

impl PageRange {
    /// The pages `len` bytes at `addr` touch, with pages of `page` bytes (a power of two).
    /// `None` for zero length, a page size that is not a power of two, or a range past the end
    /// of the address space.
    pub fn covering(addr: u64, len: u64, page: u64) -> Option<Self> {
        if len == 0 || !page.is_power_of_two() {
            return None;
        }
        let start = addr & !(page - 1);
        let last = addr.checked_add(len - 1)?;
        let end = (last | (page - 1)).checked_add(1)?;
        Some(Self { start, end })
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    /// Whether the range is empty (never, for a range built by [`Self::covering`]).
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }

    /// Whether `other` lies entirely inside this range.
    pub fn contains(&self, other: &Self) -> bool {
        self.start <= other.start && other.end <= self.end
    }
}

impl fmt::Display for PageRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}..{:#x}", self.start, self.end)
    }
}

/// What [`RegCache::acquire`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// An entry covers the request; its count was taken. Release it with this key.
    Hit(PageRange),
    /// No entry covers it: register this range, then [`RegCache::insert`] it.
    Miss(PageRange),
}

/// Why the cache refused a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegCacheError {
    /// Zero bytes, or a range that wraps the address space: nothing to register.
    EmptyRange,
    /// [`RegCache::insert`] of a range that is already an entry (a caller bug: it should have
    /// been a hit).
    AlreadyCached(PageRange),
    /// [`RegCache::release`] of a range that is not an entry (released once too often).
    NotCached(PageRange),
    /// A count would pass `u32::MAX`.
    TooManyUsers(PageRange),
}

impl fmt::Display for RegCacheError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::EmptyRange => f.write_str("empty or wrapping address range"),
            Self::AlreadyCached(r) => write!(f, "pages {r} are already registered"),
            Self::NotCached(r) => write!(f, "pages {r} are not registered"),
            Self::TooManyUsers(r) => write!(f, "pages {r} have 2^32 - 1 registrations"),
        }
    }
}

#[derive(Debug)]
struct Entry<M> {
    range: PageRange,
    users: u32,
    registration: M,
}

/// The registrations of one protection domain, sorted by range (start, then end).
#[derive(Debug)]
pub struct RegCache<M> {
    entries: Vec<Entry<M>>,
    page: u64,
}

impl<M> RegCache<M> {
    /// An empty cache for pages of `page` bytes (a power of two; anything else is treated as
    /// 4096).
    pub fn new(page: u64) -> Self {
        Self {
            entries: Vec::new(),
            page: if page.is_power_of_two() { page } else { 4096 },
        }
    }

    /// The page size in force.
    pub fn page(&self) -> u64 {
        self.page
    }

    /// Number of registrations held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes registered in all, counting each registration once.
    pub fn registered_bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.range.len()).sum()
    }

    /// Look up `len` bytes at `addr`: take a count on an entry that covers them, or say which
    /// range to register.
    pub fn acquire(&mut self, addr: u64, len: u64) -> Result<Acquired, RegCacheError> {
        let want = PageRange::covering(addr, len, self.page).ok_or(RegCacheError::EmptyRange)?;
        // Candidates start at or before `want.start`: those are the entries before the first
        // one starting after it. Take the innermost-sorted one that covers the request, i.e. scan
        // back from there (ranges starting earlier may still reach past `want.end`).
        let after = self
            .entries
            .partition_point(|e| e.range.start <= want.start);
        let hit = self.entries[..after]
            .iter_mut()
            .rev()
            .find(|e| e.range.contains(&want));
        match hit {
            Some(entry) => {
                entry.users = entry
                    .users
                    .checked_add(1)
                    .ok_or(RegCacheError::TooManyUsers(entry.range))?;
                Ok(Acquired::Hit(entry.range))
            }
            None => Ok(Acquired::Miss(want)),
        }
    }

    /// Add the registration of `range` (after a [`Acquired::Miss`]) with one user.
    pub fn insert(&mut self, range: PageRange, registration: M) -> Result<(), RegCacheError> {
        match self.entries.binary_search_by(|e| e.range.cmp(&range)) {
            Ok(_) => Err(RegCacheError::AlreadyCached(range)),
            Err(at) => {
                self.entries.insert(
                    at,
                    Entry {
                        range,
                        users: 1,
                        registration,
                    },
                );
                Ok(())
            }
        }
    }

    /// The registration of the entry `range`.
    pub fn get(&self, range: PageRange) -> Option<&M> {
        self.entries
            .binary_search_by(|e| e.range.cmp(&range))
            .ok()
            .map(|i| &self.entries[i].registration)
    }

    /// Users of the entry `range` (0 when there is none).
    pub fn users(&self, range: PageRange) -> u32 {
        self.entries
            .binary_search_by(|e| e.range.cmp(&range))
            .map_or(0, |i| self.entries[i].users)
    }

    /// Give back one user of `range`. `Ok(Some(registration))` when it was the last: the caller
    /// deregisters it. `Ok(None)` while others still use it.
    pub fn release(&mut self, range: PageRange) -> Result<Option<M>, RegCacheError> {
        let at = self
            .entries
            .binary_search_by(|e| e.range.cmp(&range))
            .map_err(|_| RegCacheError::NotCached(range))?;
        let entry = &mut self.entries[at];
        entry.users -= 1;
        if entry.users > 0 {
            return Ok(None);
        }
        Ok(Some(self.entries.remove(at).registration))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    const PAGE: u64 = 4096;

    /// Acquire, registering on a miss with a token numbering the registrations; returns the key
    /// and whether it hit.
    fn take(cache: &mut RegCache<u32>, next: &mut u32, addr: u64, len: u64) -> (PageRange, bool) {
        match cache.acquire(addr, len).unwrap() {
            Acquired::Hit(r) => (r, true),
            Acquired::Miss(r) => {
                cache.insert(r, *next).unwrap();
                *next += 1;
                (r, false)
            }
        }
    }

    #[test]
    fn covering_rounds_to_whole_pages() {
        let r = PageRange::covering(0x1234, 1, PAGE).unwrap();
        assert_eq!((r.start, r.end), (0x1000, 0x2000));
        let r = PageRange::covering(0x1000, 0x1000, PAGE).unwrap();
        assert_eq!((r.start, r.end), (0x1000, 0x2000));
        let r = PageRange::covering(0x1fff, 2, PAGE).unwrap();
        assert_eq!((r.start, r.end), (0x1000, 0x3000));
        assert_eq!(PageRange::covering(0x1000, 0, PAGE), None);
        assert_eq!(PageRange::covering(u64::MAX - 10, 100, PAGE), None);
        assert_eq!(PageRange::covering(u64::MAX - 1, 1, PAGE), None);
        assert!(PageRange::covering(u64::MAX - PAGE, 1, PAGE).is_some());
        assert_eq!(PageRange::covering(0x1000, 1, 3000), None);
    }

    #[test]
    fn the_same_buffer_registered_many_times_is_pinned_once() {
        let mut cache = RegCache::new(PAGE);
        let mut next = 0;
        let buf = 0x7f00_0000_0000;
        let len = 64 << 20;
        let mut keys = vec![];
        for i in 0..100 {
            let (key, hit) = take(&mut cache, &mut next, buf, len);
            assert_eq!(hit, i > 0);
            keys.push(key);
        }
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.registered_bytes(), len);
        assert_eq!(cache.users(keys[0]), 100);
        for (i, key) in keys.iter().enumerate() {
            let last = cache.release(*key).unwrap();
            assert_eq!(last.is_some(), i == 99, "released at {i}");
        }
        assert!(cache.is_empty());
        assert_eq!(
            cache.release(keys[0]),
            Err(RegCacheError::NotCached(keys[0]))
        );
    }

    #[test]
    fn contained_ranges_hit_overlapping_and_adjacent_ones_miss() {
        let mut cache = RegCache::new(PAGE);
        let mut next = 0;
        let (big, _) = take(&mut cache, &mut next, 0x10_000, 0x10_000);
        // Contained, including unaligned starts and ends inside the pages.
        for (addr, len) in [
            (0x10_000, 0x10_000),
            (0x10_000, 1),
            (0x12_345, 0x100),
            (0x1f_fff, 1),
        ] {
            assert_eq!(take(&mut cache, &mut next, addr, len), (big, true));
        }
        // Adjacent on either side, and overlapping either edge: their own registrations.
        for (addr, len) in [
            (0x20_000, 0x1000),
            (0xf_000, 0x1000),
            (0x1f_000, 0x2000),
            (0xf_fff, 2),
        ] {
            let (key, hit) = take(&mut cache, &mut next, addr, len);
            assert!(!hit, "{addr:#x}+{len:#x} must miss");
            assert_ne!(key, big);
        }
        assert_eq!(cache.len(), 5);
        assert_eq!(cache.users(big), 5);
        // A range containing an earlier one does not reuse it (it is bigger), but later requests
        // inside either are served by some entry that covers them.
        let (outer, hit) = take(&mut cache, &mut next, 0x8_000, 0x20_000);
        assert!(!hit);
        for addr in (0x8_000..0x28_000).step_by(0x1000) {
            let (key, hit) = take(&mut cache, &mut next, addr, 0x800);
            assert!(hit, "{addr:#x} lies inside {outer}");
            assert!(key.contains(&PageRange::covering(addr, 0x800, PAGE).unwrap()));
        }
    }

    #[test]
    fn entries_stay_sorted_and_each_release_frees_exactly_its_own() {
        let mut cache = RegCache::new(PAGE);
        let mut next = 0;
        let mut keys = vec![];
        // Insert out of order, with nested and overlapping ranges.
        for (addr, len) in [
            (0x50_000, 0x1000),
            (0x10_000, 0x40_000),
            (0x30_000, 0x30_000),
            (0x0, 0x1000),
            (0x60_000, 0x2000),
        ] {
            keys.push(take(&mut cache, &mut next, addr, len).0);
        }
        // 0x50_000 was inserted first; the later 0x30_000..0x60_000 range contains it but the
        // lookup for 0x50_000 must find the entry it was registered with or any cover.
        let starts: Vec<u64> = cache.entries.iter().map(|e| e.range.start).collect();
        let mut sorted = starts.clone();
        sorted.sort_unstable();
        assert_eq!(starts, sorted);
        let tokens: Vec<u32> = keys.iter().map(|k| *cache.get(*k).unwrap()).collect();
        assert_eq!(tokens, [0, 1, 2, 3, 4]);
        for (i, key) in keys.iter().enumerate().rev() {
            assert_eq!(cache.release(*key).unwrap(), Some(tokens[i]));
            assert_eq!(cache.len(), i);
        }
    }

    #[test]
    fn a_double_insert_is_refused_and_bad_pages_are_refused() {
        let mut cache: RegCache<u32> = RegCache::new(PAGE);
        let Acquired::Miss(r) = cache.acquire(0x1000, 10).unwrap() else {
            panic!("empty cache must miss");
        };
        cache.insert(r, 1).unwrap();
        assert_eq!(cache.insert(r, 2), Err(RegCacheError::AlreadyCached(r)));
        assert_eq!(cache.acquire(0x1000, 0), Err(RegCacheError::EmptyRange));
        assert_eq!(RegCache::<u32>::new(3000).page(), 4096);
        assert_eq!(RegCache::<u32>::new(1 << 16).page(), 1 << 16);
    }

    /// Random requests against a model that records every live (range, users): the cache's
    /// answers and its final state must match, and pinned bytes never exceed one registration
    /// per distinct miss.
    #[test]
    fn matches_a_reference_model_under_random_use() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut cache = RegCache::new(PAGE);
        let mut model: Vec<(PageRange, u32)> = vec![];
        let mut held: Vec<PageRange> = vec![];
        for _ in 0..5000 {
            if rand(3) == 0 && !held.is_empty() {
                let key = held.swap_remove(rand(held.len() as u64) as usize);
                let freed = cache.release(key).unwrap().is_some();
                let at = model.iter().position(|(r, _)| *r == key).unwrap();
                model[at].1 -= 1;
                assert_eq!(freed, model[at].1 == 0);
                if freed {
                    model.remove(at);
                }
            } else {
                let addr = rand(64) * 0x800 + rand(0x800);
                let len = 1 + rand(8 * PAGE);
                let want = PageRange::covering(addr, len, PAGE).unwrap();
                let covered = model.iter().any(|(r, _)| r.contains(&want));
                match cache.acquire(addr, len).unwrap() {
                    Acquired::Hit(key) => {
                        assert!(covered);
                        assert!(key.contains(&want));
                        model.iter_mut().find(|(r, _)| *r == key).unwrap().1 += 1;
                        held.push(key);
                    }
                    Acquired::Miss(key) => {
                        assert!(!covered, "{want} is covered but missed");
                        assert_eq!(key, want);
                        cache.insert(key, 0).unwrap();
                        model.push((key, 1));
                        held.push(key);
                    }
                }
            }
            assert_eq!(cache.len(), model.len());
        }
        for (r, users) in &model {
            assert_eq!(cache.users(*r), *users);
        }
    }
}
