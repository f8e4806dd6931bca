"""The pipeline on a real two-node Ray cluster on this one machine (`tests/multinode/cluster.sh`),
and what clouds do to it.

Everything runs inside fresh network and PID namespaces (only loopback; the harness's
``ray stop`` sees no other Ray on the machine): a moto S3 server (the only shared storage) with
a proxy in front of it that fails requests on demand, an MLflow tracking server with its
artifacts in the bucket, a Ray head offering 0 CPUs and a worker with 2 CPUs in its own mount
and PID namespaces with a private tmpfs over its scratch directory. ``ray job submit`` runs:

1. ``pipelines/full.py`` with an ``s3://`` output: it must succeed, every output in the bucket;
   the trial's process is killed once after epoch 2 and resumes from the checkpoint there;
2. the same with a local output: it must fail fast (shared storage is needed);
3. a sweep whose worker node is killed whole (its PID namespace, its tmpfs) while the trial
   holds after its checkpoint of epoch 2, and a new node started: the job succeeds, the trial
   resumed on the new node, with the results of a run that never stopped;
4. a sweep during which the MLflow server is stopped for longer than the client's (shortened)
   retries, then started again: every metric and status lands, in order;
5. a sweep whose S3 requests fail 30 % of the time for 150 s (503 SlowDown, dropped
   connections): it succeeds, and no object is half-written.

The harness runs once per session (a few minutes); each test reads what it left.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from asymvlm.checkpoints.folder import CONFIG_FILE, HISTORY_FILE, TRAINER_FILE, WEIGHTS_FILE

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HARNESS = os.path.join(REPO, "tests", "multinode", "cluster.sh")
DRILLS = {"node": "drill-node", "outage": "drill-outage", "flaky": "drill-flaky"}

pytestmark = pytest.mark.slow


def _namespaces_allowed() -> str | None:
    """None when `unshare` can make the namespaces the harness needs, else why not."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare or ip is not installed"
    probe = [
        "unshare",
        "--net",
        "--pid",
        "--fork",
        "--mount-proc",
        "unshare",
        "--mount",
        "--pid",
        "--fork",
        "sh",
        "-c",
        "mount -t tmpfs tmpfs /mnt && ip link set lo up",
    ]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare failed: {exc}"
    if done.returncode != 0:
        return f"namespaces are not permitted here: {done.stderr.strip()[:200]}"
    return None


class Harness:
    """The results folder of one run of the harness."""

    def __init__(self, results, stderr: str, returncode: int) -> None:
        self.results, self.stderr, self.returncode = results, stderr, returncode
        found = results / "found.json"
        self.found = json.loads(found.read_text()) if found.exists() else {}

    def read(self, name: str) -> str:
        path = self.results / name
        return path.read_text() if path.exists() else ""

    def job(self, name: str) -> tuple[str, str]:
        """(exit code, log) of job ``name``."""
        return self.read(f"job-{name}.rc").strip(), self.read(f"job-{name}.log")

    def succeeded(self, name: str) -> str:
        rc, log = self.job(name)
        context = f"harness rc {self.returncode}\n{self.stderr[-3000:]}\n{log[-6000:]}"
        assert rc == "0", context
        assert "succeeded" in log, context
        return log

    def trial_runs(self, experiment: str) -> list[dict]:
        return [
            r
            for r in self.found["runs"]
            if r["experiment"] == experiment and r["tags"].get("kind") == "trial"
        ]

    def times(self) -> dict[str, float]:
        pairs = (line.split() for line in self.read("times.txt").splitlines() if line.strip())
        return {name: float(at) for name, at in pairs}


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Harness:
    why = _namespaces_allowed()
    if why:
        pytest.skip(why)
    if not os.path.exists(os.path.join(REPO, ".venv", "bin", "ray")):
        pytest.skip("the project's virtualenv (.venv) is needed on the nodes")
    results = tmp_path_factory.mktemp("multinode") / "results"
    command = ["unshare", "--net", "--pid", "--fork", "--mount-proc", "bash", HARNESS]
    done = subprocess.run(
        [*command, str(results)], cwd=REPO, capture_output=True, text=True, timeout=1500
    )
    return Harness(results, done.stderr, done.returncode)


def _straight_through(harness: Harness, seed: int = 0) -> dict:
    """The drill sweep's trial trained without Ray, on the tables the jobs used: what a run
    that never stopped gives."""
    import torch

    from asymvlm.protocol import run_protocol
    from pipelines.schema import load_sweep

    sweep = load_sweep(
        os.path.join(REPO, "tests", "multinode", "sweep.yaml"),
        [f"embeddings={harness.results / 'tables'}", f"output={harness.results / 'reference'}"],
    )
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as the trial (cpus_per_worker: 1)
    try:
        out = run_protocol(sweep.run_spec(sweep.methods[0], sweep.lr[0], seed))
    finally:
        torch.set_num_threads(before)
    return json.loads(json.dumps({split: out[split] for split in ("val", "test")}))


def _finals(harness: Harness, output: str) -> dict[str, dict]:
    (record,) = [v for k, v in harness.found["sweeps"].items() if k.startswith(f"bucket/{output}/")]
    return {f"{r['stage']}-{r['seed']}": r for r in record["trials"]}


def test_the_pipeline_on_two_nodes_with_an_object_store(harness) -> None:
    job_log = harness.succeeded("s3")
    found = harness.found
    keys = found["keys"]
    run = "bucket/run/sweeps/tiny"
    assert any(k.startswith(f"{run}/tune/") for k in keys), keys  # Tune state
    assert any(
        k.startswith(f"{run}/tune/trials/") and "/checkpoint_" in k and k.endswith("trainer.pt")
        for k in keys
    ), keys
    assert f"{run}/sweep.json" in keys
    assert "bucket/run/evaluations/00-hierarcaps.json" in keys
    assert "bucket/run/report/report.md" in keys
    assert any(k.startswith("bucket/mlartifacts/") for k in keys)
    # The training worker was killed after epoch 2 and resumed from the checkpoint in the bucket.
    assert "injected failure: worker 0 is killed after epoch 2" in job_log, job_log[-6000:]
    assert re.search(r"resumed asymvlm-vmf from epoch [12]\b", job_log), job_log[-6000:]
    assert [row["epoch"] for row in found["history"]] == [1, 2, 3], found["history"]
    runs = [r for r in found["runs"] if r["experiment"] == "asymvlm-multinode"]
    assert runs and all(r["status"] == "FINISHED" for r in runs), runs
    assert {r["tags"].get("kind") for r in runs} >= {"pipeline"}
    assert all(r["artifact_uri"].startswith(("mlflow-artifacts:", "s3://")) for r in runs)
    # A local output on two nodes fails fast, before any work.
    rc, log = harness.job("local")
    assert rc not in ("", "0"), log[-3000:]
    assert "shared storage is needed" in log, log[-3000:]


def test_a_worker_node_lost_mid_trial_and_a_new_one_the_sweep_ends_as_if_never_stopped(
    harness,
) -> None:
    log = harness.succeeded("node")
    times = harness.times()
    assert "node-killed" in times and "node-joined" in times, harness.stderr[-3000:]
    assert "injected pause: worker 0 holds for 120 s after epoch 2" in log, log[-6000:]
    assert re.search(r"resumed asymvlm-vmf from epoch 2\b", log), log[-6000:]
    # The trial's MLflow run: every epoch once, in order, FINISHED.
    (trial,) = harness.trial_runs(DRILLS["node"])
    assert trial["status"] == "FINISHED"
    assert [step for step, _ in trial["epochs"]] == [1, 2, 3, 4, 5, 6], trial["epochs"]
    # Bit for bit what a run that never stopped gives (the trial runs in place, on CPU).
    (final,) = _finals(harness, "node").values()
    assert final["outcome"] == {**final["outcome"], **_straight_through(harness)}
    (record,) = [v for k, v in harness.found["sweeps"].items() if k.startswith("bucket/node/")]
    assert record["failed"] == [] and set(record["adapters"]["asymvlm-vmf"]) == {"0"}


def test_a_tracking_server_outage_longer_than_the_client_retries_loses_nothing(harness) -> None:
    log = harness.succeeded("outage")
    times = harness.times()
    assert "mlflow-stopped" in times and "mlflow-started" in times, harness.stderr[-3000:]
    assert times["mlflow-started"] - times["mlflow-stopped"] >= 30
    runs = harness.trial_runs(DRILLS["outage"])
    assert sorted(r["tags"]["trial"] for r in runs) == [
        "seeds-asymvlm-vmf-lr0.002-seed0",
        "seeds-asymvlm-vmf-lr0.002-seed1",
    ]
    for run in runs:
        assert run["status"] == "FINISHED", run
        steps = [step for step, _ in run["epochs"]]
        assert steps == [1, 2, 3, 4, 5, 6], steps  # every epoch once, in the order it came
        stamps = [at for _, at in run["epochs"]]
        assert stamps == sorted(stamps)
        assert "t2i_recall_at_1" in run["metrics"] and "adapter" in run["models"], run
    sweep = [
        r
        for r in harness.found["runs"]
        if r["experiment"] == DRILLS["outage"] and r["tags"].get("kind") == "sweep"
    ]
    assert [r["status"] for r in sweep] == ["FINISHED"]
    for final in _finals(harness, "outage").values():
        assert final["outcome"] == {**final["outcome"], **_straight_through(harness, final["seed"])}
    assert "FAILED" not in log


def test_an_object_store_failing_30_percent_of_requests_loses_nothing(harness) -> None:
    harness.succeeded("flaky")
    proxy = harness.found["proxy"]
    failed = proxy.get("failed_paths", [])
    assert proxy.get("failed", 0) >= 10, proxy
    assert any("/tables/synthetic/" in p for p in failed), failed  # table reads
    assert any(p.startswith("/bucket/flaky/tune/") for p in failed), failed  # checkpoints
    keys = harness.found["keys"]
    assert not [k for k in keys if ".tmp-" in k], [k for k in keys if ".tmp-" in k]
    assert harness.found["unreadable"] == {}
    checkpoints = {
        k: v for k, v in harness.found["checkpoints"].items() if k.startswith("bucket/flaky/")
    }
    assert checkpoints
    for folder, files in checkpoints.items():  # every checkpoint whole
        whole = {CONFIG_FILE, WEIGHTS_FILE, HISTORY_FILE, TRAINER_FILE}
        assert whole <= set(files), (folder, files)
    (final,) = _finals(harness, "flaky").values()
    assert final["outcome"] == {**final["outcome"], **_straight_through(harness)}
    (run,) = harness.trial_runs(DRILLS["flaky"])
    assert run["status"] == "FINISHED" and "adapter" in run["models"], run
