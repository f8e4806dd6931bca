"""Which Ray an entry point runs on: a cluster only when ``$RAY_ADDRESS`` (or the config's
``ray.address``) names one, else a new local Ray, whatever an earlier cluster left behind."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from asymvlm.errors import ConfigError
from asymvlm_ray.session import cluster_address
from tests.helpers import REPO, dead_cluster_ray_tmpdir, free_port


def _sweep(small_world: str, tmp_path, env: dict[str, str]) -> subprocess.CompletedProcess:
    doc = {"name": "session", "embeddings": small_world, "output": str(tmp_path / "out")}
    doc |= {"methods": ["asymvlm-vmf"], "lr": [1e-3], "seeds": [0], "epochs": 1}
    doc |= {"batch_size": 64, "hidden_dim": 16}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc))
    command = [sys.executable, "pipelines/sweep.py", "--config", str(path)]
    base = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return subprocess.run(
        command, cwd=REPO, env={**base, **env}, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_a_sweep_runs_on_a_new_local_ray_when_a_dead_cluster_is_remembered(small_world, tmp_path):
    with dead_cluster_ray_tmpdir() as ray_tmp:
        done = _sweep(small_world, tmp_path, {"RAY_TMPDIR": ray_tmp})
    assert done.returncode == 0, done.stderr[-3000:]
    assert '"failed_trials": 0' in done.stdout
    assert "Failed to connect to GCS" not in done.stderr


def test_a_named_cluster_that_does_not_answer_is_one_line(small_world, tmp_path) -> None:
    address = f"127.0.0.1:{free_port()}"
    done = _sweep(small_world, tmp_path, {"RAY_ADDRESS": address})  # before any trial
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: no Ray cluster answers at {address} (RAY_ADDRESS: ")
    assert done.stderr.count("\n") == 1, done.stderr
    assert "unset it to run on a local Ray" in done.stderr
    assert not os.path.exists(tmp_path / "out" / "tune")


def test_the_address_comes_from_the_config_then_the_environment(monkeypatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert cluster_address() == "local"
    monkeypatch.setenv("RAY_ADDRESS", "auto")  # Ray's own search, asked for by name
    assert cluster_address() == "auto"
    with pytest.raises(ConfigError, match=r"^ray.address=10.0.0.1: expected HOST:PORT"):
        cluster_address("10.0.0.1")
    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:8265")
    with pytest.raises(ConfigError, match=r"http:// is the dashboard's, for `ray job submit`"):
        cluster_address()
