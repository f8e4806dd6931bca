"""The protocol for K runs at once, trained packed (:class:`asymvlm.training.PackedTrainer`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from asymvlm.errors import ConfigError
from asymvlm.evaluation.registry import evaluate_split
from asymvlm.protocol.run import training_data
from asymvlm.protocol.spec import RunSpec
from asymvlm.splits import SplitCache, SplitTensors, load_split
from asymvlm.training import (
    EpochRow,
    History,
    PackedTrainer,
    Trainer,
    check_packable,
    resolve_device,
    use_streaming,
)
from asymvlm.training.packed import require_alike

__all__ = ["PackedProtocolHook", "check_packable_specs", "run_packed_protocol"]

logger = logging.getLogger(__name__)

#: The :class:`RunSpec` fields that do not change a run's training or evaluation.
_SPEC_FREE = ("train", "checkpoint_every")
#: ``on_epoch(member, row, trainer, history)`` of :func:`run_packed_protocol`.
PackedProtocolHook = Callable[[int, EpochRow, Trainer, History], None]


def check_packable_specs(specs: Sequence[RunSpec]) -> None:
    """:func:`check_packable` for run specs, which must also name the same tables and splits."""
    require_alike(
        [s.model_dump() for s in specs], _SPEC_FREE, "run", "train and evaluate on the same data"
    )
    check_packable([s.train for s in specs])
    lead = specs[0]
    if use_streaming(lead.train, lead.embeddings, lead.train_split):
        raise ConfigError(
            f"{lead.embeddings}/{lead.train_split} is larger than the memory budget "
            "(stream: auto would stream it), and packed trials hold the training split in "
            "memory: set pack: 1 (each trial then streams on its own) or raise "
            "stream_memory_bytes"
        )


def run_packed_protocol(
    specs: Sequence[RunSpec],
    *,
    device: str | torch.device | None = None,
    on_epoch: PackedProtocolHook | None = None,
    progress: bool = False,
    vmap: bool = True,
    cache: SplitCache | None = None,
    state: Mapping[str, Any] | None = None,
    on_state: Callable[[PackedTrainer], None] | None = None,
) -> list[dict[str, Any]]:
    """:func:`~asymvlm.protocol.run_protocol` (App. B.4) for K runs at once, trained packed.

    The specs must differ only in ``train.lr`` and ``train.seed`` (and ``checkpoint_every``;
    :func:`check_packable_specs`: a pack never streams). The training data (and the hold-out)
    are loaded once, the members are built and trained by :class:`PackedTrainer`, then each is
    evaluated on the validation and test splits (loaded once) as
    :meth:`~asymvlm.protocol.TrainingRun.results` does. ``on_epoch(k, row, trainer, history)``
    is called after every epoch of member k, and ``on_state(pack)`` when the pack's
    :meth:`~PackedTrainer.state_dict` is whole after it (the place to checkpoint); ``state``,
    such a state dict, resumes the pack where it was taken.
    With a ``cache`` the splits are read once per process (:class:`SplitCache`).

    Returns one entry per spec, in order: what ``run_protocol(spec)`` returns on rank 0 --
    ``{"history", "dim", "epochs_run", "val", "test"}``, or ``{"diverged": reason, "history":
    ...}`` for a member that diverged (the others are unaffected). Single process only.
    """
    runs = list(specs)
    check_packable_specs(runs)
    cfgs = [run.train for run in runs]
    if device is None:
        dev = resolve_device(cfgs[0].device)
    else:
        dev = torch.device(device)
        cfgs = [cfg.model_copy(update={"device": str(dev)}) for cfg in cfgs]
    # training_data draws nothing from the torch RNG, so loading it before the members are
    # seeded (TrainingRun seeds first) changes nothing.
    data, held_out = training_data(runs[0], dev, cache)
    pack = PackedTrainer.build(cfgs, data, vmap=vmap)
    if state is not None:
        pack.load_state_dict(state)
    epochs = cfgs[0].epochs

    def after_epoch(k: int, row: EpochRow) -> None:
        cfg, epoch = cfgs[k], pack.trainers[k].epoch
        if epoch % max(1, epochs // 10) == 0 or epoch == 1:
            logger.info(
                "%s lr=%g seed=%d epoch %d/%d loss %.4f (packed member %d)",
                cfg.method,
                cfg.lr,
                cfg.seed,
                epoch,
                epochs,
                row["train_loss"],
                k,
            )
        if on_epoch is not None:
            on_epoch(k, row, pack.trainers[k], pack.histories[k])

    pack.fit(progress=progress, on_epoch_end=after_epoch, on_state=on_state)
    return _results(pack, runs[0], data.dim, held_out, dev, cache)


def _results(
    pack: PackedTrainer,
    spec: RunSpec,
    dim: int,
    held_out: SplitTensors | None,
    device: torch.device,
    cache: SplitCache | None = None,
) -> list[dict[str, Any]]:
    """Each member's :meth:`TrainingRun.results` (or its divergence), the splits loaded once."""
    load = cache.load if cache is not None else load_split
    adapter_input = spec.train.adapter_input
    val = held_out
    if val is None and spec.val_split:
        val = load(spec.embeddings, spec.val_split, adapter_input, device)
    test = None
    if spec.test_split:
        root = spec.test_embeddings or spec.embeddings
        test = load(root, spec.test_split, adapter_input, device)
    out: list[dict[str, Any]] = []
    for k, method in enumerate(pack.methods):
        history = pack.histories[k]
        if pack.errors[k] is not None:
            out.append({"diverged": pack.errors[k], "history": history})
            continue
        method.eval()
        result: dict[str, Any] = {
            "history": history,
            "dim": dim,
            "epochs_run": pack.trainers[k].epoch,
        }
        with pack.member_rng(k):
            if val is not None:
                result["val"] = evaluate_split("retrieval", method, val)
            if test is not None:
                result["test"] = evaluate_split("retrieval", method, test)
        out.append(result)
    return out
