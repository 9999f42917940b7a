//! What both machines share: an outbound queue, an incremental frame reader, the deadline, and
//! [`Common`], the part of a machine that is not its state (bytes for the socket, events for the
//! driver, the deadline) with the steps both take the same way.

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use super::HandshakeError;

use crate::time::{Duration, Instant};
use crate::wire::{FrameHeader, HEADER_LEN, Message, MessageKind, WireError};

/// Bytes queued for the socket, with how many were already written.
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    buf: Vec<u8>,
    sent: usize,
}

impl Outbox {
    /// Queues a frame behind whatever is pending.
    pub(crate) fn push(&mut self, message: &Message) {
        if self.sent == self.buf.len() {
            self.buf.clear();
            self.sent = 0;
        }
        message.encode_into(&mut self.buf);
    }

    /// The bytes not yet written.
    pub(crate) fn pending(&self) -> &[u8] {
        self.buf.get(self.sent..).unwrap_or(&[])
    }

    /// True when everything queued was written.
    pub(crate) fn is_empty(&self) -> bool {
        self.pending().is_empty()
    }

    /// Records that `n` pending bytes were written. False (and nothing changes) if fewer than
    /// `n` bytes were pending.
    pub(crate) fn consume(&mut self, n: usize) -> bool {
        if n > self.pending().len() {
            return false;
        }
        self.sent += n;
        true
    }
}

/// Why the frame reader stopped.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The bytes are not a valid frame.
    Wire(WireError),
    /// A valid header of a kind the current stage does not accept.
    Unexpected(MessageKind),
}

/// Reassembles one frame from arbitrarily small pieces, validating the header byte by byte.
///
/// It only ever asks for the rest of the current piece (header, then body), so it never takes a
/// byte beyond the frame.
#[derive(Debug)]
pub(crate) struct FrameReader {
    header: [u8; HEADER_LEN],
    header_len: usize,
    parsed: Option<FrameHeader>,
    body: Vec<u8>,
}

impl FrameReader {
    pub(crate) fn new() -> Self {
        Self {
            header: [0; HEADER_LEN],
            header_len: 0,
            parsed: None,
            body: Vec::new(),
        }
    }

    /// Bytes needed to finish the current piece: never more than the header, or the body whose
    /// length the validated header declared.
    pub(crate) fn wanted(&self) -> usize {
        match self.parsed {
            None => HEADER_LEN - self.header_len,
            Some(h) => (h.body_len as usize).saturating_sub(self.body.len()),
        }
    }

    /// Bytes of the frame received so far.
    pub(crate) fn buffered(&self) -> usize {
        self.header_len + self.body.len()
    }

    /// Takes `bytes` (at most [`wanted`](Self::wanted); the caller checks). Returns the message
    /// once its last byte arrived.
    pub(crate) fn push(
        &mut self,
        bytes: &[u8],
        allowed: &[MessageKind],
    ) -> Result<Option<Message>, ReadError> {
        let mut rest = bytes;
        let header = match self.parsed {
            Some(header) => header,
            None => {
                let take = rest.len().min(HEADER_LEN - self.header_len);
                let (head, tail) = rest.split_at(take);
                for (slot, byte) in self.header.iter_mut().skip(self.header_len).zip(head) {
                    *slot = *byte;
                }
                self.header_len += take;
                rest = tail;
                let seen = self.header.get(..self.header_len).unwrap_or(&[]);
                let Some(header) = FrameHeader::decode_prefix(seen).map_err(ReadError::Wire)?
                else {
                    return Ok(None);
                };
                if !allowed.contains(&header.kind) {
                    return Err(ReadError::Unexpected(header.kind));
                }
                self.parsed = Some(header);
                self.body.reserve_exact(header.body_len as usize);
                header
            }
        };
        let take = rest.len().min(self.wanted());
        self.body.extend_from_slice(rest.get(..take).unwrap_or(&[]));
        if self.wanted() > 0 {
            return Ok(None);
        }
        Message::decode_body(header, &self.body)
            .map(Some)
            .map_err(ReadError::Wire)
    }
}

/// The handshake's one deadline, fixed at creation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timer {
    pub(crate) started: Instant,
    pub(crate) deadline: Instant,
}

impl Timer {
    pub(crate) fn new(now: Instant, timeout: Duration) -> Self {
        Self {
            started: now,
            deadline: now + timeout,
        }
    }

    /// How long the handshake waited, if `now` is at or past the deadline.
    pub(crate) fn expired(&self, now: Instant) -> Option<Duration> {
        (now >= self.deadline).then(|| now.saturating_duration_since(self.started))
    }
}

/// The state-independent half of a handshake machine, `E` its event type.
#[derive(Debug)]
pub(crate) struct Common<E> {
    /// Frames queued for the socket.
    pub(crate) outbox: Outbox,
    /// Events for the driver, oldest first.
    pub(crate) events: VecDeque<E>,
    /// The handshake's deadline.
    pub(crate) timer: Timer,
}

impl<E> Common<E> {
    /// Nothing queued, the deadline `timeout` after `now`.
    pub(crate) fn new(now: Instant, timeout: Duration) -> Self {
        Self {
            outbox: Outbox::default(),
            events: VecDeque::new(),
            timer: Timer::new(now, timeout),
        }
    }

    /// The next event for the driver.
    pub(crate) fn next_event(&mut self) -> Option<E> {
        self.events.pop_front()
    }

    /// The deadline while the handshake is still under way (`finished`: established or failed).
    pub(crate) fn deadline(&self, finished: bool) -> Option<Instant> {
        (!finished).then_some(self.timer.deadline)
    }

    /// The error to fail with when the clock reached `now` past the deadline of an unfinished
    /// handshake in `stage`.
    pub(crate) fn timed_out(
        &self,
        finished: bool,
        now: Instant,
        stage: &'static str,
    ) -> Option<HandshakeError> {
        if finished {
            return None;
        }
        self.timer
            .expired(now)
            .map(|waited| HandshakeError::Timeout { stage, waited })
    }

    /// The shared half of failing with `error`: queue a Reject telling the peer why, when the
    /// error calls for one, and drop the events the driver has not taken (they are moot).
    pub(crate) fn failing(&mut self, error: &HandshakeError) {
        if let Some(reason) = error.reject_reason() {
            self.outbox
                .push(&Message::Reject(crate::wire::Reject { reason }));
        }
        self.events.clear();
    }
}

/// The error for a driver bug in `stage`: `fail` fails the machine with it, except once
/// `established` (terminal too: a late bug in the driver does not undo a working connection).
pub(crate) fn misuse(
    stage: &'static str,
    what: &'static str,
    established: bool,
    fail: impl FnOnce(HandshakeError) -> HandshakeError,
) -> HandshakeError {
    let error = HandshakeError::Misuse { stage, what };
    if established { error } else { fail(error) }
}

/// The `what` of a protocol error for a message of `kind` that the stage does not accept.
pub(crate) fn unexpected(kind: MessageKind) -> &'static str {
    match kind {
        MessageKind::ConnectRequest => "the peer sent a connect request, which is not allowed here",
        MessageKind::AcceptReply => "the peer sent an accept reply, which is not allowed here",
        MessageKind::Ready => "the peer sent ready, which is not allowed here",
        MessageKind::Reject => "the peer sent a reject, which is not allowed here",
        MessageKind::Lane => "the peer sent a lane, which is not allowed here",
        MessageKind::Failover => "the peer sent a failover answer, which is not allowed here",
    }
}
