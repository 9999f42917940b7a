#!/usr/bin/env bash
# Rivet's whole test suite, from a fresh Debian machine: installs what it needs, then runs
# formatting, lints, the no_std build of the core, the minimal build, the shipped libraries'
# footprint, reproducibility and packages, unit/integration tests, docs, fuzz smoke runs and the
# Soft-RoCE VM lanes. `.ci/run` calls exactly this.
#
#   scripts/test.sh            everything
#   RIVET_SKIP_VM=1 ...        skip the Soft-RoCE VM lane (it needs qemu and ~10 minutes)
#   RIVET_SKIP_FUZZ=1 ...      skip the fuzz smoke runs
#   RIVET_SKIP_FABRIC=1 ...    skip the native lane over the user-space verbs fabric
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"

stage() { printf '\n=== %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

stage "dependencies"
# Headers for the bindgen layout test (libibverbs-dev, libclang-dev), the C compiler for the C
# test programs, binutils' nm for the export check, valgrind for the VM lane's memcheck run,
# dpkg-dev for the package's multiarch directory.
need_apt=()
# The fabric lane: python3 for the GPU script's driver (its CPU half runs there), and for the
# fabric's own tests ibverbs-utils (ibv_devinfo) and perftest.
for pkg in libibverbs-dev libclang-dev clang gcc binutils pkg-config valgrind dpkg-dev python3 ibverbs-utils perftest; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get update -qq
  if ! as_root apt-get install -y -qq --no-install-recommends "${need_apt[@]}"; then
    # A half-finished earlier install or upgrade blocks every later one: complete it, retry.
    as_root dpkg --configure -a || true
    as_root apt-get -f install -y -qq || true
    as_root apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
  fi
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true
rustup target add x86_64-unknown-none >/dev/null
# std's sources: the shipped library is built with a std without its backtrace printer
# (scripts/build-dist.sh says why).
rustup component add rust-src >/dev/null

stage "format"
cargo fmt --all --check

stage "clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

stage "core without std (x86_64-unknown-none)"
cargo build -p rivet-core --locked --target x86_64-unknown-none

stage "build"
# The plugin's cdylib must exist before the loader test runs (cargo test builds only rlibs of
# dependencies).
cargo build --workspace --locked

stage "minimal build (--no-default-features): clippy, the plugin's unit tests"
cargo clippy -p rivet-plugin -p rivet --all-targets --no-default-features --locked -- -D warnings
cargo test -p rivet-plugin --lib --no-default-features --locked

stage "footprint: the shipped libraries (default, minimal): sizes, exports, no test-support code"
scripts/footprint.sh

stage "reproducible: the shipped library built again in another directory is byte-identical"
scripts/reproducible.sh

stage "packages: the Debian package and the relocatable tarball (default and minimal)"
scripts/package.sh --out target/package
scripts/package.sh --minimal --out target/package

stage "tests"
cargo test --workspace --locked

stage "docs"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked

if [ "${RIVET_SKIP_FUZZ:-0}" != 1 ] && [ -x scripts/fuzz-smoke.sh ]; then
  stage "fuzz smoke"
  scripts/fuzz-smoke.sh
fi

if [ "${RIVET_SKIP_FABRIC:-0}" != 1 ]; then
  stage "native fabric lane (the user-space verbs fabric, no VM)"
  scripts/fabric-lane.sh
fi

if [ "${RIVET_SKIP_VM:-0}" != 1 ]; then
  stage "Soft-RoCE VM lane"
  scripts/vm-lane.sh
  stage "Soft-RoCE VM lane: failure behaviour"
  scripts/vm-faults.sh
  stage "Soft-RoCE multi-VM rig (pair2): across hosts"
  scripts/vm-rig.sh
fi

stage "all passed"
