#!/usr/bin/env python3
"""Join the results files of one benchmark run into one (`just bench-vs-torch`
runs each workload of each configuration as its own process, so that burn and
PyTorch alternate workload by workload; `just bench-tch`, config by config).

Usage:
  python benches/merge_runs.py OUT.json PART1.json PART2.json ...

Each part holds a JSON list of records (the schema of benches/torch_bench.py);
OUT gets their concatenation in the order given, written to a temporary file
and renamed. Exits with an error naming the file if a part is unreadable or
not a list.
"""

import json
import os
import sys


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit("usage: merge_runs.py OUT.json PART.json [PART.json ...]")
    out, parts = sys.argv[1], sys.argv[2:]
    records = []
    for path in parts:
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            sys.exit(f"merge_runs.py: error: cannot read {path}: {e}")
        if not isinstance(data, list):
            sys.exit(f"merge_runs.py: error: {path}: expected a JSON list of result records")
        records.extend(data)
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(records, f, indent=2)
        f.write("\n")
    os.replace(tmp, out)


if __name__ == "__main__":
    main()
