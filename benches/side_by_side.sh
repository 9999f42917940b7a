#!/usr/bin/env bash
# benches/side_by_side.sh: Rivet against perftest on the same RDMA device, in the same boot.
#
# On the host it boots the Soft-RoCE VM (vm/run.sh) and runs itself inside; on a machine with a real
# device, set RIVET_IN_VM=1 and DEV/IP yourself. For each of RUNS rounds it runs, per size,
#   ib_write_bw -d DEV -x <RoCE v2 IPv4 GID> -t 8 -s SIZE -n N   (8 writes in flight, as NCCL keeps)
# then ib_send_lat -s 8, then `rivet bench --json` over the same sizes (window 8) and 8-byte
# ping-pong (--poll $POLL), then the ping-pong again with --poll spin (ib_send_lat busy-polls on
# both sides, so that is the like-for-like latency), and prints the medians and the ratios:
#   bandwidth (MiB/s, perftest's "MB/sec"): goal >= 0.95 x ib_write_bw for sizes >= 64 KiB
#   latency (one-way, µs): Rivet p50 (--poll spin) against ib_send_lat t_typical; goal <= 1.2 x
# On Soft-RoCE with both ends in this VM it also counts the RDMA packets each message cost
# (rxe0's hw_counters/sent_pkts: every packet either end sends, ACKs included), per size and for
# the 8-byte ping-pong: unlike the timings, that count does not move with TCG's scheduling.
#
# Over the user-space verbs fabric (FABRIC=1): no VM; builds the fabric (fabric/build.sh) and runs
# both ends here with the fabric's folder first on LD_LIBRARY_PATH (its device rfab0 is InfiniBand:
# perftest addresses it by LID, no -x GID), the handshakes on loopback. The fabric models no
# timing: its figures compare two consumers of the same memory-copy engine, not wires.
#
# Across hosts (ACROSS=1): boots two VMs wired by one link (vm/multi.sh --topology pair, 1 vCPU each)
# and runs itself in both: VM B runs every server (perftest, `rivet bench --server`), VM A every client
# over the link (rxe1 on eth1: NCCL_IB_HCA==rxe1, NCCL_SOCKET_IFNAME=eth1) and prints the table.
#
# usage: benches/side_by_side.sh [--release]
#   FABRIC=1               both ends on this host over the user-space verbs fabric (see above)
#   ACROSS=1               server and client in two VMs, over a link (see above)
#   RUNS=3                 rounds (the median is reported)
#   SIZES="4K 16K 64K 256K 1M 4M 16M 64M"
#   LAT_ITERS=2000         round trips per latency run
#   BW_ITERS=1000          most messages per bandwidth run, both tools (128 MiB per size, at least
#                          8): over the fabric 1000 messages of 4 KiB last ~10 ms, so a run there
#                          wants BW_ITERS=32768 (all of 128 MiB) to be more than scheduling noise
#   RIVET=path/to/rivet    (default target/release/rivet with --release, else target/debug/rivet)
#   RIVET_PLUGIN_LIB=...   plugin library (default: next to rivet)
#   POLL=yield             rivet bench --poll: yield (NCCL's proxy thread), spin or sleep
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
# shellcheck source=benches/lib.sh
source "$here/lib.sh"
profile=$(bench_profile "$@")

fabric=${FABRIC:-0}
if [[ $fabric == 1 ]]; then
    fabric_lib=$(bash "$repo/fabric/build.sh")
    export LD_LIBRARY_PATH=$(dirname "$fabric_lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    RIVET_FABRIC_DIR=$(mktemp -d "${TMPDIR:-/tmp}/rivet-side-fabric.XXXXXX")
    export RIVET_FABRIC_DIR NCCL_SOCKET_IFNAME==lo
    DEV=${DEV:-rfab0} IP=${IP:-127.0.0.1} RIVET_IN_VM=1
fi
if [[ ${RIVET_IN_VM:-0} != 1 && ${ACROSS:-0} == 1 ]]; then
    exec bash "$repo/vm/multi.sh" --topology pair --timeout "${RIVET_SIDE_TIMEOUT:-2400}" \
        -e RUNS="${RUNS:-3}" -e SIZES="${SIZES:-}" -e LAT_ITERS="${LAT_ITERS:-2000}" -e BW_ITERS="${BW_ITERS:-}" -e RIVET="${RIVET:-}" -e POLL="${POLL:-yield}" \
        -- bash "$here/side_by_side.sh" "$@"
fi
if [[ ${RIVET_IN_VM:-0} != 1 ]]; then
    exec bash "$repo/vm/run.sh" --timeout "${RIVET_SIDE_TIMEOUT:-1800}" \
        -e RUNS="${RUNS:-3}" -e SIZES="${SIZES:-}" -e LAT_ITERS="${LAT_ITERS:-2000}" -e BW_ITERS="${BW_ITERS:-}" -e RIVET="${RIVET:-}" -e POLL="${POLL:-yield}" \
        -- bash "$here/side_by_side.sh" "$@"
fi

runs=${RUNS:-3}
sizes=(${SIZES:-4K 16K 64K 256K 1M 4M 16M 64M})
lat_iters=${LAT_ITERS:-2000}
rivet=${RIVET:-$repo/target/$profile/rivet}
dev=${DEV:-rxe0}
# Across hosts (vm/multi.sh): the first link; VM B serves, VM A measures. Otherwise both ends here.
role=both peer=
if [[ -n ${RIVET_VM_TOPOLOGY:-} ]]; then
    dev=${RIVET_VM_RXES%% *}
    link_if=${RIVET_VM_NETDEVS%% *}
    IP=${RIVET_VM_ADDRS%% *}
    peer=${RIVET_VM_PEER_ADDRS%% *}
    role=client
    [[ $RIVET_VM_INDEX == 1 ]] && role=server
    export NCCL_IB_HCA="=$dev" NCCL_SOCKET_IFNAME=$link_if
fi
[[ -x $rivet ]] || { echo "side_by_side: $rivet is missing: cargo build --workspace${profile/debug/} first" >&2; exit 1; }
for tool in ib_write_bw ib_send_lat ss awk; do
    command -v "$tool" >/dev/null || { echo "side_by_side: $tool is not installed (perftest, iproute2)" >&2; exit 1; }
done

say() { echo "side_by_side: $*" >&2; }
bytes() { # 4K -> 4096
    local s=$1 n=${1%[KMG]}
    case $s in *K) echo $((n << 10)) ;; *M) echo $((n << 20)) ;; *G) echo $((n << 30)) ;; *) echo "$s" ;; esac
}
iters_for() { # the same schedule as rivet bench: 128 MiB per size, between 8 and 1000 (BW_ITERS) messages
    local n=$(((128 << 20) / $1)) most=${BW_ITERS:-1000}
    ((n > most)) && n=$most
    ((n < 8)) && n=8
    echo $n
}

ip4=${IP:-$(ip -4 -o addr show dev eth0 | awk '{ split($4, a, "/"); print a[1]; exit }')}
gid_args=()
if ((fabric)); then
    gid_index="none (InfiniBand, LID)" # an InfiniBand port: perftest takes its LID, no GID
else
    gid_index=$(gid_index "$dev" "$ip4") || { echo "side_by_side: no RoCE v2 GID for $ip4 on $dev" >&2; exit 1; }
    gid_args=(-x "$gid_index")
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/rivet-side.XXXXXX")
trap 'rm -rf "$work" ${RIVET_FABRIC_DIR:+"$RIVET_FABRIC_DIR"}' EXIT
port=18700

# perf_pair TOOL ARGS...: server and client on DEV/ip4; prints the client's numeric result line.
# Across hosts the server runs here in VM B (prints nothing), the client in VM A against it: a
# perftest client does not wait for its server, so it is retried until one answers.
perf_pair() {
    local tool=$1
    shift
    port=$((port + 1))
    local args=(-d "$dev" "${gid_args[@]}" -F -p "$port" "$@")
    if [[ $role == server ]]; then
        timeout 600 "$tool" "${args[@]}" >"$work/server" 2>&1 || { cat "$work/server" >&2; return 1; }
        return 0
    elif [[ $role == client ]]; then
        local tries=0
        until timeout 300 "$tool" "${args[@]}" "$peer" >"$work/client" 2>&1; do
            ((++tries <= 300)) || { cat "$work/client" >&2; return 1; }
            sleep 0.2
        done
        awk '/^ *#bytes/ { on = 1; next } on && /^ *[0-9]/ { print; exit }' "$work/client"
        return 0
    fi
    timeout 300 "$tool" "${args[@]}" >"$work/server" 2>&1 &
    local server=$! n=0
    until ss -Hltn "sport = :$port" | grep -q .; do
        ((++n <= 400)) || { cat "$work/server" >&2; return 1; }
        kill -0 "$server" 2>/dev/null || { cat "$work/server" >&2; return 1; }
        sleep 0.05
    done
    local rc=0
    timeout 300 "$tool" "${args[@]}" "$ip4" >"$work/client" 2>&1 || rc=$?
    wait "$server" || rc=$?
    ((rc == 0)) || { cat "$work/client" "$work/server" >&2; return 1; }
    awk '/^ *#bytes/ { on = 1; next } on && /^ *[0-9]/ { print; exit }' "$work/client"
}

# record_latency KIND JSON: the latency percentiles of a `rivet bench --json` line into $results
# (KIND p50, KIND99 p99); leaves them in $p50 and $p99.
record_latency() {
    local lat
    lat=$(grep -o '"latency":{[^}]*}' <<<"$2")
    p50=$(grep -o '"p50_us":[0-9.]*' <<<"$lat" | cut -d: -f2)
    p99=$(grep -o '"p99_us":[0-9.]*' <<<"$lat" | cut -d: -f2)
    echo "$1 8 $p50" >>"$results"
    echo "${1}99 8 $p99" >>"$results"
}

# rivet_bench ARGS...: `rivet bench` in this VM (loopback), or across hosts one client run against
# the server VM B keeps for the whole script (its control port on the link).
rivet_bench() {
    if [[ $role == client ]]; then "$rivet" bench --client "$peer:18620" "$@"; else "$rivet" bench "$@"; fi
}

if [[ $role == server ]]; then
    # Serve: the perftest servers in the clients' order, with `rivet bench --server` up all along
    # (the client's two runs per round are its clients); stop when the last perftest run ends.
    "$rivet" bench --server --bind "$ip4" --port 18620 --poll "${POLL:-yield}" >"$work/rivet-server" 2>&1 &
    rivet_server=$!
    for ((r = 1; r <= runs; r++)); do
        for s in "${sizes[@]}"; do
            n=$(bytes "$s")
            # In a subshell, as the client's $(perf_pair ...) runs: both keep the same port.
            (perf_pair ib_write_bw -t 8 -s "$n" -n "$(iters_for "$n")") || { say "ib_write_bw -s $n server failed"; exit 1; }
        done
        (perf_pair ib_send_lat -s 8 -n "$lat_iters") || { say "ib_send_lat server failed"; exit 1; }
        # The client's rivet bench runs of this round come next; the next round's perftest server
        # simply waits for them to finish.
    done
    # The client's last two rivet bench runs follow the last perftest run: wait for both.
    for _ in $(seq 1200); do
        (($(grep -c ' done$' "$work/rivet-server" 2>/dev/null || true) >= 2 * runs)) && break
        sleep 0.5
    done
    kill "$rivet_server" 2>/dev/null || true
    cat "$work/rivet-server" >&2
    exit 0
fi

say "device $dev, GID index $gid_index ($ip4), $runs round(s), sizes ${sizes[*]}, rivet $rivet"
say "$(uname -r), $(nproc) vCPU(s), $(date -u +%Y-%m-%dT%H:%MZ)"
results=$work/results # lines: KIND SIZE VALUE
: >"$results"
# RDMA packets per message: with both ends on one rxe device every packet is counted once.
pkt_file=
if [[ $role == both && $fabric != 1 && -r /sys/class/infiniband/$dev/ports/1/hw_counters/sent_pkts ]]; then
    pkt_file=/sys/class/infiniband/$dev/ports/1/hw_counters/sent_pkts
fi
pkts() { if [[ -n $pkt_file ]]; then cat "$pkt_file"; else echo 0; fi; }
count_pkts() { # KIND SIZE BEFORE MESSAGES: packets per message since BEFORE into $results
    [[ -n $pkt_file ]] || return 0
    awk -v k="$1" -v s="$2" -v a="$3" -v b="$(pkts)" -v m="$4" 'BEGIN { printf "%s %s %.2f\n", k, s, (b - a) / m }' >>"$results"
}
# Pull "size":N ... "mib_per_s":X pairs out of a one-line `rivet bench --json`.
record_bandwidth() {
    grep -o '"size":[0-9]*,"iters":[0-9]*,"seconds":[0-9.]*,"mib_per_s":[0-9.]*' <<<"$1" |
        awk -F'[:,]' '{ print "rivet_bw", $2, $8 }' >>"$results"
}
iters_arg=()
[[ -n ${BW_ITERS:-} ]] && iters_arg=(--iters "$BW_ITERS")
csv_sizes=$(IFS=,; echo "${sizes[*]}")
for ((r = 1; r <= runs; r++)); do
    for s in "${sizes[@]}"; do
        n=$(bytes "$s")
        iters=$(iters_for "$n")
        p0=$(pkts)
        line=$(perf_pair ib_write_bw -t 8 -s "$n" -n "$iters") || { say "ib_write_bw -s $n failed"; exit 1; }
        count_pkts perf_pkt "$n" "$p0" "$iters"
        # #bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]
        bw=$(awk '{ print $4 }' <<<"$line")
        echo "perf_bw $n $bw" >>"$results"
        say "round $r: ib_write_bw $s: $bw MiB/s"
    done
    p0=$(pkts)
    line=$(perf_pair ib_send_lat -s 8 -n "$lat_iters") || { say "ib_send_lat failed"; exit 1; }
    count_pkts perf_pkt 8 "$p0" $((2 * lat_iters))
    # #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%
    read -r _ _ tmin _ ttyp tavg _ t99 _ <<<"$line"
    echo "perf_lat 8 $ttyp" >>"$results"
    echo "perf_lat99 8 $t99" >>"$results"
    say "round $r: ib_send_lat 8 B: t_min $tmin typical $ttyp avg $tavg 99% $t99 us"
    if [[ -n $pkt_file ]]; then
        # One run per size, and the latency on its own, so each count covers one kind of message.
        for s in "${sizes[@]}"; do
            n=$(bytes "$s")
            p0=$(pkts)
            json=$(rivet_bench --json --quiet --poll "${POLL:-yield}" --sizes "$n" --lat-iters 0 "${iters_arg[@]}") || { say "rivet bench $s failed"; exit 1; }
            record_bandwidth "$json"
            # `rivet bench` sends its window (8) of warm-up messages first.
            count_pkts rivet_pkt "$n" "$p0" $(($(grep -o '"iters":[0-9]*' <<<"$json" | head -1 | cut -d: -f2) + 8))
        done
        json=$(rivet_bench --json --quiet --poll "${POLL:-yield}" --sizes none --lat-iters "$lat_iters") || { say "rivet bench failed"; exit 1; }
    else
        json=$(rivet_bench --json --quiet --poll "${POLL:-yield}" --sizes "$csv_sizes" --lat-iters "$lat_iters" "${iters_arg[@]}") || { say "rivet bench failed"; exit 1; }
        record_bandwidth "$json"
    fi
    echo "$json" >"$work/rivet-$r.json"
    record_latency rivet_lat "$json"
    say "round $r: rivet bench done (p50 $p50 us, p99 $p99 us)"
    # ib_send_lat busy-polls its CQ on both sides: the like-for-like latency busy-polls too.
    p0=$(pkts)
    json=$(rivet_bench --json --quiet --poll spin --sizes none --lat-iters "$lat_iters") || { say "rivet bench --poll spin failed"; exit 1; }
    # Both directions, after `rivet bench`'s warm-up of a tenth (1 to 100) of the round trips.
    lat_warm=$((lat_iters / 10)); ((lat_warm < 1)) && lat_warm=1; ((lat_warm > 100)) && lat_warm=100
    count_pkts rivet_pkt 8 "$p0" $((2 * (lat_iters + lat_warm)))
    record_latency rivet_spin_lat "$json"
    say "round $r: rivet bench --poll spin latency done (p50 $p50 us, p99 $p99 us)"
done

median() { # KIND SIZE -> median of the values
    awk -v k="$1" -v s="$2" '$1 == k && $2 == s { print $3 }' "$results" | sort -g |
        awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

echo
echo "Rivet vs perftest on $dev (GID $gid_index)${peer:+, across two VMs to $peer}, median of $runs round(s), $(date -u +%Y-%m-%d), $(nproc) vCPU(s), $rivet --poll ${POLL:-yield}"
echo
echo "| size | ib_write_bw -t 8 (MiB/s) | rivet bench, window 8 (MiB/s) | rivet / perftest |"
echo "| ---: | ---: | ---: | ---: |"
fail=0
for s in "${sizes[@]}"; do
    n=$(bytes "$s")
    p=$(median perf_bw "$n")
    q=$(median rivet_bw "$n")
    ratio=$(awk -v a="$q" -v b="$p" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "nan" }')
    mark=""
    if ((n >= 65536)) && awk -v x="$ratio" 'BEGIN { exit !(x < 0.95) }'; then mark=" (goal 0.95)"; fail=1; fi
    printf '| %s | %.1f | %.1f | %s%s |\n' "${s/K/ KiB}" "$p" "$q" "$ratio" "$mark" | sed 's/\([0-9]\)M |/\1 MiB |/'
done
pl=$(median perf_lat 8)
pl99=$(median perf_lat99 8)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "nan" }'; }
rl=$(median rivet_lat 8)
rl99=$(median rivet_lat99 8)
sl=$(median rivet_spin_lat 8)
sl99=$(median rivet_spin_lat99 8)
lratio=$(ratio "$sl" "$pl")
echo
echo "| 8 B latency (one-way, us) | ib_send_lat | rivet bench --poll spin | ratio | rivet bench --poll ${POLL:-yield} | ratio |"
echo "| --- | ---: | ---: | ---: | ---: | ---: |"
printf '| p50 (perftest: t_typical) | %.1f | %.1f | %s | %.1f | %s |\n' "$pl" "$sl" "$lratio" "$rl" "$(ratio "$rl" "$pl")"
printf '| p99 | %.1f | %.1f | %s | %.1f | %s |\n' "$pl99" "$sl99" "$(ratio "$sl99" "$pl99")" "$rl99" "$(ratio "$rl99" "$pl99")"
echo
echo "(the latency goal is judged on --poll spin: ib_send_lat busy-polls on both sides too)"
if [[ -n $pkt_file ]]; then
    echo
    echo "| RDMA packets per message ($dev sent_pkts, ACKs included) | perftest | rivet bench | ratio |"
    echo "| --- | ---: | ---: | ---: |"
    for s in "${sizes[@]}"; do
        n=$(bytes "$s")
        printf '| %s, window 8 / ib_write_bw -t 8 | %.2f | %.2f | %s |\n' "${s/K/ KiB}" "$(median perf_pkt "$n")" "$(median rivet_pkt "$n")" \
            "$(ratio "$(median rivet_pkt "$n")" "$(median perf_pkt "$n")")"
    done
    printf '| 8 B ping-pong --poll spin / ib_send_lat | %.2f | %.2f | %s |\n' "$(median perf_pkt 8)" "$(median rivet_pkt 8)" \
        "$(ratio "$(median rivet_pkt 8)" "$(median perf_pkt 8)")"
fi
if awk -v x="$lratio" 'BEGIN { exit !(x > 1.2) }'; then fail=1; fi
echo
if ((fail)); then
    echo "goals: MISSED (bandwidth >= 0.95 x ib_write_bw from 64 KiB, latency p50 <= 1.2 x ib_send_lat)"
else
    echo "goals: met (bandwidth >= 0.95 x ib_write_bw from 64 KiB, latency p50 <= 1.2 x ib_send_lat)"
fi
# A missed goal is a finding, not a script failure: exit 0 so the numbers are always printed.
exit 0
