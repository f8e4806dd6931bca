"""Every script of benchmarks/ runs at a tiny size and prints its JSON (a smoke run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

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
    + ["--set", "methods=[determ-ft]", "--set", "lr=[0.001]", "--set", "hidden_dim=16"]
    + ["--set", "batch_size=64"],
    "cli_startup": ["--repeats", "1"],
    "embed_throughput": ["--data", str(HIERARCAPS), "--n-images", "4", "--repeats", "1"]
    + ["--threads", "1", "--no-sorted"],
    "search_decisions": ["--seeds", "0", "--methods", "asymvlm-vmf", "--images", "300,100,100"]
    + ["--epochs", "2"],
    "search_speed": ["--images", "2000", "--dim", "32", "--queries", "10", "--seconds", "1"]
    + ["--clients", "2", "--no-vit"],
    "curate_filter": ["--seeds", "0", "--images", "300,100,100", "--epochs", "1", "--drops", "30"],
    "curate_speed": ["--rows", "4000", "--shard-rows", "1000"]
    + ["--captions", "300", "--no-vit", "--epochs", "1", "--actors", "1", "--small-rows", "0"]
    + ["--caption-shards", "2", "--caption-actors", "1"]
    + ["--quiet-wait", "0"],
}


POSITIVE, FRACTION = (lambda v: v > 0), (lambda v: 0 <= v <= 1)
#: What each script's JSON says after its tiny run: a dotted key -> the value, or a check of it.
EXPECTED: dict[str, dict[str, Any]] = {
    "eval_scale": {"n_captions": 200, "n_images": 50, "d": 16, "largest_score_block": [200, 50]},
    "train_throughput": {"config.samples_per_epoch": 256, "trainer_samples_per_s": POSITIVE},
    # the packed trials end where the same trials trained one after another end
    "packed_trials": {"config.lrs": [0.005, 0.02], "max_rel_loss_diff": lambda d: d < 1e-4},
    "train_memory": {"world.scale": 0.001, "config.epochs": 1, "all_met": True},
    "ray_overhead": {"config.epochs": 2, "config.captions": 500, "ray_init_seconds": POSITIVE},
    "i2t_analysis": {"epochs": [1], "default_world.1.world_test.n_images": 40},
    "protocols": {"epochs": 1, "results.asymvlm-vmf/improved.t2i_recall@1": FRACTION},
    "generic_captions": {"methods": ["determ-ft"], "curve.0.mean.determ-ft.pos_acc": FRACTION},
    "serve_throughput": {"requests": 4, "serve_batched.captions_per_second": POSITIVE},
    "sweep_overhead": {"trials": 1, "selection": {"determ-ft": 0.001}},
    # the pipelined stages and two Tuner.fit calls both ran the trials
    "sweep_stages": {"trials": 2, "median_seconds.pipelined": POSITIVE},
    # `asymvlm --help` answers without importing torch, Ray, MLflow or pyarrow
    "cli_startup": {"repeats": 1, "commands.asymvlm --help.heavy_imports": []},
    "embed_throughput": {"stage_summary.n_images": 4, "stage_summary.n_image_errors": 0},
    # abstention by kappa measured against the other orders, on the synthetic world's test split
    "search_decisions": {
        "asymvlm-vmf.seeds.0.t2i.aurc_kappa": FRACTION,
        "asymvlm-vmf.seeds.0.t2i.aurc_random": FRACTION,
        "asymvlm-vmf.summary.t2i.ece.std": 0.0,
    },
    # exact search at this size: the index finds what numpy finds, and Serve answered
    "search_speed": {
        "build.kind": "flat",
        "in_process.recall_at_10": 1.0,
        "served.tiny.requests": POSITIVE,
    },
    # the job scored every row with the plain loop's kappa, and the captions to embed
    "curate_speed": {
        "pools.large.rows": 4000,
        "job.actors_1.large.rows": 4000,
        "plain_vs_job_max_rel_kappa_diff": 0.0,
        "captions.tiny.rows": 300,
    },
    # the job's kappa is the adapter's, and each rule kept its fraction of the pool
    "curate_filter": {
        "seeds.0.job_kappa_vs_caption_scores_max_rel_diff": 0.0,
        "seeds.0.kept_fraction.clip-top-30": 0.3,
        "seeds.0.retrained.all.t2i_recall@1": FRACTION,
    },
}


def at(result, path: str):
    """The value at a dotted ``path`` of a benchmark's JSON."""
    for key in path.split("."):
        result = result[int(key) if isinstance(result, list) else key]
    return result


def test_every_benchmark_has_a_smoke_run() -> None:
    scripts = {n[:-3] for n in os.listdir(os.path.join(ROOT, "benchmarks")) if n.endswith(".py")}
    assert scripts - {"_common"} == set(SMOKE) == set(EXPECTED)


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
    for path, want in EXPECTED[name].items():  # a missing key: KeyError, naming it
        value = at(result, path)
        assert want(value) if callable(want) else value == want, f"{name}: {path} = {value!r}"
