//! State-machine tests: fixtures build a machine already in a given stage; tests are named
//! `<stage>_<event>`. At the end, a connector and an acceptor are pumped against each other
//! through in-memory pipes with random chunking.

use alloc::string::ToString;
use alloc::vec::Vec;

use super::*;
use crate::time::Duration;
use crate::wire::tests::{ib_endpoint, roce_endpoint};
use crate::wire::{
    AcceptReply, ConnectRequest, EndpointInfo, FrameHeader, HEADER_LEN, Lanes, LinkLayer,
    ListenHandle, MAX_FRAME_LEN, Message, MessageKind, Reject, RejectReason, RivetVersion,
    WireError,
};

const LISTEN_ID: u64 = 0x5eed_0000_0000_0001;
const T0: Instant = Instant::from_nanos(1_000_000);
const TIMEOUT: Duration = Duration::from_secs(5);

fn deadline() -> Instant {
    T0 + TIMEOUT
}

fn handle() -> ListenHandle {
    ListenHandle::new("127.0.0.1:40000".parse().unwrap(), LISTEN_ID)
}

fn connector_local() -> EndpointInfo {
    roce_endpoint()
}

fn acceptor_local() -> EndpointInfo {
    EndpointInfo {
        qpn: 0x77,
        psn: 5,
        ..roce_endpoint()
    }
}

fn request_frame(listen_id: u64) -> Vec<u8> {
    Message::ConnectRequest(ConnectRequest {
        listen_id,
        rivet_version: RivetVersion::ours(),
        lanes: Lanes::ONE,
        failover: false,
        sender: connector_local(),
    })
    .encode()
}

fn reply_frame(receiver: EndpointInfo) -> Vec<u8> {
    Message::AcceptReply(AcceptReply { receiver }).encode()
}

fn reject_frame(reason: RejectReason) -> Vec<u8> {
    Message::Reject(Reject { reason }).encode()
}

/// A frame header with another wire version.
fn header_with_version(kind: MessageKind, version: u16) -> Vec<u8> {
    let mut header = FrameHeader::new(kind).encode().to_vec();
    header[4..6].copy_from_slice(&version.to_le_bytes());
    header
}

/// Feeds `bytes` the way a driver does: never more than `input_wanted`. Returns how many the
/// machine took (it stops taking when it wants no more).
fn feed<M: Handshake>(machine: &mut M, bytes: &[u8]) -> Result<usize, HandshakeError> {
    let mut taken = 0;
    while taken < bytes.len() {
        let wanted = machine.input_wanted();
        if wanted == 0 {
            break;
        }
        let n = wanted.min(bytes.len() - taken);
        machine.handle_input(&bytes[taken..taken + n])?;
        taken += n;
    }
    Ok(taken)
}

/// Writes everything pending; returns it.
fn drain<M: Handshake>(machine: &mut M) -> Vec<u8> {
    let out = machine.poll_transmit().to_vec();
    machine.handle_transmitted(out.len());
    out
}

/// Splits a byte stream into frames, all of which must be valid.
fn frames(mut bytes: &[u8]) -> Vec<Message> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let header = FrameHeader::decode_prefix(bytes).unwrap().unwrap();
        let len = HEADER_LEN + header.body_len as usize;
        out.push(Message::decode(&bytes[..len]).unwrap());
        bytes = &bytes[len..];
    }
    out
}

/// Asserts the machine failed with `expected`, stays failed, and answers every call with it.
fn assert_failed_with<M: Handshake>(machine: &mut M, expected: &HandshakeError) {
    assert_eq!(machine.error(), Some(expected));
    assert_eq!(machine.stage_name(), "failed");
    assert!(!machine.is_established());
    assert_eq!(machine.input_wanted(), 0);
    assert_eq!(machine.poll_timeout(), None);
    assert_eq!(machine.handle_input(b"x").as_ref(), Err(expected));
    assert_eq!(machine.handle_peer_closed().as_ref(), Err(expected));
    machine.handle_timeout(Instant::from_nanos(u64::MAX));
    assert_eq!(machine.error(), Some(expected));
    assert!(machine.poll_event().is_none());
}

// ---------------------------------------------------------------- connector fixtures

fn connector_sending_request() -> Connector {
    Connector::new(&handle(), connector_local(), T0, TIMEOUT)
}

fn connector_awaiting_reply() -> Connector {
    let mut c = connector_sending_request();
    drain(&mut c);
    assert_eq!(c.stage(), ConnectorStage::AwaitingReply);
    c
}

fn connector_bringing_up() -> Connector {
    let mut c = connector_awaiting_reply();
    assert_eq!(feed(&mut c, &reply_frame(acceptor_local())), Ok(92));
    assert_eq!(
        c.poll_event(),
        Some(ConnectorEvent::BringUp {
            remote: acceptor_local()
        })
    );
    assert_eq!(c.stage(), ConnectorStage::BringingUp);
    c
}

fn connector_sending_ready() -> Connector {
    let mut c = connector_bringing_up();
    c.handle_qp_ready().unwrap();
    assert_eq!(c.stage(), ConnectorStage::SendingReady);
    c
}

fn connector_established() -> Connector {
    let mut c = connector_sending_ready();
    drain(&mut c);
    assert_eq!(c.poll_event(), Some(ConnectorEvent::Established));
    c
}

// ---------------------------------------------------------------- acceptor fixtures

fn acceptor_awaiting_request() -> Acceptor {
    Acceptor::new(LISTEN_ID, T0, TIMEOUT)
}

fn acceptor_bringing_up() -> Acceptor {
    let mut a = acceptor_awaiting_request();
    assert_eq!(feed(&mut a, &request_frame(LISTEN_ID)), Ok(120));
    assert_eq!(
        a.poll_event(),
        Some(AcceptorEvent::Request {
            remote: connector_local()
        })
    );
    assert_eq!(a.stage(), AcceptorStage::BringingUp);
    a
}

fn acceptor_sending_reply() -> Acceptor {
    let mut a = acceptor_bringing_up();
    a.handle_local_ready(acceptor_local()).unwrap();
    assert_eq!(a.stage(), AcceptorStage::SendingReply);
    a
}

fn acceptor_awaiting_ready() -> Acceptor {
    let mut a = acceptor_sending_reply();
    drain(&mut a);
    assert_eq!(a.stage(), AcceptorStage::AwaitingReady);
    a
}

fn acceptor_established() -> Acceptor {
    let mut a = acceptor_awaiting_ready();
    assert_eq!(feed(&mut a, &Message::Ready.encode()), Ok(HEADER_LEN));
    assert_eq!(a.poll_event(), Some(AcceptorEvent::Established));
    a
}

// ---------------------------------------------------------------- connector: sending request

#[test]
fn sending_request_transmits_connect_request() {
    let c = connector_sending_request();
    assert_eq!(c.stage(), ConnectorStage::SendingRequest);
    assert_eq!(
        frames(c.poll_transmit()),
        [Message::ConnectRequest(ConnectRequest {
            listen_id: LISTEN_ID,
            rivet_version: RivetVersion::ours(),
            lanes: Lanes::ONE,
            failover: false,
            sender: connector_local(),
        })]
    );
    assert_eq!(c.poll_timeout(), Some(deadline()));
    assert_eq!(c.listener_version(), &RivetVersion::ours());
}

#[test]
fn sending_request_wants_no_input_until_written() {
    let mut c = connector_sending_request();
    let total = c.poll_transmit().len();
    c.handle_transmitted(total - 1);
    assert_eq!(c.poll_transmit().len(), 1);
    assert_eq!(c.input_wanted(), 0);
    c.handle_transmitted(1);
    assert_eq!(c.input_wanted(), HEADER_LEN);
}

#[test]
fn sending_request_transmitted_too_much_is_misuse() {
    let mut c = connector_sending_request();
    let total = c.poll_transmit().len();
    c.handle_transmitted(total + 1);
    assert!(matches!(
        c.error(),
        Some(HandshakeError::Misuse {
            stage: "sending connect request",
            ..
        })
    ));
}

#[test]
fn sending_request_times_out() {
    let mut c = connector_sending_request();
    c.handle_timeout(deadline());
    let expected = HandshakeError::Timeout {
        stage: "sending connect request",
        waited: TIMEOUT,
    };
    assert_failed_with(&mut c, &expected);
    assert!(expected.to_string().contains("5.000 s"), "{expected}");
}

#[test]
fn new_with_invalid_local_info_fails_and_sends_nothing() {
    let local = EndpointInfo {
        mtu: 9,
        ..connector_local()
    };
    let mut c = Connector::new(&handle(), local, T0, TIMEOUT);
    assert!(c.poll_transmit().is_empty());
    let error = c.error().cloned().unwrap();
    assert!(matches!(
        error,
        HandshakeError::InvalidLocalInfo {
            error: WireError::BadField { field: "mtu", .. },
            ..
        }
    ));
    assert_failed_with(&mut c, &error);
}

// ---------------------------------------------------------------- connector: awaiting reply

#[test]
fn awaiting_reply_receives_accept_reply() {
    let c = connector_bringing_up();
    assert_eq!(c.remote(), Some(&acceptor_local()));
    assert_eq!(c.input_wanted(), 0);
    assert!(c.poll_transmit().is_empty());
}

#[test]
fn awaiting_reply_receives_accept_reply_one_byte_at_a_time() {
    let mut c = connector_awaiting_reply();
    for byte in reply_frame(acceptor_local()) {
        assert!(c.input_wanted() >= 1);
        c.handle_input(&[byte]).unwrap();
    }
    assert_eq!(
        c.poll_event(),
        Some(ConnectorEvent::BringUp {
            remote: acceptor_local()
        })
    );
}

#[test]
fn awaiting_reply_receives_reject() {
    let mut c = connector_awaiting_reply();
    let err = feed(&mut c, &reject_frame(RejectReason::WrongListener)).unwrap_err();
    let expected = HandshakeError::Rejected {
        stage: "awaiting accept reply",
        reason: RejectReason::WrongListener,
    };
    assert_eq!(err, expected);
    assert!(
        c.poll_transmit().is_empty(),
        "no reject is sent back for a reject"
    );
    assert!(err.to_string().contains("stale"), "{err}");
    assert_failed_with(&mut c, &expected);
}

#[test]
fn awaiting_reply_receives_garbage() {
    let mut c = connector_awaiting_reply();
    let err = c.handle_input(b"H").unwrap_err();
    assert!(matches!(
        err,
        HandshakeError::Wire {
            stage: "awaiting accept reply",
            error: WireError::BadMagic { .. }
        }
    ));
    assert_eq!(
        frames(c.poll_transmit()),
        [Message::Reject(Reject {
            reason: RejectReason::Malformed
        })]
    );
    assert_failed_with(&mut c, &err);
}

#[test]
fn awaiting_reply_receives_newer_wire_version() {
    let mut c = connector_awaiting_reply();
    let header = header_with_version(MessageKind::AcceptReply, 4);
    let err = c.handle_input(&header[..6]).unwrap_err();
    let HandshakeError::Wire {
        error: WireError::VersionMismatch {
            ours: 3, theirs: 4, ..
        },
        ..
    } = &err
    else {
        panic!("{err:?}");
    };
    let text = err.to_string();
    assert!(
        text.contains("version 4 (newer") && text.contains("version 3"),
        "{text}"
    );
    assert_eq!(
        frames(c.poll_transmit()),
        [Message::Reject(Reject {
            reason: RejectReason::WireVersion
        })]
    );
}

#[test]
fn awaiting_reply_receives_older_wire_version() {
    let mut c = connector_awaiting_reply();
    let err = feed(&mut c, &header_with_version(MessageKind::AcceptReply, 0)).unwrap_err();
    assert!(err.to_string().contains("version 0 (older"), "{err}");
}

#[test]
fn awaiting_reply_receives_oversize_length() {
    let mut c = connector_awaiting_reply();
    let mut header = FrameHeader::new(MessageKind::AcceptReply).encode();
    header[8..].copy_from_slice(&0x0100_0000u32.to_le_bytes());
    let err = feed(&mut c, &header).unwrap_err();
    assert!(matches!(
        err,
        HandshakeError::Wire {
            error: WireError::Oversize { .. },
            ..
        }
    ));
}

#[test]
fn awaiting_reply_receives_ready() {
    let mut c = connector_awaiting_reply();
    let err = feed(&mut c, &Message::Ready.encode()).unwrap_err();
    assert!(matches!(
        err,
        HandshakeError::Protocol {
            stage: "awaiting accept reply",
            ..
        }
    ));
    assert!(err.to_string().contains("ready"), "{err}");
}

#[test]
fn awaiting_reply_receives_connect_request() {
    let mut c = connector_awaiting_reply();
    let err = feed(&mut c, &request_frame(LISTEN_ID)).unwrap_err();
    assert!(matches!(err, HandshakeError::Protocol { .. }), "{err:?}");
}

#[test]
fn awaiting_reply_receives_other_link_layer() {
    let mut c = connector_awaiting_reply();
    let err = feed(&mut c, &reply_frame(ib_endpoint())).unwrap_err();
    let expected = HandshakeError::Incompatible {
        stage: "awaiting accept reply",
        what: Incompatibility::LinkLayer {
            ours: LinkLayer::Ethernet,
            theirs: LinkLayer::Infiniband,
        },
    };
    assert_eq!(err, expected);
    assert_eq!(
        frames(c.poll_transmit()),
        [Message::Reject(Reject {
            reason: RejectReason::LinkLayerMismatch
        })]
    );
}

#[test]
fn awaiting_reply_receives_invalid_endpoint() {
    let mut c = connector_awaiting_reply();
    let mut frame = reply_frame(acceptor_local());
    frame[HEADER_LEN + 24..HEADER_LEN + 28].copy_from_slice(&(1u32 << 24).to_le_bytes());
    let err = feed(&mut c, &frame).unwrap_err();
    assert!(matches!(
        err,
        HandshakeError::Wire {
            error: WireError::BadField { field: "qpn", .. },
            ..
        }
    ));
    assert!(err.to_string().contains("qpn"), "{err}");
}

#[test]
fn awaiting_reply_receives_truncated_then_peer_closed() {
    let mut c = connector_awaiting_reply();
    let frame = reply_frame(acceptor_local());
    assert_eq!(feed(&mut c, &frame[..30]), Ok(30));
    let err = c.handle_peer_closed().unwrap_err();
    assert_eq!(
        err,
        HandshakeError::PeerClosed {
            stage: "awaiting accept reply",
            partial: 30
        }
    );
    assert!(err.to_string().contains("30 bytes into a message"), "{err}");
    assert!(c.poll_transmit().is_empty());
}

#[test]
fn awaiting_reply_receives_more_than_wanted() {
    let mut c = connector_awaiting_reply();
    let err = c.handle_input(&reply_frame(acceptor_local())).unwrap_err();
    assert!(matches!(
        err,
        HandshakeError::Misuse {
            stage: "awaiting accept reply",
            ..
        }
    ));
}

#[test]
fn awaiting_reply_times_out() {
    let mut c = connector_awaiting_reply();
    c.handle_timeout(Instant::from_nanos(deadline().as_nanos() - 1));
    assert_eq!(c.error(), None);
    c.handle_timeout(deadline() + Duration::from_millis(1));
    let expected = HandshakeError::Timeout {
        stage: "awaiting accept reply",
        waited: Duration::from_millis(5001),
    };
    assert_failed_with(&mut c, &expected);
    assert_eq!(
        frames(c.poll_transmit()),
        [Message::Reject(Reject {
            reason: RejectReason::TimedOut
        })]
    );
}

#[test]
fn awaiting_reply_qp_ready_is_misuse() {
    let mut c = connector_awaiting_reply();
    assert!(matches!(
        c.handle_qp_ready(),
        Err(HandshakeError::Misuse { .. })
    ));
    assert!(c.error().is_some());
}

// ---------------------------------------------------------------- connector: bringing up

#[test]
fn bringing_up_qp_ready_sends_ready() {
    let c = connector_sending_ready();
    assert_eq!(frames(c.poll_transmit()), [Message::Ready]);
    assert!(!c.is_established());
}

#[test]
fn bringing_up_reject_sends_reject() {
    let mut c = connector_bringing_up();
    c.reject(RejectReason::SetupFailed).unwrap();
    let expected = HandshakeError::RejectedLocally {
        stage: "bringing up the queue pair",
        reason: RejectReason::SetupFailed,
    };
    assert_eq!(
        frames(c.poll_transmit()),
        [Message::Reject(Reject {
            reason: RejectReason::SetupFailed
        })]
    );
    assert_failed_with(&mut c, &expected);
    // The queued reject is still written after the failure.
    drain(&mut c);
    assert!(c.poll_transmit().is_empty());
}

#[test]
fn bringing_up_times_out() {
    let mut c = connector_bringing_up();
    c.handle_timeout(deadline());
    assert!(matches!(
        c.error(),
        Some(HandshakeError::Timeout {
            stage: "bringing up the queue pair",
            ..
        })
    ));
}

#[test]
fn bringing_up_peer_closed() {
    let mut c = connector_bringing_up();
    assert_eq!(
        c.handle_peer_closed(),
        Err(HandshakeError::PeerClosed {
            stage: "bringing up the queue pair",
            partial: 0
        })
    );
}

#[test]
fn bringing_up_qp_ready_twice_is_misuse() {
    let mut c = connector_sending_ready();
    assert!(matches!(
        c.handle_qp_ready(),
        Err(HandshakeError::Misuse {
            stage: "sending ready",
            ..
        })
    ));
}

// ---------------------------------------------------------------- connector: sending ready

#[test]
fn sending_ready_written_is_established() {
    let mut c = connector_sending_ready();
    c.handle_transmitted(5);
    assert!(!c.is_established());
    assert_eq!(c.poll_event(), None);
    drain(&mut c);
    assert!(c.is_established());
    assert_eq!(c.poll_event(), Some(ConnectorEvent::Established));
    assert_eq!(c.remote(), Some(&acceptor_local()));
}

#[test]
fn sending_ready_peer_closed() {
    let mut c = connector_sending_ready();
    assert_eq!(
        c.handle_peer_closed(),
        Err(HandshakeError::PeerClosed {
            stage: "sending ready",
            partial: 0
        })
    );
}

// ---------------------------------------------------------------- connector: established

#[test]
fn established_connector_ignores_peer_close_and_time() {
    let mut c = connector_established();
    assert_eq!(c.handle_peer_closed(), Ok(()));
    assert_eq!(c.poll_timeout(), None);
    c.handle_timeout(Instant::from_nanos(u64::MAX));
    assert!(c.is_established());
    assert_eq!(c.input_wanted(), 0);
    assert!(matches!(
        c.handle_input(b"x"),
        Err(HandshakeError::Misuse {
            stage: "established",
            ..
        })
    ));
    assert!(matches!(
        c.handle_qp_ready(),
        Err(HandshakeError::Misuse { .. })
    ));
    c.handle_transmitted(1);
    assert!(
        c.is_established(),
        "a late driver bug does not undo the connection"
    );
    assert_eq!(c.error(), None);
}

#[test]
fn established_acceptor_stays_established_after_driver_bug() {
    let mut a = acceptor_established();
    assert!(matches!(
        a.handle_local_ready(acceptor_local()),
        Err(HandshakeError::Misuse { .. })
    ));
    assert!(matches!(
        a.reject(RejectReason::SetupFailed),
        Err(HandshakeError::Misuse { .. })
    ));
    assert!(a.is_established());
    assert!(a.poll_transmit().is_empty());
}

// ---------------------------------------------------------------- acceptor: awaiting request

#[test]
fn awaiting_request_receives_connect_request() {
    let a = acceptor_bringing_up();
    assert_eq!(a.remote(), Some(&connector_local()));
    assert_eq!(a.peer_version(), Some(&RivetVersion::ours()));
    assert_eq!(a.input_wanted(), 0);
    assert!(a.poll_transmit().is_empty());
}

#[test]
fn awaiting_request_wants_header_then_exactly_the_body() {
    let mut a = acceptor_awaiting_request();
    assert_eq!(a.input_wanted(), HEADER_LEN);
    let frame = request_frame(LISTEN_ID);
    a.handle_input(&frame[..5]).unwrap();
    assert_eq!(a.input_wanted(), HEADER_LEN - 5);
    a.handle_input(&frame[5..HEADER_LEN]).unwrap();
    assert_eq!(a.input_wanted(), frame.len() - HEADER_LEN);
}

#[test]
fn awaiting_request_receives_wrong_listen_id() {
    let mut a = acceptor_awaiting_request();
    let err = feed(&mut a, &request_frame(LISTEN_ID + 1)).unwrap_err();
    let expected = HandshakeError::WrongListener {
        expected: LISTEN_ID,
        found: LISTEN_ID + 1,
    };
    assert_eq!(err, expected);
    assert!(err.to_string().contains("0x5eed000000000002"), "{err}");
    assert_eq!(
        frames(a.poll_transmit()),
        [Message::Reject(Reject {
            reason: RejectReason::WrongListener
        })]
    );
    assert_failed_with(&mut a, &expected);
}

#[test]
fn awaiting_request_receives_newer_wire_version() {
    let mut a = acceptor_awaiting_request();
    let header = header_with_version(MessageKind::ConnectRequest, 4);
    assert_eq!(a.handle_input(&header[..5]), Ok(()));
    let err = a.handle_input(&header[5..6]).unwrap_err();
    assert_eq!(
        err,
        HandshakeError::Wire {
            stage: "awaiting connect request",
            error: WireError::VersionMismatch {
                what: "frame header",
                ours: 3,
                theirs: 4,
                their_rivet: None
            },
        }
    );
    assert!(err.to_string().contains("newer"), "{err}");
    assert_eq!(
        frames(a.poll_transmit()),
        [Message::Reject(Reject {
            reason: RejectReason::WireVersion
        })]
    );
}

#[test]
fn awaiting_request_receives_older_wire_version() {
    let mut a = acceptor_awaiting_request();
    let err = feed(&mut a, &header_with_version(MessageKind::ConnectRequest, 0)).unwrap_err();
    assert!(err.to_string().contains("older"), "{err}");
}

#[test]
fn awaiting_request_receives_garbage() {
    let mut a = acceptor_awaiting_request();
    let err = feed(&mut a, b"GET / HTTP/1.1\r\n").unwrap_err();
    assert!(matches!(
        err,
        HandshakeError::Wire {
            error: WireError::BadMagic { .. },
            ..
        }
    ));
    assert!(err.to_string().contains("\"GET.\""), "{err}");
}

#[test]
fn awaiting_request_receives_wrong_magic_after_good_prefix() {
    let mut a = acceptor_awaiting_request();
    assert_eq!(a.handle_input(b"RVT"), Ok(()));
    let err = a.handle_input(b"H").unwrap_err();
    assert!(err.to_string().contains("0x52565448"), "{err}");
}

#[test]
fn awaiting_request_receives_oversize_length() {
    let mut a = acceptor_awaiting_request();
    let mut header = FrameHeader::new(MessageKind::ConnectRequest).encode();
    header[8..].copy_from_slice(&u32::MAX.to_le_bytes());
    let err = feed(&mut a, &header).unwrap_err();
    assert_eq!(
        err,
        HandshakeError::Wire {
            stage: "awaiting connect request",
            error: WireError::Oversize {
                declared: u32::MAX,
                max: crate::wire::MAX_BODY_LEN
            },
        }
    );
}

#[test]
fn awaiting_request_receives_wrong_body_length() {
    let mut a = acceptor_awaiting_request();
    let mut header = FrameHeader::new(MessageKind::ConnectRequest).encode();
    header[8..].copy_from_slice(&200u32.to_le_bytes());
    let err = feed(&mut a, &header).unwrap_err();
    assert!(matches!(
        err,
        HandshakeError::Wire {
            error: WireError::BadLength { .. },
            ..
        }
    ));
}

#[test]
fn awaiting_request_receives_ready() {
    let mut a = acceptor_awaiting_request();
    let err = feed(&mut a, &Message::Ready.encode()).unwrap_err();
    assert!(matches!(
        err,
        HandshakeError::Protocol {
            stage: "awaiting connect request",
            ..
        }
    ));
}

#[test]
fn awaiting_request_receives_reject() {
    let mut a = acceptor_awaiting_request();
    let err = feed(&mut a, &reject_frame(RejectReason::Malformed)).unwrap_err();
    assert!(matches!(err, HandshakeError::Protocol { .. }), "{err:?}");
}

#[test]
fn awaiting_request_receives_trailing_bytes() {
    // The driver only reads what the machine asks for, so bytes after the request stay in the
    // socket; they are read as the next frame and fail there.
    let mut a = acceptor_awaiting_request();
    let mut stream = request_frame(LISTEN_ID);
    stream.extend_from_slice(b"junk");
    assert_eq!(feed(&mut a, &stream), Ok(stream.len() - 4));
    assert!(a.poll_event().is_some());
    a.handle_local_ready(acceptor_local()).unwrap();
    drain(&mut a);
    let err = feed(&mut a, b"junk").unwrap_err();
    assert!(matches!(
        err,
        HandshakeError::Wire {
            stage: "awaiting ready",
            error: WireError::BadMagic { .. }
        }
    ));
}

#[test]
fn awaiting_request_receives_invalid_endpoint() {
    let mut a = acceptor_awaiting_request();
    let mut frame = request_frame(LISTEN_ID);
    frame[HEADER_LEN + 28 + 22] = 99; // service level
    let err = feed(&mut a, &frame).unwrap_err();
    assert!(err.to_string().contains("service level"), "{err}");
}

#[test]
fn awaiting_request_times_out() {
    let mut a = acceptor_awaiting_request();
    assert_eq!(a.poll_timeout(), Some(deadline()));
    a.handle_timeout(deadline());
    let expected = HandshakeError::Timeout {
        stage: "awaiting connect request",
        waited: TIMEOUT,
    };
    assert_failed_with(&mut a, &expected);
}

#[test]
fn awaiting_request_peer_closed() {
    let mut a = acceptor_awaiting_request();
    let err = a.handle_peer_closed().unwrap_err();
    assert_eq!(
        err,
        HandshakeError::PeerClosed {
            stage: "awaiting connect request",
            partial: 0
        }
    );
    assert!(a.poll_transmit().is_empty());
}

#[test]
fn awaiting_request_truncated_then_peer_closed() {
    let mut a = acceptor_awaiting_request();
    let frame = request_frame(LISTEN_ID);
    assert_eq!(feed(&mut a, &frame[..frame.len() - 1]), Ok(frame.len() - 1));
    assert_eq!(
        a.handle_peer_closed(),
        Err(HandshakeError::PeerClosed {
            stage: "awaiting connect request",
            partial: 119
        })
    );
}

#[test]
fn awaiting_request_local_ready_is_misuse() {
    let mut a = acceptor_awaiting_request();
    assert!(matches!(
        a.handle_local_ready(acceptor_local()),
        Err(HandshakeError::Misuse {
            stage: "awaiting connect request",
            ..
        })
    ));
    assert!(matches!(
        a.reject(RejectReason::SetupFailed),
        Err(HandshakeError::Misuse { .. })
    ));
}

// ---------------------------------------------------------------- acceptor: bringing up

#[test]
fn bringing_up_local_ready_sends_reply() {
    let a = acceptor_sending_reply();
    assert_eq!(
        frames(a.poll_transmit()),
        [Message::AcceptReply(AcceptReply {
            receiver: acceptor_local()
        })]
    );
    assert_eq!(
        a.input_wanted(),
        0,
        "no reading before the reply is written"
    );
}

#[test]
fn bringing_up_acceptor_rejects() {
    let mut a = acceptor_bringing_up();
    a.reject(RejectReason::LinkLayerMismatch).unwrap();
    assert_eq!(
        frames(a.poll_transmit()),
        [Message::Reject(Reject {
            reason: RejectReason::LinkLayerMismatch
        })]
    );
    let expected = HandshakeError::RejectedLocally {
        stage: "bringing up the queue pair",
        reason: RejectReason::LinkLayerMismatch,
    };
    assert_failed_with(&mut a, &expected);
}

#[test]
fn bringing_up_local_other_link_layer() {
    let mut a = acceptor_bringing_up();
    let err = a.handle_local_ready(ib_endpoint()).unwrap_err();
    assert!(matches!(err, HandshakeError::Incompatible { .. }));
    assert!(err.to_string().contains("InfiniBand"), "{err}");
    assert_eq!(
        frames(a.poll_transmit()),
        [Message::Reject(Reject {
            reason: RejectReason::LinkLayerMismatch
        })]
    );
}

#[test]
fn bringing_up_invalid_local_info() {
    let mut a = acceptor_bringing_up();
    let err = a
        .handle_local_ready(EndpointInfo {
            psn: u32::MAX,
            ..acceptor_local()
        })
        .unwrap_err();
    assert!(matches!(
        err,
        HandshakeError::InvalidLocalInfo {
            error: WireError::BadField { field: "psn", .. },
            ..
        }
    ));
    assert_eq!(
        frames(a.poll_transmit()),
        [Message::Reject(Reject {
            reason: RejectReason::SetupFailed
        })]
    );
}

#[test]
fn bringing_up_acceptor_times_out() {
    let mut a = acceptor_bringing_up();
    a.handle_timeout(deadline());
    assert!(matches!(
        a.error(),
        Some(HandshakeError::Timeout {
            stage: "bringing up the queue pair",
            ..
        })
    ));
}

// ---------------------------------------------------------------- acceptor: awaiting ready

#[test]
fn awaiting_ready_receives_ready() {
    let mut a = acceptor_established();
    assert!(a.is_established());
    assert_eq!(a.remote(), Some(&connector_local()));
    assert_eq!(a.poll_timeout(), None);
    assert_eq!(a.handle_peer_closed(), Ok(()));
}

#[test]
fn awaiting_ready_receives_reject() {
    let mut a = acceptor_awaiting_ready();
    let err = feed(&mut a, &reject_frame(RejectReason::LinkLayerMismatch)).unwrap_err();
    assert_eq!(
        err,
        HandshakeError::Rejected {
            stage: "awaiting ready",
            reason: RejectReason::LinkLayerMismatch
        }
    );
    assert!(a.poll_transmit().is_empty());
}

#[test]
fn awaiting_ready_receives_accept_reply() {
    let mut a = acceptor_awaiting_ready();
    let err = feed(&mut a, &reply_frame(acceptor_local())).unwrap_err();
    assert!(matches!(
        err,
        HandshakeError::Protocol {
            stage: "awaiting ready",
            ..
        }
    ));
}

#[test]
fn awaiting_ready_receives_ready_with_body() {
    let mut a = acceptor_awaiting_ready();
    let mut header = FrameHeader::new(MessageKind::Ready).encode();
    header[8] = 4;
    let err = feed(&mut a, &header).unwrap_err();
    assert!(matches!(
        err,
        HandshakeError::Wire {
            error: WireError::BadLength {
                kind: MessageKind::Ready,
                declared: 4,
                expected: 0
            },
            ..
        }
    ));
}

#[test]
fn awaiting_ready_peer_closed() {
    let mut a = acceptor_awaiting_ready();
    assert_eq!(
        a.handle_peer_closed(),
        Err(HandshakeError::PeerClosed {
            stage: "awaiting ready",
            partial: 0
        })
    );
}

#[test]
fn awaiting_ready_times_out() {
    let mut a = acceptor_awaiting_ready();
    a.handle_timeout(deadline());
    assert!(matches!(
        a.error(),
        Some(HandshakeError::Timeout {
            stage: "awaiting ready",
            ..
        })
    ));
    assert_eq!(
        frames(a.poll_transmit()),
        [Message::Reject(Reject {
            reason: RejectReason::TimedOut
        })]
    );
}

#[test]
fn sending_reply_times_out() {
    let mut a = acceptor_sending_reply();
    a.handle_timeout(deadline());
    assert!(matches!(
        a.error(),
        Some(HandshakeError::Timeout {
            stage: "sending accept reply",
            ..
        })
    ));
    // The reply's bytes come first, then the reject: the stream stays well-formed.
    let sent = frames(a.poll_transmit());
    assert_eq!(sent.len(), 2);
    assert_eq!(
        sent[1],
        Message::Reject(Reject {
            reason: RejectReason::TimedOut
        })
    );
}

#[test]
fn every_error_display_names_its_stage() {
    let errors = [
        HandshakeError::Timeout {
            stage: "awaiting ready",
            waited: TIMEOUT,
        },
        HandshakeError::PeerClosed {
            stage: "awaiting ready",
            partial: 0,
        },
        HandshakeError::Rejected {
            stage: "awaiting ready",
            reason: RejectReason::TimedOut,
        },
        HandshakeError::RejectedLocally {
            stage: "awaiting ready",
            reason: RejectReason::TimedOut,
        },
        HandshakeError::Protocol {
            stage: "awaiting ready",
            what: "x",
        },
        HandshakeError::Misuse {
            stage: "awaiting ready",
            what: "x",
        },
        HandshakeError::Wire {
            stage: "awaiting ready",
            error: WireError::UnknownKind { found: 9 },
        },
    ];
    for error in errors {
        assert!(error.to_string().contains("awaiting ready"), "{error}");
    }
}

// ---------------------------------------------------------------- the pair, through pipes

/// Tiny deterministic PRNG (xorshift64*), so the test needs no external crate.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Moves at most a random number of bytes (possibly zero) from `from`'s transmit queue into a pipe.
fn write_some<M: Handshake>(rng: &mut XorShift, from: &mut M, pipe: &mut Vec<u8>) {
    let pending = from.poll_transmit();
    if pending.is_empty() {
        return;
    }
    let n = rng.below(pending.len() + 1);
    pipe.extend_from_slice(&pending[..n]);
    from.handle_transmitted(n);
}

/// Moves at most a random number of bytes, never more than wanted, from a pipe into `to`.
fn read_some<M: Handshake>(rng: &mut XorShift, pipe: &mut Vec<u8>, to: &mut M) {
    let limit = to.input_wanted().min(pipe.len());
    assert!(to.input_wanted() <= MAX_FRAME_LEN);
    if limit == 0 {
        return;
    }
    let n = 1 + rng.below(limit);
    let chunk: Vec<u8> = pipe.drain(..n).collect();
    to.handle_input(&chunk).unwrap();
}

/// Lane `i` of `count` on one end: distinct queue pair numbers and inbound regions.
fn lanes_of(first: EndpointInfo, count: usize) -> Vec<EndpointInfo> {
    (0..count)
        .map(|i| EndpointInfo {
            qpn: first.qpn + i as u32 * 0x100,
            inbound: crate::nic::RemoteRegion {
                addr: first.inbound.addr + i as u64 * 0x1_0000,
                ..first.inbound
            },
            ..first
        })
        .collect()
}

fn pump_pair(seed: u64) {
    pump_lanes(seed, 1, 1);
}

/// A connector of `count` lanes (each message over `width`) and an acceptor pumped against
/// each other; each end must learn every lane of the other, in order.
fn pump_lanes(seed: u64, count: usize, width: usize) {
    assert_eq!(pump_with(seed, count, width, false, false), (false, false));
}

/// [`pump_lanes`] with port failover on or off at each end: what each end concluded.
fn pump_with(
    seed: u64,
    count: usize,
    width: usize,
    c_failover: bool,
    a_failover: bool,
) -> (bool, bool) {
    let mut rng = XorShift(seed | 1);
    let (c_lanes, a_lanes) = (
        lanes_of(connector_local(), count),
        lanes_of(acceptor_local(), count),
    );
    let mut c = Connector::with_options(&handle(), &c_lanes, width, c_failover, T0, TIMEOUT);
    let mut a = Acceptor::new(LISTEN_ID, T0, TIMEOUT).with_failover(a_failover);
    let (mut c_to_a, mut a_to_c) = (Vec::new(), Vec::new());
    let (mut c_events, mut a_events) = (Vec::new(), Vec::new());
    for _ in 0..10_000 {
        write_some(&mut rng, &mut c, &mut c_to_a);
        write_some(&mut rng, &mut a, &mut a_to_c);
        read_some(&mut rng, &mut c_to_a, &mut a);
        read_some(&mut rng, &mut a_to_c, &mut c);
        while let Some(event) = c.poll_event() {
            if let ConnectorEvent::BringUp { .. } = event {
                c.handle_qp_ready().unwrap();
            }
            c_events.push(event);
        }
        while let Some(event) = a.poll_event() {
            if let AcceptorEvent::Request { .. } = event {
                assert_eq!(a.lanes(), Lanes::new(count, width).unwrap());
                assert_eq!(a.remote_lanes(), &c_lanes[..]);
                a.handle_local_lanes_ready(&a_lanes).unwrap();
            }
            a_events.push(event);
        }
        if c.is_established() && a.is_established() {
            break;
        }
    }
    assert!(
        c.is_established() && a.is_established(),
        "seed {seed}: {:?} {:?}",
        c.stage(),
        a.stage()
    );
    assert_eq!(c.remote(), Some(&acceptor_local()));
    assert_eq!(a.remote(), Some(&connector_local()));
    assert_eq!(c.remote_lanes(), &a_lanes[..]);
    assert_eq!(a.remote_lanes(), &c_lanes[..]);
    assert_eq!(
        c_events,
        [
            ConnectorEvent::BringUp {
                remote: acceptor_local()
            },
            ConnectorEvent::Established
        ]
    );
    assert_eq!(
        a_events,
        [
            AcceptorEvent::Request {
                remote: connector_local()
            },
            AcceptorEvent::Established
        ]
    );
    assert!(
        c_to_a.is_empty() && a_to_c.is_empty(),
        "seed {seed}: bytes left in a pipe"
    );
    assert!(c.poll_transmit().is_empty() && a.poll_transmit().is_empty());
    (c.failover(), a.failover())
}

#[test]
fn failover_is_on_only_when_both_ends_have_it() {
    for (c_on, a_on) in [(false, false), (true, false), (false, true), (true, true)] {
        for seed in 0..60 {
            for (count, width) in [(1, 1), (2, 2), (3, 1)] {
                let both = c_on && a_on;
                assert_eq!(
                    pump_with(0x5eed ^ seed, count, width, c_on, a_on),
                    (both, both),
                    "connector {c_on}, acceptor {a_on}, seed {seed}, lanes {count}"
                );
            }
        }
    }
}

#[test]
fn a_request_without_failover_is_byte_for_byte_the_earlier_one() {
    let locals = lanes_of(connector_local(), 2);
    let plain = Connector::with_lanes(&handle(), &locals, 2, T0, TIMEOUT);
    let off = Connector::with_options(&handle(), &locals, 2, false, T0, TIMEOUT);
    let on = Connector::with_options(&handle(), &locals, 2, true, T0, TIMEOUT);
    assert_eq!(plain.poll_transmit(), off.poll_transmit());
    // Byte 27 of the request body, after the 12-byte frame header: 0 without, 1 with.
    assert_eq!(off.poll_transmit()[12 + 27], 0);
    assert_eq!(on.poll_transmit()[12 + 27], 1);
    let mut differing = plain
        .poll_transmit()
        .iter()
        .zip(on.poll_transmit())
        .enumerate()
        .filter(|(_, (a, b))| a != b)
        .map(|(i, _)| i);
    assert_eq!(differing.next(), Some(12 + 27));
    assert_eq!(differing.next(), None, "only the option byte differs");
}

#[test]
fn a_connector_asking_for_failover_waits_for_the_answer_and_refuses_anything_else() {
    let reply = Message::AcceptReply(AcceptReply {
        receiver: acceptor_local(),
    })
    .encode();
    let asking = || {
        let mut c = Connector::with_options(&handle(), &[connector_local()], 1, true, T0, TIMEOUT);
        drain(&mut c);
        assert_eq!(feed(&mut c, &reply), Ok(reply.len()));
        c
    };
    let mut c = asking();
    assert_eq!(c.poll_event(), None, "no bring-up before the answer");
    assert!(!c.failover());
    // Ready in place of the answer is a protocol error.
    assert!(feed(&mut c, &Message::Ready.encode()).is_err());
    assert!(c.error().is_some());
    // The answer "off": brought up without failover.
    let mut c = asking();
    feed(&mut c, &Message::Failover(false).encode()).unwrap();
    assert!(matches!(
        c.poll_event(),
        Some(ConnectorEvent::BringUp { .. })
    ));
    assert!(!c.failover());
    let mut c = asking();
    feed(&mut c, &Message::Failover(true).encode()).unwrap();
    assert!(matches!(
        c.poll_event(),
        Some(ConnectorEvent::BringUp { .. })
    ));
    assert!(c.failover());
}

#[test]
fn pair_pumped_with_random_chunking_establishes() {
    for seed in 0..500 {
        pump_pair(0x9e37_79b9_7f4a_7c15 ^ seed);
    }
}

#[test]
fn pair_with_stale_handle_fails_on_both_ends() {
    let stale = ListenHandle::new("127.0.0.1:40000".parse().unwrap(), LISTEN_ID ^ 1);
    let mut c = Connector::new(&stale, connector_local(), T0, TIMEOUT);
    let mut a = Acceptor::new(LISTEN_ID, T0, TIMEOUT);
    let request = drain(&mut c);
    assert!(feed(&mut a, &request).is_err());
    let reject = drain(&mut a);
    let err = feed(&mut c, &reject).unwrap_err();
    assert_eq!(
        err,
        HandshakeError::Rejected {
            stage: "awaiting accept reply",
            reason: RejectReason::WrongListener
        }
    );
}

#[test]
fn pair_with_lanes_pumped_with_random_chunking_establishes() {
    for (count, width) in [(2, 1), (2, 2), (4, 1), (4, 4), (5, 2), (128, 128)] {
        for seed in 0..40 {
            pump_lanes(0x51a7_e5ee_d000_0000 ^ seed, count, width);
        }
    }
}

#[test]
fn lanes_connect_request_is_followed_by_one_lane_frame_per_further_lane() {
    let locals = lanes_of(connector_local(), 3);
    let mut c = Connector::with_lanes(&handle(), &locals, 3, T0, TIMEOUT);
    let sent = frames(&drain(&mut c));
    assert_eq!(
        sent,
        [
            Message::ConnectRequest(ConnectRequest {
                listen_id: LISTEN_ID,
                rivet_version: RivetVersion::ours(),
                lanes: Lanes::new(3, 3).unwrap(),
                failover: false,
                sender: locals[0],
            }),
            Message::Lane(locals[1]),
            Message::Lane(locals[2]),
        ]
    );
    // The reply alone is not enough: the connector waits for the acceptor's other lanes.
    let remotes = lanes_of(acceptor_local(), 3);
    feed(&mut c, &reply_frame(remotes[0])).unwrap();
    assert_eq!(c.stage(), ConnectorStage::AwaitingReply);
    assert!(c.poll_event().is_none() && c.remote_lanes().is_empty());
    feed(&mut c, &Message::Lane(remotes[1]).encode()).unwrap();
    assert!(c.poll_event().is_none());
    feed(&mut c, &Message::Lane(remotes[2]).encode()).unwrap();
    assert_eq!(
        c.poll_event(),
        Some(ConnectorEvent::BringUp { remote: remotes[0] })
    );
    assert_eq!(c.remote_lanes(), &remotes[..]);
}

#[test]
fn lanes_bad_shape_is_misuse_and_sends_nothing() {
    let locals = lanes_of(connector_local(), 2);
    for (lanes, width) in [(&locals[..0], 1), (&locals[..], 0), (&locals[..], 3)] {
        let mut c = Connector::with_lanes(&handle(), lanes, width, T0, TIMEOUT);
        assert!(matches!(c.error(), Some(HandshakeError::Misuse { .. })));
        assert!(drain(&mut c).is_empty());
    }
    let mut bad = locals.clone();
    bad[1].mtu = 9;
    let c = Connector::with_lanes(&handle(), &bad, 1, T0, TIMEOUT);
    assert!(matches!(
        c.error(),
        Some(HandshakeError::InvalidLocalInfo { .. })
    ));
}

#[test]
fn lanes_acceptor_needs_every_lane_before_the_request_event() {
    let locals = lanes_of(connector_local(), 3);
    let mut c = Connector::with_lanes(&handle(), &locals, 1, T0, TIMEOUT);
    let bytes = drain(&mut c);
    let mut a = Acceptor::new(LISTEN_ID, T0, TIMEOUT);
    let request_len = HEADER_LEN + MessageKind::ConnectRequest.body_len() as usize;
    let lane_len = HEADER_LEN + MessageKind::Lane.body_len() as usize;
    assert_eq!(
        feed(&mut a, &bytes[..request_len + lane_len]),
        Ok(request_len + lane_len)
    );
    assert!(a.poll_event().is_none());
    assert_eq!(a.stage(), AcceptorStage::AwaitingRequest);
    assert!(a.remote_lanes().is_empty());
    // A second connect request where a lane belongs is a protocol error.
    let err = feed(&mut a, &request_frame(LISTEN_ID)).unwrap_err();
    assert!(matches!(err, HandshakeError::Protocol { .. }), "{err:?}");
    // Fed properly, the request event comes with all three lanes; answering with two is misuse.
    let mut a = Acceptor::new(LISTEN_ID, T0, TIMEOUT);
    feed(&mut a, &bytes).unwrap();
    assert_eq!(
        a.poll_event(),
        Some(AcceptorEvent::Request { remote: locals[0] })
    );
    assert_eq!(a.remote_lanes(), &locals[..]);
    let mine = lanes_of(acceptor_local(), 3);
    assert!(matches!(
        a.handle_local_lanes_ready(&mine[..2]),
        Err(HandshakeError::Misuse { .. })
    ));
}

#[test]
fn lanes_link_layer_is_checked_on_every_lane() {
    let locals = lanes_of(connector_local(), 2);
    let mut c = Connector::with_lanes(&handle(), &locals, 2, T0, TIMEOUT);
    drain(&mut c);
    feed(&mut c, &reply_frame(acceptor_local())).unwrap();
    let err = feed(&mut c, &Message::Lane(ib_endpoint()).encode()).unwrap_err();
    assert!(
        matches!(err, HandshakeError::Incompatible { .. }),
        "{err:?}"
    );
    // The acceptor checks its own lanes against the connector's, lane by lane.
    let mut c = Connector::with_lanes(&handle(), &locals, 2, T0, TIMEOUT);
    let mut a = Acceptor::new(LISTEN_ID, T0, TIMEOUT);
    feed(&mut a, &drain(&mut c)).unwrap();
    let mut mine = lanes_of(acceptor_local(), 2);
    mine[1] = ib_endpoint();
    let err = a.handle_local_lanes_ready(&mine).unwrap_err();
    assert!(
        matches!(err, HandshakeError::Incompatible { .. }),
        "{err:?}"
    );
}
