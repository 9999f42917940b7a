//! Helpers shared by the integration tests.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The plugin library built next to the running test (`target/<profile>/libnccl_net_rivet.so`),
/// or `RIVET_PLUGIN_LIB`.
pub(crate) fn plugin_library() -> PathBuf {
    if let Some(path) = std::env::var_os("RIVET_PLUGIN_LIB") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test>-<hash> -> target/<profile>/libnccl_net_rivet.so
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>");
    let lib = profile_dir.join("libnccl_net_rivet.so");
    assert!(
        lib.exists(),
        "{} is missing: build the workspace first (cargo build --workspace)",
        lib.display()
    );
    lib
}

/// Run a VM lane command (`vm/run.sh …`, `vm/multi.sh …`), echo its stdout and stderr into the
/// test's output, and fail unless it exited 0. Returns (stdout, stderr).
#[allow(
    dead_code,
    reason = "the VM lanes use it; the loader test, which shares this module, does not"
)]
pub(crate) fn run_lane(command: &mut Command) -> (String, String) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("run {command:?}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        output.status.success(),
        "{:?} failed with {:?}",
        command.get_program(),
        output.status
    );
    (stdout, stderr)
}

/// What a whole run of the conformance suite (`tests/c/conformance.c LIB`, all tables) must have
/// printed, on any device: its summary with at least 54 checks passed and none failed, no FAIL
/// line, and a transfer through every table v6 … v12.
#[allow(
    dead_code,
    reason = "the lanes that run the conformance suite use it; other tests sharing this module do not"
)]
pub(crate) fn check_conformance(stdout: &str) {
    let summary = stdout
        .lines()
        .find_map(|l| l.strip_prefix("conformance: "))
        .unwrap_or_else(|| panic!("the conformance suite printed no summary"));
    let counts: Vec<u32> = summary
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    assert!(
        counts.len() == 2 && counts[1] == 0 && counts[0] >= 54,
        "conformance: {summary} (expected at least 54 passed, 0 failed)"
    );
    assert!(
        !stdout.lines().any(|l| l.starts_with("FAIL ")),
        "the conformance suite printed FAIL lines"
    );
    for v in 6..=12 {
        assert!(
            stdout.contains(&format!("PASS v{v} transfer: size sweep")),
            "conformance: no transfer through ncclNetPlugin_v{v}"
        );
    }
}

/// What `tests/c/transfer.c LIB --version 12` (without `--quick`) must have printed on stderr: the
/// 64 MiB message, the grouped receive of 8 and the 10,000 small messages, each verified.
#[allow(
    dead_code,
    reason = "the lanes that run the transfer program use it; other tests sharing this module do not"
)]
pub(crate) fn check_transfer(stderr: &str) {
    for needle in [
        "PASS message of 67108864 bytes arrived intact",
        "PASS grouped receive of 8 with shuffled tags",
        "PASS 10000 small messages with a window of 8",
    ] {
        assert!(stderr.contains(needle), "missing {needle:?}");
    }
}

/// What a run of `tests/c/rma.c LIB --version <version>` (not `--kill`, not `--bench`) must have
/// printed on stderr: every phase's PASS line (rank 0 prints them).
#[allow(
    dead_code,
    reason = "the lanes that run the RMA program use it; other tests sharing this module do not"
)]
pub(crate) fn check_rma(stderr: &str, version: u32) {
    let mut needles = vec![
        format!("PASS ncclRmaPlugin_v{version}: init,"),
        "is a GIN_PROXY device".to_owned(),
        "(connect given a NULL / garbage NET context)".to_owned(),
        "contexts), three windows registered".to_owned(),
        "PASS iput at 0, 1, 8, 4095, 65536 and 4194304 bytes".to_owned(),
        "PASS iputSignal INC at 0, 1, 8, 4095, 65536 and 4194304 bytes".to_owned(),
        "PASS iputSignal ADD at 0, 1, 8, 4095, 65536 and 4194304 bytes".to_owned(),
        "PASS iget at 0, 1, 8, 4095, 65536 and 4194304 bytes".to_owned(),
        "iputSignal per ordered pair in flight at once".to_owned(),
        "put-with-signal per ordered pair (puts up to 64 KiB, signal i adds 1 << i): each put's bytes are there the moment its own signal is".to_owned(),
        "PASS one iput and one iget of ".to_owned(),
        "PASS a second group (1 context) beside the first".to_owned(),
        "PASS 256 iput requests in flight towards one peer at once, all complete and land"
            .to_owned(),
        "PASS NCCL's flush: an 8-byte iput within one window to this rank itself, and to a peer"
            .to_owned(),
        "PASS 1000 random operations per rank".to_owned(),
        "refused with ncclInvalidArgument and no request; the exact edges accepted; the context still works".to_owned(),
        "PASS a healthy run: queryLastError false, rmaProgress never failed".to_owned(),
        "PASS the 4 KiB guards around every window untouched".to_owned(),
    ];
    if version == 13 {
        needles.push("PASS v13 createContext: devHandle".to_owned());
        needles.push("PASS v13 regMrSym wrote *ginHandle".to_owned());
    }
    if version >= 16 {
        needles.push("PASS getRmaProperties: flushesAllPutsOnAnySignal".to_owned());
    }
    for needle in needles {
        assert!(
            stderr.contains(&needle),
            "rma v{version}: missing {needle:?}"
        );
    }
    assert!(
        !stderr.lines().any(|l| l.starts_with("FAIL ")),
        "the RMA program printed FAIL lines"
    );
}
