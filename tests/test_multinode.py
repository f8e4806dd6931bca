"""The pipeline on a real two-node Ray cluster on this one machine (`tests/multinode/cluster.sh`,
which says what it starts and which jobs it runs), its doors locked by token authentication, and
what clouds do to it: a trial SIGKILLed, a local output refused, an object store failing 30 % of
its requests, a worker node lost mid-trial, the MLflow server away for longer than its client's
retries. The harness runs once per module; each test reads what it left."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess

import pytest
import yaml

from asymvlm.checkpoints.folder import CONFIG_FILE, HISTORY_FILE, TRAINER_FILE, WEIGHTS_FILE

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWEEP = os.path.join(REPO, "tests", "multinode", "sweep.yaml")
with open(SWEEP) as fh:
    EPOCHS = list(range(1, yaml.safe_load(fh)["epochs"] + 1))
PROBE = "unshare --net --pid --fork --mount-proc unshare --mount --pid --fork sh -c"

pytestmark = pytest.mark.slow


def _namespaces_refused() -> str | None:
    """Why `unshare` cannot make the namespaces the harness needs (None: it can)."""
    probe = [*shlex.split(PROBE), "mount -t tmpfs tmpfs /mnt && ip link set lo up"]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare failed: {exc}"
    return done.returncode and f"namespaces are not permitted here: {done.stderr[:200]}" or None


class Harness:
    """The results folder of one run of the harness."""

    def __init__(self, results, stderr: str, returncode: int) -> None:
        self.results, self.stderr, self.returncode = results, stderr, returncode
        found = results / "found.json"
        self.found = json.loads(found.read_text()) if found.exists() else {}
        stamps = self.read("times.txt").split()
        self.times = dict(zip(stamps[::2], map(float, stamps[1::2]), strict=True))

    def read(self, name: str) -> str:
        path = self.results / name
        return path.read_text() if path.exists() else ""

    def succeeded(self, name: str) -> str:
        rc, log = self.read(f"job-{name}.rc").strip(), self.read(f"job-{name}.log")
        context = f"harness rc {self.returncode}\n{self.stderr[-3000:]}\n{log[-6000:]}"
        assert rc == "0" and "succeeded" in log, context
        return log

    def runs(self, experiment: str, kind: str = "trial") -> list[dict]:
        found = self.found["runs"]
        return [r for r in found if r["experiment"] == experiment and r["tags"].get("kind") == kind]

    def finals(self, output: str) -> list[dict]:
        """The trials of the sweep record at ``bucket/<output>``, each with what a run that never
        stopped gives: the trial trained without Ray on the same tables."""
        (record,) = [
            v for k, v in self.found["sweeps"].items() if k.startswith(f"bucket/{output}/")
        ]
        return [{**r, "reference": self.reference(r["seed"])} for r in record["trials"]]

    def reference(self, seed: int) -> dict:
        import torch

        from asymvlm.runner import train_and_evaluate
        from asymvlm_ray.schema import load_sweep

        where = [f"embeddings={self.results / 'tables'}", f"output={self.results / 'reference'}"]
        sweep, before = load_sweep(SWEEP, where), torch.get_num_threads()
        torch.set_num_threads(1)  # as the trial (cpus_per_worker: 1)
        try:
            out = train_and_evaluate(sweep.run_spec(sweep.methods[0], sweep.lr[0], seed))
        finally:
            torch.set_num_threads(before)
        return json.loads(json.dumps({split: out[split] for split in ("val", "test")}))


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Harness:
    if why := _namespaces_refused():
        pytest.skip(why)
    if not os.path.exists(os.path.join(REPO, ".venv", "bin", "ray")):
        pytest.skip("the project's virtualenv (.venv) is needed on the nodes")
    results = tmp_path_factory.mktemp("multinode") / "results"
    command = ["unshare", "--net", "--pid", "--fork", "--mount-proc", "bash"]
    command += [os.path.join(REPO, "tests", "multinode", "cluster.sh"), str(results)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1500)
    return Harness(results, done.stderr, done.returncode)


def test_without_the_token_no_job_is_submitted_and_no_node_joins(harness) -> None:
    """The nodes run with token authentication as the cluster documents start them: a submission
    without the token is refused, the same with it runs; a node without it is turned away."""
    context = f"harness rc {harness.returncode}\n{harness.stderr[-3000:]}"
    refused, accepted = harness.read("submit-no-token.log"), harness.read("submit-token.log")
    assert harness.read("submit-no-token.rc").strip() == "1", context + refused[-3000:]
    assert "Unauthorized: Missing authentication token" in refused, refused[-3000:]
    assert "hello from the cluster" not in refused
    assert harness.read("submit-token.rc").strip() == "0", context + accepted[-3000:]
    assert "hello from the cluster" in accepted and "succeeded" in accepted, accepted[-3000:]
    intruder = harness.read("intruder.log")
    assert harness.read("intruder.rc").strip() == "1", context + intruder[-3000:]
    assert "InvalidAuthToken: Authentication token is missing or incorrect" in intruder, intruder
    assert len(json.loads(harness.read("nodes.json") or "[]")) == 2, context  # head and worker


def test_the_pipeline_on_two_nodes_with_an_object_store(harness) -> None:
    log, found = harness.succeeded("s3"), harness.found
    keys, run = found["keys"], "bucket/run/sweeps/tiny"
    assert any(
        k.startswith(f"{run}/tune/trials/") and "/checkpoint_" in k and k.endswith("trainer.pt")
        for k in keys
    ), keys
    assert {f"{run}/sweep.json", "bucket/run/evaluations/00-hierarcaps.json"} <= set(keys)
    assert "bucket/run/report/report.md" in keys
    assert any(k.startswith("bucket/mlartifacts/") for k in keys)
    # The training worker was killed after epoch 2 and resumed from the checkpoint in the bucket.
    assert "injected failure: worker 0 is killed after epoch 2" in log, log[-6000:]
    assert re.search(r"resumed asymvlm-vmf from epoch [12]\b", log), log[-6000:]
    assert [row["epoch"] for row in found["history"]] == [1, 2, 3], found["history"]
    runs = [r for r in found["runs"] if r["experiment"] == "asymvlm-multinode"]
    assert runs and all(r["status"] == "FINISHED" for r in runs), runs
    assert "pipeline" in {r["tags"].get("kind") for r in runs}
    assert all(r["artifact_uri"].startswith(("mlflow-artifacts:", "s3://")) for r in runs)
    # A local output on two nodes fails fast, before any work.
    rc, log = harness.read("job-local.rc").strip(), harness.read("job-local.log")
    assert rc not in ("", "0") and "shared storage is needed" in log, log[-3000:]


def test_a_worker_node_lost_mid_trial_the_sweep_ends_as_if_never_stopped(harness) -> None:
    log = harness.succeeded("node")
    assert {"node-killed", "node-joined"} <= set(harness.times), harness.stderr[-3000:]
    assert "injected pause: worker 0 holds for 120 s after epoch 2" in log, log[-6000:]
    assert re.search(r"resumed asymvlm-vmf from epoch 2\b", log), log[-6000:]
    (trial,) = harness.runs("drill-node")  # every epoch once, in order, FINISHED
    assert trial["status"] == "FINISHED" and [s for s, _ in trial["epochs"]] == EPOCHS
    (final,) = harness.finals("node")  # bit for bit (the trial runs in place, on CPU):
    assert final["outcome"] == {**final["outcome"], **final["reference"]}
    (record,) = [v for k, v in harness.found["sweeps"].items() if k.startswith("bucket/node/")]
    assert record["failed"] == [] and set(record["adapters"]["asymvlm-vmf"]) == {"0"}


def test_a_worker_node_lost_mid_curation_every_row_is_written_once(harness) -> None:
    """The curation job's actor holds after its third shard when its node goes: the job stops
    with one line; submitted again, it scores the rest; every row of the pool once."""
    lost = harness.read("job-curate-lost.log")
    assert harness.read("job-curate-lost.rc").strip() not in ("", "0"), lost[-3000:]
    assert "the shards written are kept: run the same command again to go on" in lost, lost[-3000:]
    again = harness.succeeded("curate")
    assert "12 clip-retrieval shards, 3 scored already, 9 to score" in again, again[-6000:]
    before = json.loads(harness.read("curated-before.json"))
    after = json.loads(harness.read("curated-after.json"))
    assert len(before) == 3 and {k: after[k] for k in before} == before  # not written again
    curation = harness.found["curation"]
    pool = [key for keys in curation["pool"].values() for key in keys]
    scored = [key for keys in curation["scores"].values() for key in keys]
    assert len(curation["scores"]) == 12 and sorted(scored) == sorted(pool)
    assert len(set(scored)) == len(scored) == 600  # every row of the pool, once
    (run,) = harness.runs("drill-curate", "curate")
    assert run["status"] == "FINISHED" and run["metrics"]["rows"] == 600, run


def test_a_tracking_server_outage_longer_than_the_client_retries_loses_nothing(harness) -> None:
    log, times = harness.succeeded("outage"), harness.times
    assert {"mlflow-stopped", "mlflow-started"} <= set(times), harness.stderr[-3000:]
    assert times["mlflow-started"] - times["mlflow-stopped"] >= 30
    runs = harness.runs("drill-outage")
    assert sorted(r["tags"]["trial"] for r in runs) == [
        "seeds-asymvlm-vmf-lr0.002-seed0",
        "seeds-asymvlm-vmf-lr0.002-seed1",
    ]
    for run in runs:  # every epoch once, in the order it came
        assert run["status"] == "FINISHED" and [s for s, _ in run["epochs"]] == EPOCHS, run
        assert [at for _, at in run["epochs"]] == sorted(at for _, at in run["epochs"])
        assert "t2i_recall_at_1" in run["metrics"] and "adapter" in run["models"], run
    assert [r["status"] for r in harness.runs("drill-outage", "sweep")] == ["FINISHED"]
    for final in harness.finals("outage"):
        assert final["outcome"] == {**final["outcome"], **final["reference"]}
    assert "FAILED" not in log


def test_an_object_store_failing_30_percent_of_requests_loses_nothing(harness) -> None:
    harness.succeeded("flaky")
    proxy, keys = harness.found["proxy"], harness.found["keys"]
    failed = proxy.get("failed_paths", [])
    assert proxy.get("failed", 0) >= 10, proxy
    assert any("/tables/synthetic/" in p for p in failed), failed  # table reads
    assert any(p.startswith("/bucket/flaky/tune/") for p in failed), failed  # checkpoints
    assert not [k for k in keys if ".tmp-" in k] and harness.found["unreadable"] == {}
    checkpoints = [
        v for k, v in harness.found["checkpoints"].items() if k.startswith("bucket/flaky/")
    ]
    assert checkpoints
    for files in checkpoints:  # every checkpoint whole
        assert {CONFIG_FILE, WEIGHTS_FILE, HISTORY_FILE, TRAINER_FILE} <= set(files), files
    (final,) = harness.finals("flaky")
    assert final["outcome"] == {**final["outcome"], **final["reference"]}
    (run,) = harness.runs("drill-flaky")
    assert run["status"] == "FINISHED" and "adapter" in run["models"], run
