//! A scripted [`Nic`] for the per-state unit tests: records what is posted, hands out the
//! completions a test queues, and exposes the inbound and staging regions as plain bytes.

use std::collections::VecDeque;
use std::vec::Vec;

use crate::nic::{
    Completion, CompletionKind, Nic, NicError, Payload, RemoteRegion, SendOp, SendWr, Sge, WcStatus,
};

/// A posted send work request, owned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Posted {
    pub(crate) wr_id: u64,
    pub(crate) op: SendOp,
    /// Inline or staged bytes (staged: as they were in staging at post time).
    pub(crate) bytes: Vec<u8>,
    pub(crate) inline: bool,
    pub(crate) staged: Option<(u32, u32)>,
    pub(crate) local: Option<Sge>,
    pub(crate) empty: bool,
    pub(crate) remote_addr: u64,
    pub(crate) rkey: u32,
    pub(crate) signaled: bool,
}

#[derive(Debug, Default)]
pub(crate) struct MockNic {
    pub(crate) max_inline: usize,
    pub(crate) inbound: Vec<u8>,
    pub(crate) staging: Vec<u8>,
    pub(crate) sent: Vec<Posted>,
    pub(crate) recvs: Vec<u64>,
    pub(crate) cq: VecDeque<Completion>,
    pub(crate) fail_post: Option<NicError>,
    pub(crate) fail_poll: Option<NicError>,
    /// Eager copies: the destination and the bytes.
    pub(crate) delivered: Vec<(u64, Vec<u8>)>,
}

/// The peer region the fixtures hand to `new`.
pub(crate) fn peer_region(len: usize) -> RemoteRegion {
    RemoteRegion {
        addr: 0x5000_0000,
        rkey: 0x77,
        len: len as u32,
    }
}

impl MockNic {
    pub(crate) fn new(max_inline: usize, inbound_len: usize, staging_len: usize) -> Self {
        Self {
            max_inline,
            inbound: std::vec![0; inbound_len],
            staging: std::vec![0; staging_len],
            ..Self::default()
        }
    }

    /// Queue a successful completion of a posted send work request.
    pub(crate) fn complete_send(&mut self, wr_id: u64) {
        self.cq.push_back(Completion {
            wr_id,
            status: WcStatus::SUCCESS,
            vendor_err: 0,
            kind: CompletionKind::Send,
        });
    }

    /// Queue a write-with-immediate arrival for receive work request `wr_id`.
    pub(crate) fn arrive(&mut self, wr_id: u64, imm: u32, byte_len: u32) {
        self.cq.push_back(Completion {
            wr_id,
            status: WcStatus::SUCCESS,
            vendor_err: 0,
            kind: CompletionKind::RecvWriteImm { imm, byte_len },
        });
    }

    /// Queue a failed completion.
    pub(crate) fn fail(&mut self, wr_id: u64, status: WcStatus, kind: CompletionKind) {
        self.cq.push_back(Completion {
            wr_id,
            status,
            vendor_err: 0x42,
            kind,
        });
    }

    /// The last posted send work request.
    pub(crate) fn last(&self) -> &Posted {
        self.sent.last().expect("nothing posted")
    }
}

impl Nic for MockNic {
    fn max_inline(&self) -> usize {
        self.max_inline
    }

    fn post_send(&mut self, chain: &[SendWr<'_>]) -> Result<(), NicError> {
        if let Some(err) = self.fail_post {
            return Err(err);
        }
        for wr in chain {
            let (bytes, inline, staged, local) = match wr.payload {
                Payload::Empty => (Vec::new(), false, None, None),
                Payload::Inline(b) => {
                    assert!(b.len() <= self.max_inline, "inline beyond max_inline");
                    (b.to_vec(), true, None, None)
                }
                Payload::Staged { offset, len } => (
                    self.staging[offset as usize..(offset + len) as usize].to_vec(),
                    false,
                    Some((offset, len)),
                    None,
                ),
                Payload::Local(sge) => (Vec::new(), false, None, Some(sge)),
            };
            self.sent.push(Posted {
                wr_id: wr.wr_id,
                op: wr.op,
                bytes,
                inline,
                staged,
                local,
                empty: wr.payload == Payload::Empty,
                remote_addr: wr.remote_addr,
                rkey: wr.rkey,
                signaled: wr.signaled,
            });
        }
        Ok(())
    }

    fn post_recv(&mut self, wr_id: u64) -> Result<(), NicError> {
        if let Some(err) = self.fail_post {
            return Err(err);
        }
        self.recvs.push(wr_id);
        Ok(())
    }

    fn poll(&mut self, out: &mut [Completion]) -> Result<usize, NicError> {
        if let Some(err) = self.fail_poll {
            return Err(err);
        }
        let mut got = 0;
        while got < out.len() {
            let Some(c) = self.cq.pop_front() else { break };
            out[got] = c;
            got += 1;
        }
        Ok(got)
    }

    fn read_inbound(&self, offset: usize, out: &mut [u8]) {
        out.copy_from_slice(&self.inbound[offset..offset + out.len()]);
    }

    fn write_staging(&mut self, offset: usize, bytes: &[u8]) {
        self.staging[offset..offset + bytes.len()].copy_from_slice(bytes);
    }

    fn deliver_inbound(&mut self, offset: usize, len: usize, dst: u64) {
        let bytes = self.inbound[offset..offset + len].to_vec();
        self.delivered.push((dst, bytes));
    }

    fn write_inbound(&mut self, offset: usize, bytes: &[u8]) {
        if let Some(dst) = self.inbound.get_mut(offset..offset + bytes.len()) {
            dst.copy_from_slice(bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::MockNic;
    use crate::nic::Nic;

    /// The provided stamped read: the stamp is the entry's last four bytes, little-endian.
    #[test]
    fn read_inbound_stamped_returns_stamp_and_entry() {
        let mut nic = MockNic::new(0, 64, 0);
        for (i, byte) in nic.inbound.iter_mut().enumerate() {
            *byte = i as u8;
        }
        let (stamp, entry) = nic.read_inbound_stamped::<8>(32);
        assert_eq!(entry, [32, 33, 34, 35, 36, 37, 38, 39]);
        assert_eq!(stamp, u32::from_le_bytes([36, 37, 38, 39]));
    }
}
