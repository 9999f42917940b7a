#!/usr/bin/env bash
# RMA put bandwidth and put-with-signal latency against perftest, in one run, as ratios.
#
#   ib_write_bw -t 8 -s SIZE (8 writes in flight)  against  tests/c/rma --bench "put SIZE" (8 in flight)
#   ib_write_lat -s 8 (t_typical, one way)          against  rma --bench "putsignal-half-rtt 8"
#       (an 8-byte put with its signal, the peer spinning on the signal word and answering the
#        same way: half of that round trip)
#
# Where: FABRIC=1 (default) both ends on this host over the user-space verbs fabric (its timings
# are host scheduling, not a network: docs/fabric-lane.md); FABRIC=0 on this host's RDMA device
# DEV (default: the first `ibv_devices` lists; in the Soft-RoCE VM, rxe0) over loopback.
# RUNS rounds (default 3), medians printed. Prints numbers; never fails on them.
#
# usage: [FABRIC=1] [RUNS=3] [DEV=rxe0] benches/rma_side_by_side.sh [--release]
set -euo pipefail
cd "$(dirname "$0")/.."
profile=debug
[[ ${1:-} == --release ]] && profile=release
runs=${RUNS:-3}
fabric=${FABRIC:-1}
lib=target/$profile/libnccl_net_rivet.so
rma=${RIVET_C_RMA_BIN:-}
if [[ -z $rma ]]; then
    rma=$(mktemp -d "${TMPDIR:-/tmp}/rivet-rma-bench.XXXXXX")/rma
    cc -O2 -o "$rma" tests/c/rma.c -ldl -lm
fi
[[ -f $lib ]] || { echo "rma_side_by_side: $lib is missing: cargo build -p rivet-plugin${profile/debug/} first" >&2; exit 1; }
for tool in ib_write_bw ib_write_lat ss awk; do
    command -v "$tool" >/dev/null || { echo "rma_side_by_side: $tool not found (apt install perftest iproute2)" >&2; exit 1; }
done
if [[ $fabric == 1 ]]; then
    fabric/build.sh >/dev/null
    export LD_LIBRARY_PATH=$PWD/target/fabric${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    RIVET_FABRIC_DIR=$(mktemp -d "${TMPDIR:-/tmp}/rivet-rma-fabric.XXXXXX")
    export RIVET_FABRIC_DIR NCCL_SOCKET_IFNAME==lo
    dev=rfab0
    gid_args=()
else
    dev=${DEV:-$(ibv_devices | awk 'NR > 2 { print $1; exit }')}
    gid_args=(-x "${GID_INDEX:-1}")
    export NCCL_IB_HCA="=$dev"
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/rivet-rma-side.XXXXXX")
trap 'rm -rf "$work" ${RIVET_FABRIC_DIR:+"$RIVET_FABRIC_DIR"}' EXIT
port=18800

# perf_pair TOOL ARGS...: server and client on this host; the client's first result line.
perf_pair() {
    local tool=$1
    shift
    port=$((port + 1))
    local args=(-d "$dev" "${gid_args[@]}" -F -p "$port" "$@")
    timeout 300 "$tool" "${args[@]}" >"$work/server" 2>&1 &
    local server=$! n=0
    until ss -Hltn "sport = :$port" | grep -q .; do
        ((++n <= 400)) || { cat "$work/server" >&2; return 1; }
        kill -0 "$server" 2>/dev/null || { cat "$work/server" >&2; return 1; }
        sleep 0.05
    done
    local rc=0
    timeout 300 "$tool" "${args[@]}" 127.0.0.1 >"$work/client" 2>&1 || rc=$?
    wait "$server" || rc=$?
    ((rc == 0)) || { cat "$work/client" "$work/server" >&2; return 1; }
    awk '/^ *#bytes/ { on = 1; next } on && /^ *[0-9]/ { print; exit }' "$work/client"
}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print "nan" }'; }

sizes=(65536 1048576 4194304)
for ((r = 1; r <= runs; r++)); do
    for s in "${sizes[@]}"; do
        # ib_write_bw: "#bytes #iterations BW peak BW average MsgRate": MB/sec average is field 4.
        perf_pair ib_write_bw -t 8 -s "$s" -n 500 | awk -v s="$s" '{ printf "%s %.3f\n", s, $4 * 1.048576 / 1000 }' >>"$work/perf_bw"
    done
    # ib_write_lat: "#bytes #iterations t_min t_max t_typical ...": t_typical is field 5.
    perf_pair ib_write_lat -s 8 -n 2000 | awk '{ print $5 }' >>"$work/perf_lat"
    timeout 300 "$rma" "$PWD/$lib" --ranks 2 --bench 2>&1 | grep '^BENCH' >>"$work/rma" || true
done

echo "RMA over ${dev} ($([[ $fabric == 1 ]] && echo "user-space fabric" || echo "device")), ${runs} round(s), medians:"
echo
echo "| size | ib_write_bw -t 8 (GB/s) | rma iput, 8 in flight (GB/s) | rma / perftest |"
echo "| ---: | ---: | ---: | ---: |"
for s in "${sizes[@]}"; do
    p=$(awk -v s="$s" '$1 == s { print $2 }' "$work/perf_bw" | median)
    q=$(awk -v s="$s" '$3 == "put" && $4 == s { print $5 }' "$work/rma" | median)
    awk -v s="$s" -v p="$p" -v q="$q" 'BEGIN { printf "| %d | %.3f | %.3f | %.2f |\n", s, p, q, (p > 0 ? q / p : 0) }'
done
echo
p=$(median <"$work/perf_lat")
echo "| 8 B one way (us), medians | ib_write_lat t_typical | rma, half round trip | ratio |"
echo "| --- | ---: | ---: | ---: |"
for v in putsignal put signal; do
    q=$(awk -v v="$v-half-rtt" '$3 == v { print $5 }' "$work/rma" | median)
    case $v in
        putsignal) what="put with signal (the peer spins on the signal word)" ;;
        put) what="put alone (the peer polls the bytes)" ;;
        signal) what="signal alone (size 0)" ;;
    esac
    awk -v p="$p" -v q="$q" -v w="$what" 'BEGIN { printf "| %s | %.2f | %.2f | %.2f |\n", w, p, q, (p > 0 ? q / p : 0) }'
done
