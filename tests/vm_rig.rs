//! The multi-VM rig (issue #12): two Soft-RoCE VMs wired by two links on two subnets (`vm/multi.sh
//! --topology pair2`, the dual-rail node), Rivet between them through the plugin's C table.
//!
//! In one boot, on each link in turn (`NCCL_IB_HCA==rxeK`, `NCCL_SOCKET_IFNAME=ethK`):
//! `tests/c/transfer.c` across hosts (B receives, A sends; also over four split queue pairs per
//! connection on link 2; the handle over a TCP control connection
//! on the link), every byte verified, and the link NIC's counters must show the traffic went that
//! way. Then a link of the fused device (rxe1 and rxe2 through `makeVDevice`) cut mid-stream (B
//! takes `eth2` down): without port failover both ends fail within the bound (`fused-cut`); with
//! it (`NCCL_IB_RESILIENCY_PORT_FAILOVER=1`, `faults link-failover`) the stream goes on over the
//! other link to the end, byte-exact, its recovery time printed (`fused-failover`). Then the
//! link-cut fault on link 2 (B takes `eth2` down mid-stream: both ends must fail within the
//! silent-peer bound, later calls too). Then the host-death fault: B grants 8 receives
//! of 64 MiB on link 1 and the host SIGKILLs B's whole VM while A writes them; A's queue pair must
//! fail by RDMA retry exhaustion within 2 x the retry time + 5 s of the kill
//! (`tests/c/faults.c host-death`, `NCCL_IB_TIMEOUT=14`, `NCCL_IB_RETRY_CNT=2`), and later calls fail
//! too. CollNet across hosts on link 1 (`tests/c/collnet.c`, four ranks, two per VM, bit-exact
//! results).
//!
//! After the host death, B's VM boots again (`--reboot-on`) and a new connection from A to it
//! works. A second test boots the `triangle` (three VMs, a link per pair on its own subnet) and moves
//! byte-checked data between every pair over its own link.
//!
//! Slow (VMs under TCG), so both are `#[ignore]`d; `scripts/vm-rig.sh` (run by `.ci/run`) runs them.

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
    let collnet = env!("RIVET_C_COLLNET");
    format!(
        r#"set -u
step() {{ name=$1; shift; "$@"; echo "STEP $name rc=$?"; }}
set -- $RIVET_VM_PEER_ADDRS
peers=("$@")
if [ "$RIVET_VM_BOOT" = 2 ]; then
  # B, booted again after its VM was killed: a new connection on link 1 works.
  step reboot-transfer env NCCL_IB_HCA==rxe1 NCCL_SOCKET_IFNAME=eth1 {transfer} {lib} --quick --small 500 --listen-port 18641
  exit 0
fi
bytes() {{ echo $(( $(cat /sys/class/net/$1/statistics/rx_bytes) + $(cat /sys/class/net/$1/statistics/tx_bytes) )); }}
# At least 64 MiB more went through NIC $1 than $2 bytes.
carried() {{ test $(( $(bytes $1) - $2 )) -gt 67108864; }}
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
# Four queue pairs per connection, every message split over all four, across hosts on link 2.
before=$(bytes eth2)
lanes="NCCL_IB_HCA==rxe2 NCCL_SOCKET_IFNAME=eth2 NCCL_IB_QPS_PER_CONNECTION=4 NCCL_IB_SPLIT_DATA_ON_QPS=1 HARNESS_VERBOSE=1"
if [ "$RIVET_VM_INDEX" = 1 ]; then
  step transfer-qps4 env $lanes {transfer} {lib} --small 2000 --listen-port 18603
else
  step transfer-qps4 env $lanes {transfer} {lib} --small 2000 --peer ${{peers[1]}}:18603
fi
step traffic-qps4 carried eth2 $before
# NIC fusion: rxe1 and rxe2 fused by makeVDevice into one device; each message is striped over
# one queue pair per link, so each link must carry at least 40 % of the bytes.
b1=$(bytes eth1); b2=$(bytes eth2)
fused="NCCL_IB_HCA==rxe1,rxe2 NCCL_SOCKET_IFNAME=eth1 HARNESS_VERBOSE=1"
if [ "$RIVET_VM_INDEX" = 1 ]; then
  step transfer-fused env $fused {transfer} {lib} --fuse 0,1 --small 2000 --listen-port 18604
else
  step transfer-fused env $fused {transfer} {lib} --fuse 0,1 --small 2000 --peer ${{peers[0]}}:18604
fi
d1=$(( $(bytes eth1) - b1 )); d2=$(( $(bytes eth2) - b2 ))
echo "fused traffic: eth1 $d1 B, eth2 $d2 B"
step fused-share test $(( d1 * 100 / (d1 + d2 + 1) )) -ge 40 -a $(( d2 * 100 / (d1 + d2 + 1) )) -ge 40 -a $(( d1 + d2 )) -gt 67108864
# Conformance across hosts on link 1: B runs the receiver side of every two-process check of every
# table, A the sender side, a TCP control connection per check instead of the socketpair.
if [ "$RIVET_VM_INDEX" = 1 ]; then
  step conformance env NCCL_IB_HCA==rxe1 NCCL_SOCKET_IFNAME=eth1 {conformance} {lib} --across receiver:18630
else
  step conformance env NCCL_IB_HCA==rxe1 NCCL_SOCKET_IFNAME=eth1 {conformance} {lib} --across sender:${{peers[0]}}:18630
fi
# CollNet across hosts on link 1: four ranks, two per VM; A serves the handle exchange.
if [ "$RIVET_VM_INDEX" = 1 ]; then
  step collnet env NCCL_IB_HCA==rxe1 NCCL_SOCKET_IFNAME=eth1 {collnet} {lib} --ranks 4 --first-rank 2 --local 2 --server ${{peers[0]}}:18650 --quick
else
  step collnet env NCCL_IB_HCA==rxe1 NCCL_SOCKET_IFNAME=eth1 {collnet} {lib} --ranks 4 --local 2 --serve 18650 --quick
fi
export NCCL_IB_TIMEOUT=14
# A member of a fused device cut: rxe1+rxe2 fused, B takes eth2 down mid-stream; the connection
# must fail on both ends within the bound. Then eth2 comes back for the next cut.
fused="NCCL_IB_HCA==rxe1,rxe2 NCCL_SOCKET_IFNAME=eth1 FAULTS_FUSE=0,1"
if [ "$RIVET_VM_INDEX" = 1 ]; then
  step fused-cut env $fused FAULTS_CUT_IF=eth2 {faults} {lib} link-cut --listen-port 18613
  ip link set eth2 up
else
  step fused-cut env $fused {faults} {lib} link-cut --peer ${{peers[0]}}:18613
fi
sleep 5
# Port failover across the fused device's links (issue #39): as fused-cut, with
# NCCL_IB_RESILIENCY_PORT_FAILOVER=1 at both ends (NCCL_IB_RETRY_CNT=2: Soft-RoCE retries for ever
# at 7, see host-death). B takes eth2 down after 20 verified messages of a stream of 100 (8 B -
# 4 MiB, 4 in flight); the stream must go on over link 1 to the end, byte-exact, no call failing.
# The longest wait for one completion is the recovery time. Then eth2 comes back.
failover="$fused NCCL_IB_RESILIENCY_PORT_FAILOVER=1 NCCL_IB_RETRY_CNT=2 HARNESS_VERBOSE=1"
if [ "$RIVET_VM_INDEX" = 1 ]; then
  step fused-failover env $failover FAULTS_CUT_IF=eth2 {faults} {lib} link-failover --listen-port 18614
  ip link set eth2 up
else
  step fused-failover env $failover {faults} {lib} link-failover --peer ${{peers[0]}}:18614
fi
sleep 5
# Link cut on link 2: B takes its eth2 down mid-stream; both ends must fail within the bound.
if [ "$RIVET_VM_INDEX" = 1 ]; then
  step link-cut env NCCL_IB_HCA==rxe2 NCCL_SOCKET_IFNAME=eth2 FAULTS_CUT_IF=eth2 {faults} {lib} link-cut --listen-port 18612
else
  step link-cut env NCCL_IB_HCA==rxe2 NCCL_SOCKET_IFNAME=eth2 {faults} {lib} link-cut --peer ${{peers[1]}}:18612
fi
# Host death on link 1: B's VM is SIGKILLed while A writes 512 MiB into it. NCCL_IB_RETRY_CNT=2:
# Soft-RoCE retries forever at 7 (rxe_comp.c never counts 7 down), hardware gives up after 7.
export NCCL_IB_HCA==rxe1 NCCL_SOCKET_IFNAME=eth1 FAULTS_MARKER=$RIVET_VM_SET/B.mid-stream NCCL_IB_RETRY_CNT=2
if [ "$RIVET_VM_INDEX" = 1 ]; then
  {faults} {lib} host-death --listen-port 18611
else
  step host-death {faults} {lib} host-death --peer ${{peers[0]}}:18611
  # B boots again: a new connection to it works.
  unset NCCL_IB_RETRY_CNT
  step reboot-transfer {transfer} {lib} --quick --small 500 --peer ${{peers[0]}}:18641
fi
"#
    )
}

/// Boot `topology` with `vm/multi.sh` (`options` before `--`), run `script` in every VM, and
/// return (stdout, stderr).
fn run_rig(topology: &str, options: &[&str], script: &str) -> (String, String) {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    common::run_lane(
        Command::new(repo.join("vm/multi.sh"))
            .current_dir(&repo)
            .args(["--topology", topology])
            .args(options)
            .args(["--", "bash", "-c", script]),
    )
}

/// The exit status VM `vm` printed for its step `name` (`[A] STEP name rc=0`), if it ran.
fn step_rc(stdout: &str, vm: &str, name: &str) -> Option<i32> {
    let prefix = format!("[{vm}] STEP {name} rc=");
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rc| rc.trim().parse().ok())
}

#[test]
#[ignore = "boots two QEMU VMs (minutes under TCG); run by scripts/vm-rig.sh"]
fn pair2_across_hosts() {
    let (stdout, stderr) = run_rig(
        "pair2",
        &["--timeout", "1200", "--reboot-on", "B=B.mid-stream"],
        &script(),
    );
    assert!(
        stderr.contains("rivet-vm: killed B") && stderr.contains("rivet-vm: booting B again"),
        "B's VM was never killed and booted again: the host-death fault did not happen"
    );

    let step = |vm: &str, name: &str| -> i32 {
        step_rc(&stdout, vm, name).unwrap_or_else(|| panic!("{vm}: step {name} did not run"))
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
    for vm in ["A", "B"] {
        assert_eq!(
            step(vm, "transfer-qps4"),
            0,
            "{vm}: transfer over four split queue pairs across hosts failed"
        );
        assert_eq!(
            step(vm, "traffic-qps4"),
            0,
            "{vm}: the four-queue-pair transfer did not go through eth2"
        );
        let lanes = "(4 queue pair(s), each message over 4)";
        assert!(
            stderr
                .lines()
                .any(|l| l.starts_with(&format!("[{vm}] ")) && l.contains(lanes)),
            "{vm}: no connection of four split queue pairs reported"
        );
    }
    for vm in ["A", "B"] {
        assert_eq!(
            step(vm, "transfer-fused"),
            0,
            "{vm}: transfer over the fused device of both links failed"
        );
        assert!(
            stderr.contains(&format!("[{vm}] PASS ["))
                && stdout.contains(&format!("[{vm}] fused traffic:")),
            "{vm}: no fused-traffic figures"
        );
        assert_eq!(
            step(vm, "fused-share"),
            0,
            "{vm}: a link of the fused device carried under 40 % of the bytes (see 'fused traffic')"
        );
    }
    for vm in ["A", "B"] {
        assert_eq!(
            step(vm, "fused-cut"),
            0,
            "{vm}: cutting one link of the fused device did not fail the connection within the bound"
        );
    }
    for vm in ["A", "B"] {
        assert_eq!(
            step(vm, "fused-failover"),
            0,
            "{vm}: with port failover on, the stream over the fused device did not go on after one \
             link was cut"
        );
    }
    for (vm, role) in [("A", "sender"), ("B", "receiver")] {
        let line = stderr
            .lines()
            .find(|l| {
                l.starts_with(&format!("[{vm}] PASS [{role}] link failover: "))
                    && l.contains("byte-exact and in order across the cut")
            })
            .unwrap_or_else(|| panic!("{vm}: no PASS line of the link failover"));
        let recovery = line
            .split("recovery: ")
            .nth(1)
            .and_then(|r| r.split(',').next())
            .unwrap_or("?");
        eprintln!("vm rig: {vm}: link failover across the fused device, recovery: {recovery}");
    }
    assert!(
        stderr.lines().any(|l| l.starts_with("[B] ")
            && l.contains("port failover: lane")
            && l.contains("moved from rxe2 port 1 to rxe1 port 1")),
        "B: no lane of the fused device moved from rxe2 (its link cut) to rxe1"
    );
    assert!(
        stderr.contains("PASS [receiver] fused devices 0,1 into device 2")
            && stderr.contains("PASS [sender] fused devices 0,1 into device 2"),
        "makeVDevice did not fuse both links on both hosts"
    );
    // Once per link, once over four queue pairs and once over the fused device; the grouped
    // receive once more in the transfer after B's reboot.
    for (needle, times) in [
        ("[B] PASS message of 67108864 bytes arrived intact", 4),
        ("[B] PASS grouped receive of 8 with shuffled tags", 5),
        ("[B] PASS 10000 small messages with a window of 8", 2),
        ("[B] PASS 2000 small messages with a window of 8", 2),
        ("[B] PASS 500 small messages with a window of 8", 1),
    ] {
        assert_eq!(
            stderr.matches(needle).count(),
            times,
            "{needle:?} not seen {times} times"
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
        assert_eq!(step(vm, "collnet"), 0, "{vm}: CollNet across hosts failed");
    }
    for needle in [
        "[A] PASS a group of 4 ranks formed",
        "[A] PASS iallreduce: 12 types x 5 ops x 4 counts",
        "[A] PASS iallgather (3 receive parts) and ireducescatter",
        "[A] PASS two groups formed and used at once",
    ] {
        assert!(
            stderr.contains(needle),
            "CollNet across hosts: missing {needle:?}"
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
    assert!(
        stderr.contains("[A] PASS [sender] peer host death: error")
            && stderr.contains("by RDMA retry exhaustion"),
        "the survivor did not fail by RDMA retry exhaustion"
    );
    assert!(stderr.contains("[A] PASS [sender] peer host death: a later call fails too"));
    for vm in ["A", "B"] {
        assert_eq!(
            step(vm, "reboot-transfer"),
            0,
            "{vm}: a new connection after B's reboot failed"
        );
    }
}

/// The triangle: three VMs, a link per pair, each link its own /24 (A–B 192.168.101, A–C
/// 192.168.100, B–C 192.168.102), two rxe devices per VM. Every pair moves byte-checked data over
/// its own link, through the plugin (the VM named first in the link listens): each VM reaches both
/// peers, one per NIC.
fn triangle_script() -> String {
    let lib = plugin_library();
    let lib = lib.display();
    let transfer = env!("RIVET_C_TRANSFER");
    let all_connect = env!("RIVET_C_ALL_CONNECT");
    let faults = env!("RIVET_C_FAULTS");
    format!(
        r#"set -u
step() {{ name=$1; shift; "$@"; echo "STEP $name rc=$?"; }}
read -r -a devs <<<"$RIVET_VM_NETDEVS"
read -r -a rxes <<<"$RIVET_VM_RXES"
read -r -a peers <<<"$RIVET_VM_PEER_ADDRS"
read -r -a names <<<"$RIVET_VM_PEERS"
for pair in AB:18701 AC:18702 BC:18703; do
  x=${{pair:0:1}} y=${{pair:1:1}} port=${{pair#*:}}
  for i in 0 1; do
    if [ "$RIVET_VM_NAME" = "$x" ] && [ "${{names[$i]}}" = "$y" ]; then
      step link-$x$y env NCCL_IB_HCA==${{rxes[$i]}} NCCL_SOCKET_IFNAME=${{devs[$i]}} {transfer} {lib} --quick --small 200 --listen-port $port
    elif [ "$RIVET_VM_NAME" = "$y" ] && [ "${{names[$i]}}" = "$x" ]; then
      step link-$x$y env NCCL_IB_HCA==${{rxes[$i]}} NCCL_SOCKET_IFNAME=${{devs[$i]}} {transfer} {lib} --quick --small 200 --peer ${{peers[$i]}}:$port
    fi
  done
done
# The mesh device (RIVET_MESH=1, every link NIC behind one device; rxe0 is the VMs' shared user
# network, the same address in every VM, so it stays out): each pair again, the plugin choosing
# the NIC; the RDMA packet counters of this VM's two link NICs show which link carried it.
export RIVET_MESH=1 NCCL_IB_HCA=^=rxe0
sent() {{ cat /sys/class/infiniband/$1/ports/1/hw_counters/sent_pkts; }}
for pair in AB:18711 AC:18712 BC:18713; do
  x=${{pair:0:1}} y=${{pair:1:1}} port=${{pair#*:}}
  for i in 0 1; do
    o=$((1 - i))
    if [ "$RIVET_VM_NAME" = "$x" ] && [ "${{names[$i]}}" = "$y" ]; then role="--listen-port $port"
    elif [ "$RIVET_VM_NAME" = "$y" ] && [ "${{names[$i]}}" = "$x" ]; then role="--peer ${{peers[$i]}}:$port"
    else continue; fi
    on=$(sent ${{rxes[$i]}}) off=$(sent ${{rxes[$o]}})
    step mesh-$x$y {transfer} {lib} --quick --small 200 $role
    on=$(( $(sent ${{rxes[$i]}}) - on )) off=$(( $(sent ${{rxes[$o]}}) - off ))
    echo "mesh-$x$y packets: ${{rxes[$i]}} (to ${{names[$i]}}) $on, ${{rxes[$o]}} (to ${{names[$o]}}) $off"
    step mesh-own-link-$x$y test $on -gt 200 -a $off -eq 0
  done
done
# All at once: every VM sends to and receives from both others through the mesh device.
code() {{ case $1 in A) echo 0 ;; B) echo 1 ;; C) echo 2 ;; esac; }}
me=$(code $RIVET_VM_NAME)
for i in 0 1; do
  peer=${{names[$i]}} them=$(code ${{names[$i]}})
  step a2a-from-$peer {transfer} {lib} --quick --small 200 --listen-port $((18720 + them * 3 + me)) &
  step a2a-to-$peer {transfer} {lib} --quick --small 200 --peer ${{peers[$i]}}:$((18720 + me * 3 + them)) &
done
wait
# NCCL's set-up pattern on the mesh: 9 ranks (3 processes per VM), each listening once per peer
# and polling every peer's connect and accept from one thread until all 16 connections are up.
step all-connect {all_connect} {lib} --ranks 9 --first-rank $((me * 3)) --local 3 --dir $RIVET_VM_SET
# No pair of NICs reaches: A keeps only its NIC to C, B only its NIC to C; A's connect to B must
# fail at once, naming both sides' addresses.
for i in 0 1; do [ "${{names[$i]}}" = C ] && to_c=$i; done
if [ "$RIVET_VM_NAME" = B ]; then
  timeout 15 env NCCL_IB_HCA==${{rxes[$to_c]}} {transfer} {lib} --quick --listen-port 18730 >/dev/null 2>&1 || true
elif [ "$RIVET_VM_NAME" = A ]; then
  for i in 0 1; do [ "${{names[$i]}}" = B ] && to_b=$i; done
  t0=$(date +%s%N)
  env NCCL_IB_HCA==${{rxes[$to_c]}} {transfer} {lib} --quick --peer ${{peers[$to_b]}}:18730
  echo "mismatch: exit $? after $(( ($(date +%s%N) - t0) / 1000000 )) ms"
fi
# Link A-B cut mid-stream (B takes its NIC to A down) while A and C keep moving data through the
# same mesh devices: only the A-B connection fails, within the bound; A-C works on, and after.
export NCCL_IB_TIMEOUT=14
for i in 0 1; do
  case ${{names[$i]}} in A) to_a=$i ;; B) to_b=$i ;; C) to_c=$i ;; esac
done
case $RIVET_VM_NAME in
  B) step mesh-cut env FAULTS_CUT_IF=${{devs[$to_a]}} {faults} {lib} link-cut --listen-port 18741 ;;
  A)
    step mesh-cut {faults} {lib} link-cut --peer ${{peers[$to_b]}}:18741 &
    step mesh-cut-other {transfer} {lib} --quick --small 2000 --peer ${{peers[$to_c]}}:18740
    wait
    step mesh-after-cut {transfer} {lib} --quick --small 100 --peer ${{peers[$to_c]}}:18742
    ;;
  C)
    step mesh-cut-other {transfer} {lib} --quick --small 2000 --listen-port 18740
    step mesh-after-cut {transfer} {lib} --quick --small 100 --listen-port 18742
    ;;
esac
"#
    )
}

#[test]
#[ignore = "boots three QEMU VMs (minutes under TCG); run by scripts/vm-rig.sh"]
fn triangle_every_pair_over_its_own_link() {
    let (stdout, stderr) = run_rig("triangle", &["--timeout", "600"], &triangle_script());
    for (pair, vms) in [("AB", ["A", "B"]), ("AC", ["A", "C"]), ("BC", ["B", "C"])] {
        for vm in vms {
            let rc = step_rc(&stdout, vm, &format!("link-{pair}"))
                .unwrap_or_else(|| panic!("{vm}: the transfer on link {pair} did not run"));
            assert_eq!(rc, 0, "{vm}: the transfer on link {pair} failed");
        }
    }
    for (pair, vms) in [("AB", ["A", "B"]), ("AC", ["A", "C"]), ("BC", ["B", "C"])] {
        for vm in vms {
            let rc = |name: &str| {
                step_rc(&stdout, vm, name)
                    .unwrap_or_else(|| panic!("{vm}: step {name} did not run"))
            };
            assert_eq!(
                rc(&format!("mesh-{pair}")),
                0,
                "{vm}: mesh transfer {pair} failed"
            );
            assert_eq!(
                rc(&format!("mesh-own-link-{pair}")),
                0,
                "{vm}: the mesh transfer {pair} did not use (only) its own link: {}",
                stdout
                    .lines()
                    .find(|l| l.starts_with(&format!("[{vm}] mesh-{pair} packets")))
                    .unwrap_or("no packet line")
            );
        }
    }
    for (vm, peers) in [("A", ["B", "C"]), ("B", ["A", "C"]), ("C", ["A", "B"])] {
        for peer in peers {
            for dir in ["from", "to"] {
                let name = format!("a2a-{dir}-{peer}");
                let rc = step_rc(&stdout, vm, &name)
                    .unwrap_or_else(|| panic!("{vm}: step {name} did not run"));
                assert_eq!(rc, 0, "{vm}: all-to-all {name} failed");
            }
        }
    }
    assert_eq!(
        stderr
            .matches("PASS 200 small messages with a window of 8, every byte verified")
            .count(),
        3 + 3 + 6,
        "one verified transfer per link, per mesh pair and per all-to-all direction"
    );
    for vm in ["A", "B", "C"] {
        let rc = step_rc(&stdout, vm, "all-connect")
            .unwrap_or_else(|| panic!("{vm}: the all-to-all connect did not run"));
        assert_eq!(
            rc, 0,
            "{vm}: 9 ranks connecting to each other at once failed"
        );
    }
    assert_eq!(
        stderr
            .matches("connected to and from all 8 peers at once")
            .count(),
        9,
        "every one of the 9 ranks connects to all 8 peers"
    );
    for (vm, steps) in [
        ("A", &["mesh-cut", "mesh-cut-other", "mesh-after-cut"][..]),
        ("B", &["mesh-cut"][..]),
        ("C", &["mesh-cut-other", "mesh-after-cut"][..]),
    ] {
        for name in steps {
            let rc = step_rc(&stdout, vm, name)
                .unwrap_or_else(|| panic!("{vm}: step {name} did not run"));
            assert_eq!(rc, 0, "{vm}: {name} failed");
        }
    }
    assert!(
        stderr.contains("[B] PASS [receiver] link cut: error")
            && stderr.contains("[A] PASS [sender] link cut: error"),
        "the cut link's connection did not fail on both ends within the bound"
    );
    let mismatch = stdout
        .lines()
        .find_map(|l| l.strip_prefix("[A] mismatch: exit "))
        .expect("A: the mismatched connect did not run");
    let (exit, took) = mismatch
        .split_once(" after ")
        .expect("mismatch line: exit and time");
    let took_ms: u64 = took.trim_end_matches(" ms").parse().expect("mismatch time");
    assert!(
        exit != "0" && took_ms < 10_000,
        "a connect with no reachable NIC pair must fail fast: {mismatch}"
    );
    assert!(
        stderr.contains("no local NIC reaches the peer: this node has 192.168.100.1/24, the peer 192.168.102.2/24"),
        "the mismatch error does not name both sides' addresses"
    );
}
