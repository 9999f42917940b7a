#!/usr/bin/env bash
# Build Rivet in release mode and install the NCCL net plugin library.
#
#   scripts/install.sh [--prefix DIR] [--as-default]
#
# Installs DIR/lib/libnccl-net-rivet.so (DIR defaults to /usr/local) and the `rivet` command as
# DIR/bin/rivet. NCCL finds the library with NCCL_NET_PLUGIN=rivet when DIR/lib is on the
# loader's path (LD_LIBRARY_PATH or ld.so.conf). With --as-default, DIR/lib/libnccl-net.so is also
# made a symlink to it, which NCCL loads when NCCL_NET_PLUGIN is unset.
set -euo pipefail

prefix=/usr/local
as_default=0
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix="$2"; shift 2 ;;
    --prefix=*) prefix="${1#--prefix=}"; shift ;;
    --as-default) as_default=1; shift ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
cargo build --profile dist --locked -p rivet-plugin -p rivet
target="${CARGO_TARGET_DIR:-$repo/target}/dist"

install -d "$prefix/lib" "$prefix/bin"
install -m 0755 "$target/libnccl_net_rivet.so" "$prefix/lib/libnccl-net-rivet.so"
# The release build keeps debug info and symbols for profiling; the installed library ships
# without them (about 0.65 MB instead of 6 MB; README "Footprint"). Its exported tables are
# dynamic symbols, which strip keeps.
if command -v strip >/dev/null; then
  strip --strip-all "$prefix/lib/libnccl-net-rivet.so"
else
  echo "install.sh: strip not found; the library is installed with its symbols" >&2
fi
install -m 0755 "$target/rivet" "$prefix/bin/rivet"
if [ "$as_default" = 1 ]; then
  ln -sfn libnccl-net-rivet.so "$prefix/lib/libnccl-net.so"
fi
echo "installed $prefix/lib/libnccl-net-rivet.so and $prefix/bin/rivet"
echo "use it with: LD_LIBRARY_PATH=$prefix/lib NCCL_NET_PLUGIN=rivet NCCL_NET=Rivet <your NCCL program>"
