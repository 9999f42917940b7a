#!/usr/bin/env bash
# Builds the user-space verbs fabric: a stand-in libibverbs.so.1 (a test instrument,
# never shipped, never installed) into target/fabric/ (override: FABRIC_OUT).
# Use: LD_LIBRARY_PATH=target/fabric ib_write_bw ...   (see docs/fabric.md)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
out="${FABRIC_OUT:-$root/target/fabric}"
cc="${CC:-cc}"
mkdir -p "$out"
flags=(-std=gnu11 -O2 -g -fPIC -fvisibility=hidden -Wall -Wextra -Werror -pthread)
"$cc" "${flags[@]}" -shared -Wl,-soname,libibverbs.so.1 \
	-Wl,--version-script="$here/libibverbs.map" -Wl,-z,defs -Wl,-z,now \
	-o "$out/libibverbs.so.1.tmp" "$here"/src/*.c
mv "$out/libibverbs.so.1.tmp" "$out/libibverbs.so.1"
# NCCL dlopens "libibverbs.so" before "libibverbs.so.1"
ln -sf libibverbs.so.1 "$out/libibverbs.so"
if [ "${1:-}" = "--tests" ]; then
	mkdir -p "$out/tests"
	for t in "$here"/tests/*.c; do
		[ -e "$t" ] || continue
		"$cc" -std=gnu11 -O2 -g -Wall -Wextra -Werror -pthread -o "$out/tests/$(basename "$t" .c)" "$t" \
			-L"$out" -Wl,-rpath-link,"$out" -libverbs
	done
fi
echo "$out/libibverbs.so.1"
