#!/usr/bin/env bash
# The native fabric lane (issue #28): no VM. Builds the user-space verbs fabric (fabric/build.sh,
# into target/fabric), runs the fabric's own tests (fabric/test.sh), then Rivet's shipped library,
# unchanged, over it with the fabric's folder first on LD_LIBRARY_PATH and nothing else:
# tests/fabric_lane.rs (discovery, the conformance suite between two processes, the 64 MiB /
# grouped / small transfers, `rivet bench`, all-to-all connect of 8 and 32 ranks, the faults that
# make sense on one host, the relocatable tarballs unpacked: RIVET_PACKAGE_DIR, default
# target/package, built with scripts/package.sh when missing), and the CPU half of the GPU script
# (scripts/gpu-nccl.sh --cpu).
# Prints the time of each part and of the lane.
#
#   scripts/fabric-lane.sh             the lane (scripts/test.sh runs it unless RIVET_SKIP_FABRIC=1)
#   scripts/fabric-lane.sh --lib-dir   print the folder of the built fabric library and exit
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
lib_dir="${FABRIC_OUT:-$repo/target/fabric}"
if [ "${1:-}" = "--lib-dir" ]; then
  [ -e "$lib_dir/libibverbs.so.1" ] || { echo "fabric-lane: $lib_dir/libibverbs.so.1 is not built (fabric/build.sh)" >&2; exit 1; }
  echo "$lib_dir"
  exit 0
fi

lane_start=$(date +%s)
part_start=$lane_start
part() {
  local now
  now=$(date +%s)
  printf 'fabric-lane: %s: %d s\n' "$1" $((now - part_start))
  part_start=$now
}

bash fabric/build.sh --tests >/dev/null
part "build the fabric"
if [ -x fabric/test.sh ] || [ -f fabric/test.sh ]; then
  bash fabric/test.sh
  part "the fabric's own tests (fabric/test.sh)"
else
  echo "fabric-lane: fabric/test.sh is missing: the fabric's own tests did not run" >&2
  exit 1
fi

cargo build --workspace --locked
part "build Rivet"

# Every process of the lane shares one fresh fabric directory, removed at the end.
RIVET_FABRIC_DIR="$(mktemp -d "${TMPDIR:-/tmp}/rivet-fabric-lane.XXXXXX")"
export RIVET_FABRIC_DIR
trap 'rm -rf "$RIVET_FABRIC_DIR"' EXIT
# The relocatable tarballs the lane unpacks (scripts/test.sh made them; built here if not).
package_dir="${RIVET_PACKAGE_DIR:-$repo/target/package}"
for flavour in "" --minimal; do
  if ! ls "$package_dir"/rivet-*"${flavour:+-minimal}".tar.gz >/dev/null 2>&1; then
    scripts/package.sh $flavour --out "$package_dir"
  fi
done
part "the packages (built if missing)"
RIVET_FABRIC_LIB_DIR="$lib_dir" RIVET_PACKAGE_DIR="$package_dir" \
  cargo test --locked --test fabric_lane -- --ignored --test-threads=1 --nocapture
part "Rivet over the fabric (tests/fabric_lane.rs)"

# The GPU script's fabric half: the kit it would carry, then its CPU mode.
kit="$repo/target/gpu-kit-debug"
scripts/gpu-nccl.sh --pack --debug --kit "$kit"
scripts/gpu-nccl.sh --cpu --quick --kit "$kit"
part "scripts/gpu-nccl.sh --pack and --cpu"

printf 'fabric-lane: the whole lane: %d s\n' $(($(date +%s) - lane_start))
