#!/usr/bin/env bash
# scripts/footprint.sh: build the two libraries Rivet ships (scripts/build-dist.sh: the default
# one and --minimal) and check what each carries (docs/footprint.md):
#   - its dynamic symbols: the seven net tables, plus the seven CollNet tables and the four RMA
#     tables in the default build and none of them in the minimal one; nothing else;
#   - no code of the test support: rivet-verbs-ffi's `mlx5-model` and `loopback-check` features,
#     rivet-core's `sim` feature, the plugin's cfg(test) simulated backend;
#   - the minimal one: no function of CollNet, the mesh device, the profiler events or RMA;
#   - `.data` at most 64 KiB; the stripped size at most 1,010,000 bytes (default: 850,000 until
#     the RMA tables' 79 KB came, 900,000 until port failover's 109 KB, 1,000,000 until failover
#     between devices, 15 KB, docs/footprint.md) and
#     630,000 bytes (minimal: 600,000 until the eager path's 18 KB came, 620,000 until the
#     multi-lane path's failover branches, the negotiation and the inline payload, 11 KB).
# Prints each stripped size and its `.text`, `.data`, `.rodata`, `.eh_frame` sections (`size -A`).
#
#   scripts/footprint.sh                  build both and check both
#   scripts/footprint.sh [--minimal] DIR  check DIR/lib and DIR/debug as build-dist.sh wrote them
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"

net=(ncclNetPlugin_v{6..12})
collnet=(ncclCollNetPlugin_v{6..12})
rma=(ncclRmaPlugin_v{13..16})
# Demangled path prefixes of code that must not be linked in.
test_support='rivet_verbs_ffi::(mlx5::model|selftest)::|rivet_core::sim::|nccl_net_rivet::backend::sim::'
# Functions of the optional parts' own modules (the minimal build may keep std's generic code
# instantiated for their types, e.g. dropping the never-set Option<Arc<MeshDevice>>: 341 bytes).
optional_parts=' [tTwW] <?(nccl_net_rivet::(collnet|mesh|profiler|rma)|rivet_core::(collnet|rma))::'
max_data=65536

# check NAME DIR MAX_BYTES MINIMAL(0|1)
check() {
  local name=$1 dir=$2 max=$3 minimal=$4 fail=0
  local stripped="$dir/lib/libnccl-net-rivet.so" full="$dir/debug/libnccl-net-rivet.so"
  local required=("${net[@]}")
  [ "$minimal" = 1 ] || required+=("${collnet[@]}" "${rma[@]}")
  local exports
  exports=$(nm -D --defined-only "$stripped" | awk '{print $3}' | sort)
  for sym in "${required[@]}"; do
    grep -qxF "$sym" <<<"$exports" || { echo "footprint: FAIL $name: $sym is not exported" >&2; fail=1; }
  done
  local unexpected
  unexpected=$(grep -vxF -f <(printf '%s\n' "${required[@]}") <<<"$exports" || true)
  if [ -n "$unexpected" ]; then
    echo "footprint: FAIL $name exports beyond its tables: $(echo "$unexpected" | tr '\n' ' ')" >&2
    fail=1
  fi
  # The unstripped library's symbol table names every function that was linked in (and not inlined).
  local linked
  linked=$({
    nm -C "$full" | grep -E "$test_support"
    if [ "$minimal" = 1 ]; then nm -C "$full" | grep -E "$optional_parts"; fi
  } || true)
  if [ -n "$linked" ]; then
    echo "footprint: FAIL $name links $(wc -l <<<"$linked") symbols it must not carry:" >&2
    head -5 <<<"$linked" >&2
    fail=1
  fi
  section() { size -A "$stripped" | awk -v s="$1" '$1 == s { print $2 }'; }
  local data bytes
  data=$(section .data)
  bytes=$(stat -c %s "$stripped")
  if [ "${data:-0}" -gt "$max_data" ]; then
    echo "footprint: FAIL $name: .data is $data bytes (at most $max_data)" >&2
    fail=1
  fi
  if [ "$bytes" -gt "$max" ]; then
    echo "footprint: FAIL $name: $bytes bytes stripped (at most $max)" >&2
    fail=1
  fi
  printf 'footprint: %s stripped %d bytes (at most %d): .text %d, .data %d, .rodata %d, .eh_frame %d; %d exports\n' \
    "$name" "$bytes" "$max" "$(section .text)" "${data:-0}" "$(section .rodata)" \
    "$(section .eh_frame)" "$(wc -l <<<"$exports")"
  return "$fail"
}

if [ $# -gt 0 ]; then
  minimal=0
  [ "$1" = --minimal ] && { minimal=1; shift; }
  if [ "$minimal" = 1 ]; then check minimal "$1" 630000 1; else check default "$1" 1010000 0; fi
  exit
fi
work=$(mktemp -d /tmp/rivet-footprint.XXXXXX)
trap 'rm -rf "$work"' EXIT
scripts/build-dist.sh "$work/default"
scripts/build-dist.sh --minimal "$work/minimal"
fail=0
check default "$work/default" 1010000 0 || fail=1
check minimal "$work/minimal" 630000 1 || fail=1
exit "$fail"
