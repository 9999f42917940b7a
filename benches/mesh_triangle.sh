#!/usr/bin/env bash
# benches/mesh_triangle.sh: the mesh device (RIVET_MESH=1) on the triangle of vm/multi.sh (three
# VMs, a link per pair, each link its own /24, 1 vCPU per VM).
#
# For each pair in turn: `ib_write_bw -t 8 -s SIZE` on the pair's link, then `rivet bench` between
# the two VMs through the mesh device (window 8, SIZE messages; the plugin picks the link). Then all
# six directions at once: every VM runs a `rivet bench` client to each of its peers and serves both
# of them, and prints what each of its clients moved. Lines to read: "mesh_triangle: ...".
#
# usage: benches/mesh_triangle.sh [--release]     (SIZE=1M by default; build the workspace first)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
# shellcheck source=benches/lib.sh
source "$here/lib.sh"
profile=$(bench_profile "$@")
bench_in_rig triangle "${RIVET_MESH_TIMEOUT:-1800}" -e SIZE="${SIZE:-1M}" -- bash "$here/mesh_triangle.sh" "$@"

rivet=$repo/target/$profile/rivet
[[ -x $rivet ]] || { echo "mesh_triangle: $rivet is missing (cargo build --workspace first)" >&2; exit 1; }
size=${SIZE:-1M}
n=${size%[KM]}
case $size in *K) bytes=$((n << 10)) ;; *M) bytes=$((n << 20)) ;; *) bytes=$size ;; esac
iters=$(((64 << 20) / bytes))
((iters < 8)) && iters=8
((iters > 1000)) && iters=1000
read -r -a rxes <<<"$RIVET_VM_RXES"
read -r -a addrs <<<"$RIVET_VM_ADDRS"
read -r -a peers <<<"$RIVET_VM_PEER_ADDRS"
read -r -a names <<<"$RIVET_VM_PEERS"
me=$RIVET_VM_NAME
say() { echo "mesh_triangle: [$me] $*"; }
code() { case $1 in A) echo 0 ;; B) echo 1 ;; C) echo 2 ;; esac; }
mib() { grep -o '"mib_per_s":[0-9.]*' <<<"$1" | head -1 | cut -d: -f2; }


export RIVET_MESH=1 NCCL_IB_HCA=^=rxe0
k=0
for pair in AB AC BC; do
    x=${pair:0:1} y=${pair:1:1}
    k=$((k + 1))
    for i in 0 1; do
        if [[ $me == "$x" && ${names[$i]} == "$y" ]]; then
            gid=$(gid_index "${rxes[$i]}" "${addrs[$i]}")
            timeout 600 ib_write_bw -d "${rxes[$i]}" -x "$gid" -F -p $((18800 + k)) -t 8 -s "$bytes" -n "$iters" >/dev/null 2>&1 ||
                say "ib_write_bw server $pair failed"
            timeout 600 "$rivet" bench --server --once --bind "${addrs[$i]}" --port $((18810 + k)) >/dev/null 2>&1 ||
                say "rivet bench server $pair failed"
        elif [[ $me == "$y" && ${names[$i]} == "$x" ]]; then
            gid=$(gid_index "${rxes[$i]}" "${addrs[$i]}")
            tries=0
            until out=$(timeout 600 ib_write_bw -d "${rxes[$i]}" -x "$gid" -F -p $((18800 + k)) -t 8 -s "$bytes" -n "$iters" "${peers[$i]}" 2>&1); do
                ((++tries <= 300)) || { say "ib_write_bw $pair failed"; break; }
                sleep 0.2
            done
            perf=$(awk '/^ *#bytes/ { on = 1; next } on && /^ *[0-9]/ { print $4; exit }' <<<"$out")
            tries=0
            until json=$(timeout 600 "$rivet" bench --client "${peers[$i]}:$((18810 + k))" --sizes "$size" --iters "$iters" --lat-iters 0 --json --quiet 2>/dev/null); do
                ((++tries <= 300)) || { say "rivet bench $pair failed"; break; }
                sleep 0.2
            done
            say "pair $pair ($size, window 8): ib_write_bw ${perf:-?} MB/s, rivet bench (mesh) $(mib "$json") MiB/s"
        fi
    done
done

# All six directions at once through the mesh device.
mine=$(code "$me")
for i in 0 1; do
    them=$(code "${names[$i]}")
    timeout 600 "$rivet" bench --server --once --bind "${addrs[$i]}" --port $((18820 + them * 3 + mine)) >/dev/null 2>&1 &
done
for i in 0 1; do
    them=$(code "${names[$i]}")
    (
        tries=0
        until json=$(timeout 600 "$rivet" bench --client "${peers[$i]}:$((18820 + mine * 3 + them))" --sizes "$size" --iters "$iters" --lat-iters 0 --json --quiet 2>/dev/null); do
            ((++tries <= 300)) || { say "all-to-all to ${names[$i]} failed"; exit 1; }
            sleep 0.2
        done
        say "all-to-all: to ${names[$i]} $(mib "$json") MiB/s"
    ) &
done
wait
