use super::*;
use alloc::vec;

fn window(rank: u32, host: bool) -> Window {
    Window {
        entries: vec![
            WindowEntry {
                base: 0x1000,
                len: 4096,
                rkey: 10,
            },
            WindowEntry {
                base: 0x9000,
                len: 64,
                rkey: 11,
            },
            WindowEntry {
                base: 0x2_0000,
                len: 0,
                rkey: 12,
            },
        ],
        rank,
        lkey: 7,
        host,
    }
}

#[test]
fn ranges_are_checked_against_the_target_window() {
    let w = window(0, true);
    assert_eq!(w.range(Which::Destination, 1, 0, 64), Ok(0x9000));
    assert_eq!(w.range(Which::Destination, 1, 63, 1), Ok(0x903f));
    assert_eq!(w.range(Which::Destination, 1, 64, 0), Ok(0x9040));
    assert_eq!(
        w.range(Which::Destination, 1, 60, 8),
        Err(RmaError::OutOfWindow {
            which: Which::Destination,
            rank: 1,
            offset: 60,
            size: 8,
            len: 64
        })
    );
    // Wrapping offsets are refused, not wrapped.
    assert!(w.range(Which::Source, 0, u64::MAX, 2).is_err());
    assert!(w.range(Which::Source, 0, 1, u64::MAX).is_err());
    assert_eq!(
        w.range(Which::Source, 3, 0, 0),
        Err(RmaError::BadRank { rank: 3, nranks: 3 })
    );
}

#[test]
fn a_put_uses_the_own_source_and_the_targets_destination() {
    let src = window(1, true);
    let dst = window(1, true);
    let plan = plan_put(&src, 8, 16, &dst, 100, 0, 64).unwrap();
    assert_eq!(
        plan,
        Plan::Put(Transfer {
            local: 0x9008,
            lkey: 7,
            remote: 0x1064,
            rkey: 10,
            len: 16,
            inline: true
        })
    );
    assert_eq!(plan.work_requests(), 1);
    // Device memory is never inline; longer than the inline size neither.
    let dev = window(1, false);
    let Plan::Put(t) = plan_put(&dev, 0, 16, &dst, 0, 0, 64).unwrap() else {
        panic!()
    };
    assert!(!t.inline);
    let Plan::Put(t) = plan_put(&src, 0, 64, &dst, 0, 0, 32).unwrap() else {
        panic!()
    };
    assert!(!t.inline);
    // An empty put is done at once, but its offsets are still checked.
    assert_eq!(plan_put(&src, 64, 0, &dst, 0, 0, 64), Ok(Plan::Nothing));
    assert!(plan_put(&src, 65, 0, &dst, 0, 0, 64).is_err());
    // The source is checked against the own part (64 bytes for rank 1).
    assert!(matches!(
        plan_put(&src, 0, 65, &dst, 0, 0, 64),
        Err(RmaError::OutOfWindow {
            which: Which::Source,
            rank: 1,
            ..
        })
    ));
}

#[test]
fn large_transfers_are_split_into_work_requests_of_at_most_one_gib() {
    let t = Transfer {
        local: 0,
        lkey: 1,
        remote: 1 << 40,
        rkey: 2,
        len: 2 * u64::from(MAX_WR_BYTES) + 5,
        inline: false,
    };
    let pieces: Vec<Piece> = t.pieces().collect();
    assert_eq!(pieces.len(), 3);
    assert_eq!(t.piece_count(), 3);
    assert_eq!(pieces[1].local, u64::from(MAX_WR_BYTES));
    assert_eq!(pieces[1].remote, (1 << 40) + u64::from(MAX_WR_BYTES));
    assert_eq!(pieces[2].len, 5);
    assert_eq!(pieces.iter().map(|p| u64::from(p.len)).sum::<u64>(), t.len);
}

#[test]
fn signals_check_op_alignment_and_window() {
    let w = window(0, true);
    let plan = plan_put_signal(None, 0, 1, &w, 8, SIGNAL_OP_INC, 99, 64).unwrap();
    assert_eq!(
        plan,
        Plan::PutSignal(
            None,
            SignalAdd {
                remote: 0x9008,
                rkey: 11,
                add: 1
            }
        )
    );
    assert_eq!(plan.work_requests(), 1);
    let Plan::PutSignal(_, s) = plan_put_signal(None, 0, 1, &w, 8, SIGNAL_OP_ADD, 99, 64).unwrap()
    else {
        panic!()
    };
    assert_eq!(s.add, 99);
    assert_eq!(
        plan_put_signal(None, 0, 1, &w, 8, 3, 1, 64),
        Err(RmaError::BadSignalOp(3))
    );
    assert!(matches!(
        plan_put_signal(None, 0, 1, &w, 4, SIGNAL_OP_INC, 1, 64),
        Err(RmaError::MisalignedSignal { offset: 4, .. })
    ));
    assert!(matches!(
        plan_put_signal(None, 0, 1, &w, 64, SIGNAL_OP_INC, 1, 64),
        Err(RmaError::OutOfWindow {
            which: Which::Signal,
            ..
        })
    ));
    let with_put = plan_put_signal(Some((&w, 0, &w, 0)), 100, 1, &w, 0, SIGNAL_OP_INC, 0, 0);
    assert!(matches!(
        with_put,
        Err(RmaError::OutOfWindow {
            which: Which::Destination,
            ..
        })
    ));
    let ok = plan_put_signal(Some((&w, 0, &w, 0)), 16, 1, &w, 0, SIGNAL_OP_INC, 0, 0).unwrap();
    assert_eq!(ok.work_requests(), 2);
}

#[test]
fn gets_and_flushes() {
    let w = window(0, false);
    let plan = plan_get(&w, 4, 8, &w, 16, 1).unwrap();
    assert_eq!(
        plan,
        Plan::Get(Transfer {
            local: 0x1010,
            lkey: 7,
            remote: 0x9004,
            rkey: 11,
            len: 8,
            inline: false
        })
    );
    assert!(matches!(
        plan_get(&w, 60, 8, &w, 0, 1),
        Err(RmaError::OutOfWindow {
            which: Which::Remote,
            ..
        })
    ));
    assert!(matches!(
        plan_get(&w, 0, 8, &w, 4090, 1),
        Err(RmaError::OutOfWindow {
            which: Which::Local,
            ..
        })
    ));
    assert_eq!(
        plan_flush(&w),
        Ok(Plan::FlushRead {
            remote: 0x1000,
            rkey: 10
        })
    );
    assert_eq!(plan_flush(&window(0, true)), Ok(Plan::Nothing));
    assert_eq!(plan_flush(&window(2, false)), Ok(Plan::Nothing));
}

#[test]
fn request_ids_round_trip_and_are_never_zero() {
    let mut r = Requests::new(1, 2, 0, 1, 64);
    let lane = r.lane(0, 1).unwrap();
    for _ in 0..5000 {
        let id = r.begin(lane, 1).unwrap();
        assert_ne!(id.to_bits(), 0);
        assert_eq!(RequestId::from_bits(id.to_bits()), Some(id));
        r.handle_completion(id.wr_id(), WcStatus::SUCCESS);
        assert_eq!(r.test(id), Ok(Tested::Done));
        // A released id is stale.
        assert_eq!(r.test(id), Err(RmaError::UnknownRequest));
    }
    assert_eq!(RequestId::from_bits(0), None);
    assert_eq!(r.outstanding(), 0);
}

#[test]
fn lanes_and_contexts_are_checked() {
    let r = Requests::new(2, 3, 1, 1, 64);
    assert_eq!(r.lane(1, 2), Ok(5));
    assert_eq!(
        r.lane(2, 0),
        Err(RmaError::BadContext {
            context: 2,
            contexts: 2
        })
    );
    assert!(matches!(r.lane(-1, 0), Err(RmaError::BadContext { .. })));
    assert_eq!(r.lane(0, 3), Err(RmaError::BadRank { rank: 3, nranks: 3 }));
    // Stride 2 of 4 ranks, own rank 1: ranks 1 and 3 are reachable (both directions).
    let s = Requests::new(1, 4, 1, 2, 64);
    assert!(s.is_connected(1) && s.is_connected(3));
    assert!(!s.is_connected(0) && !s.is_connected(2));
    assert_eq!(
        s.lane(0, 2),
        Err(RmaError::NotConnected { rank: 2, stride: 2 })
    );
    // Every rank agrees with every other about each lane.
    for n in 1..9 {
        for stride in 1..5 {
            for a in 0..n {
                for b in 0..n {
                    assert_eq!(connected(a, b, n, stride), connected(b, a, n, stride));
                }
            }
        }
    }
}

#[test]
fn a_request_is_pending_until_its_last_completion() {
    let mut r = Requests::new(1, 2, 0, 1, 64);
    let lane = r.lane(0, 1).unwrap();
    let id = r.begin(lane, 2).unwrap();
    assert_eq!(r.reserved(), 2);
    assert_eq!(r.test(id), Ok(Tested::Pending));
    // A successful piece never reports (unsignaled); the last one completes the request.
    r.handle_completion(id.wr_id(), WcStatus::SUCCESS);
    assert_eq!(r.reserved(), 0);
    assert_eq!(r.test(id), Ok(Tested::Done));
    // Done at once.
    let now = r.begin(lane, 0).unwrap();
    assert_eq!(r.test(now), Ok(Tested::Done));
}

#[test]
fn a_failure_fails_the_lane_and_its_requests_at_once_and_sticks() {
    let mut r = Requests::new(1, 3, 0, 1, 64);
    let to1 = r.lane(0, 1).unwrap();
    let to2 = r.lane(0, 2).unwrap();
    let a = r.begin(to1, 2).unwrap();
    let b = r.begin(to1, 1).unwrap();
    let c = r.begin(to2, 1).unwrap();
    assert_eq!(r.peer_of_request(b), Some(1));
    assert_eq!(r.peer_of_request(c), Some(2));
    // A's unsignaled piece fails: every request on lane 1 fails now, before any flush comes.
    assert_eq!(r.failed_lanes(), 0);
    r.handle_completion(a.piece_wr_id(), WcStatus::RETRY_EXC_ERR);
    assert!(r.has_error());
    assert_eq!(r.failed_lanes(), 1);
    let failed = RmaError::PeerFailed {
        rank: 1,
        context: 0,
        status: WcStatus::RETRY_EXC_ERR,
    };
    assert_eq!(r.test(b), Err(failed));
    assert_eq!(r.test(a), Err(failed));
    // The lane refuses new work; lane 2 keeps working.
    assert_eq!(r.lane(0, 1), Err(failed));
    assert_eq!(r.test(c), Ok(Tested::Pending));
    r.handle_completion(c.wr_id(), WcStatus::SUCCESS);
    assert_eq!(r.test(c), Ok(Tested::Done));
    assert_eq!(r.peer_of_request(c), None, "released");
    // The flushed completions arrive later and free what the orphans reserved.
    assert_eq!(r.reserved(), 3);
    r.handle_completion(a.wr_id(), WcStatus::WR_FLUSH_ERR);
    r.handle_completion(b.wr_id(), WcStatus::WR_FLUSH_ERR);
    assert_eq!(
        r.failed_lanes(),
        1,
        "one lane failed, however many completions say so"
    );
    assert_eq!(r.reserved(), 0);
    assert_eq!(r.outstanding(), 0);
    // The flushes did not overwrite the first cause.
    assert_eq!(r.lane_failure(to1), Some(failed));
}

#[test]
fn a_flush_error_first_is_replaced_by_the_real_cause() {
    let mut r = Requests::new(1, 2, 0, 1, 64);
    let lane = r.lane(0, 1).unwrap();
    let a = r.begin(lane, 1).unwrap();
    let b = r.begin(lane, 1).unwrap();
    r.handle_completion(a.wr_id(), WcStatus::WR_FLUSH_ERR);
    r.handle_completion(b.wr_id(), WcStatus::REM_ACCESS_ERR);
    assert_eq!(
        r.lane_failure(lane),
        Some(RmaError::PeerFailed {
            rank: 1,
            context: 0,
            status: WcStatus::REM_ACCESS_ERR
        })
    );
}

#[test]
fn limits_per_lane_and_per_queue() {
    let mut r = Requests::new(1, 2, 0, 1, 4 * MAX_REQUESTS_PER_LANE);
    let lane = r.lane(0, 1).unwrap();
    let ids: Vec<RequestId> = (0..MAX_REQUESTS_PER_LANE)
        .map(|_| r.begin(lane, 1).unwrap())
        .collect();
    assert!(matches!(r.begin(lane, 1), Err(RmaError::LaneFull { .. })));
    // Requests done at once need no room.
    assert!(r.begin(lane, 0).is_ok());
    r.handle_completion(ids[0].wr_id(), WcStatus::SUCCESS);
    assert!(r.begin(lane, 1).is_ok());

    let mut q = Requests::new(1, 2, 0, 1, 3);
    let lane = q.lane(0, 0).unwrap();
    let a = q.begin(lane, 2).unwrap();
    assert!(matches!(q.begin(lane, 2), Err(RmaError::QueueFull { .. })));
    q.handle_completion(a.wr_id(), WcStatus::SUCCESS);
    assert!(q.begin(lane, 2).is_ok());
}

#[test]
fn stale_and_bogus_completions_are_ignored() {
    let mut r = Requests::new(1, 2, 0, 1, 64);
    let lane = r.lane(0, 1).unwrap();
    let a = r.begin(lane, 1).unwrap();
    r.handle_completion(a.wr_id(), WcStatus::SUCCESS);
    assert_eq!(r.test(a), Ok(Tested::Done));
    let b = r.begin(lane, 1).unwrap();
    // The slot is reused with a new generation: a's id no longer names it.
    assert_eq!(a.slot, b.slot);
    r.handle_completion(a.wr_id(), WcStatus::SUCCESS);
    assert_eq!(r.test(b), Ok(Tested::Pending));
    r.handle_completion(0, WcStatus::SUCCESS);
    r.handle_completion(u64::MAX, WcStatus::GENERAL_ERR);
    r.handle_completion(1 << 40, WcStatus::GENERAL_ERR);
    assert!(!r.has_error());
    assert_eq!(r.test(b), Ok(Tested::Pending));
}

#[test]
fn a_post_failure_withdraws_the_request() {
    let mut r = Requests::new(1, 2, 0, 1, 64);
    let lane = r.lane(0, 1).unwrap();
    let a = r.begin(lane, 2).unwrap();
    assert_eq!(r.abandon(a, 12), RmaError::Post { rank: 1, errno: 12 });
    assert_eq!(r.reserved(), 0);
    assert_eq!(r.outstanding(), 0);
    assert_eq!(r.test(a), Err(RmaError::UnknownRequest));
}

#[test]
fn errors_read_as_sentences() {
    use alloc::string::ToString;
    let e = RmaError::OutOfWindow {
        which: Which::Destination,
        rank: 2,
        offset: 10,
        size: 8,
        len: 16,
    };
    assert_eq!(
        e.to_string(),
        "destination offset 10 + size 8 lies outside rank 2's window of 16 bytes"
    );
    assert!(RmaError::BadSignalOp(7).to_string().contains("INC"));
}

#[test]
fn a_peer_entry_past_the_end_of_the_address_space_is_refused() {
    // Found by the rma_ops fuzz target's author: a peer's entry that wraps made a plan whose
    // pieces overflowed.
    let own = WindowEntry {
        base: 0x10000,
        len: 1 << 32,
        rkey: 1,
    };
    let peer = WindowEntry {
        base: u64::MAX - (1 << 29),
        len: 1 << 31,
        rkey: 2,
    };
    let w = Window {
        entries: vec![own, peer],
        rank: 0,
        lkey: 1,
        host: false,
    };
    assert!(matches!(
        plan_put(&w, 0, 1 << 31, &w, 0, 1, 0),
        Err(RmaError::OutOfWindow {
            which: Which::Destination,
            rank: 1,
            ..
        })
    ));
    // Up to the last byte of the address space is fine.
    let base = u64::MAX - (1 << 29);
    assert_eq!(w.range(Which::Destination, 1, 0, (1 << 29) + 1), Ok(base));
    assert!(w.range(Which::Destination, 1, 1, (1 << 29) + 1).is_err());
    // An empty range right at 2^64 has no address (found by the fuzz target's 10-minute run).
    assert!(w.range(Which::Destination, 1, (1 << 29) + 1, 0).is_err());
}

#[test]
fn huge_counts_saturate_and_are_refused() {
    let t = Transfer {
        local: 0,
        lkey: 1,
        remote: 0,
        rkey: 2,
        len: (1 << 62) + 1,
        inline: false,
    };
    assert_eq!(t.piece_count(), u32::MAX);
    assert_eq!(
        Plan::PutSignal(
            Some(t),
            SignalAdd {
                remote: 0,
                rkey: 0,
                add: 1
            }
        )
        .work_requests(),
        u32::MAX
    );
    let mut r = Requests::new(1, 2, 0, 1, 64);
    let lane = r.lane(0, 1).unwrap();
    r.begin(lane, 1).unwrap();
    assert!(matches!(
        r.begin(lane, u32::MAX),
        Err(RmaError::LaneFull { .. })
    ));
    // A rank past the group is no lane, whatever the lane table holds behind it.
    let s = Requests::new(2, 4, 0, 2, 64);
    assert!(!s.is_connected(6));
}
