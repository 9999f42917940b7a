//! The multi-VM rig (issue #12): two Soft-RoCE VMs wired by two links on two subnets (`vm/multi.sh
//! --topology pair2`, the dual-rail node), Rivet between them through the plugin's C table.
//!
//! In one boot, on each link in turn (`NCCL_IB_HCA==rxeK`, `NCCL_SOCKET_IFNAME=ethK`):
//! `tests/c/transfer.c` across hosts (B receives, A sends; the handle over a TCP control connection
//! on the link), every byte verified, and the link NIC's counters must show the traffic went that
//! way. Then the link-cut fault on link 2 (B takes `eth2` down mid-stream: both ends must fail
//! within the silent-peer bound, later calls too). Then the host-death fault: B streams receives on link 1 and, mid-stream, the host SIGKILLs
//! B's whole VM (`--kill-on`); A's sends must fail within the silent-peer bound
//! (`tests/c/faults.c host-death`, `NCCL_IB_TIMEOUT=14`), and later calls fail too.
//!
//! Slow (two VMs under TCG), so it is `#[ignore]`d; `scripts/vm-rig.sh` (run by `.ci/run`) runs it.

use std::path::PathBuf;
use std::process::Command;

mod common;
use common::plugin_library;

/// The script both VMs run; VM A (index 0) sends and survives, VM B receives and is the victim.
/// Each step prints `STEP <name> rc=<code>`.
fn script() -> String {
    let lib = plugin_library();
    let lib = lib.display();
    let transfer = env!("RIVET_C_TRANSFER");
    let faults = env!("RIVET_C_FAULTS");
    let conformance = env!("RIVET_C_CONFORMANCE");
    format!(
        r#"set -u
step() {{ name=$1; shift; "$@"; echo "STEP $name rc=$?"; }}
bytes() {{ echo $(( $(cat /sys/class/net/$1/statistics/rx_bytes) + $(cat /sys/class/net/$1/statistics/tx_bytes) )); }}
# At least 64 MiB more went through NIC $1 than $2 bytes.
carried() {{ test $(( $(bytes $1) - $2 )) -gt 67108864; }}
set -- $RIVET_VM_PEER_ADDRS
peers=("$@")
for k in 1 2; do
  peer=${{peers[$((k - 1))]}}
  before=$(bytes eth$k)
  if [ "$RIVET_VM_INDEX" = 1 ]; then
    step transfer-link$k env NCCL_IB_HCA==rxe$k NCCL_SOCKET_IFNAME=eth$k {transfer} {lib} --listen-port 1860$k
  else
    step transfer-link$k env NCCL_IB_HCA==rxe$k NCCL_SOCKET_IFNAME=eth$k {transfer} {lib} --peer $peer:1860$k
  fi
  step traffic-link$k carried eth$k $before
done
# Conformance across hosts on link 1: B runs the receiver side of every two-process check of every
# table, A the sender side, a TCP control connection per check instead of the socketpair.
if [ "$RIVET_VM_INDEX" = 1 ]; then
  step conformance env NCCL_IB_HCA==rxe1 NCCL_SOCKET_IFNAME=eth1 {conformance} {lib} --across receiver:18630
else
  step conformance env NCCL_IB_HCA==rxe1 NCCL_SOCKET_IFNAME=eth1 {conformance} {lib} --across sender:${{peers[0]}}:18630
fi
export NCCL_IB_TIMEOUT=14
# Link cut on link 2: B takes its eth2 down mid-stream; both ends must fail within the bound.
if [ "$RIVET_VM_INDEX" = 1 ]; then
  step link-cut env NCCL_IB_HCA==rxe2 NCCL_SOCKET_IFNAME=eth2 FAULTS_CUT_IF=eth2 {faults} {lib} link-cut --listen-port 18612
else
  step link-cut env NCCL_IB_HCA==rxe2 NCCL_SOCKET_IFNAME=eth2 {faults} {lib} link-cut --peer ${{peers[1]}}:18612
fi
export NCCL_IB_HCA==rxe1 NCCL_SOCKET_IFNAME=eth1 FAULTS_MARKER=$RIVET_VM_SET/B.mid-stream
if [ "$RIVET_VM_INDEX" = 1 ]; then
  {faults} {lib} host-death --listen-port 18611
else
  step host-death {faults} {lib} host-death --peer ${{peers[0]}}:18611
fi
"#
    )
}

#[test]
#[ignore = "boots two QEMU VMs (minutes under TCG); run by scripts/vm-rig.sh"]
fn pair2_across_hosts() {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let (stdout, stderr) = common::run_lane(
        Command::new(repo.join("vm/multi.sh"))
            .current_dir(&repo)
            .args([
                "--topology",
                "pair2",
                "--timeout",
                "1200",
                "--kill-on",
                "B=B.mid-stream",
                "--",
                "bash",
                "-c",
                &script(),
            ]),
    );
    assert!(
        stderr.contains("rivet-vm: B killed"),
        "B's VM was never killed: the host-death fault did not happen"
    );

    let step = |vm: &str, name: &str| -> i32 {
        let prefix = format!("[{vm}] STEP {name} rc=");
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rc| rc.trim().parse().ok())
            .unwrap_or_else(|| panic!("{vm}: step {name} did not run"))
    };
    for k in [1, 2] {
        for vm in ["A", "B"] {
            assert_eq!(
                step(vm, &format!("transfer-link{k}")),
                0,
                "{vm}: transfer across hosts on link {k} failed"
            );
            assert_eq!(
                step(vm, &format!("traffic-link{k}")),
                0,
                "{vm}: the transfer on link {k} did not go through eth{k}"
            );
        }
    }
    for needle in [
        "[B] PASS message of 67108864 bytes arrived intact",
        "[B] PASS grouped receive of 8 with shuffled tags",
        "[B] PASS 10000 small messages with a window of 8",
    ] {
        assert_eq!(
            stderr.matches(needle).count(),
            2,
            "{needle:?} not seen once per link"
        );
    }
    for vm in ["A", "B"] {
        assert_eq!(
            step(vm, "conformance"),
            0,
            "{vm}: a conformance check across hosts failed"
        );
        let summary = stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("[{vm}] conformance: ")))
            .unwrap_or_else(|| panic!("{vm}: no conformance summary"));
        let passed: u32 = summary
            .split(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        assert!(
            passed >= 20 && summary.ends_with(" 0 failed"),
            "{vm}: conformance across hosts: {summary}"
        );
        assert!(
            stdout.contains(&format!("[{vm}] PASS v12 16 channels x 8 in flight")),
            "{vm}: the full suite's pair checks did not run across hosts"
        );
    }
    for vm in ["A", "B"] {
        assert_eq!(
            step(vm, "link-cut"),
            0,
            "{vm}: no error within the bound after link 2 was cut"
        );
    }
    assert!(stderr.contains("[B] PASS [receiver] link cut: error"));
    assert!(stderr.contains("[A] PASS [sender] link cut: error"));
    assert_eq!(
        step("A", "host-death"),
        0,
        "the survivor did not fail within the bound after its peer host died"
    );
    assert!(stderr.contains("[A] PASS [sender] peer host death: error"));
    assert!(stderr.contains("[A] PASS [sender] peer host death: a later call fails too"));
}
