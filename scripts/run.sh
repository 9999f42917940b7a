#!/usr/bin/env bash
# Rivet's main job: build the plugin, show the ports it exposes, and move data through it between
# two processes (tests/c/transfer.c, through the ncclNetPlugin_v12 table): sizes 0 B – 64 MiB, a
# grouped receive of 8, and 10,000 small messages, every byte verified.
#
# With an RDMA device on this machine it runs here; otherwise it boots the Soft-RoCE VM
# (vm/run.sh, QEMU + rdma_rxe) and runs there. Needs root the first time (packages, VM kit).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
if ! command -v cc >/dev/null || ! dpkg-query -W libibverbs1 >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev ibverbs-providers libibverbs1
fi
cargo build --release --locked -p rivet-plugin -p rivet
target="${CARGO_TARGET_DIR:-$repo/target}/release"
transfer=$(ls -t "$target"/build/rivet-*/out/transfer | head -n 1)
job="$target/rivet info && $transfer $target/libnccl_net_rivet.so"
if [ -n "$(ls -A /sys/class/infiniband 2>/dev/null)" ]; then
  echo "RDMA device found: running on this machine"
  exec bash -c "$job"
fi
echo "no RDMA device on this machine: running in the Soft-RoCE VM (vm/run.sh)"
vm/kit.sh
exec vm/run.sh -- bash -c "$job"
