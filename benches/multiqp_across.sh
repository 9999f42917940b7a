#!/usr/bin/env bash
# benches/multiqp_across.sh: queue pairs per connection across hosts, on the dual-rail rig
# (vm/multi.sh --topology pair2: two VMs, two links, 1 vCPU per VM).
#
# In one boot: `ib_write_bw -t 8` on link 1 (rxe1 on eth1) for reference, then `rivet bench` from
# A to B on link 1 with NCCL_IB_QPS_PER_CONNECTION=1, 2 and 4 (round-robin, NCCL's default) and 4
# split (NCCL_IB_SPLIT_DATA_ON_QPS=1), then on rxe1+rxe2 fused by makeVDevice (`--fuse 0,1`) with
# 1 and 2 queue pairs per port; window 8, 64 KiB, 1 MiB and 4 MiB messages. Around every client run
# A's CPU time (user, system, softirq: Soft-RoCE's work is the kernel's), and around every server
# run B's, is read from /proc/stat and printed as a share of the vCPU, which says whether the links
# or the CPU bound the figure. Lines to read: "multiqp_across: ...".
#
# usage: benches/multiqp_across.sh [--release]     (build the workspace first)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
# shellcheck source=benches/lib.sh
source "$here/lib.sh"
profile=$(bench_profile "$@")
bench_in_rig pair2 "${RIVET_MULTIQP_TIMEOUT:-1800}" -- bash "$here/multiqp_across.sh" "$@"

rivet=$repo/target/$profile/rivet
[[ -x $rivet ]] || { echo "multiqp_across: $rivet is missing (cargo build --workspace first)" >&2; exit 1; }
read -r -a rxes <<<"$RIVET_VM_RXES"
read -r -a addrs <<<"$RIVET_VM_ADDRS"
read -r -a peers <<<"$RIVET_VM_PEER_ADDRS"
export NCCL_SOCKET_IFNAME=eth1
one="=${rxes[0]}" both="=${rxes[0]},${rxes[1]}"
say() { echo "multiqp_across: [$RIVET_VM_NAME] $*"; }
mib() { grep -o '"mib_per_s":[0-9.]*' <<<"$1" | sed -n "${2}p" | cut -d: -f2; }
# Busy and total jiffies of the CPU line of /proc/stat (busy: user, nice, system, irq, softirq).
cpu() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat; }
# busy_share BUSY0 TOTAL0 BUSY1 TOTAL1: the busy share of the vCPU between two cpu readings, in %.
busy_share() { echo $((($3 - $1) * 100 / ($4 - $2 > 0 ? $4 - $2 : 1))); }


sizes=(64K 1M 4M)
# qps split fused
runs=("1 0 0" "2 0 0" "4 0 0" "4 1 0" "1 0 1" "2 0 1")
# The device options of a run: one link, or both fused.
devices() { if [[ $1 == 1 ]]; then echo "--fuse 0,1"; fi; }
hca() { if [[ $1 == 1 ]]; then echo "$both"; else echo "$one"; fi; }
gid=$(gid_index "${rxes[0]}" "${addrs[0]}")
if [[ $RIVET_VM_INDEX == 1 ]]; then
    for s in "${sizes[@]}"; do
        timeout 600 ib_write_bw -d "${rxes[0]}" -x "$gid" -F -p 18820 -t 8 -s "$s" -n 200 >/dev/null 2>&1 ||
            say "ib_write_bw server $s failed"
    done
    for r in "${runs[@]}"; do
        read -r qps split fused <<<"$r"
        read -r busy0 total0 <<<"$(cpu)"
        # shellcheck disable=SC2046
        NCCL_IB_HCA=$(hca "$fused") timeout 900 "$rivet" bench --server --once --bind "${addrs[0]}" \
            --port 18821 $(devices "$fused") >/dev/null 2>&1 || say "rivet bench server ($r) failed"
        read -r busy1 total1 <<<"$(cpu)"
        say "rivet bench server qps=$qps split=$split fused=$fused: B's vCPU busy $(busy_share "$busy0" "$total0" "$busy1" "$total1") %"
    done
    exit 0
fi
for s in "${sizes[@]}"; do
    tries=0
    until out=$(timeout 600 ib_write_bw -d "${rxes[0]}" -x "$gid" -F -p 18820 -t 8 -s "$s" -n 200 "${peers[0]}" 2>&1); do
        ((++tries <= 300)) || { say "ib_write_bw $s failed"; break; }
        sleep 0.2
    done
    say "ib_write_bw -t 8 $s: $(awk '/^ *#bytes/ { on = 1; next } on && /^ *[0-9]/ { print $4; exit }' <<<"$out") MB/s"
done
for r in "${runs[@]}"; do
    read -r qps split fused <<<"$r"
    read -r busy0 total0 <<<"$(cpu)"
    tries=0
    # shellcheck disable=SC2046
    until json=$(NCCL_IB_HCA=$(hca "$fused") NCCL_IB_QPS_PER_CONNECTION=$qps NCCL_IB_SPLIT_DATA_ON_QPS=$split \
        timeout 900 "$rivet" bench --client "${peers[0]}:18821" $(devices "$fused") \
        --sizes "$(IFS=,; echo "${sizes[*]}")" --iters 200 --lat-iters 0 --json --quiet 2>/dev/null); do
        ((++tries <= 300)) || { say "rivet bench qps=$qps split=$split fused=$fused failed"; break; }
        sleep 0.2
    done
    read -r busy1 total1 <<<"$(cpu)"
    busy=$(busy_share "$busy0" "$total0" "$busy1" "$total1")
    say "rivet bench $([[ $fused == 1 ]] && echo "rxe1+rxe2 fused" || echo "link 1") qps=$qps split=$split: 64K $(mib "${json:-}" 1) MiB/s, 1M $(mib "${json:-}" 2) MiB/s, 4M $(mib "${json:-}" 3) MiB/s; A's vCPU busy ${busy} %"
done
