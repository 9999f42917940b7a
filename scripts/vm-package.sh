#!/usr/bin/env bash
# scripts/vm-package.sh: inside the Soft-RoCE VM (a step of tests/vm_lane.rs), install the
# Debian package on a clean root, run the transfer test against the INSTALLED library, remove
# the package and check that nothing of it is left.
#
#   scripts/vm-package.sh DEB TRANSFER       (as root, in the VM: RIVET_IN_VM=1)
#
# The clean root: an overlay whose lower layer is the VM's root (the host's, over 9p, read
# only here) and whose upper layer is a tmpfs, so dpkg writes nothing to the host. Before the
# install no libnccl-net-rivet.so may be on the loader's path (else the test would prove
# nothing); the transfer test dlopens the bare name `libnccl-net-rivet.so`, as NCCL does for
# NCCL_NET_PLUGIN=rivet, so the loader finds the installed copy. After `dpkg --purge` the upper
# layer may hold only dpkg's own records and the loader cache.
set -euo pipefail
deb=$(realpath "$1")
transfer=$(realpath "$2")
[ "${RIVET_IN_VM:-0}" = 1 ] || { echo "vm-package.sh: runs inside the VM only" >&2; exit 2; }

# overlayfs is a module of the guest kernel; the kit holds the guest's modules. vm/run.sh and
# vm/multi.sh export the kit's path into the guest; the default is theirs.
kit=${RIVET_VM_KIT:-$(cd "$(dirname "$0")/.." && pwd)/.vm-kit}
if ! grep -qw overlay /proc/filesystems; then
  ko=$(find "$kit/kernel" -path "*/$(uname -r)/*" -name 'overlay.ko*' | head -n 1)
  [ -n "$ko" ] || { echo "vm-package.sh: no overlay module for $(uname -r)" >&2; exit 1; }
  case "$ko" in
    *.xz) xz -dc "$ko" >/run/overlay.ko; insmod /run/overlay.ko ;;
    *) insmod "$ko" ;;
  esac
fi

scratch=$(mktemp -d /run/rivet-pkg.XXXXXX)
mount -t tmpfs tmpfs "$scratch"
mkdir -p "$scratch"/{upper,work,root}
mount -t overlay overlay -o "lowerdir=/,upperdir=$scratch/upper,workdir=$scratch/work" "$scratch/root"
root=$scratch/root
for m in proc sys dev dev/pts run; do mount --bind "/$m" "$root/$m"; done
mount -t tmpfs tmpfs "$root/tmp"
cp "$deb" "$root/tmp/rivet.deb"
# The test program is copied in too: the build tree may itself lie under /tmp (a clone in
# `mktemp -d`), which the root's own /tmp hides.
cp "$transfer" "$root/tmp/transfer"
cleanup() {
  for m in tmp run dev/pts dev sys proc; do umount "$root/$m" 2>/dev/null || true; done
  umount "$root" 2>/dev/null || true
  umount "$scratch" 2>/dev/null || true
  rmdir "$scratch" 2>/dev/null || true
}
trap cleanup EXIT
in_root() { chroot "$root" "$@"; }

fail=0
check() { if "$@"; then echo "PASS $*"; else echo "FAIL $*"; fail=1; fi; }
absent_from_loader() { ! in_root ldconfig -p | grep -q 'libnccl-net-rivet\.so'; }

echo "== before install"
check absent_from_loader
in_root ldconfig
check absent_from_loader
echo "== dpkg -i"
in_root dpkg -i /tmp/rivet.deb
in_root dpkg -L rivet | sed 's/^/  /'
multiarch=$(in_root dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
installed=/usr/lib/$multiarch/libnccl-net-rivet.so
check test -f "$root$installed"
# No conffile: /etc/nccl.conf stays the administrator's (libnccl2 may ship one).
no_files_in_etc() { ! in_root dpkg -L rivet | grep -q '^/etc'; }
check no_files_in_etc
in_root /usr/bin/rivet version
in_root ldconfig -p | grep rivet || { echo "FAIL the loader cache lacks libnccl-net-rivet.so"; fail=1; }
echo "== transfer through the installed library"
# The test program comes from the build tree (copied into the root's /tmp); the library from
# the install.
check in_root env LD_DEBUG=libs LD_DEBUG_OUTPUT=/tmp/ld /tmp/transfer libnccl-net-rivet.so --version 12 --quick --small 500
loaded=$(cat "$root"/tmp/ld.* 2>/dev/null | sed -n 's/.*calling init: \(.*libnccl-net-rivet\.so\)$/\1/p' | sort -u)
echo "loaded: $loaded"
# /lib may be a link to /usr/lib (merged /usr): compare where the paths lead.
if [ -n "$loaded" ] && [ "$(in_root realpath "$loaded")" = "$(in_root realpath "$installed")" ]; then
  echo "PASS the transfer loaded the installed library"
else
  echo "FAIL the transfer did not load $installed"; fail=1
fi
files=$(in_root dpkg -L rivet)
echo "== dpkg --purge"
in_root dpkg --purge rivet
for f in $files; do
  [ -d "$root$f" ] && continue
  if [ -e "$root$f" ]; then echo "FAIL left behind: $f"; fail=1; fi
done
check absent_from_loader
# Whatever the install and removal wrote that is not dpkg's own record or the loader cache.
left=$(cd "$scratch/upper" && find . -mindepth 1 \( -type f -o -type l -o -type c \) \
  ! -path './var/lib/dpkg/*' ! -path './var/log/*' ! -path './var/cache/ldconfig/*' \
  ! -path './etc/ld.so.cache' ! -path './tmp/*' | sort)
if [ -n "$left" ]; then echo "FAIL left in the root after purge:"; echo "$left"; fail=1; else
  echo "PASS nothing left in the root but dpkg's records and the loader cache"; fi
exit "$fail"
