#!/usr/bin/env python3
"""Recompute a run's claim from per_problem.csv, with Python's standard
library only: McNemar's exact one-sided test that accuracy went up (the
upper tail of Binomial(gained + lost, 1/2) at the number of gained
problems), and both accuracies.

    python3 recompute.py per_problem.csv
"""
import csv
import math
import sys


def upper_tail(k, n):
    """P(X >= k) for X ~ Binomial(n, 1/2)."""
    if k <= 0:
        return 1.0
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2 ** n


def main(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    base = [int(r["base"]) for r in rows]
    trained = [int(r["trained"]) for r in rows]
    gained = sum(1 for b, t in zip(base, trained) if not b and t)
    lost = sum(1 for b, t in zip(base, trained) if b and not t)
    n = len(rows)
    print(f"problems: {n}")
    print(f"base accuracy: {sum(base) / n:.4f}")
    print(f"trained accuracy: {sum(trained) / n:.4f}")
    print(f"gained: {gained}, lost: {lost}")
    print(f"one-sided p: {upper_tail(gained, gained + lost):.6g}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "per_problem.csv")
