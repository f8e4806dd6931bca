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
LOG=.venv/setup.log
: > "$LOG"
pip_install() {
  if ! "$VPY" -m pip install "$@" >>"$LOG" 2>&1; then
    echo "[setup] pip install $* failed; last lines of $LOG:" >&2
    tail -n 30 "$LOG" >&2
    exit 1
  fi
}
if ! "$VPY" -c "import torch" >/dev/null 2>&1; then
  echo "[setup] installing torch==2.13.0"
  pip_install "torch==2.13.0"
fi
echo "[setup] installing asymvlm[dev] (log: $LOG)"
pip_install -e ".[dev]"
"$VPY" -c "import asymvlm, torch, ray; print(f'[setup] ok: asymvlm {asymvlm.__version__}, torch {torch.__version__}, ray {ray.__version__}')"
