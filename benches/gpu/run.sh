#!/usr/bin/env bash
# mappa's GPU check in one call: the GPU bundle's entry point (`just
# gpu-bundle` builds the bundle, `just gpu-checks` runs this from a checkout).
#
#   ./run.sh [OUT]        (default OUT: ./results)
#
# 1. finds the NVIDIA driver and NVRTC (the CUDA toolkit's, or PyTorch's
#    NVIDIA wheels') and links them under the names cudarc looks for;
# 2. runs `mappa doctor` on the GPU (parity with the CPU, training steps,
#    memory against the plan, throughput and MFU, a tiny run, determinism);
# 3. where `python3 -c 'import torch'` works: the same workloads in PyTorch
#    on the same GPU (f32 and bf16; with CUDA, where torch sees the GPU) for
#    burn/PyTorch ratios, and the
#    checkpoint mappa trained and saved on the GPU loaded into transformers;
# 4. writes OUT/summary.md (one table) beside the JSON files.
#
# Time budget on an H100, at most 6 minutes in all: the doctor 240 s, the
# PyTorch workloads 75 s, the HF parity 25 s; each part runs under its own
# `timeout`, and the doctor writes each check's line as it finishes, so a
# part cut short still leaves what it measured.
#
# Environment: MAPPA_BIN (default: ./mappa, unpacked from ./mappa.xz),
# MAPPA_BACKEND (cuda; `cpu` runs the same flow on the CPU, as CI does),
# MAPPA_DOCTOR_ARGS (more `mappa doctor` arguments, e.g. `--only parity`),
# PYTHON (default python3).
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$here
# From a checkout (`just gpu-checks`, CI) the repository is two levels up.
[ -d "$root/experiments" ] || root=$(cd "$here/../.." && pwd)
out=$(mkdir -p "${1:-$here/results}" && cd "${1:-$here/results}" && pwd)
backend=${MAPPA_BACKEND:-cuda}
python=${PYTHON:-python3}
mappa=${MAPPA_BIN:-$here/mappa}
log() { echo "== $*" | tee -a "$out/run.log"; }
: > "$out/run.log"

if [ ! -x "$mappa" ] && [ -f "$here/mappa.xz" ]; then
    log "unpacking mappa.xz"
    "$python" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
        "$here/mappa.xz" "$here/mappa" && chmod +x "$here/mappa"
fi
[ -x "$mappa" ] || { echo "run.sh: no mappa binary at $mappa (set MAPPA_BIN)" >&2; exit 2; }

# The first file matching $2 in the folders $3..., for library $1.
find_lib() {
    local what=$1 pattern=$2 dir f
    shift 2
    for dir in "$@"; do
        [ -d "$dir" ] || continue
        f=$(find -L "$dir" -maxdepth 1 -name "$pattern" 2>/dev/null | sort -V | tail -1)
        [ -n "$f" ] && { echo "$f"; return 0; }
    done
    echo "run.sh: $what not found in: $*" >&2
    return 1
}

if [ "$backend" = cuda ]; then
    torch_lib=$("$python" -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null || true)
    site=$(dirname "${torch_lib:-/nonexistent}")
    cuda_home=${CUDA_HOME:-${CUDA_PATH:-/usr/local/cuda}}
    # cudarc (pinned to CUDA 12.8's API) looks for libcuda.so, libnvrtc.so,
    # libnvrtc.so.12 and a few more, not libnvrtc.so.13: link the plain
    # names to what is found, and keep NVRTC's own folder (its builtins).
    # What is not found is said here, and the doctor then stops with the
    # names it searched (environment.json).
    mkdir -p "$out/lib"
    if driver=$(find_lib "the NVIDIA driver (libcuda.so.1)" 'libcuda.so.1' \
        $(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 /{print $NF}' | xargs -r -n1 dirname) \
        /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/nvidia/lib64 /usr/lib/wsl/lib); then
        ln -sf "$driver" "$out/lib/libcuda.so"
        LD_LIBRARY_PATH="$(dirname "$driver")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        log "driver $driver"
    fi
    if nvrtc=$(find_lib "NVRTC (libnvrtc.so.*)" 'libnvrtc.so.[0-9]*' \
        "$cuda_home/lib64" "$cuda_home/targets/x86_64-linux/lib" \
        "$site"/nvidia/cu13/lib "$site"/nvidia/cuda_nvrtc/lib /usr/lib/x86_64-linux-gnu); then
        ln -sf "$nvrtc" "$out/lib/libnvrtc.so"
        LD_LIBRARY_PATH="$(dirname "$nvrtc")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        log "NVRTC $nvrtc"
    fi
    export LD_LIBRARY_PATH="$out/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$out/run.log"
fi

# The sandbox's Python (the tiny run's tool calls): as root, one outside
# /root that its unprivileged uid can run.
if [ "$(id -u)" = 0 ] && [ -z "${MAPPA_SANDBOX_PYTHON:-}" ] && [ -x /usr/bin/python3 ]; then
    export MAPPA_SANDBOX_PYTHON=/usr/bin/python3
fi
chmod 0711 "$out"

cd "$root"
log "mappa doctor --backend $backend (at most 240 s)"
# shellcheck disable=SC2086
timeout 240 "$mappa" doctor --backend "$backend" --out "$out/doctor" ${MAPPA_DOCTOR_ARGS:-} 2>&1 | tee -a "$out/run.log"
doctor_rc=${PIPESTATUS[0]}

torch_rc=skipped
hf_rc=skipped
torch_check='import torch, transformers'
[ "$backend" = cuda ] && torch_check="$torch_check; assert torch.cuda.is_available()"
if "$python" -c "$torch_check" 2>/dev/null; then
    device=cpu
    configs=1m
    [ "$backend" = cuda ] && device=cuda configs=25m,135m,500m
    log "PyTorch on $device: the doctor's workloads in f32 and bf16 (at most 75 s)"
    torch_rc=0
    for dtype in f32 bf16; do
        timeout 35 "$python" benches/torch_bench.py --device "$device" --dtype "$dtype" --threads 2 \
            --configs "$configs" --warmup 1 --iters 3 --out "$out/torch-$dtype.json" 2>&1 | tee -a "$out/run.log"
        [ "${PIPESTATUS[0]}" = 0 ] || torch_rc=1
    done
    log "transformers loads the checkpoint mappa trained on the device (at most 25 s)"
    timeout 25 "$python" benches/gpu/hf_parity.py --device "$device" "$out/doctor/hf-export" \
        --out "$out/hf-parity.json" 2>&1 | tee -a "$out/run.log"
    hf_rc=${PIPESTATUS[0]}
else
    log "no PyTorch here ($python -c '$torch_check' failed): the PyTorch comparison and HF parity are skipped"
fi

"$python" benches/gpu/summarise.py "$out" --doctor-rc "$doctor_rc" --torch "$torch_rc" --hf "$hf_rc" | tee -a "$out/run.log"
summary_rc=${PIPESTATUS[0]}
[ "$doctor_rc" = 0 ] && [ "$summary_rc" = 0 ]
