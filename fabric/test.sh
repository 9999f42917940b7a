#!/usr/bin/env bash
# Builds the verbs fabric and runs its tests: the two-process conformance suite,
# the loader check, ibv_devinfo, and perftest between two processes over it.
# Exits non-zero on any failure. Needs cc, libibverbs-dev (headers), ibverbs-utils
# and perftest. Times are printed; nothing here is a timed assertion except the
# peer-death bounds the conformance suite states.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
out="${FABRIC_OUT:-$root/target/fabric}"
start=$(date +%s.%N)
FABRIC_OUT="$out" "$here/build.sh" --tests >/dev/null
export RIVET_FABRIC_DIR="${RIVET_FABRIC_DIR:-$(mktemp -d /tmp/rivet-fabric-test.XXXXXX)}"
fail=0
step() { printf '\n== %s\n' "$*"; }
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f s", b - a }'; }

step "loader: LD_LIBRARY_PATH=$out picks the fabric"
if LD_LIBRARY_PATH="$out" "$out/tests/loadcheck" "$out"; then :; else echo "FAIL loadcheck"; fail=1; fi
deps=$(LD_LIBRARY_PATH="$out" ldd /usr/bin/ib_write_bw)  # not piped into grep -q: SIGPIPE + pipefail
if grep -q "libibverbs.so.1 => $out/" <<<"$deps"; then
	echo "  ldd ib_write_bw: libibverbs.so.1 => $out/libibverbs.so.1"
else
	echo "FAIL ldd does not resolve libibverbs.so.1 to the fabric"; fail=1
fi

step "conformance (two processes per case)"
t=$(date +%s.%N)
if LD_LIBRARY_PATH="$out" timeout 300 "$out/tests/fabtest"; then :; else echo "FAIL fabtest"; fail=1; fi
echo "  conformance: $(elapsed "$t")"
step "conformance again, progress only on the progress thread (RIVET_FABRIC_POLL_PROGRESS=0)"
t=$(date +%s.%N)
cases=$("$out/tests/fabtest" --list | grep -v pingpong)  # ping-pong measures the default mode
# shellcheck disable=SC2086
if RIVET_FABRIC_POLL_PROGRESS=0 LD_LIBRARY_PATH="$out" timeout 300 "$out/tests/fabtest" $cases >/dev/null; then
	echo "  ok"
else
	echo "FAIL fabtest with RIVET_FABRIC_POLL_PROGRESS=0"; fail=1
fi
echo "  conformance: $(elapsed "$t")"

step "ibv_devinfo"
info=$(LD_LIBRARY_PATH="$out" ibv_devinfo)
echo "$info" | grep -E 'hca_id|state|port_lid|link_layer|active_mtu'
for want in 'hca_id:	rfab0' 'PORT_ACTIVE' 'link_layer:		InfiniBand' 'port_lid:		1'; do
	grep -qF "$want" <<<"$info" || { echo "FAIL ibv_devinfo lacks '$want'"; fail=1; }
done
multi=$(RIVET_FABRIC_DEVICES=2 RIVET_FABRIC_PORTS=2 LD_LIBRARY_PATH="$out" ibv_devinfo -l)
echo "$multi" | tr '\n' ' '; echo
grep -q rfab1 <<<"$multi" || { echo "FAIL RIVET_FABRIC_DEVICES=2 shows no rfab1"; fail=1; }
ports=$(RIVET_FABRIC_DEVICES=2 RIVET_FABRIC_PORTS=2 LD_LIBRARY_PATH="$out" ibv_devinfo -d rfab1 | grep -cE '^\s+port:')
[ "$ports" = 2 ] || { echo "FAIL RIVET_FABRIC_PORTS=2 shows $ports ports"; fail=1; }

# perftest's client tries to connect once: wait until the server listens (a loaded host can take
# well over the usual fraction of a second to start it)
wait_listen() {
	local hex i
	hex=$(printf ':%04X ' "$1")
	for ((i = 0; i < 200; i++)); do
		if cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk '$4 == "0A"' | grep -q "$hex"; then
			return 0
		fi
		sleep 0.05
	done
}

# perftest: server and client as two processes on loopback, default device
perf() {
	local name="$1"; shift
	local port=$((20000 + RANDOM % 20000))
	local log; log=$(mktemp)
	LD_LIBRARY_PATH="$out" timeout 120 "$name" -p "$port" "$@" >"$log.srv" 2>&1 &
	local spid=$!
	wait_listen "$port"
	local t; t=$(date +%s.%N)
	if LD_LIBRARY_PATH="$out" timeout 120 "$name" -p "$port" "$@" localhost >"$log" 2>&1 && wait "$spid"; then
		grep -A1 '#bytes' "$log" | grep -v '^--'
		awk '/^ *[0-9]+ +[0-9]+ /' "$log" | tail -n +2
		echo "  $name $*: $(elapsed "$t")"
	else
		wait "$spid" || true
		echo "FAIL $name $*"; tail -5 "$log" "$log.srv"; fail=1
	fi
	rm -f "$log" "$log.srv"
}
step "perftest over the fabric"
perf ib_write_bw -s 65536 -n 5000
perf ib_write_bw -s 1048576 -n 1000
perf ib_read_bw -s 65536 -n 2000
perf ib_send_bw -s 65536 -n 2000
perf ib_send_lat -s 2 -n 2000
perf ib_write_lat -s 2 -n 2000
perf ib_atomic_bw -n 2000

rm -rf "$RIVET_FABRIC_DIR"
printf '\nfabric tests: %s in %s\n' "$([ $fail = 0 ] && echo PASS || echo FAIL)" "$(elapsed "$start")"
exit $fail
