"""A training run into a checkpoint folder (:func:`train`, behind ``asymvlm train``)."""

from __future__ import annotations

import os
import pickle

import torch

from asymvlm.errors import CheckpointError, ConfigError, NonFiniteError
from asymvlm.methods import Method, build_method
from asymvlm.training.checkpoint import (
    HISTORY_FILE,
    TRAINER_FILE,
    _location,
    check_resumable,
    checkpoint_to_resume,
    discard_checkpoint,
    load_checkpoint,
    read_history,
    save_checkpoint,
)
from asymvlm.training.config import TrainConfig, resolve_device
from asymvlm.training.data import load_split
from asymvlm.training.trainer import Trainer


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
    torch.manual_seed(cfg.seed)
    device = resolve_device(cfg.device)
    data = load_split(root, split, cfg.adapter_input, device)
    method = build_method(cfg.method, data.dim, **cfg.method_args())
    trainer = Trainer(method, cfg, data)
    history: list[dict[str, float]] = []
    last_good: str | None = None
    if previous is not None:
        assert output is not None
        _resume_trainer(output, trainer, device)
        history = read_history(output)
        if [row.get("epoch") for row in history] != list(range(1, trainer.epoch + 1)):
            raise CheckpointError(
                f"{output}: {HISTORY_FILE} does not hold epochs 1..{trainer.epoch} of "
                f"{TRAINER_FILE}; pass --overwrite to start over"
            )
        last_good = f"epoch {trainer.epoch} of {cfg.epochs}"
    elif output is not None and overwrite:
        discard_checkpoint(output)  # the replaced run's checkpoint goes before training starts
    extra = {
        "embeddings": _location(root),
        "split": split,
        "embedding_model": data.split.manifest.model,
    }

    def write(complete: bool) -> None:
        assert output is not None
        save_checkpoint(output, method, cfg, data.dim, extra, epoch=trainer.epoch,
                        complete=complete, trainer_state=trainer.state_dict(),
                        history=history)  # fmt: skip

    def on_epoch_end(row: dict[str, float]) -> None:
        nonlocal last_good
        history.append(row)
        every = checkpoint_every
        if output is not None and every and trainer.epoch % every == 0:
            if trainer.epoch < cfg.epochs:
                write(complete=False)
                last_good = f"epoch {trainer.epoch} of {cfg.epochs}"

    try:
        trainer.fit(progress=progress, on_epoch_end=on_epoch_end)
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
    return method, history


def _resume_trainer(directory: str, trainer: Trainer, device: torch.device) -> None:
    path = os.path.join(directory, TRAINER_FILE)
    try:
        state = torch.load(path, map_location=device, weights_only=True)
        trainer.load_state_dict(state)
    except (RuntimeError, EOFError, KeyError, TypeError, pickle.UnpicklingError) as exc:
        raise CheckpointError(f"{path}: cannot resume from it ({exc})") from exc
