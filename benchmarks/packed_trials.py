"""K packed trials (one batched model, ``asymvlm.training.PackedTrainer``) vs K sequential ones.

A sweep trains one method for several learning rates and seeds (App. B.4). On a random
in-memory split of a small world (d = 64 by default: unit images, raw texts, a caption -> image
index) this script trains K such trials (lr spread over a factor of 4, seeds 0..K-1) both ways
and times them side by side, interleaved (A, B, then B, A, ...) so that machine noise hits both:

* **packed**: ``PackedTrainer(cfgs, data).fit()`` -- every step is one vmapped forward
  and backward pass over the K members' stacked parameters and batches;
* **sequential**: for each trial, what ``TrainingRun`` does -- ``torch.manual_seed(seed)``,
  ``build_method``, ``Trainer(...).fit()`` -- one after another.

Both include building the members, calibration and every epoch's statistics. The packed
members must end equal to the sequential runs; the largest relative difference of their final
losses is reported (``max_rel_loss_diff``). One JSON object goes to stdout, progress to
stderr::

    .venv/bin/python benchmarks/packed_trials.py [--k 8 --dim 64 --hidden-dim 64 --device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from typing import Any

import torch
from _common import cpu_model, loadavg, logger  # noqa: E402
from train_throughput import random_split, sync  # noqa: E402

from asymvlm.methods import build_method
from asymvlm.splits import SplitTensors
from asymvlm.training import PackedTrainer, TrainConfig, Trainer

log = logger("packed_trials")


def configs(args: argparse.Namespace) -> list[TrainConfig]:
    """K trials of one method: lr spread geometrically over [lr / 2, 2 lr], seeds 0..K-1."""
    k = args.k
    return [
        TrainConfig(
            method=args.method,
            epochs=args.epochs,
            lr=args.lr * 2.0 ** (2.0 * i / max(1, k - 1) - 1.0),
            seed=i,
            batch_size=args.batch_size,
            hidden_dim=args.hidden_dim,
            depth=args.depth,
            device=args.device,
            precision=args.precision,
        )
        for i in range(k)
    ]


def run_packed(cfgs: list[TrainConfig], data: SplitTensors) -> list[float]:
    """Train the K trials packed; their final epoch losses."""
    pack = PackedTrainer(cfgs, data)
    histories = pack.fit()
    return [h[-1]["train_loss"] if h else float("nan") for h in histories]


def run_sequential(cfgs: list[TrainConfig], data: SplitTensors) -> list[float]:
    """Train the K trials one after another, each as ``TrainingRun`` would; final losses."""
    out = []
    for cfg in cfgs:
        torch.manual_seed(cfg.seed)
        method = build_method(cfg.method, data.dim, **cfg.method_args())
        history = Trainer(method, cfg, data).fit(progress=False)
        out.append(history[-1]["train_loss"] if history else float("nan"))
    return out


def timed(fn: Any, device: torch.device) -> tuple[float, Any]:
    sync(device)
    t0 = time.perf_counter()
    value = fn()
    sync(device)
    return time.perf_counter() - t0, value


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--k", type=int, default=8, help="trials per pack")
    p.add_argument("--method", default="asymvlm-vmf")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--hidden-dim", type=int, default=64)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--n-text", type=int, default=8192)
    p.add_argument("--captions-per-image", type=int, default=5)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-2, help="middle of the lr spread")
    p.add_argument("--repeats", type=int, default=2, help="timed runs per side, interleaved")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default="fp32", choices=["auto", "fp32", "bf16", "fp16"])
    args = p.parse_args(argv)

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    load_before = loadavg()
    data = random_split(args.n_text, args.dim, args.captions_per_image, device)
    cfgs = configs(args)
    log(
        f"{args.k} x {args.method}: d={args.dim} hidden={args.hidden_dim} depth={args.depth} "
        f"B={args.batch_size} n_text={args.n_text} epochs={args.epochs} "
        f"threads={torch.get_num_threads()} device={device}"
    )

    log("warm-up (one epoch each way)")
    warm = [cfg.model_copy(update={"epochs": 1}) for cfg in cfgs[:2]]
    run_packed(warm, data)
    run_sequential(warm, data)

    t_packed, t_seq, diffs = [], [], []
    for r in range(args.repeats):
        order = ("packed", "sequential") if r % 2 == 0 else ("sequential", "packed")
        losses: dict[str, list[float]] = {}
        for side in order:
            fn = run_packed if side == "packed" else run_sequential
            seconds, losses[side] = timed(lambda fn=fn: fn(cfgs, data), device)
            (t_packed if side == "packed" else t_seq).append(seconds)
        diffs.append(
            max(
                abs(a - b) / max(abs(b), 1e-12)
                for a, b in zip(losses["packed"], losses["sequential"], strict=True)
            )
        )
        log(
            f"repeat {r + 1}/{args.repeats}: packed {t_packed[-1]:.2f}s  "
            f"sequential {t_seq[-1]:.2f}s  (max rel. loss diff {diffs[-1]:.1e})"
        )

    paired = [ts / tp for tp, ts in zip(t_packed, t_seq, strict=True)]
    params = sum(
        p.numel() for p in build_method(args.method, args.dim, **cfgs[0].method_args()).parameters()
    )
    result: dict[str, Any] = {
        "config": {
            **vars(args),
            "lrs": [cfg.lr for cfg in cfgs],
            "params_per_trial": params,
            "steps_per_epoch": args.n_text // min(args.batch_size, args.n_text),
        },
        "packed_seconds": round(min(t_packed), 3),
        "sequential_seconds": round(min(t_seq), 3),
        # the median of the paired (interleaved) ratios; best vs best beside it
        "speedup": round(statistics.median(paired), 3),
        "speedup_best_vs_best": round(min(t_seq) / min(t_packed), 3),
        "packed_seconds_all": [round(t, 3) for t in t_packed],
        "sequential_seconds_all": [round(t, 3) for t in t_seq],
        "max_rel_loss_diff": max(diffs),
        "machine": {
            "cpu": cpu_model(),
            "cpu_count": os.cpu_count(),
            "threads": torch.get_num_threads(),
            "device": str(device),
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "loadavg_1min_before_after": [load_before, loadavg()],
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
