//! The plugin's module graph: no module imports from a higher layer, and no import cycle.
//!
//! The layer order is the table in the crate docs (`plugin/src/lib.rs`, section "Layers"): one
//! row per layer, bottom first, naming modules in backticks. This test reads that table and every
//! `plugin/src/**/*.rs`, collects the modules each file refers to (`use crate::…`, `use super::…`,
//! `use self::…`, a `use` of a child module, and `crate::…`/`super::…` paths written inline),
//! and fails on
//! - a module no layer row names,
//! - an import of a module in a higher layer (or of the crate root, which only declares modules
//!   and re-exports), and
//! - a cycle among the modules (two modules importing each other, directly or round a circle).
//!
//! A module is a file or an inline `mod name { … }` inside one (checked as a module of its own:
//! `backend/endpoint.rs` holds `endpoint::region` and `endpoint::any`). Every `mod tests { … }`
//! block is left out: unit tests may reach anywhere. Test-only files are checked like the rest.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
mod common;

use common::{rust_files, src_dir};
use std::path::Path;

type ModPath = Vec<String>;

fn name(m: &[String]) -> String {
    if m.is_empty() {
        "crate".to_owned()
    } else {
        m.join("::")
    }
}

/// `src/lib.rs` → [], `src/comm/mod.rs` → [comm], `src/comm/data.rs` → [comm, data].
fn module_path(src: &Path, file: &Path) -> ModPath {
    let rel = file.strip_prefix(src).expect("under src");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("file name");
    match last.as_str() {
        "lib.rs" | "mod.rs" => {}
        other => parts.push(other.trim_end_matches(".rs").to_owned()),
    }
    parts
}

/// The file's code without comments.
fn code_of(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let code = match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        };
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// Where the block opened by the `{` at `open` closes (string and brace-character literals
/// skipped), or the end of `s`.
fn block_end(s: &[u8], open: usize) -> usize {
    let mut depth = 0usize;
    let mut i = open;
    while i < s.len() {
        match s[i] {
            b'"' => {
                i += 1;
                while i < s.len() && s[i] != b'"' {
                    i += if s[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'\'' if s.get(i + 2) == Some(&b'\'') => i += 2,
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    s.len()
}

/// `code` (comments already out) split into its modules: the file's own code first, then each
/// inline `mod name { … }` as a module of its own under `module` (a file may hold several, e.g.
/// `backend/endpoint.rs`). Every `mod tests { … }` block is left out: unit tests may reach
/// anywhere.
fn modules_in(module: &ModPath, code: &str) -> Vec<(ModPath, String)> {
    let s = code.as_bytes();
    let mut own = String::new();
    let mut inner = Vec::new();
    let mut copied = 0;
    let mut search = 0;
    while let Some(found) = code[search..].find("mod ") {
        let at = search + found;
        search = at + 4;
        if at > 0 && is_ident(s[at - 1]) {
            continue;
        }
        let mut i = at + 4;
        skip_ws(s, &mut i);
        let start = i;
        while i < s.len() && is_ident(s[i]) {
            i += 1;
        }
        let name = &code[start..i];
        skip_ws(s, &mut i);
        if name.is_empty() || s.get(i) != Some(&b'{') {
            continue; // `mod name;`: a file of its own
        }
        let end = block_end(s, i);
        own.push_str(&code[copied..at]);
        copied = end;
        search = end;
        if name != "tests" {
            let mut child = module.clone();
            child.push(name.to_owned());
            inner.extend(modules_in(&child, &code[i + 1..end - 1]));
        }
    }
    own.push_str(&code[copied..]);
    let mut out = vec![(module.clone(), own)];
    out.extend(inner);
    out
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

fn skip_ws(s: &[u8], i: &mut usize) {
    while *i < s.len() && s[*i].is_ascii_whitespace() {
        *i += 1;
    }
}

/// Parse a path or use tree at `i` (`a::b`, `a::{b, c::d}`, `a::*`), appending every full path.
fn parse_tree(s: &[u8], i: &mut usize, mut prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    loop {
        skip_ws(s, i);
        if *i < s.len() && s[*i] == b'{' {
            *i += 1;
            loop {
                skip_ws(s, i);
                if *i >= s.len() {
                    return;
                }
                if s[*i] == b'}' {
                    *i += 1;
                    return;
                }
                let before = *i;
                parse_tree(s, i, prefix.clone(), out);
                skip_ws(s, i);
                // Step over the comma, or over a byte the parser could not use (no endless loop).
                if *i < s.len() && (s[*i] == b',' || *i == before) {
                    *i += 1;
                }
            }
        }
        let start = *i;
        while *i < s.len() && is_ident(s[*i]) {
            *i += 1;
        }
        if *i == start {
            out.push(prefix);
            return;
        }
        prefix.push(String::from_utf8_lossy(&s[start..*i]).into_owned());
        skip_ws(s, i);
        if s[*i..].starts_with(b"::") {
            *i += 2;
        } else {
            out.push(prefix);
            return;
        }
    }
}

/// Every path in `code` that can name a module of this crate.
fn paths_in(code: &str) -> Vec<Vec<String>> {
    let s = code.as_bytes();
    let mut out = Vec::new();
    for (at, _) in code.match_indices("::") {
        // The start of the identifier before this `::`.
        let mut start = at;
        while start > 0 && is_ident(s[start - 1]) {
            start -= 1;
        }
        let first = &code[start..at];
        if !matches!(first, "crate" | "super" | "self") {
            continue;
        }
        // Only the first segment of a path (not `a::super::`).
        if start >= 2 && &code[start - 2..start] == "::" {
            continue;
        }
        let mut i = start;
        parse_tree(s, &mut i, Vec::new(), &mut out);
    }
    // `use child::…` (2018 relative paths) and `use {…}` trees that do not start with a keyword.
    for (at, _) in code.match_indices("use ") {
        if at > 0 && is_ident(s[at - 1]) {
            continue;
        }
        let mut i = at + 4;
        parse_tree(s, &mut i, vec!["<rel>".to_owned()], &mut out);
    }
    out
}

/// The module a path refers to, seen from module `from` (`None` for other crates).
fn resolve(from: &ModPath, path: &[String], modules: &BTreeSet<ModPath>) -> Option<ModPath> {
    let mut rest: Vec<String> = path.to_vec();
    let mut base: ModPath;
    match rest.first().map(String::as_str) {
        Some("<rel>") => {
            rest.remove(0);
            match rest.first().map(String::as_str) {
                Some("crate" | "super" | "self") => return None, // found by the first scan
                Some(child) => {
                    let mut candidate = from.clone();
                    candidate.push(child.to_owned());
                    if !modules.contains(&candidate) {
                        return None;
                    }
                    base = from.clone();
                }
                None => return None,
            }
        }
        Some("crate") => {
            rest.remove(0);
            base = Vec::new();
        }
        Some("self") => {
            rest.remove(0);
            base = from.clone();
        }
        Some("super") => {
            base = from.clone();
            while rest.first().is_some_and(|s| s == "super") {
                rest.remove(0);
                base.pop()?;
            }
        }
        _ => return None,
    }
    let mut best = base.clone();
    for seg in rest {
        if seg == "self" {
            break;
        }
        base.push(seg);
        if modules.contains(&base) {
            best = base.clone();
        } else {
            break;
        }
    }
    Some(best)
}

/// The layer table from the crate docs: module name (e.g. `comm::mr`) → layer, bottom = 0.
fn layers(lib: &str) -> BTreeMap<ModPath, usize> {
    let mut table = BTreeMap::new();
    let mut in_section = false;
    let mut layer = 0;
    for line in lib.lines() {
        let Some(doc) = line.strip_prefix("//!") else {
            continue;
        };
        let doc = doc.trim();
        if doc.starts_with("## ") {
            in_section = doc == "## Layers";
            continue;
        }
        if !in_section || !doc.starts_with('|') || doc.starts_with("|-") || doc.contains("---") {
            continue;
        }
        let cells: Vec<&str> = doc.split('|').collect();
        let Some(modules) = cells.get(2) else {
            continue;
        };
        if cells[1].trim().parse::<usize>().is_err() {
            continue; // the header row
        }
        for (k, chunk) in modules.split('`').enumerate() {
            if k % 2 == 1 {
                table.insert(chunk.split("::").map(str::to_owned).collect(), layer);
            }
        }
        layer += 1;
    }
    table
}

fn layer_of(m: &ModPath, table: &BTreeMap<ModPath, usize>) -> Option<usize> {
    (0..=m.len())
        .rev()
        .find_map(|n| table.get(&m[..n].to_vec()).copied())
}

struct Graph {
    edges: BTreeMap<ModPath, BTreeSet<ModPath>>,
}

fn graph(src: &Path) -> Graph {
    let mut chunks = Vec::new();
    for file in rust_files(src) {
        let code = code_of(&std::fs::read_to_string(&file).expect("read source"));
        chunks.extend(modules_in(&module_path(src, &file), &code));
    }
    let modules: BTreeSet<ModPath> = chunks.iter().map(|(m, _)| m.clone()).collect();
    let mut edges = BTreeMap::new();
    for (from, code) in chunks {
        let targets: BTreeSet<ModPath> = paths_in(&code)
            .iter()
            .filter_map(|p| resolve(&from, p, &modules))
            .filter(|t| *t != from)
            .collect();
        edges.insert(from, targets);
    }
    Graph { edges }
}

fn cycles(g: &Graph) -> Vec<Vec<ModPath>> {
    // Tarjan, recursive: the graph has a few dozen nodes.
    struct State<'a> {
        g: &'a Graph,
        index: BTreeMap<&'a ModPath, usize>,
        low: BTreeMap<&'a ModPath, usize>,
        stack: Vec<&'a ModPath>,
        on_stack: BTreeSet<&'a ModPath>,
        next: usize,
        out: Vec<Vec<ModPath>>,
    }
    fn visit<'a>(st: &mut State<'a>, v: &'a ModPath) {
        st.index.insert(v, st.next);
        st.low.insert(v, st.next);
        st.next += 1;
        st.stack.push(v);
        st.on_stack.insert(v);
        let g = st.g;
        for w in g.edges.get(v).into_iter().flatten() {
            if !g.edges.contains_key(w) {
                continue;
            }
            if !st.index.contains_key(w) {
                visit(st, w);
                let lw = st.low[w];
                let lv = st.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if st.on_stack.contains(w) {
                let iw = st.index[w];
                let lv = st.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if st.low[v] == st.index[v] {
            let mut members = Vec::new();
            loop {
                let w = st.stack.pop().expect("on stack");
                st.on_stack.remove(w);
                members.push(w.clone());
                if w == v {
                    break;
                }
            }
            if members.len() > 1 {
                members.sort();
                st.out.push(members);
            }
        }
    }
    let mut st = State {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in g.edges.keys() {
        if !st.index.contains_key(v) {
            visit(&mut st, v);
        }
    }
    st.out
}

#[test]
fn no_upward_import_and_no_cycle() {
    let src = src_dir();
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("read lib.rs");
    let table = layers(&lib);
    assert!(
        table.len() >= 5,
        "the crate docs of plugin/src/lib.rs have no usable \"## Layers\" table: {table:?}"
    );
    let g = graph(&src);
    let mut problems = String::new();
    let mut arrows = 0;
    let mut upward = 0;
    for (from, targets) in &g.edges {
        // The crate root sits above every layer: it declares the modules and re-exports.
        let root = usize::MAX;
        let Some(lf) = (if from.is_empty() {
            Some(root)
        } else {
            layer_of(from, &table)
        }) else {
            writeln!(
                problems,
                "module {} is in no layer of the table",
                name(from)
            )
            .unwrap();
            continue;
        };
        for to in targets {
            arrows += 1;
            if to.is_empty() {
                upward += 1;
                writeln!(problems, "{} imports the crate root", name(from)).unwrap();
                continue;
            }
            let Some(lt) = layer_of(to, &table) else {
                continue; // reported as a module without a layer
            };
            if lt > lf {
                upward += 1;
                writeln!(
                    problems,
                    "upward import: {} (layer {lf}) → {} (layer {lt})",
                    name(from),
                    name(to)
                )
                .unwrap();
            }
        }
    }
    let circles = cycles(&g);
    for members in &circles {
        let names: Vec<String> = members.iter().map(|m| name(m)).collect();
        writeln!(problems, "import cycle among: {}", names.join(", ")).unwrap();
    }
    println!(
        "{} modules, {arrows} arrows, {upward} upward, {} cycle(s)",
        g.edges.len(),
        circles.len()
    );
    assert!(problems.is_empty(), "module graph:\n{problems}");
}

/// The checker itself sees what it must: grouped, relative and inline paths, and a circle.
#[test]
fn the_checker_finds_paths_and_cycles() {
    let m = vec!["m".to_owned()];
    let chunks = modules_in(
        &m,
        &code_of(
            "use super::{Ptr, data::{self, Side}};\nuse crate::a::b as c; // crate::zzz\n\
             pub(crate) use child::f;\nfn x() { crate::d::e(); }\n\
             pub(crate) mod inner {\n    use super::super::q;\n    const S: &str = \"}\";\n\
             #[cfg(test)]\n    mod tests {\n        use crate::u;\n    }\n}\nmod decl;\n\
             #[cfg(test)]\nmod tests {\n use crate::t;\n}\n",
        ),
    );
    // The file's own code, then its inline module (with the string's brace skipped); the test
    // blocks at both depths left out.
    let names: Vec<String> = chunks.iter().map(|(m, _)| name(m)).collect();
    assert_eq!(names, ["m", "m::inner"]);
    assert!(paths_in(&chunks[1].1).contains(&vec![
        "super".to_owned(),
        "super".to_owned(),
        "q".to_owned()
    ]));
    assert!(
        chunks
            .iter()
            .all(|(_, c)| !c.contains("crate::u") && !c.contains("crate::t"))
    );
    let code = &chunks[0].1;
    let paths = paths_in(code);
    let modules: BTreeSet<ModPath> = [
        vec![],
        vec!["m".to_owned()],
        vec!["m".to_owned(), "child".to_owned()],
        vec!["data".to_owned()],
        vec!["a".to_owned()],
        vec!["d".to_owned()],
        vec!["t".to_owned()],
        vec!["zzz".to_owned()],
    ]
    .into_iter()
    .collect();
    let from = vec!["m".to_owned()];
    let found: BTreeSet<String> = paths
        .iter()
        .filter_map(|p| resolve(&from, p, &modules))
        .map(|m| name(&m))
        .collect();
    let want: BTreeSet<String> = ["crate", "data", "a", "m::child", "d"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(found, want);

    let a = vec!["a".to_owned()];
    let b = vec!["b".to_owned()];
    let c = vec!["c".to_owned()];
    let g = Graph {
        edges: [
            (a.clone(), [b.clone()].into_iter().collect()),
            (b.clone(), [a.clone()].into_iter().collect()),
            (c.clone(), [a.clone()].into_iter().collect()),
        ]
        .into_iter()
        .collect(),
    };
    assert_eq!(cycles(&g), vec![vec![a, b]]);

    let table = layers(
        "//! ## Layers\n//! | layer | modules |\n//! |---|---|\n//! | 0 | `x`, `y::z` |\n//! | 1 | `y` |\n//! ## Next\n//! | 7 | `q` |\n",
    );
    assert_eq!(
        layer_of(
            &vec!["y".to_owned(), "z".to_owned(), "w".to_owned()],
            &table
        ),
        Some(0)
    );
    assert_eq!(
        layer_of(&vec!["y".to_owned(), "v".to_owned()], &table),
        Some(1)
    );
    assert_eq!(layer_of(&vec!["q".to_owned()], &table), None);
}
