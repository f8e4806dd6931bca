"""K training runs at once, trained packed (:class:`asymvlm.training.PackedTrainer`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from asymvlm.errors import ConfigError
from asymvlm.runner.single import RunSpec, eval_splits, log_epoch, run_outcome, training_data
from asymvlm.splits import SplitCache
from asymvlm.training import (
    EpochRow,
    History,
    PackedTrainer,
    Trainer,
    check_packable,
    resolve_device,
    use_streaming,
)
from asymvlm.training.packed_trainer import require_alike


def check_packable_specs(specs: Sequence[RunSpec]) -> None:
    """:func:`check_packable` for run specs, which must also name the same tables and splits."""
    free = ("train", "checkpoint_every")  # what does not change a run's data
    require_alike(
        [s.model_dump() for s in specs], free, "run", "train and evaluate on the same data"
    )
    check_packable([s.train for s in specs])
    lead = specs[0]
    if use_streaming(lead.train, lead.embeddings, lead.train_split):
        raise ConfigError(
            f"{lead.embeddings}/{lead.train_split} is larger than the memory budget (stream: auto "
            "would stream it), and packed trials hold the training split in memory: set pack: 1 "
            "(each trial then streams on its own) or raise stream_memory_bytes"
        )


def train_and_evaluate_packed(
    specs: Sequence[RunSpec],
    *,
    device: str | torch.device | None = None,
    on_epoch: Callable[[int, EpochRow, Trainer, History], None] | None = None,
    cache: SplitCache | None = None,
    state: Mapping[str, Any] | None = None,
    on_state: Callable[[PackedTrainer], None] | None = None,
) -> list[dict[str, Any]]:
    """:func:`~asymvlm.runner.train_and_evaluate` (App. B.4) for K specs differing only in
    ``train.lr`` / ``train.seed``, trained as one :class:`PackedTrainer` (``state`` resumes it;
    ``on_state(pack)`` follows each epoch, the place to checkpoint), each member evaluated as
    its own run; one result per spec, in order."""
    runs = [spec.with_table_input() for spec in specs]
    check_packable_specs(runs)
    cfgs = [run.train for run in runs]
    dev = resolve_device(cfgs[0].device) if device is None else torch.device(device)
    if device is not None:
        cfgs = [cfg.model_copy(update={"device": str(dev)}) for cfg in cfgs]
    data, held_out = training_data(runs[0], dev, cache)
    pack = PackedTrainer(cfgs, data)
    if state is not None:
        pack.load_state_dict(state)

    def after_epoch(k: int, row: EpochRow) -> None:
        log_epoch(cfgs[k], row, f" (packed member {k})")
        if on_epoch is not None:
            on_epoch(k, row, pack.trainers[k], pack.histories[k])

    pack.fit(on_epoch_end=after_epoch, on_state=on_state)
    splits = eval_splits(runs[0], held_out, dev, cache)
    out: list[dict[str, Any]] = []
    for k, method in enumerate(pack.methods):
        history = pack.histories[k]
        if pack.errors[k] is not None:
            out.append({"diverged": pack.errors[k], "history": history})
            continue
        with pack.member_rng(k):
            out.append(run_outcome(method, history, pack.trainers[k].epoch, data.dim, splits))
    return out
