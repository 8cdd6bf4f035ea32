#!/usr/bin/env python3
"""PyTorch / HF-transformers reference benchmark for the Rust-vs-PyTorch comparison.

Builds randomly initialised Qwen3ForCausalLM models (float32 by default, eager
attention, no torch.compile) for the configs the Rust benchmark uses (1m, 25m;
for GPUs also 135m and 500m: SmolLM2-135M's and Qwen2.5-0.5B's shapes; batch 8),
and loads the real SmolLM2-135M-Instruct that `just models` converted (smol-b1 and
smol-b8: batch 1 and 8), and times three workloads on the CPU, or on
`--device cuda` (synchronised before each clock read) in `--dtype bf16` or f32:

  forward     batch B x seq 128, full logits, no KV cache      tokens/iter = B*128
  train_step  batch B x seq 128, forward+CE loss, backward,
              Adam step, zero_grad                              tokens/iter = B*128
  generate    batch B prompts x 16 tokens, greedy decoding of
              exactly 64 new tokens with the KV cache           tokens/iter = B*64

Each workload runs `warmup` untimed iterations followed by `iters` timed ones
(time.perf_counter); we report the median iteration time and
tokens/s = tokens_per_iter / median_s.

Usage:
  .venv/bin/python benches/torch_bench.py [--threads 2] [--configs 1m,25m,smol-b1,smol-b8]
      [--smol-dir models/SmolLM2-135M-Instruct] [--out results.json] [--quick]
      [--workloads forward,train_step,generate] [--warmup N] [--iters N]
      [--device cpu|cuda] [--dtype f32|bf16]

The JSON written by --out is a list of records (one per config x workload) with
the schema consumed by benches/compare.py. A readable summary goes to stderr.
"""

import argparse
import json
import statistics
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

# Model configs. These MUST match the Rust side exactly.
CONFIGS = {
    "1m": dict(
        vocab_size=2048,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
    ),
    "25m": dict(
        vocab_size=8192,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=7,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
    ),
    # SmolLM2-135M's shape (its config.json), with Qwen3 layers.
    "135m": dict(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
    ),
    # Qwen2.5-0.5B's shape (its config.json), with Qwen3 layers.
    "500m": dict(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        head_dim=64,
    ),
}

# Settings shared by both configs.
COMMON = dict(
    hidden_act="silu",
    rms_norm_eps=1e-6,
    max_position_embeddings=512,
    tie_word_embeddings=True,
    # transformers 5 stores rope_theta inside rope_parameters.
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    attention_bias=False,
    attention_dropout=0.0,
    use_sliding_window=False,
)

# The real model at two batch sizes (loaded from --smol-dir).
SMOL_BATCHES = {"smol-b1": 1, "smol-b8": 8}

WORKLOADS = ("forward", "train_step", "generate")

# Workload shapes (the random-weight configs run at batch 8).
BATCH = 8
SEQ = 128
PROMPT_LEN = 16
NEW_TOKENS = 64

# Default (warmup, iters) per config and workload.
DEFAULT_REPS = {
    "1m": {"forward": (2, 10), "train_step": (2, 10), "generate": (1, 5)},
    "25m": {"forward": (1, 5), "train_step": (1, 4), "generate": (1, 3)},
    "smol": {"forward": (1, 3), "train_step": (1, 3), "generate": (1, 3)},
    "135m": {"forward": (1, 3), "train_step": (1, 3), "generate": (1, 3)},
    "500m": {"forward": (1, 3), "train_step": (1, 3), "generate": (1, 3)},
}
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}

# Set by main() from --device: every clock read waits for the GPU first.
DEVICE = torch.device("cpu")


def synchronize():
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)
QUICK_REPS = (1, 2)

# Fixed seeds: model init and input token ids are deterministic across runs.
MODEL_SEED = 0
DATA_SEED = 1234


def build_model(name: str, smol_dir: str, dtype=torch.float32):
    """Random-init Qwen3 model with eager attention (seeded, so every
    workload starts from identical weights), or the real model from
    smol_dir, in `dtype` on DEVICE."""
    if name in SMOL_BATCHES:
        model = AutoModelForCausalLM.from_pretrained(
            smol_dir, attn_implementation="eager", dtype=dtype
        )
    else:
        config = Qwen3Config(**CONFIGS[name], **COMMON, use_cache=True)
        torch.manual_seed(MODEL_SEED)
        model = Qwen3ForCausalLM._from_config(
            config, attn_implementation="eager", dtype=dtype
        )
    model = model.to(DEVICE)
    # No EOS: generation must always produce exactly NEW_TOKENS tokens. In
    # transformers 5 passing eos_token_id=None to generate() does not override
    # the generation config, so clear it on the model itself.
    model.generation_config.eos_token_id = None
    return model


def count_params(model: torch.nn.Module) -> int:
    # model.parameters() deduplicates shared tensors, so the tied
    # embedding / lm_head weight is counted once.
    return sum(p.numel() for p in model.parameters())


def random_ids(vocab_size: int, batch: int, seq: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(DATA_SEED)
    ids = torch.randint(0, vocab_size, (batch, seq), generator=gen, dtype=torch.long)
    return ids.to(DEVICE)


def time_loop(step, warmup: int, iters: int) -> list:
    """Run `step` warmup times untimed, then `iters` times timed; return the
    per-iteration wall times in seconds."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(iters):
        synchronize()
        t0 = time.perf_counter()
        step()
        synchronize()
        times.append(time.perf_counter() - t0)
    return times


def bench_forward(model, vocab_size, batch, warmup, iters):
    model.eval()
    input_ids = random_ids(vocab_size, batch, SEQ)

    def step():
        with torch.no_grad():
            logits = model(input_ids, use_cache=False).logits
        assert logits.shape == (batch, SEQ, vocab_size)

    return batch * SEQ, time_loop(step, warmup, iters)


def bench_train_step(model, vocab_size, batch, warmup, iters):
    model.train()  # dropout is 0.0, so this only flips the module flag
    input_ids = random_ids(vocab_size, batch, SEQ)
    opt = torch.optim.Adam(
        model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.0
    )

    def step():
        # labels=input_ids: HF shifts internally and takes the mean
        # cross-entropy over the B*(S-1) predicted positions.
        loss = model(input_ids, labels=input_ids, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return batch * SEQ, time_loop(step, warmup, iters)


def bench_generate(model, vocab_size, batch, warmup, iters):
    model.eval()
    input_ids = random_ids(vocab_size, batch, PROMPT_LEN)
    attention_mask = torch.ones_like(input_ids)

    def step():
        out = model.generate(
            input_ids,
            attention_mask=attention_mask,
            do_sample=False,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            use_cache=True,
            pad_token_id=0,
        )
        assert out.shape == (batch, PROMPT_LEN + NEW_TOKENS), out.shape

    return batch * NEW_TOKENS, time_loop(step, warmup, iters)


BENCHES = {
    "forward": bench_forward,
    "train_step": bench_train_step,
    "generate": bench_generate,
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2)")
    p.add_argument("--configs", default="1m,25m,smol-b1,smol-b8",
                   help="comma-separated: 1m,25m,135m,500m,smol-b1,smol-b8")
    p.add_argument("--smol-dir", default="models/SmolLM2-135M-Instruct",
                   help="the real model (`just models` installs it)")
    p.add_argument("--workloads", default=",".join(WORKLOADS),
                   help=f"comma-separated: {','.join(WORKLOADS)}")
    p.add_argument("--out", help="write JSON results to this file")
    p.add_argument("--quick", action="store_true",
                   help=f"warmup {QUICK_REPS[0]}, iters {QUICK_REPS[1]} everywhere (smoke test)")
    p.add_argument("--warmup", type=int, help="override warmup iterations for all workloads")
    p.add_argument("--iters", type=int, help="override timed iterations for all workloads")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    p.add_argument("--dtype", default="f32", choices=sorted(DTYPES),
                   help="the weights' and activations' dtype (default f32, as mappa trains)")
    args = p.parse_args()
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    known = list(CONFIGS) + list(SMOL_BATCHES)
    unknown = [c for c in args.configs if c not in known]
    if unknown:
        p.error(f"unknown config(s) {unknown}; choose from {known}")
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in args.workloads if w not in WORKLOADS]
    if unknown or not args.workloads:
        p.error(f"--workloads {unknown or 'empty'}: choose from {list(WORKLOADS)}")
    if args.iters is not None and args.iters < 1:
        p.error("--iters must be >= 1")
    if args.warmup is not None and args.warmup < 0:
        p.error("--warmup must be >= 0")
    return args


def main():
    args = parse_args()
    global DEVICE
    DEVICE = torch.device(args.device)
    if DEVICE.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"--device {args.device}: torch {torch.__version__} sees no CUDA device")

    # Thread settings first: set_num_interop_threads must precede any parallel work.
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)

    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    log = lambda msg: print(msg, file=sys.stderr, flush=True)
    log(f"torch {versions['torch']}, transformers {versions['transformers']}, "
        f"intra-op threads {torch.get_num_threads()}, "
        f"interop threads {torch.get_num_interop_threads()}, "
        f"device {DEVICE}, dtype {args.dtype}")
    if DEVICE.type == "cuda":
        versions["cuda"] = torch.version.cuda
        versions["device"] = torch.cuda.get_device_name(DEVICE)

    results = []
    t_start = time.perf_counter()
    for cfg in args.configs:
        batch = SMOL_BATCHES.get(cfg, BATCH)
        reps = DEFAULT_REPS["smol" if cfg in SMOL_BATCHES else cfg]
        params = None
        for workload in (w for w in WORKLOADS if w in args.workloads):
            warmup, iters = QUICK_REPS if args.quick else reps[workload]
            if args.warmup is not None:
                warmup = args.warmup
            if args.iters is not None:
                iters = args.iters

            # Fresh, identically seeded model per workload so that training
            # does not perturb the weights used by the other workloads.
            model = build_model(cfg, args.smol_dir, DTYPES[args.dtype])
            vocab_size = model.config.vocab_size
            if params is None:
                params = count_params(model)
                log(f"[{cfg}] params: {params:,}")

            started = time.time()
            tokens, times = BENCHES[workload](model, vocab_size, batch, warmup, iters)
            median = statistics.median(times)
            rec = {
                "impl": "pytorch",
                "config": cfg,
                "params": params,
                "workload": workload,
                "tokens_per_iter": tokens,
                "median_s": median,
                "tokens_per_s": tokens / median,
                "iters": iters,
                "threads": args.threads,
                "device": str(DEVICE),
                "dtype": args.dtype,
                "started_unix_s": started,
                "versions": versions,
            }
            results.append(rec)
            log(f"[{cfg}] {workload:<10} median {median * 1e3:9.2f} ms  "
                f"{rec['tokens_per_s']:10.1f} tok/s  "
                f"(warmup {warmup}, iters {iters}, "
                f"min {min(times) * 1e3:.2f} ms, max {max(times) * 1e3:.2f} ms)")
            del model

    log(f"total wall time: {time.perf_counter() - t_start:.1f} s")

    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
            f.write("\n")
        log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
