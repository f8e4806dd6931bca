"""Ray Train: one adapter training run as a ``TorchTrainer`` (DDP over cached embeddings).

    python pipelines/train.py --embeddings ROOT --method asymvlm-vmf --lr 1e-2 --num-workers 2

The run itself is :func:`asymvlm.training.run_protocol` (the paper's protocol, App. B.4: train,
then evaluate on the validation split -- for model selection -- and the test split), run on
every worker: each keeps its shard of the captions as tensors on its device (GPU when the
cluster has them: NCCL, bf16 autocast; else gloo, fp32); the contrastive objective spans the
global batch. This module adds only what Ray brings: after every epoch each worker reports to
Ray Train, and when a checkpoint is due (every ``checkpoint_every`` epochs and after the last)
rank 0 attaches a ``ray.train.Checkpoint`` (adapter, optimiser, scheduler, RNG state, epoch,
history); with ``FailureConfig(max_failures)`` a run whose worker dies resumes from the latest
checkpoint and ends exactly where an uninterrupted run ends. Rank 0's results are the run's
``Result.return_value``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import tempfile
from dataclasses import asdict, fields
from typing import Any

import torch

from asymvlm import storage, tables
from asymvlm.errors import NonFiniteError
from asymvlm.training import (
    RunSpec,
    RunState,
    TrainConfig,
    Trainer,
    provenance,
    run_protocol,
    save_checkpoint,
)

if __name__ != "__main__":
    # Workers may not have this folder on their path (a cluster without --working-dir): ship
    # this module's functions by value rather than by reference.
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

logger = logging.getLogger(__name__)

# A Ray Train checkpoint folder holds these (the two-node test looks for the first two).
STATE_FILE = "trainer.pt"
HISTORY_FILE = "history.json"
MODEL_DIR = "model"
_TRAIN_KEYS = {f.name for f in fields(TrainConfig)}


def train_loop_per_worker(config: dict[str, Any]) -> dict[str, Any] | None:
    """:func:`run_protocol` on this worker (rank, world size and device from Ray Train),
    continued from the run's latest checkpoint if there is one; rank 0 returns the results."""
    import ray.train
    import ray.train.torch

    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    device = ray.train.torch.get_device()
    worker_logging(rank)
    state = None
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state = read_state(directory)

    def on_epoch(
        row: dict[str, float], trainer: Trainer, history: list[dict[str, float]], due: bool
    ) -> None:
        if due:
            _report_with_checkpoint(row, trainer, history, rank)
        else:
            ray.train.report(row)
        maybe_inject_failure(config, trainer.epoch, rank)

    return run_protocol(
        RunSpec.from_dict(config),
        rank=rank,
        world_size=world_size,
        device=device,
        state=state,
        on_epoch=on_epoch,
    )


def read_state(directory: str) -> RunState:
    """The trainer state and history of a checkpoint written by :func:`_report_with_checkpoint`,
    on the CPU whatever the run's device: the trainer moves the weights and optimiser state to
    its device, and the RNG state must stay a CPU tensor (torch.set_rng_state refuses others)."""
    trainer = torch.load(os.path.join(directory, STATE_FILE), map_location="cpu",
                         weights_only=False)  # fmt: skip
    with open(os.path.join(directory, HISTORY_FILE)) as fh:
        history = json.load(fh)
    return RunState(trainer=trainer, history=history)


def _report_with_checkpoint(
    row: dict[str, float], trainer: Trainer, history: list[dict[str, float]], rank: int
) -> None:
    """Every worker reports; rank 0 attaches the checkpoint (one copy of the replicated state)."""
    import ray.train

    with tempfile.TemporaryDirectory() as directory:
        checkpoint = None
        if rank == 0:
            write_checkpoint(directory, trainer, history)
            checkpoint = ray.train.Checkpoint.from_directory(directory)
        ray.train.report(row, checkpoint=checkpoint)


def write_checkpoint(directory: str, trainer: Trainer, history: list[dict[str, float]]) -> None:
    """A Ray checkpoint folder: the trainer state (resume), the history and the adapter
    (``model/``, a checkpoint folder :func:`asymvlm.training.load_checkpoint` reads)."""
    torch.save(trainer.state_dict(), os.path.join(directory, STATE_FILE))
    with open(os.path.join(directory, HISTORY_FILE), "w") as fh:
        json.dump(history, fh)
    save_adapter(directory, trainer)


def save_adapter(directory: str, trainer: Trainer) -> None:
    """The trainer's adapter as ``<directory>/model``, a checkpoint folder
    :func:`asymvlm.training.load_checkpoint` reads (its epoch, the tables' encoder)."""
    save_checkpoint(
        os.path.join(directory, MODEL_DIR),
        trainer.method,
        trainer.cfg,
        trainer.data.dim,
        extra={"epoch": trainer.epoch, **provenance(trainer.data.split.manifest)},
    )


FAULT_ENV = "ASYMVLM_FAULT_INJECTION"


def maybe_inject_failure(config: dict[str, Any], epoch: int, rank: int) -> None:
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
        logger.warning("injected failure: worker %d is killed after epoch %d", rank, epoch)
        os.kill(os.getpid(), signal.SIGKILL)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (Ray redirects it)."""

    worker_handler = True  # marks ours (the class itself may be shipped anew by value)

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def worker_logging(rank: int, label: str = "train rank") -> None:
    """This run's log records (``asymvlm.*`` and this module's, INFO and up) go to the worker's
    stderr as ``[train rank N] message``, which Ray streams to the driver's (the job's) log.
    Ray leaves other loggers to the root logger, which may drop INFO; they do not propagate
    there, so no record shows twice. Idempotent."""
    formatter = logging.Formatter(f"[{label} {rank}] %(message)s")
    for log in (logging.getLogger("asymvlm"), logger):
        for old in [h for h in log.handlers if getattr(h, "worker_handler", False)]:
            log.removeHandler(old)
        handler = _StderrHandler()
        handler.setFormatter(formatter)
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def _absolute(path: str) -> str:
    """Local paths made absolute (workers run elsewhere); URIs (s3://...) as they are."""
    return path if "://" in path else os.path.abspath(path)


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
    """The ``train_loop_config`` of one run (plain JSON types: it travels to every worker):
    a :class:`RunSpec` (``val_fraction`` and ``test_embeddings`` among ``extra``), validated
    here, plus the rest of ``extra`` as it is (fault injection: ``fail_at_epoch`` ...)."""
    train = asdict(train) if isinstance(train, TrainConfig) else dict(train)
    unknown = set(train) - _TRAIN_KEYS
    if unknown:
        raise ValueError(f"unknown training keys {sorted(unknown)}")
    spec = RunSpec.from_dict(
        {
            **extra,
            "embeddings": _absolute(embeddings),
            "train": train,
            "train_split": train_split,
            "val_split": val_split,
            "test_split": test_split,
            "checkpoint_every": checkpoint_every,
        }
    )
    return {**extra, **spec.to_dict()}


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
    callbacks: list | None = None,
) -> dict[str, Any]:
    """Run one training as a TorchTrainer; returns rank 0's results plus where they are stored.

    ``use_gpu=None`` uses GPUs when the cluster has them (NCCL), else gloo on CPUs.
    ``callbacks``: Ray Train callbacks of the run (``RunConfig(callbacks=...)``), e.g. to pass
    every epoch's report on.
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
            callbacks=callbacks,
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


#: Flags with a fixed default; the others default to the protocol's value for the method.
_FIXED = ("method", "protocol", "epochs", "batch_size", "seed")

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
    flags = {"method": str, "protocol": str, "epochs": int, "lr": float, "optimizer": str,
             "batch_size": int, "hidden_dim": int, "seed": int}  # fmt: skip
    for key, kind in flags.items():  # None: the protocol's default for the method
        parser.add_argument(f"--{key.replace('_', '-')}", type=kind,
                            default=getattr(defaults, key) if key in _FIXED else None)  # fmt: skip
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
        doc = {k: getattr(args, k) for k in flags if getattr(args, k) is not None}
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
        sys.stdout.write(json.dumps(summary, indent=2, default=str) + "\n")
        return 0

    from asymvlm.errors import guarded

    return guarded(run)


if __name__ == "__main__":
    raise SystemExit(main())
