#!/usr/bin/env python3
"""The ranks and the report of scripts/gpu-nccl.sh (read that script first).

  gpu_nccl.py rank --rank R --port P --out FILE [--max-bytes N] [--quick]
      One of two ranks on GPU 0 (torch.distributed, backend nccl, rendezvous on 127.0.0.1:P).
      Runs all-reduce, all-gather, reduce-scatter, all-to-all and send/recv for every size from
      8 B to --max-bytes (default 256 MiB), checks every element of one fresh run per size, then
      times the rest. Rank 0 writes one JSON line per (collective, size) to FILE; every rank
      prints MISMATCH lines for wrong elements. Exit status 1 on any mismatch.
  gpu_nccl.py report NAME=FILE ...
      The bus bandwidth table of the runs, and the Rivet/IB ratio when both ran.
  gpu_nccl.py self-test
      The pure parts (sizes, bus-bandwidth factors, expected values, the report) without torch:
      what --cpu mode can check on a machine without a GPU.

Sizes follow nccl-tests: the size of a row is the bytes of the largest buffer of one rank (the
all-reduce buffer, the all-gather output, the reduce-scatter input, the all-to-all buffer, the
message of send/recv), and bus bandwidth = size / time x factor, factor 2(n-1)/n for all-reduce,
(n-1)/n for all-gather, reduce-scatter and all-to-all, 1 for send/recv (n = 2 ranks).
"""

import json
import sys
import time

WORLD = 2
COLLECTIVES = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"]
ELEMENT = 4  # float32


def bus_factor(coll, n=WORLD):
    if coll == "all_reduce":
        return 2.0 * (n - 1) / n
    if coll in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if coll == "send_recv":
        return 1.0
    raise ValueError(coll)


def sizes(max_bytes, quick=False):
    """8 B, then x4 up to max_bytes, max_bytes itself always last."""
    out, s = [], 8
    step = 16 if quick else 4
    while s < max_bytes:
        out.append(s)
        s *= step
    out.append(max_bytes)
    return out


def iterations(size):
    """Timed iterations: about 512 MiB moved per size, between 2 and 20."""
    return max(2, min(20, (512 << 20) // max(size, 1)))


def pattern_value(rank, i):
    """Element i of rank's input: small integers, so float32 sums of two ranks are exact."""
    return float((i * 7 + rank * 13) % 1021)


def busbw_gbps(coll, size, seconds):
    return size / seconds * bus_factor(coll) / 1e9


def run_rank(args):
    import torch
    import torch.distributed as dist

    rank = args["rank"]
    peer = 1 - rank
    torch.cuda.set_device(0)
    dev = torch.device("cuda:0")
    dist.init_process_group(
        "nccl",
        init_method="tcp://127.0.0.1:%d" % args["port"],
        rank=rank,
        world_size=WORLD,
        device_id=dev,
    )

    def pattern(r, count, offset=0):
        i = torch.arange(offset, offset + count, device=dev, dtype=torch.int64)
        return ((i * 7 + r * 13) % 1021).to(torch.float32)

    def once(coll, size):
        """One run on fresh buffers: (output, expected)."""
        n = size // ELEMENT
        if coll == "all_reduce":
            t = pattern(rank, n)
            dist.all_reduce(t)
            return t, pattern(0, n) + pattern(1, n)
        if coll == "all_gather":
            part = n // WORLD
            out = torch.empty(n, device=dev)
            dist.all_gather_into_tensor(out, pattern(rank, part, rank * part))
            return out, torch.cat([pattern(r, part, r * part) for r in range(WORLD)])
        if coll == "reduce_scatter":
            part = n // WORLD
            out = torch.empty(part, device=dev)
            dist.reduce_scatter_tensor(out, pattern(rank, n))
            lo = rank * part
            return out, pattern(0, part, lo) + pattern(1, part, lo)
        if coll == "all_to_all":
            part = n // WORLD
            out = torch.empty(n, device=dev)
            # Rank r's block b goes to rank b; block b of the input is offset by b*part.
            dist.all_to_all_single(out, pattern(rank, n))
            return out, torch.cat([pattern(r, part, rank * part) for r in range(WORLD)])
        if coll == "send_recv":
            out = torch.empty(n, device=dev)
            ops = [
                dist.P2POp(dist.isend, pattern(rank, n), peer),
                dist.P2POp(dist.irecv, out, peer),
            ]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
            return out, pattern(peer, n)
        raise ValueError(coll)

    def timed(coll, size, iters):
        n = size // ELEMENT
        a = torch.ones(n, device=dev)
        b = torch.empty(n, device=dev)
        half = torch.ones(max(n // WORLD, 1), device=dev)

        def step():
            if coll == "all_reduce":
                dist.all_reduce(a)
            elif coll == "all_gather":
                dist.all_gather_into_tensor(b, half)
            elif coll == "reduce_scatter":
                dist.reduce_scatter_tensor(half, a)
            elif coll == "all_to_all":
                dist.all_to_all_single(b, a)
            else:
                ops = [dist.P2POp(dist.isend, a, peer), dist.P2POp(dist.irecv, b, peer)]
                for req in dist.batch_isend_irecv(ops):
                    req.wait()

        step()  # warm-up
        torch.cuda.synchronize()
        dist.barrier(device_ids=[0])
        start = time.perf_counter()
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / iters

    mismatches = 0
    rows = []
    for size in sizes(args["max_bytes"], args["quick"]):
        for coll in COLLECTIVES:
            got, want = once(coll, size)
            torch.cuda.synchronize()
            bad = int((got != want).sum().item())
            if bad:
                first = int((got != want).nonzero()[0].item())
                print(
                    "MISMATCH rank %d %s %d B: %d of %d elements wrong, first at %d: %r != %r"
                    % (rank, coll, size, bad, got.numel(), first, got[first].item(), want[first].item()),
                    flush=True,
                )
                mismatches += 1
            seconds = timed(coll, size, iterations(size))
            rows.append(
                {
                    "coll": coll,
                    "size": size,
                    "us": seconds * 1e6,
                    "busbw_gbps": busbw_gbps(coll, size, seconds),
                    "elements_checked": got.numel(),
                    "ok": bad == 0,
                }
            )
        if rank == 0:
            print("size %d B done" % size, file=sys.stderr, flush=True)
    total = torch.tensor([mismatches], device=dev, dtype=torch.int64)
    dist.all_reduce(total)
    dist.destroy_process_group()
    if rank == 0:
        with open(args["out"], "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
            f.write(json.dumps({"mismatching_rows_all_ranks": int(total.item())}) + "\n")
    return 0 if int(total.item()) == 0 else 1


def load(path):
    rows, bad = {}, None
    try:
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if "coll" in r:
                    rows[(r["coll"], r["size"])] = r
                else:
                    bad = r.get("mismatching_rows_all_ranks")
    except OSError:
        return None, None
    return rows, bad


def human(size):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return "%d %s" % (size >> shift, unit)
    return "%d B" % size


def report(named, out=sys.stdout):
    runs = []
    for item in named:
        name, _, path = item.partition("=")
        rows, bad = load(path)
        if rows is None:
            print("%s: no results (%s)" % (name, path), file=out)
            continue
        runs.append((name, rows, bad))
    if not runs:
        return 1
    status = 0
    for name, rows, bad in runs:
        wrong = [k for k, r in rows.items() if not r["ok"]]
        checked = sum(r["elements_checked"] for r in rows.values())
        verdict = "every element right" if not wrong and bad == 0 else "WRONG RESULTS"
        if wrong or bad != 0:
            status = 1
        print(
            "%s: %d collective x size rows, %d elements checked on rank 0, %s"
            % (name, len(rows), checked, verdict),
            file=out,
        )
    names = [n for n, _, _ in runs]
    by_name = {n: rows for n, rows, _ in runs}
    ratio = "Rivet" in by_name and "IB" in by_name
    for coll in COLLECTIVES:
        print("", file=out)
        head = "| %s size | " % coll + " | ".join("%s busbw GB/s" % n for n in names)
        if ratio:
            head += " | Rivet/IB"
        print(head + " |", file=out)
        print("|" + " ---: |" * (len(names) + 1 + int(ratio)), file=out)
        all_sizes = sorted({s for _, rows, _ in runs for (c, s) in rows if c == coll})
        for size in all_sizes:
            cells = []
            for n in names:
                r = by_name[n].get((coll, size))
                cells.append("%.3f%s" % (r["busbw_gbps"], "" if r["ok"] else " WRONG") if r else "-")
            line = "| %s | %s" % (human(size), " | ".join(cells))
            if ratio:
                a, b = by_name["Rivet"].get((coll, size)), by_name["IB"].get((coll, size))
                line += " | %s" % ("%.2f" % (a["busbw_gbps"] / b["busbw_gbps"]) if a and b and b["busbw_gbps"] > 0 else "-")
            print(line + " |", file=out)
    return status


def self_test():
    import io
    import os
    import tempfile

    assert sizes(256 << 20)[0] == 8 and sizes(256 << 20)[-1] == 256 << 20
    assert all(s % 8 == 0 for s in sizes(256 << 20)), "every size splits into 2 float32 parts"
    assert bus_factor("all_reduce") == 1.0 and bus_factor("all_gather") == 0.5
    assert bus_factor("send_recv") == 1.0 and bus_factor("all_reduce", 8) == 1.75
    assert iterations(8) == 20 and iterations(256 << 20) == 2
    assert abs(busbw_gbps("all_gather", 1 << 30, 1.0) - (1 << 30) / 2e9) < 1e-9
    # Sums of two ranks' patterns stay below 2^24: float32 adds them exactly.
    assert max(pattern_value(r, i) for r in (0, 1) for i in range(2048)) * 2 < 1 << 24
    with tempfile.TemporaryDirectory() as d:
        files = {}
        for name, bw in (("Rivet", 2.0), ("IB", 4.0)):
            path = os.path.join(d, name)
            with open(path, "w") as f:
                for coll in COLLECTIVES:
                    f.write(json.dumps({"coll": coll, "size": 8, "us": 1.0, "busbw_gbps": bw, "elements_checked": 2, "ok": True}) + "\n")
                f.write(json.dumps({"mismatching_rows_all_ranks": 0}) + "\n")
            files[name] = path
        buf = io.StringIO()
        assert report(["Rivet=" + files["Rivet"], "IB=" + files["IB"]], buf) == 0
        text = buf.getvalue()
        assert "| 8 B | 2.000 | 4.000 | 0.50 |" in text, text
        assert "every element right" in text
    print("gpu_nccl.py self-test: PASS (sizes, bus-bandwidth factors, exact sums, report)")
    return 0


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "self-test":
        return self_test()
    if cmd == "report":
        return report(rest)
    if cmd == "rank":
        args = {"max_bytes": 256 << 20, "quick": False}
        it = iter(rest)
        for a in it:
            if a == "--rank":
                args["rank"] = int(next(it))
            elif a == "--port":
                args["port"] = int(next(it))
            elif a == "--out":
                args["out"] = next(it)
            elif a == "--max-bytes":
                args["max_bytes"] = int(next(it))
            elif a == "--quick":
                args["quick"] = True
            else:
                print("gpu_nccl.py rank: unknown argument %r" % a, file=sys.stderr)
                return 2
        return run_rank(args)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
