//! The plugin's unsafe discipline, checked on the source: the crate root denies `unsafe_code`;
//! a module that needs it opts in with `#![allow(unsafe_code)]` and says why in its module docs;
//! every `unsafe fn` has a `# Safety` section. (Every `unsafe {}` having a `// SAFETY:` comment
//! is clippy's `undocumented_unsafe_blocks`, denied for the workspace.)

mod common;

use common::{rust_files, src_dir};

/// Whether a line (comments cut off) defines an `unsafe fn` (not a fn-pointer type).
fn defines_unsafe_fn(code: &str) -> bool {
    let code = code.trim_start();
    let code = code
        .strip_prefix("pub(crate) ")
        .or_else(|| code.strip_prefix("pub(super) "))
        .or_else(|| code.strip_prefix("pub "))
        .unwrap_or(code);
    let code = code.strip_prefix("const ").unwrap_or(code);
    code.starts_with("unsafe fn ") || code.starts_with("unsafe extern \"C\" fn ")
}

/// The problems of one file's text.
fn check(file: &str, text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let code = |line: &str| line.split("//").next().unwrap_or("").to_owned();
    let uses_unsafe = lines.iter().any(|l| {
        let c = code(l);
        c.contains("unsafe {")
            || c.contains("unsafe fn ")
            || c.contains("unsafe extern \"C\" fn ") && c.trim_start().starts_with("pub")
            || defines_unsafe_fn(&c)
            || c.contains("unsafe impl")
            || c.contains("#[unsafe(")
    });
    if uses_unsafe {
        if !text.contains("#![allow(unsafe_code)]") {
            problems.push(format!(
                "{file}: uses unsafe without `#![allow(unsafe_code)]`"
            ));
        }
        let why = lines
            .iter()
            .take_while(|l| l.starts_with("//!") || l.trim().is_empty())
            .any(|l| l.starts_with("//!") && l.to_lowercase().contains("unsafe"));
        if !why {
            problems.push(format!(
                "{file}: opts into unsafe without saying why in its module docs"
            ));
        }
    }
    for (i, line) in lines.iter().enumerate() {
        if !defines_unsafe_fn(&code(line)) {
            continue;
        }
        let documented = lines[..i]
            .iter()
            .rev()
            .take_while(|l| {
                let t = l.trim_start();
                t.starts_with("///") || t.starts_with("#[")
            })
            .any(|l| l.trim_start() == "/// # Safety");
        if !documented {
            problems.push(format!(
                "{file}:{}: `unsafe fn` without a `# Safety` section",
                i + 1
            ));
        }
    }
    problems
}

#[test]
fn unsafe_is_opted_into_and_documented() {
    let src = src_dir();
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("read lib.rs");
    let mut problems = Vec::new();
    if !lib.contains("#![deny(unsafe_code)]") {
        problems.push("lib.rs: no `#![deny(unsafe_code)]`".to_owned());
    }
    let files = rust_files(&src);
    let mut unsafe_fns = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read source");
        let name = file
            .strip_prefix(&src)
            .expect("under src")
            .display()
            .to_string();
        unsafe_fns += text
            .lines()
            .filter(|l| defines_unsafe_fn(l.split("//").next().unwrap_or("")))
            .count();
        problems.extend(check(&name, &text));
    }
    println!("{} files, {unsafe_fns} unsafe fns", files.len());
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_checker_sees_missing_docs() {
    let bad = "//! A module.\n\nunsafe fn f() {}\n";
    let problems = check("bad.rs", bad);
    assert_eq!(problems.len(), 3, "{problems:?}");
    let good = "//! Unsafe: because.\n#![allow(unsafe_code)]\n\n/// Does f.\n///\n/// # Safety\n/// None.\n#[inline]\npub(crate) unsafe fn f() {}\ntype T = Option<unsafe extern \"C\" fn()>;\n";
    assert!(check("good.rs", good).is_empty());
}
