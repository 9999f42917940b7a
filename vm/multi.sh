#!/usr/bin/env bash
# vm/multi.sh: boot a set of Soft-RoCE VMs wired point to point, run one command in each.
#
# usage: vm/multi.sh --topology NAME|FILE [--timeout SEC] [--mem MiB] [--smp N] [-e NAME[=VALUE]]...
#                    [--kill-on VM=FILE]... [--reboot-on VM=FILE]... -- COMMAND [ARGS...]
#
# A topology is a list of links, one per line: `X-Y SUBNET` (VMs are named A, B, C; SUBNET is the
# first three octets of a /24). VM number i (A = 0) has address SUBNET.(i+1) on each of its links.
# Presets:
#   pair      A-B 192.168.101                                 (one rxe each)
#   pair2     A-B 192.168.101, A-B 192.168.102                (two links, two subnets: dual-rail)
#   triangle  A-B 192.168.101, A-C 192.168.100, B-C 192.168.102   (a link per pair, two rxe per VM)
# Each VM is booted as vm/run.sh boots one (shared code: vm/lib.sh), with eth0 + rxe0 on its private
# user network as there, plus one virtio NIC per link, numbered eth1, eth2, … in the order its links
# are listed, each with an rxe device of the same number (eth1 -> rxe1). A link is a QEMU `socket`
# netdev pair over TCP on 127.0.0.1 (the first VM of the link line listens, the other connects, so VMs
# boot in name order, each once its listeners are up): traffic never leaves loopback and is never
# dropped on the way. A VM that dies leaves its peers' link NICs up but silent, as a dead host does; a
# VM booted again by --reboot-on reconnects to the listeners of its links (so reboot only a VM whose
# links all connect, i.e. one named last in each of its link lines, such as B in pair/pair2).
#
# Every VM runs COMMAND (chrooted into the host root, as run.sh does) with, in its environment:
#   RIVET_VM_NAME (A, B, C), RIVET_VM_INDEX (0, 1, 2), RIVET_VM_COUNT, RIVET_VM_TOPOLOGY,
#   RIVET_VM_BOOT (1, or 2 after a --reboot-on), RIVET_VM_SET (a host directory, shared, for markers),
#   and per link, as space-separated lists in link order: RIVET_VM_NETDEVS (eth1 …), RIVET_VM_RXES
#   (rxe1 …), RIVET_VM_ADDRS (own address), RIVET_VM_PEER_ADDRS (the other end's), RIVET_VM_PEERS
#   (the other end's name).
# Output: each VM's stdout/stderr lines on this script's stdout/stderr, prefixed `[A] `. Then one line
# per VM on stderr: `rivet-vm: A exit N` (or `killed`, `timeout`, `died`). The exit status is 124 if any
# VM ran past --timeout (all are then killed), else 125 if a VM died on its own, else the first non-zero
# command status in VM order, else 0. A VM killed by --kill-on does not count.
#
# Faults: `--kill-on VM=FILE` SIGKILLs VM's QEMU as soon as FILE exists (a guest creates it, e.g. under
# $RIVET_VM_SET, when it is mid-stream; a relative FILE is taken inside $RIVET_VM_SET): the host dies with no FIN, no RDMA close. `--reboot-on VM=FILE`
# does the same and then boots VM again (RIVET_VM_BOOT=2, same addresses); the second boot's status
# is the one reported. No QEMU outlives this script.
#
# Knobs: RIVET_VM_MEM (default 1536 per VM), RIVET_VM_SMP (default 1: TCG on a 2-core host), plus
# everything run.sh reads (RIVET_VM_KIT, RIVET_VM_KEEP, RIVET_VM_VERBOSE, RIVET_VM_APPEND, ...).
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
    sed -n 's/^# \{0,1\}//; 4,5p' "${BASH_SOURCE[0]}" >&2
    exit 2
}

topology_links() {
    case $1 in
    pair) echo "A-B 192.168.101" ;;
    pair2) printf '%s\n' "A-B 192.168.101" "A-B 192.168.102" ;;
    triangle) printf '%s\n' "A-B 192.168.101" "A-C 192.168.100" "B-C 192.168.102" ;;
    *)
        [[ -f $1 ]] || { say "no topology $1 (pair, pair2, triangle or a file)"; exit 2; }
        grep -v '^[[:space:]]*\(#\|$\)' "$1"
        ;;
    esac
}

mem=${RIVET_VM_MEM:-1536}
smp=${RIVET_VM_SMP:-1}
timeout_s=${RIVET_VM_TIMEOUT:-900}
topology=''
extra_env=()
declare -A kill_on=() reboot_on=()
while (($#)); do
    case $1 in
    --topology) topology=${2:?}; shift 2 ;;
    --mem) mem=${2:?}; shift 2 ;;
    --smp) smp=${2:?}; shift 2 ;;
    --timeout) timeout_s=${2:?}; shift 2 ;;
    -e | --env) extra_env+=("${2:?}"); shift 2 ;;
    --kill-on) kill_on[${2%%=*}]=${2#*=}; shift 2 ;;
    --reboot-on) reboot_on[${2%%=*}]=${2#*=}; shift 2 ;;
    --) shift; break ;;
    -h | --help) usage ;;
    *) say "unknown option $1"; usage ;;
    esac
done
(($#)) && [[ -n $topology ]] || usage
[[ $mem =~ ^[0-9]+$ && $smp =~ ^[0-9]+$ && $timeout_s =~ ^[0-9]+$ ]] ||
    { say "--mem, --smp and --timeout take whole numbers"; exit 2; }

# The links, and from them each VM's NICs.
names=(A B C D)
declare -A netdevs=() rxes=() addrs=() peer_addrs=() peers=() nics=() links_file=() vm_used=() connects=() listens=()
nvm=0 nlink=0
# Link ports: TCP on loopback, a free-looking block of one per link.
port_base=$((20000 + (RANDOM % 2000) * 16))
while read -r ends subnet; do
    x=${ends%-*} y=${ends#*-}
    [[ $ends == ?-? && $subnet =~ ^[0-9]+\.[0-9]+\.[0-9]+$ && $x != "$y" ]] ||
        { say "bad link line: $ends $subnet"; exit 2; }
    for v in "$x" "$y"; do
        idx=-1
        for i in "${!names[@]}"; do [[ ${names[$i]} == "$v" ]] && idx=$i; done
        ((idx >= 0)) || { say "VM names are A, B, C, D (got $v)"; exit 2; }
        ((idx + 1 > nvm)) && nvm=$((idx + 1))
        vm_used[$v]=1
    done
    nlink=$((nlink + 1))
    port=$((port_base + nlink))
    for side in x y; do
        if [[ $side == x ]]; then me=$x other=$y; else me=$y other=$x; fi
        mi=0 oi=0
        for i in "${!names[@]}"; do
            [[ ${names[$i]} == "$me" ]] && mi=$i
            [[ ${names[$i]} == "$other" ]] && oi=$i
        done
        n=$(($(wc -w <<<"${netdevs[$me]:-}") + 1))
        mac=$(printf '52:54:00:%02x:%02x:%02x' $((mi + 1)) "$nlink" "$n")
        netdevs[$me]+="${netdevs[$me]:+ }eth$n"
        rxes[$me]+="${rxes[$me]:+ }rxe$n"
        addrs[$me]+="${addrs[$me]:+ }$subnet.$((mi + 1))"
        peer_addrs[$me]+="${peer_addrs[$me]:+ }$subnet.$((oi + 1))"
        peers[$me]+="${peers[$me]:+ }$other"
        links_file[$me]+="eth$n $mac $subnet.$((mi + 1))/24 rxe$n"$'\n'
        # The VM named first in the link line listens, the other connects (and so must boot later).
        if ((mi < oi)); then
            nics[$me]+="-netdev socket,id=l$n,listen=127.0.0.1:$port"
            listens[$me]=1
        else
            nics[$me]+="-netdev socket,id=l$n,connect=127.0.0.1:$port"
            connects[$me]+="${connects[$me]:+ }$port"
        fi
        nics[$me]+=" -device virtio-net-pci,netdev=l$n,mac=$mac,host_mtu=9000 "
    done
done < <(topology_links "$topology")
((nlink > 0)) || { say "topology $topology has no links"; exit 2; }
for ((i = 0; i < nvm; i++)); do
    [[ -n ${vm_used[${names[$i]}]:-} ]] || { say "VM ${names[$i]} has no link"; exit 2; }
done
vms=("${names[@]:0:nvm}")
for v in "${!kill_on[@]}" "${!reboot_on[@]}"; do
    [[ -n ${vm_used[$v]:-} ]] || { say "no VM $v in $topology"; exit 2; }
done
for v in "${!reboot_on[@]}"; do
    [[ -z ${listens[$v]:-} ]] || { say "--reboot-on $v: $v listens on a link, so its peer would not reconnect"; exit 2; }
done

# Already inside a VM: nothing to boot there.
[[ ${RIVET_IN_VM:-0} != 1 ]] || { say "vm/multi.sh runs on the host only"; exit 2; }

bash "$here/kit.sh"
# shellcheck source=/dev/null
source "$kit/kit.env"

setdir=$(mktemp -d /tmp/rivet-vmset.XXXXXX)
declare -A qemu_pid=() watch_pid=() result=()
relay_pids=()
# shellcheck disable=SC2317 # invoked by the EXIT trap
cleanup() {
    local v pid
    for v in "${!watch_pid[@]}"; do kill "${watch_pid[$v]}" 2>/dev/null || true; done
    # Killing `timeout` makes it kill its QEMU; the pid file covers a QEMU whose `timeout` is gone.
    for v in "${!qemu_pid[@]}"; do kill "${qemu_pid[$v]}" 2>/dev/null || true; done
    for v in "${vms[@]}"; do
        pid=$(cat "$setdir/$v/qemu.pid" 2>/dev/null) || continue
        [[ $(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") == *"rivet.run=$setdir/$v "* ]] &&
            kill -KILL "$pid" 2>/dev/null
    done
    for pid in "${relay_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    if [[ ${RIVET_VM_KEEP:-0} == 1 ]]; then
        say "set directory kept: $setdir"
    else
        rm -rf "$setdir"
    fi
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT
trap 'say "terminated"; exit 143' TERM

# boot VM BOOT: a fresh run directory $setdir/VM, cmd.sh, links, relays, QEMU under `timeout`.
boot() {
    local v=$1 bootno=$2 idx rundir=$setdir/$1
    for i in "${!vms[@]}"; do [[ ${vms[$i]} == "$v" ]] && idx=$i; done
    rm -rf "$rundir"
    mkdir -p "$rundir"
    vm_env=("${extra_env[@]}"
        "RIVET_VM_NAME=$v" "RIVET_VM_INDEX=$idx" "RIVET_VM_COUNT=$nvm" "RIVET_VM_TOPOLOGY=$topology"
        "RIVET_VM_BOOT=$bootno" "RIVET_VM_SET=$setdir"
        "RIVET_VM_NETDEVS=${netdevs[$v]}" "RIVET_VM_RXES=${rxes[$v]}" "RIVET_VM_ADDRS=${addrs[$v]}"
        "RIVET_VM_PEER_ADDRS=${peer_addrs[$v]}" "RIVET_VM_PEERS=${peers[$v]}")
    vm_write_cmd "$rundir/cmd.sh" -- "${cmd[@]}" || exit 2
    printf '%s' "${links_file[$v]}" >"$rundir/links"
    vm_fifos "$rundir"
    sed -u "s/^/[$v] /" "$rundir/stdout.out" &
    relay_pids+=($!)
    sed -u "s/^/[$v] /" "$rundir/stderr.out" >&2 &
    relay_pids+=($!)
    # A link's connecting end needs its listener up: QEMU gives up at once on a refused connect.
    local p tries
    for p in ${connects[$v]:-}; do
        tries=0
        until ss -Hltn "sport = :$p" | grep -q .; do
            ((++tries <= 300)) || { say "no QEMU listening on 127.0.0.1:$p for $v's link"; exit 125; }
            sleep 0.1
        done
    done
    vm_qemu_argv "$rundir" "$smp" "$mem" "$v"
    # shellcheck disable=SC2206 # the NIC options are plain words
    vm_qemu+=(${nics[$v]})
    timeout --kill-after=10 "$deadline_left" "${vm_qemu[@]}" </dev/null >"$rundir/qemu.log" 2>&1 &
    qemu_pid[$v]=$!
}

# watch VM FILE MODE: in the background, SIGKILL VM's QEMU once FILE exists; note it in $setdir.
watch() {
    local v=$1 file=$2 pid
    [[ $file == /* ]] || file=$setdir/$file
    (
        while [[ ! -e $file ]]; do sleep 0.05; done
        pid=$(cat "$setdir/$v/qemu.pid")
        kill -KILL "$pid"
        date +%s.%N >"$setdir/$v.killed"
        echo "rivet-vm: killed $v (QEMU pid $pid): $file appeared" >&2
    ) &
    watch_pid[$v]=$!
}

cmd=("$@")
t_start=$(date +%s)
deadline_left=$timeout_s
for v in "${vms[@]}"; do
    boot "$v" 1
    [[ -n ${kill_on[$v]:-} ]] && watch "$v" "${kill_on[$v]}"
    [[ -n ${reboot_on[$v]:-} ]] && watch "$v" "${reboot_on[$v]}"
done

# Wait for every QEMU; a VM killed for --reboot-on boots again, with what is left of the timeout.
declare -A waiting=()
for v in "${vms[@]}"; do waiting[${qemu_pid[$v]}]=$v; done
timed_out=0 panicked=0
while ((${#waiting[@]})); do
    finished='' status=0
    wait -n -p finished "${!waiting[@]}" || status=$?
    [[ -n $finished ]] || continue
    v=${waiting[$finished]}
    unset "waiting[$finished]"
    unset "qemu_pid[$v]"
    if [[ -f $setdir/$v.killed ]]; then
        rm -f "$setdir/$v.killed"
        unset "watch_pid[$v]"
        if [[ -n ${reboot_on[$v]:-} ]]; then
            unset "reboot_on[$v]"
            deadline_left=$((timeout_s - ($(date +%s) - t_start)))
            ((deadline_left > 0)) || deadline_left=1
            say "booting $v again"
            boot "$v" 2
            waiting[${qemu_pid[$v]}]=$v
            continue
        fi
        result[$v]=killed
    elif ((status == 124 || status == 137)); then
        result[$v]=timeout
        if ((!timed_out)); then
            timed_out=1
            say "TIMEOUT: $v ran past ${timeout_s} s; stopping the set"
            for p in "${!waiting[@]}"; do kill "$p" 2>/dev/null || true; done
        fi
    elif [[ -f $setdir/$v/rc ]]; then
        result[$v]=$(cat "$setdir/$v/rc")
    else
        result[$v]=died
        say "$v stopped before its command finished (qemu exit status $status)"
        vm_show_console "$setdir/$v" "$v"
        # A guest kernel panic is the kernel's bug, not the command's failure, and the other VMs'
        # commands would only wait for a peer that is gone (until --timeout): stop them now.
        if grep -q 'Kernel panic' "$setdir/$v/console.log" 2>/dev/null && ((!panicked)); then
            panicked=1
            say "GUEST KERNEL PANIC in $v: stopping the set (scripts/vm-rig.sh reruns a set once for this)"
            for p in "${!waiting[@]}"; do kill "$p" 2>/dev/null || true; done
        fi
    fi
done

# The relays see EOF once QEMU is gone; give them a moment to flush.
for pid in "${relay_pids[@]}"; do
    for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
done
if [[ ${RIVET_VM_VERBOSE:-0} == 1 ]]; then
    for v in "${vms[@]}"; do vm_show_console "$setdir/$v" "$v"; done
fi

rc=0
for v in "${vms[@]}"; do
    case ${result[$v]} in [0-9]*) say "$v exit ${result[$v]}" ;; *) say "$v ${result[$v]}" ;; esac
    case ${result[$v]} in
    killed) ;;
    timeout) rc=124 ;;
    died) ((rc == 124)) || rc=125 ;;
    *) ((rc != 0)) || rc=${result[$v]} ;;
    esac
done
say "set of $nvm VMs ($topology) done in $(($(date +%s) - t_start)) s"
exit "$rc"
