//! Who owns which bytes of a collective, and the order in which contributions fold.
//!
//! Every byte of an operation's window has one **owner** rank. For `iallreduce` the `count`
//! elements are split into `nranks` contiguous segments, the first `count % nranks` one element
//! longer ([`Regions::Split`]); for `ireducescatter`/`iallgather` rank `q` owns
//! `[q·bytesPerRank, (q+1)·bytesPerRank)` of the `nranks·bytesPerRank`-byte vector, cut to the
//! window NCCL asks for ([`Regions::PerRank`]).
//!
//! **Fold order.** An element owned by rank `q` is reduced as the left fold over ranks
//! `q+1, q+2, …, n−1, 0, …, q` (every rank once, the owner last), then finished (`avg`
//! divides). The owner computes it; every other rank receives the owner's bytes. This is the
//! order a ring reduce-scatter accumulates in, so the same definition would hold for a ring.

use super::reduce::{ReduceError, Reduction};

/// Largest group Rivet's CollNet forms (each rank keeps a connection to every other).
pub const MAX_RANKS: u32 = 256;

/// A byte range relative to the start of the operation's window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// First byte.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// How an operation's window divides among the owners.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Regions {
    /// `count` elements of `elem` bytes in `nranks` near-equal contiguous segments.
    Split {
        /// Elements.
        count: u64,
        /// Bytes per element.
        elem: u64,
    },
    /// Rank `q` owns `[q·bytes_per_rank, (q+1)·bytes_per_rank)`; the operation covers
    /// `[window_offset, window_offset + window_bytes)` of that vector.
    PerRank {
        /// Bytes each rank owns.
        bytes_per_rank: u64,
        /// First byte of the window.
        window_offset: u64,
        /// Bytes in the window.
        window_bytes: u64,
    },
}

impl Regions {
    /// Bytes in the window.
    pub const fn window_len(&self) -> u64 {
        match *self {
            Self::Split { count, elem } => count.saturating_mul(elem),
            Self::PerRank { window_bytes, .. } => window_bytes,
        }
    }

    /// What rank `q` of `nranks` owns, relative to the window (empty spans sit at their
    /// position, which may be the window's end).
    pub fn region(&self, nranks: u32, q: u32) -> Span {
        let (n, q) = (u64::from(nranks.max(1)), u64::from(q));
        match *self {
            Self::Split { count, elem } => {
                let (base, rem) = (count / n, count % n);
                let start = q * base + q.min(rem);
                let len = base + u64::from(q < rem);
                Span {
                    offset: start * elem,
                    len: len * elem,
                }
            }
            Self::PerRank {
                bytes_per_rank,
                window_offset,
                window_bytes,
            } => {
                let lo = q.saturating_mul(bytes_per_rank);
                let hi = lo.saturating_add(bytes_per_rank);
                let w_end = window_offset.saturating_add(window_bytes);
                let start = lo.clamp(window_offset, w_end);
                let end = hi.clamp(window_offset, w_end);
                Span {
                    offset: start - window_offset,
                    len: end - start,
                }
            }
        }
    }
}

/// The rank whose contribution comes `k`-th in the fold of an element owned by `owner`.
pub const fn fold_rank(nranks: u32, owner: u32, k: u32) -> u32 {
    (owner + 1 + k) % nranks
}

/// Fold one chunk of this rank's own region: `dst = finish(fold over ranks rank+1 … rank)`, the
/// other ranks' contributions from `contribution(q)`, this rank's from `own` (last).
pub fn fold_owned<'a>(
    reduction: &Reduction,
    nranks: u32,
    rank: u32,
    dst: &mut [u8],
    own: &'a [u8],
    contribution: impl Fn(u32) -> &'a [u8],
) -> Result<(), ReduceError> {
    reduction.fold(dst, nranks as usize, |k| {
        let q = fold_rank(nranks, rank, k as u32);
        if q == rank { own } else { contribution(q) }
    })
}

/// Fold a whole small `iallreduce` on every rank alike: every segment `i` of `dst` is the fold
/// over ranks `i+1 … i` of the same bytes of every rank's vector (`vector(q)`, whole vectors).
pub fn fold_all<'a>(
    reduction: &Reduction,
    nranks: u32,
    regions: &Regions,
    dst: &mut [u8],
    vector: impl Fn(u32) -> &'a [u8],
) -> Result<(), ReduceError> {
    for owner in 0..nranks {
        let span = regions.region(nranks, owner);
        if span.len == 0 {
            continue;
        }
        let (lo, hi) = (span.offset as usize, (span.offset + span.len) as usize);
        let Some(out) = dst.get_mut(lo..hi) else {
            return Err(ReduceError::LengthMismatch {
                dst: dst.len(),
                other: hi,
            });
        };
        reduction.fold(out, nranks as usize, |k| {
            let v = vector(fold_rank(nranks, owner, k as u32));
            v.get(lo..hi).unwrap_or(&[])
        })?;
    }
    Ok(())
}

/// The group's identity: FNV-1a over every member's listen handle, in rank order. Every member
/// computes it from the same `handles[]` NCCL gave `connect`, so it names this group and no other
/// (listen handles carry a random listen id).
pub fn group_id<'a>(handles: impl IntoIterator<Item = &'a [u8]>) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for handle in handles {
        for &b in handle {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // Separator, so that moving bytes between handles changes the id.
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3) ^ 0xff;
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_covers_the_vector_once() {
        for n in 1..=9u32 {
            for count in [0u64, 1, 2, 7, 8, 9, 1000, 1001] {
                let regions = Regions::Split { count, elem: 4 };
                let mut next = 0;
                for q in 0..n {
                    let s = regions.region(n, q);
                    assert_eq!(s.offset, next, "n={n} count={count} q={q}");
                    next += s.len;
                    let len = s.len / 4;
                    assert!(len == count / u64::from(n) || len == count / u64::from(n) + 1);
                }
                assert_eq!(next, count * 4);
            }
        }
    }

    #[test]
    fn per_rank_regions_cut_to_the_window() {
        let r = Regions::PerRank {
            bytes_per_rank: 100,
            window_offset: 150,
            window_bytes: 200,
        };
        assert_eq!(r.region(4, 0), Span { offset: 0, len: 0 });
        assert_eq!(r.region(4, 1), Span { offset: 0, len: 50 });
        assert_eq!(
            r.region(4, 2),
            Span {
                offset: 50,
                len: 100
            }
        );
        assert_eq!(
            r.region(4, 3),
            Span {
                offset: 150,
                len: 50
            }
        );
    }

    #[test]
    fn fold_order_starts_after_the_owner() {
        let order: alloc::vec::Vec<u32> = (0..4).map(|k| fold_rank(4, 2, k)).collect();
        assert_eq!(order, [3, 0, 1, 2]);
    }

    #[test]
    fn group_id_depends_on_every_handle_and_the_order() {
        let (a, b) = ([1u8; 8], [2u8; 8]);
        let ab = group_id([&a[..], &b[..]]);
        assert_ne!(ab, group_id([&b[..], &a[..]]));
        assert_ne!(ab, group_id([&a[..]]));
        assert_eq!(ab, group_id([&a[..], &b[..]]));
    }
}
