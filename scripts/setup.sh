#!/usr/bin/env bash
# Create ./.venv and install asymvlm with its dev extras, every package at the version pinned in
# constraints.txt (the same pins as the cluster image, cluster/Dockerfile).
# Torch first: where no torch is present we install the pinned torch (a CPU build is on local
# disk on our dev/CI machines; elsewhere pip resolves it from PyPI). The pin has no local label
# (torch==2.13.0), so 2.13.0+cpu and PyPI's CUDA build both satisfy it, and pip never pulls a
# second, multi-GB build when one of them is already installed (a torch of another version in
# an existing .venv is replaced by the pinned one).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
LOG=.venv/setup.log
: > "$LOG"
pip_install() {
  if ! "$VPY" -m pip install -c constraints.txt "$@" >>"$LOG" 2>&1; then
    echo "[setup] pip install -c constraints.txt $* failed; last lines of $LOG:" >&2
    tail -n 30 "$LOG" >&2
    exit 1
  fi
}
TORCH_PIN=$(grep -E '^torch==' constraints.txt) || { echo "[setup] constraints.txt pins no torch" >&2; exit 1; }
if ! "$VPY" -c "import torch" >/dev/null 2>&1; then
  echo "[setup] installing $TORCH_PIN"
  pip_install torch
fi
echo "[setup] installing asymvlm[dev] with constraints.txt (log: $LOG)"
pip_install -e ".[dev]"
# The bayesvlm extra (laplace-torch) without its declared dependencies: laplace-torch and
# backpack-for-pytorch declare torchvision, which they do not import at run time, and PyPI's
# torchvision (a CUDA build) beside a CPU torch fails to load and breaks transformers' CLIP.
# The packages it does need, all pinned in constraints.txt:
echo "[setup] installing the bayesvlm extra (laplace-torch) without torchvision"
pip_install --no-deps laplace-torch backpack-for-pytorch curvlinops-for-pytorch asdfghjkl \
  torchmetrics lightning-utilities opt-einsum einops einconv linear_operator unfoldNd
"$VPY" -c "import asymvlm, torch, ray; print(f'[setup] ok: asymvlm {asymvlm.__version__}, torch {torch.__version__}, ray {ray.__version__}')"
