#!/usr/bin/env bash
# benches/eager_ab.sh: the eager path against the clear-to-send protocol alone, in one boot of the
# Soft-RoCE VM (or over the fabric with FABRIC=1), as ratios to perftest measured in the same boot.
#
# Runs benches/side_by_side.sh inside one VM boot ROUNDS times, alternating Rivet with the eager path
# on (NCCL_RIVET_EAGER_THRESHOLD unset: the default) and off (NCCL_RIVET_EAGER_THRESHOLD=0), each run
# measuring perftest and Rivet with RUNS rounds (the median). Each run prints its table; compare the
# ratios of runs in the same boot.
#
# usage: benches/eager_ab.sh [--release]
#   ROUNDS=2     on/off pairs per boot
#   RUNS=3       rounds per side_by_side run (median)
#   SIZES="4K 16K 64K"
#   FABRIC=1     over the user-space verbs fabric instead (no VM; timings are host sockets)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
rounds=${ROUNDS:-2}
inner() {
    for ((r = 1; r <= rounds; r++)); do
        for mode in on off; do
            echo "eager_ab: round $r, eager $mode" >&2
            if [[ $mode == off ]]; then
                NCCL_RIVET_EAGER_THRESHOLD=0 bash "$here/side_by_side.sh" "$@"
            else
                env -u NCCL_RIVET_EAGER_THRESHOLD bash "$here/side_by_side.sh" "$@"
            fi
        done
    done
}
if [[ ${FABRIC:-0} == 1 || ${RIVET_IN_VM:-0} == 1 ]]; then
    export RUNS=${RUNS:-3} SIZES=${SIZES:-4K 16K 64K}
    inner "$@"
    exit 0
fi
exec bash "$repo/vm/run.sh" --timeout "${RIVET_SIDE_TIMEOUT:-3600}" \
    -e RUNS="${RUNS:-3}" -e SIZES="${SIZES:-4K 16K 64K}" -e ROUNDS="$rounds" -e LAT_ITERS="${LAT_ITERS:-2000}" -e BW_ITERS="${BW_ITERS:-}" \
    -e POLL="${POLL:-yield}" -- bash "$here/eager_ab.sh" "$@"
