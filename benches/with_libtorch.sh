#!/usr/bin/env bash
# Runs a command against the libtorch of the PyTorch wheel in `.venv-tch`
# (`just setup-tch`): what the `tch` feature (burn's LibTorch backend, through
# tch 0.22 and its torch-sys) needs to build, and its binaries to run.
#
#   benches/with_libtorch.sh cargo build --release -p mappa-benches --features tch --bin bench_json
#   benches/with_libtorch.sh target/release/bench_json --backend tch
set -euo pipefail
venv="$(cd "$(dirname "$0")/.." && pwd)/${MAPPA_TCH_VENV:-.venv-tch}"
if [ ! -x "$venv/bin/python" ]; then
    echo "with_libtorch.sh: no PyTorch at $venv (run \`just setup-tch\`)" >&2
    exit 1
fi
# torch-sys asks the Python on PATH for libtorch's headers and libraries.
export VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH" LIBTORCH_USE_PYTORCH=1
lib="$("$venv/bin/python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))' 2>/dev/null)"
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$@"
