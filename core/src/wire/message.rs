//! Handshake messages and their frames.

use alloc::vec::Vec;
use core::fmt;

use super::bytes::Reader;
use super::{ENDPOINT_INFO_LEN, EndpointInfo, MagicBytes, RivetVersion, WIRE_VERSION, WireError};

/// The magic every frame starts with.
pub const FRAME_MAGIC: [u8; 4] = *b"RVTF";

/// Size of a frame header.
pub const HEADER_LEN: usize = 12;

/// Hard limit on a declared body length: a header declaring more fails at once, before any body
/// byte is read. Every body of this wire version is far smaller (at most 108 bytes).
pub const MAX_BODY_LEN: u32 = 1024;

/// Largest frame: header plus the largest body of this wire version.
pub const MAX_FRAME_LEN: usize = HEADER_LEN + CONNECT_REQUEST_LEN;

const CONNECT_REQUEST_LEN: usize = 28 + ENDPOINT_INFO_LEN;
const REJECT_LEN: usize = 4;
const FAILOVER_LEN: usize = 4;

/// Most queue pairs ("lanes") one connection may have: NCCL's `NCCL_IB_MAX_QPS`, which bounds
/// `NCCL_IB_QPS_PER_CONNECTION` times the ports of a fused device.
pub const MAX_LANES: usize = 128;

/// The kind of a handshake message (byte 6 of the frame header).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MessageKind {
    /// [`ConnectRequest`]: connector to acceptor, first.
    ConnectRequest,
    /// [`AcceptReply`]: acceptor to connector, after the acceptor's QP is ready.
    AcceptReply,
    /// `Ready`: connector to acceptor, after the connector's QP is ready. Last message.
    Ready,
    /// [`Reject`]: either direction, instead of the expected message; ends the handshake.
    Reject,
    /// `Lane`: one more queue pair of a connection with several ([`Lanes`]); the connector
    /// sends `count - 1` of them right after its request, the acceptor right after its reply.
    Lane,
    /// `Failover`: acceptor to connector, after its lanes, only when the request asked for port
    /// failover ([`ConnectRequest::failover`]): whether the acceptor has it on too.
    Failover,
}

impl MessageKind {
    /// The code in the frame header.
    pub fn code(self) -> u8 {
        match self {
            Self::ConnectRequest => 1,
            Self::AcceptReply => 2,
            Self::Ready => 3,
            Self::Reject => 4,
            Self::Lane => 5,
            Self::Failover => 6,
        }
    }

    /// The kind with header code `code`, if there is one.
    pub fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Self::ConnectRequest),
            2 => Some(Self::AcceptReply),
            3 => Some(Self::Ready),
            4 => Some(Self::Reject),
            5 => Some(Self::Lane),
            6 => Some(Self::Failover),
            _ => None,
        }
    }

    /// The exact body length of this kind.
    pub fn body_len(self) -> u32 {
        let len = match self {
            Self::ConnectRequest => CONNECT_REQUEST_LEN,
            Self::AcceptReply | Self::Lane => ENDPOINT_INFO_LEN,
            Self::Ready => 0,
            Self::Reject => REJECT_LEN,
            Self::Failover => FAILOVER_LEN,
        };
        len as u32
    }

    /// The name used in messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::ConnectRequest => "connect request",
            Self::AcceptReply => "accept reply",
            Self::Ready => "ready",
            Self::Reject => "reject",
            Self::Lane => "lane",
            Self::Failover => "failover",
        }
    }
}

impl fmt::Display for MessageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A validated frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// The message kind.
    pub kind: MessageKind,
    /// The body length, always `kind.body_len()`.
    pub body_len: u32,
}

impl FrameHeader {
    /// The header of a frame carrying a `kind` message.
    pub fn new(kind: MessageKind) -> Self {
        Self {
            kind,
            body_len: kind.body_len(),
        }
    }

    /// The encoded header.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0; HEADER_LEN];
        let fields = FRAME_MAGIC
            .into_iter()
            .chain(WIRE_VERSION.to_le_bytes())
            .chain([self.kind.code(), 0])
            .chain(self.body_len.to_le_bytes());
        for (slot, byte) in out.iter_mut().zip(fields) {
            *slot = byte;
        }
        out
    }

    /// Validates as much of a header as `bytes` holds (only the first [`HEADER_LEN`] bytes are
    /// looked at): `Ok(None)` when every byte so far is valid but the header is incomplete, the
    /// header once complete, and an error as soon as a byte is wrong — a bad magic byte, another
    /// wire version, an unknown kind, non-zero flags, a body length above [`MAX_BODY_LEN`] or not
    /// that of the kind.
    pub fn decode_prefix(bytes: &[u8]) -> Result<Option<Self>, WireError> {
        let bytes = bytes.get(..HEADER_LEN).unwrap_or(bytes);
        let magic_len = bytes.len().min(FRAME_MAGIC.len());
        let magic = bytes.get(..magic_len).unwrap_or(&[]);
        if FRAME_MAGIC.get(..magic_len) != Some(magic) {
            return Err(WireError::BadMagic {
                what: "frame header",
                expected: FRAME_MAGIC,
                found: MagicBytes::new(magic),
            });
        }
        let Some(&[v0, v1]) = bytes.get(4..6).and_then(|s| <&[u8; 2]>::try_from(s).ok()) else {
            return Ok(None);
        };
        let version = u16::from_le_bytes([v0, v1]);
        if version != WIRE_VERSION {
            return Err(WireError::VersionMismatch {
                what: "frame header",
                ours: WIRE_VERSION,
                theirs: version,
                their_rivet: None,
            });
        }
        let Some(&code) = bytes.get(6) else {
            return Ok(None);
        };
        let kind = MessageKind::from_code(code).ok_or(WireError::UnknownKind { found: code })?;
        let Some(&flags) = bytes.get(7) else {
            return Ok(None);
        };
        if flags != 0 {
            return Err(WireError::BadField {
                field: "frame flags",
                value: flags.into(),
                expected: "0",
            });
        }
        let Some(Ok(len)) = bytes.get(8..12).map(<[u8; 4]>::try_from) else {
            return Ok(None);
        };
        let declared = u32::from_le_bytes(len);
        if declared > MAX_BODY_LEN {
            return Err(WireError::Oversize {
                declared,
                max: MAX_BODY_LEN,
            });
        }
        if declared != kind.body_len() {
            return Err(WireError::BadLength {
                kind,
                declared,
                expected: kind.body_len(),
            });
        }
        Ok(Some(Self {
            kind,
            body_len: declared,
        }))
    }
}

/// Why a connection was refused, carried by [`Reject`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// The connect request's listen id is not the listener's: the handle is stale or for another
    /// listen comm.
    WrongListener,
    /// The peer's frames carry another wire version.
    WireVersion,
    /// The peer sent bytes that are not a valid message, or a message not allowed at that stage.
    Malformed,
    /// The two ends' ports use different link layers (InfiniBand and Ethernet).
    LinkLayerMismatch,
    /// The rejecting end could not set up its side (QP creation, registration, …).
    SetupFailed,
    /// The rejecting end gave up waiting.
    TimedOut,
}

impl RejectReason {
    /// The code carried on the wire.
    pub fn code(self) -> u16 {
        match self {
            Self::WrongListener => 1,
            Self::WireVersion => 2,
            Self::Malformed => 3,
            Self::LinkLayerMismatch => 4,
            Self::SetupFailed => 5,
            Self::TimedOut => 6,
        }
    }

    /// The reason with wire code `code`, if there is one.
    pub fn from_code(code: u16) -> Option<Self> {
        match code {
            1 => Some(Self::WrongListener),
            2 => Some(Self::WireVersion),
            3 => Some(Self::Malformed),
            4 => Some(Self::LinkLayerMismatch),
            5 => Some(Self::SetupFailed),
            6 => Some(Self::TimedOut),
            _ => None,
        }
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            Self::WrongListener => {
                "wrong listener (the connect handle is stale or names another listen comm)"
            }
            Self::WireVersion => "wire version mismatch (the ranks run different Rivet releases)",
            Self::Malformed => "malformed or unexpected handshake message",
            Self::LinkLayerMismatch => {
                "link layer mismatch (InfiniBand on one end, RoCE on the other)"
            }
            Self::SetupFailed => "the rejecting end failed to set up its queue pair",
            Self::TimedOut => "the rejecting end timed out",
        };
        write!(f, "{text} (code {})", self.code())
    }
}

/// How many queue pairs ("lanes") a connection has, and over how many of them each message is
/// spread (`rivet_core::data::multi`). The connector decides; the acceptor follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lanes {
    count: u8,
    width: u8,
}

impl Lanes {
    /// One queue pair: the connection of every Rivet release before lanes existed.
    pub const ONE: Self = Self { count: 1, width: 1 };

    /// `count` lanes (1..=[`MAX_LANES`]), each message over `width` of them (1..=`count`).
    pub fn new(count: usize, width: usize) -> Option<Self> {
        if !(1..=MAX_LANES).contains(&count) || !(1..=count).contains(&width) {
            return None;
        }
        Some(Self {
            count: count as u8,
            width: width as u8,
        })
    }

    /// Queue pairs of the connection.
    pub fn count(self) -> usize {
        usize::from(self.count)
    }

    /// Queue pairs each message travels on.
    pub fn width(self) -> usize {
        usize::from(self.width)
    }
}

/// First message, connector to acceptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectRequest {
    /// The listen id from the handle; must match the acceptor's.
    pub listen_id: u64,
    /// The connector's Rivet release.
    pub rivet_version: RivetVersion,
    /// The connection's queue pairs; `count - 1` [`Message::Lane`] frames follow the request.
    pub lanes: Lanes,
    /// The connector has port failover on (`NCCL_IB_RESILIENCY_PORT_FAILOVER`): the acceptor
    /// answers with a [`Message::Failover`] after its lanes. Byte 27, bit 0; the byte was
    /// reserved zero before, so a request without failover is byte for byte what earlier
    /// releases of this wire version send (and an earlier acceptor refuses one with it).
    pub failover: bool,
    /// The connector's QP (lane 0) and inbound region.
    pub sender: EndpointInfo,
}

/// Acceptor to connector, once the acceptor's QP is at RTS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcceptReply {
    /// The acceptor's QP and inbound region.
    pub receiver: EndpointInfo,
}

/// Refusal, either direction; the sender closes after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reject {
    /// Why.
    pub reason: RejectReason,
}

/// One handshake message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Message {
    /// See [`ConnectRequest`].
    ConnectRequest(ConnectRequest),
    /// See [`AcceptReply`].
    AcceptReply(AcceptReply),
    /// Connector to acceptor: the connector's QP is at RTS; the acceptor may now write to it.
    Ready,
    /// See [`Reject`].
    Reject(Reject),
    /// One more queue pair of a connection with several: lanes `1..count` in order, each with its
    /// own inbound region.
    Lane(EndpointInfo),
    /// Acceptor to connector, answering a request with failover: whether the acceptor has port
    /// failover on too (both must, for a connection to fail over).
    Failover(bool),
}

impl Message {
    /// This message's kind.
    pub fn kind(&self) -> MessageKind {
        match self {
            Self::ConnectRequest(_) => MessageKind::ConnectRequest,
            Self::AcceptReply(_) => MessageKind::AcceptReply,
            Self::Ready => MessageKind::Ready,
            Self::Reject(_) => MessageKind::Reject,
            Self::Lane(_) => MessageKind::Lane,
            Self::Failover(_) => MessageKind::Failover,
        }
    }

    /// Appends the whole frame (header and body) to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&FrameHeader::new(self.kind()).encode());
        match self {
            Self::ConnectRequest(m) => {
                out.extend_from_slice(&m.listen_id.to_le_bytes());
                out.push(m.rivet_version.wire_len());
                out.extend_from_slice(m.rivet_version.wire_bytes());
                out.extend_from_slice(&[
                    m.lanes.count - 1,
                    m.lanes.width - 1,
                    u8::from(m.failover),
                ]);
                m.sender.encode_into(out);
            }
            Self::AcceptReply(m) => m.receiver.encode_into(out),
            Self::Lane(info) => info.encode_into(out),
            Self::Ready => {}
            Self::Reject(m) => {
                out.extend_from_slice(&m.reason.code().to_le_bytes());
                out.extend_from_slice(&[0; 2]);
            }
            Self::Failover(on) => out.extend_from_slice(&[u8::from(*on), 0, 0, 0]),
        }
    }

    /// The whole frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(MAX_FRAME_LEN);
        self.encode_into(&mut out);
        out
    }

    /// Decodes exactly one frame: header, then a body of exactly the declared length.
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let header = FrameHeader::decode_prefix(bytes)?.ok_or(WireError::Truncated {
            what: "frame header",
            needed: HEADER_LEN,
            found: bytes.len(),
        })?;
        let body = bytes.get(HEADER_LEN..).unwrap_or(&[]);
        let needed = header.body_len as usize;
        if body.len() < needed {
            return Err(WireError::Truncated {
                what: header.kind.name(),
                needed: HEADER_LEN + needed,
                found: bytes.len(),
            });
        }
        Self::decode_body(header, body)
    }

    /// Decodes the body of a frame whose header was already validated; `body` must be exactly
    /// `header.body_len` bytes.
    pub fn decode_body(header: FrameHeader, body: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(body, header.kind.name());
        let message = match header.kind {
            MessageKind::ConnectRequest => {
                let listen_id = r.u64()?;
                let version_len = r.u8()?;
                let rivet_version = RivetVersion::from_wire(version_len, r.array()?)?;
                let count = usize::from(r.u8()?) + 1;
                let width = usize::from(r.u8()?) + 1;
                let lanes = Lanes::new(count, width).ok_or(WireError::BadField {
                    field: "connect request lanes",
                    value: ((count as u64) << 8) | width as u64,
                    expected: "1..=128 lanes, each message over 1..=lanes of them",
                })?;
                let failover = r.flag("connect request options")?;
                let sender = EndpointInfo::read(&mut r)?;
                Self::ConnectRequest(ConnectRequest {
                    listen_id,
                    rivet_version,
                    lanes,
                    failover,
                    sender,
                })
            }
            MessageKind::AcceptReply => Self::AcceptReply(AcceptReply {
                receiver: EndpointInfo::read(&mut r)?,
            }),
            MessageKind::Lane => Self::Lane(EndpointInfo::read(&mut r)?),
            MessageKind::Ready => Self::Ready,
            MessageKind::Reject => {
                let code = r.u16()?;
                let reason = RejectReason::from_code(code).ok_or(WireError::BadField {
                    field: "reject reason",
                    value: code.into(),
                    expected: "a reason code 1..=6",
                })?;
                r.reserved::<2>("reject reserved bytes")?;
                Self::Reject(Reject { reason })
            }
            MessageKind::Failover => {
                let on = r.flag("failover answer")?;
                r.reserved::<3>("failover reserved bytes")?;
                Self::Failover(on)
            }
        };
        r.finish()?;
        Ok(message)
    }
}
