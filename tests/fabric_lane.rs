//! The native fabric lane: Rivet's shipped library, unchanged, over the project's user-space verbs
//! fabric (`fabric/`), with no VM: the fabric's `libibverbs.so.1` comes first on
//! `LD_LIBRARY_PATH` and nothing else tells Rivet about it. Checked here: discovery finds the
//! fabric's device (`rivet info`; `rivet doctor`, `rivet info --stats` and the benchmarks' GID
//! helper through the same discovery), the conformance suite between two processes (the same checks
//! as the Soft-RoCE lane, `common::check_conformance`), the 64 MiB / grouped / many-small
//! transfers, `rivet bench` (its figures printed), an all-to-all connect of 8 and of 32 ranks,
//! the RMA conformance (`tests/c/rma.c`: 2, 3 and 8 ranks through `ncclRmaPlugin_v16`, the v13,
//! v14 and v15 tables once each, a killed member, its `--bench` figures),
//! the faults that make sense on one host: a peer killed in either role, hostile handshake
//! clients, a handshake that times out, bad memory, fork after init, connect/close cycles and
//! closes with receives in flight; and the relocatable tarballs (`scripts/package.sh`, default and
//! minimal) unpacked in a scratch folder: their `rivet version` and their library moving data.
//!
//! What the fabric does not model (timing, congestion, link state, device removal) is not tested
//! here: port flaps, link loss and device removal stay in the VM lane.
//!
//! `#[ignore]`d: it needs the fabric built; `scripts/fabric-lane.sh` builds it and runs this with
//! `RIVET_FABRIC_LIB_DIR` set, one test at a time.

mod common;
use common::plugin_library;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

/// The folder holding the fabric's `libibverbs.so.1` (set by `scripts/fabric-lane.sh`).
fn fabric_dir() -> PathBuf {
    let dir = std::env::var_os("RIVET_FABRIC_LIB_DIR")
        .map(PathBuf::from)
        .expect("RIVET_FABRIC_LIB_DIR: the fabric's library folder (run scripts/fabric-lane.sh)");
    assert!(
        dir.join("libibverbs.so.1").exists(),
        "{} has no libibverbs.so.1",
        dir.display()
    );
    dir
}

/// `program args…` with the fabric first on `LD_LIBRARY_PATH` and the handshake on loopback.
fn over_fabric(program: &str, args: &[&str]) -> Command {
    let mut path = fabric_dir().into_os_string();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        path.push(":");
        path.push(old);
    }
    let mut command = Command::new(program);
    command
        .args(args)
        .env("LD_LIBRARY_PATH", path)
        .env("NCCL_SOCKET_IFNAME", "=lo");
    command
}

/// Run `command`, echo its output into the test's, and return it with how long it took.
fn run(what: &str, command: &mut Command) -> (Output, String, String) {
    let start = Instant::now();
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: run {command:?}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    println!("{stdout}");
    eprintln!("{stderr}");
    eprintln!(
        "fabric lane: {what}: {:?} in {:.1} s",
        output.status,
        start.elapsed().as_secs_f64()
    );
    (output, stdout, stderr)
}

fn lib() -> String {
    plugin_library().display().to_string()
}

#[test]
#[ignore = "needs the fabric (scripts/fabric-lane.sh)"]
fn discovery_finds_the_fabric_device_from_ld_library_path_alone() {
    let (out, stdout, _) = run(
        "rivet info",
        &mut over_fabric(env!("CARGO_BIN_EXE_rivet"), &["info"]),
    );
    assert!(out.status.success(), "rivet info over the fabric failed");
    assert!(
        stdout.contains("InfiniBand"),
        "rivet info shows no InfiniBand port over the fabric:\n{stdout}"
    );
    // Without the fabric the same host has no device: the fabric, not the host, was found.
    let (_, plain, _) = run(
        "rivet info without the fabric",
        Command::new(env!("CARGO_BIN_EXE_rivet")).arg("info"),
    );
    assert_ne!(plain, stdout, "the fabric changed nothing in rivet info");
}

/// The stdout line of `rivet doctor` for check `name` (`devices:`, `port rfab0:1:`, …).
fn doctor_line<'a>(stdout: &'a str, name: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.get(5..).is_some_and(|rest| rest.starts_with(name)))
        .unwrap_or_else(|| panic!("rivet doctor printed no {name:?} line:\n{stdout}"))
}

#[test]
#[ignore = "needs the fabric (scripts/fabric-lane.sh)"]
fn doctor_and_stats_see_the_fabric_device_through_discovery() {
    // Both list the devices the plugin's discovery lists and read each where its ibdev_path
    // points (the fabric's own tree), not /sys/class/infiniband.
    let (_, stdout, _) = run(
        "rivet doctor",
        &mut over_fabric(env!("CARGO_BIN_EXE_rivet"), &["doctor"]),
    );
    let devices = doctor_line(&stdout, "devices:");
    assert!(
        devices.starts_with("OK") && devices.contains("1 ACTIVE"),
        "{devices}"
    );
    let port = doctor_line(&stdout, "port rfab0:1:");
    assert!(
        port.starts_with("OK") && port.contains("ACTIVE, link layer InfiniBand"),
        "{port}"
    );
    assert!(doctor_line(&stdout, "mtu rfab0:1:").contains("active MTU 4096"));
    assert!(doctor_line(&stdout, "gid rfab0:1:").starts_with("OK"));
    // The PCI checks follow the device's `device` link into the fabric's tree (a stand-in PCI
    // function without config space).
    assert!(doctor_line(&stdout, "acs:").contains("1 PCI NIC(s)"));
    assert!(doctor_line(&stdout, "relaxed-ordering rfab0:").starts_with("OK"));

    let (out, stats, _) = run(
        "rivet info --stats",
        &mut over_fabric(env!("CARGO_BIN_EXE_rivet"), &["info", "--stats"]),
    );
    assert!(out.status.success(), "rivet info --stats exit status");
    assert!(
        stats.lines().any(|l| l.starts_with("rfab0:1: ")),
        "rivet info --stats does not name rfab0:1:\n{stats}"
    );

    // Without the fabric the same host does not show it.
    let (_, plain, _) = run(
        "rivet doctor without the fabric",
        Command::new(env!("CARGO_BIN_EXE_rivet")).arg("doctor"),
    );
    assert!(!plain.contains("rfab0"), "{plain}");
}

#[test]
#[ignore = "needs the fabric (scripts/fabric-lane.sh)"]
fn the_benchmarks_gid_helper_asks_rivet() {
    // benches/lib.sh's gid_index over a RoCE fabric (its own directory: the link layer is one
    // fabric's setting, shared by every process that uses that directory).
    let dir = std::env::temp_dir().join(format!("rivet-fabric-roce-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let gid_index = |ip: &str| {
        let script = format!(
            "source {}/benches/lib.sh; gid_index rfab0 {ip}",
            env!("CARGO_MANIFEST_DIR")
        );
        run(
            &format!("gid_index rfab0 {ip}"),
            over_fabric("bash", &["-c", &script])
                .env("RIVET_FABRIC_DIR", &dir)
                .env("RIVET_FABRIC_LINK_LAYER", "ethernet")
                .env("rivet", env!("CARGO_BIN_EXE_rivet")),
        )
    };
    // The fabric's port 1 of device 0 has the RoCE v2 GID ::ffff:127.0.0.1 at index 0.
    let (out, stdout, _) = gid_index("127.0.0.1");
    assert!(out.status.success(), "gid_index rfab0 127.0.0.1 failed");
    assert_eq!(stdout.trim(), "0");
    let (out, stdout, stderr) = gid_index("10.9.9.9");
    assert!(!out.status.success(), "a GID that is not there: {stdout}");
    assert!(
        stderr.contains("no RoCE v2 GID ::ffff:10.9.9.9 on rfab0"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[ignore = "needs the fabric (scripts/fabric-lane.sh)"]
fn conformance_suite_between_two_processes() {
    // The fabric pins no pages (it moves memory with process_vm_writev): VmPin cannot show the
    // registration cache's page accounting, the rest of that check runs.
    let (out, stdout, _) = run(
        "conformance",
        over_fabric(env!("RIVET_C_CONFORMANCE"), &[&lib()]).env("CONFORMANCE_UNPINNED_DEVICE", "1"),
    );
    common::check_conformance(&stdout);
    assert!(out.status.success(), "conformance exit status");
    let (out, _, stderr) = run(
        "transfer v12",
        &mut over_fabric(env!("RIVET_C_TRANSFER"), &[&lib(), "--version", "12"]),
    );
    assert!(out.status.success(), "transfer v12 exit status");
    common::check_transfer(&stderr);
}

#[test]
#[ignore = "needs the fabric (scripts/fabric-lane.sh)"]
fn rivet_bench_moves_every_size_and_prints_its_figures() {
    let sizes = ["4096", "65536", "1048576", "16777216"];
    let (out, stdout, _) = run(
        "rivet bench",
        &mut over_fabric(
            env!("CARGO_BIN_EXE_rivet"),
            &[
                "bench",
                "--json",
                "--quiet",
                "--sizes",
                "4K,64K,1M,16M",
                "--lat-iters",
                "500",
            ],
        ),
    );
    assert!(out.status.success(), "rivet bench over the fabric failed");
    for size in sizes {
        let key = format!("\"size\":{size},");
        let rest = stdout
            .split(&key)
            .nth(1)
            .unwrap_or_else(|| panic!("no result for {size} B: {stdout}"));
        let mib: f64 = rest
            .split("\"mib_per_s\":")
            .nth(1)
            .and_then(|r| r.split([',', '}']).next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no mib_per_s for {size} B: {rest}"));
        assert!(mib > 0.0, "{size} B: {mib} MiB/s");
        eprintln!("fabric lane: rivet bench {size} B: {mib:.1} MiB/s");
    }
    assert!(stdout.contains("\"p50_us\":"), "no latency: {stdout}");
}

/// The folder holding the packages (`scripts/package.sh`, default and `--minimal`), set by
/// `scripts/fabric-lane.sh`.
fn package_dir() -> PathBuf {
    std::env::var_os("RIVET_PACKAGE_DIR")
        .map(PathBuf::from)
        .expect("RIVET_PACKAGE_DIR: the packages' folder (run scripts/fabric-lane.sh)")
}

/// Unpack the tarball whose name is `rivet-<version>-<arch>.tar.gz` (`minimal`: with `-minimal`
/// after the version) into a fresh scratch folder; return the unpacked top folder.
fn unpack_tarball(minimal: bool) -> PathBuf {
    let dir = package_dir();
    let tarball = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .find(|path| {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with("rivet-")
                && name.ends_with(".tar.gz")
                && name.contains("-minimal") == minimal
        })
        .unwrap_or_else(|| panic!("no tarball (minimal: {minimal}) in {}", dir.display()));
    let scratch = std::env::temp_dir().join(format!(
        "rivet-tarball-{}-{}",
        std::process::id(),
        if minimal { "minimal" } else { "default" }
    ));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).expect("scratch folder");
    let status = Command::new("tar")
        .arg("-xzf")
        .arg(&tarball)
        .arg("-C")
        .arg(&scratch)
        .status()
        .expect("run tar");
    assert!(status.success(), "tar -xzf {}", tarball.display());
    let top: Vec<PathBuf> = std::fs::read_dir(&scratch)
        .expect("scratch folder")
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .collect();
    assert_eq!(top.len(), 1, "the tarball has one top folder: {top:?}");
    top.into_iter().next().unwrap_or_default()
}

/// A tarball unpacked where nothing else of Rivet is: its `rivet version` names this build's
/// features, and its library (not the build tree's) passes the transfer test over the fabric.
fn unpacked_tarball_works(minimal: bool) {
    let top = unpack_tarball(minimal);
    let library = top.join("lib/libnccl-net-rivet.so");
    assert!(library.is_file(), "{} is missing", library.display());
    let (out, stdout, _) = run(
        "unpacked rivet version",
        Command::new(top.join("bin/rivet")).arg("version"),
    );
    assert!(out.status.success(), "rivet version exit status");
    assert!(
        stdout.starts_with("Rivet ")
            && stdout.contains(" commit ")
            && stdout.contains("net ABI v6-v12"),
        "rivet version: {stdout}"
    );
    // The minimal build has no CollNet: its version line must not claim it.
    assert_eq!(
        stdout.contains("CollNet ABI v6-v12"),
        !minimal,
        "CollNet in the version line of the {} build: {stdout}",
        if minimal { "minimal" } else { "default" }
    );
    let library = library.display().to_string();
    let (out, _, stderr) = run(
        "transfer v12 with the unpacked library",
        &mut over_fabric(env!("RIVET_C_TRANSFER"), &[&library, "--version", "12"]),
    );
    assert!(out.status.success(), "transfer v12 exit status ({library})");
    common::check_transfer(&stderr);
    let _ = std::fs::remove_dir_all(top.parent().unwrap_or(&top));
}

#[test]
#[ignore = "needs the fabric and the packages (scripts/fabric-lane.sh)"]
fn the_default_tarball_unpacked_moves_data_over_the_fabric() {
    unpacked_tarball_works(false);
}

#[test]
#[ignore = "needs the fabric and the packages (scripts/fabric-lane.sh)"]
fn the_minimal_tarball_unpacked_moves_data_over_the_fabric() {
    unpacked_tarball_works(true);
}

/// `all_connect` with `ranks` ranks on this host; every rank must connect to every other.
fn all_connect(ranks: u32) {
    let dir = std::env::temp_dir().join(format!(
        "rivet-fabric-all-connect-{}-{ranks}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    let n = ranks.to_string();
    let (out, _, stderr) = run(
        &format!("all_connect {ranks} ranks"),
        &mut over_fabric(
            env!("RIVET_C_ALL_CONNECT"),
            &[
                &lib(),
                "--ranks",
                &n,
                "--local",
                &n,
                "--dir",
                &dir.display().to_string(),
            ],
        ),
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success() && !stderr.contains("FAIL "),
        "all_connect {ranks}"
    );
    let passed = stderr
        .lines()
        .filter(|l| l.starts_with("PASS [rank"))
        .count();
    assert!(
        passed >= ranks as usize,
        "all_connect {ranks}: {passed} rank lines passed"
    );
}

#[test]
#[ignore = "needs the fabric (scripts/fabric-lane.sh)"]
fn all_to_all_connect_of_8_ranks() {
    all_connect(8);
}

#[test]
#[ignore = "needs the fabric (scripts/fabric-lane.sh)"]
fn all_to_all_connect_of_32_ranks() {
    all_connect(32);
}

/// The `tests/c/faults.c` scenarios that make sense between processes of one host. Link state,
/// device removal and the memlock limit (which needs another user and a device node) stay in
/// the VM lane.
const FAULTS: [&str; 8] = [
    "kill-sender",
    "kill-receiver",
    "hostile",
    "handshake-timeout",
    "bad-regmr",
    "fork",
    "cycles=100",
    "close-inflight=10",
];

#[test]
#[ignore = "needs the fabric (scripts/fabric-lane.sh)"]
fn faults_end_in_errors_not_hangs() {
    let mut stderr_all = String::new();
    for scenario in FAULTS {
        let mut command = over_fabric(env!("RIVET_C_FAULTS"), &[&lib(), scenario]);
        if scenario == "handshake-timeout" {
            command.env("RIVET_HANDSHAKE_TIMEOUT_MS", "1500");
        }
        let (out, _, stderr) = run(&format!("faults {scenario}"), &mut command);
        assert!(out.status.success(), "fault scenario {scenario} failed");
        assert!(!stderr.contains("FAIL ["), "{scenario}: a check failed");
        stderr_all += &stderr;
    }
    assert!(
        stderr_all.contains("failed: the peer closed the connection or died"),
        "no peer-death line"
    );
}

/// One port of a device fused from two, cut in both processes mid-stream (the fabric's control
/// file, docs/fabric.md): without port failover (issue #39) the connection fails on both sides
/// within twice the retry budget plus 5 s (`NCCL_IB_TIMEOUT=14`, `NCCL_IB_RETRY_CNT=2`: 0.2 s),
/// never a hang, and later calls fail at once.
#[test]
#[ignore = "needs the fabric (scripts/fabric-lane.sh)"]
fn a_cut_port_of_a_fused_device_fails_the_connection_in_bound() {
    let dir = std::env::temp_dir().join(format!("rivet-port-cut-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory for the port-cut fabric");
    let ctl = dir.join("ctl");
    std::fs::write(&ctl, "").expect("the control file");
    let mut command = over_fabric(env!("RIVET_C_FAULTS"), &[&lib(), "port-cut"]);
    command
        .env("RIVET_FABRIC_DIR", dir.join("fabric"))
        .env("RIVET_FABRIC_PORTS", "2")
        .env("RIVET_FABRIC_CTL", &ctl)
        .env("FAULTS_FUSE", "0,1")
        .env("NCCL_IB_TIMEOUT", "14")
        .env("NCCL_IB_RETRY_CNT", "2");
    let (out, _, stderr) = run("faults port-cut", &mut command);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "the port-cut scenario failed");
    assert!(!stderr.contains("FAIL ["), "port-cut: a check failed");
    assert!(
        stderr.matches("port cut (no failover): error").count() == 2,
        "both sides must fail in bound"
    );
}

/// One run of a faults port-failover scenario, port failover on in both processes, the fused
/// device's first member's port cut after `cut_at` messages: by default a device fused from the
/// two ports of `rfab0`, port 1 cut; `extra` more environment after that (another fabric, e.g.
/// `RIVET_FABRIC_DEVICES=2`, another port to cut, `FAULTS_CUT_PORT`, or a cut in the receiver's
/// process only, `FAULTS_CUT_SIDES=receiver`). Its stderr.
fn port_failover_run(scenario: &str, cut_at: u32, extra: &[(&str, &str)]) -> String {
    // Each run its own fabric, also when tests run in parallel (one process: one pid).
    static RUNS: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "rivet-{scenario}-{}-{cut_at}-{}",
        std::process::id(),
        RUNS.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("a directory for the port-failover fabric");
    let ctl = dir.join("ctl");
    std::fs::write(&ctl, "").expect("the control file");
    let mut command = over_fabric(env!("RIVET_C_FAULTS"), &[&lib(), scenario]);
    command
        .env("RIVET_FABRIC_DIR", dir.join("fabric"))
        .env("RIVET_FABRIC_PORTS", "2")
        .env("RIVET_FABRIC_CTL", &ctl)
        .env("FAULTS_FUSE", "0,1")
        .env("FAULTS_CUT_AT", cut_at.to_string())
        .env("NCCL_IB_RESILIENCY_PORT_FAILOVER", "1")
        .env("RIVET_STATS_DIR", &dir)
        .env("NCCL_IB_TIMEOUT", "14")
        .env("NCCL_IB_RETRY_CNT", "2");
    for (k, v) in extra {
        command.env(k, v);
    }
    let settings: Vec<String> = extra.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let (out, _, stderr) = run(
        &format!(
            "faults {scenario} (cut after {cut_at}{}{})",
            if settings.is_empty() { "" } else { "; " },
            settings.join(" ")
        ),
        &mut command,
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success() && !stderr.contains("FAIL ["),
        "{scenario}, cut after {cut_at} messages ({settings:?}): a check failed"
    );
    stderr
}

/// The cut points of a failover test's trials, one each: `RIVET_FAILOVER_TRIALS` of them (3 by
/// default: 100 by hand), each at random in 1..=80 (a xorshift seeded by the process id and
/// `salt`).
fn failover_cut_points(salt: u64) -> Vec<u32> {
    let trials: u32 = std::env::var("RIVET_FAILOVER_TRIALS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(3);
    let mut seed = (u64::from(std::process::id()) ^ salt) | 1;
    (0..trials)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            1 + (seed % 80) as u32
        })
        .collect()
}

/// What every trial of a port-failover test must show in `stderr`: both sides saw every message
/// across the cut, the failover's WARN line (lane moved, replayed, time taken), and both
/// processes published their failover counts. Returns the longest wait either side reported.
fn check_failed_over(stderr: &str, trial: usize, cut_at: u32) -> f64 {
    assert_eq!(
        stderr
            .matches("byte-exact and in order across the cut")
            .count(),
        2,
        "trial {trial} (cut after {cut_at}): both sides must see every message"
    );
    assert!(
        stderr.contains("port failover: lane"),
        "trial {trial}: the failover's WARN line (lane moved, replayed, time taken)"
    );
    assert_eq!(
        stderr.matches("published for rivet info --stats").count(),
        2,
        "trial {trial}: both processes publish their failover counts"
    );
    stderr
        .split("recovery: longest wait ")
        .skip(1)
        .filter_map(|rest| rest.split(' ').next()?.parse::<f64>().ok())
        .fold(0.0, f64::max)
}

#[test]
#[ignore = "needs the fabric (scripts/fabric-lane.sh)"]
fn a_cut_port_of_a_fused_device_fails_over_and_the_stream_goes_on() {
    // Port failover on in both processes: the cut port's lanes move to port 2 and every message
    // (8 B to 4 MiB, 4 in flight) still arrives byte-exact, in order, without an error. The cut
    // point is random per trial (RIVET_FAILOVER_TRIALS, 3 by default: 100 by hand), and the
    // connection has one queue pair per port, then two (NCCL_IB_QPS_PER_CONNECTION=2, split).
    for (trial, cut_at) in failover_cut_points(0).into_iter().enumerate() {
        let extra: &[(&str, &str)] = if trial % 2 == 1 {
            &[
                ("NCCL_IB_QPS_PER_CONNECTION", "2"),
                ("NCCL_IB_SPLIT_DATA_ON_QPS", "1"),
            ]
        } else {
            &[]
        };
        let stderr = port_failover_run("port-failover", cut_at, extra);
        check_failed_over(&stderr, trial, cut_at);
    }
}

#[test]
#[ignore = "needs the fabric (scripts/fabric-lane.sh)"]
fn a_cut_device_of_a_fused_pair_fails_over_and_the_stream_goes_on() {
    // Two devices of one port each (RIVET_FABRIC_DEVICES=2: rfab0 and rfab1, NCCL devices 0 and
    // 1, two protection domains) fused into one; rfab0's port cut at a random point of the
    // stream, port failover on in both processes: the cut device's lanes move to rfab1 and every
    // message still arrives byte-exact, in order, without an error. Every other trial cuts the
    // port in the receiver's process only (FAULTS_CUT_SIDES=receiver: the sender's port stays up
    // and it meets the cut from its end of the link, as a cut link looks in the VM rig); every
    // other pair of trials has two queue pairs per port (split).
    let mut longest = 0.0_f64;
    for (trial, cut_at) in failover_cut_points(0x5eed_d0d0).into_iter().enumerate() {
        let mut extra = vec![
            ("RIVET_FABRIC_PORTS", "1"),
            ("RIVET_FABRIC_DEVICES", "2"),
            ("FAULTS_CUT_PORT", "rfab0 1"),
        ];
        if trial % 2 == 1 {
            extra.push(("FAULTS_CUT_SIDES", "receiver"));
        }
        if trial / 2 % 2 == 1 {
            extra.push(("NCCL_IB_QPS_PER_CONNECTION", "2"));
            extra.push(("NCCL_IB_SPLIT_DATA_ON_QPS", "1"));
        }
        let stderr = port_failover_run("port-failover", cut_at, &extra);
        longest = longest.max(check_failed_over(&stderr, trial, cut_at));
        assert!(
            stderr.contains("from rfab0 port 1 to rfab1 port 1"),
            "trial {trial}: no lane moved from rfab0 to rfab1"
        );
    }
    eprintln!("fabric lane: failover across devices: longest wait {longest:.2} s");
}

#[test]
#[ignore = "needs the fabric (scripts/fabric-lane.sh)"]
fn with_both_ports_of_a_fused_device_cut_the_connection_fails_in_bound() {
    // Port 1 fails over; port 2 cut later leaves none: both sides fail with an error in bound.
    let stderr = port_failover_run("port-failover-both", 15, &[]);
    assert_eq!(
        stderr.matches("both ports cut: error").count(),
        2,
        "both sides must fail in bound"
    );
}

#[test]
#[ignore = "needs the fabric (scripts/fabric-lane.sh)"]
fn c_loader_with_the_fabric_device_checks_the_rma_tables() {
    // With a device, the RMA tables must init, list it and call it a GIN_PROXY device (NCCL
    // drops the table otherwise): checks the no-device run of tests/abi_loader.rs cannot make.
    let (out, _, stderr) = run(
        "loader devices",
        &mut over_fabric(env!("RIVET_C_LOADER"), &[&lib(), "devices"]),
    );
    assert!(
        out.status.success() && !stderr.lines().any(|l| l.starts_with("FAIL")),
        "the C loader with the fabric's device failed"
    );
    for version in 13..=16 {
        for needle in [
            format!("PASS rma v{version} init succeeds"),
            format!("PASS rma v{version} device 0 is a GIN_PROXY device"),
            format!("PASS rma v{version} init/finalize per communicator, 50 times"),
        ] {
            assert!(stderr.contains(&needle), "loader: missing {needle:?}");
        }
    }
}

/// `tests/c/rma.c` over the fabric with `args` after the library; its stderr, after checking the
/// exit status, that no check failed and that the summary line names the run.
fn rma(args: &[&str], summary: &str) -> String {
    let mut all = vec![lib()];
    all.extend(args.iter().map(|a| (*a).to_owned()));
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let mut command = over_fabric(env!("RIVET_C_RMA"), &all);
    if args.contains(&"--kill") {
        // Short transport retries: the survivors must see the death within the bound.
        command
            .env("NCCL_IB_TIMEOUT", "12")
            .env("NCCL_IB_RETRY_CNT", "2");
    }
    let (out, _, stderr) = run(&format!("rma {}", args.join(" ")), &mut command);
    assert!(
        !stderr.lines().any(|l| l.starts_with("FAIL ")),
        "rma {args:?}: a check failed"
    );
    assert!(out.status.success(), "rma {args:?}: exit status");
    let last = stderr.lines().rev().find(|l| l.starts_with("rma: "));
    assert!(
        last.is_some_and(|l| l.starts_with(summary) && l.contains(", 0 rank(s) failed")),
        "rma {args:?}: summary {last:?}, want it to start with {summary:?}"
    );
    stderr
}

#[test]
#[ignore = "needs the fabric (scripts/fabric-lane.sh)"]
fn rma_conformance_of_2_ranks() {
    let stderr = rma(&["--ranks", "2", "--quick"], "rma: v16, 2 ranks");
    common::check_rma(&stderr, 16);
}

#[test]
#[ignore = "needs the fabric (scripts/fabric-lane.sh)"]
fn rma_conformance_of_3_ranks() {
    let stderr = rma(&["--ranks", "3", "--quick"], "rma: v16, 3 ranks");
    common::check_rma(&stderr, 16);
}

#[test]
#[ignore = "needs the fabric (scripts/fabric-lane.sh)"]
fn rma_conformance_of_8_ranks() {
    let stderr = rma(&["--ranks", "8", "--quick"], "rma: v16, 8 ranks");
    common::check_rma(&stderr, 16);
}

#[test]
#[ignore = "needs the fabric (scripts/fabric-lane.sh)"]
fn rma_conformance_through_the_v13_v14_and_v15_tables() {
    for version in ["13", "14", "15"] {
        let stderr = rma(
            &["--ranks", "2", "--quick", "--version", version],
            &format!("rma: v{version}, 2 ranks"),
        );
        common::check_rma(&stderr, version.parse().unwrap_or_default());
    }
}

#[test]
#[ignore = "needs the fabric (scripts/fabric-lane.sh)"]
fn rma_killed_member_fails_the_others_puts_not_the_survivors() {
    let stderr = rma(&["--ranks", "3", "--kill"], "rma: v16, 3 ranks");
    for needle in [
        "PASS puts towards the killed rank 2 failed at",
        "PASS queryLastError reports the error after the peer's death",
        "PASS after the death of rank 2, iput and iget between the 2 survivors complete",
    ] {
        assert!(stderr.contains(needle), "rma --kill: missing {needle:?}");
    }
}

#[test]
#[ignore = "needs the fabric (scripts/fabric-lane.sh)"]
fn rma_bench_prints_its_figures() {
    let stderr = rma(&["--ranks", "2", "--bench", "--quick"], "rma: v16, 2 ranks");
    let figure = |prefix: &str| -> f64 {
        stderr
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("rma --bench printed no {prefix:?} figure"))
    };
    for size in ["65536", "1048576", "4194304"] {
        let gbs = figure(&format!("BENCH rma put {size} "));
        assert!(gbs > 0.0, "put {size}: {gbs} GB/s");
        eprintln!("fabric lane: rma put {size} B: {gbs:.3} GB/s");
    }
    let rtt = figure("BENCH rma putsignal-rtt 8 ");
    let half = figure("BENCH rma putsignal-half-rtt 8 ");
    assert!(
        rtt > 0.0 && (half * 2.0 - rtt).abs() < 0.05,
        "rtt {rtt}, half {half}"
    );
    eprintln!("fabric lane: rma put-with-signal round trip: {rtt:.2} us");
}
