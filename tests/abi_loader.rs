//! Loads the built plugin library the way NCCL does, through the C loader program
//! (`tests/c/loader.c`, built by `build.rs`), and checks its exported symbols with `nm`: the net
//! tables `ncclNetPlugin_v6` … `v12` and the CollNet tables `ncclCollNetPlugin_v6` … `v12`.

mod common;
use common::plugin_library;
use std::process::Command;

/// Whether this machine has RDMA devices the plugin should find.
fn machine_has_rdma() -> bool {
    std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut entries| entries.next().is_some())
}

#[test]
fn c_loader_accepts_every_exported_version() {
    let lib = plugin_library();
    let mode = if machine_has_rdma() {
        "devices"
    } else {
        "no-device"
    };
    let output = Command::new(env!("RIVET_C_LOADER"))
        .arg(&lib)
        .arg(mode)
        .output()
        .expect("run the C loader");
    let report = String::from_utf8_lossy(&output.stderr);
    let failures: Vec<&str> = report.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert!(
        output.status.success() && failures.is_empty(),
        "C loader ({mode}) failed:\n{}",
        failures.join("\n")
    );
    for version in 6..=12 {
        assert!(
            report.contains(&format!("PASS v{version} name is \"Rivet\"")),
            "no check of v{version} ran:\n{report}"
        );
        assert!(
            report.contains(&format!("PASS collnet v{version} name is \"Rivet\"")),
            "no check of the CollNet v{version} table ran:\n{report}"
        );
    }
    assert!(
        output.stdout.is_empty(),
        "the plugin must never print to stdout, got: {}",
        String::from_utf8_lossy(&output.stdout)
    );
}

#[test]
fn exports_exactly_the_net_and_collnet_tables() {
    let lib = plugin_library();
    let output = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&lib)
        .output()
        .expect("run nm");
    assert!(
        output.status.success(),
        "nm failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut symbols: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().nth(2).map(str::to_owned))
        .collect();
    symbols.sort();
    let expected: Vec<String> = (6..=12)
        .flat_map(|v| {
            [
                format!("ncclNetPlugin_v{v}"),
                format!("ncclCollNetPlugin_v{v}"),
            ]
        })
        .collect();
    let mut expected_sorted = expected.clone();
    expected_sorted.sort();
    assert_eq!(
        symbols, expected_sorted,
        "the library must export the seven net and seven CollNet tables and nothing else"
    );
}
