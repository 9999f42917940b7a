//! The Soft-RoCE lane: boots the QEMU VM once (`vm/run.sh`) and, against a real `rxe0` device,
//! checks discovery (`rivet info`), the C loader with devices present, the verbs-ffi device tests,
//! two processes moving data through the plugin's C tables for ABI v9 … v12, and the conformance
//! suite (`tests/c/conformance.c`: NCCL's calling contract through every table v6 … v12; again
//! with two queue pairs per connection), transfers over four queue pairs round-robin and three
//! split (`NCCL_IB_QPS_PER_CONNECTION`, `NCCL_IB_SPLIT_DATA_ON_QPS`), the
//! CollNet conformance (`tests/c/collnet.c`: 2, 3 and 8 ranks, bit-exact results, a killed and a
//! missing member), the RMA conformance (`tests/c/rma.c`: 2, 3 and 8 ranks through
//! `ncclRmaPlugin_v16`, a killed member), and `rivet selftest --quick` (the verbs path PASSes, the mlx5 direct path is
//! skipped on rxe), and, with `RIVET_PACKAGE_DEB`, the Debian package installed on a clean root
//! with the transfer test through the installed library (`scripts/vm-package.sh`).
//!
//! Slow (a VM under TCG), so it is `#[ignore]`d; `scripts/vm-lane.sh` (run by `.ci/run`) runs it.

use std::path::PathBuf;
use std::process::Command;

mod common;
use common::plugin_library;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One shell script run inside the VM; each step prints a `STEP <name> rc=<code>` line.
fn script() -> String {
    let lib = plugin_library();
    let lib = lib.display();
    let rivet = env!("CARGO_BIN_EXE_rivet");
    let loader = env!("RIVET_C_LOADER");
    let transfer = env!("RIVET_C_TRANSFER");
    let conformance = env!("RIVET_C_CONFORMANCE");
    let collnet = env!("RIVET_C_COLLNET");
    let rma = env!("RIVET_C_RMA");
    let device_tests = std::env::var("RIVET_VERBS_DEVICE_TEST").unwrap_or_default();
    let mut s =
        String::from("set -u\nstep() { name=$1; shift; \"$@\"; echo \"STEP $name rc=$?\"; }\n");
    s += &format!("step info {rivet} info\n");
    s += &format!("step doctor {rivet} doctor\n");
    s += &format!("step loader {loader} {lib} devices\n");
    if !device_tests.is_empty() {
        s += &format!("step verbs-device-tests {device_tests} --ignored --test-threads=1\n");
    }
    // rivet-core's multi-QP connections over 4 real queue pairs (round-robin and split).
    let plugin_tests = std::env::var("RIVET_PLUGIN_DEVICE_TEST").unwrap_or_default();
    if !plugin_tests.is_empty() {
        s += &format!(
            "step multi-qp {plugin_tests} comm::multi_device_tests --ignored --test-threads=1\n"
        );
    }
    s += &format!("step transfer-v12 {transfer} {lib} --version 12\n");
    for v in [9, 10, 11] {
        s += &format!("step transfer-v{v} {transfer} {lib} --version {v} --quick\n");
    }
    s += &format!("step conformance {conformance} {lib}\n");
    // The plugin's own connections with several queue pairs (NCCL_IB_QPS_PER_CONNECTION):
    // round-robin, split, and NCCL's whole calling contract on two queue pairs.
    s += &format!(
        "step transfer-qps4 env NCCL_IB_QPS_PER_CONNECTION=4 HARNESS_VERBOSE=1 {transfer} {lib} --version 12\n"
    );
    s += &format!(
        "step transfer-split3 env NCCL_IB_QPS_PER_CONNECTION=3 NCCL_IB_SPLIT_DATA_ON_QPS=1 HARNESS_VERBOSE=1 {transfer} {lib} --version 12\n"
    );
    s += &format!("step conformance-qps2 env NCCL_IB_QPS_PER_CONNECTION=2 {conformance} {lib}\n");
    s += &format!("step collnet {collnet} {lib} --ranks 3 --quick\n");
    s += &format!("step collnet-2 {collnet} {lib} --ranks 2 --quick\n");
    s += &format!("step collnet-8 {collnet} {lib} --ranks 8 --quick\n");
    s += &format!("step collnet-kill {collnet} {lib} --ranks 3 --kill\n");
    s += &format!("step collnet-missing {collnet} {lib} --ranks 3 --missing\n");
    s += &format!("step rma {rma} {lib} --ranks 3 --quick\n");
    s += &format!("step rma-2 {rma} {lib} --ranks 2 --quick\n");
    s += &format!("step rma-8 {rma} {lib} --ranks 8 --quick\n");
    s += &format!(
        "step rma-kill env NCCL_IB_TIMEOUT=12 NCCL_IB_RETRY_CNT=2 {rma} {lib} --ranks 3 --kill\n"
    );
    s += &format!("step selftest {rivet} selftest --quick --plugin {lib}\n");
    s += &format!("step stats {rivet} info --stats\n");
    // The Debian package on a clean root (an overlay), the transfer test through the installed
    // library, then its removal (scripts/vm-package.sh).
    if let Some(deb) = std::env::var("RIVET_PACKAGE_DEB")
        .ok()
        .filter(|d| !d.is_empty())
    {
        let check = repo().join("scripts/vm-package.sh");
        s += &format!("step package bash {} {deb} {transfer}\n", check.display());
    }
    s
}

#[test]
#[ignore = "boots a QEMU VM (minutes under TCG); run by scripts/vm-lane.sh"]
fn soft_roce_lane() {
    let run = repo().join("vm/run.sh");
    let (stdout, stderr) = common::run_lane(Command::new(&run).current_dir(repo()).args([
        "--timeout",
        "1200",
        "--",
        "bash",
        "-c",
        &script(),
    ]));

    let step = |name: &str| -> i32 {
        let prefix = format!("STEP {name} rc=");
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rc| rc.trim().parse().ok())
            .unwrap_or_else(|| panic!("step {name} did not run"))
    };
    let info = stdout
        .lines()
        .find(|l| l.contains("rxe0"))
        .unwrap_or_else(|| panic!("rivet info shows no rxe0"));
    assert!(
        info.contains("RoCE") && info.contains("::ffff:10.0.2.15"),
        "rxe0 without its RoCE v2 IPv4 GID: {info}"
    );
    // Soft-RoCE has no dma-buf MRs and the VM no GPU: host memory only, each refusal explained.
    assert!(
        info.contains("cuda no (no peer-memory module")
            && info.contains("dmabuf no (unsupported by the provider or kernel: EOPNOTSUPP 95)")
            && info.contains("gpu flush n/a"),
        "rxe0's GPUDirect line does not say why it offers host memory only: {info}"
    );
    assert_eq!(step("info"), 0);
    check_doctor(&stdout, step("doctor"));
    // After the transfers: rxe0's driver counters show the packets they sent.
    assert_eq!(step("stats"), 0);
    let sent = stdout
        .lines()
        .find(|l| l.starts_with("  hw_counters: "))
        .unwrap_or_else(|| panic!("rivet info --stats printed no hw_counters line"));
    assert!(
        sent.contains("sent_pkts="),
        "no sent packets counted: {sent}"
    );
    assert_eq!(step("loader"), 0, "C loader with devices present failed");
    if std::env::var("RIVET_VERBS_DEVICE_TEST").is_ok_and(|v| !v.is_empty()) {
        assert_eq!(
            step("verbs-device-tests"),
            0,
            "verbs-ffi device tests failed"
        );
    }
    if std::env::var("RIVET_PLUGIN_DEVICE_TEST").is_ok_and(|v| !v.is_empty()) {
        assert_eq!(
            step("multi-qp"),
            0,
            "multi-QP transfers over 4 queue pairs on rxe0 failed"
        );
    }
    for v in [12, 11, 10, 9] {
        assert_eq!(
            step(&format!("transfer-v{v}")),
            0,
            "transfer through ncclNetPlugin_v{v} failed"
        );
    }
    assert_eq!(
        step("conformance"),
        0,
        "conformance suite failed: see its FAIL lines above"
    );
    for name in ["transfer-qps4", "transfer-split3", "conformance-qps2"] {
        assert_eq!(step(name), 0, "{name} failed: see its FAIL lines above");
    }
    for lanes in [
        "(4 queue pair(s), each message over 1)",
        "(3 queue pair(s), each message over 3)",
    ] {
        assert!(
            stderr.matches(lanes).count() >= 2,
            "both ends should report connections of {lanes}"
        );
    }
    for name in [
        "collnet",
        "collnet-2",
        "collnet-8",
        "collnet-kill",
        "collnet-missing",
    ] {
        assert_eq!(step(name), 0, "{name} failed: see its FAIL lines above");
    }
    for needle in [
        "PASS iallreduce: 12 types x 5 ops x 4 counts",
        "PASS iallreduce of 1 Mi elements",
        "PASS iallgather (3 receive parts) and ireducescatter (2 send parts",
        "PASS two groups formed and used at once",
        "PASS host memory only: getProperties offers NCCL_PTR_HOST, regMr refuses NCCL_PTR_CUDA",
        "PASS ncclCollNetPlugin_v8: group, iallreduce, iallgather",
        "bit-exact on 2 ranks (240 operations)",
        "bit-exact on 8 ranks (240 operations)",
        "PASS a member killed mid-operation fails the others",
        "PASS a member that never connects fails connect",
    ] {
        assert!(stderr.contains(needle), "collnet: missing {needle:?}");
    }
    for name in ["rma", "rma-2", "rma-8", "rma-kill"] {
        assert_eq!(step(name), 0, "{name} failed: see its FAIL lines above");
    }
    common::check_rma(&stderr, 16);
    for needle in [
        "rma: v16, 2 ranks (2 here), quick, 0 rank(s) failed",
        "rma: v16, 3 ranks (3 here), quick, 0 rank(s) failed",
        "rma: v16, 8 ranks (8 here), quick, 0 rank(s) failed",
        "PASS puts towards the killed rank 2 failed at",
        "PASS queryLastError reports the error after the peer's death",
        "PASS after the death of rank 2, iput and iget between the 2 survivors complete",
    ] {
        assert!(stderr.contains(needle), "rma: missing {needle:?}");
    }
    assert_eq!(step("selftest"), 0, "rivet selftest failed: see above");
    assert!(
        stdout.lines().any(|l| l.starts_with("PASS verbs: rxe0:"))
            && stdout
                .lines()
                .any(|l| l.starts_with("SKIP mlx5-direct: rxe0 is not an mlx5 device")),
        "rivet selftest: verbs must PASS and mlx5-direct be skipped on rxe0"
    );
    common::check_conformance(&stdout);
    if std::env::var("RIVET_PACKAGE_DEB").is_ok_and(|v| !v.is_empty()) {
        assert_eq!(
            step("package"),
            0,
            "the installed package failed: see above"
        );
        for needle in [
            "PASS the transfer loaded the installed library",
            "PASS nothing left in the root but dpkg's records and the loader cache",
        ] {
            assert!(stdout.contains(needle), "package: missing {needle:?}");
        }
    }
    common::check_transfer(&stderr);
}

/// `rivet doctor` on rxe0: every check answers; rxe0's port is ACTIVE, it has a RoCE v2 GID and
/// the GID Rivet picks is the IPv4 one; the exit status is 1 exactly when a line says FAIL.
fn check_doctor(stdout: &str, rc: i32) {
    let line = |prefix: &str| {
        stdout
            .lines()
            .find(|l| l.get(5..).is_some_and(|rest| rest.starts_with(prefix)))
            .unwrap_or_else(|| panic!("rivet doctor printed no {prefix:?} line"))
    };
    for check in [
        "memlock:",
        "devices:",
        "port rxe0:1:",
        "mtu rxe0:1:",
        "roce-v2 rxe0:1:",
        "gid rxe0:1:",
        "gpu-memory:",
        "acs:",
        "iommu:",
        "relaxed-ordering:",
        "env:",
        "socket-if:",
    ] {
        line(check);
    }
    assert!(line("devices:").starts_with("OK"), "{}", line("devices:"));
    assert!(line("port rxe0:1:").contains("ACTIVE"));
    assert!(line("roce-v2 rxe0:1:").starts_with("OK"));
    assert!(line("gid rxe0:1:").contains("::ffff:10.0.2.15 RoCE v2"));
    assert!(line("mtu rxe0:1:").contains("active MTU"));
    let fails = stdout
        .lines()
        .filter(|l| l.starts_with("FAIL ") && l.contains(": "))
        .count();
    assert_eq!(rc, i32::from(fails > 0), "rivet doctor exit status {rc}");
}
