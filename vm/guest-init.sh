#!/bin/busybox sh
# vm/guest-init.sh: /init of the Soft-RoCE VM's initramfs (busybox ash, runs as PID 1 in the guest).
#
# Loads the modules, mounts the host's root over 9p at /mnt/host, gives it the guest's proc/sys/dev,
# brings up eth0 + rxe0, then runs the run directory's cmd.sh chrooted into the host root with
# stdout/stderr on the virtio serial ports "rivet.stdout"/"rivet.stderr". The exit status goes to
# <run dir>/rc on the shared root; then the guest powers off.
#
# Kernel command line parameters (see vm/run.sh):
#   rivet.run=DIR      host path of the run directory (holds cmd.sh; receives rc)
#   rivet.msize=BYTES  9p msize
#   rivet.cache=MODE   9p cache mode (none, loose, mmap, ...)
#   rivet.name=NAME    (vm/multi.sh) this VM's name in its set: hostname rivet-vm-NAME
#
# If the run directory holds a `links` file (vm/multi.sh writes it), each line `IFNAME MAC ADDR/LEN RXE`
# names a link NIC: the interface with that MAC must be IFNAME (QEMU's device order makes it so; checked),
# and gets MTU 9000, ADDR/LEN and an rxe device RXE on top.
#
# Messages from this script go to the serial console (<run dir>/console.log on the host). Any setup
# failure powers off without writing rc; run.sh then prints the console log.
# shellcheck shell=ash

/bin/busybox mkdir -p /bin /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin

log() { echo "rivet-vm-init: $*"; }
die() {
    log "FATAL: $*"
    poweroff -f
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

run=
name=
msize=512000
cache=loose
read -r cmdline </proc/cmdline
for arg in $cmdline; do
    case $arg in
    rivet.run=*) run=${arg#rivet.run=} ;;
    rivet.msize=*) msize=${arg#rivet.msize=} ;;
    rivet.cache=*) cache=${arg#rivet.cache=} ;;
    rivet.name=*) name=${arg#rivet.name=} ;;
    esac
done
[ -n "$run" ] || die "no rivet.run= on the kernel command line"

while read -r mod; do
    insmod "/lib/modules/$mod" || die "insmod $mod failed"
done </lib/modules/order

# The host root. cache=loose: reads of big binaries/libraries are cached (cargo starts ~2x faster than
# with cache=none); the price is that host-side changes made during the run may go unseen. The virtio
# transport caps msize at 512000 on this kernel.
R=/mnt/host
mount -t 9p -o trans=virtio,version=9p2000.L,msize="$msize",cache="$cache",access=any hostroot "$R" ||
    die "cannot mount the host root over 9p"

# The guest's own kernel interfaces over the host's (which 9p would otherwise show). /run and /dev/shm
# are guest-private tmpfs so nothing in the VM scribbles on the host's. /tmp stays the host's (the
# run directory lives there, and callers may work in /tmp); TMPDIR points into /run (see below).
mount -t proc proc "$R/proc"
mount -t sysfs sysfs "$R/sys"
mount -t devtmpfs devtmpfs "$R/dev"
mkdir -p "$R/dev/pts" "$R/dev/shm"
mount -t devpts devpts "$R/dev/pts"
mount -t tmpfs tmpfs "$R/dev/shm"
mount -t tmpfs tmpfs "$R/run"
# TMPDIR for the command: guest-local, because AF_UNIX sockets cannot be bound on 9p (ENXIO).
mkdir -m 1777 "$R/run/tmp"
[ -d "$R$run" ] || die "run directory $run not visible in the guest"

hostname "rivet-vm${name:+-$name}"
ip link set lo up
# MTU 9000 on eth0 gives rxe0 an active RoCE MTU of 4096.
ip link set eth0 mtu 9000 up || die "no eth0"
ip addr add 10.0.2.15/24 dev eth0
# `rdma` comes from the host's iproute2: busybox has none.
chroot "$R" rdma link add rxe0 type rxe netdev eth0 || die "rdma link add rxe0 failed"

rxes=rxe0
# Link NICs (multi-VM sets): point-to-point links to other VMs, one rxe device each.
if [ -f "$R$run/links" ]; then
    while read -r ifname mac cidr rxe; do
        [ "$(cat "/sys/class/net/$ifname/address" 2>/dev/null)" = "$mac" ] ||
            die "link NIC $ifname does not have MAC $mac"
        ip link set "$ifname" mtu 9000 up || die "cannot bring up $ifname"
        ip addr add "$cidr" dev "$ifname" || die "cannot give $ifname $cidr"
        chroot "$R" rdma link add "$rxe" type rxe netdev "$ifname" || die "rdma link add $rxe failed"
        rxes="$rxes $rxe"
    done <"$R$run/links"
fi

# A port turns ACTIVE once the netdev carrier is seen; give each up to 10 s.
for rxe in $rxes; do
    i=0
    until grep -q ACTIVE "/sys/class/infiniband/$rxe/ports/1/state" 2>/dev/null; do
        i=$((i + 1))
        [ $i -le 100 ] || die "$rxe port 1 never became ACTIVE"
        sleep 0.1
    done
done

# RDMA pins memory: never let RLIMIT_MEMLOCK get in the way.
ulimit -l unlimited

# The device of the virtio serial port named $1; ports are announced asynchronously, so wait up to 5 s.
port_dev() {
    n=0
    while [ $n -lt 50 ]; do
        for p in /sys/class/virtio-ports/*; do
            if [ "$(cat "$p/name" 2>/dev/null)" = "$1" ] && [ -c "/dev/${p##*/}" ]; then
                echo "/dev/${p##*/}"
                return 0
            fi
        done
        n=$((n + 1))
        sleep 0.1
    done
    return 1
}
out=$(port_dev rivet.stdout) || die "no virtio port rivet.stdout"
err=$(port_dev rivet.stderr) || die "no virtio port rivet.stderr"

log "command starts at uptime $(cut -d' ' -f1 /proc/uptime) s"
# env -i: cmd.sh sets exactly the environment run.sh chose.
chroot "$R" /usr/bin/env -i /bin/bash --noprofile --norc "$run/cmd.sh" </dev/null >"$out" 2>"$err"
rc=$?
log "command exited with $rc at uptime $(cut -d' ' -f1 /proc/uptime) s"
echo "$rc" >"$R$run/rc.tmp" && mv "$R$run/rc.tmp" "$R$run/rc"
sync
poweroff -f
