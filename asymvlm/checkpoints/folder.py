"""The checkpoint folder: its files, written as a whole, read back.

One layout for every writer -- ``asymvlm train``, a Ray Train run, a sweep's Tune trials and
their packs -- and every reader (``evaluate``, ``score``, the scorer, the MLflow models, a
resumed run):

* ``config.json`` (:data:`CONFIG_FILE`): everything needed to rebuild the method (method, dim,
  method arguments, adapter input, the training config), ``complete``, ``epoch``, ``epochs``,
  and what the tables record of their encoder (:func:`provenance`);
* ``model.safetensors`` (:data:`WEIGHTS_FILE`): the method's ``state_dict`` (CPU tensors, in
  safetensors: no pickle, nothing that runs code on load), its SHA-256 recorded in
  ``config.json`` (``sha256``) and checked on load; checkpoints of earlier versions hold
  ``model.pt`` (:data:`LEGACY_WEIGHTS_FILE`, a ``torch.save`` pickle) instead, still read
  (weights only), with one log line saying so;
* ``history.jsonl`` (:data:`HISTORY_FILE`): one row per epoch trained so far;
* ``trainer.pt`` (:data:`TRAINER_FILE`): :meth:`~asymvlm.training.Trainer.state_dict`, to
  resume the run (:func:`read_run_state`).

The adapter alone is the first two (:data:`ADAPTER_FILES`; what a sweep exports and logs as an
MLflow model, :func:`copy_adapter`). A pack of trials (:class:`~asymvlm.training.PackedTrainer`)
checkpoints as a folder holding :data:`PACK_STATE_FILE` and one adapter folder per finished
member (:func:`member_folder`).

A folder is published as a whole (:func:`publish_folder`): readers see the old folder or the
new one, and a killed run never leaves a half-written or mixed checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from safetensors.torch import load_file as load_safetensors
from safetensors.torch import save_file as save_safetensors

from asymvlm.errors import CheckpointError
from asymvlm.methods import Method, build_method
from asymvlm.training import History, TrainConfig, Trainer

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
#: The weights file of checkpoints written before safetensors (a ``torch.save`` pickle).
LEGACY_WEIGHTS_FILE = "model.pt"
HISTORY_FILE = "history.jsonl"
TRAINER_FILE = "trainer.pt"
#: Every file a checkpoint folder may hold; anything else in it is not ours to replace.
CHECKPOINT_FILES = (CONFIG_FILE, WEIGHTS_FILE, LEGACY_WEIGHTS_FILE, HISTORY_FILE, TRAINER_FILE)
#: The adapter alone: what is exported and logged as a model (no optimiser state, no history);
#: an older checkpoint's adapter is its config and :data:`LEGACY_WEIGHTS_FILE`.
ADAPTER_FILES = (CONFIG_FILE, WEIGHTS_FILE)
#: A model folder's model card (``asymvlm export``; the Hugging Face Hub shows it).
CARD_FILE = "README.md"
#: ``format`` in the ``config.json`` of a model folder written by ``asymvlm export``.
EXPORT_FORMAT = "asymvlm-adapter"
#: File endings of Python pickles (``torch.save`` included), refused in model folders: loading
#: a pickle can run code.
PICKLE_SUFFIXES = (".pt", ".pth", ".pkl", ".pickle", ".bin", ".ckpt", ".joblib")
#: The key of ``config.json`` recording the SHA-256 of its weights file: ``{file: hex digest}``.
HASHES_KEY = "sha256"
#: A pack's checkpoint: its state (:meth:`~asymvlm.training.PackedTrainer.state_dict`) ...
PACK_STATE_FILE = "pack_state.pt"
#: ... and the adapter folder of each finished member k.
MEMBER_FOLDER = "member{k}"


@dataclass
class RunState:
    """Where a run stopped: :meth:`~asymvlm.training.Trainer.state_dict` and the history of its
    epochs so far."""

    trainer: dict[str, Any]
    history: History


def member_folder(directory: str, k: int) -> str:
    """The adapter folder of member ``k`` in the pack checkpoint ``directory``."""
    return os.path.join(directory, MEMBER_FOLDER.format(k=k))


def weights_file(directory: str) -> str | None:
    """The name of the weights file in checkpoint ``directory``: :data:`WEIGHTS_FILE`, else an
    older checkpoint's :data:`LEGACY_WEIGHTS_FILE`; None when it holds neither."""
    for name in (WEIGHTS_FILE, LEGACY_WEIGHTS_FILE):
        if os.path.isfile(os.path.join(directory, name)):
            return name
    return None


def file_sha256(path: str) -> str:
    """The SHA-256 hex digest of the file ``path``."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_hashes(directory: str, meta: dict[str, Any]) -> None:
    """Refuse a folder whose files differ from the SHA-256 its ``config.json`` records for them
    (``sha256``: ``{file: digest}``), naming the file; nothing is recorded by older
    checkpoints."""
    recorded = meta.get(HASHES_KEY) or {}
    if not isinstance(recorded, dict):
        raise CheckpointError(f"{directory}: {CONFIG_FILE}'s {HASHES_KEY!r} is not a mapping")
    for name, expected in sorted(recorded.items()):
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            raise CheckpointError(f"{path}: missing ({CONFIG_FILE} records its SHA-256)")
        if file_sha256(path) != expected:
            raise CheckpointError(
                f"{path}: its SHA-256 differs from the one {CONFIG_FILE} records (the file "
                "changed after the checkpoint was written); refusing to load it"
            )


def check_no_pickle(folder: str, label: str | None = None) -> None:
    """Refuse a model folder holding a pickle anywhere (:data:`PICKLE_SUFFIXES`), naming it."""
    for root, _, files in os.walk(folder):
        for name in sorted(files):
            if name.lower().endswith(PICKLE_SUFFIXES):
                where = os.path.relpath(os.path.join(root, name), folder)
                raise CheckpointError(
                    f"{label or folder}: holds {where}, a pickle (it can run code when loaded); "
                    f"a model folder keeps its weights in {WEIGHTS_FILE} only"
                )


def sibling_paths(directory: str) -> tuple[str, str, str, str]:
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
    target, staging, previous, discarded = sibling_paths(directory)
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
    target, staging, previous, _ = sibling_paths(directory)
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
    target, _, _, discarded = sibling_paths(directory)
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
        out["encoder"] = {
            k: info.get(k) for k in ("model", "revision", "family", "files_sha256", "dim")
        }
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
    history: History | None = None,
) -> None:
    """Write the checkpoint folder ``directory`` as a whole (:func:`publish_folder`).

    ``config.json`` holds everything needed to rebuild the method plus ``complete``, ``epoch``
    and ``epochs``, ``extra`` (provenance) and the SHA-256 of the weights;
    ``model.safetensors`` the weights; ``trainer.pt``
    (:meth:`~asymvlm.training.Trainer.state_dict`) and ``history.jsonl`` are written when given.
    ``epoch`` defaults to the end of training; ``complete`` to ``epoch >= epochs``.
    :func:`load_checkpoint` refuses an incomplete checkpoint unless told.
    """
    epochs = cfg.epochs if method.trainable else 0
    epoch = epochs if epoch is None else int(epoch)
    meta = {
        "method": method.name,
        "dim": dim,
        "method_kwargs": cfg.method_args(),
        "adapter_input": cfg.adapter_input,
        "train_config": cfg.model_dump(),
        "complete": bool(epoch >= epochs if complete is None else complete),
        "epoch": epoch,
        "epochs": epochs,
        **(extra or {}),
    }
    json.dumps(meta, allow_nan=False)  # not JSON: refused before anything is written
    history_text = None
    if history is not None:
        history_text = "".join(json.dumps(row, allow_nan=False) + "\n" for row in history)
    weights = state_tensors(method.state_dict())

    def write(folder: str) -> None:
        path = write_weights(weights, os.path.join(folder, WEIGHTS_FILE))
        config_text = json.dumps(
            {**meta, HASHES_KEY: {WEIGHTS_FILE: file_sha256(path)}}, indent=2, allow_nan=False
        )
        if trainer_state is not None:
            torch.save(trainer_state, os.path.join(folder, TRAINER_FILE))
        if history_text is not None:
            with open(os.path.join(folder, HISTORY_FILE), "w") as fh:
                fh.write(history_text)
        with open(os.path.join(folder, CONFIG_FILE), "w") as fh:
            fh.write(config_text)

    publish_folder(directory, write)


def state_tensors(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A state dict as safetensors stores it: every value a contiguous CPU tensor of its own.
    Copies, so that no two entries share memory (a packed member's parameters are views of the
    pack's stacked ones; tied weights would share a buffer, which safetensors refuses)."""
    out = {}
    for key, value in state.items():
        if not torch.is_tensor(value):
            raise CheckpointError(
                f"state entry {key!r} is not a tensor "
                f"({type(value).__name__}): safetensors stores tensors only"
            )
        out[key] = value.detach().to("cpu", copy=True).contiguous()
    return out


def write_weights(weights: dict[str, torch.Tensor], path: str) -> str:
    """Write ``weights`` (:func:`state_tensors`) as safetensors at ``path``, readable as the
    process's umask allows (safetensors creates the file owner-only); returns ``path``."""
    save_safetensors(weights, path, metadata={"format": "pt"})
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)
    return path


def save_run_checkpoint(
    directory: str,
    trainer: Trainer,
    history: History | None = None,
    extra: dict[str, Any] | None = None,
    *,
    state: bool = True,
    complete: bool | None = None,
) -> None:
    """The checkpoint of a run where its ``trainer`` stands: the adapter, what its tables
    record of their encoder (:func:`provenance`), ``extra``, and -- with ``state`` -- the
    trainer's state and the ``history`` to resume from (:func:`read_run_state`). The one writer
    of ``asymvlm train``, Ray Train runs, sweep trials and pack members."""
    save_checkpoint(
        directory,
        trainer.method,
        trainer.cfg,
        trainer.data.dim,
        {**provenance(trainer.data.split.manifest), **(extra or {})},
        epoch=trainer.epoch,
        complete=complete,
        trainer_state=trainer.state_dict() if state else None,
        history=history if state else None,
    )


def read_run_state(directory: str) -> RunState:
    """The trainer state and history of a checkpoint folder, to resume its run. Loaded on the
    CPU whatever the run's device: the trainer moves the weights and optimiser state to its
    device, and the RNG state must stay a CPU tensor (``torch.set_rng_state`` refuses others).
    Each file's problem is a :class:`CheckpointError` naming it."""
    path = os.path.join(directory, TRAINER_FILE)
    try:
        trainer = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as exc:
        raise CheckpointError(f"{path}: cannot resume from it ({exc})") from exc
    if not isinstance(trainer, dict) or "epoch" not in trainer:
        raise CheckpointError(f"{path}: not a trainer state (no epoch)")
    history = read_history(directory)
    epoch = int(trainer["epoch"])
    if [row.get("epoch") for row in history] != list(range(1, epoch + 1)):
        raise CheckpointError(
            f"{directory}: {HISTORY_FILE} does not hold epochs 1..{epoch} of {TRAINER_FILE}; "
            "pass --overwrite to start over"
        )
    return RunState(trainer=trainer, history=history)


def copy_adapter(directory: str, target: str) -> str:
    """Copy the adapter of checkpoint ``directory`` (its config and weights file, no optimiser
    state, no history) into the folder ``target``; returns ``target``."""
    os.makedirs(target, exist_ok=True)
    for name in (CONFIG_FILE, weights_file(directory) or WEIGHTS_FILE):
        shutil.copy2(os.path.join(directory, name), os.path.join(target, name))
    return target


# -- packs --------------------------------------------------------------------------------------
def save_pack_checkpoint(directory: str, pack: Any) -> None:
    """A pack's checkpoint folder: its state (:data:`PACK_STATE_FILE`, what a retry resumes
    from) and the adapter of every member that has finished its epochs (:func:`member_folder`).
    ``pack``: a :class:`~asymvlm.training.PackedTrainer`."""
    os.makedirs(directory, exist_ok=True)
    torch.save(pack.state_dict(), os.path.join(directory, PACK_STATE_FILE))
    for k, trainer in enumerate(pack.trainers):
        if pack.errors[k] is None and trainer.epoch == trainer.cfg.epochs:
            save_run_checkpoint(member_folder(directory, k), trainer, state=False)


def read_pack_state(directory: str) -> dict[str, Any]:
    """The pack state of a pack checkpoint folder (on the CPU, as :func:`read_run_state`)."""
    path = os.path.join(directory, PACK_STATE_FILE)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as exc:
        raise CheckpointError(f"{path}: cannot resume the pack from it ({exc})") from exc


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


def read_history(directory: str) -> History:
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


def _read_weights(path: str) -> Any:
    """The state dict of a weights file: safetensors, or an older checkpoint's pickle read as
    weights only (one log line says so)."""
    if os.path.basename(path) == WEIGHTS_FILE:
        try:
            return load_safetensors(path, device="cpu")
        except Exception as exc:  # safetensors' own error type, or an OSError
            raise CheckpointError(f"{path}: unreadable ({exc})") from exc
    logger.warning(
        "%s: an older checkpoint's pickle, read as weights only; `asymvlm export` writes it as %s",
        path,
        WEIGHTS_FILE,
    )
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError) as exc:
        raise CheckpointError(f"{path}: unreadable ({exc})") from exc


def load_checkpoint(
    directory: str, device: str | torch.device = "cpu", *, allow_incomplete: bool = False
) -> tuple[Method, dict[str, Any]]:
    """Rebuild the method saved by :func:`save_checkpoint`; returns (method, config dict).

    Raises :class:`CheckpointError` naming the folder when it holds no checkpoint, when the
    weights are missing, unreadable, differ from the SHA-256 ``config.json`` records or do not
    fit the method it names (with the registered methods they would fit), and for an
    incomplete checkpoint (a run still in progress, killed or diverged) unless
    ``allow_incomplete``. An older checkpoint's ``model.pt`` is read as weights only
    (``torch.load(weights_only=True)``: no code runs), with one log line saying so.
    """
    if not os.path.isdir(directory):
        _, _, previous, _ = sibling_paths(directory)
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
    if meta.get("format") == EXPORT_FORMAT:  # a model folder: nothing that runs code on load
        check_no_pickle(directory)
    found = weights_file(directory)
    if found is None:
        raise CheckpointError(f"{directory}: {CONFIG_FILE} but no {WEIGHTS_FILE} (a partial copy?)")
    weights = os.path.join(directory, found)
    check_hashes(directory, meta)
    name, dim = meta["method"], meta["dim"]
    kwargs = meta.get("method_kwargs", {})
    try:
        method = build_method(name, dim, **kwargs)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{directory}: cannot rebuild method {name!r}: {exc}") from exc
    state = _read_weights(weights)
    mismatch = _state_mismatch(method, state)
    if mismatch is not None:
        fits = _methods_fitting(state, dim, kwargs) if isinstance(state, dict) else []
        guess = f"the weights fit {', '.join(fits)}" if fits else "the weights fit no known method"
        raise CheckpointError(
            f"{directory}: {found} does not match {CONFIG_FILE}, which names method "
            f"{name!r} (dim {dim}): {mismatch}; {guess}"
        )
    method.load_state_dict(state)
    method.to(torch.device(device)).eval()
    return method, meta
