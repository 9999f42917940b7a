#!/usr/bin/env python3
"""Exclusive instruction totals per object and per function from a callgrind.out file (for
benches/callgrind_pingpong.sh): callgrind_annotate names the object only on some lines, so the
file is read directly. usage: callgrind_totals.py FILE ROUNDS PLUGIN_BASENAME [TOP]"""
import collections
import os
import sys

path, rounds, plugin = sys.argv[1], int(sys.argv[2]), sys.argv[3]
top = int(sys.argv[4]) if len(sys.argv) > 4 else 25
names = {"ob": {}, "fn": {}}
by_obj, by_fn = collections.Counter(), collections.Counter()
obj = fn = None
skip_next = False


def name(kind, value):
    # "(id) name" defines a compressed name, "(id)" uses one
    value = value.strip()
    if value.startswith("("):
        ident, _, rest = value.partition(")")
        rest = rest.strip()
        if rest:
            names[kind][ident] = rest
        return names[kind].get(ident, ident)
    return value


with open(path) as f:
    for line in f:
        line = line.rstrip("\n")
        if not line:
            continue
        head = line[0]
        if head.isdigit() or head in "+-*":
            if skip_next:
                skip_next = False
                continue
            parts = line.split()
            if len(parts) >= 2 and fn is not None:
                cost = int(parts[1])
                by_obj[obj] += cost
                by_fn[(fn, obj)] += cost
            continue
        key, _, value = line.partition("=")
        if key == "ob":
            obj = os.path.basename(name("ob", value))
        elif key == "fn":
            fn = name("fn", value)
        elif key in ("cob", "cfn", "cfi", "cfl"):
            name(key[1:] if key != "cfl" else "fl", value) if key in ("cob", "cfn") else None
        elif key == "calls":
            skip_next = True

total = sum(by_obj.values())
per = lambda n: n / rounds / 2  # noqa: E731
print(f"per 8-byte round trip, per side (one isend, one irecv, two tests), {rounds} rounds:")
print(f"  whole loop {per(total):8.0f} Ir   (NCCL's IB transport 2,463 on Soft-RoCE: the bar of issue #30; stretch 1,850)")
print(f"  plugin     {per(by_obj[plugin]):8.0f} Ir   ({100 * by_obj[plugin] / max(total, 1):.1f} %; NCCL's IB transport ~1,170: the bar; stretch 585)")
print("per object:")
for o, c in by_obj.most_common():
    print(f"  {per(c):8.0f}  {o}")
print(f"top {top} functions (exclusive Ir per round trip per side):")
for (f_, o), c in by_fn.most_common(top):
    print(f"  {per(c):8.1f}  {o:<22} {f_}")
