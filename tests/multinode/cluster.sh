#!/usr/bin/env bash
# Two Ray nodes on one machine, run inside a fresh network namespace (`unshare --net`), so every
# address is loopback and nothing clashes with other Ray instances on the machine:
#   * an S3 server (moto): the only storage the nodes share;
#   * an MLflow tracking server (SQLite on the head, artifacts in the bucket);
#   * a head offering 0 CPUs (so training can only run on the worker), with the dashboard;
#   * a worker with 2 CPUs in its own mount and PID namespaces, a private tmpfs over its scratch
#     directory (a local path written on one node does not exist on the other).
# Then the pipeline is submitted with `ray job submit`, once with an s3:// output (must succeed)
# and once with a local output (must fail: shared storage is needed). Findings go to $RESULTS.
# Usage (from the repository root):
#   unshare --net --pid --fork --mount-proc bash tests/multinode/cluster.sh RESULTS_DIR
# Its own PID namespace (with /proc remounted) keeps `ray stop` from seeing, let alone stopping,
# any other Ray on the machine; RAY_TMPDIR keeps Ray's "current cluster" file private.
set -uo pipefail
RESULTS="$1"
mkdir -p "$RESULTS"
REPO="$(pwd)"
PY="$REPO/.venv/bin/python"
BIN="$REPO/.venv/bin"
ip link set lo up
T="$(mktemp -d /tmp/amn.XXXXXX)"   # short: Ray's socket paths must fit
mkdir -p "$T/head" "$T/wk" "$T/home"
export HOME="$T/home"              # a private ~/.ray (auth token) for this cluster
export RAY_TMPDIR="$T/tmp" && mkdir -p "$RAY_TMPDIR"
export PATH="$BIN:$PATH"
export RAY_USAGE_STATS_ENABLED=0
S3=5555 MLF=5556 GCS=6390 DASH=8270
export AWS_ENDPOINT_URL="http://127.0.0.1:$S3" MLFLOW_S3_ENDPOINT_URL="http://127.0.0.1:$S3"
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_DEFAULT_REGION=us-east-1
PIDS=()
WORKER_PID=""
log() { echo "[cluster $(date +%T)] $*" >&2; }
cleanup() {
    log "cleanup"
    if [ -n "$WORKER_PID" ]; then   # the worker's PID namespace: its init ends, all its processes go
        kill -TERM "$WORKER_PID" 2>/dev/null
        for _ in $(seq 20); do kill -0 "$WORKER_PID" 2>/dev/null || break; sleep 0.5; done
        kill -KILL "$WORKER_PID" 2>/dev/null
    fi
    ray stop --force >/dev/null 2>&1
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
    sleep 1
    for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null; done
    cp -r "$T/head/logs" "$RESULTS/ray-head-logs" 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT
wait_port() {
    for _ in $(seq 120); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.5
    done
    log "port $1 never opened"; return 1
}

log "S3 server"
"$PY" -m moto.server -H 127.0.0.1 -p "$S3" >"$RESULTS/moto.log" 2>&1 & PIDS+=($!)
wait_port "$S3" || exit 3
"$PY" - <<'PYEOF' || exit 3
import s3fs
s3fs.S3FileSystem().mkdir("bucket")
PYEOF

log "MLflow server"
"$BIN/mlflow" server --backend-store-uri "sqlite:///$T/head/mlflow.db" \
    --artifacts-destination s3://bucket/mlartifacts --host 127.0.0.1 --port "$MLF" \
    --workers 1 >"$RESULTS/mlflow.log" 2>&1 & PIDS+=($!)

log "token and head"
ray get-auth-token --generate >/dev/null 2>&1
RAY_AUTH_TOKEN="$(ray get-auth-token 2>/dev/null | tail -1)"
export RAY_AUTH_TOKEN RAY_AUTH_MODE=token
ray start --head --num-cpus 0 --node-ip-address 127.0.0.1 --port "$GCS" \
    --dashboard-host 127.0.0.1 --dashboard-port "$DASH" --temp-dir "$T/head" \
    --disable-usage-stats >"$RESULTS/head.log" 2>&1 || { cat "$RESULTS/head.log" >&2; exit 4; }

log "worker"
unshare --mount --pid --fork bash -c '
    mount -t tmpfs tmpfs "$1" && mkdir -p "$1/ray" || exit 1
    exec ray start --address "127.0.0.1:$2" --node-ip-address 127.0.0.1 --num-cpus 2 \
        --resources "{\"trainer\": 2}" --temp-dir "$1/ray" --block --disable-usage-stats
' worker "$T/wk" "$GCS" >"$RESULTS/worker.log" 2>&1 &
WORKER_PID=$!
wait_port "$MLF" || exit 5
"$PY" - "$GCS" <<'PYEOF' || exit 6
import sys, time, ray
ray.init(address=f"127.0.0.1:{sys.argv[1]}", logging_level="ERROR")
for _ in range(120):
    if len([n for n in ray.nodes() if n["Alive"]]) == 2:
        break
    time.sleep(0.5)
else:
    sys.exit("the worker never joined")
print(ray.cluster_resources(), file=sys.stderr)
PYEOF

submit() {  # OUTPUT LOGFILE [--runtime-env-json JSON] [extra --set ...]
    local output="$1" logfile="$2" env=()
    shift 2
    if [ "${1:-}" = "--runtime-env-json" ]; then env=("$1" "$2"); shift 2; fi
    ray job submit --address "http://127.0.0.1:$DASH" --working-dir . "${env[@]}" -- \
        python pipelines/full.py --config tests/multinode/config.yaml --output "$output" \
        --verbose --set "mlflow.tracking_uri=http://127.0.0.1:$MLF" "$@" >"$logfile" 2>&1
}
log "job: s3 output"
start=$(date +%s)
# The trial's process SIGKILLs itself once after reporting the checkpoint of epoch 2 (the marker
# lives on the worker's private tmpfs); Tune restarts it from the checkpoint in the bucket.
FAULT="{\"env_vars\": {\"ASYMVLM_FAULT_INJECTION\": \"epoch=2,rank=0,marker=$T/wk/killed\"}}"
submit s3://bucket/run "$RESULTS/job-s3.log" --runtime-env-json "$FAULT"
echo $? >"$RESULTS/job-s3.rc"
echo $(( $(date +%s) - start )) >"$RESULTS/job-s3.seconds"
log "job: local output"
# The inputs stay in the bucket (the first job wrote them), so the only fault is the local
# output.
submit "$T/head/local-run" "$RESULTS/job-local.log" \
    --set sweeps.0.embeddings=s3://bucket/run/tables/synthetic \
    --set evaluations.0.data=s3://bucket/run/tables/synthetic:test; echo $? >"$RESULTS/job-local.rc"
ray list jobs --address "http://127.0.0.1:$DASH" --format json >"$RESULTS/jobs.json" 2>/dev/null

log "collect"
"$PY" - "$RESULTS" "http://127.0.0.1:$MLF" <<'PYEOF'
import json, sys
import s3fs
from mlflow import MlflowClient
out, uri = sys.argv[1], sys.argv[2]
fs = s3fs.S3FileSystem()
keys = fs.find("bucket")
# The history in the last checkpoint of the (killed and resumed) training run.
last = sorted(k for k in keys if k.startswith("bucket/run/sweeps/tiny/tune/trials/")
              and k.endswith("/history.jsonl"))
history = [json.loads(line) for line in fs.cat_file(last[-1]).decode().splitlines()
           if line.strip()] if last else []
client = MlflowClient(uri)
runs = []
for exp in client.search_experiments():
    for run in client.search_runs([exp.experiment_id]):
        runs.append({"experiment": exp.name, "run_id": run.info.run_id,
                     "status": run.info.status, "artifact_uri": run.info.artifact_uri,
                     "tags": dict(run.data.tags)})
json.dump({"keys": keys, "runs": runs, "history": history}, open(f"{out}/found.json", "w"), indent=1)
PYEOF
log "done"
