#!/usr/bin/env bash
# The Python package and what its tests need, in the venv models/setup.sh made (models/.venv: PyTorch and
# transformers, which from_torch/to_transformers and the notebook use): python/requirements-test.txt, then
# `pip install ./python`, which builds wsctl through maturin in the workspace's target folder (so after
# `cargo build --release` it only links) and puts it on the venv's PATH. Idempotent; prints the venv's python.
set -euo pipefail
cd "$(dirname "$0")/.."
bash models/setup.sh >/dev/null
PY="$(cd models/.venv && pwd)/bin/python"
"$PY" -m pip install --quiet --disable-pip-version-check -r python/requirements-test.txt
"$PY" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps ./python
echo "$PY"
