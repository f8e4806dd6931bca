"""Ray Train: one adapter training run as a TorchTrainer (DDP over cached embeddings).

Flags: the fields of ``RunSpec`` and ``TrainConfig``; prints rank 0's results as JSON."""

from __future__ import annotations

import argparse
import json
import sys

from asymvlm.entry import ArgumentParser, guarded, require
from asymvlm.errors import ConfigError

require("ray", "tracking")

from asymvlm import config  # noqa: E402
from asymvlm.methods import method_names  # noqa: E402
from asymvlm.runner import RunSpec  # noqa: E402
from asymvlm.training import TrainConfig  # noqa: E402
from asymvlm_ray.ray_train import run_training  # noqa: E402
from asymvlm_ray.session import RaySession  # noqa: E402

#: The training flags (the others are --set keys).
TRAIN_FLAGS = "method protocol epochs lr optimizer batch_size hidden_dim seed".split()


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    run_keys = config.add_model_flags(parser, RunSpec, exclude=("train",), required=("embeddings",))
    train_keys = config.add_model_flags(
        parser,
        TrainConfig,
        exclude=set(TrainConfig.model_fields) - set(TRAIN_FLAGS),
        choices={"method": method_names()},
    )
    override = "any other TrainConfig key (YAML value; dots: method_kwargs.calibrate_input=false)"
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=override)
    parser.add_argument("--output", default="runs/train", help="Ray Train storage path")
    parser.add_argument("--name", default=None, help="the run's name (default: method-lr-seed)")
    parser.add_argument("--num-workers", type=int, default=1, help="DDP workers")
    parser.add_argument("--cpus-per-worker", type=float, default=1.0, help="CPUs per worker")
    parser.add_argument("--max-failures", type=int, default=0, help="worker deaths resumed")
    parser.set_defaults(run_keys=run_keys, train_keys=train_keys)  # what main reads back
    return parser


def main(argv: list[str] | None = None) -> int:
    def run() -> int:
        args = build_parser().parse_args(argv)
        if args.num_workers < 1 or args.max_failures < 0 or not args.cpus_per_worker > 0:
            raise ConfigError(
                "--num-workers must be >= 1, --max-failures >= 0 and --cpus-per-worker > 0"
            )
        train = config.apply_overrides(config.model_values(args, args.train_keys), args.set)
        doc = {**config.model_values(args, args.run_keys), "train": train}
        for split in ("val_split", "test_split"):  # "" switches a split off
            doc[split] = getattr(args, split) or None
        spec = config.validate(RunSpec, doc, "pipelines/train.py", flags=True)
        spec.check_splits()  # a missing table or split fails before Ray starts
        cfg = spec.train
        name = args.name or f"{cfg.method}-lr{cfg.lr:g}-seed{cfg.seed}"
        workers = {k: getattr(args, k) for k in ("num_workers", "cpus_per_worker", "max_failures")}
        with RaySession(eager=True):
            out = run_training(spec, name=name, storage_path=args.output, **workers)
        out.pop("history", None)
        sys.stdout.write(json.dumps(out, indent=2, default=str) + "\n")
        return 0

    return guarded(run)


if __name__ == "__main__":
    raise SystemExit(main())
