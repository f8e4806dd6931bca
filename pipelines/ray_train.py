"""Ray Train: one adapter training run as a ``TorchTrainer`` (DDP over cached embeddings).

The run itself is :func:`asymvlm.protocol.run_protocol` (the paper's protocol, App. B.4: train,
then evaluate on the validation split -- for model selection -- and the test split), run on
every worker: each keeps its shard of the captions as tensors on its device (GPU when the
cluster has them: NCCL, bf16 autocast; else gloo, fp32); the contrastive objective spans the
global batch. This module adds only what Ray brings: after every epoch each worker reports to
Ray Train, and when a checkpoint is due (every ``checkpoint_every`` epochs and after the last)
rank 0 attaches a ``ray.train.Checkpoint`` -- a checkpoint folder of
:mod:`asymvlm.checkpoints` (adapter, trainer state, history); with
``FailureConfig(max_failures)`` a run whose worker dies resumes from the latest checkpoint and
ends exactly where an uninterrupted run ends. Rank 0's results are the run's
``Result.return_value``.

The run travels typed: ``train_loop_config`` is ``{"spec": RunSpec, "fault": FaultInjection |
None}`` (pickled once, at the Ray Train boundary).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from asymvlm import storage
from asymvlm.checkpoints import read_run_state, save_run_checkpoint
from asymvlm.errors import NonFiniteError
from asymvlm.protocol import RunSpec, run_protocol
from asymvlm.training import EpochRow, History, Trainer
from pipelines.schema import FaultInjection
from pipelines.session import require_ray

__all__ = [
    "checkpoint_folder",
    "maybe_inject_failure",
    "run_training",
    "train_loop_per_worker",
    "worker_logging",
]

logger = logging.getLogger(__name__)


def train_loop_per_worker(config: dict[str, Any]) -> dict[str, Any] | None:
    """:func:`run_protocol` on this worker (rank, world size and device from Ray Train),
    continued from the run's latest checkpoint if there is one; rank 0 returns the results."""
    import ray.train
    import ray.train.torch

    spec: RunSpec = config["spec"]
    fault: FaultInjection | None = config.get("fault")
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    worker_logging(rank)
    state = None
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state = read_run_state(directory)

    def on_epoch(row: EpochRow, trainer: Trainer, history: History, due: bool) -> None:
        if due:
            with checkpoint_folder(trainer, history, rank == 0) as folder:
                ckpt = ray.train.Checkpoint.from_directory(folder) if folder else None
                ray.train.report(row, checkpoint=ckpt)
        else:
            ray.train.report(row)
        maybe_inject_failure(fault, trainer.epoch, rank)

    return run_protocol(
        spec,
        rank=rank,
        world_size=world_size,
        device=ray.train.torch.get_device(),
        state=state,
        on_epoch=on_epoch,
    )


@contextlib.contextmanager
def checkpoint_folder(
    trainer: Trainer, history: History, write: bool = True
) -> Iterator[str | None]:
    """A temporary checkpoint folder of the run where ``trainer`` stands (adapter, trainer
    state, history: :func:`asymvlm.checkpoints.save_run_checkpoint`) for the block, to report
    to Ray; None when this worker does not write it (``write``: rank 0 only, one copy of the
    replicated state)."""
    if not write:
        yield None
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "checkpoint")
        save_run_checkpoint(folder, trainer, history)
        yield folder


def maybe_inject_failure(fault: FaultInjection | None, epoch: int, rank: int) -> None:
    """A drill (:class:`~pipelines.schema.FaultInjection`, else ``$ASYMVLM_FAULT_INJECTION``):
    worker ``fault.rank`` SIGKILLs its own process once (or pauses), right after the checkpoint
    of epoch ``fault.epoch`` was reported (its marker file makes it once)."""
    fault = fault or FaultInjection.from_environment()
    if fault is None or epoch != fault.epoch or rank != fault.rank:
        return
    if fault.marker and not os.path.exists(fault.marker):
        with open(fault.marker, "w") as fh:
            fh.write(f"worker {rank}: {fault.action} after epoch {epoch}\n")
        if fault.action == "pause":
            logger.warning(
                "injected pause: worker %d holds for %.0f s after epoch %d",
                rank,
                fault.seconds,
                epoch,
            )
            time.sleep(fault.seconds)
            return
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


def run_training(
    spec: RunSpec,
    *,
    name: str,
    storage_path: str,
    num_workers: int = 1,
    use_gpu: bool | None = None,
    cpus_per_worker: float = 1.0,
    gpus_per_worker: float = 1.0,
    max_failures: int = 0,
    fault: FaultInjection | None = None,
    callbacks: list | None = None,
) -> dict[str, Any]:
    """Run ``spec`` as a TorchTrainer on the running cluster; returns rank 0's results plus
    where they are stored (``path``, ``checkpoint``: the final checkpoint folder's URI).

    ``use_gpu=None`` uses GPUs when the cluster has them (NCCL), else gloo on CPUs.
    ``callbacks``: Ray Train callbacks of the run (``RunConfig(callbacks=...)``), e.g. to pass
    every epoch's report on."""
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    require_ray("a Ray Train run")
    if use_gpu is None:
        use_gpu = ray.cluster_resources().get("GPU", 0) > 0
    # Local folder, or an object store every node reaches (Ray Train needs storage that all
    # workers share: checkpoints are uploaded there from whichever node reports them).
    storage_path, storage_filesystem = storage.ray_storage(storage_path)
    resources = {"CPU": cpus_per_worker, **({"GPU": gpus_per_worker} if use_gpu else {})}
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
