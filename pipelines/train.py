"""Ray Train: one adapter training run as a ``TorchTrainer`` (DDP over cached embeddings).

    python pipelines/train.py --embeddings ROOT --method asymvlm-vmf --lr 1e-2 --num-workers 2

Each worker loads the split, keeps its shard of the captions as tensors on its device (GPU when
the cluster has them: NCCL, bf16 autocast; else gloo, fp32) and runs
:class:`asymvlm.training.Trainer`, whose contrastive objective spans the global batch. Every
``checkpoint_every`` epochs rank 0 writes a ``ray.train.Checkpoint`` (adapter, optimiser,
scheduler, RNG state, epoch, history); with ``FailureConfig(max_failures)`` a run whose worker
dies resumes from the latest checkpoint and ends exactly where an uninterrupted run ends. At the
end rank 0 evaluates on the validation split (for model selection) and the test split and
returns everything (``Result.return_value``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import asdict, fields
from typing import Any

import torch

from asymvlm import storage, tables
from asymvlm.errors import NonFiniteError
from asymvlm.evaluation import evaluate_retrieval
from asymvlm.methods import build_method
from asymvlm.training import (
    TrainConfig,
    Trainer,
    hold_out_images,
    load_split,
    save_checkpoint,
)

if __name__ != "__main__":
    # Workers may not have this folder on their path (a cluster without --working-dir): ship
    # this module's functions by value rather than by reference.
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

STATE_FILE = "trainer.pt"
HISTORY_FILE = "history.json"
MODEL_DIR = "model"
_TRAIN_KEYS = {f.name for f in fields(TrainConfig)}


def train_loop_per_worker(config: dict[str, Any]) -> dict[str, Any] | None:
    """The paper's protocol (App. B.4) on this worker's shard; rank 0 returns the results."""
    import ray.train
    import ray.train.torch

    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    device = ray.train.torch.get_device()
    cfg = TrainConfig(**config["train"])
    cfg.device = str(device)

    torch.manual_seed(cfg.seed)
    data, held_out = _training_data(config, cfg.adapter_input, device)
    method = build_method(cfg.method, data.dim, **cfg.method_args())
    trainer = Trainer(method, cfg, data, rank=rank, world_size=world_size)
    dim = data.dim
    del data  # the trainer keeps this worker's shard

    history: list[dict[str, float]] = []
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state = torch.load(
                os.path.join(directory, STATE_FILE), map_location=device, weights_only=False
            )
            trainer.load_state_dict(state)
            with open(os.path.join(directory, HISTORY_FILE)) as fh:
                history = json.load(fh)
        _log(rank, f"resumed {cfg.method} from epoch {trainer.epoch}")
    elif method.trainable:
        trainer.start()

    every = max(1, int(config.get("checkpoint_every", 1)))
    try:
        while method.trainable and trainer.epoch < cfg.epochs:
            t0 = time.perf_counter()
            row = trainer.train_epoch()
            row["epoch_seconds"] = time.perf_counter() - t0
            history.append(row)
            if rank == 0 and (trainer.epoch % max(1, cfg.epochs // 10) == 0 or trainer.epoch == 1):
                _log(rank, f"{cfg.method} lr={cfg.lr:g} seed={cfg.seed} epoch {trainer.epoch}/"
                           f"{cfg.epochs} loss {row['train_loss']:.4f}")  # fmt: skip
            last = trainer.epoch == cfg.epochs
            if trainer.epoch % every == 0 or last:
                _report_with_checkpoint(row, trainer, history, rank)
            else:
                ray.train.report(row)
            _maybe_inject_failure(config, trainer.epoch, rank)
        if rank != 0:
            return None
        method.eval()
        out: dict[str, Any] = {"history": history, "dim": dim, "epochs_run": trainer.epoch}
        if held_out is not None:
            out["val"] = evaluate_retrieval(method, held_out)
        elif config.get("val_split"):
            val = load_split(config["embeddings"], config["val_split"], cfg.adapter_input, device)
            out["val"] = evaluate_retrieval(method, val)
        if config.get("test_split"):
            root = config.get("test_embeddings") or config["embeddings"]
            test = load_split(root, config["test_split"], cfg.adapter_input, device)
            out["test"] = evaluate_retrieval(method, test)
        return out
    except NonFiniteError as exc:
        # Deterministic: every rank sees the same global-batch loss and the same all-reduced
        # gradient, so all stop at the same step. Returned rather than raised: a Ray Train
        # retry from the last checkpoint would only diverge again.
        _log(rank, str(exc))
        return {"diverged": str(exc), "history": history} if rank == 0 else None


def _training_data(config: dict[str, Any], adapter_input: str, device: torch.device):
    """(train split, held-out validation or None): a ``val_fraction`` of the training images is
    held out when the tables have no ``val_split`` (COCO 2017, CC). The hold-out is the same
    for every worker, seed and method (it depends only on the image ids)."""
    root = config["embeddings"]
    data = load_split(root, config["train_split"], adapter_input, device)
    fraction = config.get("val_fraction")
    val_split = config.get("val_split")
    if fraction and (not val_split or val_split not in tables.list_splits(root)):
        return hold_out_images(data, float(fraction), seed=0)
    return data, None


def _report_with_checkpoint(
    row: dict[str, float], trainer: Trainer, history: list[dict[str, float]], rank: int
) -> None:
    """Every worker reports; rank 0 attaches the checkpoint (one copy of the replicated state)."""
    import ray.train

    with tempfile.TemporaryDirectory() as directory:
        checkpoint = None
        if rank == 0:
            torch.save(trainer.state_dict(), os.path.join(directory, STATE_FILE))
            with open(os.path.join(directory, HISTORY_FILE), "w") as fh:
                json.dump(history, fh)
            save_checkpoint(
                os.path.join(directory, MODEL_DIR),
                trainer.method,
                trainer.cfg,
                trainer.data.dim,
                extra={"epoch": trainer.epoch},
            )
            checkpoint = ray.train.Checkpoint.from_directory(directory)
        ray.train.report(row, checkpoint=checkpoint)


FAULT_ENV = "ASYMVLM_FAULT_INJECTION"


def _maybe_inject_failure(config: dict[str, Any], epoch: int, rank: int) -> None:
    """Fault-injection for tests: worker ``fail_rank`` SIGKILLs its own process once, right
    after the checkpoint of epoch ``fail_at_epoch`` was reported (a marker file makes it once).

    Set in the run config (``fail_at_epoch``, ``fail_rank``, ``fail_marker``) or, for a submitted
    job, in the environment: ``ASYMVLM_FAULT_INJECTION="epoch=2,rank=0,marker=/tmp/killed"``
    (e.g. through ``ray job submit --runtime-env-json '{"env_vars": {...}}'``).
    """
    spec = {"epoch": config.get("fail_at_epoch"), "rank": config.get("fail_rank", 0),
            "marker": config.get("fail_marker")}  # fmt: skip
    if spec["epoch"] is None and os.environ.get(FAULT_ENV):
        spec |= dict(item.split("=", 1) for item in os.environ[FAULT_ENV].split(",") if item)
    if spec["epoch"] is None or epoch != int(spec["epoch"]) or rank != int(spec["rank"]):
        return
    marker = spec["marker"]
    if marker and not os.path.exists(marker):
        with open(marker, "w") as fh:
            fh.write(f"worker {rank} killed after epoch {epoch}\n")
        _log(rank, f"injected failure: worker {rank} is killed after epoch {epoch}")
        os.kill(os.getpid(), signal.SIGKILL)


def _absolute(path: str) -> str:
    """Local paths made absolute (workers run elsewhere); URIs (s3://...) as they are."""
    return path if "://" in path else os.path.abspath(path)


def _log(rank: int, msg: str) -> None:
    print(f"[train rank {rank}] {msg}", file=sys.stderr, flush=True)


# -- the TorchTrainer ---------------------------------------------------------------------------
def run_config_dict(
    embeddings: str,
    train: TrainConfig | dict[str, Any],
    *,
    train_split: str = "train",
    val_split: str | None = "val",
    test_split: str | None = "test",
    checkpoint_every: int = 1,
    **extra: Any,
) -> dict[str, Any]:
    """The ``train_loop_config`` of one run (plain JSON types: it travels to every worker)."""
    train = asdict(train) if isinstance(train, TrainConfig) else dict(train)
    unknown = set(train) - _TRAIN_KEYS
    if unknown:
        raise ValueError(f"unknown training keys {sorted(unknown)}")
    return {
        "embeddings": _absolute(embeddings),
        "train": train,
        "train_split": train_split,
        "val_split": val_split,
        "test_split": test_split,
        "checkpoint_every": checkpoint_every,
        **extra,
    }


def run_training(
    config: dict[str, Any],
    *,
    name: str,
    storage_path: str,
    num_workers: int = 1,
    use_gpu: bool | None = None,
    cpus_per_worker: float = 1.0,
    gpus_per_worker: float = 1.0,
    max_failures: int = 0,
) -> dict[str, Any]:
    """Run one training as a TorchTrainer; returns rank 0's results plus where they are stored.

    ``use_gpu=None`` uses GPUs when the cluster has them (NCCL), else gloo on CPUs.
    """
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    if use_gpu is None:
        use_gpu = ray.cluster_resources().get("GPU", 0) > 0
    # Local folder, or an object store every node reaches (Ray Train needs storage that all
    # workers share: checkpoints are uploaded there from whichever node reports them).
    storage_path, storage_filesystem = storage.ray_storage(storage_path)
    resources = {"CPU": cpus_per_worker, **({"GPU": gpus_per_worker} if use_gpu else {})}
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config=config,
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        scaling_config=ScalingConfig(
            num_workers=num_workers, use_gpu=use_gpu, resources_per_worker=resources
        ),
        run_config=RunConfig(
            name=name,
            storage_path=storage_path,
            storage_filesystem=storage_filesystem,
            failure_config=FailureConfig(max_failures=max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=2),
        ),
    )
    result = trainer.fit()
    if result.error is not None:
        raise result.error
    out = dict(result.return_value or {})
    if out.get("diverged"):
        raise NonFiniteError(out["diverged"])
    out["path"] = storage.uri_of(result.filesystem, result.path)
    ckpt = result.checkpoint
    out["checkpoint"] = storage.uri_of(ckpt.filesystem, ckpt.path) if ckpt is not None else None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--embeddings", required=True, help="embedding tables ROOT")
    parser.add_argument("--train-split", default="train")
    parser.add_argument("--val-split", default="val")
    parser.add_argument("--test-split", default="test")
    parser.add_argument("--output", default="runs/train", help="Ray Train storage path")
    parser.add_argument("--name", default=None)
    parser.add_argument("--num-workers", type=int, default=1)
    parser.add_argument("--cpus-per-worker", type=float, default=1.0)
    parser.add_argument("--max-failures", type=int, default=0)
    parser.add_argument("--checkpoint-every", type=int, default=1)
    defaults = TrainConfig()
    for key in ("method", "epochs", "lr", "optimizer", "batch_size", "hidden_dim", "seed"):
        parser.add_argument(f"--{key.replace('_', '-')}", type=type(getattr(defaults, key)),
                            default=getattr(defaults, key))  # fmt: skip
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="any other TrainConfig key (YAML value; dots: "
                             "method_kwargs.calibrate_input=false)")  # fmt: skip
    args = parser.parse_args(argv)

    def run() -> int:
        from asymvlm import config
        from asymvlm.errors import ConfigError

        for flag in ("num_workers", "checkpoint_every"):
            if getattr(args, flag) < 1:
                raise ConfigError(f"--{flag.replace('_', '-')} must be >= 1")
        if args.max_failures < 0 or not args.cpus_per_worker > 0:
            raise ConfigError("--max-failures must be >= 0 and --cpus-per-worker > 0")
        doc = {k: getattr(args, k) for k in
               ("method", "epochs", "lr", "optimizer", "batch_size", "hidden_dim", "seed")}
        train = config.validate(TrainConfig, config.apply_overrides(doc, args.set),
                                "pipelines/train.py", flags=True)  # fmt: skip
        tables.read_manifest(args.embeddings)  # a missing table fails before Ray starts
        run_cfg = run_config_dict(
            args.embeddings,
            train,
            train_split=args.train_split,
            val_split=args.val_split or None,
            test_split=args.test_split or None,
            checkpoint_every=args.checkpoint_every,
        )
        from pipelines.ray_session import init_ray

        init_ray()
        out = run_training(
            run_cfg,
            name=args.name or f"{args.method}-lr{args.lr:g}-seed{args.seed}",
            storage_path=args.output,
            num_workers=args.num_workers,
            cpus_per_worker=args.cpus_per_worker,
            max_failures=args.max_failures,
        )
        summary = {k: v for k, v in out.items() if k != "history"}
        json.dump(summary, sys.stdout, indent=2, default=str)
        print()
        return 0

    from asymvlm.errors import guarded

    return guarded(run)


if __name__ == "__main__":
    raise SystemExit(main())
