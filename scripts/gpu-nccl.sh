#!/usr/bin/env bash
# scripts/gpu-nccl.sh: the real NCCL (PyTorch's own libnccl) moving data through Rivet, over the
# project's user-space verbs fabric (fabric/, docs/fabric.md), on a machine with one NVIDIA GPU
# and no RDMA hardware (issue #28). One command, under 5 minutes.
#
#   scripts/gpu-nccl.sh --pack     on the x86-64 build machine: build the kit (Rivet's release
#                                  library, the `rivet` command, the fabric library) into
#                                  target/gpu-kit, an ignored path that travels to the GPU machine
#                                  (--pack --debug: from the debug build, for the fabric lane)
#   scripts/gpu-nccl.sh            on the GPU machine (PyTorch with its bundled NCCL, root,
#                                  python3; no compiler, no network, no rdma_rxe needed): the run
#   scripts/gpu-nccl.sh --cpu      the fabric half on a CPU-only machine (no torch, no GPU): the
#                                  kit, the fabric device, the /sys view NCCL's IB transport reads,
#                                  Rivet's library moving 8 B … 256 MiB between two processes, and
#                                  the driver's own checks
# options: --kit DIR (default $RIVET_GPU_KIT or target/gpu-kit), --max-bytes N (default 268435456),
#          --quick (sizes x16 apart instead of x4)
#
# The GPU run: starts the fabric (a fresh RIVET_FABRIC_DIR, its folder first on LD_LIBRARY_PATH),
# gives NCCL's IB transport the /sys/class/infiniband it insists on inside a private mount
# namespace (never on the host), then runs two ranks on GPU 0, presented to NCCL as two hosts
# (NCCL_HOSTID differs, one rendezvous port), through all-reduce, all-gather, reduce-scatter,
# all-to-all and send/recv from 8 B to 256 MiB, checking every element (scripts/gpu_nccl.py):
#   1. NCCL_NET=Rivet  NCCL_NET_PLUGIN=<kit>/lib/libnccl-net-rivet.so
#   2. NCCL_NET=IB     NCCL's own IB transport over the same fabric
#   3. NCCL_NET=Socket
#   4. Rivet again with NCCL_COLLNET_ENABLE=1: did NCCL choose Rivet's CollNet, were results right
# and prints NCCL's own lines (Using network …, via NET/…), the bus bandwidth per size and the
# Rivet/IB ratio. Exit status 0 only if every element of every run was right.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
started=$(date +%s)

mode=gpu max_bytes=$((256 << 20)) quick=() kit=${RIVET_GPU_KIT:-$repo/target/gpu-kit} profile=release
orig_args=("$@")
while (($#)); do
    case $1 in
        --pack) mode=pack ;;
        --debug) profile=debug ;;
        --cpu) mode=cpu ;;
        --kit) kit=$2; shift ;;
        --max-bytes) max_bytes=$2; shift ;;
        --quick) quick=(--quick) ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu-nccl: unknown argument $1 (--help)" >&2; exit 2 ;;
    esac
    shift
done

say() { echo "gpu-nccl: $*" >&2; }
die() { say "$*"; exit 1; }
elapsed() { echo $(($(date +%s) - started)); }

# ------------------------------------------------------------------------------------------ pack
if [[ $mode == pack ]]; then
    cd "$repo"
    bash fabric/build.sh
    fabric_lib=$(bash scripts/fabric-lane.sh --lib-dir)
    if [[ $profile == release ]]; then
        cargo build --release --locked -p rivet-plugin -p rivet
    else
        cargo build --locked -p rivet-plugin -p rivet
    fi
    rm -rf "$kit"
    mkdir -p "$kit/lib" "$kit/bin" "$kit/fabric"
    cp "target/$profile/libnccl_net_rivet.so" "$kit/lib/libnccl-net-rivet.so"
    cp "target/$profile/rivet" "$kit/bin/rivet"
    cp -P "$fabric_lib"/libibverbs.so* "$kit/fabric/"
    # NCCL's IB transport dlopens "libibverbs.so" before "libibverbs.so.1".
    [[ -e $kit/fabric/libibverbs.so ]] || ln -s libibverbs.so.1 "$kit/fabric/libibverbs.so"
    git -C "$repo" describe --always --dirty >"$kit/VERSION"
    say "kit ready in $kit ($profile, $(du -sh "$kit" | cut -f1), $(cat "$kit/VERSION")): carry it to the GPU machine"
    exit 0
fi

# ------------------------------------------------------------------------ kit and prerequisites
for f in lib/libnccl-net-rivet.so bin/rivet fabric/libibverbs.so.1; do
    [[ -e $kit/$f ]] || die "$kit/$f is missing: run scripts/gpu-nccl.sh --pack on the build machine"
done
command -v python3 >/dev/null || die "python3 is missing"
kit=$(cd "$kit" && pwd)
plugin=$kit/lib/libnccl-net-rivet.so
rivet=$kit/bin/rivet

# ------------------------------------------------------------------------ the private /sys view
# NCCL's IB transport reads /sys/class/infiniband/<dev>/device (and, on RoCE, gid_attrs) by
# absolute path. Inside a private mount namespace (this script re-executes itself there), the
# fabric's own tree is shown at /sys/class/infiniband; the host's /sys is never touched.
if [[ ${RIVET_GPU_NCCL_NS:-0} != 1 ]]; then
    export RIVET_GPU_NCCL_WORK=${RIVET_GPU_NCCL_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/rivet-gpu-nccl.XXXXXX")}
    ns=(unshare -m --propagation private)
    ((EUID == 0)) || ns=(unshare -r -m --propagation private)
    if RIVET_GPU_NCCL_NS=1 "${ns[@]}" true 2>/dev/null; then
        rc=0
        RIVET_GPU_NCCL_NS=1 "${ns[@]}" bash "$0" "${orig_args[@]}" || rc=$?
    else
        say "no private mount namespace here (unshare -m failed): NCCL's IB transport will not find /sys/class/infiniband"
        rc=0
        RIVET_GPU_NCCL_NS=none bash "$0" "${orig_args[@]}" || rc=$?
    fi
    rm -rf "$RIVET_GPU_NCCL_WORK"
    exit "$rc"
fi

work=$RIVET_GPU_NCCL_WORK
# Start the fabric: its own directory, its library first on the search path. Nothing else tells
# Rivet, perftest or NCCL about it.
export RIVET_FABRIC_DIR=$work/fabric
mkdir -p "$RIVET_FABRIC_DIR"
export LD_LIBRARY_PATH=$kit/fabric${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# The handshakes (NCCL's bootstrap, Rivet's and NCCL IB's connection setup) stay on loopback.
export NCCL_SOCKET_IFNAME=lo
# The fabric moves host memory only (docs/fabric.md): no GPUDirect RDMA, no dma-buf.
export NCCL_NET_GDR_LEVEL=LOC NCCL_DMABUF_ENABLE=0
"$rivet" info >"$work/info" 2>&1 || true
sed 's/^/  rivet info: /' "$work/info"
dev=$(awk '$3 == "port" { print $2; exit }' "$work/info")
[[ -n $dev ]] || die "Rivet finds no fabric device (see rivet info above)"
ibdev_dir=$(find "$RIVET_FABRIC_DIR" -path "*/class/infiniband/$dev" 2>/dev/null | head -n 1)
[[ -n $ibdev_dir ]] || die "the fabric made no sysfs tree for $dev under $RIVET_FABRIC_DIR"
say "fabric started: device $dev, its sysfs tree $ibdev_dir"

if [[ ${RIVET_GPU_NCCL_NS} == 1 ]]; then
    fabric_class=$(dirname "$ibdev_dir")
    if [[ -d /sys/class/infiniband ]]; then
        mount --bind "$fabric_class" /sys/class/infiniband
    else
        # No RDMA class on this kernel and sysfs takes no new directory: show a copy of
        # /sys/class (its entries are symlinks into /sys/devices, which stays) plus the fabric's.
        view=$work/sys-class
        mkdir -p "$view"
        for c in /sys/class/*; do
            mkdir -p "$view/${c##*/}"
            cp -P "$c"/* "$view/${c##*/}/" 2>/dev/null || true
        done
        rmdir "$view/infiniband" 2>/dev/null || true
        ln -s "$fabric_class" "$view/infiniband"
        [[ -d $(dirname "$fabric_class")/infiniband_verbs ]] && ln -sfn "$(dirname "$fabric_class")/infiniband_verbs" "$view/infiniband_verbs"
        mount --bind "$view" /sys/class
    fi
    # The fabric registers host memory only: hide the GPU peer-memory module from NCCL and Rivet
    # (else both would offer GPUDirect RDMA, which the fabric refuses).
    empty=$work/empty
    mkdir -p "$empty"
    for p in /sys/kernel/mm/memory_peers /sys/module/nvidia_peermem; do
        [[ -d $p ]] && mount --bind "$empty" "$p" && say "private /sys view: $p hidden (host memory only)"
    done
    if real=$(realpath "/sys/class/infiniband/$dev/device" 2>/dev/null); then
        say "private /sys view: /sys/class/infiniband/$dev/device -> $real (the host's /sys is unchanged)"
    else
        die "private /sys view: /sys/class/infiniband/$dev/device does not resolve"
    fi
fi

# ------------------------------------------------------------------------------------ CPU half
if [[ $mode == cpu ]]; then
    status=0
    if command -v ibv_devinfo >/dev/null; then
        if ibv_devinfo -d "$dev" >"$work/devinfo" 2>&1 && grep -q "link_layer:.*InfiniBand" "$work/devinfo"; then
            say "ibv_devinfo sees $dev: $(grep -E 'state:|link_layer:|sm_lid|port_lid' "$work/devinfo" | tr -s ' \t' ' ' | paste -sd, -)"
        else
            cat "$work/devinfo" >&2
            say "FAIL ibv_devinfo does not show $dev as an InfiniBand device"
            status=1
        fi
    fi
    # Rivet's library between two processes (rivet bench forks its server), every size of the GPU run.
    csv=$(cd "$repo" && python3 -c "import sys; sys.path.insert(0, 'scripts'); import gpu_nccl as g; print(','.join(str(s) for s in g.sizes($max_bytes, ${#quick[@]} > 0)))")
    if "$rivet" bench --plugin "$plugin" --json --quiet --sizes "$csv" --lat-iters 200 >"$work/bench.json" 2>"$work/bench.err"; then
        say "Rivet's library ($plugin), two processes over $dev:"
        grep -o '"size":[0-9]*,"iters":[0-9]*,"seconds":[0-9.]*,"mib_per_s":[0-9.]*' "$work/bench.json" |
            awk -F'[:,]' '{ printf "  %10d B  %9.1f MiB/s\n", $2, $8 }' >&2
        grep -o '"p50_us":[0-9.]*' "$work/bench.json" | head -n 1 | sed 's/^/  8 B latency /' >&2
    else
        cat "$work/bench.err" >&2
        say "FAIL rivet bench over the fabric"
        status=1
    fi
    if [[ ${RIVET_GPU_NCCL_NS} == 1 ]]; then
        for p in "/sys/class/infiniband/$dev/device" "/sys/class/infiniband/$dev/ports/1"; do
            [[ -e $p ]] || { say "FAIL $p is missing in the private view"; status=1; }
        done
        ((status)) || say "the paths NCCL's IB transport reads exist in the private view"
    fi
    (cd "$repo" && python3 scripts/gpu_nccl.py self-test) || status=1
    say "--cpu: $( ((status)) && echo FAILED || echo passed) in $(elapsed) s (no GPU: the NCCL runs themselves were not made)"
    exit "$status"
fi

# ------------------------------------------------------------------------------------ GPU runs
python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() and torch.cuda.device_count() >= 1 else 1)' ||
    die "torch with a CUDA device is needed (or run --cpu)"
say "$(python3 -c 'import torch; print("torch", torch.__version__, "NCCL", ".".join(map(str, torch.cuda.nccl.version())), "GPU", torch.cuda.get_device_name(0))')"

port=29600
# run_ranks NAME ENV...: the two ranks of one run; results in $work/NAME.json, logs in $work/NAME.r*.log
run_ranks() {
    local name=$1
    shift
    port=$((port + 1))
    local pids=() r rc=0
    for r in 0 1; do
        env "$@" NCCL_HOSTID="rivet-gpu-nccl-host-$r" CUDA_VISIBLE_DEVICES=0 \
            NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,TUNING \
            timeout 240 python3 "$here/gpu_nccl.py" rank --rank "$r" --port "$port" \
            --out "$work/$name.json" --max-bytes "$max_bytes" "${quick[@]}" \
            >"$work/$name.r$r.log" 2>&1 &
        pids+=($!)
    done
    for r in 0 1; do wait "${pids[$r]}" || rc=$?; done
    say "$name: ranks exited ($rc) after $(elapsed) s in all"
    grep -hE "Using network|via NET/|NET/Plugin|Initialized NET plugin|Failed to initialize NET|NET/IB ?:|COLLNET/|Connected CollNet|WARN|MISMATCH|Error|error:" \
        "$work/$name.r0.log" | grep -v "TUNING" | sort | uniq -c | sort -rn | head -n 25 | sed "s/^/  [$name rank 0] /" >&2 || true
    grep -hE "MISMATCH|Traceback|Error" "$work/$name.r1.log" | head -n 5 | sed "s/^/  [$name rank 1] /" >&2 || true
    return "$rc"
}

overall=0
run_ranks Rivet NCCL_NET=Rivet NCCL_NET_PLUGIN="$plugin" || overall=1
grep -q "Using network Rivet" "$work/Rivet.r0.log" || { say "NCCL did not say 'Using network Rivet'"; overall=1; }
run_ranks IB NCCL_NET=IB NCCL_NET_PLUGIN=none || overall=1
run_ranks Socket NCCL_NET=Socket NCCL_NET_PLUGIN=none || overall=1
run_ranks CollNet NCCL_NET=Rivet NCCL_NET_PLUGIN="$plugin" NCCL_COLLNET_ENABLE=1 || overall=1

echo
python3 "$here/gpu_nccl.py" report Rivet="$work/Rivet.json" IB="$work/IB.json" Socket="$work/Socket.json" || overall=1
echo
collnet_algos=$(grep -ohE "AllReduce: [0-9]+ Bytes -> Algo [A-Za-z]+" "$work/CollNet.r0.log" | awk '{ print $NF }' | sort | uniq -c | tr -s ' ' | paste -sd, - || true)
if grep -q "via COLLNET/Rivet" "$work/CollNet.r0.log"; then
    echo "CollNet (NCCL_COLLNET_ENABLE=1): NCCL connected Rivet's CollNet (via COLLNET/Rivet); all-reduce algorithms chosen: ${collnet_algos:-none logged}"
else
    echo "CollNet (NCCL_COLLNET_ENABLE=1): NCCL did not connect Rivet's CollNet; all-reduce algorithms chosen: ${collnet_algos:-none logged}"
    grep -hiE "collnet" "$work/CollNet.r0.log" | grep -v TUNING | sort -u | head -n 8 | sed 's/^/  /' || true
fi
python3 "$here/gpu_nccl.py" report CollNet="$work/CollNet.json" >"$work/CollNet.report" || overall=1
head -n 1 "$work/CollNet.report"
echo
echo "gpu-nccl: $( ((overall)) && echo FAILED || echo passed) in $(elapsed) s"
exit "$overall"
