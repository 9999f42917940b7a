#!/usr/bin/env bash
# benches/plugin_ab.sh: two builds of the plugin against each other in one boot of the Soft-RoCE VM
# (or over the fabric with FABRIC=1), as ratios to perftest measured in the same boot.
#
# Runs benches/side_by_side.sh ROUNDS times per library, alternating A and B, each run measuring
# perftest and Rivet with RUNS rounds (the median); compare the ratios of runs in the same boot.
# Build the two libraries first (e.g. copy target/release/libnccl_net_rivet.so aside between two
# builds; keep them under the repository: the VM sees the host's root).
#
# usage: A=path/to/a.so B=path/to/b.so benches/plugin_ab.sh --release
#   ROUNDS=2     A/B pairs per boot
#   RUNS=3       rounds per side_by_side run (median)
#   SIZES="4K 16K 64K"
#   FABRIC=1     over the user-space verbs fabric instead (no VM; timings are host sockets)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
rounds=${ROUNDS:-2}
: "${A:?A=path of the first plugin library}" "${B:?B=path of the second plugin library}"
A=$(realpath "$A") B=$(realpath "$B")
inner() {
    for ((r = 1; r <= rounds; r++)); do
        for which in A B; do
            lib=${!which}
            echo "plugin_ab: round $r, $which = $lib" >&2
            RIVET_PLUGIN_LIB=$lib bash "$here/side_by_side.sh" "$@"
        done
    done
}
if [[ ${FABRIC:-0} == 1 || ${RIVET_IN_VM:-0} == 1 ]]; then
    export RUNS=${RUNS:-3} SIZES=${SIZES:-4K 16K 64K}
    inner "$@"
    exit 0
fi
exec bash "$repo/vm/run.sh" --timeout "${RIVET_SIDE_TIMEOUT:-3600}" \
    -e A="$A" -e B="$B" -e RUNS="${RUNS:-3}" -e SIZES="${SIZES:-4K 16K 64K}" -e ROUNDS="$rounds" \
    -e LAT_ITERS="${LAT_ITERS:-2000}" -e BW_ITERS="${BW_ITERS:-}" -e POLL="${POLL:-yield}" -- bash "$here/plugin_ab.sh" "$@"
