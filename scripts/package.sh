#!/usr/bin/env bash
# scripts/package.sh: the Debian package `rivet` and a relocatable tarball of the library Rivet
# ships (scripts/build-dist.sh), with dpkg-deb and tar only.
#
#   scripts/package.sh [--minimal] [--out DIR]      (DIR defaults to target/package)
#
# DIR/rivet_VERSION_ARCH.deb (…+minimal… with --minimal: the p2p plugin alone):
#   /usr/lib/<multiarch>/libnccl-net-rivet.so   what NCCL_NET_PLUGIN=rivet makes NCCL dlopen
#                                                (the multiarch directory is on the loader's path)
#   /usr/bin/rivet                              the command (version, info, doctor, selftest, bench)
#   /usr/share/doc/rivet/                       README.md, docs/, copyright, nccl.conf.example
# No conffile: /etc/nccl.conf belongs to the administrator (and libnccl2 may ship one); the
# example line goes to /usr/share/doc/rivet/nccl.conf.example.
# DIR/rivet-VERSION-ARCH.tar.gz (…-minimal…): rivet-VERSION-ARCH/{lib,bin,share/doc/rivet},
# usable from wherever it is unpacked (NCCL_NET_PLUGIN=<dir>/lib/libnccl-net-rivet.so).
#
# Both are reproducible: file times are SOURCE_DATE_EPOCH (default: the commit's time), owners
# root, names sorted. Outside a git checkout set RIVET_BUILD_COMMIT (else the version line says
# the commit is unknown).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"

out="$repo/target/package"
minimal=()
while [ $# -gt 0 ]; do
  case "$1" in
    --minimal) minimal=(--minimal); shift ;;
    --out) out="$2"; shift 2 ;;
    --out=*) out="${1#--out=}"; shift ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "package.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
arch=$(dpkg --print-architecture)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
flavour=${minimal:+-minimal}
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
  SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null || echo 0)
fi
export SOURCE_DATE_EPOCH

work=$(mktemp -d /tmp/rivet-package.XXXXXX)
trap 'rm -rf "$work"' EXIT
scripts/build-dist.sh "${minimal[@]}" "$work/build"
built="$work/build"

# The documents both ship.
docs() {
  local dir=$1
  install -d "$dir/docs"
  install -m 0644 README.md "$dir/README.md"
  if compgen -G "docs/*.md" >/dev/null; then install -m 0644 docs/*.md "$dir/docs/"; fi
  cat >"$dir/copyright" <<COPYRIGHT
Rivet: an NCCL network plugin for RDMA (InfiniBand and RoCE)
License: Apache-2.0 OR MIT (see /usr/share/common-licenses/Apache-2.0)
COPYRIGHT
  cat >"$dir/nccl.conf.example" <<CONF
# NCCL reads /etc/nccl.conf (and ~/.nccl.conf). To make every NCCL job use Rivet, copy the
# lines below into it, uncommented. NCCL_NET_PLUGIN=rivet makes NCCL dlopen libnccl-net-rivet.so;
# NCCL_NET=Rivet makes it fail rather than fall back to another network.
#NCCL_NET_PLUGIN=rivet
#NCCL_NET=Rivet
CONF
}

# The Debian package.
root="$work/deb"
install -d "$root/DEBIAN" "$root/usr/lib/$multiarch" "$root/usr/bin" "$root/usr/share/doc/rivet"
install -m 0644 "$built/lib/libnccl-net-rivet.so" "$root/usr/lib/$multiarch/"
install -m 0755 "$built/bin/rivet" "$root/usr/bin/"
docs "$root/usr/share/doc/rivet"
deb_version="$version${minimal:++minimal}"
cat >"$root/DEBIAN/control" <<CONTROL
Package: rivet
Version: $deb_version
Architecture: $arch
Maintainer: Rivet developers <rivet@example.invalid>
Section: net
Priority: optional
Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)
Depends: libc6
Recommends: libibverbs1
Suggests: libnccl2
Homepage: https://example.invalid/rivet
Description: NCCL network plugin for RDMA (InfiniBand and RoCE)
 Rivet is a network plugin NCCL loads as libnccl-net-rivet.so (NCCL_NET_PLUGIN=rivet) to move
 data between machines over RDMA verbs. libibverbs is loaded at run time. The rivet command
 prints the version, the ports the plugin would use, and diagnoses the machine's RDMA setup.
CONTROL
# The library lands in a directory ld.so caches: refresh the cache after install and removal.
echo "activate-noawait ldconfig" >"$root/DEBIAN/triggers"
chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/triggers"
find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
mkdir -p "$out"
deb="$out/rivet_${deb_version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null

# The relocatable tarball.
name="rivet-$version-$arch$flavour"
tree="$work/tar/$name"
install -d "$tree/lib" "$tree/bin" "$tree/share/doc/rivet"
install -m 0644 "$built/lib/libnccl-net-rivet.so" "$tree/lib/"
install -m 0755 "$built/bin/rivet" "$tree/bin/"
docs "$tree/share/doc/rivet"
tarball="$out/$name.tar.gz"
tar -C "$work/tar" --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
  -cf - "$name" | gzip -n -9 >"$tarball"

echo "package.sh: $deb ($(stat -c %s "$deb") bytes)"
echo "package.sh: $tarball ($(stat -c %s "$tarball") bytes)"
