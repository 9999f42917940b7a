//! Unit tests of the decision machine and the plans.

use alloc::vec;

use super::*;
use crate::nic::{Completion, CompletionKind, WcStatus};

fn config() -> FailoverConfig {
    FailoverConfig {
        enabled: true,
        max_attempts: 1,
        timeout: Duration::from_secs(2),
        port_devices: vec![0, 0],
        lane_ports: vec![0, 1],
    }
}

fn failed(status: WcStatus) -> Completion {
    Completion {
        wr_id: 0,
        status,
        vendor_err: 0x81,
        kind: CompletionKind::Send,
    }
}

fn at(secs: u64) -> Instant {
    Instant::from_nanos(secs * 1_000_000_000)
}

fn receiver_report(lane: u8, oldest: u32, announced: u32) -> [u8; report::REPORT_LEN] {
    Report {
        lane,
        attempt: 1,
        body: ReportBody::Receiver(ReceiverSnapshot {
            oldest,
            announced,
            eager: false,
        }),
        qp_info: QpInfo::new(&[0xab; 4]).unwrap(),
        port: None,
        rekeyed: false,
        keys: 0,
    }
    .encode()
}

fn actions(m: &mut Failover) -> Vec<Action> {
    core::iter::from_fn(|| m.poll_action()).collect()
}

fn gave_up(m: &mut Failover) -> FailoverError {
    let all = actions(m);
    match all.last() {
        Some(Action::GiveUp { reason, .. }) => *reason,
        other => panic!("expected a give-up, got {other:?} in {all:?}"),
    }
}

#[test]
fn a_sender_fails_a_lane_over_end_to_end() {
    let mut m = Failover::new(Role::Sender, config());
    m.handle_completion_error(0, &failed(WcStatus::RETRY_EXC_ERR), at(1));
    assert_eq!(actions(&mut m), [Action::QuiesceLane { lane: 0 }]);
    assert!(m.is_failing(0) && !m.is_failing(1));
    // Flushes of the failing queue pair change nothing.
    m.handle_completion_error(0, &failed(WcStatus::WR_FLUSH_ERR), at(1));
    assert_eq!(actions(&mut m), []);
    let own = SenderSnapshot {
        ended: 10,
        acked: 4,
        eager: false,
    };
    m.handle_quiesced(0, ReportBody::Sender(own));
    assert_eq!(actions(&mut m), [Action::CreateQp { lane: 0, port: 1 }]);
    let info = QpInfo::new(&[1, 2, 3]).unwrap();
    m.handle_qp_created(0, info, &KeyMap::EMPTY);
    let sent = actions(&mut m);
    assert_eq!(
        sent,
        [Action::SendReport(Report {
            lane: 0,
            attempt: 1,
            body: ReportBody::Sender(own),
            qp_info: info,
            port: Some(1),
            rekeyed: false,
            keys: 0,
        })]
    );
    m.handle_peer(&receiver_report(0, 6, 12), at(2));
    let expected = SenderPlan {
        complete: SeqRange { start: 4, end: 6 },
        replay: SeqRange { start: 6, end: 10 },
        peer_keys: None,
    };
    assert_eq!(
        actions(&mut m),
        [Action::Replay {
            lane: 0,
            plan: Plan::Sender(expected),
            peer_qp: QpInfo::new(&[0xab; 4]).unwrap(),
        }]
    );
    let done = Replayed {
        receives: 6,
        work_requests: 9,
    };
    m.handle_replayed(0, Ok(done), at(3));
    assert_eq!(actions(&mut m), [Action::Resume { lane: 0 }]);
    assert!(!m.is_failing(0));
    assert_eq!(m.lane_port(0), Some(1));
    let s = m.stats();
    assert_eq!(
        (s.failovers, s.receives_replayed, s.work_requests_replayed),
        (1, 6, 9)
    );
    assert_eq!(s.max_time, Duration::from_secs(2));
    use alloc::string::ToString;
    assert!(
        s.to_string()
            .starts_with("1 lane failover(s), 6 receive(s) and 9 work request(s) replayed"),
        "{s}"
    );
    assert_eq!(m.poll_timeout(), None);
}

#[test]
fn the_peer_starts_it_and_a_working_port_stays() {
    let mut m = Failover::new(Role::Receiver, config());
    let report = Report {
        lane: 1,
        attempt: 1,
        body: ReportBody::Sender(SenderSnapshot {
            ended: 3,
            acked: 3,
            eager: false,
        }),
        qp_info: QpInfo::EMPTY,
        port: None,
        rekeyed: false,
        keys: 0,
    };
    m.handle_peer(&report.encode(), at(0));
    assert_eq!(actions(&mut m), [Action::QuiesceLane { lane: 1 }]);
    let own = ReceiverSnapshot {
        oldest: 3,
        announced: 5,
        eager: false,
    };
    m.handle_quiesced(1, ReportBody::Receiver(own));
    // This end's port did not fail: the new queue pair goes on the same port.
    assert_eq!(actions(&mut m), [Action::CreateQp { lane: 1, port: 1 }]);
    m.handle_qp_created(1, QpInfo::EMPTY, &KeyMap::EMPTY);
    let all = actions(&mut m);
    assert!(matches!(all[0], Action::SendReport(_)));
    assert_eq!(
        all[1],
        Action::Replay {
            lane: 1,
            plan: Plan::Receiver(ReceiverPlan {
                rewrite: SeqRange { start: 3, end: 5 }
            }),
            peer_qp: QpInfo::EMPTY,
        }
    );
}

#[test]
fn a_peer_started_failover_leaves_a_port_this_end_saw_go_down() {
    let mut m = Failover::new(Role::Receiver, config());
    m.handle_port_event(1, false);
    let report = Report {
        lane: 1,
        attempt: 1,
        body: ReportBody::Sender(SenderSnapshot::default()),
        qp_info: QpInfo::EMPTY,
        port: None,
        rekeyed: false,
        keys: 0,
    };
    m.handle_peer(&report.encode(), at(0));
    m.handle_quiesced(1, ReportBody::Receiver(ReceiverSnapshot::default()));
    let all = actions(&mut m);
    assert_eq!(all[1], Action::CreateQp { lane: 1, port: 0 });
    // The port came back before the next one: it is usable again.
    m.handle_port_event(1, true);
    assert!(m.is_failing(1));
}

#[test]
fn off_unsurvivable_or_exhausted_gives_up_with_the_completion() {
    let mut off = Failover::new(
        Role::Sender,
        FailoverConfig {
            enabled: false,
            ..config()
        },
    );
    let c = failed(WcStatus::RETRY_EXC_ERR);
    off.handle_completion_error(0, &c, at(0));
    let all = actions(&mut off);
    assert_eq!(
        all,
        [Action::GiveUp {
            cause: DataError::Completion {
                status: WcStatus::RETRY_EXC_ERR,
                vendor_err: 0x81,
                wr: None,
            },
            reason: FailoverError::Disabled,
        }]
    );

    let mut m = Failover::new(Role::Sender, config());
    m.handle_completion_error(0, &failed(WcStatus::REM_ACCESS_ERR), at(0));
    assert_eq!(
        gave_up(&mut m),
        FailoverError::NotSurvivable(WcStatus::REM_ACCESS_ERR)
    );
    // Nothing more happens after giving up.
    m.handle_completion_error(1, &c, at(0));
    assert_eq!(actions(&mut m), []);

    // A flush is survivable only after a PORT_ERR on the lane's port.
    let mut m = Failover::new(Role::Sender, config());
    m.handle_completion_error(0, &failed(WcStatus::WR_FLUSH_ERR), at(0));
    assert_eq!(
        gave_up(&mut m),
        FailoverError::NotSurvivable(WcStatus::WR_FLUSH_ERR)
    );
    let mut m = Failover::new(Role::Sender, config());
    m.handle_port_event(0, false);
    m.handle_completion_error(0, &failed(WcStatus::WR_FLUSH_ERR), at(0));
    assert_eq!(actions(&mut m), [Action::QuiesceLane { lane: 0 }]);
    // Port 1 down (a PORT_ERR) and port 0 failing: nowhere to go.
    let mut m2 = Failover::new(
        Role::Sender,
        FailoverConfig {
            max_attempts: 2,
            ..config()
        },
    );
    m2.handle_port_event(1, false);
    m2.handle_completion_error(0, &c, at(0));
    assert_eq!(gave_up(&mut m2), FailoverError::NoSurvivingPort);

    // One attempt: the second port's failure is one too many.
    let mut m = Failover::new(
        Role::Sender,
        FailoverConfig {
            port_devices: vec![0, 0, 0],
            ..config()
        },
    );
    m.handle_completion_error(0, &c, at(0));
    let _ = actions(&mut m);
    m.handle_completion_error(1, &c, at(0));
    assert_eq!(gave_up(&mut m), FailoverError::AttemptsExhausted { max: 1 });
}

#[test]
fn a_lane_on_an_already_failed_port_costs_no_attempt_but_two_devices_fail() {
    let c = failed(WcStatus::RETRY_EXC_ERR);
    let mut m = Failover::new(
        Role::Sender,
        FailoverConfig {
            lane_ports: vec![0, 0, 1],
            port_devices: vec![0, 1, 2],
            max_attempts: 5,
            ..config()
        },
    );
    m.handle_completion_error(0, &c, at(0));
    m.handle_completion_error(1, &c, at(0));
    assert_eq!(
        actions(&mut m),
        [
            Action::QuiesceLane { lane: 0 },
            Action::QuiesceLane { lane: 1 }
        ]
    );
    m.handle_completion_error(2, &c, at(0));
    assert_eq!(gave_up(&mut m), FailoverError::DevicesFailed { failed: 2 });
}

#[test]
fn a_silent_peer_times_out() {
    let mut m = Failover::new(Role::Sender, config());
    m.handle_completion_error(1, &failed(WcStatus::RETRY_EXC_ERR), at(5));
    let _ = actions(&mut m);
    assert_eq!(m.poll_timeout(), Some(at(7)));
    m.handle_timeout(at(6));
    assert_eq!(actions(&mut m), []);
    m.handle_timeout(at(7));
    let all = actions(&mut m);
    assert!(
        matches!(
            all[0],
            Action::SendReport(Report {
                body: ReportBody::Refusal(Refusal::GaveUp),
                ..
            })
        ),
        "the peer is told: {all:?}"
    );
    assert_eq!(
        all[1],
        Action::GiveUp {
            cause: DataError::PeerLost,
            reason: FailoverError::Timeout {
                lane: 1,
                after: Duration::from_secs(2)
            },
        }
    );
    assert_eq!(
        m.gave_up(),
        Some(FailoverError::Timeout {
            lane: 1,
            after: Duration::from_secs(2)
        })
    );
}

#[test]
fn bad_reports_give_up_as_protocol_errors() {
    let proto = DataError::Protocol(super::super::ProtocolError::FailoverReport);
    let mut m = Failover::new(Role::Sender, config());
    m.handle_peer(&[0; 5], at(0));
    let all = actions(&mut m);
    assert_eq!(
        all.last(),
        Some(&Action::GiveUp {
            cause: proto,
            reason: FailoverError::BadReport(ReportError::Length(5)),
        })
    );
    // A sender report to a sender.
    let mut m = Failover::new(Role::Sender, config());
    let same = Report {
        lane: 0,
        attempt: 1,
        body: ReportBody::Sender(SenderSnapshot::default()),
        qp_info: QpInfo::EMPTY,
        port: None,
        rekeyed: false,
        keys: 0,
    };
    m.handle_peer(&same.encode(), at(0));
    assert!(matches!(
        gave_up(&mut m),
        FailoverError::Inconsistent { .. }
    ));
    // A lane the connection does not have.
    let mut m = Failover::new(Role::Sender, config());
    m.handle_peer(&receiver_report(5, 0, 0), at(0));
    assert_eq!(gave_up(&mut m), FailoverError::Lane(5));
    // Two reports for one failover.
    let mut m = Failover::new(Role::Sender, config());
    m.handle_peer(&receiver_report(0, 0, 0), at(0));
    m.handle_peer(&receiver_report(0, 0, 0), at(0));
    assert!(matches!(
        gave_up(&mut m),
        FailoverError::Inconsistent { .. }
    ));
    // A receiver's oldest past what the sender ended.
    let mut m = Failover::new(Role::Sender, config());
    m.handle_completion_error(0, &failed(WcStatus::RETRY_EXC_ERR), at(0));
    m.handle_quiesced(
        0,
        ReportBody::Sender(SenderSnapshot {
            ended: 4,
            acked: 2,
            eager: false,
        }),
    );
    m.handle_qp_created(0, QpInfo::EMPTY, &KeyMap::EMPTY);
    m.handle_peer(&receiver_report(0, 5, 9), at(0));
    let all = actions(&mut m);
    assert_eq!(
        all.last(),
        Some(&Action::GiveUp {
            cause: proto,
            reason: FailoverError::Inconsistent {
                lane: 0,
                why: "its oldest receive is outside the slot ends posted and not acknowledged"
            },
        })
    );
    // A refusal.
    let mut m = Failover::new(Role::Receiver, config());
    let refusal = Report {
        lane: 0,
        attempt: 0,
        body: ReportBody::Refusal(Refusal::Disabled),
        qp_info: QpInfo::EMPTY,
        port: None,
        rekeyed: false,
        keys: 0,
    };
    m.handle_peer(&refusal.encode(), at(0));
    assert_eq!(
        actions(&mut m),
        [Action::GiveUp {
            cause: DataError::PeerLost,
            reason: FailoverError::PeerRefused(Refusal::Disabled),
        }]
    );
    // Off here, asked by the peer: refuse, so the peer fails at once.
    let mut off = Failover::new(
        Role::Sender,
        FailoverConfig {
            enabled: false,
            ..config()
        },
    );
    off.handle_peer(&receiver_report(0, 0, 0), at(0));
    let all = actions(&mut off);
    assert_eq!(all[0], Action::SendReport(refusal));
    assert!(matches!(
        all[1],
        Action::GiveUp {
            reason: FailoverError::Disabled,
            ..
        }
    ));
}

#[test]
fn plans_check_the_peer_against_this_end_with_wrapping_numbers() {
    let s = |ended, acked| SenderSnapshot {
        ended,
        acked,
        eager: false,
    };
    let r = |oldest, announced| ReceiverSnapshot {
        oldest,
        announced,
        eager: false,
    };
    let max = u32::MAX;
    // Across the wrap: acked max-1, oldest max, ended 2, announced 5.
    let plan = plan_sender(0, s(2, max - 1), r(max, 5)).unwrap();
    assert_eq!((plan.complete.len(), plan.replay.len()), (1, 3));
    assert_eq!(
        plan.replay.iter().collect::<Vec<_>>(),
        [max, 0, 1],
        "in order across the wrap"
    );
    assert!(
        plan_sender(0, s(2, max - 1), r(max - 2, 5)).is_err(),
        "before acked"
    );
    assert!(
        plan_sender(0, s(2, max - 1), r(3, 5)).is_err(),
        "past ended"
    );
    assert!(
        plan_sender(0, s(10, 5), r(7, 9)).is_err(),
        "announced < ended"
    );
    assert!(
        plan_sender(0, s(10, 5), r(7, 5 + 257)).is_err(),
        "more than a FIFO"
    );
    assert_eq!(
        plan_sender(
            0,
            s(1, 0),
            ReceiverSnapshot {
                eager: true,
                ..r(1, 1)
            }
        ),
        Err(FailoverError::Eager)
    );
    let plan = plan_receiver(0, r(max, 3), s(1, max - 3)).unwrap();
    assert_eq!(plan.rewrite, SeqRange { start: 1, end: 3 });
    assert!(
        plan_receiver(0, r(10, 12), s(13, 10)).is_err(),
        "ended unannounced"
    );
    assert!(
        plan_receiver(0, r(10, 12), s(9, 9)).is_err(),
        "ended before oldest"
    );
    assert!(
        plan_receiver(0, r(10, 12), s(11, 11)).is_err(),
        "acked past oldest"
    );
    assert!(plan_receiver(0, r(10, 12), s(10, 10)).is_ok());
}

#[test]
fn errors_name_what_happened() {
    use alloc::string::ToString;
    let text = FailoverError::AttemptsExhausted { max: 1 }.to_string();
    assert!(text.contains("MAX_ATTEMPTS") && text.starts_with("port failover gave up"));
    assert!(
        FailoverError::NotSurvivable(WcStatus::REM_ACCESS_ERR)
            .to_string()
            .contains("remote access error (status 10)")
    );
    let text = FailoverError::Rekey("a buffer is not registered there").to_string();
    assert!(text.contains("keys cannot move") && text.ends_with("not registered there"));
}

/// A NIC whose completion queue is a script, with a backend fast path that offers each
/// completion to `take` as it converts it.
struct Scripted {
    cq: VecDeque<Completion>,
}

impl Nic for Scripted {
    fn max_inline(&self) -> usize {
        0
    }
    fn post_send(&mut self, _: &[SendWr<'_>]) -> Result<(), NicError> {
        Ok(())
    }
    fn post_recv(&mut self, _: u64) -> Result<(), NicError> {
        Ok(())
    }
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize, NicError> {
        let mut got = 0;
        while got < out.len() {
            let Some(c) = self.cq.pop_front() else { break };
            out[got] = c;
            got += 1;
        }
        Ok(got)
    }
    fn poll_take(
        &mut self,
        out: &mut [Completion],
        mut take: impl FnMut(&Completion) -> bool,
    ) -> Result<(usize, usize), NicError> {
        let (mut got, mut left) = (0, 0);
        while got < out.len() {
            let Some(c) = self.cq.pop_front() else { break };
            got += 1;
            if left == 0 && take(&c) {
                continue;
            }
            out[left] = c;
            left += 1;
        }
        Ok((got, left))
    }
    fn read_inbound(&self, _: usize, _: &mut [u8]) {}
    fn write_staging(&mut self, _: usize, _: &[u8]) {}
    fn deliver_inbound(&mut self, _: usize, _: usize, _: u64) {}
    fn write_inbound(&mut self, _: usize, _: &[u8]) {}
}

#[test]
fn the_tripwire_passes_successes_before_the_first_failure_only() {
    let ok = |wr_id| Completion {
        wr_id,
        ..failed(WcStatus::SUCCESS)
    };
    let flush = |wr_id, kind| Completion {
        wr_id,
        kind,
        ..failed(WcStatus::WR_FLUSH_ERR)
    };
    let script = [
        ok(1),
        ok(2),
        failed(WcStatus::RETRY_EXC_ERR),
        flush(4, CompletionKind::Send),
        flush(MARKER_SEND_WR_ID, CompletionKind::Send),
    ];
    for fast in [false, true] {
        let mut nic = Scripted {
            cq: script.iter().copied().collect(),
        };
        let mut g = Guarded::new(&mut nic, true);
        let mut out = [ok(0); 3];
        let mut taken = Vec::new();
        let seen = if fast {
            let (got, left) = g
                .poll_take(&mut out, |c| {
                    taken.push(c.wr_id);
                    c.wr_id == 1
                })
                .unwrap();
            assert_eq!(got, 3);
            left
        } else {
            g.poll(&mut out).unwrap()
        };
        if fast {
            assert_eq!(taken, [1, 2], "a failure is never offered to the fast path");
            assert_eq!((seen, out[0].wr_id), (1, 2));
        } else {
            assert_eq!(seen, 2);
        }
        assert!(g.trip.tripped() && !g.trip.send_marker);
        let polled = if fast {
            g.poll_take(&mut out, |_| panic!("nothing is offered once tripped"))
                .unwrap()
                .1
        } else {
            g.poll(&mut out).unwrap()
        };
        assert_eq!(polled, 0);
        let trip = g.trip;
        assert_eq!(trip.failed, 3);
        assert!(trip.send_marker && !trip.recv_marker && !trip.success_after);
        assert_eq!(trip.first.unwrap().status, WcStatus::RETRY_EXC_ERR);
    }
}

/// Unarmed (failover not negotiated), the tripwire is not there: a failed completion reaches
/// the core through `poll`, and every completion is offered to the backend's fast path.
#[test]
fn an_unarmed_tripwire_passes_failed_completions_through() {
    let ok = |wr_id| Completion {
        wr_id,
        ..failed(WcStatus::SUCCESS)
    };
    let script = [ok(1), failed(WcStatus::RETRY_EXC_ERR), ok(3)];
    for fast in [false, true] {
        let mut nic = Scripted {
            cq: script.iter().copied().collect(),
        };
        let mut g = Guarded::new(&mut nic, false);
        let mut out = [ok(0); 3];
        let mut offered = Vec::new();
        let seen = if fast {
            let (got, left) = g
                .poll_take(&mut out, |c| {
                    offered.push(c.wr_id);
                    false
                })
                .unwrap();
            assert_eq!(got, 3);
            left
        } else {
            g.poll(&mut out).unwrap()
        };
        assert_eq!(seen, 3, "fast {fast}: every completion reaches the core");
        assert_eq!(out[1].status, WcStatus::RETRY_EXC_ERR);
        if fast {
            assert_eq!(
                offered,
                [1],
                "the fast path sees the failure as without the wrapper"
            );
        }
        assert_eq!(
            g.trip,
            Tripwire::new(false),
            "an unarmed tripwire records nothing"
        );
        assert!(!g.trip.tripped());
    }
}

/// Two devices of one port each (the lanes start on port `lane % 2`).
fn two_devices() -> FailoverConfig {
    FailoverConfig {
        port_devices: vec![0, 1],
        ..config()
    }
}

/// Pairs `(i, 0x100 + i)` for `i` in `0..n`.
fn key_pairs(n: u32) -> KeyMap {
    let mut keys = KeyMap::EMPTY;
    for i in 0..n {
        assert!(keys.insert(i, 0x100 + i));
    }
    keys
}

/// An end that starts on the peer's report follows the peer to its port when that is on
/// another device (the two devices are two rails), and a receiver moving there sends its
/// state report flagged rekeyed, then as many key reports as it says; ports of one device
/// keep the old choice (this end's port while it works, else the peer's).
#[test]
fn a_peer_on_another_device_is_followed_and_a_rekeyed_receiver_sends_its_keys() {
    let mut m = Failover::new(Role::Receiver, two_devices());
    let report = Report {
        lane: 0,
        attempt: 1,
        body: ReportBody::Sender(SenderSnapshot {
            ended: 7,
            acked: 2,
            eager: false,
        }),
        qp_info: QpInfo::new(&[1]).unwrap(),
        port: Some(1),
        rekeyed: true,
        keys: 0,
    };
    m.handle_peer(&report.encode(), at(0));
    assert_eq!(actions(&mut m), [Action::QuiesceLane { lane: 0 }]);
    assert!(m.moves_device(0), "port 1 is device 1");
    assert!(!m.moves_device(1), "lane 1 is not failing");
    let own = ReceiverSnapshot {
        oldest: 5,
        announced: 9,
        eager: false,
    };
    m.handle_quiesced(0, ReportBody::Receiver(own));
    assert_eq!(actions(&mut m), [Action::CreateQp { lane: 0, port: 1 }]);
    let keys = key_pairs(12);
    m.handle_qp_created(0, QpInfo::new(&[2]).unwrap(), &keys);
    let all = actions(&mut m);
    assert_eq!(all.len(), 4, "{all:?}");
    assert_eq!(
        all[0],
        Action::SendReport(Report {
            lane: 0,
            attempt: 1,
            body: ReportBody::Receiver(own),
            qp_info: QpInfo::new(&[2]).unwrap(),
            port: Some(1),
            rekeyed: true,
            keys: 2,
        })
    );
    let told: Vec<(u32, u32)> = all[1..3]
        .iter()
        .flat_map(|a| match a {
            Action::SendReport(Report {
                body: ReportBody::Keys(chunk),
                port: None,
                rekeyed: false,
                keys: 0,
                ..
            }) => chunk.pairs().to_vec(),
            other => panic!("a key report: {other:?}"),
        })
        .collect();
    assert_eq!(told, keys.pairs());
    assert_eq!(
        all[3],
        Action::Replay {
            lane: 0,
            plan: Plan::Receiver(ReceiverPlan {
                rewrite: SeqRange { start: 7, end: 9 }
            }),
            peer_qp: QpInfo::new(&[1]).unwrap(),
        }
    );
    for a in &all[..3] {
        let Action::SendReport(r) = a else {
            unreachable!()
        };
        assert_eq!(Report::decode(&r.encode()), Ok(*r), "every report encodes");
    }

    // One device: a working port stays when the report names none, and follows the peer's
    // port when it names one (one rail for both new queue pairs).
    for (port, expected) in [(None, 1), (Some(0), 0)] {
        let mut m = Failover::new(Role::Receiver, config());
        m.handle_peer(
            &Report {
                lane: 1,
                port,
                ..report
            }
            .encode(),
            at(0),
        );
        m.handle_quiesced(1, ReportBody::Receiver(ReceiverSnapshot::default()));
        let all = actions(&mut m);
        assert_eq!(
            all[1],
            Action::CreateQp {
                lane: 1,
                port: expected
            },
            "{port:?}"
        );
        assert!(!m.moves_device(1));
    }
    // ... and one that went down follows the peer's.
    let mut m = Failover::new(
        Role::Receiver,
        FailoverConfig {
            port_devices: vec![0, 0, 0],
            ..config()
        },
    );
    m.handle_port_event(1, false);
    m.handle_peer(
        &Report {
            lane: 1,
            port: Some(2),
            ..report
        }
        .encode(),
        at(0),
    );
    m.handle_quiesced(1, ReportBody::Receiver(ReceiverSnapshot::default()));
    assert_eq!(actions(&mut m)[1], Action::CreateQp { lane: 1, port: 2 });
    // A peer's port that is down here is not followed.
    let mut m = Failover::new(Role::Receiver, two_devices());
    m.handle_port_event(1, false);
    m.handle_peer(&report.encode(), at(0));
    m.handle_quiesced(0, ReportBody::Receiver(ReceiverSnapshot::default()));
    assert_eq!(actions(&mut m)[1], Action::CreateQp { lane: 0, port: 0 });
    assert!(!m.moves_device(0));
}

/// A sender waits for every key report a rekeyed receiver announced before it plans, and its
/// plan carries them; key reports it was not told of, or for a lane not failing, give up.
#[test]
fn a_sender_plans_only_with_every_key_of_a_rekeyed_receiver() {
    let start = |m: &mut Failover| {
        m.handle_completion_error(0, &failed(WcStatus::RETRY_EXC_ERR), at(0));
        m.handle_quiesced(
            0,
            ReportBody::Sender(SenderSnapshot {
                ended: 6,
                acked: 4,
                eager: false,
            }),
        );
        assert!(m.moves_device(0), "port 0 failed: device 1's port 1");
        m.handle_qp_created(0, QpInfo::EMPTY, &key_pairs(3));
        let all = actions(m);
        let Action::SendReport(own) = all[2] else {
            panic!("{all:?}")
        };
        // A sender tells no keys, even if handed some.
        assert_eq!((own.port, own.rekeyed, own.keys), (Some(1), true, 0));
        assert_eq!(all.len(), 3, "{all:?}");
    };
    let state = Report {
        lane: 0,
        attempt: 1,
        body: ReportBody::Receiver(ReceiverSnapshot {
            oldest: 5,
            announced: 8,
            eager: false,
        }),
        qp_info: QpInfo::new(&[3]).unwrap(),
        port: Some(1),
        rekeyed: true,
        keys: 2,
    };
    let chunk = |from: u32, n: u32| {
        let pairs: Vec<(u32, u32)> = (from..from + n).map(|i| (i, 0x100 + i)).collect();
        Report {
            lane: 0,
            attempt: 1,
            body: ReportBody::Keys(KeyChunk::new(&pairs).unwrap()),
            qp_info: QpInfo::EMPTY,
            port: None,
            rekeyed: false,
            keys: 0,
        }
        .encode()
    };
    let mut m = Failover::new(Role::Sender, two_devices());
    start(&mut m);
    m.handle_peer(&state.encode(), at(1));
    assert_eq!(actions(&mut m), [], "keys still on their way");
    m.handle_peer(&chunk(0, 10), at(1));
    assert_eq!(actions(&mut m), []);
    m.handle_peer(&chunk(10, 2), at(1));
    let all = actions(&mut m);
    let [
        Action::Replay {
            plan: Plan::Sender(plan),
            ..
        },
    ] = all.as_slice()
    else {
        panic!("{all:?}")
    };
    assert_eq!(plan.peer_keys, Some(key_pairs(12)));
    assert_eq!(plan.replay, SeqRange { start: 5, end: 6 });

    // A receiver that was not rekeyed: no keys, none awaited.
    let mut m = Failover::new(Role::Sender, two_devices());
    start(&mut m);
    let plain = Report {
        rekeyed: false,
        keys: 0,
        ..state
    };
    m.handle_peer(&plain.encode(), at(1));
    let all = actions(&mut m);
    assert!(
        matches!(
            all.as_slice(),
            [Action::Replay {
                plan: Plan::Sender(SenderPlan {
                    peer_keys: None,
                    ..
                }),
                ..
            }]
        ),
        "{all:?}"
    );

    // One key report more than said.
    let mut m = Failover::new(Role::Sender, two_devices());
    start(&mut m);
    m.handle_peer(&Report { keys: 1, ..state }.encode(), at(1));
    m.handle_peer(&chunk(0, 1), at(1));
    assert!(matches!(actions(&mut m)[0], Action::Replay { .. }));
    m.handle_peer(&chunk(1, 1), at(1));
    assert!(matches!(
        gave_up(&mut m),
        FailoverError::Inconsistent { .. }
    ));
    // Keys before any report, on a lane not failing.
    let mut m = Failover::new(Role::Sender, two_devices());
    m.handle_peer(&chunk(0, 1), at(0));
    assert!(matches!(
        gave_up(&mut m),
        FailoverError::Inconsistent { .. }
    ));
    // Keys sent to a receiver.
    let mut m = Failover::new(Role::Receiver, two_devices());
    m.handle_peer(&chunk(0, 1), at(0));
    assert!(matches!(
        gave_up(&mut m),
        FailoverError::Inconsistent { .. }
    ));
    // More pairs than a lane may carry.
    let mut m = Failover::new(Role::Sender, two_devices());
    start(&mut m);
    m.handle_peer(&Report { keys: 5, ..state }.encode(), at(1));
    for i in 0..4 {
        m.handle_peer(&chunk(10 * i, 10), at(1));
    }
    assert_eq!(
        actions(&mut m),
        [],
        "40 pairs fit, a fifth report is awaited"
    );
    m.handle_peer(&chunk(40, 1), at(1));
    assert!(matches!(
        gave_up(&mut m),
        FailoverError::Inconsistent { .. }
    ));
}
