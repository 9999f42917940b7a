//! The request slots of one direction of a connection, shared by [`super::SendConn`] and
//! [`super::RecvConn`]: every slot carries a generation, so a stale id (its request already
//! reported) or one of the other direction is refused, never taken for a newer request; and
//! `test` reports a request's end the same way on both sides.
//!
//! Sends take any free slot (a free list, since they end in any order); receives take the slot of
//! their sequence number (the clear-to-send FIFO is positional), so the free list is a const
//! parameter.

use super::{DataError, MAX_REQUESTS, RequestId, Side};

/// The state a direction keeps per request.
pub(super) trait RequestState: Copy {
    /// A slot not in use.
    const FREE: Self;
    /// Whether this is [`FREE`](Self::FREE) (a `matches!`, not the derived `PartialEq`, which
    /// compares every field of every variant and is not always inlined).
    fn is_free(&self) -> bool;
    /// Still waiting for its completion (`test` polls the NIC only then).
    fn pending(&self) -> bool;
}

#[derive(Clone, Copy, Debug)]
struct Slot<S> {
    /// The id the slot's request has (or its next one will have): its generation is in it.
    id: RequestId,
    state: S,
}

/// [`MAX_REQUESTS`] generation-checked slots; with `FREE_LIST`, a stack of the free ones.
#[derive(Clone, Debug)]
pub(super) struct RequestPool<S, const FREE_LIST: bool> {
    slots: [Slot<S>; MAX_REQUESTS],
    /// Free slots, popped from the end (only with `FREE_LIST`).
    free: [u8; MAX_REQUESTS],
    free_len: usize,
    in_use: usize,
}

impl<S: RequestState, const FREE_LIST: bool> RequestPool<S, FREE_LIST> {
    /// Every slot free; with the free list, slot 0 is handed out first.
    pub(super) fn new(side: Side) -> Self {
        let mut free = [0u8; MAX_REQUESTS];
        for (i, slot) in free.iter_mut().enumerate() {
            *slot = (MAX_REQUESTS - 1 - i) as u8;
        }
        let mut slots = [Slot {
            id: RequestId::new(0, side, 0),
            state: S::FREE,
        }; MAX_REQUESTS];
        for (index, slot) in slots.iter_mut().enumerate() {
            slot.id = RequestId::new(index as u8, side, 0);
        }
        Self {
            slots,
            free,
            free_len: if FREE_LIST { MAX_REQUESTS } else { 0 },
            in_use: 0,
        }
    }

    /// The slot the next [`occupy`](Self::occupy) of a free-list pool takes, if any is free.
    #[inline(always)]
    pub(super) fn next_free(&self) -> Option<u8> {
        FREE_LIST
            .then(|| self.free_len.checked_sub(1).map(|top| self.free[top]))
            .flatten()
    }

    /// Whether slot `index` is free.
    #[inline(always)]
    pub(super) fn is_free(&self, index: u8) -> bool {
        self.slots[usize::from(index)].state.is_free()
    }

    /// Put a request in slot `index` (free: [`next_free`](Self::next_free) with the free list,
    /// [`is_free`](Self::is_free) without) and name it.
    #[inline(always)]
    pub(super) fn occupy(&mut self, index: u8, state: S) -> RequestId {
        if FREE_LIST {
            debug_assert_eq!(
                self.next_free(),
                Some(index),
                "a free-list pool takes its top"
            );
            self.free_len -= 1;
        }
        self.in_use += 1;
        let slot = &mut self.slots[usize::from(index)];
        slot.state = state;
        slot.id
    }

    /// The slot of `req`, if it names a request in use of this pool.
    #[inline(always)]
    pub(super) fn lookup(&self, req: RequestId) -> Result<usize, DataError> {
        let index = usize::from(req.index());
        let slot = &self.slots[index];
        // The id carries the direction and the generation: one compare refuses both an id of
        // the other direction and a stale one.
        if slot.id != req || slot.state.is_free() {
            return Err(DataError::InvalidRequest {
                bits: req.to_bits(),
            });
        }
        Ok(index)
    }

    /// The state of slot `index`.
    #[inline(always)]
    pub(super) fn state(&self, index: usize) -> &S {
        &self.slots[index].state
    }

    /// The state of slot `index`, to change.
    #[inline(always)]
    pub(super) fn state_mut(&mut self, index: usize) -> &mut S {
        &mut self.slots[index].state
    }

    /// End the request in slot `index` (nothing if it is free): its id goes stale.
    pub(super) fn release(&mut self, index: usize) {
        let slot = &mut self.slots[index];
        if slot.state.is_free() {
            return;
        }
        slot.state = S::FREE;
        slot.id = slot.id.next_generation();
        self.in_use -= 1;
        if FREE_LIST && self.free_len < MAX_REQUESTS {
            self.free[self.free_len] = index as u8;
            self.free_len += 1;
        }
    }

    /// `test`'s answer for the request in slot `index` (found in use by [`lookup`](Self::lookup))
    /// after the direction's `progress` (polling the NIC): a failed progress, or else what
    /// `report` makes of the slot's state (`Ok(false)` pending, `Ok(true)` finished with its
    /// sizes written, or the request's error). Anything but pending frees the slot.
    #[inline(always)]
    pub(super) fn settle(
        &mut self,
        index: usize,
        progress: Result<(), DataError>,
        report: impl FnOnce(&S) -> Result<bool, DataError>,
    ) -> Result<bool, DataError> {
        // `lookup` found the slot in use and progress never frees one: no stale check again.
        let report = match progress {
            Err(err) => Err(err),
            Ok(()) => report(&self.slots[index].state),
        };
        if !matches!(report, Ok(false)) {
            self.end_in_use(index);
        }
        report
    }

    /// [`release`](Self::release) of a slot known to be in use (`settle`'s: `lookup` found it
    /// so, and nothing between frees one), inlined into `test`.
    #[inline(always)]
    fn end_in_use(&mut self, index: usize) {
        let slot = &mut self.slots[index];
        debug_assert!(!slot.state.is_free(), "settle ends a request in use");
        slot.state = S::FREE;
        slot.id = slot.id.next_generation();
        self.in_use -= 1;
        if FREE_LIST && self.free_len < MAX_REQUESTS {
            self.free[self.free_len] = index as u8;
            self.free_len += 1;
        }
    }

    /// Requests in use.
    #[inline(always)]
    pub(super) fn outstanding(&self) -> usize {
        self.in_use
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Toy {
        Free,
        Waiting,
        Done,
        Failed,
    }

    impl RequestState for Toy {
        const FREE: Self = Self::Free;
        fn is_free(&self) -> bool {
            matches!(self, Self::Free)
        }
        fn pending(&self) -> bool {
            *self == Self::Waiting
        }
    }

    impl Toy {
        fn report(&self) -> Result<bool, DataError> {
            match self {
                Self::Waiting => Ok(false),
                Self::Done => Ok(true),
                Self::Failed | Self::Free => Err(DataError::InvalidArgument("toy")),
            }
        }
    }

    #[test]
    fn ids_go_stale_when_reported_and_never_cross_directions() {
        let mut sends: RequestPool<Toy, true> = RequestPool::new(Side::Send);
        let first = sends.next_free().unwrap();
        assert_eq!(first, 0, "request 0 is handed out first");
        let id = sends.occupy(first, Toy::Waiting);
        assert_eq!(sends.outstanding(), 1);
        let i = sends.lookup(id).unwrap();
        assert_eq!(sends.settle(i, Ok(()), Toy::report), Ok(false));
        *sends.state_mut(i) = Toy::Done;
        assert_eq!(sends.settle(i, Ok(()), Toy::report), Ok(true));
        assert_eq!(sends.outstanding(), 0);
        assert!(sends.lookup(id).is_err(), "a reported id is stale");
        // The slot comes back with a new generation: the old id does not name the new request.
        let again = sends.occupy(sends.next_free().unwrap(), Toy::Waiting);
        assert_eq!(again.index(), id.index());
        assert!(sends.lookup(id).is_err() && sends.lookup(again).is_ok());

        let mut recvs: RequestPool<Toy, false> = RequestPool::new(Side::Recv);
        assert_eq!(
            recvs.next_free(),
            None,
            "receives take their slot by position"
        );
        assert!(recvs.is_free(5));
        let r = recvs.occupy(5, Toy::Waiting);
        assert!(!recvs.is_free(5));
        assert!(sends.lookup(r).is_err(), "a receive id is not a send id");
        assert!(recvs.lookup(again).is_err(), "nor the other way round");
        // A failed progress ends the request with its error.
        let i = recvs.lookup(r).unwrap();
        assert_eq!(
            recvs.settle(i, Err(DataError::InvalidArgument("poll")), Toy::report),
            Err(DataError::InvalidArgument("poll"))
        );
        assert!(recvs.is_free(5) && recvs.outstanding() == 0);
        // A refused request reports its error once, then is gone.
        let r = recvs.occupy(6, Toy::Failed);
        let i = recvs.lookup(r).unwrap();
        assert!(recvs.settle(i, Ok(()), Toy::report).is_err());
        assert!(recvs.lookup(r).is_err());
    }

    /// Every value `RequestId::from_bits` unpacks that no slot handed out is refused by the
    /// one compare, with every slot in use (so the free check decides nothing): zero, index 0
    /// or above `MAX_REQUESTS`, direction 0 or 3, the other direction, another generation.
    #[test]
    fn lookup_refuses_every_id_no_slot_handed_out() {
        let mut sends: RequestPool<Toy, true> = RequestPool::new(Side::Send);
        while let Some(i) = sends.next_free() {
            sends.occupy(i, Toy::Waiting);
        }
        for bits in [
            0,
            1,
            1 << 9,
            257 | 1 << 9,
            0x1ff | 1 << 9,
            1 | 3 << 9,
            1 | 2 << 9,
            1 | 1 << 9 | 1 << 16,
            !0xf800,
        ] {
            let id = RequestId::from_bits(bits).expect("bits 11-15 clear");
            assert_eq!(
                sends.lookup(id),
                Err(DataError::InvalidRequest { bits }),
                "{bits:#x}"
            );
        }
        let handed_out = RequestId::from_bits(1 | 1 << 9).expect("an id");
        assert_eq!(sends.lookup(handed_out), Ok(0));
    }

    #[test]
    fn the_free_list_hands_out_every_slot_once() {
        let mut pool: RequestPool<Toy, true> = RequestPool::new(Side::Send);
        let mut seen = [false; MAX_REQUESTS];
        while let Some(i) = pool.next_free() {
            assert!(!seen[usize::from(i)]);
            seen[usize::from(i)] = true;
            pool.occupy(i, Toy::Waiting);
        }
        assert!(seen.iter().all(|&s| s));
        assert_eq!(pool.outstanding(), MAX_REQUESTS);
        pool.release(3);
        assert_eq!(pool.next_free(), Some(3));
        pool.release(3);
        assert_eq!(
            pool.outstanding(),
            MAX_REQUESTS - 1,
            "releasing twice is a no-op"
        );
    }
}
