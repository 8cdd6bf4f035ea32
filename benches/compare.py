#!/usr/bin/env python3
"""Compare benchmark results: burn against the PyTorch reference
(`just bench-vs-torch`), or one burn backend against another
(`just bench-backends`).

Usage:
  python benches/compare.py [--metric gflop_per_s] A.json B.json
  python benches/compare.py [--goals] A1.json,A2.json,A3.json B1.json,B2.json,B3.json

Each side is one results file, or several comma-separated files from repeated
runs (run i of A alternated with run i of B, so paired runs saw the same
machine state). Every file holds a JSON list of records with (at least) the
keys "impl", "config", "workload", "tokens_per_s" (the schema written by
benches/torch_bench.py), or "gflop_per_s" instead of "tokens_per_s" with
`--metric gflop_per_s` (matrix products: `just bench-matmul`). Rows are matched on (config, workload) and printed
to stdout as a markdown table: each side's median throughput over its runs
with the range (min-max), and the ratio A/B (> 1 means A is faster) as the
median of the per-run ratios with their range. The columns are named after
each file's "impl" field. Rows appear in the order of A's first file. Where a
side's records hold "core_round_trip_ns" (bench_json's), its per-run round
trips follow the table; where they hold "cpu_loop_us" (each CPU's time for
bench_json's fixed loop), the slowest CPU's time per run follows too. Where
both sides' records hold "started_unix_s" (when a workload's timing began),
the time between the two sides of each pair is printed first.

With `--goals` (`just bench-vs-torch`: A is burn, B is PyTorch), a last
column marks issue 19's goal for each row that has one (GOALS): met in every
pair of runs, met by the median (in how many pairs), or not met; likewise the
floor where a goal has one. With more than one pair, each gets the one-sided
exact sign test's p-value (the chance of at least that many pairs reaching it
if the pairs' median ratio were at the goal), and a line under the table says
how many pairs show a goal at the ALPHA level.

Exits with an error (and prints no table) if a (config, workload) pair is
missing from any file, if the sides have different numbers of runs, or if a
file is malformed.
"""

import json
import math
import statistics
import sys

# The compared quantity (higher is faster): its record key and its unit.
METRICS = {"tokens_per_s": "tok/s", "gflop_per_s": "GFLOP/s"}

# Issue 19's goals for burn against PyTorch, as ratios A/B of the rows they
# apply to: (config, workload) -> (goal, floor or None).
GOALS = {
    ("1m", "forward"): (1.0, None),
    ("1m", "train_step"): (1.5, 1.0),
    ("1m", "generate"): (2.0, None),
    ("25m", "forward"): (1.0, None),
    ("25m", "train_step"): (1.0, None),
    ("25m", "generate"): (1.5, None),
    ("smol-b8", "train_step"): (1.0, None),
    ("smol-b8", "generate"): (1.0, None),
}


# The sign test's level: a goal is shown by a table when its p-value is below it.
ALPHA = 0.05


def die(msg: str) -> None:
    print(f"compare.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


def load(path: str, metric: str) -> dict:
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
        missing = [k for k in ("config", "workload", metric) if k not in rec]
        if missing:
            die(f"{path}: record {i} lacks key(s) {missing}")
        key = (rec["config"], rec["workload"])
        if key in rows:
            die(f"{path}: duplicate record for config={key[0]} workload={key[1]}")
        rows[key] = rec
    return rows


def load_runs(arg: str, metric: str) -> list:
    """The runs of one side: one file, or comma-separated files with the same rows."""
    paths = [p for p in arg.split(",") if p]
    if not paths:
        die(f"no results file in {arg!r}")
    runs = [(p, load(p, metric)) for p in paths]
    first_path, first = runs[0]
    for path, rows in runs[1:]:
        if set(rows) != set(first):
            diff = sorted(set(rows) ^ set(first))
            die(f"{path} and {first_path} hold different (config, workload) pairs: {diff}")
    return runs


def fmt_tps(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def spread(values: list, fmt) -> str:
    """The median, and the range when there is more than one value."""
    text = fmt(statistics.median(values))
    if len(values) > 1:
        text += f" ({fmt(min(values))}-{fmt(max(values))})"
    return text


def per_run_spread(runs: list) -> str:
    """Each run's values as "run i: median (min-max)", joined."""
    return "; ".join(f"run {i + 1}: {spread(run, lambda x: f'{x:.0f}')}"
                     for i, run in enumerate(runs))


def sign_test_p(met: int, pairs: int) -> float:
    """The one-sided exact sign test's p-value: the chance of at least `met`
    of `pairs` pairs reaching a goal if each reached it with probability 1/2
    (the pairs' median ratio at the goal)."""
    return sum(math.comb(pairs, k) for k in range(met, pairs + 1)) / 2**pairs


def pairs_needed(pairs: int) -> int | None:
    """The fewest of `pairs` pairs reaching a goal for which the sign test
    shows it at level ALPHA (None where no count does)."""
    return next((k for k in range(pairs + 1) if sign_test_p(k, pairs) < ALPHA), None)


def verdict(ratios: list, target: float) -> str:
    """Whether the per-pair `ratios` reach `target`: in every pair, by the
    median (and in how many pairs), or not; with more than one pair, the
    sign test's p-value (`sign_test_p`)."""
    met = sum(r >= target for r in ratios)
    head = f">= {target:.1f}x: "
    if len(ratios) == 1:
        return head + ("met" if met else "**not met**")
    p = f"sign test p = {sign_test_p(met, len(ratios)):.3g}"
    if met == len(ratios):
        return head + f"met in every pair ({p})"
    if statistics.median(ratios) >= target:
        return head + f"met by the median, in {met} of {len(ratios)} pairs ({p})"
    return head + f"**not met** (met in {met} of {len(ratios)} pairs; {p})"


def goal_cell(key: tuple, ratios: list) -> str:
    """The goal column's cell for row `key` (empty where it has no goal)."""
    if key not in GOALS or not ratios:
        return ""
    goal, floor = GOALS[key]
    cell = verdict(ratios, goal)
    if floor is not None:
        cell += "; floor " + verdict(ratios, floor).removeprefix(">= ")
    return cell


def main() -> None:
    argv, metric = sys.argv[1:], "tokens_per_s"
    goals = "--goals" in argv
    argv = [a for a in argv if a != "--goals"]
    if len(argv) == 4 and argv[0] == "--metric":
        metric, argv = argv[1], argv[2:]
        if metric not in METRICS:
            die(f"--metric {metric!r}: expected one of {', '.join(METRICS)}")
    if len(argv) != 2:
        die("usage: python benches/compare.py [--metric gflop_per_s] [--goals] "
            "A.json[,A2.json...] B.json[,B2.json...]")
    a_runs, b_runs = load_runs(argv[0], metric), load_runs(argv[1], metric)
    if len(a_runs) != len(b_runs):
        die(f"{len(a_runs)} runs of A but {len(b_runs)} of B: the runs are compared in pairs")
    a_path, a = a_runs[0]
    b_path, b = b_runs[0]

    only_a = [k for k in a if k not in b]
    only_b = [k for k in b if k not in a]
    if only_a or only_b:
        lines = [f"  config={c} workload={w}: missing in {b_path}" for c, w in only_a]
        lines += [f"  config={c} workload={w}: missing in {a_path}" for c, w in only_b]
        die("(config, workload) pairs present on only one side:\n" + "\n".join(lines))

    # Non-fatal sanity checks: a parameter-count or thread-count mismatch usually
    # means the two sides did not run the same thing.
    for key, r in a.items():
        t = b[key]
        for field in ("params", "threads", "tokens_per_iter"):
            if field in r and field in t and r[field] != t[field]:
                print(f"compare.py: warning: config={key[0]} workload={key[1]}: "
                      f"{field} differs ({r[field]} vs {t[field]})", file=sys.stderr)

    name_a = next(iter(a.values())).get("impl", a_path)
    name_b = next(iter(b.values())).get("impl", b_path)
    runs = len(a_runs)
    if runs > 1:
        print(f"{runs} runs each, alternating; median (min-max) over the runs, "
              f"the ratio per pair of runs.\n")
    unit = METRICS[metric]
    header = f"| config | workload | {name_a} {unit} | {name_b} {unit} | {name_a}/{name_b} |"
    print(header + (" issue 19 goal |" if goals else ""))
    print("|---|---|---:|---:|---:|" + ("---|" if goals else ""))
    for key in a:
        a_tps = [float(rows[key][metric]) for _, rows in a_runs]
        b_tps = [float(rows[key][metric]) for _, rows in b_runs]
        ratios = [] if any(x <= 0 for x in b_tps) else [x / y for x, y in zip(a_tps, b_tps)]
        ratio = spread(ratios, lambda r: f"{r:.2f}x") if ratios else "n/a"
        row = f"| {key[0]} | {key[1]} | {spread(a_tps, fmt_tps)} | {spread(b_tps, fmt_tps)} | {ratio} |"
        print(row + (f" {goal_cell(key, ratios)} |" if goals else ""))
    if goals and runs > 1:
        needed = pairs_needed(runs)
        fewest = next(n for n in range(1, 64) if pairs_needed(n) is not None)
        shown = (f"{needed} or more of the {runs} pairs show it (p < {ALPHA})" if needed
                 else f"no count of {runs} pairs can show it at p < {ALPHA} "
                      f"({fewest} pairs can)")
        print(f"\nThe sign test (one-sided, exact) of a goal: p is the chance that at least "
              f"that many pairs reach it if each pair reached it with probability 1/2 (the "
              f"pairs' median ratio at the goal); {shown}.")

    # How far apart in time the two sides of each pair were timed: the closer,
    # the likelier both saw the same machine state.
    gaps = [abs(float(ra[k]["started_unix_s"]) - float(rb[k]["started_unix_s"]))
            for (_, ra), (_, rb) in zip(a_runs, b_runs) for k in a
            if isinstance(ra[k].get("started_unix_s"), (int, float))
            and isinstance(rb[k].get("started_unix_s"), (int, float))]
    if gaps and len(gaps) == runs * len(a):
        print(f"\nSeconds between the two sides' timings of a row, over every "
              f"row and pair: {spread(gaps, lambda x: f'{x:.0f}')}")

    # How far apart the host ran two threads in each run of a side that records
    # it (bench_json's `core_round_trip_ns`, measured before each workload): on
    # 2-vCPU VMs a far placement slows a two-thread step, so a table is read
    # with it.
    for name, runs_ in ((name_a, a_runs), (name_b, b_runs)):
        trips = [[rows[k].get("core_round_trip_ns") for k in rows] for _, rows in runs_]
        if all(isinstance(t, (int, float)) for run in trips for t in run):
            print(f"\n{name}: the cores' round trip before each workload, ns, "
                  f"median (min-max) per run: {per_run_spread(trips)}")
        # How fast the slowest CPU ran a fixed loop before each workload: the
        # host slows one vCPU at times, and a two-thread step with it.
        loops = [[rows[k].get("cpu_loop_us") for k in rows] for _, rows in runs_]
        if all(isinstance(t, list) and t for run in loops for t in run):
            slowest = [[max(t) for t in run] for run in loops]
            print(f"\n{name}: the slowest CPU's time for the same loop before each "
                  f"workload, us, median (min-max) per run: {per_run_spread(slowest)}")


if __name__ == "__main__":
    main()
