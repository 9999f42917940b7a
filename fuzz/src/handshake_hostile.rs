//! A hostile peer against one [`Connector`] or [`Acceptor`] driven by an honest driver.
//!
//! The input is a little program (hand-writable, so seeds are small files):
//!
//! - byte 0: bit 0 picks the machine (0 connector, 1 acceptor);
//! - then operations, one opcode byte each (`op % 8`) plus argument bytes:
//!   - 0 `len bytes…`: queue `len` arbitrary bytes from the peer;
//!   - 1 `k m`: queue canned frame `k` (valid or deliberately wrong), xor byte `m - 1` of it with `m`
//!     when `m != 0`;
//!   - 2 `n`: deliver up to `n` queued bytes (0: as many as possible) in pieces of at most
//!     `input_wanted` — what an honest driver's read loop does;
//!   - 3 `n`: report up to `n` bytes written (0: all pending);
//!   - 4 `d`: advance the clock by `d` × 100 ms and call `handle_timeout`;
//!   - 5: the peer closed the socket;
//!   - 6 `r`: answer the pending event: reject when `r % 8 == 0`, else proceed;
//!   - 7 `w`: a driver bug, chosen by `w`.
//!
//! Checked after every step: no panic; `input_wanted` is bounded by `MAX_FRAME_LEN`; a failed
//! machine stays failed with the same error; everything the machine wrote is a well-formed frame
//! sequence of the shape its side may send; and the machine is established only if the bytes
//! delivered were exactly a valid exchange (and no error or driver bug happened).

use rivet_core::handshake::{
    Acceptor, AcceptorEvent, Connector, ConnectorEvent, Handshake, HandshakeError,
};
use rivet_core::nic::RemoteRegion;
use rivet_core::time::{Duration, Instant};
use rivet_core::wire::{
    AcceptReply, ConnectRequest, DeviceName, EndpointInfo, FrameHeader, HEADER_LEN, Lanes,
    LinkLayer, ListenHandle, MAX_FRAME_LEN, Message, MessageKind, Reject, RejectReason,
    RivetVersion,
};

const LISTEN_ID: u64 = 0xfeed_f00d;
const TIMEOUT: Duration = Duration::from_secs(2);

fn endpoint(link_layer: LinkLayer, qpn: u32) -> EndpointInfo {
    EndpointInfo {
        gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8],
        lid: if link_layer == LinkLayer::Infiniband {
            7
        } else {
            0
        },
        port_num: 1,
        mtu: 5,
        link_layer,
        qpn,
        psn: 0,
        inbound: RemoteRegion {
            addr: 0x1000,
            rkey: 0x42,
            len: 4096,
        },
        traffic_class: 0,
        service_level: 0,
        device_name: DeviceName::new("rxe0").expect("constant name is valid"),
    }
}

fn connector_local() -> EndpointInfo {
    endpoint(LinkLayer::Ethernet, 0x11)
}

fn acceptor_local() -> EndpointInfo {
    endpoint(LinkLayer::Ethernet, 0x22)
}

fn canned(k: u8) -> Vec<u8> {
    let request = |listen_id| {
        Message::ConnectRequest(ConnectRequest {
            listen_id,
            rivet_version: RivetVersion::ours(),
            lanes: Lanes::ONE,
            failover: false,
            sender: connector_local(),
        })
        .encode()
    };
    let reply = |receiver| Message::AcceptReply(AcceptReply { receiver }).encode();
    match k % 10 {
        0 => request(LISTEN_ID),
        1 => request(LISTEN_ID ^ 1),
        2 => reply(acceptor_local()),
        3 => reply(endpoint(LinkLayer::Infiniband, 0x22)),
        4 => Message::Ready.encode(),
        5 => Message::Reject(Reject {
            reason: RejectReason::SetupFailed,
        })
        .encode(),
        6 => {
            let mut header = FrameHeader::new(MessageKind::Ready).encode().to_vec();
            header[4] = header[4].wrapping_add(1);
            header
        }
        7 => {
            let mut header = FrameHeader::new(MessageKind::AcceptReply).encode().to_vec();
            header[8..].copy_from_slice(&u32::MAX.to_le_bytes());
            header
        }
        8 => {
            let mut header = FrameHeader::new(MessageKind::ConnectRequest)
                .encode()
                .to_vec();
            header[6] = 0;
            header
        }
        // A lane where a one-lane connection expects none: a protocol error on either side.
        _ => Message::Lane(connector_local()).encode(),
    }
}

/// Splits `bytes` into complete frames; `None` if they are not a sequence of valid frames.
fn frames(mut bytes: &[u8]) -> Option<Vec<Message>> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let header = FrameHeader::decode_prefix(bytes).ok()??;
        let len = HEADER_LEN + header.body_len as usize;
        out.push(Message::decode(bytes.get(..len)?).ok()?);
        bytes = &bytes[len..];
    }
    Some(out)
}

/// The honest driver's answers to events, as a trait over the two machines.
trait Driven: Handshake {
    fn answer(&mut self, proceed: bool) -> Result<(), HandshakeError>;
    fn misuse(&mut self, which: u8);
    fn is_pending_event(event: &Self::Event) -> bool;
    /// Whether `delivered` (all peer bytes the machine took) is exactly a valid exchange.
    fn valid_exchange(delivered: &[u8]) -> bool;
    /// The peer endpoint a valid exchange carried, and the one the machine reports.
    fn remotes(&self, delivered: &[u8]) -> (Option<EndpointInfo>, Option<EndpointInfo>);
    /// Whether everything the machine wrote is a sequence of frames its side may send.
    fn valid_output(sent: &[Message]) -> bool;
}

impl Driven for Connector {
    fn remotes(&self, delivered: &[u8]) -> (Option<EndpointInfo>, Option<EndpointInfo>) {
        let sent = match frames(delivered).as_deref() {
            Some([Message::AcceptReply(reply)]) => Some(reply.receiver),
            _ => None,
        };
        (sent, self.remote().copied())
    }
    fn answer(&mut self, proceed: bool) -> Result<(), HandshakeError> {
        if proceed {
            self.handle_qp_ready()
        } else {
            self.reject(RejectReason::SetupFailed)
        }
    }
    fn misuse(&mut self, which: u8) {
        match which % 3 {
            0 => self.handle_transmitted(self.poll_transmit().len() + 1),
            1 => drop(self.handle_qp_ready()),
            _ => drop(self.handle_input(&vec![0; self.input_wanted() + 1])),
        }
    }
    fn is_pending_event(event: &ConnectorEvent) -> bool {
        matches!(event, ConnectorEvent::BringUp { .. })
    }
    fn valid_exchange(delivered: &[u8]) -> bool {
        matches!(
            frames(delivered).as_deref(),
            Some([Message::AcceptReply(reply)]) if reply.receiver.link_layer == LinkLayer::Ethernet
        )
    }
    fn valid_output(sent: &[Message]) -> bool {
        let mut rest = sent;
        let Some((Message::ConnectRequest(request), tail)) = rest.split_first() else {
            return sent.is_empty();
        };
        assert_eq!(request.listen_id, LISTEN_ID);
        rest = tail;
        if let Some((Message::Ready, tail)) = rest.split_first() {
            rest = tail;
        }
        matches!(rest, [] | [Message::Reject(_)])
    }
}

impl Driven for Acceptor {
    fn remotes(&self, delivered: &[u8]) -> (Option<EndpointInfo>, Option<EndpointInfo>) {
        let sent = match frames(delivered).as_deref() {
            Some([Message::ConnectRequest(request), ..]) => Some(request.sender),
            _ => None,
        };
        (sent, self.remote().copied())
    }
    fn answer(&mut self, proceed: bool) -> Result<(), HandshakeError> {
        if proceed {
            self.handle_local_ready(acceptor_local())
        } else {
            self.reject(RejectReason::LinkLayerMismatch)
        }
    }
    fn misuse(&mut self, which: u8) {
        match which % 3 {
            0 => self.handle_transmitted(self.poll_transmit().len() + 1),
            1 => drop(self.handle_local_ready(acceptor_local())),
            _ => drop(self.handle_input(&vec![0; self.input_wanted() + 1])),
        }
    }
    fn is_pending_event(event: &AcceptorEvent) -> bool {
        matches!(event, AcceptorEvent::Request { .. })
    }
    fn valid_exchange(delivered: &[u8]) -> bool {
        matches!(
            frames(delivered).as_deref(),
            Some([Message::ConnectRequest(request), Message::Ready])
                if request.listen_id == LISTEN_ID && request.sender.link_layer == LinkLayer::Ethernet
        )
    }
    fn valid_output(sent: &[Message]) -> bool {
        matches!(
            sent,
            [] | [Message::AcceptReply(_)]
                | [Message::Reject(_)]
                | [Message::AcceptReply(_), Message::Reject(_)]
        )
    }
}

struct Run<M: Driven> {
    machine: M,
    now: Instant,
    queue: Vec<u8>,
    delivered: Vec<u8>,
    sent: Vec<u8>,
    pending_event: bool,
    first_error: Option<HandshakeError>,
    rejected_locally: bool,
}

impl<M: Driven> Run<M> {
    fn step(&mut self, op: u8, arg: &mut impl FnMut() -> u8) {
        match op % 8 {
            0 => {
                let len = arg();
                for _ in 0..len {
                    self.queue.push(arg());
                }
            }
            1 => {
                let mut frame = canned(arg());
                let m = arg();
                if m != 0 && !frame.is_empty() {
                    let at = usize::from(m - 1) % frame.len();
                    frame[at] ^= m;
                }
                self.queue.extend_from_slice(&frame);
            }
            2 => {
                // A driver's read loop: piece by piece, each at most `input_wanted`.
                let mut budget = match arg() {
                    0 => usize::MAX,
                    n => usize::from(n),
                };
                loop {
                    let n = budget
                        .min(self.machine.input_wanted())
                        .min(self.queue.len());
                    if n == 0 {
                        break;
                    }
                    budget -= n;
                    let chunk: Vec<u8> = self.queue.drain(..n).collect();
                    self.delivered.extend_from_slice(&chunk);
                    if self.machine.handle_input(&chunk).is_err() {
                        break;
                    }
                }
            }
            3 => {
                let pending = self.machine.poll_transmit().len();
                let n = match arg() {
                    0 => pending,
                    n => usize::from(n).min(pending),
                };
                self.sent
                    .extend_from_slice(&self.machine.poll_transmit()[..n]);
                self.machine.handle_transmitted(n);
            }
            4 => {
                self.now = self.now + Duration::from_millis(100 * u64::from(arg()));
                self.machine.handle_timeout(self.now);
            }
            5 => {
                let _ = self.machine.handle_peer_closed();
            }
            6 => {
                let proceed = arg() % 8 != 0;
                if self.pending_event {
                    self.pending_event = false;
                    self.rejected_locally |= !proceed;
                    let _ = self.machine.answer(proceed);
                }
            }
            _ => {
                // Either a Misuse error, or (a repeated answer) the honest call after all.
                self.machine.misuse(arg());
                self.pending_event = false;
            }
        }
        while let Some(event) = self.machine.poll_event() {
            if M::is_pending_event(&event) {
                self.pending_event = true;
            }
        }
        self.check();
    }

    fn check(&mut self) {
        let wanted = self.machine.input_wanted();
        assert!(
            wanted <= MAX_FRAME_LEN,
            "input_wanted {wanted} is unbounded"
        );
        if let Some(first) = &self.first_error {
            assert_eq!(
                self.machine.error(),
                Some(first),
                "a failed machine changed its error"
            );
            assert!(!self.machine.is_established());
        } else if let Some(error) = self.machine.error() {
            let _ = error.to_string();
            self.first_error = Some(error.clone());
        }
        if self.machine.is_established() {
            assert!(
                M::valid_exchange(&self.delivered),
                "established on an invalid exchange"
            );
            assert!(!self.rejected_locally);
            let (sent, reported) = self.machine.remotes(&self.delivered);
            assert!(sent.is_some());
            assert_eq!(
                sent, reported,
                "the machine reports another peer than the one that spoke"
            );
            assert!(self.machine.poll_timeout().is_none());
        }
        let mut all = self.sent.clone();
        all.extend_from_slice(self.machine.poll_transmit());
        let sent = frames(&all).expect("the machine wrote a malformed frame");
        assert!(
            M::valid_output(&sent),
            "unexpected output sequence {sent:?}"
        );
    }
}

fn run<M: Driven>(machine: M, now: Instant, ops: &[u8]) {
    let mut run = Run {
        machine,
        now,
        queue: Vec::new(),
        delivered: Vec::new(),
        sent: Vec::new(),
        pending_event: false,
        first_error: None,
        rejected_locally: false,
    };
    let mut bytes = ops.iter().copied();
    while let Some(op) = bytes.next() {
        let mut arg = || bytes.next().unwrap_or(0);
        run.step(op, &mut arg);
    }
}

/// One run of the target on libFuzzer's bytes.
pub fn check(data: &[u8]) {
    let Some((&side, ops)) = data.split_first() else {
        return;
    };
    let now = Instant::from_nanos(1_000_000_000);
    if side & 1 == 0 {
        let handle = ListenHandle::new("10.0.0.1:4791".parse().expect("constant"), LISTEN_ID);
        run(
            Connector::new(&handle, connector_local(), now, TIMEOUT),
            now,
            ops,
        );
    } else {
        run(Acceptor::new(LISTEN_ID, now, TIMEOUT), now, ops);
    }
}
