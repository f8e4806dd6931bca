"""Whether a run's output folder may take a new checkpoint (:func:`check_output`), or be
continued (:func:`checkpoint_to_resume`, :func:`check_resumable`)."""

from __future__ import annotations

import json
import os
from typing import Any

from asymvlm.checkpoints.folder import (
    CHECKPOINT_FILES,
    CONFIG_FILE,
    HISTORY_FILE,
    TRAINER_FILE,
    WEIGHTS_FILE,
    read_checkpoint_meta,
    recover_checkpoint,
    sibling_paths,
)
from asymvlm.errors import CheckpointError, ConfigError
from asymvlm.storage import absolute
from asymvlm.training import TrainConfig

__all__ = ["check_output", "check_resumable", "checkpoint_to_resume"]

#: Settings a resumed run may change: where it runs, not what it computes.
RESUME_MAY_DIFFER = frozenset({"device", "stream_memory_bytes"})


def check_output(directory: str) -> None:
    """Refuse an output that cannot hold a checkpoint folder: a file, a folder (or nearest
    existing parent) that is not writable, a folder holding other files (it is replaced as a
    whole)."""
    target = sibling_paths(directory)[0]
    if os.path.lexists(target) and not os.path.isdir(target):
        raise CheckpointError(f"{directory} is a file, not a checkpoint folder")
    if target == os.path.realpath(os.getcwd()):
        raise CheckpointError(f"{directory} is the current folder; name a new folder for it")
    ancestor = os.path.dirname(target)
    while not os.path.lexists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise CheckpointError(f"{directory}: {ancestor} is a file, not a folder")
    for folder in (ancestor, target) if os.path.isdir(target) else (ancestor,):
        if not os.access(folder, os.W_OK | os.X_OK):
            raise CheckpointError(f"{directory}: cannot write a checkpoint ({folder} is read-only)")
    if os.path.isdir(target):
        foreign = sorted(set(os.listdir(target)) - set(CHECKPOINT_FILES))
        if foreign:
            shown = ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else "")
            raise CheckpointError(
                f"{directory} holds files that are not part of a checkpoint ({shown}); a "
                "checkpoint replaces its whole folder: choose a new or empty folder"
            )


def checkpoint_to_resume(
    directory: str, *, resume: bool = False, overwrite: bool = False
) -> dict[str, Any] | None:
    """The config of the checkpoint in the run output ``directory`` to continue (``resume``),
    or None to start fresh (none there, or ``overwrite``); a :class:`CheckpointError` for a
    checkpoint there without either, or one that cannot be resumed."""
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite exclude each other: pick one")
    check_output(directory)
    recover_checkpoint(directory)
    present = [f for f in CHECKPOINT_FILES if os.path.lexists(os.path.join(directory, f))]
    if not present or overwrite:
        return None
    if not resume:
        raise CheckpointError(
            f"{directory} already holds a checkpoint; pass --resume to continue it or "
            "--overwrite to replace it"
        )
    meta = read_checkpoint_meta(directory)
    needed = [CONFIG_FILE, WEIGHTS_FILE]
    if meta is not None and not meta["complete"]:
        needed += [TRAINER_FILE, HISTORY_FILE]
    missing = [f for f in needed if f not in present]
    if missing:
        raise CheckpointError(
            f"{directory}: cannot resume: the checkpoint has no {', '.join(missing)}; pass "
            "--overwrite to start over"
        )
    return meta


def check_resumable(
    directory: str, meta: dict[str, Any], cfg: TrainConfig, root: str, split: str
) -> None:
    """Refuse to continue a checkpoint with other settings than it was started with (``epochs``
    shape the cosine schedule) or on other embeddings, naming the differing fields."""
    ours = json.loads(json.dumps(cfg.model_dump()))
    theirs = dict(meta.get("train_config", {}))
    diffs = [
        f"{key} {theirs.get(key)!r} (checkpoint) vs {ours.get(key)!r} (now)"
        for key in sorted(set(ours) | set(theirs))
        if key not in RESUME_MAY_DIFFER and theirs.get(key) != ours.get(key)
    ]
    for key, then, now in (
        ("embeddings", absolute(str(meta.get("embeddings"))), absolute(root)),
        ("split", meta.get("split"), split),
    ):
        if key in meta and then != now:
            diffs.append(f"{key} {then!r} (checkpoint) vs {now!r} (now)")
    if diffs:
        raise CheckpointError(
            f"{directory}: cannot resume with other settings: {'; '.join(diffs)}. Resume with "
            "the checkpoint's settings, or pass --overwrite to start over"
        )
