#!/usr/bin/env bash
# Rivet's main job: build the plugin and show what it sees. With an RDMA device on this machine it
# runs here; otherwise it boots the Soft-RoCE VM (vm/run.sh) and runs there.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
command -v cc >/dev/null || { apt-get update -qq && apt-get install -y -qq gcc; }
cargo build --release --locked -p rivet-plugin -p rivet
exec "${CARGO_TARGET_DIR:-$repo/target}/release/rivet" info
