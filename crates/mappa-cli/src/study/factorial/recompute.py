#!/usr/bin/env python3
"""Recompute a mappa factorial study's p-values from its per-seed CSV.

Reads per_seed.csv (one row per run: seed, cell, arm, ..., area) and
contrasts.json (the registered contrasts, and mappa's results) in this
directory, with the Python standard library only. For each contrast it
forms the per-seed value (a weight on `cell` takes that cell's method-minus-
baseline area difference; a weight on `cell/arm` takes that arm's area),
computes the one-sided exact sign-flip p-value (the share of the 2^n sign
assignments whose sum reaches the observed sum), and Holm's adjustment over
the primary contrasts. It prints both and exits 1 if any p-value differs
from mappa's by more than 1e-9.
"""
import csv
import itertools
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def load():
    with open(os.path.join(HERE, "per_seed.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    with open(os.path.join(HERE, "contrasts.json")) as f:
        spec = json.load(f)
    return rows, spec


def per_seed(contrast, areas, seeds, method, baseline):
    values = {}
    for seed in seeds:
        total = 0.0
        try:
            for key, weight in contrast["weights"].items():
                if "/" in key:
                    cell, arm = key.split("/", 1)
                    term = areas[(seed, cell, arm)]
                else:
                    term = areas[(seed, key, method)] - areas[(seed, key, baseline)]
                total += weight * term
        except KeyError:
            continue
        values[seed] = total
    return values


def sign_flip_p(values):
    n = len(values)
    if n == 0:
        return 1.0
    observed = sum(values)
    magnitudes = [abs(v) for v in values]
    scale = max(sum(magnitudes), sys.float_info.min)
    hits = 0
    for signs in itertools.product((1.0, -1.0), repeat=n):
        if sum(s * m for s, m in zip(signs, magnitudes)) >= observed - 1e-12 * scale:
            hits += 1
    return hits / 2 ** n


def holm(ps):
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    adjusted, running = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        adjusted[i] = running
    return adjusted


def main():
    rows, spec = load()
    areas = {(int(r["seed"]), r["cell"], r["arm"]): float(r["area"]) for r in rows}
    seeds = sorted({int(r["seed"]) for r in rows})
    results = []
    for contrast in spec["contrasts"]:
        values = per_seed(contrast, areas, seeds, spec["method"], spec["baseline"])
        results.append((contrast, sign_flip_p(list(values.values())), len(values)))
    primary = [i for i, (c, _, _) in enumerate(results) if c.get("primary")]
    adjusted = dict(zip(primary, holm([results[i][1] for i in primary])))
    mappa = {r["name"]: r for r in spec["results"]}
    ok = True
    print(f"{'contrast':28} {'seeds':>5} {'p':>8} {'Holm p':>8}  mappa p")
    for i, (contrast, p, n) in enumerate(results):
        theirs = mappa[contrast["name"]]["p_value"]
        same = abs(theirs - p) <= 1e-9
        ok &= same
        holm_p = f"{adjusted[i]:8.4f}" if i in adjusted else f"{'-':>8}"
        print(f"{contrast['name']:28} {n:5d} {p:8.4f} {holm_p}  {theirs:.4f}{'' if same else '  DIFFERS'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
