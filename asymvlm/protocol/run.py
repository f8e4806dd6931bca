"""The paper's training protocol (App. B.4) for one (method, lr, seed) run, without Ray.

:func:`run_protocol` is the whole run: seed, load the training split (holding out a validation
part when the tables have none), build the method and its :class:`~asymvlm.training.Trainer`,
continue from a saved state, train the remaining epochs and evaluate retrieval on the
validation and test splits (the registry's ``retrieval``, :func:`asymvlm.evaluation.registry.
evaluate_split`). The Ray wiring runs it on every Ray Train worker and in every Tune trial,
reporting (and checkpointing) through ``on_epoch``; :func:`~asymvlm.protocol.train`
(``asymvlm train``) runs the same pieces (:class:`TrainingRun`) into a local checkpoint folder.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from asymvlm import tables
from asymvlm.checkpoints import RunState
from asymvlm.errors import ConfigError, NonFiniteError
from asymvlm.evaluation.registry import evaluate_split
from asymvlm.methods import Method, build_method
from asymvlm.protocol.spec import RunSpec
from asymvlm.splits import SplitCache, SplitTensors, hold_out_images, load_split
from asymvlm.training import (
    CaptionStream,
    EpochRow,
    History,
    StreamingTrainer,
    Trainer,
    open_stream,
    resolve_device,
)

__all__ = ["EpochHook", "TrainingRun", "run_protocol", "streamed_hold_out", "training_data"]

logger = logging.getLogger(__name__)

#: ``on_epoch(row, trainer, history, checkpoint_due)``, called after every epoch on every rank.
EpochHook = Callable[[EpochRow, Trainer, History, bool], None]


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
        return cache.memo(
            spec.embeddings, key, lambda: hold_out_images(data, float(fraction), seed=0)
        )
    return data, None


def streamed_hold_out(spec: RunSpec, stream: CaptionStream) -> SplitTensors | None:
    """The held-out validation part of a streamed run: None, since a streamed training split
    is used whole. A spec asking to hold out ``val_fraction`` of the training images (tables
    without a ``val_split``) is a :class:`ConfigError` in streaming mode -- write a validation
    split to the tables, or set ``stream='never'``."""
    fraction, val_split = spec.val_fraction, spec.val_split
    if fraction and (not val_split or val_split not in tables.list_splits(spec.embeddings)):
        raise ConfigError(
            f"{stream.root}/{stream.split} streams (stream={spec.train.stream!r}), and holding "
            f"out val_fraction={fraction} of it is not supported in streaming mode: write a "
            f"{val_split or 'val'} split to the tables or set stream='never'"
        )
    return None


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
        spec: RunSpec,
        *,
        rank: int = 0,
        world_size: int = 1,
        device: str | torch.device | None = None,
        cache: SplitCache | None = None,
    ) -> None:
        self.spec = spec
        cfg = self.spec.train
        if device is None:
            self.device = resolve_device(cfg.device)
        else:
            self.device = torch.device(device)
            cfg = cfg.model_copy(update={"device": str(self.device)})
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        torch.manual_seed(cfg.seed)
        self.cache = cache
        self.history: History = []
        # Tables bigger than memory: the training captions stream from the parquet parts.
        stream = open_stream(
            cfg,
            self.spec.embeddings,
            self.spec.train_split,
            rank=rank,
            world_size=world_size,
            device=self.device,
        )
        if stream is not None:
            self.held_out = streamed_hold_out(self.spec, stream)
            self.dim = stream.dim
            self.method: Method = build_method(cfg.method, stream.dim, **cfg.method_args())
            self.trainer: Trainer = StreamingTrainer(
                self.method, cfg, stream, rank=rank, world_size=world_size
            )
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

        def after_epoch(row: EpochRow) -> None:
            self.history.append(row)
            epoch = trainer.epoch
            tenth = epoch % max(1, cfg.epochs // 10) == 0 or epoch == 1
            if log_epochs and self.rank == 0 and tenth:
                logger.info(
                    "%s lr=%g seed=%d epoch %d/%d loss %.4f",
                    cfg.method,
                    cfg.lr,
                    cfg.seed,
                    epoch,
                    cfg.epochs,
                    row["train_loss"],
                )
            if on_epoch is not None:
                on_epoch(row, trainer, self.history, self.spec.checkpoint_due(epoch))

        trainer.fit(progress=progress, on_epoch_end=after_epoch)
        return self.history

    def results(self) -> dict[str, Any]:
        """The run's outcome: ``history``, ``dim``, ``epochs_run`` and retrieval metrics on the
        validation split (held out or ``val_split``; ``val``) and ``test_split`` (``test``),
        for the splits the spec names."""
        spec, adapter_input = self.spec, self.cfg.adapter_input
        self.method.eval()
        out: dict[str, Any] = {
            "history": self.history,
            "dim": self.dim,
            "epochs_run": self.trainer.epoch,
        }
        if self.held_out is not None:
            out["val"] = evaluate_split("retrieval", self.method, self.held_out)
        elif spec.val_split:
            val = self._load(spec.embeddings, spec.val_split, adapter_input, self.device)
            out["val"] = evaluate_split("retrieval", self.method, val)
        if spec.test_split:
            root = spec.test_embeddings or spec.embeddings
            test = self._load(root, spec.test_split, adapter_input, self.device)
            out["test"] = evaluate_split("retrieval", self.method, test)
        return out


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
