"""What the two-node drills left, gathered for tests/test_multinode.py (run by cluster.sh at the
end, while the servers still run): ``found.json`` in the results folder, and a copy of the
synthetic tables the jobs trained on (the test trains on them without Ray, for reference).

    python tests/multinode/collect.py RESULTS MLFLOW_URI PROXY_URL
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request

import cloudpickle
import pyarrow.parquet as pq
import s3fs
from mlflow import MlflowClient


def _readable(fs: s3fs.S3FileSystem, key: str) -> str | None:
    """Why the object ``key`` does not read whole (None: it does)."""
    try:
        if key.rsplit("/", 1)[-1].startswith(("search_gen_state-", "basic-variant-state-")):
            cloudpickle.loads(fs.cat_file(key))  # Tune's state
        elif key.endswith(".json"):
            json.loads(fs.cat_file(key))
        elif key.endswith(".jsonl"):
            [json.loads(line) for line in fs.cat_file(key).decode().splitlines() if line.strip()]
        elif key.endswith(".parquet"):
            with fs.open(key, "rb") as fh:
                pq.read_table(fh)
    except Exception as exc:  # reported, the test fails on it
        return f"{type(exc).__name__}: {exc}"
    return None


def _keys(fs: s3fs.S3FileSystem, key: str) -> list[str]:
    with fs.open(key, "rb") as fh:
        return pq.read_table(fh, columns=["key"])["key"].to_pylist()


def _run(client: MlflowClient, experiment, run) -> dict:
    row = {"experiment": experiment.name, "status": run.info.status, "tags": dict(run.data.tags)}
    row |= {"artifact_uri": run.info.artifact_uri, "metrics": dict(run.data.metrics)}
    if run.data.tags.get("kind") == "trial":
        history = client.get_metric_history(run.info.run_id, "train_loss")
        row["epochs"] = [[m.step, m.timestamp] for m in history]
        where = f"source_run_id = '{run.info.run_id}'"
        models = client.search_logged_models([experiment.experiment_id], filter_string=where)
        row["models"] = sorted(m.name for m in models)
    return row


def main(out: str, uri: str, proxy: str) -> None:
    fs = s3fs.S3FileSystem()
    keys = fs.find("bucket")
    found: dict = {"keys": keys, "unreadable": {k: why for k in keys if (why := _readable(fs, k))}}
    found["sweeps"] = {k: json.loads(fs.cat_file(k)) for k in keys if k.endswith("/sweep.json")}
    # The history in the last checkpoint of the pipeline job's (killed and resumed) trial.
    trials = "bucket/run/sweeps/tiny/tune/trials/"
    last = sorted(k for k in keys if k.startswith(trials) and k.endswith("/history.jsonl"))
    lines = fs.cat_file(last[-1]).decode().splitlines() if last else []
    found["history"] = [json.loads(line) for line in lines if line.strip()]
    found["checkpoints"] = {}  # every checkpoint folder and the files in it
    for k in keys:
        if "/checkpoint_" in k:
            folder, _, rest = k.partition("/checkpoint_")
            number, _, name = rest.partition("/")
            found["checkpoints"].setdefault(f"{folder}/checkpoint_{number}", []).append(name)
    found["curation"] = {  # every key of the pool, and of the curation's scores, shard by shard
        what: {k.rsplit("/", 1)[-1]: _keys(fs, k) for k in sorted(fs.glob(pattern))}
        for what, pattern in (
            ("pool", "bucket/pool/metadata/*.parquet"),
            ("scores", "bucket/curated/scores/*.parquet"),
        )
    }
    client = MlflowClient(uri)
    found["runs"] = [
        _run(client, exp, run)
        for exp in client.search_experiments()
        for run in client.search_runs([exp.experiment_id], max_results=1000)
    ]
    try:
        with urllib.request.urlopen(f"{proxy}/__faults__", timeout=10) as answer:
            found["proxy"] = json.loads(answer.read())
    except OSError as exc:
        found["proxy"] = {"error": str(exc)}
    with open(os.path.join(out, "found.json"), "w") as fh:
        json.dump(found, fh, indent=1)
    fs.get("bucket/run/tables/synthetic", os.path.join(out, "tables"), recursive=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
