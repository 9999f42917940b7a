#!/usr/bin/env bash
# Instructions per RMA call, the way NCCL's proxy calls (the v16 table, `rmaProgress` on every
# pass): `tests/c/rma.c --bench --quick` (two ranks over the user-space verbs fabric) under
# callgrind, then per call of `iput` and `iputSignal`: the instructions inside the plugin
# (inclusive, less what libibverbs' `ibv_post_send` costs: the fabric's, not a NIC's) and the
# whole call. Prints numbers; never fails on them. (`--fair-sched=yes`: the ranks spin on their
# completion queues; without it valgrind may leave the fabric's progress thread unscheduled for long.)
#
# usage: benches/rma_callgrind.sh [--release]    (the library must be built: cargo build -p rivet-plugin)
set -euo pipefail
cd "$(dirname "$0")/.."
profile=debug
[[ ${1:-} == --release ]] && profile=release
lib=$PWD/target/$profile/libnccl_net_rivet.so
[[ -f $lib ]] || { echo "rma_callgrind: $lib is missing" >&2; exit 1; }
command -v valgrind >/dev/null || { echo "rma_callgrind: valgrind not found" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/rivet-rma-cg.XXXXXX")
trap 'rm -rf "$work"' EXIT
cc -O2 -g -o "$work/rma" tests/c/rma.c -ldl -lm
fabric/build.sh >/dev/null
export LD_LIBRARY_PATH=$PWD/target/fabric RIVET_FABRIC_DIR=$work/fabric NCCL_SOCKET_IFNAME==lo
(cd "$work" && valgrind --tool=callgrind --fair-sched=yes --trace-children=yes --callgrind-out-file="$work/cg.%p" \
    "$work/rma" "$lib" --ranks 2 --bench --quick 2>&1 | grep -E '^rma:') || true
# The rank that issued the most iputs (rank 0: it runs the bandwidth loop).
best= most=0
for f in "$work"/cg.*; do
    [[ $f == *.txt ]] && continue
    callgrind_annotate --inclusive=yes --tree=calling --threshold=100 "$f" >"$f.txt" 2>/dev/null || true
    n=$({ grep -E '> .*rma_shims::iput_opt ' "$f.txt" || true; } | sed -E 's/.*\(([0-9,]+)x\).*/\1/' | tr -d , | awk '{ s += $1 } END { print s + 0 }')
    if ((n > most)); then most=$n best=$f.txt; fi
done
[[ -n $best ]] || { echo "rma_callgrind: no rank called iput" >&2; exit 1; }
python3 - "$best" <<'EOF'
import re, sys
incl, calls = {}, {}
cur = None
for line in open(sys.argv[1]):
    m = re.match(r"\s*([\d,]+) \([^)]*\)\s+([*>])\s+(\S+)(?: \(([\d,]+)x\))?", line)
    if not m:
        continue
    ir = int(m.group(1).replace(",", ""))
    name = m.group(3)
    if m.group(2) == "*":
        cur = name
        incl[name] = max(incl.get(name, 0), ir)
    elif cur is not None and m.group(4):
        n = int(m.group(4).replace(",", ""))
        key = (cur, name)
        a, b = calls.get(key, (0, 0))
        calls[key] = (a + ir, b + n)

def find(pat):
    return [k for k in incl if re.search(pat, k)]

def called(pat_callee):
    ir = n = 0
    for (c, e), (a, b) in calls.items():
        if re.search(pat_callee, e):
            ir += a
            n += b
    return ir, n

post_ir, post_n = 0, 0
for (c, e), (a, b) in calls.items():
    if re.search(r"Lane::post$", c) and re.search(r"post_send$", e):
        post_ir += a
        post_n += b
per_post = post_ir / post_n if post_n else 0.0
print("| call | calls | whole call (Ir) | inside the plugin (Ir) |")
print("| --- | ---: | ---: | ---: |")
for label, pat in (("iput", r"rma_shims::iput_opt$"), ("iputSignal", r"rma_shims::iput_signal_opt$")):
    ir, n = called(pat)
    if n:
        print(f"| {label} | {n} | {ir / n:.0f} | {ir / n - per_post:.0f} |")
print(f"(libibverbs' ibv_post_send, the fabric's: {per_post:.0f} Ir per post over {post_n} posts)")
EOF
