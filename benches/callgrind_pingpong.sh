#!/usr/bin/env bash
# benches/callgrind_pingpong.sh: user-space instructions per 8-byte round trip, per side, through
# the exported ncclNetPlugin_v12 table (benches/callgrind_pingpong.c under callgrind), on Soft-RoCE.
#
# On the host it builds the C driver, boots the VM (vm/run.sh) and runs itself inside; on a machine
# with an RDMA device set RIVET_IN_VM=1. Prints, per round trip and per side (one isend, one irecv,
# two tests that find their request done): the whole loop (driver + plugin + verbs + libc), the
# plugin object's share (callgrind's per-object exclusive totals) and the top functions.
# The bar (issue #30): at or below NCCL's IB transport, plugin <= 1,170 and whole loop <= 2,463 on
# Soft-RoCE (stretch 585 and 1,850).
#
# usage: benches/callgrind_pingpong.sh
#   PLUGIN=target/release/libnccl_net_rivet.so   (build it: cargo build --release -p rivet-plugin)
#   ROUNDS=300 WARMUP=30 SETTLE_US=1000          TOP=25 (functions listed)
#   OUT=/tmp/rivet-callgrind                       callgrind.out and the driver land here
#   PROFILER=nccl (default)                        NCCL's way without a profiler plugin: a callback
#                                                  that returns no event handle, non-NULL pHandles
#   PROFILER=1                                     a profiler that returns event handles
#   PROFILER=0                                     no callback, NULL pHandles (NCCL never does this)
#   PINGPONG_FUSE=0,1                              over a device fused from those ports (multi-lane;
#                                                  with FABRIC=1 set RIVET_FABRIC_PORTS=2)
#   CALLGRIND_ARGS="--dump-instr=yes"             more callgrind options (per-instruction costs
#                                                  for callgrind_annotate or objdump; on the host only)
#   FABRIC=1                                       no VM: over the user-space verbs fabric (fabric/);
#                                                  the plugin's count is the same, the provider's not
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
out=${OUT:-/tmp/rivet-callgrind}
plugin=${PLUGIN:-$repo/target/release/libnccl_net_rivet.so}
plugin=$(realpath "$plugin")

if [[ ${FABRIC:-0} == 1 && ${RIVET_IN_VM:-0} != 1 ]]; then
    # Over the user-space verbs fabric (fabric/), no VM: the plugin's own count is the same code
    # path as on Soft-RoCE; the provider's share (and so the whole loop) is the fabric's, not
    # librxe's. Seconds instead of a boot: the loop to iterate with.
    bash "$repo/fabric/build.sh" >/dev/null
    export LD_LIBRARY_PATH="$repo/target/fabric${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    RIVET_FABRIC_DIR=$(mktemp -d /tmp/rivet-callgrind-fabric.XXXXXX)
    export RIVET_FABRIC_DIR
    trap 'rm -rf "$RIVET_FABRIC_DIR"' EXIT
    mkdir -p "$out"
    cc -std=c11 -O2 -g -Wall -Wextra -Werror -o "$out/pingpong" "$here/callgrind_pingpong.c" -ldl
fi

if [[ ${RIVET_IN_VM:-0} != 1 && ${FABRIC:-0} != 1 ]]; then
    [[ -f $plugin ]] || { echo "callgrind_pingpong: $plugin is missing: cargo build --release -p rivet-plugin" >&2; exit 1; }
    mkdir -p "$out"
    cc -std=c11 -O2 -g -Wall -Wextra -Werror -o "$out/pingpong" "$here/callgrind_pingpong.c" -ldl
    exec bash "$repo/vm/run.sh" --timeout "${RIVET_CALLGRIND_TIMEOUT:-600}" \
        -e PLUGIN="$plugin" -e OUT="$out" -e ROUNDS="${ROUNDS:-300}" -e WARMUP="${WARMUP:-30}" \
        -e SETTLE_US="${SETTLE_US:-1000}" -e TOP="${TOP:-25}" -e PROFILER="${PROFILER:-nccl}" \
        -- bash "$here/callgrind_pingpong.sh"
fi

rounds=${ROUNDS:-300}
top=${TOP:-25}
[[ -x $out/pingpong ]] || cc -std=c11 -O2 -g -o "$out/pingpong" "$here/callgrind_pingpong.c" -ldl
rm -f "$out/callgrind.out"
# shellcheck disable=SC2086 # CALLGRIND_ARGS is a list of options
valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file="$out/callgrind.out" ${CALLGRIND_ARGS:-} \
    "$out/pingpong" "$plugin" "$rounds" "${WARMUP:-30}" "${SETTLE_US:-1000}" 2>"$out/valgrind.log" \
    || { cat "$out/valgrind.log" >&2; exit 1; }
callgrind_annotate --auto=no --threshold=100 "$out/callgrind.out" >"$out/annotate.txt"
python3 "$here/callgrind_totals.py" "$out/callgrind.out" "$rounds" "$(basename "$plugin")" "$top"
grep pingpong: "$out/valgrind.log" || true
