#!/usr/bin/env bash
# The Soft-RoCE VM lane: build everything on the host, then boot the QEMU VM once and run the
# real-device checks inside it (tests/vm_lane.rs). Needs root for the VM kit (apt, kernel package).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
vm/kit.sh
cargo build --workspace --locked
# The verbs-ffi tests that need a device, built here and run inside the VM.
device_test=$(cargo test -p rivet-verbs-ffi --test device --no-run --locked --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
export RIVET_VERBS_DEVICE_TEST="$device_test"
# The plugin's unit-test binary: its device tests (multi-QP connections on rxe0) run in the VM.
plugin_test=$(cargo test -p rivet-plugin --lib --no-run --locked --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
export RIVET_PLUGIN_DEVICE_TEST="$plugin_test"
# The Debian package, installed on a clean root in the VM (scripts/vm-package.sh).
scripts/package.sh --out target/package
deb=$(ls target/package/rivet_*.deb | grep -v minimal | head -n 1)
export RIVET_PACKAGE_DEB="$repo/$deb"
cargo test --locked --test vm_lane -- --ignored --nocapture
