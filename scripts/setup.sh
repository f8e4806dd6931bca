#!/usr/bin/env bash
# Create ./.venv and install asymvlm with its dev extras.
# Torch first: where no torch is present we install the pinned 2.13.0 (a CPU build is on local
# disk on our dev/CI machines; elsewhere pip resolves it from PyPI), so that the `torch>=2.4`
# range in pyproject.toml is already satisfied and pip never pulls a second, multi-GB build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
"$VPY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if ! "$VPY" -c "import torch" >/dev/null 2>&1; then
  echo "[setup] installing torch==2.13.0"
  "$VPY" -m pip install -q "torch==2.13.0" 2>&1 | grep -v "is ignored" || true
fi
echo "[setup] installing asymvlm[dev]"
"$VPY" -m pip install -q -e ".[dev]" 2>&1 | grep -v "is ignored" || true
"$VPY" -c "import asymvlm, torch, ray; print(f'[setup] ok: asymvlm {asymvlm.__version__}, torch {torch.__version__}, ray {ray.__version__}')"
