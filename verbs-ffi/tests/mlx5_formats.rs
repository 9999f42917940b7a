//! Golden bytes for every mlx5 segment encoder and the CQE decoder/encoder. The expected bytes are
//! written out by hand from the documented formats (reference verbs-mlx5dv §0, §2.4, §2.7, §2.8),
//! never produced by the code under test.

use rivet_verbs_ffi::mlx5::cqe::{self, Cqe, sw_owns, syndrome_status};
use rivet_verbs_ffi::mlx5::wqe::{
    self, CtrlSeg, RECV_TERMINATOR, ctrl_qpn_ds, ctrl_words, data_seg, data_words, decode_data_seg,
    decode_raddr_seg, fm_ce_se, inline_ds, inline_header, raddr_seg, raddr_words, wqe_bbs,
};

/// Two 64-bit words as the 16 bytes a native store of each writes.
fn unit(words: [u64; 2]) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&words[0].to_ne_bytes());
    out[8..].copy_from_slice(&words[1].to_ne_bytes());
    out
}

#[test]
fn ctrl_segment_write_with_immediate_signaled() {
    let seg = CtrlSeg {
        opmod: 0,
        wqe_index: 0x1234,
        opcode: wqe::opcode::RDMA_WRITE_IMM,
        qpn: 0x00ab_cdef,
        ds: 3,
        fm_ce_se: fm_ce_se::CQ_UPDATE,
        imm: 0x1122_3344u32.to_be_bytes(),
    };
    let golden: [u8; 16] = [
        0x00, 0x12, 0x34, 0x09, // opmod | wqe index 0x1234 | opcode 0x09
        0xab, 0xcd, 0xef, 0x03, // qpn 0xabcdef | ds 3
        0x00, // signature
        0x00, 0x00, // dci stream channel id
        0x08, // fm_ce_se: CQ_UPDATE
        0x11, 0x22, 0x33, 0x44, // immediate, network order
    ];
    assert_eq!(seg.encode(), golden);
    assert_eq!(CtrlSeg::decode(&golden), (seg, [0, 0, 0]));
    let words = ctrl_words(
        0x1234,
        wqe::opcode::RDMA_WRITE_IMM,
        ctrl_qpn_ds(0x00ab_cdef, 3),
        fm_ce_se::CQ_UPDATE,
        0x1122_3344,
    );
    assert_eq!(unit(words), golden, "the word-wise control segment");
    let unsignaled = ctrl_words(0xffff, wqe::opcode::RDMA_WRITE, ctrl_qpn_ds(0x12, 2), 0, 0);
    assert_eq!(
        unit(unsignaled),
        [
            0x00, 0xff, 0xff, 0x08, 0x00, 0x00, 0x12, 0x02, 0, 0, 0, 0, 0, 0, 0, 0
        ]
    );
}

#[test]
fn ctrl_segment_unsignaled_write_and_read() {
    let write = CtrlSeg {
        opmod: 0,
        wqe_index: 0xffff,
        opcode: wqe::opcode::RDMA_WRITE,
        qpn: 0x12,
        ds: 63,
        fm_ce_se: 0,
        imm: [0; 4],
    };
    assert_eq!(
        write.encode(),
        [
            0x00, 0xff, 0xff, 0x08, 0x00, 0x00, 0x12, 0x3f, 0, 0, 0, 0, 0, 0, 0, 0
        ]
    );
    let read = CtrlSeg {
        opcode: wqe::opcode::RDMA_READ,
        wqe_index: 7,
        ds: 3,
        fm_ce_se: fm_ce_se::CQ_UPDATE,
        ..write
    };
    assert_eq!(
        read.encode(),
        [
            0x00, 0x00, 0x07, 0x10, 0x00, 0x00, 0x12, 0x03, 0, 0, 0, 0x08, 0, 0, 0, 0
        ]
    );
}

#[test]
fn opcode_and_flag_values() {
    assert_eq!(
        [
            wqe::opcode::NOP,
            wqe::opcode::RDMA_WRITE,
            wqe::opcode::RDMA_WRITE_IMM,
            wqe::opcode::SEND,
            wqe::opcode::SEND_IMM,
            wqe::opcode::RDMA_READ
        ],
        [0x00, 0x08, 0x09, 0x0a, 0x0b, 0x10]
    );
    assert_eq!(
        [fm_ce_se::CQ_UPDATE, fm_ce_se::SOLICITED, fm_ce_se::FENCE],
        [0x08, 0x02, 0x80]
    );
}

#[test]
fn remote_address_segment() {
    let golden: [u8; 16] = [
        0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // raddr
        0xde, 0xad, 0xbe, 0xef, // rkey
        0x00, 0x00, 0x00, 0x00, // reserved
    ];
    assert_eq!(raddr_seg(0x0102_0304_0506_0708, 0xdead_beef), golden);
    assert_eq!(
        unit(raddr_words(0x0102_0304_0506_0708, 0xdead_beef)),
        golden
    );
    assert_eq!(
        decode_raddr_seg(&golden),
        (0x0102_0304_0506_0708, 0xdead_beef, 0)
    );
}

#[test]
fn data_segment_and_receive_terminator() {
    let golden: [u8; 16] = [
        0x00, 0x00, 0x10, 0x00, // byte_count 4096
        0x12, 0x34, 0x56, 0x78, // lkey
        0x00, 0x00, 0x7f, 0x00, 0x11, 0x22, 0x33, 0x44, // addr
    ];
    assert_eq!(data_seg(4096, 0x1234_5678, 0x0000_7f00_1122_3344), golden);
    assert_eq!(
        unit(data_words(4096, 0x1234_5678, 0x0000_7f00_1122_3344)),
        golden
    );
    assert_eq!(
        decode_data_seg(&golden),
        (4096, 0x1234_5678, 0x0000_7f00_1122_3344)
    );
    // {byte_count 0, lkey MLX5_INVALID_LKEY = 0x100, addr 0}
    assert_eq!(
        RECV_TERMINATOR,
        [0, 0, 0, 0, 0x00, 0x00, 0x01, 0x00, 0, 0, 0, 0, 0, 0, 0, 0]
    );
    assert_eq!(RECV_TERMINATOR, data_seg(0, wqe::INVALID_LKEY, 0));
}

#[test]
fn inline_header_and_sizes() {
    assert_eq!(inline_header(44), [0x80, 0x00, 0x00, 0x2c]);
    assert_eq!(inline_header(220), [0x80, 0x00, 0x00, 0xdc]);
    // header + bytes, padded to 16: 1..=12 bytes fit one unit, 13 need two, 220 need 14.
    assert_eq!(
        [
            inline_ds(1),
            inline_ds(12),
            inline_ds(13),
            inline_ds(28),
            inline_ds(29),
            inline_ds(220),
            inline_ds(256)
        ],
        [1, 1, 2, 2, 3, 14, 17]
    );
    // ds → basic blocks of 64 bytes.
    assert_eq!(
        [
            wqe_bbs(1),
            wqe_bbs(3),
            wqe_bbs(4),
            wqe_bbs(5),
            wqe_bbs(16),
            wqe_bbs(17),
            wqe_bbs(63)
        ],
        [1, 1, 1, 2, 4, 5, 16]
    );
}

/// A responder CQE of an RDMA WRITE WITH IMMEDIATE, byte by byte.
fn golden_resp_wr_imm(owner: bool) -> [u8; 64] {
    let mut b = [0u8; 64];
    b[24..28].copy_from_slice(&[0x00, 0x00, 0x01, 0x23]); // flags_rqpn: source QP 0x123
    b[36..40].copy_from_slice(&[0x52, 0x01, 0x00, 0x07]); // imm_inval_pkey
    b[44..48].copy_from_slice(&[0x00, 0x00, 0x00, 0x08]); // byte_cnt 8
    b[56..60].copy_from_slice(&[0x00, 0x00, 0x01, 0x26]); // sop_drop_qpn: QPN 0x126
    b[60..62].copy_from_slice(&[0x00, 0x05]); // wqe_counter 5
    b[63] = 0x10 | u8::from(owner); // opcode 1 (RESP_WR_IMM) << 4 | owner
    b
}

#[test]
fn cqe_decode_responder_write_with_immediate() {
    let cqe = Cqe::decode(&golden_resp_wr_imm(true));
    assert_eq!(cqe.opcode, cqe::opcode::RESP_WR_IMM);
    assert_eq!(cqe.format, 0);
    assert!(cqe.owner);
    assert_eq!(cqe.src_qp, 0x123);
    assert_eq!(u32::from_be_bytes(cqe.imm), 0x5201_0007);
    assert_eq!(cqe.byte_cnt, 8);
    assert_eq!(cqe.qpn, 0x126);
    assert_eq!(cqe.wqe_counter, 5);
}

#[test]
fn cqe_decode_requester_read_and_error() {
    let mut b = [0u8; 64];
    b[44..48].copy_from_slice(&[0x00, 0x01, 0x00, 0x00]); // byte_cnt 65536
    b[56..60].copy_from_slice(&[0x10, 0x00, 0x01, 0x26]); // WQE opcode RDMA_READ | QPN
    b[60..62].copy_from_slice(&[0x12, 0x34]);
    b[63] = 0x00; // REQ, owner 0
    let cqe = Cqe::decode(&b);
    assert_eq!(
        (
            cqe.opcode,
            cqe.wqe_opcode,
            cqe.qpn,
            cqe.byte_cnt,
            cqe.wqe_counter,
            cqe.owner
        ),
        (
            cqe::opcode::REQ,
            wqe::opcode::RDMA_READ,
            0x126,
            65536,
            0x1234,
            false
        )
    );

    let mut e = [0u8; 64];
    e[54] = 0x42; // vendor_err_synd
    e[55] = 0x13; // syndrome: remote access error
    e[56..60].copy_from_slice(&[0x09, 0x00, 0x01, 0x26]); // s_wqe_opcode_qpn
    e[60..62].copy_from_slice(&[0xff, 0xfe]);
    e[63] = 0xd1; // REQ_ERR (13) << 4 | owner 1
    let cqe = Cqe::decode(&e);
    assert_eq!(cqe.opcode, cqe::opcode::REQ_ERR);
    assert_eq!((cqe.syndrome, cqe.vendor_err), (0x13, 0x42));
    assert_eq!(
        (cqe.wqe_opcode, cqe.qpn, cqe.wqe_counter),
        (0x09, 0x126, 0xfffe)
    );
    assert_eq!(syndrome_status(cqe.syndrome), 10, "IBV_WC_REM_ACCESS_ERR");
}

#[test]
fn cqe_encoder_writes_the_golden_bytes() {
    let resp = Cqe {
        opcode: cqe::opcode::RESP_WR_IMM,
        owner: true,
        src_qp: 0x123,
        imm: [0x52, 0x01, 0x00, 0x07],
        byte_cnt: 8,
        qpn: 0x126,
        wqe_counter: 5,
        ..Cqe::default()
    };
    assert_eq!(resp.encode(), golden_resp_wr_imm(true));
    let err = Cqe {
        opcode: cqe::opcode::RESP_ERR,
        owner: false,
        syndrome: 0x05,
        vendor_err: 0x42,
        qpn: 0x126,
        wqe_counter: 3,
        ..Cqe::default()
    };
    let mut golden = [0u8; 64];
    golden[54] = 0x42;
    golden[55] = 0x05;
    golden[56..60].copy_from_slice(&[0x00, 0x00, 0x01, 0x26]);
    golden[60..62].copy_from_slice(&[0x00, 0x03]);
    golden[63] = 0xe0;
    assert_eq!(err.encode(), golden);
}

#[test]
fn ownership_follows_the_pass_parity() {
    let cnt = 4;
    // Pass 0 (ci 0..4): owner bit 0 is software's; 0xF0 (as the provider initialises) is not.
    assert!(!sw_owns(0xf0, 0, cnt));
    assert!(sw_owns(0x00, 0, cnt));
    assert!(sw_owns(0x10, 3, cnt));
    assert!(!sw_owns(0x01, 3, cnt));
    // Pass 1 (ci 4..8): the bit flips.
    assert!(sw_owns(0x01, 4, cnt));
    assert!(
        !sw_owns(0x00, 4, cnt),
        "last pass's CQE is still hardware-owned"
    );
    assert!(
        !sw_owns(0xf1, 5, cnt),
        "INVALID opcode is never software-owned"
    );
    // Pass 2 flips back.
    assert!(sw_owns(0xd0, 8, cnt));
}

#[test]
fn every_syndrome_maps_like_rdma_core() {
    let table = [
        (0x01, 1),  // LOC_LEN_ERR
        (0x02, 2),  // LOC_QP_OP_ERR
        (0x04, 4),  // LOC_PROT_ERR
        (0x05, 5),  // WR_FLUSH_ERR
        (0x06, 6),  // MW_BIND_ERR
        (0x10, 7),  // BAD_RESP_ERR
        (0x11, 8),  // LOC_ACCESS_ERR
        (0x12, 9),  // REM_INV_REQ_ERR
        (0x13, 10), // REM_ACCESS_ERR
        (0x14, 11), // REM_OP_ERR
        (0x15, 12), // RETRY_EXC_ERR
        (0x16, 13), // RNR_RETRY_EXC_ERR
        (0x22, 16), // REM_ABORT_ERR
        (0x00, 21), // anything else: GENERAL_ERR
        (0x93, 21),
        (0xff, 21),
    ];
    for (syndrome, status) in table {
        assert_eq!(syndrome_status(syndrome), status, "syndrome {syndrome:#x}");
    }
}

#[test]
fn cqe_offsets_match_the_reference() {
    use cqe::offset::*;
    assert_eq!(
        [
            FLAGS_RQPN,
            SRQN_UIDX,
            IMM_INVAL_PKEY,
            BYTE_CNT,
            TIMESTAMP,
            VENDOR_ERR_SYND,
            SYNDROME
        ],
        [24, 32, 36, 44, 48, 54, 55]
    );
    assert_eq!(
        [SOP_DROP_QPN, WQE_COUNTER, SIGNATURE, OP_OWN],
        [56, 60, 62, 63]
    );
}
