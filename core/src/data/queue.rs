//! Send-queue credit and completion-queue accounting shared by both directions.
//!
//! Every send work request takes one credit when it is posted. RC completes the send queue in
//! order, so a signaled completion returns the credits of every work request up to and including
//! it. To make sure credits always come back, a work request is signaled when it ends a slot, when
//! [`SIGNAL_INTERVAL`] − 1 unsignaled ones precede it, or when fewer than [`LOW_WATER`] credits
//! would be left after it. The `wr_id` carries the post position (1-based, truncated to 32 bits),
//! so a completion says how far the queue has drained; positions are validated on the way back.

use super::codec::{WrId, WrKind};
use super::error::ProtocolError;
use super::{CQ_DEPTH, SEND_QUEUE_DEPTH};

/// At most this many consecutive unsignaled work requests.
pub(crate) const SIGNAL_INTERVAL: u32 = 64;
/// Signal every work request while fewer credits than this remain.
pub(crate) const LOW_WATER: u64 = SIGNAL_INTERVAL as u64;

/// Credit state of one send queue.
#[derive(Debug, Clone, Default)]
pub(crate) struct SendQueue {
    /// Work requests posted since the connection started.
    posted: u64,
    /// Work requests known complete (up to the last polled signaled completion).
    retired: u64,
    /// Unsignaled work requests posted since the last signaled one.
    unsignaled_run: u32,
    /// Signaled work requests whose completion has not been polled yet.
    signaled_in_flight: u32,
}

/// A post position and signal decision for one work request about to be posted.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slotted {
    pub(crate) wr_id: u64,
    pub(crate) signaled: bool,
}

impl SendQueue {
    /// True when `count` more work requests fit, and their completions fit the CQ next to
    /// `other_cqes` (receive completions that may arrive).
    pub(crate) fn has_room(&self, count: usize, other_cqes: usize) -> bool {
        let in_flight = (self.posted - self.retired) as usize;
        in_flight + count <= SEND_QUEUE_DEPTH
            && self.signaled_in_flight as usize + count + other_cqes <= CQ_DEPTH
    }

    /// Work requests posted and not yet known complete.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> u64 {
        self.posted - self.retired
    }

    /// Take the next post position for a work request of `kind` at `index`; `must_signal` forces
    /// a signaled completion. The caller must have checked [`has_room`](Self::has_room).
    #[inline(always)]
    pub(crate) fn next(&mut self, kind: WrKind, index: u16, must_signal: bool) -> Slotted {
        self.posted += 1;
        // Fewer than `LOW_WATER` credits left after it (none when past the depth).
        let low = self.posted - self.retired > SEND_QUEUE_DEPTH as u64 - LOW_WATER;
        let signaled = must_signal || self.unsignaled_run + 1 >= SIGNAL_INTERVAL || low;
        if signaled {
            self.unsignaled_run = 0;
            self.signaled_in_flight += 1;
        } else {
            self.unsignaled_run += 1;
        }
        let wr_id = WrId {
            kind,
            index,
            seq: self.posted as u32,
        }
        .encode();
        Slotted { wr_id, signaled }
    }

    /// Account a successful signaled completion at post position `seq` (as carried in the
    /// `wr_id`). Returns the full 64-bit position.
    pub(crate) fn complete(&mut self, seq: u32, kind: WrKind) -> Result<u64, ProtocolError> {
        let behind = u64::from((self.posted as u32).wrapping_sub(seq));
        if behind >= self.posted - self.retired || self.signaled_in_flight == 0 {
            return Err(ProtocolError::UnexpectedCompletion { wr: kind });
        }
        self.retired = self.posted - behind;
        self.signaled_in_flight -= 1;
        Ok(self.retired)
    }

    /// Position the last posted work request got.
    pub(crate) fn posted(&self) -> u64 {
        self.posted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_next_signals_every_64th() {
        let mut sq = SendQueue::default();
        let mut signaled = 0;
        for _ in 0..256 {
            if sq.next(WrKind::Cts, 0, false).signaled {
                signaled += 1;
            }
        }
        assert_eq!(signaled, 4);
        assert_eq!(sq.in_flight(), 256);
    }

    #[test]
    fn full_next_signals_when_credits_low() {
        let mut sq = SendQueue::default();
        for _ in 0..SEND_QUEUE_DEPTH - LOW_WATER as usize {
            sq.next(WrKind::Cts, 0, false);
        }
        assert!(sq.next(WrKind::Cts, 0, false).signaled);
        assert!(sq.next(WrKind::Cts, 0, false).signaled);
    }

    #[test]
    fn full_has_room_refuses_past_depth() {
        let mut sq = SendQueue::default();
        for _ in 0..SEND_QUEUE_DEPTH {
            assert!(sq.has_room(1, 0));
            sq.next(WrKind::Data, 0, false);
        }
        assert!(!sq.has_room(1, 0));
    }

    #[test]
    fn posted_complete_returns_credits_up_to_it() {
        let mut sq = SendQueue::default();
        for _ in 0..10 {
            sq.next(WrKind::Data, 0, false);
        }
        let end = sq.next(WrKind::SlotEnd, 0, true);
        sq.next(WrKind::Data, 0, false);
        let seq = WrId::decode(end.wr_id).unwrap().seq;
        assert_eq!(sq.complete(seq, WrKind::SlotEnd), Ok(11));
        assert_eq!(sq.in_flight(), 1);
    }

    #[test]
    fn posted_complete_rejects_stale_and_future_positions() {
        let mut sq = SendQueue::default();
        let first = sq.next(WrKind::SlotEnd, 0, true);
        let seq = WrId::decode(first.wr_id).unwrap().seq;
        assert!(sq.complete(seq + 1, WrKind::SlotEnd).is_err());
        assert!(sq.complete(seq, WrKind::SlotEnd).is_ok());
        assert!(sq.complete(seq, WrKind::SlotEnd).is_err());
    }
}
