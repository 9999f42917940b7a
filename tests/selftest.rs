//! `rivet selftest` on a host without RDMA devices: it must say that nothing was tested and exit
//! non-zero, so a site's qualification script never reads "no device" as a pass. (On devices it
//! runs in the Soft-RoCE lane, `tests/vm_lane.rs`.)

use std::process::Command;

#[test]
fn selftest_without_devices_says_so_and_fails() {
    // RIVET_DISABLE=1 hides every device, also on a machine that has some.
    let output = Command::new(env!("CARGO_BIN_EXE_rivet"))
        .args(["selftest", "--quick"])
        .env("RIVET_DISABLE", "1")
        .output()
        .expect("run rivet selftest");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "stdout: {stdout}");
    assert!(
        stdout.starts_with("FAIL") && stdout.contains("no RDMA device to test"),
        "{stdout}"
    );
    assert!(!stdout.contains("PASS"), "{stdout}");
}

#[test]
fn selftest_rejects_unknown_options() {
    let output = Command::new(env!("CARGO_BIN_EXE_rivet"))
        .args(["selftest", "--bogus"])
        .output()
        .expect("run rivet selftest");
    assert_eq!(output.status.code(), Some(2));
}
