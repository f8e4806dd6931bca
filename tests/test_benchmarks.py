"""Every script of benchmarks/ runs at a tiny size and prints its JSON (a smoke run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import HIERARCAPS, requires_hierarcaps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_TRAIN = ["--hidden-dim", "16", "--batch-size", "64", "--method", "asymvlm-vmf"]

#: Each script with the options that make its run tiny (``{world}``: a small embedding table).
SMOKE: dict[str, list] = {
    "eval_scale": ["--captions", "200", "--images", "50", "--dim", "16"],
    "train_throughput": [*TINY_TRAIN, "--dim", "16", "--n-text", "256", "--epochs", "1"]
    + ["--repeats", "1", "--peak-sizes", "256"],
    "packed_trials": [*TINY_TRAIN, "--k", "2", "--dim", "16", "--n-text", "256"]
    + ["--epochs", "1", "--repeats", "1"],
    "train_memory": ["--scale", "0.001", "--no-unblocked"],
    "ray_overhead": [*TINY_TRAIN, "--dim", "16", "--train-images", "100", "--epochs", "2"]
    + ["--repeats", "1"],
    "i2t_analysis": [*TINY_TRAIN, "--epochs", "1", "--train-images", "100"]
    + ["--test-images", "40", "--bins", "2", "--no-propose"],
    "protocols": ["--epochs", "1", "--hidden-dim", "16", "--methods", "asymvlm-vmf"],
    "generic_captions": ["--p", "0", "--seeds", "0", "--methods", "determ-ft", "--epochs", "1"]
    + ["--hidden-dim", "16", "--class-images", "10"],
    "serve_throughput": ["--requests", "4", "--captions", "2", "--concurrency", "2"],
    "sweep_overhead": ["--tables", "{world}", "--set", "epochs=1"]
    + ["--set", "methods=[determ-ft]", "--set", "lr=[0.001]", "--set", "seeds=[0]"]
    + ["--set", "hidden_dim=16", "--set", "batch_size=64"],
    "sweep_stages": ["--tables", "{world}", "--rounds", "1", "--set", "epochs=1"]
    + ["--set", "methods=[determ-ft]", "--set", "hidden_dim=16", "--set", "batch_size=64"],
    "cli_startup": ["--repeats", "1"],
    "embed_throughput": ["--data", str(HIERARCAPS), "--n-images", "4", "--repeats", "1"]
    + ["--threads", "1", "--no-sorted"],
}


def test_every_benchmark_has_a_smoke_run() -> None:
    scripts = {n[:-3] for n in os.listdir(os.path.join(ROOT, "benchmarks")) if n.endswith(".py")}
    assert scripts - {"_common"} == set(SMOKE)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=requires_hierarcaps) if n == "embed_throughput" else n
        for n in sorted(SMOKE)
    ],
)
def test_benchmark_smoke_run(name: str, small_world: str, tmp_path) -> None:
    argv = [a.format(world=small_world) for a in SMOKE[name]]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # its own local Ray
    script = os.path.join(ROOT, "benchmarks", f"{name}.py")
    run = dict(capture_output=True, text=True, cwd=tmp_path, env=env)
    done = subprocess.run([sys.executable, script, *argv], **run)
    assert done.returncode == 0, done.stderr[-3000:]
    result, _ = json.JSONDecoder().raw_decode(done.stdout[done.stdout.index("{") :])
    assert result
