"""A training run into a local checkpoint folder: :func:`train` (``asymvlm train``)."""

from __future__ import annotations

from asymvlm.checkpoints import (
    check_resumable,
    checkpoint_to_resume,
    discard_checkpoint,
    load_checkpoint,
    read_history,
    read_run_state,
    save_run_checkpoint,
)
from asymvlm.errors import ConfigError, NonFiniteError
from asymvlm.methods import Method
from asymvlm.protocol.run import TrainingRun
from asymvlm.protocol.spec import RunSpec
from asymvlm.training import EpochRow, History, TrainConfig, Trainer, resolve_device

__all__ = ["train"]


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
) -> tuple[Method, History]:
    """``asymvlm train``: a run of the protocol without evaluation, into the checkpoint folder
    ``output`` (an incomplete checkpoint every ``checkpoint_every`` epochs, a complete one at
    the end). ``resume`` continues the folder's run, ``overwrite`` replaces it; a diverged run
    keeps its last good checkpoint. Returns the method and the whole history."""
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
    spec = RunSpec(
        embeddings=root,
        train=cfg,
        train_split=split,
        val_split=None,
        test_split=None,
        checkpoint_every=checkpoint_every,
    )
    run = TrainingRun(spec)
    method, trainer = run.method, run.trainer
    last_good: str | None = None
    if previous is not None:
        assert output is not None
        run.resume(read_run_state(output))
        last_good = f"epoch {trainer.epoch} of {cfg.epochs}"
    elif output is not None and overwrite:
        discard_checkpoint(output)  # the replaced run's checkpoint goes before training starts
    where = {"embeddings": spec.embeddings, "split": split}

    def write(complete: bool) -> None:
        assert output is not None
        save_run_checkpoint(output, trainer, run.history, where, complete=complete)

    def on_epoch(row: EpochRow, trainer: Trainer, history: History, due: bool) -> None:
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
