"""Checkpoint folders: published atomically as a whole, read back, checked before a resume.

A killed run never leaves a half-written or mixed checkpoint (:func:`publish_folder`);
:func:`checkpoint_to_resume` and :func:`check_resumable` decide whether a run's output folder
may be continued.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch

from asymvlm.errors import CheckpointError, ConfigError
from asymvlm.methods import Method, build_method
from asymvlm.training.config import TrainConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.pt"
HISTORY_FILE = "history.jsonl"
TRAINER_FILE = "trainer.pt"
#: Every file a checkpoint folder may hold; anything else in it is not ours to replace.
CHECKPOINT_FILES = (CONFIG_FILE, WEIGHTS_FILE, HISTORY_FILE, TRAINER_FILE)


# -- checkpoints ------------------------------------------------------------------------------
# A checkpoint is a folder holding (some of) CHECKPOINT_FILES:
#   config.json    everything needed to rebuild the method, plus "complete", "epoch", "epochs"
#   model.pt       the method's state_dict (CPU tensors)
#   history.jsonl  one row per epoch trained so far            (written by train())
#   trainer.pt     Trainer.state_dict(), to resume the run      (written by train())
# It is published as a whole (publish_folder): readers see the old folder or the new one.


def _sibling_paths(directory: str) -> tuple[str, str, str, str]:
    """(folder, staging, previous, discarded): the folder and its hidden siblings."""
    target = os.path.realpath(directory)
    parent, name = os.path.split(target)
    if not name:
        raise CheckpointError(f"{directory}: a checkpoint folder cannot be the file-system root")
    staging, previous, discarded = (
        os.path.join(parent, f".{name}.{tag}") for tag in ("writing", "previous", "discarded")
    )
    return target, staging, previous, discarded


def _remove_tree(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def _fsync(path: str, folder: bool = False) -> None:
    """Flush a file (or a folder's entries) to disk, so a power cut cannot undo a rename."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        if not folder:  # some file systems cannot fsync a folder; a file must be flushed
            raise
    finally:
        os.close(fd)


def recover_checkpoint(directory: str) -> None:
    """Tidy up after a :func:`publish_folder` that was killed: if the new folder never took the
    old one's place, the old one (``.NAME.previous``) is put back; leftovers are deleted."""
    target, staging, previous, discarded = _sibling_paths(directory)
    if os.path.isdir(previous):
        if os.path.lexists(target):
            _remove_tree(previous)
        else:
            os.rename(previous, target)
    _remove_tree(staging)
    _remove_tree(discarded)


def publish_folder(directory: str, write: Callable[[str], None]) -> None:
    """Replace the folder ``directory`` as a whole by what ``write(staging)`` writes.

    ``write`` fills a fresh hidden sibling ``.NAME.writing``; its files are flushed to disk and
    it is renamed onto ``NAME`` (an existing ``NAME`` is first renamed aside to
    ``.NAME.previous``, deleted once the new one is in place). Killed at any point, this leaves
    the old folder, the new one, or the old one aside (put back by :func:`recover_checkpoint`),
    never a half-written or mixed folder. Local file systems only: this function is the
    boundary where another store would plug in.
    """
    target, staging, previous, _ = _sibling_paths(directory)
    parent = os.path.dirname(target)
    try:
        os.makedirs(parent, exist_ok=True)
        recover_checkpoint(directory)
        os.mkdir(staging)
        write(staging)
        for entry in os.listdir(staging):
            _fsync(os.path.join(staging, entry))
        _fsync(staging, folder=True)
        if os.path.lexists(target):
            os.rename(target, previous)
            try:
                os.rename(staging, target)
            except OSError:
                os.rename(previous, target)
                raise
            _fsync(parent, folder=True)
            _remove_tree(previous)
        else:
            os.rename(staging, target)
            _fsync(parent, folder=True)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        where = f" ({exc.filename})" if exc.filename else ""
        raise CheckpointError(f"{directory}: cannot write the checkpoint: {reason}{where}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # only left when something failed


def discard_checkpoint(directory: str) -> None:
    """Remove a checkpoint folder: renamed aside (atomic), then deleted."""
    target, _, _, discarded = _sibling_paths(directory)
    if os.path.lexists(target):
        recover_checkpoint(directory)
        os.rename(target, discarded)
        _remove_tree(discarded)


def provenance(manifest: Any) -> dict[str, Any]:
    """What a checkpoint records of the tables it was trained on (``manifest``, a
    :class:`~asymvlm.tables.Manifest` or None): ``embedding_model`` and, for tables written by
    the embedding stage, ``encoder`` -- the frozen encoder to embed new captions and images
    with (:class:`asymvlm.Scorer`): model id or folder, revision, family, SHA-256 of a local
    model's files, width."""
    if manifest is None:
        return {}
    info = manifest.to_dict()
    out: dict[str, Any] = {"embedding_model": manifest.model}
    if info.get("family"):
        out["encoder"] = {k: info.get(k) for k in ("model", "revision", "family",
                                                   "files_sha256", "dim")}  # fmt: skip
    return out


def save_checkpoint(
    directory: str,
    method: Method,
    cfg: TrainConfig,
    dim: int,
    extra: dict[str, Any] | None = None,
    *,
    epoch: int | None = None,
    complete: bool | None = None,
    trainer_state: dict[str, Any] | None = None,
    history: list[dict[str, float]] | None = None,
) -> None:
    """Write the checkpoint folder ``directory`` as a whole (:func:`publish_folder`).

    ``config.json`` holds everything needed to rebuild the method plus ``complete``, ``epoch``
    and ``epochs``; ``model.pt`` the weights; ``trainer.pt`` (:meth:`Trainer.state_dict`) and
    ``history.jsonl`` are written when given. ``epoch`` defaults to ``extra["epoch"]`` (the Ray
    Train path passes it there), else to the end of training; ``complete`` defaults to
    ``epoch >= epochs``. :func:`load_checkpoint` refuses an incomplete checkpoint unless told.
    """
    extra = dict(extra or {})
    epochs = cfg.epochs if method.trainable else 0
    given = extra.pop("epoch", None)
    epoch = int(epoch if epoch is not None else given if given is not None else epochs)
    meta = {
        "method": method.name,
        "dim": dim,
        "method_kwargs": cfg.method_args(),
        "adapter_input": cfg.adapter_input,
        "train_config": asdict(cfg),
        "complete": bool(epoch >= epochs if complete is None else complete),
        "epoch": epoch,
        "epochs": epochs,
        **extra,
    }
    config_text = json.dumps(meta, indent=2, allow_nan=False)
    history_text = None
    if history is not None:
        history_text = "".join(json.dumps(row, allow_nan=False) + "\n" for row in history)
    # copies of their own: a packed member's parameters are views of the pack's stacked ones
    weights = {k: v.detach().to("cpu", copy=True) for k, v in method.state_dict().items()}

    def write(folder: str) -> None:
        torch.save(weights, os.path.join(folder, WEIGHTS_FILE))
        if trainer_state is not None:
            torch.save(trainer_state, os.path.join(folder, TRAINER_FILE))
        if history_text is not None:
            with open(os.path.join(folder, HISTORY_FILE), "w") as fh:
                fh.write(history_text)
        with open(os.path.join(folder, CONFIG_FILE), "w") as fh:
            fh.write(config_text)

    publish_folder(directory, write)


def read_checkpoint_meta(directory: str) -> dict[str, Any] | None:
    """The ``config.json`` of a checkpoint folder, or None when it has none.

    Checkpoints written before the ``complete`` flag existed were final ones: they read as
    complete.
    """
    path = os.path.join(directory, CONFIG_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as fh:
            meta = json.load(fh)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{directory}: unreadable {CONFIG_FILE} ({exc})") from exc
    if not isinstance(meta, dict) or "method" not in meta or "dim" not in meta:
        raise CheckpointError(f"{directory}: {CONFIG_FILE} is not a checkpoint's (no method/dim)")
    meta.setdefault("complete", True)
    return meta


def read_history(directory: str) -> list[dict[str, float]]:
    """The rows of ``history.jsonl`` (none when the folder has no history)."""
    path = os.path.join(directory, HISTORY_FILE)
    if not os.path.isfile(path):
        return []
    with open(path) as fh:
        lines = [line for line in fh.read().splitlines() if line.strip()]
    try:
        return [json.loads(line) for line in lines]
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: line {exc.lineno} is not JSON ({exc.msg})") from exc


def _sized_by_fitting(method: Method, name: str, fresh: torch.Tensor, saved: torch.Tensor) -> bool:
    """A still-empty buffer of :attr:`Method.FITTED_BUFFERS` (ELIP's galleries, BayesVLM's
    posterior): the method takes the saved shape when it loads it."""
    return name in method.FITTED_BUFFERS and fresh.numel() == 0 and fresh.ndim == saved.ndim


def _state_mismatch(method: Method, state: Any) -> str | None:
    """What keeps ``state`` from loading into ``method`` (None when it fits)."""
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        return "it is not a dict of tensors"
    expected = method.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    shapes = [
        f"{k} {list(state[k].shape)} vs {list(v.shape)}"
        for k, v in expected.items()
        if k in state
        and state[k].shape != v.shape
        and not _sized_by_fitting(method, k, v, state[k])
    ]
    parts = []
    for label, items in (("missing", missing), ("unexpected", unexpected), ("shape", shapes)):
        if items:
            more = f" (+{len(items) - 3} more)" if len(items) > 3 else ""
            parts.append(f"{label} {', '.join(items[:3])}{more}")
    return "; ".join(parts) or None


def _methods_fitting(state: dict[str, torch.Tensor], dim: int, kwargs: dict[str, Any]) -> list[str]:
    """Registered methods whose weights (built like the checkpoint's) have ``state``'s layout."""
    from asymvlm.methods import METHODS

    out = []
    for name in sorted(METHODS):
        try:
            candidate = build_method(name, dim, **kwargs)
        except (TypeError, ValueError):
            continue
        if _state_mismatch(candidate, state) is None:
            out.append(name)
    return out


def load_checkpoint(
    directory: str, device: str | torch.device = "cpu", *, allow_incomplete: bool = False
) -> tuple[Method, dict[str, Any]]:
    """Rebuild the method saved by :func:`save_checkpoint`; returns (method, config dict).

    Raises :class:`CheckpointError` naming the folder when it holds no checkpoint, when
    ``model.pt`` is missing, unreadable or does not fit the method ``config.json`` names (with
    the registered methods it would fit), and for an incomplete checkpoint (a run still in
    progress, killed or diverged) unless ``allow_incomplete``.
    """
    if not os.path.isdir(directory):
        _, _, previous, _ = _sibling_paths(directory)
        hint = (
            f" (an interrupted write left the last checkpoint in {previous}; "
            "`asymvlm train --resume` puts it back)"
            if os.path.isdir(previous)
            else ""
        )
        raise CheckpointError(f"{directory}: no checkpoint there (no such folder){hint}")
    meta = read_checkpoint_meta(directory)
    if meta is None:
        raise CheckpointError(f"{directory}: not a checkpoint folder (no {CONFIG_FILE})")
    if not meta["complete"] and not allow_incomplete:
        raise CheckpointError(
            f"{directory}: incomplete checkpoint (epoch {meta.get('epoch')} of "
            f"{meta.get('epochs')}): finish the run with `asymvlm train ... --resume`, or use "
            "it as it is with --allow-incomplete"
        )
    weights = os.path.join(directory, WEIGHTS_FILE)
    if not os.path.isfile(weights):
        raise CheckpointError(f"{directory}: {CONFIG_FILE} but no {WEIGHTS_FILE} (a partial copy?)")
    name, dim = meta["method"], meta["dim"]
    kwargs = meta.get("method_kwargs", {})
    try:
        method = build_method(name, dim, **kwargs)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{directory}: cannot rebuild method {name!r}: {exc}") from exc
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError) as exc:
        raise CheckpointError(f"{weights}: unreadable ({exc})") from exc
    mismatch = _state_mismatch(method, state)
    if mismatch is not None:
        fits = _methods_fitting(state, dim, kwargs) if isinstance(state, dict) else []
        guess = f"the weights fit {', '.join(fits)}" if fits else "the weights fit no known method"
        raise CheckpointError(
            f"{directory}: {WEIGHTS_FILE} does not match {CONFIG_FILE}, which names method "
            f"{name!r} (dim {dim}): {mismatch}; {guess}"
        )
    method.load_state_dict(state)
    method.to(torch.device(device)).eval()
    return method, meta


# -- a training run into a checkpoint folder ----------------------------------------------------
#: Settings a resumed run may change: where it runs, not what it computes.
RESUME_MAY_DIFFER = frozenset({"device", "stream_memory_bytes"})
#: Fields every checkpoint has recorded: a missing one is a difference, not a default.
_ALWAYS_RECORDED = frozenset({"method", "lr", "seed", "epochs", "batch_size", "optimizer"})


def _location(root: str) -> str:
    return root if "://" in root else os.path.abspath(root)


def check_output(directory: str) -> None:
    """Refuse an output that cannot hold a checkpoint folder: an existing file, a folder (or
    nearest existing parent) that is not writable, or a folder holding other files (a
    checkpoint replaces its folder as a whole, so anything else in it would be deleted)."""
    target, _, _, _ = _sibling_paths(directory)
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
    """Check ``directory`` as a training run's output; returns the config of the checkpoint to
    continue (``resume``), or None to start fresh (no checkpoint there, or ``overwrite``).

    An existing checkpoint without ``resume`` or ``overwrite`` is a :class:`CheckpointError`;
    so is one that cannot be resumed (an incomplete checkpoint without its trainer state).
    """
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
    """A checkpoint is continued only with the settings it was started with -- ``epochs``
    included, since they shape the cosine schedule -- and on the same embeddings; the
    differing fields are named in the :class:`CheckpointError`."""
    ours = json.loads(json.dumps(asdict(cfg)))
    # keys a checkpoint of an earlier version lacks were their defaults then
    defaults = json.loads(json.dumps(asdict(TrainConfig())))
    theirs = {**{k: v for k, v in defaults.items() if k not in _ALWAYS_RECORDED},
              **dict(meta.get("train_config", {}))}  # fmt: skip
    diffs = [
        f"{key} {theirs.get(key)!r} (checkpoint) vs {ours.get(key)!r} (now)"
        for key in sorted(set(ours) | set(theirs))
        if key not in RESUME_MAY_DIFFER and theirs.get(key) != ours.get(key)
    ]
    for key, then, now in (
        ("embeddings", _location(str(meta.get("embeddings"))), _location(root)),
        ("split", meta.get("split"), split),
    ):
        if key in meta and then != now:
            diffs.append(f"{key} {then!r} (checkpoint) vs {now!r} (now)")
    if diffs:
        raise CheckpointError(
            f"{directory}: cannot resume with other settings: {'; '.join(diffs)}. Resume with "
            "the checkpoint's settings, or pass --overwrite to start over"
        )
