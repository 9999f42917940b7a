//! GPU flush requests of one receive comm (`iflush`).
//!
//! When a NIC writes received data into GPU memory, the PCIe writes may still be in flight inside
//! the GPU's root complex when the receive completes. NCCL's IB transport makes them visible
//! before NCCL's kernel reads the buffer with a 1-byte RDMA READ of the received buffer over a
//! loopback queue pair (connected to itself) of the same device: the read cannot pass the earlier
//! writes, so its completion means they landed. This module decides what to flush and tracks the
//! reads; the plugin owns the loopback queue pair and posts what it is told.
//!
//! - [`FlushQueue::start`] with the sizes `test` reported: nothing to flush when every size is 0
//!   (`iflush` then returns a NULL request, which NCCL reads as done); otherwise the buffer to read
//!   (the last non-empty one, as NCCL) and a [`FlushId`] whose [`wr_id`](FlushId::wr_id) the READ
//!   carries.
//! - [`FlushQueue::handle_completion`] for each completion of the loopback queue pair.
//! - [`FlushQueue::test`]: done, pending, or the failure. A failed read fails every later flush of
//!   the comm too (the loopback queue pair is in error): the data may not be visible, and NCCL must
//!   not be told otherwise.
//!
//! At most [`MAX_FLUSHES`] reads are outstanding (NCCL keeps at most `NCCL_NET_MAX_REQUESTS`
//! receives in flight per comm and flushes each once); one more is refused, never queued.

use crate::nic::WcStatus;
use core::fmt;

/// Flushes outstanding per comm at most: NCCL's `NCCL_NET_MAX_REQUESTS`.
pub const MAX_FLUSHES: usize = 32;

/// Marks a request id as a flush: bit 15, which data-path [`RequestId`](crate::data::RequestId)s
/// never set.
const FLUSH_MARK: u32 = 1 << 15;

/// Handle of an outstanding flush: slot and generation, so a stale id is detected.
///
/// Bits of [`to_bits`](Self::to_bits): 0–4 slot, 15 set (a flush, not a data request), 16–31
/// generation. Never 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlushId {
    slot: u8,
    generation: u16,
}

impl FlushId {
    /// The id packed into a non-zero `u32`.
    pub fn to_bits(self) -> u32 {
        u32::from(self.slot) | FLUSH_MARK | u32::from(self.generation) << 16
    }

    /// Unpack an id; `None` when the bits are not a flush id (a data request's, for instance).
    pub fn from_bits(bits: u32) -> Option<Self> {
        let slot = bits & 0x7fff & !FLUSH_MARK;
        if bits & FLUSH_MARK == 0 || slot as usize >= MAX_FLUSHES {
            return None;
        }
        Some(Self {
            slot: slot as u8,
            generation: (bits >> 16) as u16,
        })
    }

    /// The `wr_id` of the READ: the id's bits (never 0).
    pub fn wr_id(self) -> u64 {
        u64::from(self.to_bits())
    }
}

/// Why a flush call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlushError {
    /// [`MAX_FLUSHES`] reads are already outstanding.
    TooMany,
    /// The id is not an outstanding flush (stale, or never issued).
    UnknownId(u32),
    /// The loopback queue pair reported a completion for no outstanding read.
    UnexpectedCompletion(u64),
    /// A flush read failed with this status; every later flush of the comm fails too.
    ReadFailed(WcStatus),
    /// More buffers than a grouped receive has.
    TooManyBuffers(usize),
}

impl fmt::Display for FlushError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooMany => write!(f, "{MAX_FLUSHES} flushes are already outstanding"),
            Self::UnknownId(bits) => write!(f, "flush request {bits:#x} is not outstanding"),
            Self::UnexpectedCompletion(wr_id) => {
                write!(
                    f,
                    "the flush queue pair completed work request {wr_id:#x}, which is not outstanding"
                )
            }
            Self::ReadFailed(status) => write!(
                f,
                "the flush read failed: {status}; received GPU data may not be visible"
            ),
            Self::TooManyBuffers(n) => write!(f, "{n} buffers; a receive has at most 8"),
        }
    }
}

/// What [`FlushQueue::start`] asks the plugin to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlushPlan {
    /// Every size is 0: nothing was written, nothing to flush.
    Nothing,
    /// Post a signaled 1-byte RDMA READ of buffer `buffer` with `id.wr_id()`.
    Read {
        /// The flush's id.
        id: FlushId,
        /// Index of the buffer to read from (the last non-empty one).
        buffer: usize,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotState {
    Free,
    Posted,
    Done,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    state: SlotState,
    generation: u16,
}

/// The flushes of one receive comm.
#[derive(Debug)]
pub struct FlushQueue {
    slots: [Slot; MAX_FLUSHES],
    failed: Option<WcStatus>,
}

impl Default for FlushQueue {
    fn default() -> Self {
        Self::new()
    }
}

impl FlushQueue {
    /// No flush outstanding.
    pub fn new() -> Self {
        Self {
            slots: [Slot {
                state: SlotState::Free,
                generation: 0,
            }; MAX_FLUSHES],
            failed: None,
        }
    }

    /// Decide the flush of a receive whose buffers got `sizes` bytes.
    pub fn start(&mut self, sizes: &[u64]) -> Result<FlushPlan, FlushError> {
        if sizes.len() > crate::data::MAX_RECVS {
            return Err(FlushError::TooManyBuffers(sizes.len()));
        }
        if let Some(status) = self.failed {
            return Err(FlushError::ReadFailed(status));
        }
        let Some(buffer) = sizes.iter().rposition(|&s| s > 0) else {
            return Ok(FlushPlan::Nothing);
        };
        let slot = self
            .slots
            .iter()
            .position(|s| s.state == SlotState::Free)
            .ok_or(FlushError::TooMany)?;
        let entry = &mut self.slots[slot];
        entry.state = SlotState::Posted;
        entry.generation = entry.generation.wrapping_add(1);
        Ok(FlushPlan::Read {
            id: FlushId {
                slot: slot as u8,
                generation: entry.generation,
            },
            buffer,
        })
    }

    /// Take back a flush whose READ could not be posted.
    pub fn abandon(&mut self, id: FlushId) {
        if let Some(entry) = self.live(id) {
            entry.state = SlotState::Free;
        }
    }

    /// A completion of the loopback queue pair.
    pub fn handle_completion(&mut self, wr_id: u64, status: WcStatus) -> Result<(), FlushError> {
        if !status.is_success() {
            // A failed read, or a read flushed after the queue pair failed: the comm's flushes
            // are over either way. Keep the first cause.
            self.failed.get_or_insert(status);
        }
        let id = u32::try_from(wr_id)
            .ok()
            .and_then(FlushId::from_bits)
            .ok_or(FlushError::UnexpectedCompletion(wr_id))?;
        let entry = self
            .live(id)
            .filter(|e| e.state == SlotState::Posted)
            .ok_or(FlushError::UnexpectedCompletion(wr_id))?;
        entry.state = SlotState::Done;
        Ok(())
    }

    /// Whether flush `id` is done; a done flush is freed (its id becomes stale).
    pub fn test(&mut self, id: FlushId) -> Result<bool, FlushError> {
        let failed = self.failed;
        let entry = self
            .live(id)
            .filter(|e| e.state != SlotState::Free)
            .ok_or(FlushError::UnknownId(id.to_bits()))?;
        if let Some(status) = failed {
            entry.state = SlotState::Free;
            return Err(FlushError::ReadFailed(status));
        }
        if entry.state == SlotState::Done {
            entry.state = SlotState::Free;
            return Ok(true);
        }
        Ok(false)
    }

    /// Reads posted and not yet completed (what a close waits for).
    pub fn in_flight(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| s.state == SlotState::Posted)
            .count()
    }

    fn live(&mut self, id: FlushId) -> Option<&mut Slot> {
        self.slots
            .get_mut(usize::from(id.slot))
            .filter(|s| s.generation == id.generation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::RequestId;

    fn read(plan: FlushPlan) -> (FlushId, usize) {
        match plan {
            FlushPlan::Read { id, buffer } => (id, buffer),
            FlushPlan::Nothing => panic!("expected a read"),
        }
    }

    #[test]
    fn nothing_to_flush_when_every_size_is_zero() {
        let mut q = FlushQueue::new();
        assert_eq!(q.start(&[0, 0, 0]), Ok(FlushPlan::Nothing));
        assert_eq!(q.start(&[]), Ok(FlushPlan::Nothing));
        assert_eq!(q.in_flight(), 0);
        assert_eq!(q.start(&[1; 9]), Err(FlushError::TooManyBuffers(9)));
    }

    #[test]
    fn reads_the_last_non_empty_buffer_and_completes_once() {
        let mut q = FlushQueue::new();
        let (id, buffer) = read(q.start(&[5, 0, 7, 0]).unwrap());
        assert_eq!(buffer, 2);
        assert_eq!(q.test(id), Ok(false));
        assert_eq!(q.in_flight(), 1);
        q.handle_completion(id.wr_id(), WcStatus::SUCCESS).unwrap();
        assert_eq!(q.in_flight(), 0);
        assert_eq!(q.test(id), Ok(true));
        // Freed: the id is stale now.
        assert_eq!(q.test(id), Err(FlushError::UnknownId(id.to_bits())));
        // A second completion for it is a protocol error.
        assert_eq!(
            q.handle_completion(id.wr_id(), WcStatus::SUCCESS),
            Err(FlushError::UnexpectedCompletion(id.wr_id()))
        );
    }

    #[test]
    fn flush_ids_never_look_like_data_requests_and_back() {
        let mut q = FlushQueue::new();
        for _ in 0..3 * MAX_FLUSHES {
            let (id, _) = read(q.start(&[1]).unwrap());
            let bits = id.to_bits();
            assert_ne!(bits, 0);
            assert_eq!(FlushId::from_bits(bits), Some(id));
            assert_eq!(RequestId::from_bits(bits), None, "{bits:#x}");
            q.handle_completion(id.wr_id(), WcStatus::SUCCESS).unwrap();
            assert_eq!(q.test(id), Ok(true));
        }
        // Data request ids are no flush ids.
        for bits in [0x201, 0x401, 0xffff_0201, 0x1_0401] {
            assert_eq!(FlushId::from_bits(bits), None, "{bits:#x}");
        }
        assert_eq!(FlushId::from_bits(FLUSH_MARK | MAX_FLUSHES as u32), None);
    }

    #[test]
    fn at_most_max_flushes_outstanding_then_refused() {
        let mut q = FlushQueue::new();
        let ids: alloc::vec::Vec<FlushId> = (0..MAX_FLUSHES)
            .map(|_| read(q.start(&[1]).unwrap()).0)
            .collect();
        assert_eq!(q.start(&[1]), Err(FlushError::TooMany));
        // Completions in any order; each test frees its slot.
        for id in ids.iter().rev() {
            q.handle_completion(id.wr_id(), WcStatus::SUCCESS).unwrap();
        }
        for id in &ids {
            assert_eq!(q.test(*id), Ok(true));
        }
        assert!(q.start(&[1]).is_ok());
    }

    #[test]
    fn a_failed_read_fails_it_and_every_later_flush() {
        let mut q = FlushQueue::new();
        let (a, _) = read(q.start(&[1]).unwrap());
        let (b, _) = read(q.start(&[1]).unwrap());
        q.handle_completion(a.wr_id(), WcStatus::RETRY_EXC_ERR)
            .unwrap();
        q.handle_completion(b.wr_id(), WcStatus::WR_FLUSH_ERR)
            .unwrap();
        assert_eq!(
            q.test(a),
            Err(FlushError::ReadFailed(WcStatus::RETRY_EXC_ERR))
        );
        assert_eq!(
            q.test(b),
            Err(FlushError::ReadFailed(WcStatus::RETRY_EXC_ERR))
        );
        assert_eq!(
            q.start(&[1]),
            Err(FlushError::ReadFailed(WcStatus::RETRY_EXC_ERR))
        );
        // Nothing written still needs no flush... but the comm's flushes are broken: refuse.
        assert_eq!(
            q.start(&[0]),
            Err(FlushError::ReadFailed(WcStatus::RETRY_EXC_ERR))
        );
    }

    #[test]
    fn an_abandoned_flush_frees_its_slot_and_stale_ids_are_refused() {
        let mut q = FlushQueue::new();
        let (a, _) = read(q.start(&[1]).unwrap());
        q.abandon(a);
        assert_eq!(q.in_flight(), 0);
        assert_eq!(q.test(a), Err(FlushError::UnknownId(a.to_bits())));
        let (b, _) = read(q.start(&[1]).unwrap());
        assert_ne!(a, b, "a reused slot has a new generation");
        assert_eq!(q.test(a), Err(FlushError::UnknownId(a.to_bits())));
    }
}
