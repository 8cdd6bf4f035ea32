#!/usr/bin/env python3
"""Compare two benchmark result files: burn against the PyTorch reference
(`just bench-vs-torch`), or one burn backend against another
(`just bench-backends`).

Usage:
  python benches/compare.py A.json B.json

Both files hold a JSON list of records with (at least) the keys
"impl", "config", "workload", "tokens_per_s" (the schema written by
benches/torch_bench.py). Rows are matched on (config, workload) and printed to
stdout as a markdown table with the throughput ratio A/B (> 1 means A is
faster); the columns are named after each file's "impl" field. Rows appear in
the order of A.json.

Exits with an error (and prints no table) if a (config, workload) pair is
present on only one side, or if a file is malformed.
"""

import json
import sys

REQUIRED_KEYS = ("config", "workload", "tokens_per_s")


def die(msg: str) -> None:
    print(f"compare.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


def load(path: str) -> dict:
    """Load a results file into {(config, workload): record}, preserving order."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        die(f"cannot read {path}: {e}")
    if not isinstance(data, list):
        die(f"{path}: expected a JSON list of result records")
    rows = {}
    for i, rec in enumerate(data):
        if not isinstance(rec, dict):
            die(f"{path}: record {i} is not an object")
        missing = [k for k in REQUIRED_KEYS if k not in rec]
        if missing:
            die(f"{path}: record {i} lacks key(s) {missing}")
        key = (rec["config"], rec["workload"])
        if key in rows:
            die(f"{path}: duplicate record for config={key[0]} workload={key[1]}")
        rows[key] = rec
    return rows


def fmt_tps(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def main() -> None:
    if len(sys.argv) != 3:
        die("usage: python benches/compare.py A.json B.json")
    rust_path, torch_path = sys.argv[1], sys.argv[2]
    rust, torch = load(rust_path), load(torch_path)

    only_rust = [k for k in rust if k not in torch]
    only_torch = [k for k in torch if k not in rust]
    if only_rust or only_torch:
        lines = [f"  config={c} workload={w}: missing in {torch_path}" for c, w in only_rust]
        lines += [f"  config={c} workload={w}: missing in {rust_path}" for c, w in only_torch]
        die("(config, workload) pairs present on only one side:\n" + "\n".join(lines))

    # Non-fatal sanity checks: a parameter-count or thread-count mismatch usually
    # means the two sides did not run the same thing.
    for key, r in rust.items():
        t = torch[key]
        for field in ("params", "threads", "tokens_per_iter"):
            if field in r and field in t and r[field] != t[field]:
                print(f"compare.py: warning: config={key[0]} workload={key[1]}: "
                      f"{field} differs ({r[field]} vs {t[field]})", file=sys.stderr)

    name_a = next(iter(rust.values())).get("impl", rust_path)
    name_b = next(iter(torch.values())).get("impl", torch_path)
    print(f"| config | workload | {name_a} tok/s | {name_b} tok/s | {name_a}/{name_b} |")
    print("|---|---|---:|---:|---:|")
    for key, r in rust.items():
        t = torch[key]
        b, p = float(r["tokens_per_s"]), float(t["tokens_per_s"])
        ratio = f"{b / p:.2f}x" if p > 0 else "n/a"
        print(f"| {key[0]} | {key[1]} | {fmt_tps(b)} | {fmt_tps(p)} | {ratio} |")


if __name__ == "__main__":
    main()
