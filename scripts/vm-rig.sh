#!/usr/bin/env bash
# The multi-VM rig lane (issue #12): build on the host, then boot two Soft-RoCE VMs wired by two
# links (vm/multi.sh --topology pair2) and run tests/vm_rig.rs across them: byte-checked transfers on
# each link, conformance across hosts, link cut, peer host death and reboot; then the triangle
# (three VMs, a transfer per link). Needs root for the VM kit (apt, kernel package).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
vm/kit.sh
cargo build --workspace --locked
cargo test --locked --test vm_rig -- --ignored --nocapture --test-threads=1
