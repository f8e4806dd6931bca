"""The paper's training protocol (App. B.4) for one (method, lr, seed) run, without Ray.

:func:`run_protocol` is the whole run: seed, load the training split (holding out a validation
part when the tables have none), build the method and its :class:`~asymvlm.training.Trainer`,
continue from a saved state, train the remaining epochs and evaluate retrieval on the
validation and test splits. ``pipelines/train.py`` runs it on every Ray Train worker, reporting
(and checkpointing) through ``on_epoch``; :func:`train` (``asymvlm train``) runs the same pieces
(:class:`TrainingRun`) into a local checkpoint folder.
"""

from __future__ import annotations

import logging
import os
import pickle
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Annotated, Any

import torch
from pydantic import ConfigDict, Field
from pydantic.dataclasses import dataclass as pydantic_dataclass

from asymvlm import tables
from asymvlm.errors import CheckpointError, ConfigError, NonFiniteError
from asymvlm.methods import Method, build_method
from asymvlm.training.cache import SplitCache
from asymvlm.training.checkpoint import (
    HISTORY_FILE,
    TRAINER_FILE,
    _location,
    check_resumable,
    checkpoint_to_resume,
    discard_checkpoint,
    load_checkpoint,
    provenance,
    read_history,
    save_checkpoint,
)
from asymvlm.training.config import TrainConfig, resolve_device
from asymvlm.training.data import SplitTensors, hold_out_images, load_split
from asymvlm.training.stream import StreamingTrainer, open_stream, streamed_hold_out
from asymvlm.training.trainer import Trainer

logger = logging.getLogger(__name__)

History = list[dict[str, float]]
#: ``on_epoch(row, trainer, history, checkpoint_due)``, called after every epoch on every rank.
EpochHook = Callable[[dict[str, float], Trainer, History, bool], None]


@pydantic_dataclass(config=ConfigDict(extra="forbid"))
class RunSpec:
    """One run: the embedding tables, the hyper-parameters, the splits.

    ``val_fraction``: when set and the tables have no ``val_split``, that fraction of the
    training images (with their captions) is held out for validation
    (:func:`~asymvlm.training.hold_out_images`; the same for every worker, seed and method).
    ``test_embeddings``: the tables holding ``test_split`` when they are not ``embeddings``.
    ``checkpoint_every``: a checkpoint is due every that many epochs and after the last one
    (None: after the last one only). Validated on construction (pydantic).
    """

    embeddings: str
    train: TrainConfig = field(default_factory=TrainConfig)
    train_split: str = "train"
    val_split: str | None = "val"
    test_split: str | None = "test"
    val_fraction: Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)] | None = None
    test_embeddings: str | None = None
    checkpoint_every: Annotated[int, Field(ge=1)] | None = 1

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> RunSpec:
        """The spec in a run config (:meth:`to_dict`); other keys (a wrapper's own) are left."""
        return cls(**{f.name: config[f.name] for f in fields(cls) if f.name in config})

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types: a run config travels to every Ray worker."""
        return asdict(self)

    def checkpoint_due(self, epoch: int) -> bool:
        every = self.checkpoint_every
        return epoch == self.train.epochs or (every is not None and epoch % every == 0)


@dataclass
class RunState:
    """Where a run stopped: :meth:`Trainer.state_dict` and the history of its epochs so far."""

    trainer: dict[str, Any]
    history: History


def training_data(
    spec: RunSpec, device: str | torch.device = "cpu", cache: SplitCache | None = None
) -> tuple[SplitTensors, SplitTensors | None]:
    """(training split, held-out validation or None): ``spec.val_fraction`` of the training
    images is held out when the tables have no ``val_split`` (COCO 2017, CC). The hold-out
    depends only on the image ids: the same for every worker, seed and method. With a
    ``cache`` both are read (and held out) once per process."""
    cfg = spec.train
    load = cache.load if cache is not None else load_split
    data = load(spec.embeddings, spec.train_split, cfg.adapter_input, device)
    fraction, val_split = spec.val_fraction, spec.val_split
    if fraction and (not val_split or val_split not in tables.list_splits(spec.embeddings)):
        if cache is None:
            return hold_out_images(data, float(fraction), seed=0)
        key = ("hold-out", spec.train_split, cfg.adapter_input, str(device), float(fraction))
        return cache.memo(spec.embeddings, key,
                          lambda: hold_out_images(data, float(fraction), seed=0))  # fmt: skip
    return data, None


class TrainingRun:
    """One run of the protocol, piece by piece. Construction seeds torch, loads the training
    data (:func:`training_data`) onto ``device`` and builds the method and its
    :class:`Trainer` (this worker's shard of a ``world_size`` DDP group); then
    :meth:`resume`, :meth:`fit`, :meth:`results`.

    ``device`` None: the one ``spec.train.device`` names (:func:`resolve_device`); a given
    device replaces that setting (a Ray worker trains on the device Ray gives it).
    """

    def __init__(
        self,
        spec: RunSpec | Mapping[str, Any],
        *,
        rank: int = 0,
        world_size: int = 1,
        device: str | torch.device | None = None,
        cache: SplitCache | None = None,
    ) -> None:
        self.spec = spec if isinstance(spec, RunSpec) else RunSpec.from_dict(spec)
        cfg = self.spec.train
        if device is None:
            self.device = resolve_device(cfg.device)
        else:
            self.device = torch.device(device)
            cfg = replace(cfg, device=str(self.device))
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        torch.manual_seed(cfg.seed)
        self.cache = cache
        self.history: History = []
        # Tables bigger than memory: the training captions stream from the parquet parts.
        stream = open_stream(cfg, self.spec.embeddings, self.spec.train_split, rank=rank,
                             world_size=world_size, device=self.device)  # fmt: skip
        if stream is not None:
            self.held_out = streamed_hold_out(self.spec, stream)
            self.dim = stream.dim
            self.method: Method = build_method(cfg.method, stream.dim, **cfg.method_args())
            self.trainer: Trainer = StreamingTrainer(self.method, cfg, stream, rank=rank,
                                                     world_size=world_size)  # fmt: skip
            return
        data, self.held_out = training_data(self.spec, self.device, cache)
        self.dim = data.dim
        self.method = build_method(cfg.method, data.dim, **cfg.method_args())
        # The trainer keeps this worker's shard (and the whole split only until it starts).
        self.trainer = Trainer(self.method, cfg, data, rank=rank, world_size=world_size)

    @property
    def _load(self) -> Callable[..., SplitTensors]:
        return self.cache.load if self.cache is not None else load_split

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
        """Train the remaining epochs (:meth:`Trainer.fit`, with a progress bar if ``progress``);
        after each, the row joins the history and ``on_epoch(row, trainer, history,
        checkpoint_due)`` is called. With ``log_epochs`` rank 0 logs the loss (INFO) after the
        first epoch and every tenth of the run. A diverged run raises :class:`NonFiniteError`;
        the history keeps the epochs before it."""
        trainer, cfg = self.trainer, self.cfg

        def after_epoch(row: dict[str, float]) -> None:
            self.history.append(row)
            epoch = trainer.epoch
            tenth = epoch % max(1, cfg.epochs // 10) == 0 or epoch == 1
            if log_epochs and self.rank == 0 and tenth:
                logger.info("%s lr=%g seed=%d epoch %d/%d loss %.4f", cfg.method, cfg.lr,
                            cfg.seed, epoch, cfg.epochs, row["train_loss"])  # fmt: skip
            if on_epoch is not None:
                on_epoch(row, trainer, self.history, self.spec.checkpoint_due(epoch))

        trainer.fit(progress=progress, on_epoch_end=after_epoch)
        return self.history

    def results(self) -> dict[str, Any]:
        """The run's outcome: ``history``, ``dim``, ``epochs_run`` and retrieval metrics on the
        validation split (held out or ``val_split``; ``val``) and ``test_split`` (``test``),
        for the splits the spec names."""
        # Imported here: asymvlm.evaluation imports this package.
        from asymvlm.evaluation import evaluate_retrieval

        spec, adapter_input = self.spec, self.cfg.adapter_input
        self.method.eval()
        out: dict[str, Any] = {
            "history": self.history,
            "dim": self.dim,
            "epochs_run": self.trainer.epoch,
        }
        if self.held_out is not None:
            out["val"] = evaluate_retrieval(self.method, self.held_out)
        elif spec.val_split:
            val = self._load(spec.embeddings, spec.val_split, adapter_input, self.device)
            out["val"] = evaluate_retrieval(self.method, val)
        if spec.test_split:
            root = spec.test_embeddings or spec.embeddings
            test = self._load(root, spec.test_split, adapter_input, self.device)
            out["test"] = evaluate_retrieval(self.method, test)
        return out


def run_protocol(
    spec: RunSpec | Mapping[str, Any],
    *,
    rank: int = 0,
    world_size: int = 1,
    device: str | torch.device | None = None,
    state: RunState | None = None,
    on_epoch: EpochHook | None = None,
    progress: bool = False,
    cache: SplitCache | None = None,
) -> dict[str, Any] | None:
    """The paper's protocol for one run (App. B.4), on this worker of ``world_size``.

    Seeds, loads the training split (and the hold-out, :func:`training_data`), builds the
    method and the :class:`Trainer`, continues from ``state`` when given, trains the remaining
    epochs calling ``on_epoch(row, trainer, history, checkpoint_due)`` after each (on every
    rank: a Ray wrapper reports there, with a checkpoint when due), then evaluates. A method
    that is not trained by SGD (``trainable = False``: the frozen ``clip``, the post-hoc
    ``bayesvlm``) has no epochs: ``on_epoch`` is called once after its fit, with the row
    ``{"epoch": 0}`` and a checkpoint due.

    Returns, on rank 0, ``{"history", "dim", "epochs_run", "val", "test"}``
    (:meth:`TrainingRun.results`; ``val``/``test`` for the splits there are), or
    ``{"diverged": reason, "history": ...}`` when the run diverged (:class:`NonFiniteError`:
    every rank sees the same global-batch loss and the same all-reduced gradients, so all stop
    at the same step; returned rather than raised, since a retry would only diverge again).
    Other ranks return None.
    """
    run = TrainingRun(spec, rank=rank, world_size=world_size, device=device, cache=cache)
    if state is not None:
        run.resume(state)
    try:
        run.fit(on_epoch, progress=progress)
        if on_epoch is not None and not run.method.trainable:
            # fitted post hoc (or nothing to fit), no epochs: one report of the fitted model
            # with a checkpoint due, so that a Ray run has a checkpoint and a sweep an adapter
            on_epoch({"epoch": 0}, run.trainer, run.history, True)
        return run.results() if rank == 0 else None
    except NonFiniteError as exc:
        logger.warning("%s", exc)
        return {"diverged": str(exc), "history": run.history} if rank == 0 else None


# -- a training run into a checkpoint folder ----------------------------------------------------


def train(
    root: str,
    split: str,
    cfg: TrainConfig,
    output: str | None = None,
    progress: bool = True,
    *,
    checkpoint_every: int | None = None,
    resume: bool = False,
    overwrite: bool = False,
) -> tuple[Method, list[dict[str, float]]]:
    """Load a split, build the method, train it and (with ``output``) write a checkpoint folder.

    The folder gets an incomplete checkpoint every ``checkpoint_every`` epochs (default: none)
    and a complete one at the end, each published as a whole (:func:`save_checkpoint`), so a
    killed run leaves the last checkpoint intact. An existing checkpoint in ``output`` is
    refused unless ``resume`` -- continue it with the same settings (:func:`check_resumable`);
    a complete one is returned untouched; with none there the run starts fresh -- or
    ``overwrite`` (the old checkpoint is discarded once the data is loaded). A resumed run ends
    where the uninterrupted one ends (bit for bit on the CPU) and its history holds every epoch
    once. A diverged run raises :class:`NonFiniteError`, leaving the last good (incomplete)
    checkpoint as it was: nothing is marked complete.

    The run is the protocol's (:class:`TrainingRun`) without the evaluation.
    Returns the trained method and the whole history (earlier epochs of a resumed run too).
    """
    if checkpoint_every is not None and checkpoint_every < 1:
        raise ConfigError(f"--checkpoint-every must be >= 1, got {checkpoint_every}")
    previous = None
    if output is not None:
        previous = checkpoint_to_resume(output, resume=resume, overwrite=overwrite)
        if previous is not None:
            check_resumable(output, previous, cfg, root, split)
            if previous["complete"]:
                method, _ = load_checkpoint(output, resolve_device(cfg.device))
                return method, read_history(output)
    spec = RunSpec(embeddings=root, train=cfg, train_split=split, val_split=None,
                   test_split=None, checkpoint_every=checkpoint_every)  # fmt: skip
    run = TrainingRun(spec)
    method, trainer = run.method, run.trainer
    last_good: str | None = None
    if previous is not None:
        assert output is not None
        _resume_from_folder(output, run)
        last_good = f"epoch {trainer.epoch} of {cfg.epochs}"
    elif output is not None and overwrite:
        discard_checkpoint(output)  # the replaced run's checkpoint goes before training starts
    extra = {
        "embeddings": _location(root),
        "split": split,
        **provenance(trainer.data.split.manifest),
    }

    def write(complete: bool) -> None:
        assert output is not None
        save_checkpoint(output, method, cfg, run.dim, extra, epoch=trainer.epoch,
                        complete=complete, trainer_state=trainer.state_dict(),
                        history=run.history)  # fmt: skip

    def on_epoch(row: dict[str, float], trainer: Trainer, history: History, due: bool) -> None:
        nonlocal last_good
        if output is not None and due and trainer.epoch < cfg.epochs:
            write(complete=False)
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
        write(complete=True)
    return method, run.history


def _resume_from_folder(directory: str, run: TrainingRun) -> None:
    """Put the trainer state and history of the checkpoint folder ``directory`` into ``run``;
    each file's problem is a :class:`CheckpointError` naming it."""
    path = os.path.join(directory, TRAINER_FILE)
    try:
        # on the CPU: the trainer moves the tensors to its device; the RNG state stays a CPU one
        state = torch.load(path, map_location="cpu", weights_only=True)
        run.trainer.load_state_dict(state)
    except (RuntimeError, EOFError, KeyError, TypeError, pickle.UnpicklingError) as exc:
        raise CheckpointError(f"{path}: cannot resume from it ({exc})") from exc
    history = read_history(directory)
    epoch = run.trainer.epoch
    if [row.get("epoch") for row in history] != list(range(1, epoch + 1)):
        raise CheckpointError(
            f"{directory}: {HISTORY_FILE} does not hold epochs 1..{epoch} of "
            f"{TRAINER_FILE}; pass --overwrite to start over"
        )
    run.history = history
