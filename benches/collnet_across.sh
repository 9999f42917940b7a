#!/usr/bin/env bash
# benches/collnet_across.sh: Rivet's software CollNet across hosts, next to the p2p bandwidth of
# the same link in the same boot.
#
# Boots two VMs wired by one link (vm/multi.sh --topology pair, 1 vCPU each) and, over that link
# (rxe1 on eth1): `rivet bench` p2p between the VMs (4 MiB messages, window 8), then the CollNet
# allreduce of tests/c/collnet.c --bench with one rank per VM (float32 sum, 64 KiB, 1 MiB and
# 4 MiB per rank), which prints the algorithm bandwidth and the bus bandwidth (algbw × 2(n−1)/n:
# what each rank moves per second, comparable with the p2p figure). Lines to read:
# "collnet_across: ..." and "BENCH ...".
#
# usage: benches/collnet_across.sh [--release]     (build the workspace first)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
# shellcheck source=benches/lib.sh
source "$here/lib.sh"
profile=$(bench_profile "$@")
bench_in_rig pair "${RIVET_COLLNET_TIMEOUT:-1200}" -- bash "$here/collnet_across.sh" "$@"

rivet=$repo/target/$profile/rivet
lib=$repo/target/$profile/libnccl_net_rivet.so
collnet=$(ls -t "$repo"/target/"$profile"/build/rivet-*/out/collnet 2>/dev/null | head -1)
[[ -x $rivet && -f $lib && -x $collnet ]] || {
    echo "collnet_across: build the workspace (cargo build --workspace${profile/debug/ --release}) first" >&2
    exit 1
}
addr=${RIVET_VM_ADDRS%% *}
peer=${RIVET_VM_PEER_ADDRS%% *}
export NCCL_IB_HCA="=${RIVET_VM_RXES%% *}" NCCL_SOCKET_IFNAME=${RIVET_VM_NETDEVS%% *}
say() { echo "collnet_across: [$RIVET_VM_NAME] $*"; }

if [[ $RIVET_VM_INDEX == 1 ]]; then
    timeout 600 "$rivet" bench --server --once --bind "$addr" --port 18900 >/dev/null 2>&1 || say "rivet bench server failed"
    "$collnet" "$lib" --ranks 2 --first-rank 1 --local 1 --server "$peer:18901" --bench 2>&1 | grep -v '^\[rank' || true
else
    tries=0
    until json=$(timeout 600 "$rivet" bench --client "$peer:18900" --sizes 4M --iters 32 --lat-iters 0 --json --quiet 2>/dev/null); do
        ((++tries <= 300)) || { say "rivet bench failed"; break; }
        sleep 0.2
    done
    say "p2p rivet bench 4 MiB, window 8: $(grep -o '"mib_per_s":[0-9.]*' <<<"${json:-}" | cut -d: -f2) MiB/s"
    "$collnet" "$lib" --ranks 2 --local 1 --serve 18901 --bench 2>&1 | grep -v '^\[rank' || true
fi
