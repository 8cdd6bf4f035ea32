#!/usr/bin/env python3
"""Load the checkpoint `mappa doctor` trained one step on its device and saved
(its `hf-export` check: config.json, model.safetensors and mappa_logits.json,
mappa's logits on that device) into HF transformers on --device, and compare
the logits. The tolerance is the doctor's for f32 logits: the largest
difference against the largest |logit| (`compare::F32.logits` in
crates/mappa-cli/src/doctor/compare.rs).

Usage: python benches/gpu/hf_parity.py CHECKPOINT_DIR [--device cuda] [--out JSON]
"""

import argparse
import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

TOLERANCE = 1e-3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkpoint", type=Path)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    cases_path = args.checkpoint / "mappa_logits.json"
    if not cases_path.exists():
        print(f"hf_parity: {cases_path} is missing (did the doctor's hf-export check run?)", file=sys.stderr)
        return 1
    # Plain f32 products on the GPU, as mappa computes (no TF32).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device(args.device)
    model = AutoModelForCausalLM.from_pretrained(
        args.checkpoint, dtype=torch.float32, attn_implementation="eager"
    ).to(device).eval()
    worst = 0.0
    for case in json.loads(cases_path.read_text()):
        ids = torch.tensor([case["input_ids"]], device=device)
        with torch.no_grad():
            hf = model(ids).logits[0].flatten().float().cpu()
        mappa = torch.tensor(case["logits"], dtype=torch.float32)
        worst = max(worst, ((hf - mappa).abs().max() / mappa.abs().max().clamp_min(1e-6)).item())
    ok = worst <= TOLERANCE
    result = {
        "check": "hf-parity",
        "status": "PASS" if ok else "FAIL",
        "measured": {"logits_rel_max": worst},
        "tolerance": {"logits_rel_max": TOLERANCE},
        "device": str(device),
        "model": type(model).__name__,
        "torch": torch.__version__,
    }
    print(f"{result['status']} hf-parity: transformers on {device} against mappa's logits: {worst:.2e} (tolerance {TOLERANCE})")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
