//! Checks the mlx5 direct path's hand-written layouts against the system `<infiniband/mlx5dv.h>`
//! as bindgen sees it: every `repr(C)` struct in `rivet_verbs_ffi::mlx5::dv::MLX5_LAYOUTS`
//! (size, alignment, every field), the byte offsets the WQE/CQE codecs use, and the value of every
//! mlx5 constant they use.
//!
//! Needs `libibverbs-dev` (the headers) and `libclang-dev`. Without the header the test fails,
//! unless `RIVET_SKIP_BINDGEN_LAYOUT=1` is set (as for `tests/layout.rs`).

use std::collections::BTreeMap;
use std::path::Path;

use rivet_verbs_ffi::mlx5::dv::{self, MLX5_LAYOUTS};
use rivet_verbs_ffi::mlx5::{cqe, wqe};

const MLX5DV_H: &str = "/usr/include/infiniband/mlx5dv.h";
const SKIP_ENV: &str = "RIVET_SKIP_BINDGEN_LAYOUT";

/// Our types that are anonymous in C: (our name, C parent, field holding it).
const ANONYMOUS: &[(&str, &str, &str)] = &[
    ("mlx5dv_qp_wq", "mlx5dv_qp", "sq"),
    ("mlx5dv_qp_bf", "mlx5dv_qp", "bf"),
    ("mlx5dv_obj_pair", "mlx5dv_obj", "qp"),
];

/// Our fields that are the only member we use of an anonymous union ending the C struct:
/// (type, our field, the union's bindgen name). The union's offset is the struct's size minus the
/// union's, and our field must sit at offset 0 inside it.
const TRAILING_UNION_MEMBERS: &[(&str, &str, &str)] =
    &[("mlx5dv_dc_init_attr", "dct_access_key", "__bindgen_anon_1")];

/// Fields of ours that rdma-core 44's header lacks (HEAD's `devx` pair).
const NEWER_THAN_HEADER: &[(&str, &str)] = &[("mlx5dv_obj", "spare")];

#[derive(Debug, Default)]
struct CLayout {
    size: Option<usize>,
    align: Option<usize>,
    fields: BTreeMap<String, usize>,
}

fn generate() -> Option<String> {
    if !Path::new(MLX5DV_H).exists() {
        if std::env::var(SKIP_ENV).as_deref() == Ok("1") {
            eprintln!("SKIPPED: {MLX5DV_H} is absent and {SKIP_ENV}=1");
            return None;
        }
        panic!(
            "{MLX5DV_H} is missing: install libibverbs-dev and libclang-dev (or set {SKIP_ENV}=1)"
        );
    }
    let bindings = bindgen::Builder::default()
        .header(MLX5DV_H)
        .allowlist_type(
            "mlx5dv_qp|mlx5dv_cq|mlx5dv_obj|mlx5dv_qp_init_attr|mlx5dv_dc_init_attr|ibv_qp_init_attr_ex|\
             ibv_rx_hash_conf|mlx5_cqe64|mlx5_err_cqe|mlx5_wqe_ctrl_seg|mlx5_wqe_raddr_seg|mlx5_wqe_data_seg|\
             mlx5_wqe_inl_data_seg",
        )
        .allowlist_var("MLX5_.*|MLX5DV_.*|IBV_QP_INIT_ATTR_PD")
        .allowlist_type("mlx5dv_obj_type|mlx5dv_qp_init_attr_mask|mlx5dv_qp_create_flags|ibv_qp_init_attr_mask")
        .prepend_enum_name(false)
        .layout_tests(true)
        .generate()
        .unwrap_or_else(|e| panic!("bindgen failed on {MLX5DV_H} (is libclang-dev installed?): {e}"));
    Some(bindings.to_string())
}

/// bindgen's `["Size of T"][... - Nusize]` style assertions.
fn parse_layouts(src: &str) -> BTreeMap<String, CLayout> {
    let mut out: BTreeMap<String, CLayout> = BTreeMap::new();
    let mut rest = src;
    while let Some(start) = rest.find("[\"") {
        rest = &rest[start + 2..];
        let Some(end) = rest.find("\"]") else { break };
        let label = &rest[..end];
        rest = &rest[end + 2..];
        let Some(close) = rest.find("usize]") else {
            break;
        };
        let head = &rest[..close];
        let Some(minus) = head.rfind("- ") else {
            continue;
        };
        let Ok(value) = head[minus + 2..].trim().parse::<usize>() else {
            continue;
        };
        if let Some(ty) = label.strip_prefix("Size of ") {
            out.entry(ty.to_owned()).or_default().size = Some(value);
        } else if let Some(ty) = label.strip_prefix("Alignment of ") {
            out.entry(ty.to_owned()).or_default().align = Some(value);
        } else if let Some((ty, field)) = label
            .strip_prefix("Offset of field: ")
            .and_then(|p| p.split_once("::"))
        {
            out.entry(ty.to_owned())
                .or_default()
                .fields
                .insert(field.to_owned(), value);
        }
    }
    out
}

/// `pub const NAME: TYPE = VALUE;` lines.
fn parse_consts(src: &str) -> BTreeMap<String, u64> {
    src.lines()
        .filter_map(|line| {
            let rest = line.trim().strip_prefix("pub const ")?;
            let (name, rest) = rest.split_once(':')?;
            let value = rest.split_once('=')?.1.trim().trim_end_matches(';').trim();
            Some((name.trim().to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// The bindgen type of `parent::field`.
fn field_type(src: &str, parent: &str, field: &str) -> Option<String> {
    let start = src.find(&format!("pub struct {parent} {{"))?;
    let body = &src[start..];
    let body = &body[..body.find("\n}")?];
    body.lines().find_map(|line| {
        let decl = line.trim().strip_prefix("pub ")?;
        let (name, ty) = decl.split_once(": ")?;
        (name.trim() == field).then(|| ty.trim().trim_end_matches(',').to_owned())
    })
}

#[test]
fn mlx5dv_structs_match_the_system_header() {
    let Some(src) = generate() else { return };
    let c = parse_layouts(&src);
    let mut problems = Vec::new();
    for ours in MLX5_LAYOUTS {
        let c_name = ANONYMOUS
            .iter()
            .find(|(name, _, _)| *name == ours.name)
            .map(|(_, parent, field)| {
                field_type(&src, parent, field)
                    .unwrap_or_else(|| panic!("no {parent}::{field} in bindgen output"))
            })
            .unwrap_or_else(|| ours.name.to_owned());
        let Some(layout) = c.get(&c_name) else {
            problems.push(format!("{}: no layout for {c_name}", ours.name));
            continue;
        };
        let newer = |f: &str| NEWER_THAN_HEADER.contains(&(ours.name, f));
        let has_newer_tail = ours
            .fields
            .iter()
            .any(|f| newer(f.name) && !layout.fields.contains_key(f.name));
        match layout.size {
            Some(s) if s == ours.size || (has_newer_tail && s < ours.size) => {}
            other => problems.push(format!(
                "{}: size {} but C says {other:?}",
                ours.name, ours.size
            )),
        }
        if layout.align != Some(ours.align) {
            problems.push(format!(
                "{}: align {} but C says {:?}",
                ours.name, ours.align, layout.align
            ));
        }
        for f in ours.fields {
            if let Some((_, _, anon)) = TRAILING_UNION_MEMBERS
                .iter()
                .find(|(t, field, _)| *t == ours.name && *field == f.name)
            {
                let union_ty = field_type(&src, &c_name, anon).expect("anonymous union");
                let union = &c[&union_ty];
                let at = layout.size.unwrap_or(0) - union.size.unwrap_or(0);
                if at != f.offset || union.fields.get(f.name) != Some(&0) {
                    problems.push(format!(
                        "{}::{}: union member not at {}",
                        ours.name, f.name, f.offset
                    ));
                }
                continue;
            }
            match layout.fields.get(f.name) {
                Some(&off) if off == f.offset => {}
                Some(&off) => problems.push(format!(
                    "{}::{}: offset {} but C says {off}",
                    ours.name, f.name, f.offset
                )),
                None if newer(f.name) => {}
                None => problems.push(format!("{}::{}: not in C", ours.name, f.name)),
            }
        }
        for name in layout.fields.keys() {
            let via_union = TRAILING_UNION_MEMBERS
                .iter()
                .any(|(t, _, anon)| *t == ours.name && anon == name);
            if !via_union && !ours.fields.iter().any(|f| f.name == name) {
                problems.push(format!("{}: C field {name} is not declared", ours.name));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "mismatches against {MLX5DV_H}:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn segment_and_cqe_offsets_match_the_system_header() {
    let Some(src) = generate() else { return };
    let c = parse_layouts(&src);
    let offset = |ty: &str, field: &str| -> usize {
        *c.get(ty)
            .and_then(|l| l.fields.get(field))
            .unwrap_or_else(|| panic!("no offset for {ty}::{field}"))
    };
    let size = |ty: &str| {
        c.get(ty)
            .and_then(|l| l.size)
            .unwrap_or_else(|| panic!("no size for {ty}"))
    };
    // Control segment: the encoder's byte positions.
    assert_eq!(size("mlx5_wqe_ctrl_seg"), 16);
    assert_eq!(offset("mlx5_wqe_ctrl_seg", "opmod_idx_opcode"), 0);
    assert_eq!(offset("mlx5_wqe_ctrl_seg", "qpn_ds"), 4);
    assert_eq!(offset("mlx5_wqe_ctrl_seg", "signature"), 8);
    assert_eq!(offset("mlx5_wqe_ctrl_seg", "dci_stream_channel_id"), 9);
    assert_eq!(offset("mlx5_wqe_ctrl_seg", "fm_ce_se"), 11);
    assert_eq!(offset("mlx5_wqe_ctrl_seg", "imm"), 12);
    assert_eq!(size("mlx5_wqe_raddr_seg"), 16);
    assert_eq!(
        (
            offset("mlx5_wqe_raddr_seg", "raddr"),
            offset("mlx5_wqe_raddr_seg", "rkey"),
            offset("mlx5_wqe_raddr_seg", "reserved")
        ),
        (0, 8, 12)
    );
    assert_eq!(size("mlx5_wqe_data_seg"), 16);
    assert_eq!(
        (
            offset("mlx5_wqe_data_seg", "byte_count"),
            offset("mlx5_wqe_data_seg", "lkey"),
            offset("mlx5_wqe_data_seg", "addr")
        ),
        (0, 4, 8)
    );
    assert_eq!(
        size("mlx5_wqe_inl_data_seg"),
        4,
        "inline bytes follow a 4-byte header"
    );
    // CQE.
    assert_eq!(size("mlx5_cqe64"), cqe::CQE64_LEN);
    for (field, ours) in [
        ("srqn_uidx", cqe::offset::SRQN_UIDX),
        ("imm_inval_pkey", cqe::offset::IMM_INVAL_PKEY),
        ("byte_cnt", cqe::offset::BYTE_CNT),
        ("timestamp", cqe::offset::TIMESTAMP),
        ("sop_drop_qpn", cqe::offset::SOP_DROP_QPN),
        ("wqe_counter", cqe::offset::WQE_COUNTER),
        ("signature", cqe::offset::SIGNATURE),
        ("op_own", cqe::offset::OP_OWN),
    ] {
        assert_eq!(offset("mlx5_cqe64", field), ours, "mlx5_cqe64::{field}");
    }
    // flags_rqpn lives in the anonymous struct of the leading union (which starts at 0).
    let union_ty = field_type(&src, "mlx5_cqe64", "__bindgen_anon_1").expect("leading union");
    let first_field = src[src.find("pub struct mlx5_cqe64 {").unwrap()..]
        .lines()
        .nth(1)
        .map(str::trim)
        .unwrap_or_default()
        .to_owned();
    assert!(
        first_field.starts_with("pub __bindgen_anon_1"),
        "the union leads the CQE: {first_field}"
    );
    let inner = c
        .iter()
        .find(|(name, l)| name.starts_with(&union_ty) && l.fields.contains_key("flags_rqpn"))
        .map(|(_, l)| l.fields["flags_rqpn"])
        .expect("flags_rqpn");
    assert_eq!(inner, cqe::offset::FLAGS_RQPN);
    assert_eq!(size("mlx5_err_cqe"), cqe::CQE64_LEN);
    for (field, ours) in [
        ("vendor_err_synd", cqe::offset::VENDOR_ERR_SYND),
        ("syndrome", cqe::offset::SYNDROME),
        ("s_wqe_opcode_qpn", cqe::offset::SOP_DROP_QPN),
        ("wqe_counter", cqe::offset::WQE_COUNTER),
        ("op_own", cqe::offset::OP_OWN),
    ] {
        assert_eq!(offset("mlx5_err_cqe", field), ours, "mlx5_err_cqe::{field}");
    }
}

#[test]
fn constants_match_the_system_header() {
    let Some(src) = generate() else { return };
    let c = parse_consts(&src);
    let expected: &[(&str, u64)] = &[
        ("MLX5_SEND_WQE_BB", wqe::SEND_WQE_BB as u64),
        ("MLX5_INLINE_SEG", u64::from(wqe::INLINE_SEG)),
        ("MLX5_INVALID_LKEY", u64::from(wqe::INVALID_LKEY)),
        ("MLX5_OPCODE_NOP", u64::from(wqe::opcode::NOP)),
        ("MLX5_OPCODE_RDMA_WRITE", u64::from(wqe::opcode::RDMA_WRITE)),
        (
            "MLX5_OPCODE_RDMA_WRITE_IMM",
            u64::from(wqe::opcode::RDMA_WRITE_IMM),
        ),
        ("MLX5_OPCODE_SEND", u64::from(wqe::opcode::SEND)),
        ("MLX5_OPCODE_SEND_IMM", u64::from(wqe::opcode::SEND_IMM)),
        ("MLX5_OPCODE_RDMA_READ", u64::from(wqe::opcode::RDMA_READ)),
        (
            "MLX5_WQE_CTRL_CQ_UPDATE",
            u64::from(wqe::fm_ce_se::CQ_UPDATE),
        ),
        (
            "MLX5_WQE_CTRL_SOLICITED",
            u64::from(wqe::fm_ce_se::SOLICITED),
        ),
        ("MLX5_WQE_CTRL_FENCE", u64::from(wqe::fm_ce_se::FENCE)),
        ("MLX5_CQE_REQ", u64::from(cqe::opcode::REQ)),
        ("MLX5_CQE_RESP_WR_IMM", u64::from(cqe::opcode::RESP_WR_IMM)),
        ("MLX5_CQE_RESP_SEND", u64::from(cqe::opcode::RESP_SEND)),
        (
            "MLX5_CQE_RESP_SEND_IMM",
            u64::from(cqe::opcode::RESP_SEND_IMM),
        ),
        (
            "MLX5_CQE_RESP_SEND_INV",
            u64::from(cqe::opcode::RESP_SEND_INV),
        ),
        ("MLX5_CQE_RESIZE_CQ", u64::from(cqe::opcode::RESIZE_CQ)),
        ("MLX5_CQE_NO_PACKET", u64::from(cqe::opcode::NO_PACKET)),
        ("MLX5_CQE_SIG_ERR", u64::from(cqe::opcode::SIG_ERR)),
        ("MLX5_CQE_REQ_ERR", u64::from(cqe::opcode::REQ_ERR)),
        ("MLX5_CQE_RESP_ERR", u64::from(cqe::opcode::RESP_ERR)),
        ("MLX5_CQE_INVALID", u64::from(cqe::opcode::INVALID)),
        (
            "MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR",
            u64::from(cqe::syndrome::LOCAL_LENGTH_ERR),
        ),
        (
            "MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR",
            u64::from(cqe::syndrome::LOCAL_QP_OP_ERR),
        ),
        (
            "MLX5_CQE_SYNDROME_LOCAL_PROT_ERR",
            u64::from(cqe::syndrome::LOCAL_PROT_ERR),
        ),
        (
            "MLX5_CQE_SYNDROME_WR_FLUSH_ERR",
            u64::from(cqe::syndrome::WR_FLUSH_ERR),
        ),
        (
            "MLX5_CQE_SYNDROME_MW_BIND_ERR",
            u64::from(cqe::syndrome::MW_BIND_ERR),
        ),
        (
            "MLX5_CQE_SYNDROME_BAD_RESP_ERR",
            u64::from(cqe::syndrome::BAD_RESP_ERR),
        ),
        (
            "MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR",
            u64::from(cqe::syndrome::LOCAL_ACCESS_ERR),
        ),
        (
            "MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR",
            u64::from(cqe::syndrome::REMOTE_INVAL_REQ_ERR),
        ),
        (
            "MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR",
            u64::from(cqe::syndrome::REMOTE_ACCESS_ERR),
        ),
        (
            "MLX5_CQE_SYNDROME_REMOTE_OP_ERR",
            u64::from(cqe::syndrome::REMOTE_OP_ERR),
        ),
        (
            "MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR",
            u64::from(cqe::syndrome::TRANSPORT_RETRY_EXC_ERR),
        ),
        (
            "MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR",
            u64::from(cqe::syndrome::RNR_RETRY_EXC_ERR),
        ),
        (
            "MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR",
            u64::from(cqe::syndrome::REMOTE_ABORTED_ERR),
        ),
        ("MLX5_RCV_DBR", dv::MLX5_RCV_DBR as u64),
        ("MLX5_SND_DBR", dv::MLX5_SND_DBR as u64),
        ("MLX5DV_OBJ_QP", dv::MLX5DV_OBJ_QP),
        ("MLX5DV_OBJ_CQ", dv::MLX5DV_OBJ_CQ),
        (
            "MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS",
            dv::MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS,
        ),
        (
            "MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE",
            u64::from(dv::MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE),
        ),
        ("IBV_QP_INIT_ATTR_PD", u64::from(dv::IBV_QP_INIT_ATTR_PD)),
    ];
    let mut problems = Vec::new();
    for (name, ours) in expected {
        match c.get(*name) {
            Some(v) if v == ours => {}
            other => problems.push(format!("{name}: ours {ours:#x}, C {other:?}")),
        }
    }
    assert!(
        problems.is_empty(),
        "constant mismatches:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn parsers_read_bindgen_output() {
    let src = "pub const MLX5_SND_DBR: _bindgen_ty_18 = 1;\npub struct p {\n    pub sq: p__bindgen_ty_1,\n}\n\
               [\"Size of p\"][0 - 16usize]; [\"Offset of field: p::sq\"][0 - 8usize];";
    assert_eq!(parse_consts(src).get("MLX5_SND_DBR"), Some(&1));
    assert_eq!(
        field_type(src, "p", "sq").as_deref(),
        Some("p__bindgen_ty_1")
    );
    let l = parse_layouts(src);
    assert_eq!((l["p"].size, l["p"].fields["sq"]), (Some(16), 8));
}
