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

OUTPUTS = ("run", "node", "outage", "flaky")  # the jobs' outputs in the bucket


def _readable(fs: s3fs.S3FileSystem, key: str) -> str | None:
    """Why the object ``key`` does not read whole (None: it does)."""
    try:
        name = key.rsplit("/", 1)[-1]
        if name.startswith(("search_gen_state-", "basic-variant-state-")):  # Tune's, pickles
            cloudpickle.loads(fs.cat_file(key))
        elif key.endswith(".json"):
            json.loads(fs.cat_file(key))
        elif key.endswith(".jsonl"):
            for line in fs.cat_file(key).decode().splitlines():
                if line.strip():
                    json.loads(line)
        elif key.endswith(".parquet"):
            with fs.open(key, "rb") as fh:
                pq.read_table(fh)
    except Exception as exc:  # reported, the test fails on it
        return f"{type(exc).__name__}: {exc}"
    return None


def main(out: str, uri: str, proxy: str) -> None:
    fs = s3fs.S3FileSystem()
    keys = fs.find("bucket")
    found: dict = {"keys": keys}
    found["unreadable"] = {k: why for k in keys if (why := _readable(fs, k))}
    found["sweeps"] = {}
    for name in OUTPUTS:
        prefix = f"bucket/{name}/"
        for sweep in [k for k in keys if k.startswith(prefix) and k.endswith("/sweep.json")]:
            found["sweeps"][sweep] = json.loads(fs.cat_file(sweep))
    # The history in the last checkpoint of the pipeline job's (killed and resumed) trial.
    last = sorted(
        k
        for k in keys
        if k.startswith("bucket/run/sweeps/tiny/tune/trials/") and k.endswith("/history.jsonl")
    )
    found["history"] = (
        [json.loads(line) for line in fs.cat_file(last[-1]).decode().splitlines() if line.strip()]
        if last
        else []
    )
    # Every checkpoint folder and the files in it.
    folders: dict[str, list[str]] = {}
    for k in keys:
        parts = k.split("/")
        for i, part in enumerate(parts[:-1]):
            if part.startswith("checkpoint_"):
                folders.setdefault("/".join(parts[: i + 1]), []).append("/".join(parts[i + 1 :]))
    found["checkpoints"] = folders
    client = MlflowClient(uri)
    runs = []
    for exp in client.search_experiments():
        for run in client.search_runs([exp.experiment_id], max_results=1000):
            row = {
                "experiment": exp.name,
                "run_id": run.info.run_id,
                "name": run.info.run_name,
                "status": run.info.status,
                "artifact_uri": run.info.artifact_uri,
                "tags": dict(run.data.tags),
                "metrics": dict(run.data.metrics),
            }
            if run.data.tags.get("kind") == "trial":
                history = client.get_metric_history(run.info.run_id, "train_loss")
                row["epochs"] = [[m.step, m.timestamp] for m in history]
                row["artifacts"] = sorted(a.path for a in client.list_artifacts(run.info.run_id))
                row["models"] = sorted(
                    m.name
                    for m in client.search_logged_models(
                        [exp.experiment_id], filter_string=f"source_run_id = '{run.info.run_id}'"
                    )
                )
            runs.append(row)
    found["runs"] = runs
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
