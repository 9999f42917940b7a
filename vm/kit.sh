#!/usr/bin/env bash
# vm/kit.sh: prepare everything the Soft-RoCE VM lane needs, idempotently.
#
#   1. host packages (QEMU, busybox, rdma-core userspace, perftest, ...), installed only if missing;
#      `apt-get update` runs only when an install or download fails or the package lists are empty;
#   2. a stock Debian kernel (linux-image-*-amd64-unsigned, newest apt offers on first run), unpacked
#      with `dpkg -x` into the kit (never installed on the host);
#   3. an initramfs: static busybox + the guest's modules (decompressed) + vm/guest-init.sh as /init.
#
# Everything lands in $RIVET_VM_KIT (default <repo>/.vm-kit). When everything is present a re-run takes
# well under a second and prints nothing. A stamp (hash of the init script, this file, busybox and the
# kernel version) rebuilds the initramfs when any of them changes.
#
# Environment:
#   RIVET_VM_KIT      kit directory (default <repo>/.vm-kit)
#   RIVET_VM_KERNEL   kernel package to use, e.g. linux-image-6.12.117+deb12-amd64-unsigned
#                     (default: the one already in the kit, else the newest apt offers)
#
# On success the last thing written is $RIVET_VM_KIT/kit.env (KIT_KERNEL, KIT_INITRD, KIT_KVER), which
# vm/run.sh sources.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
kit=${RIVET_VM_KIT:-$repo/.vm-kit}

say() { echo "vm-kit: $*" >&2; }
die() { say "error: $*"; exit 1; }

[[ $(id -u) == 0 ]] || die "must run as root (installs packages; the VM lane assumes root)"

# Host packages (checked with dpkg-query; installed only when missing).
packages=(
    qemu-system-x86   # qemu-system-x86_64 (TCG)
    busybox-static    # the initramfs userland
    cpio              # initramfs archive
    kmod              # depmod/modprobe --show-depends to resolve module order on the host
    xz-utils          # Debian ships modules as .ko.xz
    zstd              # ... or .ko.zst on newer kernels
    iproute2          # `rdma link add` (run from the host root inside the VM)
    rdma-core
    ibverbs-providers # librxe-rdmav*.so
    ibverbs-utils     # ibv_devinfo
    libibverbs-dev
    perftest          # ib_write_bw, ib_send_lat
)

apt_env=(env DEBIAN_FRONTEND=noninteractive)
# Wait for other apt users (a parallel kit.sh, a CI step) instead of failing on the lock.
apt_opts=(-o DPkg::Lock::Timeout=600 -o Acquire::Retries=3)

apt_update() {
    say "apt-get update"
    "${apt_env[@]}" apt-get "${apt_opts[@]}" -qq update >&2
}

# Stale package lists make `apt-get install`/`download` fail with 404s: update once and retry. The
# first try's errors are hidden; if the retry fails too, its errors show.
apt_retry() {
    if ! "$@" 2>/dev/null; then
        apt_update
        # A half-finished earlier install or upgrade (seen on these machine images) blocks every
        # later one until it is completed.
        "${apt_env[@]}" dpkg --configure -a >&2 || true
        "${apt_env[@]}" apt-get "${apt_opts[@]}" -qq -f install -y >&2 || true
        "$@"
    fi
}

ensure_packages() {
    local missing=() p
    for p in "${packages[@]}"; do
        if [[ $(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null) != installed ]]; then
            missing+=("$p")
        fi
    done
    ((${#missing[@]})) || return 0
    say "installing ${missing[*]}"
    # A fresh Debian image has empty lists; `apt-get install` would fail anyway.
    compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null || apt_update
    apt_retry "${apt_env[@]}" apt-get "${apt_opts[@]}" -qq install -y --no-install-recommends \
        "${missing[@]}" >&2
}

newest_kernel_pkg() {
    apt-cache search --names-only '^linux-image-[0-9].*-amd64-unsigned$' 2>/dev/null |
        awk '{print $1}' | grep -Ev -- '-(rt|cloud)-amd64-unsigned$' | sort -V | tail -n 1
}

# Picks the kernel package: explicit > already in the kit > newest apt offers.
choose_kernel_pkg() {
    if [[ -n ${RIVET_VM_KERNEL:-} ]]; then
        echo "$RIVET_VM_KERNEL"
    elif [[ -s $kit/kernel.pkg ]]; then
        cat "$kit/kernel.pkg"
    else
        local pkg
        pkg=$(newest_kernel_pkg)
        if [[ -z $pkg ]]; then
            apt_update
            pkg=$(newest_kernel_pkg)
        fi
        [[ -n $pkg ]] || die "apt offers no linux-image-*-amd64-unsigned package"
        echo "$pkg"
    fi
}

# Downloads and unpacks the kernel package into $kit/kernel/<pkg>/ (atomically: temp dir + rename).
ensure_kernel() {
    local pkg=$1 dest=$kit/kernel/$1
    [[ -f $dest/.done ]] && return 0
    say "fetching $pkg"
    local tmp
    tmp=$(mktemp -d "$kit/kernel/.tmp.XXXXXX")
    # apt's sandbox user cannot write into root-owned temp dirs; download as root without the warning.
    (cd "$tmp" && apt_retry apt-get "${apt_opts[@]}" -qq -o APT::Sandbox::User=root download "$pkg" >&2)
    dpkg -x "$tmp"/*.deb "$tmp/root"
    rm -f "$tmp"/*.deb
    local kver
    kver=$(basename "$(ls -d "$tmp"/root/lib/modules/*/)")
    [[ -f $tmp/root/boot/vmlinuz-$kver ]] || die "$pkg has no boot/vmlinuz-$kver"
    # The package has no modules.dep (postinst normally runs depmod): build it here.
    depmod -b "$tmp/root" "$kver"
    echo "$kver" >"$tmp/root/kver"
    touch "$tmp/root/.done"
    rm -rf "$dest"
    mv "$tmp/root" "$dest"
    rmdir "$tmp"
}

# Modules the guest loads, in addition to their dependencies (resolved with modprobe --show-depends).
# The chrooted host userspace cannot modprobe guest modules later, so everything is loaded up front.
# (virtio_pci and virtio_console are built in on 6.12, modules on 6.1.)
guest_modules=(virtio_pci virtio_console virtio_net 9pnet_virtio 9p ib_uverbs rdma_rxe rdma_ucm)
# Loaded when the kernel has them:
# crc32_generic: rdma_rxe up to at least 6.12 computes the ICRC through the crypto API ("crc32");
#   without it `rdma link add` fails with ENOENT. (Later kernels may use the crc32 library instead.)
# veth: for tests that want network namespaces.
optional_modules=(crc32_generic veth)

build_initramfs() {
    local kroot=$1 kver=$2 out=$3
    local stage
    stage=$(mktemp -d "$kit/.initramfs.XXXXXX")
    mkdir -p "$stage"/{bin,sbin,usr/bin,usr/sbin,dev,proc,sys,mnt/host,lib/modules}
    cp /bin/busybox "$stage/bin/busybox"
    cp "$here/guest-init.sh" "$stage/init"
    chmod 755 "$stage/init"

    # Module load order: each module's dependencies first, every module once. Busybox insmod may lack
    # xz/zstd support, so decompress here and store plain .ko files.
    local m deps line path name seen=" "
    for m in "${guest_modules[@]}" "${optional_modules[@]}"; do
        if ! deps=$(modprobe -d "$kroot" -S "$kver" --show-depends "$m" 2>/dev/null); then
            [[ " ${optional_modules[*]} " == *" $m "* ]] || die "module $m not found in $kver"
            say "note: $kver has no module $m; skipped"
            continue
        fi
        while read -r line; do
            case $line in
            insmod\ *)
                path=${line#insmod }
                path=${path%% *}
                name=$(basename "$path")
                name=${name%.xz}
                name=${name%.zst}
                name=${name%.gz}
                [[ $seen == *" $name "* ]] && continue
                seen+="$name "
                case $path in
                *.xz) xz -dc "$path" ;;
                *.zst) zstd -qdc "$path" ;;
                *.gz) gzip -dc "$path" ;;
                *) cat "$path" ;;
                esac >"$stage/lib/modules/$name"
                echo "$name" >>"$stage/lib/modules/order"
                ;;
            builtin\ *) ;;
            *) die "unexpected modprobe output for $m: $line" ;;
            esac
        done <<<"$deps"
    done

    # Uncompressed cpio: decompressing in TCG costs more boot time than reading a few MiB.
    (cd "$stage" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet) >"$out.tmp"
    mv "$out.tmp" "$out"
    rm -rf "$stage"
}

main() {
    mkdir -p "$kit/kernel"
    # One kit.sh at a time per kit directory (parallel run.sh calls on a fresh machine).
    exec 9>"$kit/.lock"
    flock 9

    ensure_packages
    local pkg kroot kver
    pkg=$(choose_kernel_pkg)
    ensure_kernel "$pkg"
    echo "$pkg" >"$kit/kernel.pkg.tmp" && mv "$kit/kernel.pkg.tmp" "$kit/kernel.pkg"
    kroot=$kit/kernel/$pkg
    kver=$(cat "$kroot/kver")

    local initrd=$kit/initramfs.cpio stamp
    stamp=$( (
        echo "$kver"
        sha256sum "$here/guest-init.sh" "$here/kit.sh" /bin/busybox | awk '{print $1}'
    ) | sha256sum | awk '{print $1}')
    if [[ ! -f $initrd || $(cat "$kit/initramfs.stamp" 2>/dev/null) != "$stamp" ]]; then
        say "building initramfs for $kver"
        build_initramfs "$kroot" "$kver" "$initrd"
        echo "$stamp" >"$kit/initramfs.stamp"
    fi

    cat >"$kit/kit.env.tmp" <<EOF
KIT_KVER=$kver
KIT_KERNEL=$kroot/boot/vmlinuz-$kver
KIT_INITRD=$initrd
EOF
    mv "$kit/kit.env.tmp" "$kit/kit.env"
}

main "$@"
