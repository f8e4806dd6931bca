#!/usr/bin/env bash
# Two Ray nodes on one machine, run inside a fresh network namespace (`unshare --net`), so every
# address is loopback and nothing clashes with other Ray instances on the machine:
#   * an S3 server (moto): the only storage the nodes share; a proxy in front of it that fails
#     a share of the requests on demand (tests/faults.py);
#   * an MLflow tracking server (SQLite on the head, artifacts in the bucket, written through
#     the proxy);
#   * a head offering 0 CPUs (so training can only run on the worker), with the dashboard;
#   * a worker with 3 CPUs in its own mount and PID namespaces, a private tmpfs over its scratch
#     directory (a local path written on one node does not exist on the other).
# Both nodes run with token authentication, started as cluster/cluster-launcher.yaml starts them
# (RAY_AUTH_MODE=token, the token in a file named by RAY_AUTH_TOKEN_PATH). The doors are tried
# first: a job submitted without the token (refused), the same with it (accepted), and a node
# without the token trying to join (it must not).
# Then jobs are submitted with `ray job submit` (findings go to $RESULTS), side by side where they
# cannot disturb each other:
#   1. s3: the pipeline with an s3:// output; the trial's process SIGKILLs itself once after
#      epoch 2 (it must succeed); beside it, once its tables are in the bucket:
#   2. local: the pipeline with a local output (it must fail: shared storage is needed);
#   3. flaky: a sweep whose S3 requests go through the proxy, failing 30 % of them for 150 s from
#      the job's start (table reads, checkpoints, Tune's state);
#   4. node: a sweep whose trial holds after its checkpoint of epoch 2, when the worker node is
#      killed whole (its PID namespace ended, its tmpfs gone); a new worker node is started;
#      beside it a curation job (pipelines/curate.py), whose actor holds after its third shard
#      when the node goes; it is submitted again once the new node is up;
#   5. outage (submitted once the new node is up): a sweep during which the MLflow server is
#      stopped for longer than the client's (shortened) retries, then started again.
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
# A node that is gone is noticed within seconds (Ray's default: 5 missed checks of 3 s each).
export RAY_health_check_period_ms=1000 RAY_health_check_timeout_ms=1000
export RAY_health_check_failure_threshold=3
S3=5555 MLF=5556 GCS=6390 DASH=8270 PROXY=5557
export AWS_ENDPOINT_URL="http://127.0.0.1:$S3" MLFLOW_S3_ENDPOINT_URL="http://127.0.0.1:$S3"
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_DEFAULT_REGION=us-east-1
PIDS=()
WORKER_PID=""
MLF_PID=""
log() { echo "[cluster $(date +%T)] $*" >&2; }
stamp() { echo "$1 $(date +%s.%N)" >>"$RESULTS/times.txt"; }
cleanup() {
    log "cleanup"
    stop_worker
    ray stop --force >/dev/null 2>&1
    [ -n "$MLF_PID" ] && kill -KILL -- -"$MLF_PID" 2>/dev/null
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
    sleep 1
    for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null; done
    cp -r "$T/head/logs" "$RESULTS/ray-head-logs" 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT
wait_port() {
    for _ in $(seq 600); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.5
    done
    log "port $1 never opened"; return 1
}

start_mlflow() {  # its own process group (server and workers), stopped as one
    setsid env MLFLOW_S3_ENDPOINT_URL="http://127.0.0.1:$PROXY" AWS_RETRY_MODE=standard \
        AWS_MAX_ATTEMPTS=10 "$BIN/mlflow" server \
        --backend-store-uri "sqlite:///$T/head/mlflow.db" \
        --artifacts-destination s3://bucket/mlartifacts --host 127.0.0.1 --port "$MLF" \
        --workers 1 >>"$RESULTS/mlflow.log" 2>&1 &
    MLF_PID=$!
}
stop_mlflow() {
    kill -TERM -- -"$MLF_PID" 2>/dev/null
    for _ in $(seq 20); do kill -0 "$MLF_PID" 2>/dev/null || break; sleep 0.5; done
    kill -KILL -- -"$MLF_PID" 2>/dev/null
    MLF_PID=""
}

start_worker() {  # LOGNAME: a node of its own (mount and PID namespaces, a fresh tmpfs)
    unshare --mount --pid --fork --kill-child bash -c '
        mount -t tmpfs tmpfs "$1" && mkdir -p "$1/ray" || exit 1
        exec ray start --address "127.0.0.1:$2" --node-ip-address 127.0.0.1 --num-cpus 3 \
            --temp-dir "$1/ray" --block --disable-usage-stats
    ' worker "$T/wk" "$GCS" >"$RESULTS/$1.log" 2>&1 &
    WORKER_PID=$!
}
stop_worker() {  # the node goes whole: the init of its PID namespace dies, and so does all in it
    [ -n "$WORKER_PID" ] || return 0
    local init
    init="$(pgrep -P "$WORKER_PID" | head -1)"
    [ -n "$init" ] && kill -KILL "$init" 2>/dev/null
    for _ in $(seq 20); do kill -0 "$WORKER_PID" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$WORKER_PID" 2>/dev/null
    WORKER_PID=""
}
wait_nodes() {  # N: until N nodes are alive
    "$PY" - "$GCS" "$1" <<'PYEOF'
import sys, time, ray
ray.init(address=f"127.0.0.1:{sys.argv[1]}", logging_level="ERROR")
for _ in range(240):
    if len([n for n in ray.nodes() if n["Alive"]]) == int(sys.argv[2]):
        break
    time.sleep(0.5)
else:
    sys.exit(f"never {sys.argv[2]} nodes")
print(ray.cluster_resources(), file=sys.stderr)
PYEOF
}
wait_glob() {  # PATTERN [SETTLE] [COUNT]: until COUNT (1) objects match PATTERN, then SETTLE s
    "$PY" - "$1" "${2:-0}" "${3:-1}" <<'PYEOF'
import sys, time
import s3fs
fs = s3fs.S3FileSystem()
for _ in range(720):
    fs.invalidate_cache()
    if len(fs.glob(sys.argv[1])) >= int(sys.argv[3]):
        time.sleep(float(sys.argv[2]))  # a checkpoint: the rest of its folder, and its report
        sys.exit(0)
    time.sleep(0.5)
sys.exit(f"nothing ever matched {sys.argv[1]}")
PYEOF
}
listing() {  # PATTERN: each matching object's ETag and time, as JSON (a rewritten one changes)
    "$PY" - "$1" <<'PYEOF'
import json, sys
import s3fs
fs = s3fs.S3FileSystem()
fs.invalidate_cache()
found = {k: fs.info(k) for k in fs.glob(sys.argv[1])}
print(json.dumps({k: [i["ETag"], str(i["LastModified"])] for k, i in found.items()}))
PYEOF
}
checkpoint() {  # OUTPUT EPOCH: a trial's checkpoint of EPOCH (Tune numbers them from 0)
    printf 'bucket/%s/tune/trials/*/*/checkpoint_%06d/trainer.pt' "$1" "$(($2 - 1))"
}

log "S3 server and the proxy in front of it"
"$PY" -m moto.server -H 127.0.0.1 -p "$S3" >"$RESULTS/moto.log" 2>&1 & PIDS+=($!)
"$PY" -m tests.faults --listen "$PROXY" --upstream "http://127.0.0.1:$S3" --seed 1 \
    >"$RESULTS/proxy.log" 2>&1 & PIDS+=($!)
wait_port "$S3" || exit 3
wait_port "$PROXY" || exit 3
"$PY" - <<'PYEOF' || exit 3
import s3fs
s3fs.S3FileSystem().mkdir("bucket")
PYEOF

log "MLflow server"
start_mlflow

log "token and head"
# As cluster/cluster-launcher.yaml starts its nodes: one token, generated once, in a file every
# node reads (RAY_AUTH_TOKEN_PATH), token authentication on (RAY_AUTH_MODE=token). Not in Ray's
# default place (~/.ray/auth_token): a process without RAY_AUTH_TOKEN_PATH has no token.
(umask 077 && mkdir -p "$T/token" && openssl rand -hex 32 >"$T/token/auth_token") || exit 4
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$T/token/auth_token"
ray start --head --num-cpus 0 --node-ip-address 127.0.0.1 --port "$GCS" \
    --dashboard-host 127.0.0.1 --dashboard-port "$DASH" --temp-dir "$T/head" \
    --disable-usage-stats >"$RESULTS/head.log" 2>&1 || { cat "$RESULTS/head.log" >&2; exit 4; }

log "worker"
start_worker worker
wait_port "$MLF" || exit 5
wait_nodes 2 || exit 6
no_token() { env -u RAY_AUTH_MODE -u RAY_AUTH_TOKEN_PATH "$@"; }

log "the doors: a node and a submission without the token, a submission with it"
# A node without the token tries to join (in the background, while the jobs below run).
no_token timeout 120 ray start --address "127.0.0.1:$GCS" --node-ip-address 127.0.0.1 \
    --num-cpus 1 --temp-dir "$T/in" --block --disable-usage-stats >"$RESULTS/intruder.log" 2>&1 &
intruder=$!
HELLO=(-- python -c "print('hello from the cluster')")
no_token ray job submit --address "http://127.0.0.1:$DASH" "${HELLO[@]}" \
    >"$RESULTS/submit-no-token.log" 2>&1
echo $? >"$RESULTS/submit-no-token.rc"
ray job submit --address "http://127.0.0.1:$DASH" "${HELLO[@]}" >"$RESULTS/submit-token.log" 2>&1
echo $? >"$RESULTS/submit-token.rc"

submit() {  # SCRIPT CONFIG OUTPUT LOGFILE [--runtime-env-json JSON] [extra --set ...]
    local script="$1" config="$2" output="$3" logfile="$4" env=()
    shift 4
    if [ "${1:-}" = "--runtime-env-json" ]; then env=("$1" "$2"); shift 2; fi
    ray job submit --address "http://127.0.0.1:$DASH" --working-dir . "${env[@]}" -- \
        python "$script" --config "$config" --verbose \
        --set "mlflow.tracking_uri=http://127.0.0.1:$MLF" --set "output=$output" "$@" \
        >"$logfile" 2>&1
}
finish() {  # NAME PID START: wait for a job in the background, record its exit code and time
    wait "$2"; echo $? >"$RESULTS/job-$1.rc"
    echo "$(( $(date +%s) - $3 ))" >"$RESULTS/job-$1.seconds"
}
PIPELINE=(pipelines/full.py tests/multinode/config.yaml)
DRILL=(pipelines/sweep.py tests/multinode/sweep.yaml)

log "jobs 1-3: s3 output; local output and flaky object store once the tables are there"
start=$(date +%s)
# The trial's process SIGKILLs itself once after reporting the checkpoint of epoch 2 (the marker
# lives on the worker's private tmpfs); Tune restarts it from the checkpoint in the bucket.
FAULT="{\"env_vars\": {\"ASYMVLM_FAULT_INJECTION\": \"epoch=2,rank=0,marker=$T/wk/killed\"}}"
submit "${PIPELINE[@]}" s3://bucket/run "$RESULTS/job-s3.log" --runtime-env-json "$FAULT" &
s3_job=$!
wait_glob bucket/run/tables/synthetic/manifest.json
# The inputs are in the bucket, so the only fault of this job is its local output.
submit "${PIPELINE[@]}" "$T/head/local-run" "$RESULTS/job-local.log" \
    --set sweeps.0.embeddings=s3://bucket/run/tables/synthetic \
    --set evaluations.0.data=s3://bucket/run/tables/synthetic:test &
local_job=$!
FLAKY="{\"env_vars\": {\"AWS_ENDPOINT_URL\": \"http://127.0.0.1:$PROXY\"}}"
"$PY" -c "import urllib.request as u; u.urlopen(u.Request('http://127.0.0.1:$PROXY/__faults__?share=0.3&seconds=150', method='POST'))"
submit "${DRILL[@]}" s3://bucket/flaky "$RESULTS/job-flaky.log" --runtime-env-json "$FLAKY" \
    --set mlflow.experiment=drill-flaky &
flaky_job=$!
finish local $local_job "$start"
finish flaky $flaky_job "$start"
finish s3 $s3_job "$start"
wait $intruder; echo $? >"$RESULTS/intruder.rc"
"$PY" - "$GCS" >"$RESULTS/nodes.json" <<'PYEOF'
import json, sys, ray
ray.init(address=f"127.0.0.1:{sys.argv[1]}", logging_level="ERROR")
print(json.dumps([n["NodeID"] for n in ray.nodes()]))  # every node that ever registered
PYEOF

log "a pool in the bucket (clip-retrieval's layout) from the pipeline's tables, to curate"
"$PY" - <<'PYEOF' || exit 7
import io
import numpy as np, pyarrow as pa, pyarrow.parquet as pq, s3fs
from asymvlm.tables import read_split
split = read_split("s3://bucket/run/tables/synthetic", "train")
fs = s3fs.S3FileSystem()
image = split.image_embeddings[np.asarray(split.text_image_index)]
for i, rows in enumerate(np.array_split(np.arange(len(split.texts)), 12)):
    for kind, array in (("text_emb", split.text_embeddings), ("img_emb", image)):
        buffer = io.BytesIO()
        np.save(buffer, array[rows].astype(np.float16))
        fs.pipe(f"bucket/pool/{kind}/{kind}_{i}.npy", buffer.getvalue())
    meta = pa.table({"key": [split.caption_ids[r] for r in rows], "caption": [split.texts[r] for r in rows]})
    with fs.open(f"bucket/pool/metadata/metadata_{i}.parquet", "wb") as out:
        pq.write_table(meta, out)
PYEOF
curate() {  # LOGFILE [--runtime-env-json JSON]: the curation job of tests/multinode/curate.yaml
    local logfile="$1"
    shift
    ray job submit --address "http://127.0.0.1:$DASH" --working-dir . "$@" -- \
        python pipelines/curate.py --config tests/multinode/curate.yaml \
        --set "tracking_uri=http://127.0.0.1:$MLF" >"$logfile" 2>&1
}

log "job 4: the worker node is lost mid-trial, and mid-curation"
start=$(date +%s)
# The curation job's actor holds after writing its third shard, when the node goes.
HOLD_CURATE="{\"env_vars\": {\"ASYMVLM_FAULT_INJECTION\": \"shards=3,action=pause,seconds=300,marker=$T/wk/held-curate\"}}"
curate "$RESULTS/job-curate-lost.log" --runtime-env-json "$HOLD_CURATE" &
curate_lost=$!
HOLD="{\"env_vars\": {\"ASYMVLM_FAULT_INJECTION\": \"epoch=2,action=pause,seconds=120,marker=$T/wk/held\"}}"
submit "${DRILL[@]}" s3://bucket/node "$RESULTS/job-node.log" --runtime-env-json "$HOLD" \
    --set mlflow.experiment=drill-node &
node_job=$!
if wait_glob "$(checkpoint node 2)" 3 && wait_glob "bucket/curated/scores/*.parquet" 1 3; then
    listing "bucket/curated/scores/*.parquet" >"$RESULTS/curated-before.json"
    stamp node-killed
    log "the worker node goes"
    stop_worker
    sleep 5
    log "a new worker node"
    start_worker worker2
    wait_nodes 2 && stamp node-joined
fi
finish curate-lost $curate_lost "$start"
log "the curation job again, once the new node is up"
curate "$RESULTS/job-curate.log" &
curate_again=$!

log "job 5: the tracking server goes away mid-sweep"
start5=$(date +%s)
SHORT="{\"env_vars\": {\"MLFLOW_HTTP_REQUEST_MAX_RETRIES\": \"1\", \"MLFLOW_HTTP_REQUEST_TIMEOUT\": \"10\", \"MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR\": \"1\", \"ASYMVLM_FAULT_INJECTION\": \"epoch=1,action=pause,seconds=8,marker=$T/wk/held-outage\"}}"
submit "${DRILL[@]}" s3://bucket/outage "$RESULTS/job-outage.log" --runtime-env-json "$SHORT" \
    --set mlflow.experiment=drill-outage --set "seeds=[0, 1]" &
outage_job=$!
if wait_glob "$(checkpoint outage 1)" 3; then
    log "the MLflow server stops"
    stamp mlflow-stopped
    stop_mlflow
    sleep 30
    log "the MLflow server starts again"
    start_mlflow
    wait_port "$MLF" && stamp mlflow-started
fi
finish node $node_job "$start"
finish outage $outage_job "$start5"
finish curate $curate_again "$start5"
listing "bucket/curated/scores/*.parquet" >"$RESULTS/curated-after.json"
ray list jobs --address "http://127.0.0.1:$DASH" --format json >"$RESULTS/jobs.json" 2>/dev/null

log "collect"
"$PY" tests/multinode/collect.py "$RESULTS" "http://127.0.0.1:$MLF" "http://127.0.0.1:$PROXY"
log "done"
