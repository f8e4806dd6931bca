"""The paper's protocol (App. B.4) for one (method, lr, seed) run, without Ray: seed, load the
training split, build the method and its trainer, resume, train, evaluate retrieval."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from asymvlm.checkpoints import RunState
from asymvlm.errors import ConfigError, NonFiniteError
from asymvlm.evaluation.registry import evaluate_split
from asymvlm.methods import Method, build_method
from asymvlm.protocol.spec import RunSpec
from asymvlm.splits import SplitCache, SplitTensors, hold_out_images, load_split
from asymvlm.training import (
    EpochRow,
    History,
    StreamingTrainer,
    TrainConfig,
    Trainer,
    open_stream,
    resolve_device,
)

__all__ = [
    "EpochHook",
    "TrainingRun",
    "eval_splits",
    "log_epoch",
    "results",
    "run_protocol",
    "training_data",
]

logger = logging.getLogger(__name__)

#: ``on_epoch(row, trainer, history, checkpoint_due)``, called after every epoch on every rank.
EpochHook = Callable[[EpochRow, Trainer, History, bool], None]


def training_data(
    spec: RunSpec, device: str | torch.device = "cpu", cache: SplitCache | None = None
) -> tuple[SplitTensors, SplitTensors | None]:
    """(training split, held-out validation or None): ``val_fraction`` of the training images
    when the tables have no ``val_split``; it depends on the image ids only."""
    cfg = spec.train
    load = cache.load if cache is not None else load_split
    data = load(spec.embeddings, spec.train_split, cfg.adapter_input, device)
    if not spec.holds_out():
        return data, None
    fraction = float(spec.val_fraction or 0)
    if cache is None:
        return hold_out_images(data, fraction, seed=0)
    key = ("hold-out", spec.train_split, cfg.adapter_input, str(device), fraction)
    return cache.memo(spec.embeddings, key, lambda: hold_out_images(data, fraction, seed=0))


def log_epoch(cfg: TrainConfig, row: EpochRow, note: str = "") -> None:
    """Log the loss after the first epoch and every tenth of the run."""
    epoch = int(row["epoch"])
    if epoch % max(1, cfg.epochs // 10) == 0 or epoch == 1:
        loss = row["train_loss"]
        logger.info(
            f"{cfg.method} lr={cfg.lr:g} seed={cfg.seed} epoch {epoch}/{cfg.epochs} "
            f"loss {loss:.4f}{note}"
        )


def eval_splits(
    spec: RunSpec,
    held_out: SplitTensors | None,
    device: torch.device,
    cache: SplitCache | None = None,
) -> dict[str, SplitTensors]:
    """The validation (held out, or ``val_split``) and test splits the spec names."""
    load = cache.load if cache is not None else load_split
    adapter_input = spec.train.adapter_input
    out = {"val": held_out} if held_out is not None else {}
    if held_out is None and spec.val_split:
        out["val"] = load(spec.embeddings, spec.val_split, adapter_input, device)
    if spec.test_split:
        root = spec.test_embeddings or spec.embeddings
        out["test"] = load(root, spec.test_split, adapter_input, device)
    return out


def results(
    method: Method, history: History, epochs_run: int, dim: int, splits: dict[str, SplitTensors]
) -> dict[str, Any]:
    """A run's outcome: ``history``, ``dim``, ``epochs_run`` and retrieval on each split."""
    method.eval()
    evals = {name: evaluate_split("retrieval", method, d) for name, d in splits.items()}
    return {"history": history, "dim": dim, "epochs_run": epochs_run, **evals}


class TrainingRun:
    """One run: construction seeds torch, loads the data and builds the method and its trainer
    (streaming when :func:`~asymvlm.training.use_streaming`); then :meth:`resume`, :meth:`fit`,
    :meth:`results`. A given ``device`` replaces ``spec.train.device``."""

    def __init__(
        self,
        spec: RunSpec,
        *,
        rank: int = 0,
        world_size: int = 1,
        device: str | torch.device | None = None,
        cache: SplitCache | None = None,
    ) -> None:
        self.spec, cfg = spec, spec.train
        if device is None:
            self.device = resolve_device(cfg.device)
        else:
            self.device = torch.device(device)
            cfg = cfg.model_copy(update={"device": str(self.device)})
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        torch.manual_seed(cfg.seed)
        self.cache, self.history = cache, []
        where = (spec.embeddings, spec.train_split)
        stream = open_stream(cfg, *where, rank=rank, world_size=world_size, device=self.device)
        if stream is not None and spec.holds_out():
            raise ConfigError(
                f"{spec.embeddings}/{spec.train_split} streams, and holding out "
                f"val_fraction={spec.val_fraction} of it is not supported: write a "
                f"{spec.val_split or 'val'} split to the tables or set stream='never'"
            )
        data, self.held_out = (
            (stream.sample, None) if stream else training_data(spec, self.device, cache)
        )
        self.dim = data.dim
        self.method: Method = build_method(cfg.method, data.dim, **cfg.method_args())
        self.trainer: Trainer = (
            StreamingTrainer(self.method, cfg, stream, rank=rank, world_size=world_size)
            if stream
            else Trainer(self.method, cfg, data, rank=rank, world_size=world_size)
        )

    def resume(self, state: RunState) -> None:
        """Continue from ``state`` (the trainer's state and the history of its epochs)."""
        self.trainer.load_state_dict(state.trainer)
        self.history = list(state.history)
        logger.info("resumed %s from epoch %d", self.cfg.method, self.trainer.epoch)

    def fit(
        self,
        on_epoch: EpochHook | None = None,
        *,
        progress: bool = False,
        log_epochs: bool = True,
    ) -> History:
        """Train the remaining epochs; after each the row joins the history and ``on_epoch(row,
        trainer, history, checkpoint_due)`` is called (rank 0 logs every tenth epoch)."""
        trainer, cfg = self.trainer, self.cfg

        def after_epoch(row: EpochRow) -> None:
            self.history.append(row)
            if log_epochs and self.rank == 0:
                log_epoch(cfg, row)
            if on_epoch is not None:
                on_epoch(row, trainer, self.history, self.spec.checkpoint_due(trainer.epoch))

        trainer.fit(progress=progress, on_epoch_end=after_epoch)
        return self.history

    def results(self) -> dict[str, Any]:
        """``history``, ``dim``, ``epochs_run`` and retrieval on the validation (``val``) and
        test (``test``) splits the spec names."""
        splits = eval_splits(self.spec, self.held_out, self.device, self.cache)
        return results(self.method, self.history, self.trainer.epoch, self.dim, splits)


def run_protocol(
    spec: RunSpec,
    *,
    rank: int = 0,
    world_size: int = 1,
    device: str | torch.device | None = None,
    state: RunState | None = None,
    on_epoch: EpochHook | None = None,
    progress: bool = False,
    cache: SplitCache | None = None,
) -> dict[str, Any] | None:
    """The paper's protocol for one run (App. B.4) on this worker of ``world_size``.

    Rank 0 returns :meth:`TrainingRun.results`, or ``{"diverged": reason, "history"}`` (every
    rank stops at the same step: a retry would diverge again); other ranks return None. A
    method not trained by SGD reports once, ``{"epoch": 0}`` with a checkpoint due.
    """
    run = TrainingRun(spec, rank=rank, world_size=world_size, device=device, cache=cache)
    if state is not None:
        run.resume(state)
    try:
        run.fit(on_epoch, progress=progress)
        if on_epoch is not None and not run.method.trainable:
            on_epoch({"epoch": 0}, run.trainer, run.history, True)
        return run.results() if rank == 0 else None
    except NonFiniteError as exc:
        logger.warning("%s", exc)
        return {"diverged": str(exc), "history": run.history} if rank == 0 else None
