#!/usr/bin/env bash
# Runs a command against the libtorch of the PyTorch wheel in `.venv-tch`
# (`just setup-tch`): what the `tch` feature (burn's LibTorch backend, through
# tch 0.22 and its torch-sys) needs to build, and its binaries to run.
#
#   benches/with_libtorch.sh cargo build --release -p mappa-benches --features tch --bin bench_json
#   benches/with_libtorch.sh target/release/bench_json --backend tch
set -euo pipefail
venv="$(cd "$(dirname "$0")/.." && pwd)/.venv-tch"
libs=("$venv"/lib/python3*/site-packages/torch/lib)
if [ ! -x "$venv/bin/python" ] || [ ! -d "${libs[0]}" ]; then
    echo "with_libtorch.sh: no PyTorch in $venv (run \`just setup-tch\`)" >&2
    exit 1
fi
# torch-sys asks the Python on PATH for libtorch's headers and libraries;
# the binaries find libtorch's shared libraries on LD_LIBRARY_PATH.
export VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH" LIBTORCH_USE_PYTORCH=1
export LD_LIBRARY_PATH="${libs[0]}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$@"
