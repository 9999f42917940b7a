//! `rivet doctor` on this machine (the host: usually no RDMA device, no GPU): every check answers,
//! the exit status follows the verdicts, and a machine without RDMA says so.

use std::process::Command;

const CHECKS: [&str; 12] = [
    "memlock",
    "devices",
    "mtu",
    "roce-v2",
    "gid",
    "gpu-memory",
    "acs",
    "iommu",
    "relaxed-ordering",
    "env",
    "socket-if",
    "version",
];

fn doctor(args: &[&str]) -> (String, i32) {
    let out = Command::new(env!("CARGO_BIN_EXE_rivet"))
        .arg("doctor")
        .args(args)
        .env_remove("NCCL_IB_HCA")
        .env_remove("NCCL_SOCKET_IFNAME")
        .output()
        .expect("run rivet doctor");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        out.status.code().expect("exit code"),
    )
}

#[test]
fn every_check_answers_and_the_exit_status_follows_the_verdicts() {
    let (text, rc) = doctor(&[]);
    for line in text.lines() {
        assert!(
            ["OK   ", "WARN ", "FAIL "]
                .iter()
                .any(|p| line.starts_with(p)),
            "line without a verdict: {line}"
        );
    }
    for check in CHECKS {
        assert!(
            text.lines().any(|l| l[5..].starts_with(check)),
            "check {check} did not answer:\n{text}"
        );
    }
    let fails = text.lines().filter(|l| l.starts_with("FAIL")).count();
    assert_eq!(
        rc,
        i32::from(fails > 0),
        "exit status {rc} with {fails} FAIL lines:\n{text}"
    );
    if !std::path::Path::new("/sys/class/infiniband").exists() {
        let devices = text
            .lines()
            .find(|l| l[5..].starts_with("devices:"))
            .unwrap();
        assert!(
            devices.starts_with("WARN") && devices.contains("no RDMA device"),
            "{devices}"
        );
    }

    let (json, json_rc) = doctor(&["--json"]);
    assert_eq!(json_rc, rc);
    assert!(
        json.starts_with("{\"ok\":") && json.trim_end().ends_with("]}"),
        "{json}"
    );
    assert!(json.contains(&format!("\"fail\":{fails},")), "{json}");
    for check in CHECKS {
        assert!(
            json.contains(&format!("{{\"check\":\"{check}")),
            "{check} missing in {json}"
        );
    }
}

#[test]
fn a_missing_interface_in_nccl_socket_ifname_fails() {
    let out = Command::new(env!("CARGO_BIN_EXE_rivet"))
        .args(["doctor"])
        .env("NCCL_SOCKET_IFNAME", "=rivetnosuch0")
        .output()
        .expect("run rivet doctor");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let env = text
        .lines()
        .find(|l| l.contains(" env: "))
        .expect("env line");
    assert!(
        env.starts_with("FAIL") && env.contains("\"rivetnosuch0\" does not exist"),
        "{env}"
    );
    let socket = text
        .lines()
        .find(|l| l.contains(" socket-if: "))
        .expect("socket line");
    assert!(socket.starts_with("FAIL"), "{socket}");
}
