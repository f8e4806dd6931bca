"""The pipeline on a real two-node Ray cluster on this one machine (`tests/multinode/cluster.sh`).

Everything runs inside fresh network and PID namespaces (only loopback; the harness's
``ray stop`` sees no other Ray on the machine): a moto S3 server (the only
shared storage), an MLflow tracking server with its artifacts in the bucket, a Ray head offering
0 CPUs and a worker with 2 CPUs in its own mount and PID namespaces with a private tmpfs over its
scratch directory. ``ray job submit`` runs ``pipelines/full.py`` with an ``s3://`` output (it
must succeed, and every output must land in the bucket), then with a local output (it must fail
fast: shared storage is needed). In the first job the trial's process is killed once after
epoch 2 and resumes from the checkpoint in the bucket.
The pipeline's ``prepare.synthetic`` writes the synthetic world to the bucket; training runs on
the worker (the only node offering CPUs).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HARNESS = os.path.join(REPO, "tests", "multinode", "cluster.sh")


def _namespaces_allowed() -> str | None:
    """None when `unshare` can make the namespaces the harness needs, else why not."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare or ip is not installed"
    probe = ["unshare", "--net", "--pid", "--fork", "--mount-proc", "unshare", "--mount",
             "--pid", "--fork", "sh", "-c",
             "mount -t tmpfs tmpfs /mnt && ip link set lo up"]  # fmt: skip
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare failed: {exc}"
    if done.returncode != 0:
        return f"namespaces are not permitted here: {done.stderr.strip()[:200]}"
    return None


@pytest.mark.slow
def test_the_pipeline_on_two_nodes_with_an_object_store(tmp_path) -> None:
    why = _namespaces_allowed()
    if why:
        pytest.skip(why)
    if not os.path.exists(os.path.join(REPO, ".venv", "bin", "ray")):
        pytest.skip("the project's virtualenv (.venv) is needed on the nodes")
    results = tmp_path / "results"
    command = ["unshare", "--net", "--pid", "--fork", "--mount-proc", "bash", HARNESS]
    done = subprocess.run([*command, str(results)], cwd=REPO,
                          capture_output=True, text=True, timeout=540)  # fmt: skip

    def read(name: str) -> str:
        path = results / name
        return path.read_text() if path.exists() else ""

    context = f"harness rc {done.returncode}\n{done.stderr[-3000:]}"
    assert read("job-s3.rc").strip() == "0", context + "\n" + read("job-s3.log")[-6000:]
    assert "succeeded" in read("job-s3.log")
    found = json.loads(read("found.json"))
    keys = found["keys"]
    run = "bucket/run/sweeps/tiny"
    assert any(k.startswith(f"{run}/tune/") for k in keys), keys  # Tune state
    assert any(k.startswith(f"{run}/tune/trials/") and "/checkpoint_" in k
               and k.endswith("trainer.pt") for k in keys), keys  # fmt: skip
    assert f"{run}/sweep.json" in keys
    assert "bucket/run/evaluations/00-hierarcaps.json" in keys
    assert "bucket/run/report/report.md" in keys
    assert any(k.startswith("bucket/mlartifacts/") for k in keys)
    # The training worker was killed after epoch 2 and resumed from the checkpoint in the bucket.
    job_log = read("job-s3.log")
    assert "injected failure: worker 0 is killed after epoch 2" in job_log, job_log[-6000:]
    assert re.search(r"resumed asymvlm-vmf from epoch [12]\b", job_log), job_log[-6000:]
    assert [row["epoch"] for row in found["history"]] == [1, 2, 3], found["history"]
    runs = found["runs"]
    assert runs and all(r["status"] == "FINISHED" for r in runs), runs
    assert {r["tags"].get("kind") for r in runs} >= {"pipeline"}
    assert all(r["artifact_uri"].startswith(("mlflow-artifacts:", "s3://")) for r in runs)
    # A local output on two nodes fails fast, before any work.
    assert read("job-local.rc").strip() not in ("", "0"), read("job-local.log")[-3000:]
    assert "shared storage is needed" in read("job-local.log"), read("job-local.log")[-3000:]
