#!/usr/bin/env bash
# Scripted check of the cluster path on this machine: a local Ray head, then
#   ray job submit --address http://127.0.0.1:8265 --working-dir . -- \
#       python pipelines/full.py --config configs/demo.yaml
# Usage: bash scripts/check_job_submit.sh [OUTPUT_DIR] [extra pipelines/full.py args...]
set -euo pipefail
cd "$(dirname "$0")/.."
source .venv/bin/activate
OUT="$(python -c 'import os,sys; print(os.path.abspath(sys.argv[1]))' "${1:-runs/demo-job}")"
shift || true
HIERARCAPS="${ASYMVLM_HIERARCAPS:-$(python -c 'from asymvlm.data.demo_sets import find_hierarcaps as f; print(f() or "")')}"
if [ -z "$HIERARCAPS" ]; then
    echo "HierarCaps not found: set ASYMVLM_HIERARCAPS" >&2
    exit 2
fi
ray stop --force >/dev/null 2>&1 || true
ray start --head --num-cpus 2 --dashboard-host 127.0.0.1 --disable-usage-stats
trap 'ray stop --force >/dev/null 2>&1 || true' EXIT
# Ray >= 2.59 protects local clusters with a token; the client sends it in token mode.
RAY_AUTH_TOKEN="$(ray get-auth-token 2>/dev/null | tail -1 || true)"
export RAY_AUTH_TOKEN RAY_AUTH_MODE=token
# The job runs in a copy of this folder: data and outputs are given as absolute paths.
ray job submit --address http://127.0.0.1:8265 --working-dir . \
    --runtime-env-json "{\"env_vars\": {\"ASYMVLM_HIERARCAPS\": \"$HIERARCAPS\"}}" \
    -- python pipelines/full.py --config configs/demo.yaml --output "$OUT" "$@"
test -s "$OUT/report/report.md"
echo "job finished: $OUT/report/report.md"
