//! Loads the built plugin library the way NCCL does, through the C loader program
//! (`tests/c/loader.c`, built by `build.rs`), and checks its exported symbols with `nm`: the net
//! tables `ncclNetPlugin_v6` … `v12` and the CollNet tables `ncclCollNetPlugin_v6` … `v12`.

mod common;
use common::plugin_library;
use std::process::Command;

/// Whether the library under test is the minimal build (`RIVET_PLUGIN_MINIMAL=1`): no CollNet
/// and no RMA tables.
fn minimal_build() -> bool {
    std::env::var("RIVET_PLUGIN_MINIMAL").is_ok_and(|v| v == "1")
}

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
    let mut command = Command::new(env!("RIVET_C_LOADER"));
    command.arg(&lib).arg(mode);
    if minimal_build() {
        command.arg("--minimal");
    }
    let output = command.output().expect("run the C loader");
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
        if !minimal_build() {
            assert!(
                report.contains(&format!("PASS collnet v{version} name is \"Rivet\"")),
                "no check of the CollNet v{version} table ran:\n{report}"
            );
        }
    }
    if minimal_build() {
        for needle in [
            "PASS minimal build: no ncclCollNetPlugin_v6 ... v12 table",
            "PASS minimal build: no ncclRmaPlugin_v13 ... v16 table",
        ] {
            assert!(report.contains(needle), "missing {needle:?}:\n{report}");
        }
    } else {
        for version in 13..=16 {
            for check in [
                format!("PASS rma v{version} name is \"Rivet\""),
                format!("PASS rma v{version} every entry is set"),
                format!("PASS rma v{version} test(bogus/NULL) is an error"),
            ] {
                assert!(
                    report.contains(&check),
                    "no check of the RMA v{version} table ran ({check:?}):\n{report}"
                );
            }
            if mode == "devices" {
                let gin_proxy = format!("PASS rma v{version} device 0 is a GIN_PROXY device");
                assert!(
                    report.contains(&gin_proxy),
                    "missing {gin_proxy:?}:\n{report}"
                );
            }
        }
        assert!(
            report.contains("PASS rma v16 getRmaProperties is set"),
            "no check of v16's getRmaProperties:\n{report}"
        );
    }
    assert!(
        output.stdout.is_empty(),
        "the plugin must never print to stdout, got: {}",
        String::from_utf8_lossy(&output.stdout)
    );
}

#[test]
fn exports_exactly_the_net_collnet_and_rma_tables() {
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
    let minimal = minimal_build();
    let mut expected: Vec<String> = (6..=12).map(|v| format!("ncclNetPlugin_v{v}")).collect();
    if !minimal {
        expected.extend((6..=12).map(|v| format!("ncclCollNetPlugin_v{v}")));
        expected.extend((13..=16).map(|v| format!("ncclRmaPlugin_v{v}")));
    }
    expected.sort();
    assert_eq!(
        symbols,
        expected,
        "{}",
        if minimal {
            "the minimal library must export the seven net tables and nothing else"
        } else {
            "the library must export the seven net, seven CollNet and four RMA tables and nothing else"
        }
    );
}
