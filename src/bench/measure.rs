//! The measured loops, as NCCL's proxy drives a connection: a window of outstanding isends (or
//! irecvs) refilled as the oldest completes, and an 8-byte ping-pong over two connections.

use super::Error;
use super::plugin::{Comm, Handle, Listener, Plugin, Region, Request};
use core::ffi::c_int;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

/// What a poll that finds nothing done does (`--poll`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Poll {
    /// Call `test` again at once.
    Spin,
    /// `sched_yield` after a poll that found nothing done, as NCCL's proxy progress thread does
    /// after a pass that progressed nothing.
    Yield,
    /// Sleep ~20 µs between polls: leaves the CPU to a software RDMA device such as Soft-RoCE,
    /// whose work runs in kernel threads (a diagnostic: NCCL does not do this).
    Sleep,
}

impl Poll {
    /// The `--poll` word.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Spin => "spin",
            Self::Yield => "yield",
            Self::Sleep => "sleep",
        }
    }
}

static POLL_MODE: AtomicU8 = AtomicU8::new(0);

/// Set what [`idle`] does.
pub(crate) fn set_poll(mode: Poll) {
    POLL_MODE.store(mode as u8, Ordering::Relaxed);
}

/// Idle polls between two looks at the clock (reading it costs more than a poll under TCG).
const POLLS_PER_CLOCK_CHECK: u32 = 1024;

/// Whether `start + limit` has passed, looking at the clock every [`POLLS_PER_CLOCK_CHECK`] calls.
fn stalled(polls: &mut u32, start: Instant, limit: Duration) -> bool {
    *polls = polls.wrapping_add(1);
    *polls % POLLS_PER_CLOCK_CHECK == 0 && start.elapsed() > limit
}

/// A poll found nothing to do.
pub(crate) fn idle() {
    match POLL_MODE.load(Ordering::Relaxed) {
        x if x == Poll::Yield as u8 => std::thread::yield_now(),
        x if x == Poll::Sleep as u8 => std::thread::sleep(Duration::from_micros(20)),
        _ => {}
    }
}

/// How long any single wait (connect, a completion) may take before the run is abandoned.
pub(crate) const STALL: Duration = Duration::from_secs(120);

const TAG: c_int = 7;

/// Connect to `peer` while accepting on `listener`, polling both from this one thread (either
/// side may need the other to progress). Returns (send comm, receive comm).
pub(crate) fn establish<'p>(
    plugin: &'p Plugin,
    listener: &Listener<'p>,
    peer: &mut Handle,
) -> Result<(Comm<'p>, Comm<'p>), Error> {
    let start = Instant::now();
    let (mut send, mut recv) = (None, None);
    loop {
        if send.is_none() {
            send = plugin.connect_poll(peer)?;
        }
        if recv.is_none() {
            recv = listener.accept_poll()?;
        }
        if let (Some(_), Some(_)) = (&send, &recv) {
            break;
        }
        if start.elapsed() > STALL {
            return Err(Error::Stalled(format!(
                "connection setup (connect {}, accept {}) after {} s",
                if send.is_some() { "done" } else { "pending" },
                if recv.is_some() { "done" } else { "pending" },
                STALL.as_secs()
            )));
        }
        std::thread::yield_now();
    }
    match (send, recv) {
        (Some(s), Some(r)) => Ok((s, r)),
        _ => Err(Error::Stalled("connection setup".into())),
    }
}

/// Offset of message `i`'s slot: separate slots when `window` messages fit, else all at 0.
fn slot_offset(i: usize, size: usize, window: usize, capacity: usize) -> usize {
    if size.saturating_mul(window) <= capacity {
        (i % window) * size
    } else {
        0
    }
}

/// Keep up to `window` requests from `post` outstanding on `comm` until `count` completed.
fn pump(
    comm: &Comm<'_>,
    count: usize,
    window: usize,
    what: &str,
    mut post: impl FnMut(usize) -> Result<Option<Request>, Error>,
) -> Result<(), Error> {
    let mut inflight: VecDeque<Request> = VecDeque::with_capacity(window);
    let (mut next, mut completed) = (0, 0);
    let mut last_progress = Instant::now();
    let mut polls = 0u32;
    while completed < count {
        while next < count && inflight.len() < window {
            match post(next)? {
                Some(req) => {
                    inflight.push_back(req);
                    next += 1;
                }
                None => break, // "try later"
            }
        }
        if let Some(oldest) = inflight.front() {
            if comm.test(oldest)?.is_some() {
                inflight.pop_front();
                completed += 1;
                last_progress = Instant::now();
                continue;
            }
        }
        idle();
        if stalled(&mut polls, last_progress, STALL) {
            return Err(Error::Stalled(format!(
                "{what}: {completed} of {count} messages done, no completion for {} s",
                STALL.as_secs()
            )));
        }
    }
    Ok(())
}

/// Sender side of one bandwidth step: `warmup` messages, then `iters` timed ones.
pub(crate) fn bandwidth_send(
    send: &Comm<'_>,
    region: &Region<'_, '_>,
    size: usize,
    warmup: usize,
    iters: usize,
    window: usize,
) -> Result<Duration, Error> {
    let cap = region.len();
    pump(send, warmup, window, "bandwidth warm-up", |i| {
        send.isend(region, slot_offset(i, size, window, cap), size, TAG)
    })?;
    let start = Instant::now();
    pump(send, iters, window, "bandwidth", |i| {
        send.isend(region, slot_offset(i, size, window, cap), size, TAG)
    })?;
    Ok(start.elapsed())
}

/// Receiver side of one bandwidth step: `count` messages.
pub(crate) fn bandwidth_recv(
    recv: &Comm<'_>,
    region: &Region<'_, '_>,
    size: usize,
    count: usize,
    window: usize,
) -> Result<(), Error> {
    let cap = region.len();
    pump(recv, count, window, "bandwidth receive", |i| {
        recv.irecv(region, slot_offset(i, size, window, cap), size, TAG)
    })
}

/// Post until the plugin takes it (a NULL request means "try later").
pub(crate) fn post_until(
    what: &str,
    mut post: impl FnMut() -> Result<Option<Request>, Error>,
) -> Result<Request, Error> {
    let start = Instant::now();
    let mut polls = 0u32;
    loop {
        if let Some(req) = post()? {
            return Ok(req);
        }
        idle();
        if stalled(&mut polls, start, STALL) {
            return Err(Error::Stalled(format!(
                "{what} refused for {} s",
                STALL.as_secs()
            )));
        }
    }
}

pub(crate) fn wait(comm: &Comm<'_>, req: &Request, what: &str) -> Result<usize, Error> {
    let start = Instant::now();
    let mut polls = 0u32;
    loop {
        if let Some(n) = comm.test(req)? {
            return Ok(n);
        }
        idle();
        if stalled(&mut polls, start, STALL) {
            return Err(Error::Stalled(format!(
                "{what}: no completion for {} s",
                STALL.as_secs()
            )));
        }
    }
}

/// Receives each side of the ping-pong keeps posted ahead: as many as NCCL's proxy posts for
/// the steps ahead of a channel (`NCCL_STEPS`), as perftest pre-posts its receive queue. The
/// clear-to-send a receive writes is then long delivered when the matching send comes.
pub(crate) const LAT_RECVS_AHEAD: usize = 8;

/// The receives of one side of the ping-pong: receive `i` goes into slot `i % LAT_RECVS_AHEAD` of
/// `region`, [`LAT_RECVS_AHEAD`] are kept posted, and each is replaced after use.
struct RecvsAhead<'a, 'p> {
    recv: &'a Comm<'p>,
    region: &'a Region<'a, 'p>,
    size: usize,
    total: usize,
    what: &'static str,
    posted: VecDeque<Request>,
}

impl<'a, 'p> RecvsAhead<'a, 'p> {
    /// Post the first [`LAT_RECVS_AHEAD`] of `total` receives.
    fn new(
        recv: &'a Comm<'p>,
        region: &'a Region<'a, 'p>,
        size: usize,
        total: usize,
        what: &'static str,
    ) -> Result<Self, Error> {
        let mut ring = Self {
            recv,
            region,
            size,
            total,
            what,
            posted: VecDeque::with_capacity(LAT_RECVS_AHEAD),
        };
        for i in 0..total.min(LAT_RECVS_AHEAD) {
            ring.post(i)?;
        }
        Ok(ring)
    }

    fn post(&mut self, i: usize) -> Result<(), Error> {
        let offset = (i % LAT_RECVS_AHEAD) * self.size;
        let req = post_until(self.what, || {
            self.recv.irecv(self.region, offset, self.size, TAG)
        })?;
        self.posted.push_back(req);
        Ok(())
    }

    /// The posted receive for message `i` (the oldest).
    fn take(&mut self, i: usize) -> Result<Request, Error> {
        self.posted
            .pop_front()
            .ok_or_else(|| Error::Stalled(format!("message {i}: no receive posted")))
    }

    /// Message `i`'s receive was used: post the one [`LAT_RECVS_AHEAD`] later, if any.
    fn replace(&mut self, i: usize) -> Result<(), Error> {
        if i + LAT_RECVS_AHEAD < self.total {
            self.post(i + LAT_RECVS_AHEAD)?;
        }
        Ok(())
    }
}

/// Test `sent` (dropped once done) and `pending` until `pending` completes, as NCCL's proxy
/// tests every outstanding request in one pass. `stall` names the wait in the error after
/// [`STALL`] from `start`.
fn wait_for_receive(
    send: &Comm<'_>,
    sent: &mut Option<Request>,
    recv: &Comm<'_>,
    pending: &Request,
    start: Instant,
    stall: impl FnOnce() -> String,
) -> Result<(), Error> {
    let mut polls = 0u32;
    loop {
        if let Some(sreq) = sent {
            if send.test(sreq)?.is_some() {
                *sent = None;
            }
        }
        if recv.test(pending)?.is_some() {
            return Ok(());
        }
        idle();
        if stalled(&mut polls, start, STALL) {
            return Err(Error::Stalled(format!(
                "{} for {} s",
                stall(),
                STALL.as_secs()
            )));
        }
    }
}

/// Client side of the ping-pong: one-way latency (round trip / 2) of each timed round trip.
/// `back` holds [`LAT_RECVS_AHEAD`] slots of `size` bytes.
pub(crate) fn latency_client(
    send: &Comm<'_>,
    recv: &Comm<'_>,
    out: &Region<'_, '_>,
    back: &Region<'_, '_>,
    size: usize,
    warmup: usize,
    iters: usize,
) -> Result<Vec<f64>, Error> {
    let total = warmup + iters;
    let mut samples = Vec::with_capacity(iters);
    let mut replies = RecvsAhead::new(recv, back, size, total, "irecv of a reply")?;
    for i in 0..total {
        let start = Instant::now();
        let mut ping = Some(post_until("isend of the ping", || {
            send.isend(out, 0, size, TAG)
        })?);
        let rreq = replies.take(i)?;
        // The round trip ends when the reply is here; the reply implies the ping was delivered,
        // so the ping's own completion (its acknowledgement) is collected after the clock.
        wait_for_receive(send, &mut ping, recv, &rreq, start, || {
            format!("round trip {i}: no reply")
        })?;
        if i >= warmup {
            samples.push(start.elapsed().as_secs_f64() * 1e6 / 2.0);
        }
        if let Some(sreq) = ping {
            wait(send, &sreq, "ping")?;
        }
        // Replace the receive just used, after the clock stopped.
        replies.replace(i)?;
    }
    Ok(samples)
}

/// Server side of the ping-pong: echo `count` messages. `inbox` holds [`LAT_RECVS_AHEAD`] slots
/// of `size` bytes.
pub(crate) fn latency_server(
    send: &Comm<'_>,
    recv: &Comm<'_>,
    inbox: &Region<'_, '_>,
    outbox: &Region<'_, '_>,
    size: usize,
    count: usize,
) -> Result<(), Error> {
    let mut pings = RecvsAhead::new(recv, inbox, size, count, "irecv of a ping")?;
    // The previous reply's completion is collected while waiting for the next ping rather than
    // before it.
    let mut reply: Option<Request> = None;
    for i in 0..count {
        let pending = pings.take(i)?;
        wait_for_receive(send, &mut reply, recv, &pending, Instant::now(), || {
            format!("ping {i}: no completion")
        })?;
        if let Some(sreq) = reply.take() {
            wait(send, &sreq, "reply")?;
        }
        reply = Some(post_until("isend of a reply", || {
            send.isend(outbox, 0, size, TAG)
        })?);
        // Replace the receive just used while the reply travels.
        pings.replace(i)?;
    }
    if let Some(sreq) = reply {
        wait(send, &sreq, "reply")?;
    }
    Ok(())
}
