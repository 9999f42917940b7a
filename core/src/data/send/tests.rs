//! Per-state unit tests of the sender: `<state>_<event>`.
//!
//! States: `unread` (no entries of the head receive cached), `matching` (a grouped receive
//! partially matched), `ending` (a slot's write-with-immediate posted, not completed),
//! `failed` (sticky error). `any` means the event behaves the same in every state.

use std::vec::Vec;

use super::*;
use crate::data::codec::{IMM_MISMATCH, IMM_RECORD};
use crate::data::mock::{MockNic, peer_region};
use crate::data::{Completed, MAX_REQUESTS};
use crate::data::{RECV_INBOUND_LEN, SEND_INBOUND_LEN, SEND_QUEUE_DEPTH, SEND_STAGING_LEN};
use crate::nic::{NicError, WcStatus};

const RECORDS: u64 = 0x5000_0000;

fn sender(max_inline: usize) -> (SendConn, MockNic) {
    (
        SendConn::new(peer_region(RECV_INBOUND_LEN)),
        MockNic::new(max_inline, SEND_INBOUND_LEN, SEND_STAGING_LEN),
    )
}

/// Write the entries of receive `seq` into the FIFO as the receiver would: `(capacity, tag)`.
fn write_cts(nic: &mut MockNic, seq: u32, bufs: &[(u64, u32)]) {
    let base = (seq as usize % SLOTS) * CTS_SLOT_LEN;
    for (i, &(size, tag)) in bufs.iter().enumerate() {
        let entry = CtsEntry {
            addr: 0x9000_0000 + 0x10_000 * i as u64,
            size,
            rkey: 0x100 + i as u32,
            tag,
            n: bufs.len() as u8,
            index: i as u8,
            eager_ok: false,
            stamp: stamp_for(seq),
        };
        let at = base + i * CTS_ENTRY_LEN;
        nic.inbound[at..at + CTS_ENTRY_LEN].copy_from_slice(&entry.encode());
    }
}

fn buf(len: u64) -> SendBuf {
    SendBuf {
        addr: 0x7000_0000,
        len,
        lkey: 0x33,
    }
}

/// A sender with a group of three (tags 0, 1, 2; capacity 100) with tag 0 matched.
fn matching() -> (SendConn, MockNic, RequestId) {
    let (mut s, mut nic) = sender(64);
    write_cts(&mut nic, 0, &[(100, 0), (100, 1), (100, 2)]);
    let id = s.isend(&mut nic, buf(10), 0).unwrap().unwrap();
    (s, nic, id)
}

/// A sender whose slot 0 (n = 1) end is posted; returns the request and the end's wr_id.
fn ending() -> (SendConn, MockNic, RequestId, u64) {
    let (mut s, mut nic) = sender(64);
    write_cts(&mut nic, 0, &[(100, 5)]);
    let id = s.isend(&mut nic, buf(40), 5).unwrap().unwrap();
    let wr_id = nic.last().wr_id;
    (s, nic, id, wr_id)
}

fn failed() -> (SendConn, MockNic, RequestId) {
    let (mut s, mut nic, id, wr_id) = ending();
    nic.fail(wr_id, WcStatus::REM_ACCESS_ERR, CompletionKind::Send);
    assert!(s.test(&mut nic, id).is_err());
    (s, nic, id)
}

#[test]
fn unread_isend_without_cts_is_try_later() {
    let (mut s, mut nic) = sender(64);
    assert_eq!(s.isend(&mut nic, buf(8), 0), Ok(None));
    assert!(nic.sent.is_empty());
    assert_eq!(s.outstanding(), 0);
}

#[test]
fn unread_isend_with_previous_lap_stamp_is_try_later() {
    let (mut s, mut nic) = sender(64);
    // Slot 0 holds entries stamped for receive 256 (another lap): not receive 0's.
    write_cts(&mut nic, 256, &[(100, 0)]);
    assert_eq!(s.isend(&mut nic, buf(8), 0), Ok(None));
}

#[test]
fn unread_isend_posts_one_signaled_write_with_immediate() {
    let (mut s, mut nic) = sender(64);
    write_cts(&mut nic, 0, &[(100, 5)]);
    let id = s.isend(&mut nic, buf(40), 5).unwrap().unwrap();
    assert_eq!(nic.sent.len(), 1);
    let wr = nic.last();
    assert!(wr.signaled);
    assert_eq!((wr.remote_addr, wr.rkey), (0x9000_0000, 0x100));
    assert_eq!(
        wr.local,
        Some(Sge {
            addr: 0x7000_0000,
            len: 40,
            lkey: 0x33
        })
    );
    let SendOp::WriteImm(imm) = wr.op else {
        panic!("not a write with immediate")
    };
    let imm = Imm::decode(imm).unwrap();
    assert_eq!(
        (imm.seq16, imm.n, imm.record, imm.mismatch),
        (0, 1, false, false)
    );
    let wr_id = WrId::decode(wr.wr_id).unwrap();
    assert_eq!((wr_id.kind, wr_id.index), (WrKind::SlotEnd, 0));
    assert_eq!(s.outstanding(), 1);
    assert_eq!(s.test(&mut nic, id), Ok(Completed::Pending));
}

#[test]
fn unread_isend_zero_length_targets_the_completion_record() {
    let (mut s, mut nic) = sender(64);
    write_cts(&mut nic, 0, &[(0, 5)]);
    s.isend(&mut nic, buf(0), 5).unwrap().unwrap();
    let wr = nic.last();
    assert!(wr.empty);
    assert_eq!((wr.remote_addr, wr.rkey), (RECORDS, 0x77));
}

#[test]
fn unread_isend_too_large_writes_a_flagged_record_inline() {
    let (mut s, mut nic) = sender(64);
    write_cts(&mut nic, 0, &[(100, 5)]);
    let id = s.isend(&mut nic, buf(101), 5).unwrap().unwrap();
    let wr = nic.last();
    assert!(wr.inline && wr.local.is_none());
    assert_eq!(wr.bytes, 101u32.to_le_bytes());
    assert_eq!(wr.remote_addr, RECORDS);
    let SendOp::WriteImm(imm) = wr.op else {
        panic!()
    };
    assert_eq!(imm & (IMM_RECORD | IMM_MISMATCH), IMM_RECORD | IMM_MISMATCH);
    let expected = DataError::SizeMismatch {
        index: 0,
        sent: 101,
        capacity: 100,
    };
    assert_eq!(s.test(&mut nic, id), Err(expected));
    assert!(s.failure().is_none());
}

#[test]
fn unread_isend_too_large_stages_the_record_without_inline() {
    let (mut s, mut nic) = sender(0);
    write_cts(&mut nic, 0, &[(100, 5)]);
    s.isend(&mut nic, buf(101), 5).unwrap().unwrap();
    let wr = nic.last();
    assert_eq!(wr.staged, Some((0, 4)));
    assert_eq!(wr.bytes, 101u32.to_le_bytes());
}

/// Rewrite the check field of the entry in `bytes` after a test altered it.
fn recheck(bytes: &mut [u8]) {
    let entry: &mut [u8; CTS_ENTRY_LEN] = bytes.try_into().expect("one entry");
    let check = crate::data::codec::entry_check(entry);
    entry[26..28].copy_from_slice(&check.to_le_bytes());
}

#[test]
fn unread_isend_entry_that_does_not_check_is_try_later() {
    let (mut s, mut nic) = sender(64);
    write_cts(&mut nic, 0, &[(100, 5)]);
    nic.inbound[0] ^= 0xff; // the head of the entry has not landed yet
    assert_eq!(s.isend(&mut nic, buf(1), 5), Ok(None));
    assert!(s.failure().is_none(), "a torn entry is not an error");
    nic.inbound[0] ^= 0xff; // now it has
    assert!(s.isend(&mut nic, buf(1), 5).unwrap().is_some());
}

#[test]
fn unread_isend_malformed_fresh_entry_fails_the_connection() {
    let (mut s, mut nic) = sender(64);
    write_cts(&mut nic, 0, &[(100, 5)]);
    nic.inbound[25] = 3; // index 3 of a group of 1
    recheck(&mut nic.inbound[..CTS_ENTRY_LEN]);
    let err = s.isend(&mut nic, buf(1), 5).unwrap_err();
    assert!(matches!(
        err,
        DataError::Protocol(ProtocolError::CtsEntry { .. })
    ));
    assert_eq!(s.failure(), Some(&err));
}

#[test]
fn unread_isend_group_disagreement_fails_the_connection() {
    let (mut s, mut nic) = sender(64);
    write_cts(&mut nic, 0, &[(100, 0), (100, 1)]);
    nic.inbound[CTS_ENTRY_LEN + 24] = 3; // entry 1 claims a group of 3
    nic.inbound[CTS_ENTRY_LEN + 25] = 1;
    recheck(&mut nic.inbound[CTS_ENTRY_LEN..2 * CTS_ENTRY_LEN]);
    let err = s.isend(&mut nic, buf(1), 0).unwrap_err();
    assert_eq!(
        err,
        DataError::Protocol(ProtocolError::CtsGroup { slot: 0 })
    );
}

#[test]
fn unread_isend_post_error_is_sticky() {
    let (mut s, mut nic) = sender(64);
    write_cts(&mut nic, 0, &[(100, 0)]);
    nic.fail_post = Some(NicError::Post { errno: 12 });
    let err = s.isend(&mut nic, buf(1), 0).unwrap_err();
    assert_eq!(err, DataError::Nic(NicError::Post { errno: 12 }));
    nic.fail_post = None;
    assert_eq!(s.isend(&mut nic, buf(1), 0), Err(err));
    assert_eq!(s.outstanding(), 0);
}

#[test]
fn matching_isend_other_tag_is_try_later() {
    let (mut s, mut nic, _) = matching();
    let before = nic.sent.len();
    assert_eq!(
        s.isend(&mut nic, buf(10), 0),
        Ok(None),
        "tag 0 already matched"
    );
    assert_eq!(s.isend(&mut nic, buf(10), 9), Ok(None));
    assert_eq!(nic.sent.len(), before);
}

#[test]
fn matching_isend_data_is_an_unsignaled_write() {
    let (_, nic, _) = matching();
    let wr = nic.last();
    assert_eq!(wr.op, SendOp::Write);
    assert!(!wr.signaled);
    assert_eq!(WrId::decode(wr.wr_id).unwrap().kind, WrKind::Data);
}

#[test]
fn matching_isend_last_posts_data_and_the_sizes_record() {
    let (mut s, mut nic, first) = matching();
    s.isend(&mut nic, buf(0), 2).unwrap().unwrap(); // zero length: no data write
    let before = nic.sent.len();
    let last = s.isend(&mut nic, buf(30), 1).unwrap().unwrap();
    assert_eq!(nic.sent.len(), before + 2);
    let end = nic.last().clone();
    assert!(end.signaled && end.inline);
    assert_eq!(end.remote_addr, RECORDS);
    let mut expected = Vec::new();
    for size in [10u32, 30, 0] {
        expected.extend_from_slice(&size.to_le_bytes());
    }
    assert_eq!(end.bytes, expected);
    let SendOp::WriteImm(imm) = end.op else {
        panic!()
    };
    let imm = Imm::decode(imm).unwrap();
    assert_eq!((imm.n, imm.record, imm.mismatch), (3, true, false));
    // The end completes all three.
    nic.complete_send(end.wr_id);
    for id in [first, last] {
        assert!(matches!(
            s.test(&mut nic, id),
            Ok(Completed::Done { n: 1, .. })
        ));
    }
}

#[test]
fn full_isend_is_try_later_and_posts_nothing() {
    let (mut s, mut nic) = sender(64);
    // 80 groups of 8: more work requests than the send queue holds, no completions.
    let mut posted_ok = 0;
    'outer: for seq in 0..80u32 {
        write_cts(&mut nic, seq, &[(100, 0); 8]);
        for _ in 0..8 {
            match s.isend(&mut nic, buf(8), 0).unwrap() {
                Some(_) => posted_ok += 1,
                None => break 'outer,
            }
        }
    }
    assert!(nic.sent.len() <= SEND_QUEUE_DEPTH);
    let before = nic.sent.len();
    assert!(posted_ok <= MAX_REQUESTS);
    assert_eq!(s.isend(&mut nic, buf(8), 0), Ok(None));
    assert_eq!(nic.sent.len(), before);
}

#[test]
fn ending_completion_marks_done_and_test_frees() {
    let (mut s, mut nic, id, wr_id) = ending();
    nic.complete_send(wr_id);
    let mut sizes = [0; MAX_RECVS];
    sizes[0] = 40;
    assert_eq!(s.test(&mut nic, id), Ok(Completed::Done { n: 1, sizes }));
    assert_eq!(s.outstanding(), 0);
    assert_eq!(
        s.test(&mut nic, id),
        Err(DataError::InvalidRequest { bits: id.to_bits() })
    );
}

#[test]
fn ending_completion_at_wrong_position_is_a_protocol_error() {
    let (mut s, mut nic, id, wr_id) = ending();
    let mut bogus = WrId::decode(wr_id).unwrap();
    bogus.seq += 5;
    nic.complete_send(bogus.encode());
    let err = s.test(&mut nic, id).unwrap_err();
    assert!(matches!(
        err,
        DataError::Protocol(ProtocolError::UnexpectedCompletion { .. })
    ));
}

#[test]
fn ending_completion_twice_is_a_protocol_error() {
    let (mut s, mut nic, id, wr_id) = ending();
    nic.complete_send(wr_id);
    nic.complete_send(wr_id);
    assert!(s.test(&mut nic, id).is_err());
    assert!(s.failure().is_some());
}

#[test]
fn ending_next_lap_of_the_slot_waits_for_the_end() {
    let (mut s, mut nic, id, first_end) = ending();
    // Receives 1..=255 are served by refused sends (freed at once); their ends stay pending too.
    let mut ends = std::vec![first_end];
    for seq in 1..256u32 {
        write_cts(&mut nic, seq, &[(0, 0)]);
        let r = s.isend(&mut nic, buf(1), 0).unwrap().unwrap();
        ends.push(nic.last().wr_id);
        assert!(matches!(
            s.test(&mut nic, r),
            Err(DataError::SizeMismatch { .. })
        ));
    }
    // Receive 256 reuses slot 0, whose end has not completed here yet.
    write_cts(&mut nic, 256, &[(100, 0)]);
    assert_eq!(s.isend(&mut nic, buf(1), 0), Ok(None));
    for wr_id in ends {
        nic.complete_send(wr_id);
    }
    assert!(s.isend(&mut nic, buf(1), 0).unwrap().is_some());
    assert!(matches!(s.test(&mut nic, id), Ok(Completed::Done { .. })));
}

#[test]
fn any_failed_completion_fails_every_request_with_status_and_kind() {
    let (mut s, mut nic, first) = matching();
    let data_wr = nic.last().wr_id;
    let second = s.isend(&mut nic, buf(5), 1).unwrap().unwrap();
    nic.fail(data_wr, WcStatus::WR_FLUSH_ERR, CompletionKind::Send);
    let err = s.test(&mut nic, second).unwrap_err();
    assert_eq!(
        err,
        DataError::Completion {
            status: WcStatus::WR_FLUSH_ERR,
            vendor_err: 0x42,
            wr: Some(WrKind::Data)
        }
    );
    assert_eq!(s.test(&mut nic, first), Err(err));
    assert_eq!(s.isend(&mut nic, buf(5), 2), Err(err));
    let text = std::format!("{err}");
    assert!(text.contains("data RDMA write failed: Work Request Flushed Error (status 5"));
    assert!(text.contains("look for the first error"));
}

#[test]
fn any_foreign_wr_id_is_a_protocol_error() {
    let (mut s, mut nic, id, _) = ending();
    nic.complete_send(0x1234);
    let err = s.test(&mut nic, id).unwrap_err();
    assert!(matches!(
        err,
        DataError::Protocol(ProtocolError::WrId { wr_id: 0x1234, .. })
    ));
}

#[test]
fn any_receive_completion_is_a_protocol_error() {
    let (mut s, mut nic, id, wr_id) = ending();
    nic.arrive(wr_id, 0, 0);
    assert!(matches!(
        s.test(&mut nic, id),
        Err(DataError::Protocol(
            ProtocolError::UnexpectedCompletion { .. }
        ))
    ));
}

#[test]
fn any_poll_error_is_sticky() {
    let (mut s, mut nic, id, _) = ending();
    nic.fail_poll = Some(NicError::Poll { code: -5 });
    let err = s.test(&mut nic, id).unwrap_err();
    assert_eq!(err, DataError::Nic(NicError::Poll { code: -5 }));
    assert_eq!(s.failure(), Some(&err));
}

#[test]
fn failed_isend_and_test_return_the_first_cause() {
    let (mut s, mut nic, id) = failed();
    let cause = *s.failure().unwrap();
    assert!(matches!(
        cause,
        DataError::Completion {
            status: WcStatus::REM_ACCESS_ERR,
            ..
        }
    ));
    s.handle_fatal(DataError::PeerLost);
    assert_eq!(s.failure(), Some(&cause));
    write_cts(&mut nic, 1, &[(100, 0)]);
    assert_eq!(s.isend(&mut nic, buf(1), 0), Err(cause));
    // The failed request was freed by the test that reported the failure.
    assert!(matches!(
        s.test(&mut nic, id),
        Err(DataError::InvalidRequest { .. })
    ));
}

#[test]
fn unread_peer_region_too_small_fails_at_once() {
    let mut s = SendConn::new(peer_region(RECV_INBOUND_LEN - 1));
    let mut nic = MockNic::new(64, SEND_INBOUND_LEN, SEND_STAGING_LEN);
    write_cts(&mut nic, 0, &[(100, 0)]);
    assert!(matches!(
        s.isend(&mut nic, buf(1), 0),
        Err(DataError::PeerRegion { .. })
    ));
}

/// What the plugin's driver does with [`SendConn::isend_one`]: read the head entry's stamp, then
/// the entry, let the core decide, post what it returns.
fn isend_one(
    s: &mut SendConn,
    nic: &mut MockNic,
    len: u64,
    tag: u32,
) -> Result<OneSend<'static>, DataError> {
    let offset = s.head_entry().expect("the one-buffer path may decide");
    let mut stamp = [0u8; 4];
    nic.read_inbound(offset + CTS_ENTRY_LEN - 4, &mut stamp);
    let mut entry = [0u8; CTS_ENTRY_LEN];
    nic.read_inbound(offset, &mut entry);
    let decided = s.isend_one(u32::from_le_bytes(stamp), &entry, buf(len), tag, None)?;
    if let OneSend::Post { wr, .. } = decided {
        nic.post_send(&[wr]).expect("mock posts");
    }
    Ok(decided)
}

#[test]
fn unread_isend_one_posts_and_completes_as_isend_does() {
    // Two senders fed the same clear-to-send entries over more than a FIFO's laps: the one-buffer
    // path returns the work request the general path posts, and the same request ids.
    let (mut general, mut nic_g) = sender(64);
    let (mut direct, mut nic_d) = sender(64);
    for seq in 0..(SLOTS as u32 + 20) {
        let (len, tag) = (u64::from(seq % 97) + 1, seq % 5);
        write_cts(&mut nic_g, seq, &[(100, tag)]);
        write_cts(&mut nic_d, seq, &[(100, tag)]);
        let id_g = general.isend(&mut nic_g, buf(len), tag).unwrap().unwrap();
        let OneSend::Post { req: id_d, wr } = isend_one(&mut direct, &mut nic_d, len, tag).unwrap()
        else {
            panic!("seq {seq}: a fitting one-buffer send is posted directly");
        };
        assert_eq!(id_d, id_g, "seq {seq}");
        assert_eq!(nic_d.last(), nic_g.last(), "seq {seq}: {wr:?}");
        for (s, nic, id) in [
            (&mut general, &mut nic_g, id_g),
            (&mut direct, &mut nic_d, id_d),
        ] {
            let wr_id = nic.last().wr_id;
            nic.complete_send(wr_id);
            let mut sizes = [0; MAX_RECVS];
            sizes[0] = len as u32;
            assert_eq!(s.test(nic, id), Ok(Completed::Done { n: 1, sizes }));
        }
    }
    assert_eq!(direct.outstanding(), 0);
}

#[test]
fn unread_isend_one_without_a_landed_entry_is_not_yet() {
    let (mut s, mut nic) = sender(64);
    assert_eq!(isend_one(&mut s, &mut nic, 8, 0), Ok(OneSend::NotYet));
    // The previous lap's stamp in the slot is not this receive's either.
    write_cts(&mut nic, SLOTS as u32, &[(100, 0)]);
    assert_eq!(isend_one(&mut s, &mut nic, 8, 0), Ok(OneSend::NotYet));
    assert!(nic.sent.is_empty());
    assert_eq!(s.outstanding(), 0);
}

#[test]
fn unread_isend_one_carries_handed_bytes_inline_and_nothing_else() {
    // The bytes the driver hands over go inline, in place of the scatter entry; the same write
    // otherwise (immediate, remote address, key, signaling, request).
    let bytes = [0xa5u8; 8];
    let (mut plain, mut nic_p) = sender(64);
    let (mut inline, mut nic_i) = sender(64);
    inline.set_inline_max(8);
    for nic in [&mut nic_p, &mut nic_i] {
        for seq in 0..3 {
            write_cts(nic, seq, &[(100, 5)]);
        }
    }
    let read = |s: &SendConn, nic: &MockNic| {
        let offset = s.head_entry().expect("one-buffer path");
        let mut stamp = [0u8; 4];
        nic.read_inbound(offset + CTS_ENTRY_LEN - 4, &mut stamp);
        let mut entry = [0u8; CTS_ENTRY_LEN];
        nic.read_inbound(offset, &mut entry);
        (u32::from_le_bytes(stamp), entry)
    };
    let (stamp, entry) = read(&plain, &nic_p);
    // Without a limit set, handed bytes change nothing.
    let OneSend::Post { req: req_p, wr } = plain
        .isend_one(stamp, &entry, buf(8), 5, Some(&bytes))
        .unwrap()
    else {
        panic!("posted");
    };
    nic_p.post_send(&[wr]).unwrap();
    let (stamp, entry) = read(&inline, &nic_i);
    let OneSend::Post { req: req_i, wr } = inline
        .isend_one(stamp, &entry, buf(8), 5, Some(&bytes))
        .unwrap()
    else {
        panic!("posted");
    };
    nic_i.post_send(&[wr]).unwrap();
    assert_eq!(req_p, req_i);
    let (p, i) = (nic_p.last().clone(), nic_i.last().clone());
    assert!(!p.inline && p.local.is_some());
    assert!(i.inline && i.local.is_none());
    assert_eq!(i.bytes, bytes.to_vec());
    assert_eq!((p.op, p.remote_addr, p.rkey), (i.op, i.remote_addr, i.rkey));
    // The plain write ends the slot, signaled: its completion completes the request. The inline
    // one's request is done already: a data write, signaled only as credits need.
    assert!(p.signaled && !i.signaled);
    assert_eq!(WrId::decode(p.wr_id).unwrap().kind, WrKind::SlotEnd);
    assert_eq!(WrId::decode(i.wr_id).unwrap().kind, WrKind::Data);
    // Bytes that are not exactly the send's are not used.
    let (stamp, entry) = read(&inline, &nic_i);
    let OneSend::Post { wr, .. } = inline
        .isend_one(stamp, &entry, buf(8), 5, Some(&bytes[..4]))
        .unwrap()
    else {
        panic!("posted");
    };
    nic_i.post_send(&[wr]).unwrap();
    assert!(!nic_i.last().inline && nic_i.last().local.is_some());
    // Nor are bytes above the limit.
    let big = [1u8; 9];
    let (stamp, entry) = read(&inline, &nic_i);
    let OneSend::Post { wr, .. } = inline
        .isend_one(stamp, &entry, buf(9), 5, Some(&big))
        .unwrap()
    else {
        panic!("posted");
    };
    nic_i.post_send(&[wr]).unwrap();
    assert!(!nic_i.last().inline && nic_i.last().local.is_some());
}

#[test]
fn an_inline_send_is_done_at_its_post_and_a_close_fences_its_write() {
    // The NIC copied an inline send's bytes at the post: its request is done before any
    // completion, and `test` polls nothing for it. The write is unsignaled (the send queue's
    // credits ask for a signal every 64th); a close fences it with a signaled empty write and
    // waits for that, and a failed write fails the connection as soon as this side waits for
    // its peer.
    let bytes = [0x5au8; 8];
    let (mut s, mut nic) = sender(64);
    s.set_inline_max(64);
    let mut sizes = [0; MAX_RECVS];
    sizes[0] = 8;
    let post = |s: &mut SendConn, nic: &mut MockNic, seq: u32| {
        write_cts(nic, seq, &[(100, 3)]);
        let offset = s.head_entry().expect("one-buffer path");
        let (stamp, entry) = nic.read_inbound_stamped::<CTS_ENTRY_LEN>(offset);
        let OneSend::Post { req, wr } =
            s.isend_one(stamp, &entry, buf(8), 3, Some(&bytes)).unwrap()
        else {
            panic!("posted");
        };
        nic.post_send(&[wr]).unwrap();
        req
    };
    let req = post(&mut s, &mut nic, 0);
    assert!(nic.last().inline && !nic.last().signaled);
    assert_eq!(s.test(&mut nic, req), Ok(Completed::Done { n: 1, sizes }));
    assert_eq!(s.outstanding(), 0);
    assert_eq!(
        s.drain(&mut nic),
        Ok(1),
        "the write is not known complete: a close waits"
    );
    let fence = nic.last().clone();
    assert!(fence.signaled && fence.empty && fence.op == SendOp::Write);
    assert_eq!(fence.remote_addr, peer_region(RECV_INBOUND_LEN).addr);
    assert_eq!(
        s.drain(&mut nic),
        Ok(1),
        "one fence, and it has not completed"
    );
    assert_eq!(nic.sent.len(), 2);
    nic.complete_send(fence.wr_id);
    assert_eq!(s.drain(&mut nic), Ok(0));
    assert_eq!(nic.sent.len(), 2);

    // The next inline send, done at its post; its write fails. A send that then waits for its
    // receive's entry polls, and the connection fails there.
    let req = post(&mut s, &mut nic, 1);
    assert_eq!(s.test(&mut nic, req), Ok(Completed::Done { n: 1, sizes }));
    let wr_id = nic.last().wr_id;
    nic.fail(wr_id, WcStatus::RETRY_EXC_ERR, CompletionKind::Send);
    let offset = s.head_entry().expect("one-buffer path");
    let (stamp, entry) = nic.read_inbound_stamped::<CTS_ENTRY_LEN>(offset);
    assert_eq!(
        s.isend_one(stamp, &entry, buf(8), 3, Some(&bytes)),
        Ok(OneSend::General),
        "no entry yet, a write not known complete: the general path, which polls"
    );
    let err = s.isend(&mut nic, buf(8), 3).unwrap_err();
    assert!(matches!(err, DataError::Completion { .. }), "{err:?}");
    assert!(s.failure().is_some());
}

#[test]
fn unread_isend_one_leaves_every_other_case_to_isend() {
    // Each case: the entries written, the send's length and tag. Nothing is posted or taken, and
    // the general path then does what it does for that case.
    type Case = (&'static [(u64, u32)], u64, u32);
    let cases: [Case; 4] = [
        (&[(100, 0), (100, 1)], 8, 0), // a grouped receive
        (&[(100, 7)], 8, 6),           // another tag
        (&[(100, 7)], 101, 7),         // larger than the buffer: refused by isend
        (&[(100, 7)], 0, 7),           // empty: a write into the record
    ];
    for (bufs, len, tag) in cases {
        let (mut s, mut nic) = sender(64);
        write_cts(&mut nic, 0, bufs);
        assert_eq!(
            isend_one(&mut s, &mut nic, len, tag),
            Ok(OneSend::General),
            "{bufs:?}"
        );
        assert!(nic.sent.is_empty());
        assert_eq!(s.outstanding(), 0);
        let taken = s.isend(&mut nic, buf(len), tag).unwrap();
        assert_eq!(taken.is_some(), tag != 6, "{bufs:?} {len} {tag}");
    }
    // An entry still landing (it does not check) is counted by the general path, not here.
    let (mut s, mut nic) = sender(64);
    write_cts(&mut nic, 0, &[(100, 5)]);
    nic.inbound[0] ^= 0xff;
    assert_eq!(isend_one(&mut s, &mut nic, 1, 5), Ok(OneSend::General));
    assert_eq!(s.isend(&mut nic, buf(1), 5), Ok(None));
    // Adaptive routing's split above its threshold.
    let (mut s, mut nic) = sender(64);
    s.set_adaptive_routing(Some(16));
    write_cts(&mut nic, 0, &[(100, 5)]);
    assert_eq!(isend_one(&mut s, &mut nic, 17, 5), Ok(OneSend::General));
    assert!(matches!(
        isend_one(&mut s, &mut nic, 16, 5),
        Ok(OneSend::Post { .. })
    ));
}

#[test]
fn unread_isend_one_waits_for_the_slot_and_reports_failures() {
    let (mut s, mut nic, _id, _wr_id) = ending();
    // Slot 0's end is in flight: the next lap of slot 0 is not the one-buffer path's to decide.
    for seq in 1..SLOTS as u32 {
        write_cts(&mut nic, seq, &[(100, 5)]);
        let OneSend::Post { req, .. } = isend_one(&mut s, &mut nic, 8, 5).unwrap() else {
            panic!("seq {seq}");
        };
        let wr_id = nic.last().wr_id;
        nic.complete_send(wr_id);
        assert!(matches!(s.test(&mut nic, req), Ok(Completed::Done { .. })));
    }
    assert_eq!(s.head_entry(), None);
    // A failed post fails the connection; later calls return that cause.
    let (mut s, mut nic) = sender(64);
    write_cts(&mut nic, 0, &[(100, 5)]);
    let (stamp, entry) = crate::sim::read_head(&s, &nic).expect("slot 0 is idle");
    let OneSend::Post { req, .. } = s.isend_one(stamp, &entry, buf(8), 5, None).unwrap() else {
        panic!("a one-buffer send");
    };
    assert_eq!(s.outstanding(), 1);
    let err = s.post_failed(req, NicError::Post { errno: 12 });
    assert_eq!(s.failure(), Some(&err));
    assert_eq!(s.outstanding(), 0, "the request never handed out is freed");
    assert_eq!(s.isend_one(stamp, &entry, buf(8), 5, None), Err(err));
    assert_eq!(s.isend(&mut nic, buf(8), 5), Err(err));
}

// The edges of `poll_cq`'s fast path (the slot end's completion compared whole): what it takes
// ends the slot and returns the credits as the long way does; everything else goes the long way
// with the results and errors it had.

#[test]
fn ending_completion_returns_the_credits_and_frees_the_slot() {
    let (mut s, mut nic, id, wr_id) = ending();
    assert_eq!(s.sq.unretired(), 1);
    nic.complete_send(wr_id);
    assert!(matches!(s.test(&mut nic, id), Ok(Completed::Done { .. })));
    assert_eq!(s.sq.unretired(), 0);
    assert_eq!(s.ends[0], EndState::Idle);
    assert_eq!(s.drain(&mut nic), Ok(0));
    assert!(s.failure().is_none());
}

#[test]
fn ending_completion_naming_another_slot_is_a_protocol_error() {
    let (mut s, mut nic, id, wr_id) = ending();
    // Same kind and position, slot 1 (idle): decodes, but is not slot 0's end.
    nic.complete_send(wr_id | 1 << 8);
    assert_eq!(
        s.test(&mut nic, id),
        Err(DataError::Protocol(ProtocolError::UnexpectedCompletion {
            wr: WrKind::SlotEnd
        }))
    );
    assert!(s.failure().is_some());
}

#[test]
fn ending_completion_with_an_index_past_the_slots_is_a_wr_id_error() {
    let (mut s, mut nic, id, wr_id) = ending();
    // Index 256: its low byte names slot 0, which is ending at this position; the decoder
    // refuses the index.
    let bogus = wr_id | 1 << 16;
    nic.complete_send(bogus);
    assert_eq!(
        s.test(&mut nic, id),
        Err(DataError::Protocol(ProtocolError::WrId {
            wr_id: bogus,
            err: DecodeError::IndexRange(256)
        }))
    );
}

#[test]
fn ending_completion_of_another_lap_of_the_slot_is_a_protocol_error() {
    let (mut s, mut nic, id, wr_id) = ending();
    // Slot 0's end, at a position 256 posts later: not the one posted.
    let mut bogus = WrId::decode(wr_id).unwrap();
    bogus.seq += 256;
    nic.complete_send(bogus.encode());
    assert_eq!(
        s.test(&mut nic, id),
        Err(DataError::Protocol(ProtocolError::UnexpectedCompletion {
            wr: WrKind::SlotEnd
        }))
    );
}

#[test]
fn ending_failed_completion_of_the_end_fails_the_connection() {
    let (mut s, mut nic, id, wr_id) = ending();
    nic.fail(wr_id, WcStatus::RETRY_EXC_ERR, CompletionKind::Send);
    let err = DataError::Completion {
        status: WcStatus::RETRY_EXC_ERR,
        vendor_err: 0x42,
        wr: Some(WrKind::SlotEnd),
    };
    assert_eq!(s.test(&mut nic, id), Err(err));
    assert_eq!(s.failure(), Some(&err));
    assert!(matches!(s.ends[0], EndState::Ending { .. }));
}

#[test]
fn ending_data_completion_at_the_ends_position_does_not_end_the_slot() {
    let (mut s, mut nic, id, wr_id) = ending();
    // A data write's `wr_id` whose index (request 0) and position are those of slot 0's end:
    // the long way accounts it as a data write; the slot is still ending.
    let mut data = WrId::decode(wr_id).unwrap();
    data.kind = WrKind::Data;
    nic.complete_send(data.encode());
    assert_eq!(s.test(&mut nic, id), Ok(Completed::Pending));
    assert_eq!(s.sq.unretired(), 0);
    assert!(matches!(s.ends[0], EndState::Ending { .. }));
    // The end itself then comes after its position was retired.
    nic.complete_send(wr_id);
    assert_eq!(
        s.test(&mut nic, id),
        Err(DataError::Protocol(ProtocolError::UnexpectedCompletion {
            wr: WrKind::SlotEnd
        }))
    );
}

#[test]
fn ending_several_ends_in_one_poll_complete_every_slot() {
    let (mut s, mut nic, first, first_end) = ending();
    let mut ids = std::vec![first];
    let mut ends = std::vec![first_end];
    for seq in 1..4u32 {
        write_cts(&mut nic, seq, &[(100, 5)]);
        ids.push(
            s.isend(&mut nic, buf(10 + u64::from(seq)), 5)
                .unwrap()
                .unwrap(),
        );
        ends.push(nic.last().wr_id);
    }
    // A grouped receive's end among them, which also goes the fast path's way.
    write_cts(&mut nic, 4, &[(100, 0), (100, 1)]);
    let a = s.isend(&mut nic, buf(7), 0).unwrap().unwrap();
    let b = s.isend(&mut nic, buf(8), 1).unwrap().unwrap();
    ends.push(nic.last().wr_id);
    for &wr_id in &ends {
        nic.complete_send(wr_id);
    }
    // One poll takes them all.
    assert!(matches!(
        s.test(&mut nic, ids[0]),
        Ok(Completed::Done { .. })
    ));
    assert!(nic.cq.is_empty());
    assert_eq!(s.sq.unretired(), 0);
    assert!(s.ends.iter().all(|end| *end == EndState::Idle));
    for (seq, &id) in ids.iter().enumerate().skip(1) {
        let mut sizes = [0; MAX_RECVS];
        sizes[0] = 10 + seq as u32;
        assert_eq!(s.test(&mut nic, id), Ok(Completed::Done { n: 1, sizes }));
    }
    for (id, size) in [(a, 7), (b, 8)] {
        let mut sizes = [0; MAX_RECVS];
        sizes[0] = size;
        assert_eq!(s.test(&mut nic, id), Ok(Completed::Done { n: 1, sizes }));
    }
}

#[test]
fn ending_ends_out_of_order_are_a_protocol_error() {
    let (mut s, mut nic, first, first_end) = ending();
    write_cts(&mut nic, 1, &[(100, 5)]);
    s.isend(&mut nic, buf(10), 5).unwrap().unwrap();
    let second_end = nic.last().wr_id;
    // RC completes in order: the later end first retires the earlier position.
    nic.complete_send(second_end);
    nic.complete_send(first_end);
    assert_eq!(
        s.test(&mut nic, first),
        Err(DataError::Protocol(ProtocolError::UnexpectedCompletion {
            wr: WrKind::SlotEnd
        }))
    );
}
