#!/usr/bin/env python3
"""The matrix products of a training step in PyTorch, for `just bench-matmul`.

Reads the rows that `matmul_bench` wrote (one per product: its shape
`[m, k] @ [k, n]`, its layout and how many times a training step computes it;
see benches/src/products.rs) and times each product with `torch.matmul` in the
same layout:

  x@w^T   the right factor a transposed [n, k] tensor (a linear layer's forward pass)
  x@w     both row-major                   (the input's gradient)
  x^T@w   the left factor a transposed [k, m] tensor (the weight's gradient)

Each product runs once to size the run (about 0.3 s of timed runs, 3 to 50,
the rule matmul_bench uses), once more untimed, then the timed runs; the row
holds the median. A last row per config adds up the step's products (median
times their count). The rows have the schema of matmul_bench's, for
benches/compare.py --metric gflop_per_s.

Usage:
  .venv/bin/python benches/torch_matmul.py --shapes target/bench/matmul-burn-1.json \
      --out target/bench/matmul-torch-1.json [--threads 2] [--quick]
"""

import argparse
import json
import os
import sys
import tempfile
import time

import torch
from torch_bench import time_loop

LAYOUTS = ("x@w^T", "x@w", "x^T@w")
STEP = "all products of a training step"


def die(msg: str) -> None:
    print(f"torch_matmul.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


def factors(layout: str, m: int, k: int, n: int):
    if layout == "x@w^T":
        return torch.randn(m, k), torch.randn(n, k).t()
    if layout == "x@w":
        return torch.randn(m, k), torch.randn(k, n)
    return torch.randn(k, m).t(), torch.randn(k, n)


def median_seconds(f, quick: bool):
    """The median time of `f` and the timed runs it took (see the module docs)."""
    start = time.perf_counter()
    f()
    first = time.perf_counter() - start
    iters = 2 if quick else min(max(int(0.3 / max(first, 1e-9)), 3), 50)
    times = sorted(time_loop(f, 1, iters))
    return times[len(times) // 2], iters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", required=True, help="matmul_bench's JSON rows")
    parser.add_argument("--out", required=True, help="where to write this side's rows")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2)")
    parser.add_argument("--quick", action="store_true", help="few repetitions, for a smoke test")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    try:
        with open(args.shapes) as f:
            shapes = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        die(f"cannot read {args.shapes}: {e}")
    rows, steps = [], {}
    with torch.no_grad():
        for i, rec in enumerate(shapes):
            if rec.get("workload") == STEP:
                continue
            try:
                config, name, layout = rec["config"], rec["workload"], rec["layout"]
                m, k, n, count = (int(rec[key]) for key in ("m", "k", "n", "count"))
            except (KeyError, TypeError, ValueError) as e:
                die(f"{args.shapes}: record {i} lacks a valid field ({e}); expected matmul_bench's rows")
            if layout not in LAYOUTS:
                die(f"{args.shapes}: record {i}: layout {layout!r}, expected one of {LAYOUTS}")
            lhs, rhs = factors(layout, m, k, n)
            median, iters = median_seconds(lambda: torch.matmul(lhs, rhs), args.quick)
            flop = 2.0 * m * k * n
            print(f"{config:>7} {name:<36} {m:>5}x{k:>5}x{n:>5} {flop / median / 1e9:7.1f} GFLOP/s",
                  file=sys.stderr)
            step = steps.setdefault(config, [0.0, 0.0])
            step[0] += flop * count
            step[1] += median * count
            rows.append(dict(impl="pytorch", config=config, workload=name, layout=layout, m=m, k=k,
                             n=n, count=count, median_s=median, gflop_per_s=flop / median / 1e9,
                             iters=iters, threads=args.threads))
    for config, (flop, seconds) in steps.items():
        print(f"{config:>7} {STEP}: {seconds * 1e3:.1f} ms, {flop / seconds / 1e9:.1f} GFLOP/s",
              file=sys.stderr)
        rows.append(dict(impl="pytorch", config=config, workload=STEP, median_s=seconds,
                         gflop_per_s=flop / seconds / 1e9, threads=args.threads))
    out_dir = os.path.dirname(os.path.abspath(args.out))
    with tempfile.NamedTemporaryFile("w", dir=out_dir, delete=False, suffix=".tmp") as f:
        json.dump(rows, f, indent=2)
        f.write("\n")
    os.replace(f.name, args.out)


if __name__ == "__main__":
    main()
