#!/usr/bin/env bash
# Build Rivet (scripts/build-dist.sh) and install the NCCL net plugin library and the command.
#
#   scripts/install.sh [--prefix DIR] [--as-default] [--minimal]
#
# Installs DIR/lib/libnccl-net-rivet.so (DIR defaults to /usr/local) and the `rivet` command as
# DIR/bin/rivet, both stripped. NCCL finds the library with NCCL_NET_PLUGIN=rivet when DIR/lib is
# on the loader's path (LD_LIBRARY_PATH or ld.so.conf). With --as-default, DIR/lib/libnccl-net.so
# is also made a symlink to it, which NCCL loads when NCCL_NET_PLUGIN is unset. --minimal builds
# the p2p plugin alone (no CollNet tables, no mesh device, no profiler events).
set -euo pipefail

prefix=/usr/local
as_default=0
minimal=()
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix="$2"; shift 2 ;;
    --prefix=*) prefix="${1#--prefix=}"; shift ;;
    --as-default) as_default=1; shift ;;
    --minimal) minimal=(--minimal); shift ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

repo="$(cd "$(dirname "$0")/.." && pwd)"
built=$(mktemp -d /tmp/rivet-install.XXXXXX)
trap 'rm -rf "$built"' EXIT
"$repo/scripts/build-dist.sh" "${minimal[@]}" "$built"

install -d "$prefix/lib" "$prefix/bin"
install -m 0755 "$built/lib/libnccl-net-rivet.so" "$prefix/lib/libnccl-net-rivet.so"
install -m 0755 "$built/bin/rivet" "$prefix/bin/rivet"
if [ "$as_default" = 1 ]; then
  ln -sfn libnccl-net-rivet.so "$prefix/lib/libnccl-net.so"
fi
echo "installed $prefix/lib/libnccl-net-rivet.so and $prefix/bin/rivet"
echo "use it with: LD_LIBRARY_PATH=$prefix/lib NCCL_NET_PLUGIN=rivet NCCL_NET=Rivet <your NCCL program>"
