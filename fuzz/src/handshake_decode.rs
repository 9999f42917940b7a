//! Every handshake decoder (listen handle, mesh address list, frame header, each message,
//! endpoint info) on
//! arbitrary bytes: never panics, accepts only canonical encodings (re-encoding what it accepted
//! reproduces the input exactly), and values built from the same bytes round-trip through
//! encode → decode exactly when they are valid.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use arbitrary::{Result, Unstructured};
use rivet_core::nic::RemoteRegion;
use rivet_core::wire::{
    AcceptReply, ConnectRequest, DeviceName, EndpointInfo, FrameHeader, HANDLE_LEN, HEADER_LEN,
    Lanes, LinkLayer, ListenHandle, MAX_LANES, MESH_LIST_LEN, MeshList, Message, MessageKind,
    Reject, RejectReason, RivetVersion,
};

/// One run of the target on libFuzzer's bytes.
pub fn check(data: &[u8]) {
    raw_decoders(data);
    let _ = structured_round_trip(&mut Unstructured::new(data));
}

fn raw_decoders(data: &[u8]) {
    if let Ok(handle) = ListenHandle::decode(data) {
        let bytes = handle.encode();
        assert_eq!(
            &bytes[..],
            &data[..HANDLE_LEN],
            "handle decode accepted a non-canonical input"
        );
        assert_eq!(ListenHandle::decode(&bytes), Ok(handle));
    }
    if let Ok(Some(list)) = MeshList::decode(data) {
        let bytes = list.encode();
        assert_eq!(
            &bytes[..],
            &data[..MESH_LIST_LEN],
            "mesh list decode accepted a non-canonical input"
        );
        assert_eq!(MeshList::decode(&bytes), Ok(Some(list)));
    }
    if let Ok(message) = Message::decode(data) {
        assert_eq!(
            message.encode(),
            data,
            "message decode accepted a non-canonical input"
        );
        assert_eq!(Message::decode(&message.encode()), Ok(message));
    }
    if let Ok(info) = EndpointInfo::decode(data) {
        assert_eq!(info.validate(), Ok(()));
        let mut bytes = Vec::new();
        info.encode_into(&mut bytes);
        assert_eq!(
            bytes, data,
            "endpoint decode accepted a non-canonical input"
        );
    }
    header_prefixes_agree(data);
}

/// The incremental header check gives one verdict however the bytes arrive: once a prefix fails,
/// every longer prefix fails the same way; a complete header is reported only at 12 bytes.
fn header_prefixes_agree(data: &[u8]) {
    let mut failed = None;
    for len in 0..=data.len().min(HEADER_LEN) {
        let verdict = FrameHeader::decode_prefix(&data[..len]);
        match (&failed, verdict) {
            (Some(first), verdict) => {
                let Err(err) = verdict else {
                    panic!("prefix {len} accepted after {first:?}")
                };
                // The magic error shows only the bytes seen so far; every other error is identical.
                if !matches!(err, rivet_core::wire::WireError::BadMagic { .. }) {
                    assert_eq!(&err, first);
                }
            }
            (None, Err(err)) => failed = Some(err),
            (None, Ok(Some(header))) => {
                assert_eq!(len, HEADER_LEN);
                assert_eq!(header.body_len, header.kind.body_len());
                assert_eq!(&header.encode()[..], &data[..HEADER_LEN]);
            }
            (None, Ok(None)) => assert!(len < HEADER_LEN),
        }
    }
    if let Ok(message) = Message::decode(data) {
        assert!(failed.is_none());
        assert_eq!(
            FrameHeader::decode_prefix(data)
                .ok()
                .flatten()
                .map(|h| h.kind),
            Some(message.kind())
        );
    }
}

fn endpoint(u: &mut Unstructured<'_>) -> Result<EndpointInfo> {
    let name: &str = u.arbitrary()?;
    let device_name = match DeviceName::new(name) {
        Ok(name) => name,
        Err(_) => DeviceName::new("mlx5_0").expect("constant name is valid"),
    };
    Ok(EndpointInfo {
        gid: u.arbitrary()?,
        lid: u.arbitrary()?,
        port_num: u.arbitrary()?,
        mtu: u.int_in_range(0..=7)?,
        link_layer: if u.arbitrary()? {
            LinkLayer::Infiniband
        } else {
            LinkLayer::Ethernet
        },
        qpn: u.int_in_range(0..=(1 << 24) + 2)?,
        psn: u.int_in_range(0..=(1 << 24) + 2)?,
        inbound: RemoteRegion {
            addr: u.arbitrary()?,
            rkey: u.arbitrary()?,
            len: u.arbitrary()?,
        },
        traffic_class: u.arbitrary()?,
        service_level: u.int_in_range(0..=17)?,
        device_name,
    })
}

fn handle(u: &mut Unstructured<'_>) -> Result<ListenHandle> {
    let port = u.arbitrary()?;
    let addr = if u.arbitrary()? {
        SocketAddr::V4(SocketAddrV4::new(
            Ipv4Addr::from(u.arbitrary::<[u8; 4]>()?),
            port,
        ))
    } else {
        let ip = Ipv6Addr::from(u.arbitrary::<[u8; 16]>()?);
        SocketAddr::V6(SocketAddrV6::new(ip, port, u.arbitrary()?, u.arbitrary()?))
    };
    let mut handle = ListenHandle::new(addr, u.arbitrary()?);
    if let Ok(version) = RivetVersion::new(u.arbitrary()?) {
        handle.rivet_version = version;
    }
    Ok(handle)
}

fn structured_round_trip(u: &mut Unstructured<'_>) -> Result<()> {
    let h = handle(u)?;
    let unspecified = match h.addr.ip() {
        IpAddr::V4(ip) => ip.is_unspecified(),
        IpAddr::V6(ip) => ip.is_unspecified(),
    };
    let decoded = ListenHandle::decode(&h.encode());
    if h.addr.port() != 0 && !unspecified {
        assert_eq!(decoded, Ok(h));
    } else {
        assert!(decoded.is_err());
    }

    let info = endpoint(u)?;
    let mut bytes = Vec::new();
    info.encode_into(&mut bytes);
    match info.validate() {
        Ok(()) => assert_eq!(EndpointInfo::decode(&bytes), Ok(info)),
        Err(err) => assert_eq!(EndpointInfo::decode(&bytes), Err(err)),
    }

    let valid = info.validate().is_ok();
    let message = match u.int_in_range(0..=5)? {
        0 => {
            let count = u.int_in_range(1..=MAX_LANES)?;
            let width = u.int_in_range(1..=count)?;
            Message::ConnectRequest(ConnectRequest {
                listen_id: u.arbitrary()?,
                rivet_version: h.rivet_version,
                lanes: Lanes::new(count, width).expect("count and width in range"),
                failover: u.arbitrary()?,
                sender: info,
            })
        }
        1 => Message::AcceptReply(AcceptReply { receiver: info }),
        2 => Message::Ready,
        3 => Message::Lane(info),
        4 => Message::Failover(u.arbitrary()?),
        _ => {
            let reason = RejectReason::from_code(u.int_in_range(1..=6)?).expect("codes 1..=6");
            Message::Reject(Reject { reason })
        }
    };
    let bytes = message.encode();
    let decoded = Message::decode(&bytes);
    let needs_info = matches!(
        message.kind(),
        MessageKind::ConnectRequest | MessageKind::AcceptReply | MessageKind::Lane
    );
    if valid || !needs_info {
        assert_eq!(decoded, Ok(message));
    } else {
        assert!(decoded.is_err());
    }
    Ok(())
}
