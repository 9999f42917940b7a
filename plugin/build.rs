//! Tells the plugin which commit it is built from (`RIVET_COMMIT`, shown by `rivet version` and
//! the library's INFO line at `init`): `RIVET_BUILD_COMMIT` when set (a package or tarball built
//! without `.git` sets it), else `git rev-parse` of the checkout, else a note that it is unknown.
//! Nothing time-dependent goes in: two builds of one commit give the same bytes.

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
}

/// The checked-out commit, asking cargo to run this again when HEAD or its branch moves.
fn git_commit() -> Option<String> {
    let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", &name]) {
            if PathBuf::from(&path).exists() {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
    Some(commit)
}

fn main() {
    println!("cargo:rerun-if-env-changed=RIVET_BUILD_COMMIT");
    println!("cargo:rerun-if-changed=build.rs");
    let commit = match std::env::var("RIVET_BUILD_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_owned(),
        _ => git_commit().unwrap_or_else(|| "unknown (built outside a git checkout)".to_owned()),
    };
    println!("cargo:rustc-env=RIVET_COMMIT={commit}");
}
