//! Unit tests of the wire formats.

use alloc::string::ToString;
use alloc::vec::Vec;
use core::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use super::crc::crc32c;
use super::*;
use crate::nic::RemoteRegion;

pub(crate) fn roce_endpoint() -> EndpointInfo {
    EndpointInfo {
        gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 7],
        lid: 0,
        port_num: 1,
        mtu: 3,
        link_layer: LinkLayer::Ethernet,
        qpn: 0x00_1234,
        psn: 0x00ab_cdef,
        inbound: RemoteRegion {
            addr: 0x7f00_1000_0000,
            rkey: 0xdead_beef,
            len: 128 * 1024,
        },
        traffic_class: 106,
        service_level: 3,
        device_name: DeviceName::new("rxe0").unwrap(),
    }
}

pub(crate) fn ib_endpoint() -> EndpointInfo {
    EndpointInfo {
        gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8],
        lid: 0x42,
        link_layer: LinkLayer::Infiniband,
        device_name: DeviceName::new("mlx5_0").unwrap(),
        ..roce_endpoint()
    }
}

fn v4_handle() -> ListenHandle {
    ListenHandle::new(
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 7), 43_210)),
        0x0123_4567_89ab_cdef,
    )
}

fn v6_handle() -> ListenHandle {
    ListenHandle::new(
        SocketAddr::V6(SocketAddrV6::new(
            Ipv6Addr::new(0xfe80, 0, 0, 0, 1, 2, 3, 4),
            5000,
            7,
            2,
        )),
        42,
    )
}

/// Rewrites a handle's checksum after a test edited its bytes.
fn reseal(mut bytes: [u8; HANDLE_LEN]) -> [u8; HANDLE_LEN] {
    let crc = crc32c(&bytes[..60]).to_le_bytes();
    bytes[60..].copy_from_slice(&crc);
    bytes
}

fn all_messages() -> [Message; 10] {
    [
        Message::ConnectRequest(ConnectRequest {
            listen_id: 99,
            rivet_version: RivetVersion::ours(),
            lanes: Lanes::ONE,
            failover: false,
            sender: roce_endpoint(),
        }),
        Message::AcceptReply(AcceptReply {
            receiver: ib_endpoint(),
        }),
        Message::Ready,
        Message::Reject(Reject {
            reason: RejectReason::LinkLayerMismatch,
        }),
        Message::Reject(Reject {
            reason: RejectReason::TimedOut,
        }),
        Message::ConnectRequest(ConnectRequest {
            listen_id: 7,
            rivet_version: RivetVersion::ours(),
            lanes: Lanes::new(MAX_LANES, 3).unwrap(),
            failover: false,
            sender: ib_endpoint(),
        }),
        Message::Lane(roce_endpoint()),
        Message::ConnectRequest(ConnectRequest {
            listen_id: 8,
            rivet_version: RivetVersion::ours(),
            lanes: Lanes::new(2, 2).unwrap(),
            failover: true,
            sender: roce_endpoint(),
        }),
        Message::Failover(true),
        Message::Failover(false),
    ]
}

#[test]
fn crc32c_matches_the_standard_check_value() {
    assert_eq!(crc32c(b"123456789"), 0xE306_9283);
}

#[test]
fn handle_round_trips_v4_and_v6() {
    for handle in [v4_handle(), v6_handle()] {
        let bytes = handle.encode();
        assert_eq!(&bytes[..4], b"RVTH");
        assert_eq!(ListenHandle::decode(&bytes), Ok(handle));
        assert_eq!(ListenHandle::decode(&bytes).unwrap().encode(), bytes);
    }
}

#[test]
fn handle_decode_ignores_the_drivers_half_of_ncclhandle() {
    let mut nccl = [0xa5u8; 128];
    nccl[..HANDLE_LEN].copy_from_slice(&v4_handle().encode());
    assert_eq!(ListenHandle::decode(&nccl), Ok(v4_handle()));
    nccl[100] ^= 0xff;
    assert_eq!(ListenHandle::decode(&nccl), Ok(v4_handle()));
}

#[test]
fn handle_truncated_is_rejected() {
    let bytes = v4_handle().encode();
    assert_eq!(
        ListenHandle::decode(&bytes[..63]),
        Err(WireError::Truncated {
            what: "listen handle",
            needed: 64,
            found: 63
        })
    );
    assert!(ListenHandle::decode(&[]).is_err());
}

#[test]
fn handle_every_bit_flip_is_rejected() {
    let bytes = v6_handle().encode();
    for i in 0..HANDLE_LEN * 8 {
        let mut bad = bytes;
        bad[i / 8] ^= 1 << (i % 8);
        assert!(
            ListenHandle::decode(&bad).is_err(),
            "bit {i} flipped was accepted"
        );
    }
}

#[test]
fn handle_bad_magic_shows_what_was_found() {
    let mut bytes = v4_handle().encode();
    bytes[..4].copy_from_slice(b"NCCL");
    let err = ListenHandle::decode(&bytes).unwrap_err();
    assert!(matches!(
        err,
        WireError::BadMagic {
            what: "listen handle",
            ..
        }
    ));
    let text = err.to_string();
    assert!(text.contains("NCCL") && text.contains("RVTH"), "{text}");
}

#[test]
fn handle_corruption_is_a_checksum_error() {
    let mut bytes = v4_handle().encode();
    bytes[30] ^= 0x10;
    assert!(matches!(
        ListenHandle::decode(&bytes),
        Err(WireError::BadChecksum { .. })
    ));
}

#[test]
fn handle_newer_version_names_their_rivet_release() {
    let mut bytes = v4_handle().encode();
    bytes[4..6].copy_from_slice(&4u16.to_le_bytes());
    bytes[6] = 5;
    bytes[7..23].copy_from_slice(b"9.8.7\0\0\0\0\0\0\0\0\0\0\0");
    let err = ListenHandle::decode(&reseal(bytes)).unwrap_err();
    assert_eq!(
        err,
        WireError::VersionMismatch {
            what: "listen handle",
            ours: 3,
            theirs: 4,
            their_rivet: Some(RivetVersion::new("9.8.7").unwrap()),
        }
    );
    let text = err.to_string();
    assert!(text.contains("version 4 (newer, Rivet 9.8.7)"), "{text}");
    assert!(text.contains("we speak version 3"), "{text}");
}

#[test]
fn handle_older_version_with_unreadable_release_says_older() {
    let mut bytes = v4_handle().encode();
    bytes[4..6].copy_from_slice(&0u16.to_le_bytes());
    bytes[6] = 0;
    let err = ListenHandle::decode(&reseal(bytes)).unwrap_err();
    assert!(
        matches!(
            err,
            WireError::VersionMismatch {
                theirs: 0,
                their_rivet: None,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("older"));
}

#[test]
fn handle_invalid_fields_are_named() {
    let cases: [(usize, u8, &str); 5] = [
        (23, 5, "address family"),
        (42, 1, "listen handle reserved bytes"),
        (30, 1, "IPv4 handle padding"),
        (44, 1, "IPv4 handle padding"),
        (6, 17, "Rivet version length"),
    ];
    for (offset, value, field) in cases {
        let mut bytes = v4_handle().encode();
        bytes[offset] = value;
        match ListenHandle::decode(&reseal(bytes)) {
            Err(WireError::BadField { field: f, .. }) => assert_eq!(f, field, "offset {offset}"),
            other => panic!("offset {offset}: {other:?}"),
        }
    }
}

#[test]
fn handle_port_zero_and_unspecified_address_are_rejected() {
    let zero_port = ListenHandle::new("10.0.0.1:0".parse().unwrap(), 1).encode();
    assert!(matches!(
        ListenHandle::decode(&zero_port),
        Err(WireError::BadField { field: "port", .. })
    ));
    for addr in ["0.0.0.0:80", "[::]:80"] {
        let bytes = ListenHandle::new(addr.parse().unwrap(), 1).encode();
        assert!(matches!(
            ListenHandle::decode(&bytes),
            Err(WireError::BadField {
                field: "IP address",
                ..
            })
        ));
    }
}

#[test]
fn messages_round_trip() {
    for message in all_messages() {
        let bytes = message.encode();
        assert_eq!(bytes.len(), HEADER_LEN + message.kind().body_len() as usize);
        assert_eq!(Message::decode(&bytes), Ok(message));
        assert_eq!(Message::decode(&bytes).unwrap().encode(), bytes);
    }
}

#[test]
fn message_trailing_bytes_are_rejected() {
    for message in all_messages() {
        let mut bytes = message.encode();
        bytes.push(0);
        assert_eq!(
            Message::decode(&bytes),
            Err(WireError::TrailingBytes {
                what: message.kind().name(),
                extra: 1
            })
        );
    }
}

#[test]
fn message_every_truncation_is_rejected() {
    for message in all_messages() {
        let bytes = message.encode();
        for len in 0..bytes.len() {
            assert!(
                matches!(
                    Message::decode(&bytes[..len]),
                    Err(WireError::Truncated { .. })
                ),
                "{message:?} cut to {len}"
            );
        }
    }
}

#[test]
fn header_prefix_fails_on_first_wrong_magic_byte() {
    assert_eq!(FrameHeader::decode_prefix(b"RV"), Ok(None));
    let err = FrameHeader::decode_prefix(b"G").unwrap_err();
    assert!(matches!(
        err,
        WireError::BadMagic {
            what: "frame header",
            ..
        }
    ));
    assert!(err.to_string().contains("found 0x47 \"G\""), "{err}");
}

#[test]
fn header_prefix_fails_on_version_before_the_rest() {
    let mut header = FrameHeader::new(MessageKind::Ready).encode();
    header[4..6].copy_from_slice(&7u16.to_le_bytes());
    let err = FrameHeader::decode_prefix(&header[..6]).unwrap_err();
    assert_eq!(
        err,
        WireError::VersionMismatch {
            what: "frame header",
            ours: 3,
            theirs: 7,
            their_rivet: None
        }
    );
}

#[test]
fn header_unknown_kind_flags_oversize_and_bad_length_are_rejected() {
    let base = FrameHeader::new(MessageKind::AcceptReply).encode();
    let mut unknown = base;
    unknown[6] = 9;
    assert_eq!(
        FrameHeader::decode_prefix(&unknown[..7]),
        Err(WireError::UnknownKind { found: 9 })
    );
    let mut flags = base;
    flags[7] = 0x80;
    assert!(matches!(
        FrameHeader::decode_prefix(&flags),
        Err(WireError::BadField {
            field: "frame flags",
            value: 0x80,
            ..
        })
    ));
    let mut oversize = base;
    oversize[8..].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(
        FrameHeader::decode_prefix(&oversize),
        Err(WireError::Oversize {
            declared: u32::MAX,
            max: MAX_BODY_LEN
        })
    );
    let mut short = base;
    short[8..].copy_from_slice(&79u32.to_le_bytes());
    assert_eq!(
        FrameHeader::decode_prefix(&short),
        Err(WireError::BadLength {
            kind: MessageKind::AcceptReply,
            declared: 79,
            expected: 80
        })
    );
}

/// Offsets inside an AcceptReply frame of each endpoint field, with a bad value for it and the
/// field name the error must carry.
const ENDPOINT_FIELD_CASES: [(usize, &[u8], &str); 14] = [
    (16, &[0, 0], "lid"),
    (16, &[0, 0xc0], "lid"),
    (18, &[0], "port number"),
    (18, &[255], "port number"),
    (19, &[0], "mtu"),
    (19, &[6], "mtu"),
    (20, &[3], "link layer"),
    (22, &[16], "service level"),
    (23, &[33], "device name length"),
    (24, &[0, 0, 0, 1], "qpn"),
    (28, &[0, 0, 0, 1], "psn"),
    (44, &[0, 0, 0, 0], "inbound region length"),
    (48, b" ", "device name byte"),
    (79, b"x", "device name padding"),
];

#[test]
fn endpoint_every_invalid_field_is_named() {
    let good = Message::AcceptReply(AcceptReply {
        receiver: ib_endpoint(),
    })
    .encode();
    for (offset, value, field) in ENDPOINT_FIELD_CASES {
        let mut bytes = good.clone();
        bytes[HEADER_LEN + offset..HEADER_LEN + offset + value.len()].copy_from_slice(value);
        match Message::decode(&bytes) {
            Err(err @ WireError::BadField { field: f, .. }) => {
                assert_eq!(f, field, "offset {offset}");
                assert!(err.to_string().contains(field));
            }
            other => panic!("offset {offset} field {field}: {other:?}"),
        }
    }
}

#[test]
fn endpoint_roce_needs_zero_lid_and_a_gid() {
    let mut info = roce_endpoint();
    info.lid = 1;
    assert!(matches!(
        info.validate(),
        Err(WireError::BadField { field: "lid", .. })
    ));
    let mut info = roce_endpoint();
    info.gid = [0; 16];
    assert!(matches!(
        info.validate(),
        Err(WireError::BadField { field: "gid", .. })
    ));
}

#[test]
fn endpoint_inbound_region_must_not_wrap() {
    let mut info = roce_endpoint();
    info.inbound.addr = u64::MAX - 10;
    assert!(matches!(
        info.validate(),
        Err(WireError::BadField {
            field: "inbound region address",
            ..
        })
    ));
}

#[test]
fn endpoint_decode_round_trips_alone() {
    let mut bytes = Vec::new();
    roce_endpoint().encode_into(&mut bytes);
    assert_eq!(bytes.len(), ENDPOINT_INFO_LEN);
    assert_eq!(EndpointInfo::decode(&bytes), Ok(roce_endpoint()));
    bytes.push(0);
    assert!(matches!(
        EndpointInfo::decode(&bytes),
        Err(WireError::TrailingBytes { .. })
    ));
}

#[test]
fn connect_request_reserved_bytes_and_bad_version_string_are_rejected() {
    let good = all_messages()[0].encode();
    // Byte 27: the options (bit 0 failover); any other bit is refused.
    let mut options = good.clone();
    options[HEADER_LEN + 27] = 1;
    assert!(matches!(
        Message::decode(&options),
        Ok(Message::ConnectRequest(ConnectRequest {
            failover: true,
            ..
        }))
    ));
    for bad in [2u8, 3, 0x80] {
        options[HEADER_LEN + 27] = bad;
        assert!(matches!(
            Message::decode(&options),
            Err(WireError::BadField {
                field: "connect request options",
                ..
            })
        ));
    }
    // The failover answer: 0 or 1, then three zero bytes.
    let answer = Message::Failover(true).encode();
    for (at, value) in [(0, 2u8), (1, 1), (3, 9)] {
        let mut bad = answer.clone();
        bad[HEADER_LEN + at] = value;
        assert!(Message::decode(&bad).is_err(), "byte {at} = {value}");
    }
    // Lanes: count 1..=128 (byte 25 holds count - 1), width 1..=count (byte 26 holds width - 1).
    for (count_byte, width_byte, ok) in [
        (0, 0, true),
        (0, 1, false),
        (127, 127, true),
        (127, 128, false),
        (128, 0, false),
        (255, 0, false),
        (3, 2, true),
        (3, 4, false),
    ] {
        let mut lanes = good.clone();
        lanes[HEADER_LEN + 25] = count_byte;
        lanes[HEADER_LEN + 26] = width_byte;
        let decoded = Message::decode(&lanes);
        match decoded {
            Ok(Message::ConnectRequest(request)) => {
                assert!(ok, "{count_byte} {width_byte} accepted");
                assert_eq!(request.lanes.count(), usize::from(count_byte) + 1);
                assert_eq!(request.lanes.width(), usize::from(width_byte) + 1);
            }
            other => {
                assert!(!ok, "{count_byte} {width_byte}: {other:?}");
                assert!(matches!(
                    other,
                    Err(WireError::BadField {
                        field: "connect request lanes",
                        ..
                    })
                ));
            }
        }
    }
    let mut version = good;
    version[HEADER_LEN + 9] = 0x07;
    assert!(matches!(
        Message::decode(&version),
        Err(WireError::BadField {
            field: "Rivet version byte",
            ..
        })
    ));
}

#[test]
fn reject_unknown_reason_is_rejected() {
    let mut bytes = Message::Reject(Reject {
        reason: RejectReason::Malformed,
    })
    .encode();
    bytes[HEADER_LEN] = 0;
    assert!(matches!(
        Message::decode(&bytes),
        Err(WireError::BadField {
            field: "reject reason",
            value: 0,
            ..
        })
    ));
    for code in 1..=6 {
        assert_eq!(
            RejectReason::from_code(code).map(RejectReason::code),
            Some(code)
        );
    }
}

#[test]
fn short_ascii_rejects_empty_long_and_unprintable() {
    assert!(DeviceName::new("").is_err());
    assert!(DeviceName::new(&"x".repeat(33)).is_err());
    assert!(DeviceName::new("mlx5 0").is_err());
    assert!(DeviceName::new("mlx5_\u{e9}").is_err());
    assert_eq!(DeviceName::new(&"x".repeat(32)).unwrap().as_str().len(), 32);
    assert_eq!(RivetVersion::ours().as_str(), env!("CARGO_PKG_VERSION"));
}

/// The committed fuzz seeds are valid encodings of this wire version (regenerate them with
/// `RIVET_WRITE_SEEDS=1 cargo test -p rivet-core write_fuzz_seeds -- --ignored`).
#[test]
fn committed_fuzz_seeds_decode() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fuzz/seeds/handshake_decode"
    );
    let handle = std::fs::read(alloc::format!("{dir}/handle_v4.bin")).unwrap();
    assert_eq!(ListenHandle::decode(&handle), Ok(v4_handle()));
    let handle = std::fs::read(alloc::format!("{dir}/handle_v6.bin")).unwrap();
    assert_eq!(ListenHandle::decode(&handle), Ok(v6_handle()));
    for (name, message) in seed_messages() {
        let bytes = std::fs::read(alloc::format!("{dir}/{name}.bin")).unwrap();
        assert_eq!(Message::decode(&bytes), Ok(message), "{name}");
    }
}

fn seed_messages() -> [(&'static str, Message); 8] {
    let [
        request,
        reply,
        ready,
        reject,
        _,
        lanes_request,
        lane,
        failover_request,
        failover,
        _,
    ] = all_messages();
    [
        ("connect_request", request),
        ("accept_reply", reply),
        ("ready", ready),
        ("reject", reject),
        ("connect_request_lanes", lanes_request),
        ("lane", lane),
        ("connect_request_failover", failover_request),
        ("failover", failover),
    ]
}

#[test]
#[ignore = "writes the fuzz seed files; run by hand after a format change"]
fn write_fuzz_seeds() {
    if std::env::var_os("RIVET_WRITE_SEEDS").is_none() {
        return;
    }
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fuzz/seeds/handshake_decode"
    );
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(alloc::format!("{dir}/handle_v4.bin"), v4_handle().encode()).unwrap();
    std::fs::write(alloc::format!("{dir}/handle_v6.bin"), v6_handle().encode()).unwrap();
    for (name, message) in seed_messages() {
        std::fs::write(alloc::format!("{dir}/{name}.bin"), message.encode()).unwrap();
    }
}
