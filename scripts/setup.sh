#!/usr/bin/env bash
# Create ./.venv and install asymvlm[dev] (the core, every extra and the dev tools), every
# package at the version pinned in constraints.txt (the same pins as the cluster image,
# cluster/Dockerfile).
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
# torchvision (open_clip's dependency) beside a torch it was not built for: PyPI's torchvision
# is a CUDA build, and beside the CPU torch of our machines its C++ operators cannot load, which
# makes `import torchvision` fail (and with it transformers' CLIP and open_clip). Then install
# scripts/torchvision_guard.py as a start-up hook, which lets its Python half (the transforms)
# import; with a matching torchvision (a CUDA torch, or both from the CPU index) nothing is done.
SITE=$("$VPY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
rm -f "$SITE/_asymvlm_torchvision_guard.py" "$SITE/_asymvlm_torchvision_guard.pth"
if ! TV_ERROR=$("$VPY" -c "import torchvision" 2>&1); then
  if [[ "$TV_ERROR" == *"operator torchvision::nms does not exist"* ]]; then
    echo "[setup] torchvision's C++ operators do not load with this torch: installing the guard"
    cp scripts/torchvision_guard.py "$SITE/_asymvlm_torchvision_guard.py"
    echo "import _asymvlm_torchvision_guard" > "$SITE/_asymvlm_torchvision_guard.pth"
  fi
  "$VPY" -c "import torchvision, open_clip" >/dev/null || {
    echo "[setup] torchvision does not import with this torch; see the error above" >&2; exit 1; }
fi
# The bayesvlm extra (laplace-torch) without its declared dependencies (they would pull more
# than it uses). The packages it does need, all pinned in constraints.txt:
echo "[setup] installing the bayesvlm extra (laplace-torch)"
pip_install --no-deps laplace-torch backpack-for-pytorch curvlinops-for-pytorch asdfghjkl \
  torchmetrics lightning-utilities opt-einsum einops einconv linear_operator unfoldNd
# The search page is tested in a real headless browser: Debian's chromium and its driver, where
# they are missing and apt-get can install them (as root, or through sudo without a password).
if ! command -v chromedriver >/dev/null 2>&1; then
  AS_ROOT=()
  if [ "$(id -u)" != 0 ]; then
    if sudo -n true 2>/dev/null; then AS_ROOT=(sudo -n); else AS_ROOT=(none); fi
  fi
  if [ "${AS_ROOT[*]}" != none ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing chromium and chromium-driver (the search page's browser tests)"
    APT=("${AS_ROOT[@]}" env DEBIAN_FRONTEND=noninteractive apt-get)
    if ! { "${APT[@]}" update -q && "${APT[@]}" install -y -q chromium chromium-driver; } >>"$LOG" 2>&1; then
      echo "[setup] apt-get could not install chromium; last lines of $LOG:" >&2
      tail -n 10 "$LOG" >&2
      exit 1
    fi
  else
    echo "[setup] no chromium here and no apt-get to install it: the browser test will fail" >&2
  fi
fi
"$VPY" -c "import asymvlm, torch, ray, open_clip; print(f'[setup] ok: asymvlm {asymvlm.__version__}, torch {torch.__version__}, ray {ray.__version__}, open_clip {open_clip.__version__}')"
