//! Checks every hand-written `repr(C)` layout in `rivet_verbs_ffi::sys` against the system's
//! `<infiniband/verbs.h>`, as computed by bindgen at test time.
//!
//! bindgen writes its layout knowledge as assertions such as
//! `["Offset of field: ibv_qp::qp_num"][::std::mem::offset_of!(ibv_qp, qp_num) - 52usize];`; this test
//! parses those numbers and compares them with `rivet_verbs_ffi::sys::LAYOUTS` (our `size_of` /
//! `offset_of!`). Both directions are checked: each of our fields exists in C at the same offset, and
//! each C field is declared by us (except the aliases listed in `C_ONLY_FIELDS`).
//!
//! Needs `libibverbs-dev` (the header) and `libclang-dev` (for bindgen). Without the header the test
//! fails, unless `RIVET_SKIP_BINDGEN_LAYOUT=1` is set.

use std::collections::BTreeMap;
use std::path::Path;

use rivet_verbs_ffi::sys::{COMPAT_PORT_ATTR_LEN, LAYOUTS, TypeLayout};

const VERBS_H: &str = "/usr/include/infiniband/verbs.h";
const SKIP_ENV: &str = "RIVET_SKIP_BINDGEN_LAYOUT";

/// Our types that are anonymous in C: (our name, C parent as we name it, C field holding it).
const ANONYMOUS_TYPES: &[(&str, &str, &str)] = &[
    ("ibv_send_wr_wr", "ibv_send_wr", "wr"),
    ("ibv_rdma_wr", "ibv_send_wr_wr", "rdma"),
    ("ibv_atomic_wr", "ibv_send_wr_wr", "atomic"),
    ("ibv_ud_wr", "ibv_send_wr_wr", "ud"),
    ("ibv_async_element", "ibv_async_event", "element"),
];

/// Fields we renamed: (type, our field, bindgen field).
const RENAMED_FIELDS: &[(&str, &str, &str)] = &[
    ("ibv_send_wr", "imm_data", "__bindgen_anon_1"),
    ("ibv_send_wr", "xrc_remote_srqn", "qp_type"),
    ("ibv_send_wr", "bind_mw_or_tso", "__bindgen_anon_2"),
    ("ibv_wc", "imm_data", "__bindgen_anon_1"),
];

/// C fields we do not declare because another declared field covers the same bytes.
const C_ONLY_FIELDS: &[(&str, &str)] = &[("ibv_gid", "global")];

/// Fields of ours that older headers lack (the v49+ tail of `ibv_port_attr`).
const NEWER_THAN_HEADER: &[(&str, &str)] = &[("ibv_port_attr", "active_speed_ex")];

#[derive(Debug, Default)]
struct CLayout {
    size: Option<usize>,
    align: Option<usize>,
    fields: BTreeMap<String, usize>,
}

/// Parses bindgen's `["label"][... - Nusize];` layout assertions.
fn parse_layouts(src: &str) -> BTreeMap<String, CLayout> {
    let mut out: BTreeMap<String, CLayout> = BTreeMap::new();
    let mut rest = src;
    while let Some(start) = rest.find("[\"") {
        rest = &rest[start + 2..];
        let Some(end) = rest.find("\"]") else { break };
        let label = &rest[..end];
        rest = &rest[end + 2..];
        // The value closes the next bracket: `... - 52usize]`.
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
        } else if let Some(path) = label.strip_prefix("Offset of field: ") {
            if let Some((ty, field)) = path.split_once("::") {
                out.entry(ty.to_owned())
                    .or_default()
                    .fields
                    .insert(field.to_owned(), value);
            }
        }
    }
    out
}

/// The fields of `pub struct|union ty { ... }` in bindgen's output, in order: (name, type).
fn struct_fields(src: &str, ty: &str) -> Option<Vec<(String, String)>> {
    let start = [format!("pub struct {ty} {{"), format!("pub union {ty} {{")]
        .iter()
        .find_map(|h| src.find(h))?;
    let body = &src[start..];
    let body = &body[body.find('{')? + 1..body.find("\n}")?];
    Some(
        body.lines()
            .filter_map(|line| line.trim().strip_prefix("pub "))
            .filter_map(|decl| {
                let (name, ty) = decl.split_once(": ")?;
                Some((
                    name.trim().to_owned(),
                    ty.trim().trim_end_matches(',').trim().to_owned(),
                ))
            })
            .collect(),
    )
}

/// The bindgen type of `field` in `ty`.
fn field_type(src: &str, ty: &str, field: &str) -> Option<String> {
    struct_fields(src, ty)?
        .into_iter()
        .find(|(name, _)| name == field)
        .map(|(_, t)| t)
}

/// Size and alignment of a bindgen field type: primitives, pointers, and types with layout asserts.
fn type_size_align(c_layouts: &BTreeMap<String, CLayout>, ty: &str) -> Option<(usize, usize)> {
    let base = ty.rsplit("::").next().unwrap_or(ty);
    if ty.starts_with('*') {
        return Some((8, 8));
    }
    match base {
        "u8" | "i8" | "c_char" | "c_uchar" | "c_schar" => Some((1, 1)),
        "u16" | "i16" | "c_ushort" | "c_short" | "__be16" => Some((2, 2)),
        "u32" | "i32" | "c_uint" | "c_int" | "__be32" => Some((4, 4)),
        "u64" | "i64" | "usize" | "isize" | "c_ulong" | "c_long" | "__be64" => Some((8, 8)),
        _ => {
            let c = c_layouts.get(base)?;
            Some((c.size?, c.align?))
        }
    }
}

/// bindgen emits no offset assertion for anonymous members (`__bindgen_anon_N`); derive their
/// offsets from the preceding field's offset and size and the member's own alignment.
fn fill_anonymous_offsets(src: &str, c_layouts: &mut BTreeMap<String, CLayout>) {
    let names: Vec<String> = c_layouts.keys().cloned().collect();
    for ty in names {
        let Some(fields) = struct_fields(src, &ty) else {
            continue;
        };
        let mut previous_end: Option<usize> = Some(0);
        for (name, field_ty) in &fields {
            let known = c_layouts[&ty].fields.get(name).copied();
            let size_align = type_size_align(c_layouts, field_ty);
            let offset = match known {
                Some(off) => Some(off),
                None if name.starts_with("__bindgen_anon_") => match (previous_end, size_align) {
                    (Some(end), Some((_, align))) => Some(end.div_ceil(align) * align),
                    _ => None,
                },
                None => None,
            };
            if let (Some(off), None) = (offset, known) {
                c_layouts
                    .get_mut(&ty)
                    .unwrap()
                    .fields
                    .insert(name.clone(), off);
            }
            previous_end = match (offset, size_align) {
                (Some(off), Some((size, _))) => Some(off + size),
                _ => None,
            };
        }
    }
}

fn generate() -> Option<String> {
    if !Path::new(VERBS_H).exists() {
        if std::env::var(SKIP_ENV).as_deref() == Ok("1") {
            eprintln!("SKIPPED: {VERBS_H} is absent and {SKIP_ENV}=1");
            return None;
        }
        panic!(
            "{VERBS_H} is missing: install libibverbs-dev and libclang-dev to check the FFI layouts \
             (or set {SKIP_ENV}=1 to skip this check on a machine without them)"
        );
    }
    let bindings = bindgen::Builder::default()
        .header(VERBS_H)
        .allowlist_type("ibv_.*")
        .layout_tests(true)
        .generate()
        .unwrap_or_else(|e| {
            panic!("bindgen failed on {VERBS_H} (is libclang-dev installed?): {e}")
        });
    Some(bindings.to_string())
}

/// Resolves our type name to bindgen's, following anonymous members.
fn c_name(src: &str, ours: &str) -> String {
    match ANONYMOUS_TYPES.iter().find(|(name, _, _)| *name == ours) {
        Some((_, parent, field)) => {
            let parent_c = c_name(src, parent);
            field_type(src, &parent_c, field).unwrap_or_else(|| {
                panic!("bindgen output has no field {parent_c}::{field} (for {ours})")
            })
        }
        None => ours.to_owned(),
    }
}

fn check_type(
    src: &str,
    c_layouts: &BTreeMap<String, CLayout>,
    ours: &TypeLayout,
    problems: &mut Vec<String>,
) {
    let c_ty = c_name(src, ours.name);
    let Some(c) = c_layouts.get(&c_ty) else {
        problems.push(format!(
            "{}: bindgen emitted no layout for {c_ty}",
            ours.name
        ));
        return;
    };
    let header_lacks = |field: &str| {
        NEWER_THAN_HEADER.contains(&(ours.name, field)) && !c.fields.contains_key(field)
    };
    let extra_tail = ours.fields.iter().any(|f| header_lacks(f.name));
    match c.size {
        Some(size) if size == ours.size => {}
        // Our struct is the newest (largest) form; an older header's is a prefix of it.
        Some(size) if extra_tail && size < ours.size => {}
        other => problems.push(format!(
            "{}: size {} but C says {other:?}",
            ours.name, ours.size
        )),
    }
    if c.align != Some(ours.align) {
        problems.push(format!(
            "{}: align {} but C says {:?}",
            ours.name, ours.align, c.align
        ));
    }
    let mut covered = Vec::new();
    for f in ours.fields {
        let c_field = RENAMED_FIELDS
            .iter()
            .find(|(t, ours_f, _)| *t == ours.name && *ours_f == f.name)
            .map_or(f.name, |(_, _, c_f)| *c_f);
        match c.fields.get(c_field) {
            Some(&off) if off == f.offset => covered.push(c_field),
            Some(&off) => problems.push(format!(
                "{}::{}: offset {} but C says {off}",
                ours.name, f.name, f.offset
            )),
            None if header_lacks(f.name) => {
                // Must sit past the end of the header's struct.
                if c.size.is_some_and(|s| f.offset < s) {
                    problems.push(format!(
                        "{}::{}: overlaps the header's struct",
                        ours.name, f.name
                    ));
                }
            }
            None => problems.push(format!(
                "{}::{}: no such field ({c_ty}::{c_field}) in C",
                ours.name, f.name
            )),
        }
    }
    for c_field in c.fields.keys() {
        if !covered.contains(&c_field.as_str())
            && !C_ONLY_FIELDS.contains(&(ours.name, c_field.as_str()))
        {
            problems.push(format!(
                "{}: C field {c_ty}::{c_field} is not declared",
                ours.name
            ));
        }
    }
}

#[test]
fn layouts_match_system_verbs_h() {
    let Some(src) = generate() else { return };
    let mut c_layouts = parse_layouts(&src);
    fill_anonymous_offsets(&src, &mut c_layouts);
    assert!(
        c_layouts.len() > 20,
        "parsed only {} layouts from bindgen output",
        c_layouts.len()
    );
    let mut problems = Vec::new();
    for ours in LAYOUTS {
        check_type(&src, &c_layouts, ours, &mut problems);
    }
    // The compat `ibv_query_port` fills the bytes before `port_cap_flags2` (the C header only
    // forward-declares `_compat_ibv_port_attr`, so check the boundary instead).
    let boundary = c_layouts
        .get("ibv_port_attr")
        .and_then(|c| c.fields.get("port_cap_flags2").copied());
    if boundary != Some(COMPAT_PORT_ATTR_LEN) {
        problems.push(format!(
            "ibv_port_attr::port_cap_flags2 at {boundary:?}, expected {COMPAT_PORT_ATTR_LEN}"
        ));
    }
    assert!(
        problems.is_empty(),
        "layout mismatches against {VERBS_H}:\n  {}",
        problems.join("\n  ")
    );
    println!("checked {} types against {VERBS_H}", LAYOUTS.len());
}

#[test]
fn parser_reads_bindgen_assertions() {
    let sample = r#"
    ["Size of ibv_qp"][::std::mem::size_of::<ibv_qp>() - 160usize];
    ["Alignment of ibv_qp"][::std::mem::align_of::<ibv_qp>() - 8usize];
    ["Offset of field: ibv_qp::qp_num"]
        [::std::mem::offset_of!(ibv_qp, qp_num) - 52usize];
    ["Offset of field: ibv_wc::__bindgen_anon_1"][::std::mem::offset_of!(ibv_wc, __bindgen_anon_1) - 24usize];
    "#;
    let parsed = parse_layouts(sample);
    let qp = &parsed["ibv_qp"];
    assert_eq!((qp.size, qp.align), (Some(160), Some(8)));
    assert_eq!(qp.fields["qp_num"], 52);
    assert_eq!(parsed["ibv_wc"].fields["__bindgen_anon_1"], 24);
    let src = "pub struct ibv_wc {\n    pub byte_len: u32,\n    pub __bindgen_anon_1: ibv_wc__bindgen_ty_1,\n    \
               pub qp_num: u32,\n}\n";
    assert_eq!(
        field_type(src, "ibv_wc", "__bindgen_anon_1").as_deref(),
        Some("ibv_wc__bindgen_ty_1")
    );
    assert_eq!(field_type(src, "ibv_wc", "next"), None);
    let mut layouts = parse_layouts(
        r#"["Size of ibv_wc__bindgen_ty_1"][0 - 4usize]; ["Alignment of ibv_wc__bindgen_ty_1"][0 - 4usize];
           ["Offset of field: ibv_wc::byte_len"][0 - 20usize]; ["Offset of field: ibv_wc::qp_num"][0 - 28usize];"#,
    );
    fill_anonymous_offsets(src, &mut layouts);
    assert_eq!(layouts["ibv_wc"].fields["__bindgen_anon_1"], 24);
}

#[test]
fn checker_reports_wrong_offsets_sizes_and_missing_fields() {
    use rivet_verbs_ffi::sys::FieldLayout;
    let src =
        "pub struct ibv_sge {\n    pub addr: u64,\n    pub length: u32,\n    pub lkey: u32,\n}\n";
    let c_layouts = parse_layouts(
        r#"["Size of ibv_sge"][0 - 16usize]; ["Alignment of ibv_sge"][0 - 8usize];
           ["Offset of field: ibv_sge::addr"][0 - 0usize]; ["Offset of field: ibv_sge::length"][0 - 8usize];
           ["Offset of field: ibv_sge::lkey"][0 - 12usize];"#,
    );
    let good = TypeLayout {
        name: "ibv_sge",
        size: 16,
        align: 8,
        fields: &[
            FieldLayout {
                name: "addr",
                offset: 0,
            },
            FieldLayout {
                name: "length",
                offset: 8,
            },
            FieldLayout {
                name: "lkey",
                offset: 12,
            },
        ],
    };
    let mut problems = Vec::new();
    check_type(src, &c_layouts, &good, &mut problems);
    assert!(problems.is_empty(), "{problems:?}");

    let bad = TypeLayout {
        name: "ibv_sge",
        size: 24,
        align: 8,
        fields: &[
            FieldLayout {
                name: "addr",
                offset: 0,
            },
            FieldLayout {
                name: "length",
                offset: 12,
            },
        ],
    };
    check_type(src, &c_layouts, &bad, &mut problems);
    let text = problems.join("\n");
    assert!(text.contains("size 24"), "{text}");
    assert!(
        text.contains("ibv_sge::length: offset 12 but C says 8"),
        "{text}"
    );
    assert!(
        text.contains("C field ibv_sge::lkey is not declared"),
        "{text}"
    );
}
