"""Ray Train: :func:`asymvlm.runner.train_and_evaluate` as a ``TorchTrainer`` (DDP); rank 0
reports each checkpoint due, from which ``FailureConfig`` resumes a run whose worker died."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

from asymvlm import storage
from asymvlm.checkpoints import read_run_state, save_run_checkpoint
from asymvlm.errors import NonFiniteError
from asymvlm.runner import RunSpec, train_and_evaluate
from asymvlm.training import EpochRow, History, Trainer
from asymvlm_ray.schema import FaultInjection
from asymvlm_ray.session import require_ray

logger = logging.getLogger(__name__)


def train_loop_per_worker(config: dict[str, Any]) -> dict[str, Any] | None:
    """:func:`train_and_evaluate` on this worker, continued from the run's latest checkpoint."""
    import ray.train
    import ray.train.torch

    spec: RunSpec = config["spec"]
    fault: FaultInjection | None = config.get("fault")
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    worker_logging(rank)
    state = None
    if (checkpoint := ray.train.get_checkpoint()) is not None:
        with checkpoint.as_directory() as directory:
            state = read_run_state(directory)

    def on_epoch(row: EpochRow, trainer: Trainer, history: History, due: bool) -> None:
        if due and rank == 0:  # rank 0 writes the one copy of the replicated state
            with checkpoint_folder(trainer, history) as folder:
                ray.train.report(row, checkpoint=ray.train.Checkpoint.from_directory(folder))
        else:
            ray.train.report(row)
        maybe_inject_failure(fault, trainer.epoch, rank)

    return train_and_evaluate(
        spec,
        rank=rank,
        world_size=world_size,
        device=ray.train.torch.get_device(),
        state=state,
        on_epoch=on_epoch,
    )


@contextlib.contextmanager
def checkpoint_folder(trainer: Trainer, history: History) -> Iterator[str]:
    """A temporary checkpoint folder of the run where ``trainer`` stands, to report to Ray."""
    with tempfile.TemporaryDirectory() as tmp:
        save_run_checkpoint(os.path.join(tmp, "checkpoint"), trainer, history)
        yield os.path.join(tmp, "checkpoint")


def maybe_inject_failure(fault: FaultInjection | None, epoch: int, rank: int) -> None:
    """A drill (:class:`~asymvlm_ray.schema.FaultInjection`, else from the environment)."""
    fault = fault or FaultInjection.from_environment()
    if fault is not None and epoch == fault.epoch and rank == fault.rank:
        fault.fire(f"worker {rank}", f"epoch {epoch}")


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (Ray redirects it)."""

    worker_handler = True  # marks ours (the class itself may be shipped anew by value)
    stream = property(lambda self: sys.stderr, lambda self, value: None)  # type: ignore[assignment]


def worker_logging(rank: int, label: str = "train rank") -> None:
    """``asymvlm.*``, ``asymvlm_ray.*`` records (INFO+) to stderr: ``[train rank N] message``."""
    formatter = logging.Formatter(f"[{label} {rank}] %(message)s")
    for log in (logging.getLogger("asymvlm"), logging.getLogger("asymvlm_ray")):
        for old in [h for h in log.handlers if getattr(h, "worker_handler", False)]:
            log.removeHandler(old)
        handler = _StderrHandler()
        handler.setFormatter(formatter)
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def run_training(
    spec: RunSpec,
    *,
    name: str,
    storage_path: str,
    num_workers: int = 1,
    cpus_per_worker: float = 1.0,
    max_failures: int = 0,
    fault: FaultInjection | None = None,
) -> dict[str, Any]:
    """``spec`` as a TorchTrainer (NCCL on GPUs, else gloo); rank 0's results, ``checkpoint``."""
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    require_ray("a Ray Train run")
    use_gpu = ray.cluster_resources().get("GPU", 0) > 0
    storage_path, storage_filesystem = storage.ray_storage(storage_path)
    resources = {"CPU": cpus_per_worker, **({"GPU": 1.0} if use_gpu else {})}
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"spec": spec, "fault": fault},
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
