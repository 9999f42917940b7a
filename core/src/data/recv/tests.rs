//! Per-state unit tests of the receiver: `<state>_<event>`.
//!
//! States of a slot: `free`, `posted` (receive and CTS posted), `done` (data arrived, not tested),
//! `refused` (size mismatch arrived); and of the connection: `failed`. `any` means every state.

use std::vec::Vec;

use super::*;
use crate::data::codec::SizeRecord;
use crate::data::mock::{MockNic, peer_region};
use crate::data::{Completed, MAX_RECVS, RECV_INBOUND_LEN, RECV_STAGING_LEN};
use crate::nic::{NicError, WcStatus};

fn receiver(max_inline: usize) -> (RecvConn, MockNic) {
    (
        RecvConn::new(peer_region(SEND_INBOUND_LEN)),
        MockNic::new(max_inline, RECV_INBOUND_LEN, RECV_STAGING_LEN),
    )
}

fn bufs(caps: &[u64]) -> Vec<RecvBuf> {
    caps.iter()
        .enumerate()
        .map(|(i, &len)| RecvBuf {
            addr: 0x4000_0000 + 0x1_0000 * i as u64,
            len,
            rkey: 0x200 + i as u32,
            host: false,
        })
        .collect()
}

/// A receiver with receive 0 posted: buffers of the given capacities, tags 0..n.
fn posted(caps: &[u64]) -> (RecvConn, MockNic, RequestId, u64) {
    let (mut r, mut nic) = receiver(256);
    let tags: Vec<u32> = (0..caps.len() as u32).collect();
    let id = r.irecv(&mut nic, &bufs(caps), &tags).unwrap().unwrap();
    let recv_wr = *nic.recvs.last().unwrap();
    (r, nic, id, recv_wr)
}

fn imm(seq: u32, n: u8, record: bool, mismatch: bool) -> u32 {
    Imm {
        seq16: seq as u16,
        n,
        record,
        mismatch,
    }
    .encode()
}

fn write_record(nic: &mut MockNic, slot: usize, sizes: &[u32]) {
    let mut record = SizeRecord {
        n: sizes.len() as u8,
        sizes: [0; MAX_RECVS],
    };
    record.sizes[..sizes.len()].copy_from_slice(sizes);
    let (bytes, len) = record.encode();
    nic.inbound[slot * RECORD_LEN..slot * RECORD_LEN + len].copy_from_slice(&bytes[..len]);
}

fn protocol_error(r: &mut RecvConn, nic: &mut MockNic, id: RequestId) -> ProtocolError {
    match r.test(nic, id) {
        Err(DataError::Protocol(err)) => {
            assert_eq!(r.failure(), Some(&DataError::Protocol(err)), "sticky");
            err
        }
        other => panic!("expected a protocol error, got {other:?}"),
    }
}

#[test]
fn free_irecv_posts_the_receive_then_one_inline_cts_write() {
    let (r, nic, _, recv_wr) = posted(&[10, 20, 30]);
    let recv = WrId::decode(recv_wr).unwrap();
    assert_eq!((recv.kind, recv.index, recv.seq), (WrKind::Recv, 0, 0));
    assert_eq!(nic.sent.len(), 1);
    let cts = nic.last();
    assert!(cts.inline && !cts.signaled);
    assert_eq!(cts.op, SendOp::Write);
    assert_eq!((cts.remote_addr, cts.rkey), (0x5000_0000, 0x77));
    assert_eq!(cts.bytes.len(), 3 * CTS_ENTRY_LEN);
    for (i, chunk) in cts.bytes.chunks_exact(CTS_ENTRY_LEN).enumerate() {
        let entry = CtsEntry::decode(chunk.try_into().unwrap()).unwrap();
        assert_eq!(
            (entry.size, entry.tag, entry.n, entry.index, entry.stamp),
            (10 * (i as u64 + 1), i as u32, 3, i as u8, 1)
        );
    }
    assert_eq!(r.outstanding(), 1);
}

#[test]
fn free_irecv_stages_cts_entries_beyond_max_inline() {
    let (mut r, mut nic) = receiver(64);
    r.irecv(&mut nic, &bufs(&[1, 2, 3]), &[0, 1, 2])
        .unwrap()
        .unwrap();
    let cts = nic.last();
    assert_eq!(cts.staged, Some((0, 96)));
    assert_eq!(nic.staging[..96], cts.bytes[..]);
}

#[test]
fn free_irecv_every_64th_cts_is_signaled() {
    let (mut r, mut nic) = receiver(64);
    let b = bufs(&[8]);
    for seq in 0..128u32 {
        let id = r.irecv(&mut nic, &b, &[0]).unwrap().unwrap();
        nic.arrive(*nic.recvs.last().unwrap(), imm(seq, 1, false, false), 8);
        assert!(matches!(r.test(&mut nic, id), Ok(Completed::Done { .. })));
    }
    let signaled: Vec<usize> = (0..nic.sent.len())
        .filter(|&i| nic.sent[i].signaled)
        .collect();
    assert_eq!(signaled, [63, 127]);
}

#[test]
fn posted_irecv_of_the_same_slot_is_try_later() {
    let (mut r, mut nic) = receiver(64);
    let b = bufs(&[8]);
    for _ in 0..SLOTS {
        r.irecv(&mut nic, &b, &[0]).unwrap().unwrap();
    }
    let before = (nic.sent.len(), nic.recvs.len());
    assert_eq!(r.irecv(&mut nic, &b, &[0]), Ok(None));
    assert_eq!((nic.sent.len(), nic.recvs.len()), before);
}

#[test]
fn posted_arrival_single_reports_the_byte_count() {
    let (mut r, mut nic, id, recv_wr) = posted(&[100]);
    nic.arrive(recv_wr, imm(0, 1, false, false), 77);
    let mut sizes = [0; MAX_RECVS];
    sizes[0] = 77;
    assert_eq!(r.test(&mut nic, id), Ok(Completed::Done { n: 1, sizes }));
    assert_eq!(r.outstanding(), 0);
}

#[test]
fn posted_arrival_single_filling_its_buffer_exactly_is_done() {
    let (mut r, mut nic, id, recv_wr) = posted(&[100]);
    nic.arrive(recv_wr, imm(0, 1, false, false), 100);
    let mut sizes = [0; MAX_RECVS];
    sizes[0] = 100;
    assert_eq!(r.test(&mut nic, id), Ok(Completed::Done { n: 1, sizes }));
}

#[test]
fn posted_arrival_single_with_a_record_reads_the_record() {
    // Not the record-less arrival `poll_cq` takes without decoding: the long way, as before.
    let (mut r, mut nic, id, recv_wr) = posted(&[100]);
    write_record(&mut nic, 0, &[64]);
    nic.arrive(recv_wr, imm(0, 1, true, false), 4);
    let mut sizes = [0; MAX_RECVS];
    sizes[0] = 64;
    assert_eq!(r.test(&mut nic, id), Ok(Completed::Done { n: 1, sizes }));

    let (mut r, mut nic, id, recv_wr) = posted(&[100]);
    write_record(&mut nic, 0, &[101]);
    nic.arrive(recv_wr, imm(0, 1, true, true), 4);
    assert_eq!(
        r.test(&mut nic, id),
        Err(DataError::SizeMismatch {
            index: 0,
            sent: 101,
            capacity: 100
        })
    );
    assert!(r.failure().is_none());
}

#[test]
fn posted_arrival_single_with_a_wr_id_of_another_slot_is_a_protocol_error() {
    let (mut r, mut nic, id, recv_wr) = posted(&[10]);
    // Same kind and sequence, index 1: decodes, but is not receive 0's.
    nic.arrive(recv_wr | 1 << 8, imm(0, 1, false, false), 1);
    assert_eq!(
        protocol_error(&mut r, &mut nic, id),
        ProtocolError::UnexpectedCompletion { wr: WrKind::Recv }
    );
}

#[test]
fn posted_arrival_grouped_reads_the_record() {
    let (mut r, mut nic, id, recv_wr) = posted(&[10, 20, 30]);
    write_record(&mut nic, 0, &[10, 0, 29]);
    nic.arrive(recv_wr, imm(0, 3, true, false), 12);
    match r.test(&mut nic, id) {
        Ok(Completed::Done { n: 3, sizes }) => assert_eq!(sizes[..3], [10, 0, 29]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn posted_arrival_flagged_mismatch_fails_the_request_only() {
    let (mut r, mut nic, id, recv_wr) = posted(&[10, 20]);
    write_record(&mut nic, 0, &[10, 21]);
    nic.arrive(recv_wr, imm(0, 2, true, true), 8);
    assert_eq!(
        r.test(&mut nic, id),
        Err(DataError::SizeMismatch {
            index: 1,
            sent: 21,
            capacity: 20
        })
    );
    assert!(r.failure().is_none());
    assert_eq!(r.outstanding(), 0);
}

#[test]
fn posted_arrival_wrong_sequence_is_a_protocol_error() {
    let (mut r, mut nic, id, recv_wr) = posted(&[10]);
    nic.arrive(recv_wr, imm(1, 1, false, false), 1);
    assert_eq!(
        protocol_error(&mut r, &mut nic, id),
        ProtocolError::Sequence {
            expected: 0,
            got: 1
        }
    );
}

#[test]
fn posted_arrival_wrong_group_size_is_a_protocol_error() {
    let (mut r, mut nic, id, recv_wr) = posted(&[10]);
    nic.arrive(recv_wr, imm(0, 2, true, false), 8);
    assert_eq!(
        protocol_error(&mut r, &mut nic, id),
        ProtocolError::GroupSize {
            expected: 1,
            got: 2
        }
    );
}

#[test]
fn posted_arrival_malformed_immediate_is_a_protocol_error() {
    let (mut r, mut nic, id, recv_wr) = posted(&[10]);
    nic.arrive(recv_wr, 0xdead_beef, 1);
    assert!(matches!(
        protocol_error(&mut r, &mut nic, id),
        ProtocolError::Immediate {
            imm: 0xdead_beef,
            ..
        }
    ));
}

#[test]
fn posted_arrival_beyond_capacity_is_a_protocol_error() {
    let (mut r, mut nic, id, recv_wr) = posted(&[10]);
    nic.arrive(recv_wr, imm(0, 1, false, false), 11);
    assert!(matches!(
        protocol_error(&mut r, &mut nic, id),
        ProtocolError::Overflow {
            index: 0,
            size: 11,
            capacity: 10
        }
    ));
}

#[test]
fn posted_arrival_record_beyond_capacity_without_flag_is_a_protocol_error() {
    let (mut r, mut nic, id, recv_wr) = posted(&[10, 10]);
    write_record(&mut nic, 0, &[10, 11]);
    nic.arrive(recv_wr, imm(0, 2, true, false), 8);
    assert!(matches!(
        protocol_error(&mut r, &mut nic, id),
        ProtocolError::Overflow { index: 1, .. }
    ));
}

#[test]
fn posted_arrival_mismatch_flag_without_oversize_is_a_protocol_error() {
    let (mut r, mut nic, id, recv_wr) = posted(&[10, 10]);
    write_record(&mut nic, 0, &[10, 10]);
    nic.arrive(recv_wr, imm(0, 2, true, true), 8);
    assert_eq!(
        protocol_error(&mut r, &mut nic, id),
        ProtocolError::BogusMismatch
    );
}

#[test]
fn posted_arrival_record_of_wrong_length_is_a_protocol_error() {
    let (mut r, mut nic, id, recv_wr) = posted(&[10, 10]);
    nic.arrive(recv_wr, imm(0, 2, true, false), 4);
    assert!(matches!(
        protocol_error(&mut r, &mut nic, id),
        ProtocolError::Record(_)
    ));
}

#[test]
fn posted_arrival_for_another_receive_wr_is_a_protocol_error() {
    let (mut r, mut nic, id, recv_wr) = posted(&[10]);
    let mut other = WrId::decode(recv_wr).unwrap();
    other.seq = 7;
    nic.arrive(other.encode(), imm(0, 1, false, false), 1);
    assert!(matches!(
        protocol_error(&mut r, &mut nic, id),
        ProtocolError::UnexpectedCompletion { .. }
    ));
}

#[test]
fn posted_flush_fails_every_request_with_the_status() {
    let (mut r, mut nic, first, recv_wr) = posted(&[10]);
    let second = r.irecv(&mut nic, &bufs(&[10]), &[0]).unwrap().unwrap();
    nic.fail(recv_wr, WcStatus::WR_FLUSH_ERR, CompletionKind::RecvFailed);
    let err = r.test(&mut nic, second).unwrap_err();
    assert_eq!(
        err,
        DataError::Completion {
            status: WcStatus::WR_FLUSH_ERR,
            vendor_err: 0x42,
            wr: Some(WrKind::Recv)
        }
    );
    assert_eq!(r.test(&mut nic, first), Err(err));
    assert_eq!(r.outstanding(), 0);
}

#[test]
fn posted_cts_failure_names_the_cts_write() {
    let (mut r, mut nic, id, _) = posted(&[10]);
    let cts = nic.last().wr_id;
    nic.fail(cts, WcStatus::REM_ACCESS_ERR, CompletionKind::Send);
    let err = r.test(&mut nic, id).unwrap_err();
    assert!(
        std::format!("{err}").starts_with("clear-to-send RDMA write failed: remote access error")
    );
}

#[test]
fn posted_send_completion_of_a_foreign_kind_is_a_protocol_error() {
    let (mut r, mut nic, id, _) = posted(&[10]);
    let bogus = WrId {
        kind: WrKind::SlotEnd,
        index: 0,
        seq: 1,
    };
    nic.complete_send(bogus.encode());
    assert!(matches!(
        protocol_error(&mut r, &mut nic, id),
        ProtocolError::UnexpectedCompletion {
            wr: WrKind::SlotEnd
        }
    ));
}

#[test]
fn free_arrival_is_a_protocol_error() {
    let (mut r, mut nic, id, recv_wr) = posted(&[10]);
    nic.arrive(recv_wr, imm(0, 1, false, false), 1);
    nic.arrive(recv_wr, imm(0, 1, false, false), 1);
    // The first arrival completes receive 0; the second has no receive to belong to.
    assert!(matches!(
        protocol_error(&mut r, &mut nic, id),
        ProtocolError::UnexpectedCompletion { .. }
    ));
}

#[test]
fn done_test_frees_and_a_second_test_is_an_invalid_request() {
    let (mut r, mut nic, id, recv_wr) = posted(&[10]);
    nic.arrive(recv_wr, imm(0, 1, false, false), 1);
    assert!(matches!(r.test(&mut nic, id), Ok(Completed::Done { .. })));
    assert_eq!(
        r.test(&mut nic, id),
        Err(DataError::InvalidRequest { bits: id.to_bits() })
    );
    // The slot's next lap gets a new generation: the old id stays invalid.
    for _ in 0..SLOTS {
        let next = r.irecv(&mut nic, &bufs(&[1]), &[0]).unwrap().unwrap();
        assert_ne!(next, id);
    }
    assert!(r.test(&mut nic, id).is_err());
}

#[test]
fn done_survives_a_later_failure() {
    let (mut r, mut nic, id, recv_wr) = posted(&[10]);
    nic.arrive(recv_wr, imm(0, 1, false, false), 3);
    let other = r.irecv(&mut nic, &bufs(&[10]), &[0]).unwrap().unwrap();
    assert_eq!(r.test(&mut nic, other), Ok(Completed::Pending));
    r.handle_fatal(DataError::PeerLost);
    assert!(matches!(r.test(&mut nic, id), Ok(Completed::Done { .. })));
    assert_eq!(r.test(&mut nic, other), Err(DataError::PeerLost));
}

#[test]
fn free_irecv_post_error_is_sticky() {
    let (mut r, mut nic) = receiver(64);
    nic.fail_post = Some(NicError::Post { errno: 22 });
    let err = r.irecv(&mut nic, &bufs(&[1]), &[0]).unwrap_err();
    assert_eq!(err, DataError::Nic(NicError::Post { errno: 22 }));
    nic.fail_post = None;
    assert_eq!(r.irecv(&mut nic, &bufs(&[1]), &[0]), Err(err));
}

#[test]
fn failed_irecv_and_test_return_the_first_cause() {
    let (mut r, mut nic, id, _) = posted(&[10]);
    r.handle_fatal(DataError::PeerLost);
    r.handle_fatal(DataError::Nic(NicError::Fatal { event: "second" }));
    assert_eq!(
        r.irecv(&mut nic, &bufs(&[1]), &[0]),
        Err(DataError::PeerLost)
    );
    assert_eq!(r.test(&mut nic, id), Err(DataError::PeerLost));
    assert_eq!(r.failure(), Some(&DataError::PeerLost));
}

/// Post `count` single receives of 8 bytes (tag 0), each followed by a `test` of it (pending), as
/// a polling receiver does; no arrivals.
fn post_singles(r: &mut RecvConn, nic: &mut MockNic, count: usize) -> Vec<RequestId> {
    let b = bufs(&[8]);
    (0..count)
        .map(|_| {
            let id = r.irecv(nic, &b, &[0]).unwrap().unwrap();
            assert_eq!(r.test(nic, id), Ok(Completed::Pending));
            id
        })
        .collect()
}

#[test]
fn free_irecv_back_to_back_writes_every_cts_at_once() {
    // Without a `test` in between nothing is deferred: a driver that posts its receives and then
    // only spins on the sender must still see every one.
    let (mut r, mut nic) = receiver(64);
    let b = bufs(&[8]);
    let count = (CTS_LOW_WATER + CTS_BATCH) as usize;
    for _ in 0..count {
        r.irecv(&mut nic, &b, &[0]).unwrap().unwrap();
    }
    assert_eq!(nic.sent.len(), count);
    // After a test, the next one may wait; a second back-to-back one takes it along.
    let (mut r, mut nic) = receiver(64);
    let ids = post_singles(&mut r, &mut nic, CTS_LOW_WATER as usize + 1);
    assert_eq!(
        nic.sent.len(),
        CTS_LOW_WATER as usize,
        "the last one is deferred"
    );
    // Right after the test: may wait too.
    r.irecv(&mut nic, &b, &[0]).unwrap().unwrap();
    assert_eq!(nic.sent.len(), CTS_LOW_WATER as usize);
    // Back to back with that one: all three go.
    r.irecv(&mut nic, &b, &[0]).unwrap().unwrap();
    assert_eq!(nic.sent.len(), CTS_LOW_WATER as usize + 1);
    let first = CTS_LOW_WATER as usize * CTS_SLOT_LEN;
    assert_eq!(
        nic.last().staged,
        Some((first as u32, (2 * CTS_SLOT_LEN + CTS_ENTRY_LEN) as u32))
    );
    assert_eq!(ids.len(), CTS_LOW_WATER as usize + 1);
}

#[test]
fn free_irecv_with_enough_grants_defers_its_cts() {
    let (mut r, mut nic) = receiver(64);
    post_singles(&mut r, &mut nic, CTS_LOW_WATER as usize);
    assert_eq!(
        nic.sent.len(),
        CTS_LOW_WATER as usize,
        "one write each below the mark"
    );
    post_singles(&mut r, &mut nic, 1);
    assert_eq!(nic.sent.len(), CTS_LOW_WATER as usize, "deferred: no write");
    assert_eq!(
        nic.recvs.len(),
        CTS_LOW_WATER as usize + 1,
        "the receive is posted"
    );
    let slot = CTS_LOW_WATER as usize * CTS_SLOT_LEN;
    let entry =
        CtsEntry::decode(nic.staging[slot..slot + CTS_ENTRY_LEN].try_into().unwrap()).unwrap();
    assert_eq!(
        entry.stamp,
        stamp_for(CTS_LOW_WATER),
        "staged for the later write"
    );
}

#[test]
fn free_irecv_completing_a_batch_writes_the_deferred_slots_in_one_write() {
    let (mut r, mut nic) = receiver(64);
    post_singles(&mut r, &mut nic, (CTS_LOW_WATER + CTS_BATCH) as usize);
    assert_eq!(nic.sent.len(), CTS_LOW_WATER as usize + 1);
    let write = nic.last();
    let first = CTS_LOW_WATER as usize * CTS_SLOT_LEN;
    let len = (CTS_BATCH as usize - 1) * CTS_SLOT_LEN + CTS_ENTRY_LEN;
    assert_eq!(write.staged, Some((first as u32, len as u32)));
    assert_eq!(write.remote_addr, 0x5000_0000 + first as u64);
    assert_eq!(write.bytes[..], nic.staging[first..first + len]);
    for i in 0..CTS_BATCH as usize {
        let at = i * CTS_SLOT_LEN;
        let entry =
            CtsEntry::decode(write.bytes[at..at + CTS_ENTRY_LEN].try_into().unwrap()).unwrap();
        assert_eq!(entry.stamp, stamp_for(CTS_LOW_WATER + i as u32));
    }
}

#[test]
fn posted_arrivals_below_the_mark_flush_the_deferred_on_the_next_call() {
    let (mut r, mut nic) = receiver(64);
    let ids = post_singles(&mut r, &mut nic, CTS_LOW_WATER as usize + 2);
    let writes = nic.sent.len();
    nic.arrive(nic.recvs[0], imm(0, 1, false, false), 8);
    assert!(matches!(
        r.test(&mut nic, ids[0]),
        Ok(Completed::Done { .. })
    ));
    assert_eq!(
        nic.sent.len(),
        writes,
        "the call that saw the arrival writes nothing"
    );
    assert_eq!(r.test(&mut nic, ids[1]), Ok(Completed::Pending));
    assert_eq!(nic.sent.len(), writes + 1);
    let first = CTS_LOW_WATER as usize * CTS_SLOT_LEN;
    assert_eq!(
        nic.last().staged,
        Some((first as u32, (CTS_SLOT_LEN + CTS_ENTRY_LEN) as u32))
    );
}

#[test]
fn posted_deferred_slots_across_the_wrap_go_in_two_writes() {
    let (mut r, mut nic) = receiver(64);
    let b = bufs(&[8]);
    // Walk the sequence so that the batch after the low-water grants starts two slots before
    // the end of the FIFO.
    let start = SLOTS as u32 - 2 - CTS_LOW_WATER;
    for seq in 0..start {
        let id = r.irecv(&mut nic, &b, &[0]).unwrap().unwrap();
        nic.arrive(*nic.recvs.last().unwrap(), imm(seq, 1, false, false), 8);
        assert!(matches!(r.test(&mut nic, id), Ok(Completed::Done { .. })));
    }
    post_singles(&mut r, &mut nic, CTS_LOW_WATER as usize);
    let before = nic.sent.len();
    post_singles(&mut r, &mut nic, CTS_BATCH as usize);
    assert_eq!(nic.sent.len(), before + 2, "slots 254..=255, then 0..");
    let (tail, head) = (&nic.sent[before], &nic.sent[before + 1]);
    let tail_at = (SLOTS - 2) * CTS_SLOT_LEN;
    assert_eq!(
        tail.staged,
        Some((tail_at as u32, (CTS_SLOT_LEN + CTS_ENTRY_LEN) as u32))
    );
    assert_eq!(tail.remote_addr, 0x5000_0000 + tail_at as u64);
    let head_len = (CTS_BATCH as usize - 3) * CTS_SLOT_LEN + CTS_ENTRY_LEN;
    assert_eq!(head.staged, Some((0, head_len as u32)));
    assert_eq!(head.remote_addr, 0x5000_0000);
    let entry = CtsEntry::decode(head.bytes[..CTS_ENTRY_LEN].try_into().unwrap()).unwrap();
    assert_eq!(entry.stamp, stamp_for(SLOTS as u32));
}

#[test]
fn posted_arrival_for_a_receive_whose_cts_is_deferred_is_a_protocol_error() {
    let (mut r, mut nic) = receiver(64);
    let ids = post_singles(&mut r, &mut nic, CTS_LOW_WATER as usize + 1);
    // All granted receives and then the deferred one arrive in one poll: the sender cannot
    // have had the last one's address.
    for seq in 0..=CTS_LOW_WATER {
        nic.arrive(nic.recvs[seq as usize], imm(seq, 1, false, false), 8);
    }
    assert_eq!(
        protocol_error(&mut r, &mut nic, ids[0]),
        ProtocolError::UnexpectedCompletion { wr: WrKind::Recv }
    );
}

/// One receiver of a pair driven the general way (`irecv` alone) and one as the plugin drives it
/// (`irecv_one`, the general `irecv` when it declines); how many the one-buffer path took.
struct Twins {
    general: (RecvConn, MockNic),
    direct: (RecvConn, MockNic),
    taken_directly: usize,
}

impl Twins {
    fn irecv(&mut self, buf: RecvBuf, tag: u32) -> RequestId {
        let (g, nic_g) = &mut self.general;
        let id_g = g.irecv(nic_g, &[buf], &[tag]).unwrap().unwrap();
        let (d, nic_d) = &mut self.direct;
        let id_d = match d.irecv_one(buf, tag, nic_d.max_inline()).unwrap() {
            OneRecv::Post { req, recv, cts } => {
                nic_d.post_recv(recv).unwrap();
                nic_d.post_send(&[d.one_cts_write(cts)]).unwrap();
                self.taken_directly += 1;
                req
            }
            OneRecv::General => d.irecv(nic_d, &[buf], &[tag]).unwrap().unwrap(),
        };
        assert_eq!(id_d, id_g);
        self.same_posts();
        id_g
    }

    fn test(&mut self, id: RequestId) -> Result<Completed, DataError> {
        let (g, nic_g) = &mut self.general;
        let (d, nic_d) = &mut self.direct;
        let result = g.test(nic_g, id);
        assert_eq!(d.test(nic_d, id), result);
        self.same_posts();
        result
    }

    fn same_posts(&self) {
        assert_eq!(self.direct.1.recvs, self.general.1.recvs);
        assert_eq!(self.direct.1.sent, self.general.1.sent);
        assert_eq!(self.direct.0.unannounced(), self.general.0.unannounced());
    }
}

#[test]
fn free_irecv_one_posts_and_completes_as_irecv_does() {
    // Rounds of 1 to 4 receives, the oldest tested once between posts (a polled receiver may
    // then batch its entries, which the one-buffer path leaves to `irecv`), then the announced
    // ones arrive in order and are tested until done; over more than a FIFO's laps.
    let mut t = Twins {
        general: receiver(64),
        direct: receiver(64),
        taken_directly: 0,
    };
    let mut seq = 0u32;
    let mut outstanding: Vec<(u32, RequestId, u64)> = Vec::new();
    for round in 0..200 {
        for _ in 0..(round % 4 + 1) {
            if let Some(&(_, oldest, _)) = outstanding.first() {
                assert_eq!(t.test(oldest), Ok(Completed::Pending));
            }
            let len = u64::from(seq % 50) + 8;
            let id = t.irecv(bufs(&[len])[0], seq % 3);
            outstanding.push((seq, id, len));
            seq += 1;
        }
        // Arrivals for what the sender was told about; testing may announce the rest.
        while let Some(&(s, id, len)) = outstanding.first() {
            let announced = t.general.0.ledger.next_seq - t.general.0.unannounced() as u32;
            if s >= announced {
                assert_eq!(t.test(id), Ok(Completed::Pending));
                continue;
            }
            let recv_wr = WrId {
                kind: WrKind::Recv,
                index: u16::from(s as u8),
                seq: s,
            }
            .encode();
            t.general
                .1
                .arrive(recv_wr, imm(s, 1, false, false), len as u32 - 1);
            t.direct
                .1
                .arrive(recv_wr, imm(s, 1, false, false), len as u32 - 1);
            let mut sizes = [0; MAX_RECVS];
            sizes[0] = len as u32 - 1;
            assert_eq!(t.test(id), Ok(Completed::Done { n: 1, sizes }));
            outstanding.remove(0);
        }
    }
    assert!(seq > SLOTS as u32);
    // Both paths ran: most receives one-buffer, the deferred ones the general way.
    assert!(
        t.taken_directly > seq as usize / 2,
        "{} of {seq}",
        t.taken_directly
    );
    assert!(
        t.taken_directly < seq as usize,
        "{} of {seq}",
        t.taken_directly
    );
}

#[test]
fn irecv_one_declines_what_it_does_not_decide() {
    // No inline room for an entry: the general path stages it.
    let (mut r, mut nic) = receiver(16);
    assert_eq!(
        r.irecv_one(bufs(&[8])[0], 0, nic.max_inline()),
        Ok(OneRecv::General)
    );
    assert_eq!(r.outstanding(), 0);
    assert!(r.irecv(&mut nic, &bufs(&[8]), &[0]).unwrap().is_some());
    // The slot is busy: every slot taken, the next receive waits (the general path says so).
    let (mut r, mut nic) = receiver(64);
    for _ in 0..SLOTS {
        let OneRecv::Post { recv, cts, .. } = r.irecv_one(bufs(&[8])[0], 0, 64).unwrap() else {
            panic!("a free slot");
        };
        nic.post_recv(recv).unwrap();
        nic.post_send(&[r.one_cts_write(cts)]).unwrap();
    }
    assert_eq!(r.irecv_one(bufs(&[8])[0], 0, 64), Ok(OneRecv::General));
    assert_eq!(r.irecv(&mut nic, &bufs(&[8]), &[0]), Ok(None));
    // A buffer that wraps the address space is refused at once.
    let (mut r, _) = receiver(64);
    let wraps = RecvBuf {
        addr: u64::MAX - 3,
        len: 8,
        rkey: 1,
        host: false,
    };
    assert!(matches!(
        r.irecv_one(wraps, 0, 64),
        Err(DataError::InvalidArgument(_))
    ));
}

#[test]
fn irecv_one_post_failure_fails_the_connection() {
    let (mut r, _) = receiver(64);
    let Ok(OneRecv::Post { req, .. }) = r.irecv_one(bufs(&[8])[0], 0, 64) else {
        panic!("a one-buffer receive");
    };
    assert_eq!(r.outstanding(), 1);
    let err = r.post_failed(req, NicError::Post { errno: 12 });
    assert_eq!(r.failure(), Some(&err));
    assert_eq!(r.outstanding(), 0, "the request never handed out is freed");
    assert_eq!(r.irecv_one(bufs(&[8])[0], 0, 64), Err(err));
}

#[test]
fn irecv_one_on_a_peer_fifo_too_small_fails_at_once() {
    // The one-buffer path computes the entry's remote address without a range check: it relies
    // on `new` failing a connection whose peer FIFO is short.
    let mut r = RecvConn::new(peer_region(SEND_INBOUND_LEN - 1));
    let err = r.irecv_one(bufs(&[8])[0], 0, 64).unwrap_err();
    assert!(matches!(err, DataError::PeerRegion { .. }), "{err}");
    assert_eq!(r.outstanding(), 0);
}
