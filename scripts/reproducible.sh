#!/usr/bin/env bash
# scripts/reproducible.sh: build the shipped library (scripts/build-dist.sh) from a copy of this
# checkout in another directory, with a target directory of its own, and check that the stripped
# library and command are byte-identical to those built here. Exit 1 (and `cmp` output) if not.
#
#   scripts/reproducible.sh [DIR]   DIR: compare with what build-dist.sh wrote there (else build)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
work=$(mktemp -d /tmp/rivet-reproducible.XXXXXX)
trap 'rm -rf "$work"' EXIT
here=${1:-}
if [ -z "$here" ]; then
  here="$work/here"
  scripts/build-dist.sh "$here"
fi
# The same files at another path: the tracked ones, as committed or edited.
mkdir -p "$work/elsewhere/checkout"
git ls-files -z | xargs -0 cp --parents -t "$work/elsewhere/checkout"
# No .git there: the commit comes in as packaging scripts pass it.
RIVET_BUILD_COMMIT=$(git rev-parse --short=12 HEAD) CARGO_TARGET_DIR="$work/elsewhere/target" \
  "$work/elsewhere/checkout/scripts/build-dist.sh" "$work/elsewhere/out"
fail=0
for f in lib/libnccl-net-rivet.so bin/rivet; do
  if cmp "$here/$f" "$work/elsewhere/out/$f"; then
    echo "reproducible: $f identical ($(sha256sum <"$here/$f" | cut -c1-16)…, $(stat -c %s "$here/$f") bytes)"
  else
    echo "reproducible: FAIL $f differs between $repo and $work/elsewhere/checkout" >&2
    fail=1
  fi
done
exit "$fail"
