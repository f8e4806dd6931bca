"""Overhead of the Ray Train path over the single-process ``asymvlm train`` on the same data.

Writes a synthetic world (default d = 512, 8000 training images x 5 captions), then times,
interleaved (single, ray, single, ray, ...):

* **single** -- ``python -m asymvlm.cli train`` in a fresh process (what a user runs);
* **ray** -- ``asymvlm_ray/ray_train.py``'s ``run_training`` with one worker (``TorchTrainer``,
  gloo, ``resources_per_worker`` = all cores so both sides use the same torch threads),
  against a Ray cluster started once before any timing.

Both train the same method, config and seed for ``--epochs`` epochs with no evaluation. The
headline is the steady-state **wall time per epoch**: the median of the per-epoch times each
side records (``epoch_seconds``: permutation, all steps, the epoch's kappa statistics), epoch 1
excluded (warm-up). ``overhead = ray / single - 1`` (target <= 0.15 at one worker). The
end-to-end wall time (process start, data load, Ray Train start-up, checkpoints) is reported
too, with the fixed cost it implies. One JSON object goes to stdout, progress to stderr::

    .venv/bin/python benchmarks/ray_overhead.py [--epochs 6 --repeats 2 --dim 512 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from _common import cpu_model, loadavg, logger  # noqa: E402

log = logger("ray_overhead")


def run_single(args: argparse.Namespace, world: str, out: str) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "asymvlm.cli",
        "train",
        "--embeddings",
        world,
        "--split",
        "train",
        "--method",
        args.method,
        "--epochs",
        str(args.epochs),
        "--lr",
        "1e-3",
        "--optimizer",
        "adamw",
        "--batch-size",
        str(args.batch_size),
        "--hidden-dim",
        str(args.hidden_dim),
        "--seed",
        "0",
        "--device",
        "cpu",
        "--output",
        out,
        "--quiet",
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"asymvlm train failed:\n{proc.stderr[-3000:]}")
    with open(os.path.join(out, "history.jsonl")) as fh:
        history = [json.loads(line) for line in fh]
    return {"wall": wall, "epoch_seconds": [row["epoch_seconds"] for row in history]}


def run_ray(args: argparse.Namespace, world: str, out: str, cpus: int) -> dict[str, Any]:
    from asymvlm.runner import RunSpec
    from asymvlm.training import TrainConfig
    from asymvlm_ray.ray_train import run_training

    train = TrainConfig(
        method=args.method,
        epochs=args.epochs,
        lr=1e-3,
        optimizer="adamw",
        batch_size=args.batch_size,
        hidden_dim=args.hidden_dim,
        seed=0,
    )
    spec = RunSpec(
        embeddings=world,
        train=train,
        val_split=None,
        test_split=None,
        checkpoint_every=args.checkpoint_every,
    )
    t0 = time.perf_counter()
    result = run_training(spec, name="bench", storage_path=out, num_workers=1, cpus_per_worker=cpus)
    wall = time.perf_counter() - t0
    return {"wall": wall, "epoch_seconds": [row["epoch_seconds"] for row in result["history"]]}


def _rounded(values: list[float]) -> list[float]:
    return [round(v, 2) for v in values]


def steady(epoch_seconds: list[float]) -> float:
    return statistics.median(epoch_seconds[1:] if len(epoch_seconds) > 1 else epoch_seconds)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--train-images", type=int, default=8000)
    p.add_argument("--method", default="asymvlm-vmf")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=2048)
    p.add_argument("--hidden-dim", type=int, default=1024)
    p.add_argument("--checkpoint-every", type=int, default=5)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args(argv)

    import ray
    import torch

    from asymvlm.synthetic import WorldConfig, write_world

    root = tempfile.mkdtemp(prefix="ray_overhead-")
    try:
        world = os.path.join(root, "world")
        log(f"writing a synthetic world (d={args.dim}, {args.train_images} train images)")
        write_world(world, WorldConfig(dim=args.dim, splits={"train": args.train_images}))
        cpus = os.cpu_count() or 1
        t0 = time.perf_counter()
        ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False)
        ray_init = time.perf_counter() - t0
        load_before = loadavg()
        single, via_ray = [], []
        for r in range(args.repeats):
            log(f"repeat {r + 1}/{args.repeats}: asymvlm train")
            single.append(run_single(args, world, os.path.join(root, f"single-{r}")))
            log(f"  {single[-1]['wall']:.1f}s, epochs {_rounded(single[-1]['epoch_seconds'])}")
            log(f"repeat {r + 1}/{args.repeats}: Ray Train, 1 worker")
            via_ray.append(run_ray(args, world, os.path.join(root, f"ray-{r}"), cpus))
            log(f"  {via_ray[-1]['wall']:.1f}s, epochs {_rounded(via_ray[-1]['epoch_seconds'])}")
        load_after = loadavg()
        ray.shutdown()
    finally:
        shutil.rmtree(root, ignore_errors=True)

    per_epoch_single = [steady(s["epoch_seconds"]) for s in single]
    per_epoch_ray = [steady(s["epoch_seconds"]) for s in via_ray]
    overheads = [r / s - 1 for s, r in zip(per_epoch_single, per_epoch_ray, strict=True)]
    result = {
        "benchmark": "ray_overhead",
        "per_epoch_seconds_single": [round(x, 3) for x in per_epoch_single],
        "per_epoch_seconds_ray": [round(x, 3) for x in per_epoch_ray],
        "overhead": round(statistics.median(overheads), 4),
        "overhead_note": "median over repeats of (Ray Train per-epoch / asymvlm train "
        "per-epoch) - 1; per-epoch = median epoch time, epoch 1 excluded; target <= 0.15",
        "overheads_per_repeat": [round(x, 4) for x in overheads],
        "end_to_end_seconds_single": [round(s["wall"], 2) for s in single],
        "end_to_end_seconds_ray": [round(s["wall"], 2) for s in via_ray],
        "end_to_end_overhead": round(
            statistics.median(
                r["wall"] / s["wall"] - 1 for s, r in zip(single, via_ray, strict=True)
            ),
            4,
        ),
        "ray_fixed_seconds": round(
            statistics.median(
                r["wall"] - s["wall"] - args.epochs * (pr - ps)
                for s, r, ps, pr in zip(
                    single, via_ray, per_epoch_single, per_epoch_ray, strict=True
                )
            ),
            2,
        ),
        "ray_init_seconds": round(ray_init, 2),
        "config": {
            "dim": args.dim,
            "train_images": args.train_images,
            "captions": 5 * args.train_images,
            "method": args.method,
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "hidden_dim": args.hidden_dim,
            "checkpoint_every": args.checkpoint_every,
            "repeats": args.repeats,
            "torch_threads": cpus,
            "ray_workers": 1,
        },
        "loadavg_1min_before_after": [load_before, load_after],
        "machine": {
            "cpu": cpu_model(),
            "cores": cpus,
            "torch": torch.__version__,
            "ray": ray.__version__,
        },
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
