#!/usr/bin/env bash
# vm/run.sh: run one command inside the Soft-RoCE QEMU VM, with the host's root filesystem as its root.
#
# usage: vm/run.sh [--mem MiB] [--smp N] [--timeout SEC] [-e NAME[=VALUE]]... -- COMMAND [ARGS...]
#
# Boots Debian's stock kernel under QEMU TCG (vm/kit.sh prepares it), brings up eth0 (10.0.2.15/24,
# MTU 9000, on a QEMU user network that reaches nothing outside the VM) and rxe0 on top of it, then runs
# COMMAND chrooted into the host's root (shared over 9p), in the caller's working directory. Host paths
# are identical inside, so binaries under target/ run as they are.
#
# COMMAND's stdout and stderr come out on this script's stdout and stderr (virtio serial ports; kernel
# messages go to a console log, shown only if the VM fails), stdin is /dev/null, and this script exits
# with COMMAND's exit status. A VM that runs past --timeout is killed: exit 124 with a message. If the VM
# dies before COMMAND finishes (boot failure, kernel panic), exit 125 and the console log is printed.
#
# Inside: / is the host's root over 9p (read-write; /tmp included), /proc, /sys, /dev are the guest's,
# /run and /dev/shm are guest-private tmpfs, TMPDIR=/run/tmp (AF_UNIX sockets cannot be bound on 9p).
#
# Environment passed through: PATH, HOME, TERM, LANG, LC_*, and every RIVET_*, NCCL_*, RUST*, CARGO_*
# variable (RUST* covers RUSTFLAGS, RUSTUP_*, RUST_LOG, RUST_BACKTRACE; CARGO_* covers CARGO_TARGET_DIR
# and what cargo sets for tests), plus each -e NAME (the caller's value) or -e NAME=VALUE. Inside,
# RIVET_IN_VM=1 is always set.
#
# Knobs: RIVET_VM_MEM (MiB, default 2048), RIVET_VM_SMP (default 2), RIVET_VM_TIMEOUT (s, default 900),
# RIVET_VM_KEEP=1 keeps the run directory (console log, cmd.sh), RIVET_VM_VERBOSE=1 reports timings and
# the console log on stderr, RIVET_VM_9P_CACHE (9p cache mode, default loose), RIVET_VM_MSIZE (9p msize,
# default 512000, the kernel's cap), RIVET_VM_APPEND (extra kernel parameters; `loglevel=7` puts the
# kernel log in the console log). See vm/kit.sh for RIVET_VM_KIT and RIVET_VM_KERNEL.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
kit=$(realpath -m "${RIVET_VM_KIT:-$repo/.vm-kit}")
# Exported so that it reaches the guest (every RIVET_* does): scripts there find the guest
# kernel's modules in the kit (scripts/vm-package.sh loads overlayfs from it).
export RIVET_VM_KIT=$kit
# shellcheck source=vm/lib.sh
source "$here/lib.sh"

say() { echo "rivet-vm: $*" >&2; }
usage() {
    sed -n 's/^# \{0,1\}//; 4p' "${BASH_SOURCE[0]}" >&2
    exit 2
}

mem=${RIVET_VM_MEM:-2048}
smp=${RIVET_VM_SMP:-2}
timeout_s=${RIVET_VM_TIMEOUT:-900}
extra_env=()
while (($#)); do
    case $1 in
    --mem) mem=${2:?}; shift 2 ;;
    --smp) smp=${2:?}; shift 2 ;;
    --timeout) timeout_s=${2:?}; shift 2 ;;
    -e | --env) extra_env+=("${2:?}"); shift 2 ;;
    --) shift; break ;;
    -h | --help) usage ;;
    *) say "unknown option $1"; usage ;;
    esac
done
(($#)) || usage
[[ $mem =~ ^[0-9]+$ && $smp =~ ^[0-9]+$ && $timeout_s =~ ^[0-9]+$ ]] ||
    { say "--mem, --smp and --timeout take whole numbers"; exit 2; }

# Already inside the VM (a test that calls run.sh from within): just run the command.
if [[ ${RIVET_IN_VM:-0} == 1 ]]; then
    exec "$@"
fi

t_start=$(date +%s.%N)
bash "$here/kit.sh"
# shellcheck source=/dev/null
source "$kit/kit.env"

# Per-run directory on the shared root: its own FIFOs, console log and rc, so parallel runs never meet.
rundir=$(mktemp -d /tmp/rivet-vm.XXXXXX)
qemu_pid='' out_pid='' err_pid=''
# shellcheck disable=SC2317 # invoked by the EXIT trap
cleanup() {
    # The VM must never outlive this script (killing `timeout` makes it kill QEMU).
    local pid
    for pid in $qemu_pid $out_pid $err_pid; do
        kill "$pid" 2>/dev/null || true
    done
    if [[ ${RIVET_VM_KEEP:-0} == 1 ]]; then
        say "run directory kept: $rundir"
    else
        rm -rf "$rundir"
    fi
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT
trap 'say "terminated"; exit 143' TERM

# cmd.sh: what the guest runs inside the chroot (under `env -i`).
vm_env=("${extra_env[@]}")
vm_write_cmd "$rundir/cmd.sh" -- "$@" || exit 2

# QEMU "pipe" chardevs write to <path>.out and read <path>.in; a cat on each .out relays to our
# stdout/stderr as the guest writes.
vm_fifos "$rundir"
cat "$rundir/stdout.out" &
out_pid=$!
cat "$rundir/stderr.out" >&2 &
err_pid=$!

vm_qemu_argv "$rundir" "$smp" "$mem"
t_boot=$(date +%s.%N)
# QEMU gets its own stdin (none) and keeps its own stderr for its own diagnostics.
timeout --kill-after=10 "$timeout_s" "${vm_qemu[@]}" </dev/null >"$rundir/qemu.log" 2>&1 &
qemu_pid=$!

# Wait for QEMU. A relay that ends first has lost its reader (e.g. `vm/run.sh -- cmd | head -1`):
# stop the VM and exit 141 as SIGPIPE would end a native command, rather than leave the guest blocked
# on a full port until the timeout.
declare -A waiting=(["$qemu_pid"]=qemu ["$out_pid"]=relay ["$err_pid"]=relay)
qemu_rc=''
while [[ -z $qemu_rc ]]; do
    finished='' status=0
    wait -n -p finished "${!waiting[@]}" || status=$?
    [[ -n $finished ]] || continue
    if [[ ${waiting[$finished]} == qemu ]]; then
        qemu_rc=$status
        qemu_pid=''
    elif ((status != 0)); then
        say "output closed; stopping the VM"
        exit 141
    fi
    unset "waiting[$finished]"
done
t_end=$(date +%s.%N)

# QEMU has closed the FIFOs, so the relays see EOF at once; if QEMU died before opening them they
# would wait forever, hence the grace period and then kill.
for _ in $(seq 50); do
    kill -0 "$out_pid" 2>/dev/null || kill -0 "$err_pid" 2>/dev/null || break
    sleep 0.1
done

show_console() { vm_show_console "$rundir"; }

if [[ ${RIVET_VM_VERBOSE:-0} == 1 ]]; then
    cmd_at=$(sed -n 's/.*command starts at uptime \([0-9.]*\) s.*/\1/p' "$rundir/console.log")
    say "$(awk -v a="$t_start" -v b="$t_boot" -v c="$t_end" -v u="${cmd_at:-nan}" 'BEGIN {
        printf "kit %.2f s, qemu %.2f s (guest uptime at command start %s s), total %.2f s", b-a, c-b, u, c-a }')"
    show_console
fi

if ((qemu_rc == 124 || qemu_rc == 137)); then
    say "TIMEOUT: the VM ran past ${timeout_s} s and was killed"
    show_console
    exit 124
fi
if [[ ! -f $rundir/rc ]]; then
    say "the VM stopped before the command finished (qemu exit status $qemu_rc)"
    show_console
    exit 125
fi
exit "$(cat "$rundir/rc")"
