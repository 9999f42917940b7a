#!/usr/bin/env bash
# Failure behaviour on a real device: boots the Soft-RoCE VM once and runs tests/c/faults.c's
# scenarios inside it (tests/vm_faults.rs). Needs root for the VM kit.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
vm/kit.sh
cargo build --workspace --locked
cargo test --locked --test vm_faults -- --ignored --nocapture
