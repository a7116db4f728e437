#!/usr/bin/env bash
# Weightstream against PyTorch, from a fresh clone, in one command:
#   bash bench/run.sh [--quick] [--steps N] [--runs N]
#   bash bench/run.sh --only-llama [--steps N] [--runs N]   (Llama-shaped: bench/llama.py -> bench/RESULTS-llama.md)
#   bash bench/run.sh --only-larger [--rounds N] [--skip-100m] [--skip-1b] [--with-3b] [--job J] (larger than memory:
#       bench/larger.py -> bench/RESULTS-larger.md; the 1 B pair takes 12–30 min, the 3 B run 15–60)
# Builds wsctl (release), creates bench/.venv with PyTorch from PyPI unless it already imports, then runs
# bench/harness.py, which writes bench/RESULTS.md, bench/results.json and bench/speedup.svg.
# Everything runs under `nice` (BENCH_NICE, default 10) so a shared machine stays usable.
set -euo pipefail
cd "$(dirname "$0")/.."
NICE="${BENCH_NICE:-10}"
PYTHON="${PYTHON:-python3}"
VENV=bench/.venv

echo "[bench] building wsctl (cargo build --release -p wsctl)" >&2
nice -n "$NICE" cargo build --release --quiet -p wsctl

# The Llama section runs transformers' LlamaForCausalLM, from the venv models/setup.sh prepares.
if [[ "${1:-}" == "--only-llama" ]]; then
    shift
    bash models/setup.sh >&2
    exec nice -n "$NICE" models/.venv/bin/python bench/llama.py "$@"
fi

if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
    echo "[bench] creating $VENV with PyTorch from PyPI (several GB the first time)" >&2
    "$PYTHON" -m venv "$VENV"
    nice -n "$NICE" "$VENV/bin/pip" install --quiet --disable-pip-version-check -r bench/requirements.txt
    "$VENV/bin/python" -c "import torch; print('[bench] torch', torch.__version__)" >&2
fi

if [[ "${1:-}" == "--only-larger" ]]; then
    shift
    exec nice -n "$NICE" "$VENV/bin/python" bench/larger.py "$@"
fi

exec nice -n "$NICE" "$VENV/bin/python" bench/harness.py "$@"
