#!/usr/bin/env bash
# scripts/build-dist.sh: build the library and the command Rivet ships, the one way that
# install.sh, package.sh, footprint.sh and the reproducibility check build them
# (docs/footprint.md has the byte accounting and the reasons).
#
#   scripts/build-dist.sh [--minimal] OUT
#
# Writes OUT/lib/libnccl-net-rivet.so and OUT/bin/rivet, stripped, and the same two unstripped
# (symbols and line tables, for profilers and debuggers) under OUT/debug/. --minimal builds
# without the plugin's default features (collnet, mesh, profiler): the p2p plugin alone.
#
# The build: `cargo build --profile dist` (release + LTO in one codegen unit; panics unwind, the
# plugin catches them at the C boundary) for the host target, with
#  - std rebuilt from the toolchain's own sources (the rust-src component) without std's
#    `backtrace` feature: `-Z build-std=std,panic_unwind -Z build-std-features=panic-unwind`,
#    which needs RUSTC_BOOTSTRAP=1 on the stable toolchain. Why: the prebuilt std carries a DWARF
#    symboliser (gimli, addr2line, miniz_oxide, rustc_demangle; ~175 KB of code) that std's
#    default panic hook links in whenever panics can unwind, and stable Rust offers no other way
#    to leave it out. A panic message is still printed (without a backtrace). Same compiler, same
#    std sources, one Cargo feature of std's own; the data path is unchanged (docs/footprint.md).
#  - every source path remapped (--remap-path-prefix: the checkout to /rivet, CARGO_HOME to
#    /cargo, the toolchain to /rustc), so the bytes do not depend on where the checkout lies.
#
# Environment:
#   RIVET_STD=rebuilt|prebuilt|auto   (default auto: rebuilt when the rust-src component is
#                                      installed or `rustup` can add it, else prebuilt with a note)
#   RIVET_BUILD_COMMIT                the commit to report when building outside a git checkout
#   CARGO_TARGET_DIR                  as for cargo
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"

features=()
out=
while [ $# -gt 0 ]; do
  case "$1" in
    --minimal) features=(--no-default-features); shift ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    -*) echo "build-dist.sh: unknown argument $1" >&2; exit 2 ;;
    *) out="$1"; shift ;;
  esac
done
[ -n "$out" ] || { echo "usage: scripts/build-dist.sh [--minimal] OUT" >&2; exit 2; }

host=$(rustc -vV | sed -n 's/^host: //p')
sysroot=$(rustc --print sysroot)
rustc_commit=$(rustc -vV | sed -n 's/^commit-hash: //p')
std_src="$sysroot/lib/rustlib/src/rust/library/Cargo.lock"
std=${RIVET_STD:-auto}
if [ "$std" != prebuilt ] && [ ! -f "$std_src" ]; then
  rustup component add rust-src >/dev/null 2>&1 || true
fi
if [ "$std" = auto ]; then
  if [ -f "$std_src" ]; then std=rebuilt; else
    echo "build-dist.sh: no rust-src component: building with the prebuilt std (~175 KB larger)" >&2
    std=prebuilt
  fi
fi
build_std=()
case "$std" in
  rebuilt)
    [ -f "$std_src" ] || { echo "build-dist.sh: RIVET_STD=rebuilt needs the rust-src component" >&2; exit 1; }
    export RUSTC_BOOTSTRAP=1
    build_std=(-Z build-std=std,panic_unwind -Z build-std-features=panic-unwind) ;;
  prebuilt) ;;
  *) echo "build-dist.sh: RIVET_STD must be rebuilt, prebuilt or auto" >&2; exit 2 ;;
esac

cargo_home=${CARGO_HOME:-$HOME/.cargo}
remap="--remap-path-prefix=$repo=/rivet --remap-path-prefix=$cargo_home=/cargo"
remap+=" --remap-path-prefix=$sysroot=/rustc/$rustc_commit"
RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }$remap" \
  cargo build --profile dist --locked --target "$host" "${build_std[@]}" \
  -p rivet-plugin -p rivet "${features[@]}"

built="${CARGO_TARGET_DIR:-$repo/target}/$host/dist"
mkdir -p "$out/lib" "$out/bin" "$out/debug"
cp "$built/libnccl_net_rivet.so" "$out/debug/libnccl-net-rivet.so"
cp "$built/rivet" "$out/debug/rivet"
# The exported tables are dynamic symbols, which --strip-all keeps.
strip --strip-all -o "$out/lib/libnccl-net-rivet.so" "$built/libnccl_net_rivet.so"
strip --strip-all -o "$out/bin/rivet" "$built/rivet"
echo "build-dist.sh: $out/lib/libnccl-net-rivet.so ($(stat -c %s "$out/lib/libnccl-net-rivet.so") bytes, std $std${features[*]:+, minimal})"
