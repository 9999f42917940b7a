#!/usr/bin/env bash
# vm/smoke.sh: smoke test of the Soft-RoCE VM lane.
#
# On the host it boots the VM through vm/run.sh and runs itself inside. Inside the VM it checks rxe0
# (ibv_devinfo, rdma link), finds the RoCE v2 GID of eth0's IPv4 address, and runs perftest pairs
# (server and client both in the VM, talking to eth0's own address over rxe0):
#   ib_write_bw -t 8 at 64 KiB and 1 MiB, ib_send_lat at 8 B.
# Exits non-zero if rxe0 is missing or any transfer fails or reports no result.
#
# usage: vm/smoke.sh        (from the host; RIVET_SMOKE_TIMEOUT bounds the VM, default 600 s)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

if [[ ${RIVET_IN_VM:-0} != 1 ]]; then
    exec bash "$here/run.sh" --timeout "${RIVET_SMOKE_TIMEOUT:-600}" -- bash "$here/smoke.sh" "$@"
fi

dev=rxe0
say() { echo "smoke: $*"; }
fail() {
    echo "smoke: FAIL: $*" >&2
    exit 1
}

say "ibv_devinfo -d $dev"
ibv_devinfo -d "$dev" || fail "$dev missing"
say "rdma link"
rdma link
rdma link show "$dev/1" | grep -q 'state ACTIVE' || fail "$dev/1 is not ACTIVE"

ip4=$(ip -4 -o addr show dev eth0 | awk '{ split($4, a, "/"); print a[1]; exit }')
[[ -n $ip4 ]] || fail "eth0 has no IPv4 address"

# The RoCE v2 GID of an IPv4 address is the IPv4-mapped IPv6 address ::ffff:a.b.c.d.
IFS=. read -r a b c d <<<"$ip4"
want=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$a" "$b" "$c" "$d")
gid_index=
ports=/sys/class/infiniband/$dev/ports/1
for g in "$ports"/gids/*; do
    i=${g##*/}
    if [[ $(cat "$g") == "$want" && $(cat "$ports/gid_attrs/types/$i" 2>/dev/null) == "RoCE v2" ]]; then
        gid_index=$i
        break
    fi
done
[[ -n $gid_index ]] || fail "no RoCE v2 GID for $ip4 on $dev"
say "eth0 $ip4, RoCE v2 IPv4 GID index $gid_index ($want)"

work=$(mktemp -d "${TMPDIR:-/tmp}/rivet-smoke.XXXXXX")
trap 'rm -rf "$work"' EXIT

# run_pair TOOL PORT ARGS...: TOOL as server and client on the same device and address; prints the
# result table; fails if either side fails or no result line appears.
run_pair() {
    local tool=$1 port=$2
    shift 2
    local args=(-d "$dev" -x "$gid_index" -F -p "$port" "$@")
    say "$tool ${args[*]}"
    timeout 180 "$tool" "${args[@]}" >"$work/server" 2>&1 &
    local server=$!
    # The client does not retry: wait until the server listens on its TCP exchange port.
    local n=0
    until ss -Hltn "sport = :$port" | grep -q .; do
        ((++n <= 200)) || { cat "$work/server" >&2; fail "$tool server never listened"; }
        kill -0 "$server" 2>/dev/null || { cat "$work/server" >&2; fail "$tool server died"; }
        sleep 0.05
    done
    local client_rc=0 server_rc=0
    timeout 180 "$tool" "${args[@]}" "$ip4" >"$work/client" 2>&1 || client_rc=$?
    wait "$server" || server_rc=$?
    if ((client_rc || server_rc)); then
        echo "--- client (exit $client_rc)" >&2
        cat "$work/client" >&2
        echo "--- server (exit $server_rc)" >&2
        cat "$work/server" >&2
        fail "$tool $*"
    fi
    # The table: header line starting with "#bytes" and the numeric line(s) below it.
    awk '/^ *#bytes/ { print; on = 1; next } on && /^ *[0-9]/ { print; found = 1 }
         END { exit !found }' "$work/client" || {
        cat "$work/client" >&2
        fail "$tool printed no result"
    }
}

# perftest's default TX depth (128) collapses under TCG; 8 keeps the pipe full without stalling.
run_pair ib_write_bw 18515 -t 8 -s 65536 -n 5000
run_pair ib_write_bw 18516 -t 8 -s 1048576 -n 500
run_pair ib_send_lat 18517 -s 8 -n 1000
say "OK"
