#!/usr/bin/env bash
# scripts/footprint.sh: build the library scripts/install.sh ships (`--profile dist`), strip a copy
# and check what it carries (README "Footprint"):
#   - its dynamic symbols: every table in REQUIRED, any of OPTIONAL, nothing else;
#   - no code of the test support: rivet-verbs-ffi's `mlx5-model` and `loopback-check` features,
#     rivet-core's `sim` feature, the plugin's cfg(test) simulated backend;
#   - `.data` is at most 64 KiB.
# Prints the stripped size and the `.text`, `.data`, `.rodata`, `.eh_frame` sections (`size -A`).
#
#   scripts/footprint.sh [LIB]     LIB: check this library instead of building one
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"

# The exported tables. A new table version or family goes here (and into tests/abi_loader.rs).
required=(ncclNetPlugin_v{6..12} ncclCollNetPlugin_v{6..12})
optional=()
# Demangled path prefixes of code that must not be linked in.
test_support='rivet_verbs_ffi::(mlx5::model|selftest)::|rivet_core::sim::|nccl_net_rivet::backend::sim::'
max_data=65536

lib=${1:-}
if [ -z "$lib" ]; then
  cargo build --profile dist --locked -p rivet-plugin
  lib="${CARGO_TARGET_DIR:-$repo/target}/dist/libnccl_net_rivet.so"
fi
stripped=$(mktemp /tmp/rivet-footprint.XXXXXX.so)
trap 'rm -f "$stripped"' EXIT
strip --strip-all -o "$stripped" "$lib"

fail=0
exports=$(nm -D --defined-only "$stripped" | awk '{print $3}' | sort)
for sym in "${required[@]}"; do
  if ! grep -qxF "$sym" <<<"$exports"; then
    echo "footprint: FAIL $sym is not exported" >&2
    fail=1
  fi
done
allowed=$(printf '%s\n' "${required[@]}" "${optional[@]}")
unexpected=$(grep -vxF -f <(echo "$allowed") <<<"$exports" || true)
if [ -n "$unexpected" ]; then
  echo "footprint: FAIL exported beyond the plugin tables: $(echo "$unexpected" | tr '\n' ' ')" >&2
  fail=1
fi
# The unstripped library's symbol table names every function that was linked in (and not inlined).
test_code=$(nm -C "$lib" | grep -cE "$test_support" || true)
if [ "$test_code" != 0 ]; then
  echo "footprint: FAIL $test_code symbols of test support in $lib:" >&2
  nm -C "$lib" | grep -E "$test_support" | head -5 >&2
  fail=1
fi
section() { size -A "$stripped" | awk -v s="$1" '$1 == s { print $2 }'; }
data=$(section .data)
if [ "${data:-0}" -gt "$max_data" ]; then
  echo "footprint: FAIL .data is $data bytes (at most $max_data)" >&2
  fail=1
fi
printf 'footprint: %s stripped %d bytes: .text %d, .data %d, .rodata %d, .eh_frame %d; exports %s\n' \
  "$(basename "$lib")" "$(stat -c %s "$stripped")" "$(section .text)" "${data:-0}" \
  "$(section .rodata)" "$(section .eh_frame)" "$(echo "$exports" | tr '\n' ' ')"
exit "$fail"
