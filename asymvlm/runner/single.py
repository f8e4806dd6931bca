"""One (method, lr, seed) training run (App. B.4), without Ray: a :class:`RunSpec` trained and
evaluated (:func:`train_and_evaluate`), or trained into a checkpoint (:func:`train`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Annotated, Any

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from asymvlm import tables
from asymvlm.checkpoints import (
    RunState,
    check_resumable,
    checkpoint_to_resume,
    discard_checkpoint,
    load_checkpoint,
    read_history,
    read_run_state,
    save_run_checkpoint,
)
from asymvlm.config import validate
from asymvlm.errors import CheckpointError, ConfigError, NonFiniteError
from asymvlm.evaluation.registry import evaluate_split
from asymvlm.methods import METHODS, Method, build_method
from asymvlm.splits import SplitCache, SplitTensors, hold_out_images, load_split
from asymvlm.storage import absolute
from asymvlm.training import (
    EpochRow,
    History,
    StreamingTrainer,
    TrainConfig,
    Trainer,
    open_stream,
    resolve_device,
)
from asymvlm.training.stream import table_input

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
        logger.info(
            f"{cfg.method} lr={cfg.lr:g} seed={cfg.seed} epoch {epoch}/{cfg.epochs} "
            f"loss {row['train_loss']:.4f}{note}"
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


def run_outcome(
    method: Method, history: History, epochs_run: int, dim: int, splits: dict[str, SplitTensors]
) -> dict[str, Any]:
    """A run's outcome: ``history``, ``dim``, ``epochs_run`` and retrieval on each split."""
    method.eval()
    evals = {name: evaluate_split("retrieval", method, d) for name, d in splits.items()}
    return {"history": history, "dim": dim, "epochs_run": epochs_run, **evals}


class TrainingRun:
    """One run: construction seeds torch, loads the data and builds the method and its trainer
    (streaming when :func:`~asymvlm.training.use_streaming`); then :meth:`resume`, :meth:`fit`,
    :meth:`outcome`. A given ``device`` replaces ``spec.train.device``."""

    def __init__(
        self,
        spec: RunSpec,
        *,
        rank: int = 0,
        world_size: int = 1,
        device: str | torch.device | None = None,
        cache: SplitCache | None = None,
    ) -> None:
        spec.check_splits()  # a split missing is said before training, not after it
        spec = spec.with_table_input()
        self.spec, cfg = spec, spec.train
        if device is None:
            self.device = resolve_device(cfg.device)
        else:
            self.device = torch.device(device)
            cfg = cfg.model_copy(update={"device": str(self.device)})
        self.cfg = cfg
        self.rank = rank
        torch.manual_seed(cfg.seed)
        self.cache = cache
        self.history = []
        where = (spec.embeddings, spec.train_split)
        stream = open_stream(cfg, *where, rank=rank, world_size=world_size, device=self.device)
        if stream is not None and spec.holds_out():
            raise ConfigError(
                f"{spec.embeddings}/{spec.train_split} streams, and holding out "
                f"val_fraction={spec.val_fraction} of it is not supported: write a "
                f"{spec.val_split or 'val'} split to the tables or set stream='never'"
            )
        data, self.held_out = (None, None) if stream else training_data(spec, self.device, cache)
        self.dim = stream.dim if stream else data.dim
        self.method: Method = build_method(cfg.method, self.dim, **cfg.method_args())
        if stream:
            self.trainer: Trainer = StreamingTrainer(self.method, cfg, stream)
        else:
            self.trainer = Trainer(self.method, cfg, data, rank=rank, world_size=world_size)

    def resume(self, state: RunState) -> None:
        """Continue from ``state`` (the trainer's state and the history of its epochs)."""
        self.trainer.load_state_dict(state.trainer)
        self.history = list(state.history)
        logger.info("resumed %s from epoch %d", self.cfg.method, self.trainer.epoch)

    def fit(self, on_epoch: EpochHook | None = None, *, progress=False, log_epochs=True) -> History:
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

    def outcome(self) -> dict[str, Any]:
        """``history``, ``dim``, ``epochs_run`` and retrieval on the spec's ``val`` and ``test``."""
        splits = eval_splits(self.spec, self.held_out, self.device, self.cache)
        return run_outcome(self.method, self.history, self.trainer.epoch, self.dim, splits)


def train_and_evaluate(
    spec: RunSpec,
    *,
    rank: int = 0,
    world_size: int = 1,
    device: str | torch.device | None = None,
    state: RunState | None = None,
    on_epoch: EpochHook | None = None,
    cache: SplitCache | None = None,
) -> dict[str, Any] | None:
    """One run trained and evaluated (App. B.4) on this worker of ``world_size``: rank 0
    returns :meth:`TrainingRun.outcome` or ``{"diverged": reason, "history"}``, other ranks None.
    A method not trained by SGD reports once, ``{"epoch": 0}`` with a checkpoint due."""
    run = TrainingRun(spec, rank=rank, world_size=world_size, device=device, cache=cache)
    if state is not None:
        run.resume(state)
    try:
        run.fit(on_epoch)
        if on_epoch is not None and not run.method.trainable:
            on_epoch({"epoch": 0}, run.trainer, run.history, True)
        return run.outcome() if rank == 0 else None
    except NonFiniteError as exc:
        logger.warning("%s", exc)
        return {"diverged": str(exc), "history": run.history} if rank == 0 else None


class RunSpec(BaseModel):
    """One run: the embedding tables, the hyper-parameters, the splits (validated once, frozen;
    table roots in one spelling, :func:`asymvlm.storage.absolute`, since workers run elsewhere)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    embeddings: str = Field(description="the embedding tables ROOT (a folder or an s3:// URI)")
    train: TrainConfig = Field(default_factory=TrainConfig, description="the hyper-parameters")
    train_split: str = Field("train", description="split of the tables to train on")
    val_split: str | None = Field(
        "val", description="split to select the learning rate on (none: no validation)"
    )
    test_split: str | None = Field("test", description="split to report (none: no test)")
    val_fraction: Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)] | None = Field(
        None,
        description="when the tables have no val_split: hold out this share of the training "
        "images (with their captions) for validation -- the same for every worker, seed and "
        "method",
    )
    test_embeddings: str | None = Field(
        None, description="the tables holding test_split, when they are not embeddings"
    )
    checkpoint_every: Annotated[int, Field(ge=1)] | None = Field(
        1,
        description="a checkpoint is due every that many epochs and after the last one (none: "
        "after the last one only)",
    )

    @field_validator("embeddings", "test_embeddings")
    @classmethod
    def _one_spelling(cls, value: str | None) -> str | None:
        return None if value is None else absolute(value)

    def variant(self, *, lr: float, seed: int) -> RunSpec:
        """This run at another ``lr`` and ``seed``."""
        return self.model_copy(
            update={"train": self.train.model_copy(update={"lr": lr, "seed": seed})}
        )

    def with_table_input(self) -> RunSpec:
        """This run on the adapter input its tables give (:func:`table_input`)."""
        cfg = table_input(self.train, self.embeddings, self.train_split)
        return self if cfg is self.train else self.model_copy(update={"train": cfg})

    def holds_out(self) -> bool:
        """Whether ``val_fraction`` of the training images is held out (no ``val_split``)."""
        splits = tables.list_splits(self.embeddings) if self.val_fraction else []
        return bool(self.val_fraction) and self.val_split not in splits

    def check_splits(self) -> None:
        """Refuse tables that lack a split this run reads, before it starts (the message of
        :func:`~asymvlm.tables.check_split`; a missing val split says how to hold one out)."""
        tables.check_split(self.embeddings, self.train_split)
        if self.val_split and not self.val_fraction:
            try:
                tables.check_split(self.embeddings, self.val_split)
            except tables.TableError as exc:
                raise tables.TableError(
                    f"{exc}: write one, or set val_fraction to hold out that share of the "
                    "training images (with their captions) for validation, e.g. 0.1"
                ) from None
        if self.test_split:
            tables.check_split(self.test_embeddings or self.embeddings, self.test_split)

    def checkpoint_due(self, epoch: int) -> bool:
        every = self.checkpoint_every
        return epoch == self.train.epochs or (every is not None and epoch % every == 0)


def train(
    embeddings: str,
    split: str = "train",
    cfg: TrainConfig | Mapping[str, Any] | None = None,
    output: str | None = None,
    progress: bool = True,
    *,
    checkpoint_every: int | None = None,
    resume: bool = False,
    overwrite: bool = False,
) -> tuple[Method, History]:
    """Train one method on ``embeddings``/``split`` (``asymvlm train``, docs/api.md): ``cfg`` a
    :class:`TrainConfig` or its keys; ``output`` a checkpoint folder (incomplete every
    ``checkpoint_every`` epochs, complete at the end). Returns (method, history)."""
    if not isinstance(cfg, TrainConfig):
        cfg = validate(TrainConfig, dict(cfg or {}), "asymvlm.train")
    if checkpoint_every is not None and checkpoint_every < 1:
        raise ConfigError(f"--checkpoint-every must be >= 1, got {checkpoint_every}")
    previous = None  # an output that is taken: said before the tables are looked at
    if output is not None:
        previous = checkpoint_to_resume(output, resume=resume, overwrite=overwrite)
    cfg = table_input(cfg, embeddings, split)  # before a resume compares it to the checkpoint's
    if previous is not None:
        assert output is not None
        check_resumable(output, previous, cfg, embeddings, split)
        epoch = previous.get("epoch")
        where = "" if epoch is None else f" (epoch {epoch} of {previous.get('epochs')})"
        if previous["complete"]:
            logger.info("%s already holds a complete checkpoint%s; nothing to do", output, where)
            method, _ = load_checkpoint(output, resolve_device(cfg.device))
            return method, read_history(output)
        logger.info("resuming %s%s", output, where)
    what = f"{cfg.epochs} epochs, {cfg.optimizer} lr={cfg.lr:g}, batch {cfg.batch_size}"
    if not METHODS[cfg.method].trainable:  # fitted post hoc (bayesvlm) or used as is (clip)
        what = "no training"
    spec = RunSpec(
        embeddings=embeddings,
        train=cfg,
        train_split=split,
        val_split=None,
        test_split=None,
        checkpoint_every=checkpoint_every,
    )
    run = TrainingRun(spec)  # the tables read and checked before a line is said
    logger.info("%s (%s, device %s) on %s/%s", cfg.method, what, run.device, embeddings, split)
    method, trainer = run.method, run.trainer
    last_good: str | None = None
    if previous is not None:
        assert output is not None
        fingerprint = trainer.data.split.fingerprint
        if previous.get("tables_fingerprint", fingerprint) != fingerprint:
            raise CheckpointError(
                f"{output}: cannot resume: {embeddings}/{split} changed since the checkpoint "
                "(its tables' fingerprint differs); pass --overwrite to start over"
            )
        run.resume(read_run_state(output))
        last_good = f"epoch {trainer.epoch} of {cfg.epochs}"
    elif output is not None and overwrite:
        discard_checkpoint(output)  # the replaced run's checkpoint goes before training starts
    where = {"embeddings": spec.embeddings, "split": split}

    def on_epoch(row: EpochRow, trainer: Trainer, history: History, due: bool) -> None:
        nonlocal last_good
        if output is not None and due and trainer.epoch < cfg.epochs:
            save_run_checkpoint(output, trainer, history, where, complete=False)
            last_good = f"epoch {trainer.epoch} of {cfg.epochs}"

    try:
        run.fit(on_epoch, progress=progress, log_epochs=False)  # the bar shows progress
    except NonFiniteError as exc:
        if output is None:
            raise
        kept = (
            f"{output} keeps the last good checkpoint ({last_good}, incomplete)"
            if last_good
            else f"no checkpoint was written to {output}"
        )
        raise NonFiniteError(f"{exc}; {kept}") from exc
    method.eval()
    if output is not None:
        save_run_checkpoint(output, trainer, run.history, where, complete=True)
    return method, run.history
