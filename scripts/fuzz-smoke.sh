#!/usr/bin/env bash
# Build every cargo-fuzz target and run each for a short smoke time (default 30 s) from its
# committed seeds. cargo-fuzz needs nightly-only flags; RUSTC_BOOTSTRAP=1 lets the stable
# toolchain accept them.
#
#   scripts/fuzz-smoke.sh [SECONDS]
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
seconds="${1:-${RIVET_FUZZ_SECONDS:-30}}"
export RUSTC_BOOTSTRAP=1
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi
targets=$(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^rivet-fuzz$')
cargo fuzz build --fuzz-dir fuzz
for target in $targets; do
  corpus=$(mktemp -d)
  # Committed seeds, and the findings kept as regressions (tests/replay.rs runs both in
  # `cargo test` too).
  seeds=""
  for dir in "fuzz/seeds/$target" "fuzz/regressions/$target"; do
    [ -d "$dir" ] && seeds="$seeds $dir"
  done
  echo "--- $target (${seconds} s)"
  log="$corpus.log"
  status=0
  cargo fuzz run --fuzz-dir fuzz "$target" "$corpus" $seeds -- -max_total_time="$seconds" -print_final_stats=1 \
    >"$log" 2>&1 || status=$?
  grep -E "^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)" "$log" || true
  if [ "$status" != 0 ]; then
    tail -n 60 "$log" >&2
    echo "fuzz target $target failed (exit $status)" >&2
    exit 1
  fi
  rm -rf "$corpus" "$log"
done
