#!/usr/bin/env python3
"""One table from the GPU bundle's results folder: each doctor check's verdict
and its key number, the doctor's throughput beside PyTorch's on the same
device (tokens/s, the burn/PyTorch ratio, model FLOPs utilisation) and the HF
parity. Writes OUT/summary.md and prints it; exits 1 when something failed.
Standard library only (a node may lack numpy).

Usage: python benches/gpu/summarise.py OUT [--doctor-rc N] [--torch 0|1|skipped] [--hf 0|1|skipped]
"""

import argparse
import json
import sys
from pathlib import Path


def read_lines(path: Path) -> list:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def key_number(check: dict) -> str:
    m = check.get("measured")
    if not isinstance(m, dict):
        return ""
    for key in ("logits_rel_max", "loss_rel", "measured_bytes", "steps"):
        if key in m and m[key] is not None:
            value = m[key]
            if key == "measured_bytes":
                plan = m.get("predicted_bytes") or 0
                return f"{value / 2**30:.3f} GiB measured, plan {plan / 2**30:.3f} GiB"
            return f"{key} {value:.3g}" if isinstance(value, float) else f"{key} {value}"
    return ""


def throughput_rows(checks: list) -> dict:
    rows = {}
    for c in checks:
        if c["check"].startswith("throughput-") and isinstance(c.get("measured"), list):
            for r in c["measured"]:
                rows[(r["config"], r["workload"])] = r
    return rows


def torch_rows(out: Path) -> dict:
    rows = {}
    for dtype in ("f32", "bf16"):
        path = out / f"torch-{dtype}.json"
        if path.exists():
            for r in json.loads(path.read_text()):
                rows[(r["config"], r["workload"], dtype)] = r
    return rows


def render(out: Path, args) -> tuple:
    checks = read_lines(out / "doctor" / "checks.jsonl")
    failed = [c["check"] for c in checks if c["status"] == "FAIL"]
    lines = ["# mappa on this device", ""]
    env_path = out / "doctor" / "environment.json"
    if env_path.exists():
        env = json.loads(env_path.read_text())
        device = env.get("device", {}).get("devices", [{}])[0].get("name") or env.get("machine", {}).get("cpu_model")
        lines += [f"backend {env.get('backend')}, device {device}, burn {env.get('burn')}, cubecl {env.get('cubecl')}", ""]
        if "device_error" in env:
            lines += [f"**The device could not be used:** {env['device_error']}", ""]
    lines += [f"doctor exit code {args.doctor_rc}: {len(checks)} checks, {len(failed)} failed"
              + (f" ({', '.join(failed)})" if failed else ""), ""]
    lines += ["| check | verdict | seconds | key number |", "|---|---|---:|---|"]
    for c in checks:
        lines.append(f"| {c['check']} | {c['status']} | {c.get('seconds', 0):.1f} | {key_number(c)} |")
    burn, torch = throughput_rows(checks), torch_rows(out)
    if burn:
        lines += ["", "| config | workload | mappa tok/s | MFU (FP32 peak) | PyTorch f32 tok/s | mappa / PyTorch f32 | PyTorch bf16 tok/s |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        for (config, workload), r in burn.items():
            t32 = torch.get((config, workload, "f32"), {}).get("tokens_per_s")
            t16 = torch.get((config, workload, "bf16"), {}).get("tokens_per_s")
            mfu = r.get("mfu_fp32")
            cells = [
                config,
                workload,
                f"{r['tokens_per_s']:.0f}",
                f"{100 * mfu:.1f}%" if mfu is not None else "-",
                f"{t32:.0f}" if t32 else "-",
                f"{r['tokens_per_s'] / t32:.2f}" if t32 else "-",
                f"{t16:.0f}" if t16 else "-",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    hf = out / "hf-parity.json"
    if hf.exists():
        h = json.loads(hf.read_text())
        lines += ["", f"HF parity (transformers {h['device']}, {h['model']}): {h['status']}, logits {h['measured']['logits_rel_max']:.2e} (tolerance {h['tolerance']['logits_rel_max']})"]
    else:
        lines += ["", f"HF parity: {args.hf}; PyTorch workloads: {args.torch}"]
    bad = bool(failed) or args.torch == "1" or args.hf not in ("0", "skipped")
    return "\n".join(lines) + "\n", bad


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--doctor-rc", default="?")
    p.add_argument("--torch", default="skipped")
    p.add_argument("--hf", default="skipped")
    args = p.parse_args()
    text, bad = render(args.out, args)
    (args.out / "summary.md").write_text(text)
    print(text, end="")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
