//! The eager path end to end on the simulated fabric: sends written before their receive is
//! posted, taken or bounced by the rule both ends apply, credits, and every case where the
//! clear-to-send protocol must take over with the same result it gives without eager.

use std::vec::Vec;

use super::{DataPair, irecv_direct, isend_direct_host};
use crate::data::eager::{DEFAULT_EAGER_THRESHOLD, EAGER_SLOTS};
use crate::data::{Completed, Connection, DataError, RecvBuf, RequestId, SendBuf};

fn pair() -> DataPair {
    DataPair::new_eager(64, DEFAULT_EAGER_THRESHOLD)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Send as the plugin does for host memory: the bytes handed over with the buffer.
fn send(p: &mut DataPair, buf: SendBuf, tag: u32) -> Option<RequestId> {
    let bytes = p.send_bytes(&buf);
    isend_direct_host(&mut p.send, &mut p.send_nic, buf, Some(&bytes), tag).expect("isend")
}

fn post(p: &mut DataPair, bufs: &[RecvBuf], tags: &[u32]) -> RequestId {
    irecv_direct(&mut p.recv, &mut p.recv_nic, bufs, tags)
        .expect("irecv")
        .expect("a receive slot is free")
}

fn host_buf(p: &DataPair, len: usize) -> RecvBuf {
    p.recv_buf(len)
}

fn gpu_buf(p: &DataPair, len: usize) -> RecvBuf {
    RecvBuf {
        host: false,
        ..p.recv_buf(len)
    }
}

/// Deliver everything, then test `req` on the receiving side until it is done (or fails).
fn finish_recv(p: &mut DataPair, req: RequestId) -> Result<Completed, DataError> {
    for _ in 0..1000 {
        p.run_until_idle_both();
        match p.recv.test(&mut p.recv_nic, req)? {
            Completed::Pending => {}
            done => return Ok(done),
        }
        // The sender may still have bounced sends to write again.
        p.send.drain(&mut p.send_nic)?;
    }
    panic!("receive {req} never finished");
}

fn finish_send(p: &mut DataPair, req: RequestId) -> Result<Completed, DataError> {
    for _ in 0..1000 {
        p.run_until_idle_both();
        match p.send.test(&mut p.send_nic, req)? {
            Completed::Pending => {}
            done => return Ok(done),
        }
    }
    panic!("send {req} never finished");
}

fn size_of(done: Completed) -> u32 {
    match done {
        Completed::Done { sizes, .. } => sizes[0],
        Completed::Pending => panic!("pending"),
    }
}

impl DataPair {
    /// Run the fabric until idle, polling neither side.
    fn run_until_idle_both(&mut self) {
        while self.fabric.step() {}
    }
}

#[test]
fn a_send_before_its_receive_goes_eager_and_completes_once_the_entry_confirms_it() {
    let mut p = pair();
    let data = pattern(100, 1);
    let sbuf = p.send_buf(&data);
    let sreq = send(&mut p, sbuf, 7).expect("no receive posted: the send goes eager");
    p.run_until_idle_both();
    assert_eq!(
        p.send.test(&mut p.send_nic, sreq),
        Ok(Completed::Pending),
        "not confirmed before the receive's entry is read"
    );
    let rbuf = host_buf(&p, 4096);
    let rreq = post(&mut p, &[rbuf], &[7]);
    // The held message is taken as the receive is posted.
    let done = finish_recv(&mut p, rreq).unwrap();
    assert_eq!(size_of(done), 100);
    assert_eq!(p.received(&rbuf, 100), data);
    assert_eq!(p.recv.eager_arrivals(), 1);
    assert_eq!(size_of(finish_send(&mut p, sreq).unwrap()), 100);
    assert_eq!(p.send.outstanding() + p.recv.outstanding(), 0);
}

#[test]
fn a_receive_posted_first_keeps_the_one_write_rendezvous() {
    let mut p = pair();
    let rbuf = host_buf(&p, 64);
    let rreq = post(&mut p, &[rbuf], &[1]);
    p.run_until_idle_both();
    let data = pattern(64, 2);
    let sbuf = p.send_buf(&data);
    let sreq = send(&mut p, sbuf, 1).expect("the entry is there");
    assert_eq!(size_of(finish_recv(&mut p, rreq).unwrap()), 64);
    assert_eq!(p.received(&rbuf, 64), data);
    assert_eq!(size_of(finish_send(&mut p, sreq).unwrap()), 64);
    assert_eq!(
        p.recv.eager_arrivals(),
        0,
        "the entry was there: no eager write"
    );
}

#[test]
fn every_size_up_to_the_threshold_goes_eager_inline_or_staged_and_arrives_exact() {
    let threshold = DEFAULT_EAGER_THRESHOLD as usize;
    for (i, len) in [0usize, 1, 8, 48, 49, 1000, 4096, threshold]
        .into_iter()
        .enumerate()
    {
        let mut p = pair();
        let data = pattern(len, i as u8);
        let sbuf = p.send_buf(&data);
        let sreq = send(&mut p, sbuf, 3).unwrap_or_else(|| panic!("{len} bytes go eager"));
        let rbuf = host_buf(&p, threshold);
        let rreq = post(&mut p, &[rbuf], &[3]);
        assert_eq!(size_of(finish_recv(&mut p, rreq).unwrap()) as usize, len);
        assert_eq!(p.received(&rbuf, len), data, "{len} bytes");
        assert_eq!(size_of(finish_send(&mut p, sreq).unwrap()) as usize, len);
        assert_eq!(p.recv.eager_arrivals(), 1);
    }
    let mut p = pair();
    let sbuf = p.send_buf(&pattern(threshold + 1, 0));
    assert_eq!(
        send(&mut p, sbuf, 3),
        None,
        "above the threshold a send waits for its entry"
    );
    assert_eq!(p.recv.eager_arrivals(), 0);
}

#[test]
fn a_grouped_receive_bounces_them_and_the_sends_land_where_they_would_without_eager() {
    let mut p = pair();
    let a = pattern(50, 3);
    let b = pattern(60, 4);
    let (sa, sb) = (p.send_buf(&a), p.send_buf(&b));
    let ra = send(&mut p, sa, 1).expect("eager");
    let rb = send(&mut p, sb, 2).expect("eager");
    p.run_until_idle_both();
    let bufs = [host_buf(&p, 64), host_buf(&p, 64)];
    // Tags in the other order than the sends: each send takes its tag's buffer.
    let rreq = post(&mut p, &bufs, &[2, 1]);
    match finish_recv(&mut p, rreq).unwrap() {
        Completed::Done { n, sizes } => assert_eq!((n, sizes[0], sizes[1]), (2, 60, 50)),
        Completed::Pending => unreachable!(),
    }
    assert_eq!(p.received(&bufs[0], 60), b);
    assert_eq!(p.received(&bufs[1], 50), a);
    assert_eq!(size_of(finish_send(&mut p, ra).unwrap()), 50);
    assert_eq!(size_of(finish_send(&mut p, rb).unwrap()), 60);
    assert_eq!(p.recv.eager_arrivals(), 2);
}

#[test]
fn gpu_memory_is_never_copied_into_and_stops_further_eager_tries() {
    let mut p = pair();
    let data = pattern(32, 5);
    let sbuf = p.send_buf(&data);
    let sreq = send(&mut p, sbuf, 0).expect("eager");
    let gpu = gpu_buf(&p, 64);
    let rreq = post(&mut p, &[gpu], &[0]);
    assert_eq!(size_of(finish_recv(&mut p, rreq).unwrap()), 32);
    assert_eq!(p.received(&gpu, 32), data, "written by the NIC, not copied");
    assert_eq!(size_of(finish_send(&mut p, sreq).unwrap()), 32);
    // The receiver's last entry offered no eager: the next send waits for its entry.
    let sbuf = p.send_buf(&data);
    assert_eq!(send(&mut p, sbuf, 0), None);
    let gpu = gpu_buf(&p, 64);
    let rreq = post(&mut p, &[gpu], &[0]);
    p.run_until_idle_both();
    let sreq = send(&mut p, sbuf, 0).expect("the entry is there");
    assert_eq!(size_of(finish_recv(&mut p, rreq).unwrap()), 32);
    finish_send(&mut p, sreq).unwrap();
    assert_eq!(p.recv.eager_arrivals(), 1);
    // After waiting a while the sender asks again (the receiver's buffers may have changed).
    for _ in 0..62 {
        let sbuf = p.send_buf(&data);
        assert_eq!(send(&mut p, sbuf, 0), None, "still waiting for entries");
    }
    let sbuf = p.send_buf(&data);
    let sreq = send(&mut p, sbuf, 0).expect("eager tried again");
    let host = host_buf(&p, 64);
    let rreq = post(&mut p, &[host], &[0]);
    finish_recv(&mut p, rreq).unwrap();
    assert_eq!(p.received(&host, 32), data);
    finish_send(&mut p, sreq).unwrap();
    assert_eq!(p.recv.eager_arrivals(), 2);
}

#[test]
fn other_tags_first_bounce_and_each_send_still_takes_its_tags_receive() {
    let mut p = pair();
    let (a, b) = (pattern(20, 6), pattern(30, 7));
    let (sa, sb) = (p.send_buf(&a), p.send_buf(&b));
    let ra = send(&mut p, sa, 5).expect("eager");
    let rb = send(&mut p, sb, 6).expect("eager");
    // The receives come in the other tag order.
    let (b6, b5) = (host_buf(&p, 64), host_buf(&p, 64));
    let r6 = post(&mut p, &[b6], &[6]);
    let r5 = post(&mut p, &[b5], &[5]);
    assert_eq!(size_of(finish_recv(&mut p, r6).unwrap()), 30);
    assert_eq!(size_of(finish_recv(&mut p, r5).unwrap()), 20);
    assert_eq!(p.received(&b6, 30), b);
    assert_eq!(p.received(&b5, 20), a);
    finish_send(&mut p, ra).unwrap();
    finish_send(&mut p, rb).unwrap();
}

#[test]
fn a_send_larger_than_its_receive_is_refused_on_both_sides_as_without_eager() {
    let mut p = pair();
    let sbuf = p.send_buf(&pattern(100, 8));
    let sreq = send(&mut p, sbuf, 0).expect("eager");
    let small = host_buf(&p, 50);
    let rreq = post(&mut p, &[small], &[0]);
    let mismatch = DataError::SizeMismatch {
        index: 0,
        sent: 100,
        capacity: 50,
    };
    assert_eq!(finish_recv(&mut p, rreq), Err(mismatch));
    assert_eq!(finish_send(&mut p, sreq), Err(mismatch));
    assert_eq!(p.received(&small, 50), std::vec![0; 50], "nothing written");
    // The connection goes on, eager again once an entry offers it.
    let rbuf = host_buf(&p, 64);
    let rreq = post(&mut p, &[rbuf], &[0]);
    p.run_until_idle_both();
    let data = pattern(10, 9);
    let sbuf = p.send_buf(&data);
    let sreq = send(&mut p, sbuf, 0).expect("rendezvous");
    finish_recv(&mut p, rreq).unwrap();
    finish_send(&mut p, sreq).unwrap();
    let sbuf = p.send_buf(&data);
    let sreq = send(&mut p, sbuf, 0).expect("eager again");
    let rbuf = host_buf(&p, 64);
    let rreq = post(&mut p, &[rbuf], &[0]);
    finish_recv(&mut p, rreq).unwrap();
    assert_eq!(p.received(&rbuf, 10), data);
    finish_send(&mut p, sreq).unwrap();
}

#[test]
fn credits_bound_the_ring_and_the_rest_wait_for_their_entries() {
    let mut p = pair();
    let count = EAGER_SLOTS + 4;
    let data: Vec<Vec<u8>> = (0..count).map(|i| pattern(8 + i, i as u8)).collect();
    let mut sends = Vec::new();
    let mut refused_at = None;
    for (i, d) in data.iter().enumerate() {
        let sbuf = p.send_buf(d);
        match send(&mut p, sbuf, 0) {
            Some(req) => sends.push((req, sbuf)),
            None => {
                refused_at = Some(i);
                break;
            }
        }
    }
    assert_eq!(
        refused_at,
        Some(EAGER_SLOTS),
        "one ring of messages, no more"
    );
    let rbufs: Vec<RecvBuf> = (0..count).map(|_| host_buf(&p, 64)).collect();
    let rreqs: Vec<RequestId> = rbufs.iter().map(|b| post(&mut p, &[*b], &[0])).collect();
    // The remaining sends go once the entries let them.
    for d in &data[EAGER_SLOTS..] {
        let sbuf = p.send_buf(d);
        let mut req = None;
        for _ in 0..100 {
            p.run_until_idle_both();
            let _ = p.recv.drain(&mut p.recv_nic);
            req = send(&mut p, sbuf, 0);
            if req.is_some() {
                break;
            }
        }
        sends.push((req.expect("sent once the ring drained"), sbuf));
    }
    for (i, (rreq, rbuf)) in rreqs.iter().zip(&rbufs).enumerate() {
        assert_eq!(
            size_of(finish_recv(&mut p, *rreq).unwrap()) as usize,
            data[i].len()
        );
        assert_eq!(p.received(rbuf, data[i].len()), data[i], "message {i}");
    }
    for (req, _) in sends {
        finish_send(&mut p, req).unwrap();
    }
}

#[test]
fn an_older_receiver_without_a_ring_keeps_the_clear_to_send_protocol() {
    let mut p = DataPair::new(64);
    assert_eq!(p.send.enable_eager(DEFAULT_EAGER_THRESHOLD), 0);
    let sbuf = p.send_buf(&pattern(8, 1));
    assert_eq!(send(&mut p, sbuf, 0), None);
    // Nor an empty send (0 bytes are not "at most a threshold of 0": eager is off), called the
    // general way (found by the eager_ops fuzzer).
    let empty = p.send_buf(&[]);
    assert_eq!(
        p.send.isend_host(&mut p.send_nic, empty, Some(&[]), 0),
        Ok(None)
    );
    p.run_until_idle_both();
    assert_eq!(p.send.failure(), None);
}

#[test]
fn close_waits_for_unconfirmed_eager_sends() {
    let mut p = pair();
    let sbuf = p.send_buf(&pattern(8, 1));
    let sreq = send(&mut p, sbuf, 0).expect("eager");
    p.run_until_idle_both();
    assert_eq!(p.send.drain(&mut p.send_nic), Ok(1), "not confirmed yet");
    let rbuf = host_buf(&p, 8);
    let rreq = post(&mut p, &[rbuf], &[0]);
    finish_recv(&mut p, rreq).unwrap();
    p.run_until_idle_both();
    assert_eq!(p.send.drain(&mut p.send_nic), Ok(0));
    finish_send(&mut p, sreq).unwrap();
}

/// A random stream: sends of 0 B – 12 KiB (above the threshold too) from one tag, receives of
/// host or GPU memory posted before or after their sends, in a random interleaving. Every
/// message arrives once, in order, byte-exact, with its size; nothing stays outstanding.
#[test]
fn a_random_stream_arrives_in_order_byte_exact_whatever_comes_first() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..20 {
        let mut p = pair();
        let total = 200;
        let sizes: Vec<usize> = (0..total)
            .map(|_| match next() % 4 {
                0 => (next() % 16) as usize,
                1 => (next() % 512) as usize,
                2 => (next() % 8192) as usize,
                _ => (next() % 12_288) as usize,
            })
            .collect();
        let mut sent = 0;
        let mut posted = 0;
        let mut pending_send: Option<SendBuf> = None;
        let mut sends = Vec::new();
        let mut recvs: Vec<(RequestId, RecvBuf)> = Vec::new();
        let mut done_recvs = 0;
        let mut steps = 0;
        while done_recvs < total {
            steps += 1;
            assert!(steps < 100_000, "round {round} stalled");
            match next() % 4 {
                0 | 1 if sent < total => {
                    let sbuf = *pending_send
                        .get_or_insert_with(|| p.send_buf(&pattern(sizes[sent], sent as u8)));
                    if let Some(req) = send(&mut p, sbuf, 9) {
                        sends.push(req);
                        sent += 1;
                        pending_send = None;
                    }
                }
                2 if posted < total && posted < done_recvs + 8 => {
                    let rbuf = if next() % 5 == 0 {
                        gpu_buf(&p, 12_288)
                    } else {
                        host_buf(&p, 12_288)
                    };
                    if let Some(req) =
                        irecv_direct(&mut p.recv, &mut p.recv_nic, &[rbuf], &[9]).expect("irecv")
                    {
                        recvs.push((req, rbuf));
                        posted += 1;
                    }
                }
                _ => {
                    for _ in 0..(next() % 8) {
                        p.fabric.step();
                    }
                    if done_recvs < posted {
                        let (req, rbuf) = recvs[done_recvs];
                        match p.recv.test(&mut p.recv_nic, req).expect("receive") {
                            Completed::Pending => {}
                            Completed::Done { n, sizes: got } => {
                                assert_eq!((n, got[0] as usize), (1, sizes[done_recvs]));
                                assert_eq!(
                                    p.received(&rbuf, sizes[done_recvs]),
                                    pattern(sizes[done_recvs], done_recvs as u8),
                                    "round {round} message {done_recvs}"
                                );
                                done_recvs += 1;
                            }
                        }
                    }
                    if let Some(&req) = sends.first() {
                        match p.send.test(&mut p.send_nic, req).expect("send") {
                            Completed::Pending => {}
                            Completed::Done { .. } => {
                                sends.remove(0);
                            }
                        }
                    }
                }
            }
        }
        for req in sends {
            finish_send(&mut p, req).unwrap();
        }
        assert_eq!(p.send.outstanding() + p.recv.outstanding(), 0);
    }
}

/// A receive posted after its message arrived is completed from the ring and writes no entries:
/// the message's one write and the credit word are all that travel, and the sender learns from the
/// word alone (its FIFO slot for the receive is never written).
#[test]
fn a_receive_after_its_message_writes_no_entries_and_the_credit_word_confirms_the_send() {
    use crate::data::codec::CTS_ENTRY_LEN;
    use crate::nic::Nic;
    let mut p = pair();
    let data = pattern(40, 3);
    let sbuf = p.send_buf(&data);
    let sreq = send(&mut p, sbuf, 2).expect("eager");
    p.run_until_idle_both();
    // The receiver polls (its test of nothing yet): the message is held.
    assert_eq!(p.recv.drain(&mut p.recv_nic), Ok(0));
    let before = p.recv_nic.sq_occupancy();
    let rbuf = host_buf(&p, 64);
    let rreq = post(&mut p, &[rbuf], &[2]);
    assert_eq!(
        p.recv_nic.sq_occupancy(),
        before + 1,
        "one write: the credit word, no entries"
    );
    assert_eq!(size_of(finish_recv(&mut p, rreq).unwrap()), 40);
    assert_eq!(p.received(&rbuf, 40), data);
    p.run_until_idle_both();
    let mut stamp = [0u8; 4];
    p.send_nic.read_inbound(CTS_ENTRY_LEN - 4, &mut stamp);
    assert_eq!(
        stamp, [0; 4],
        "the FIFO slot of receive 0 was never written"
    );
    assert_eq!(size_of(finish_send(&mut p, sreq).unwrap()), 40);
    // The next receive and send go the usual way from the next slot.
    let rbuf = host_buf(&p, 64);
    let rreq = post(&mut p, &[rbuf], &[2]);
    p.run_until_idle_both();
    let data = pattern(64, 4);
    let sbuf = p.send_buf(&data);
    let sreq = send(&mut p, sbuf, 2).expect("the entry is there");
    finish_recv(&mut p, rreq).unwrap();
    assert_eq!(p.received(&rbuf, 64), data);
    finish_send(&mut p, sreq).unwrap();
}
