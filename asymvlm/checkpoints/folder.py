"""The checkpoint folder, one layout for every writer and reader (docs/sharing.md); a folder is
replaced as a whole. A pack holds ``pack_state.pt`` and a ``member{k}`` folder per finished one."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save

from asymvlm.errors import CheckpointError, ConfigError
from asymvlm.methods import METHODS, Method, build_method, method_distribution
from asymvlm.methods.arguments import adapter_size
from asymvlm.storage import absolute
from asymvlm.tracking.store import git_commit
from asymvlm.training import History, TrainConfig, Trainer

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
HISTORY_FILE = "history.jsonl"
TRAINER_FILE = "trainer.pt"
#: Every file a checkpoint folder may hold; anything else in it is not ours to replace.
CHECKPOINT_FILES = (CONFIG_FILE, WEIGHTS_FILE, HISTORY_FILE, TRAINER_FILE)
#: The adapter alone: what is exported and logged as a model.
ADAPTER_FILES = (CONFIG_FILE, WEIGHTS_FILE)
#: ``format`` in the ``config.json`` of a model folder written by ``asymvlm export``.
EXPORT_FORMAT = "asymvlm-adapter"
#: Python pickles (``torch.save`` included), refused in model folders: loading one can run code.
PICKLE_SUFFIXES = (".pt", ".pth", ".pkl", ".pickle", ".bin", ".ckpt", ".joblib")
PACK_STATE_FILE = "pack_state.pt"
MEMBER_FOLDER = "member{k}"
#: Settings a resumed run may change: where it runs, not what it computes.
RESUME_MAY_DIFFER = frozenset({"device", "stream_memory_bytes"})


@dataclass
class RunState:
    """Where a run stopped: the trainer's ``state_dict`` and the history of its epochs."""

    trainer: dict[str, Any]
    history: History


def check_no_pickle(folder: str, label: str | None = None) -> None:
    """Refuse a model folder holding a pickle anywhere, naming it."""
    for root, _, files in os.walk(folder):
        for name in sorted(f for f in files if f.lower().endswith(PICKLE_SUFFIXES)):
            raise CheckpointError(
                f"{label or folder}: holds {os.path.relpath(os.path.join(root, name), folder)}, "
                f"a pickle (it can run code when loaded); a model folder keeps its weights in "
                f"{WEIGHTS_FILE} only"
            )


def sibling_paths(directory: str) -> tuple[str, str, str]:
    """(folder, staging, previous): the folder and its hidden siblings."""
    target = os.path.realpath(directory)
    parent, name = os.path.split(target)
    return target, os.path.join(parent, f".{name}.writing"), os.path.join(parent, f".{name}.old")


def recover_checkpoint(directory: str) -> None:
    """After a killed :func:`publish_folder`: the old folder back in place, no leftovers."""
    target, staging, previous = sibling_paths(directory)
    if os.path.isdir(previous):
        if os.path.lexists(target):
            shutil.rmtree(previous)
        else:
            os.rename(previous, target)
    shutil.rmtree(staging, ignore_errors=True)


def publish_folder(directory: str, write: Callable[[str], None]) -> None:
    """Replace the folder ``directory`` as a whole by what ``write(staging)`` writes beside it."""
    target, staging, previous = sibling_paths(directory)
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        recover_checkpoint(directory)
        os.mkdir(staging)
        write(staging)
        if os.path.lexists(target):
            os.rename(target, previous)
        os.rename(staging, target)
        shutil.rmtree(previous, ignore_errors=True)
    except OSError as exc:
        raise CheckpointError(f"{directory}: cannot write the checkpoint ({exc})") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # only left when something failed


def discard_checkpoint(directory: str) -> None:
    """Remove a checkpoint folder."""
    recover_checkpoint(directory)
    shutil.rmtree(sibling_paths(directory)[0], ignore_errors=True)


def provenance(split: Any) -> dict[str, Any]:
    """What a checkpoint records of the split it was trained on: the model and encoder of its
    tables and the tables' fingerprint (:func:`asymvlm.tables.fingerprint`)."""
    manifest = getattr(split, "manifest", None)
    if manifest is None:
        return {}
    info, keys = manifest.to_dict(), ("model", "revision", "family", "files_sha256", "dim")
    encoder = {"encoder": {k: info.get(k) for k in keys}} if info.get("family") else {}
    tables = {"tables_fingerprint": split.fingerprint} if split.fingerprint else {}
    return {"embedding_model": manifest.model, **encoder, **tables}


def write_weights(state: dict[str, torch.Tensor], folder: str) -> None:
    """``state`` as ``model.safetensors`` in ``folder`` (contiguous CPU copies), readable as the
    other files are (safetensors' own ``save_file`` writes mode 0600 whatever the umask)."""
    weights = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in state.items()}
    Path(folder, WEIGHTS_FILE).write_bytes(save(weights, metadata={"format": "pt"}))


def write_config(config: dict[str, Any], folder: str) -> None:
    Path(folder, CONFIG_FILE).write_text(json.dumps(config, indent=2, allow_nan=False) + "\n")


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
    """Write the checkpoint folder ``directory``; ``epoch`` defaults to the end of training."""
    epochs = cfg.epochs if method.trainable else 0
    epoch = epochs if epoch is None else int(epoch)
    package, commit = method_distribution(method.name), git_commit()
    meta = {
        "method": method.name,
        **({"method_package": package} if package else {}),
        "dim": dim,
        "method_kwargs": cfg.method_args(),
        "adapter_size": adapter_size(method.name, cfg.protocol, cfg.method_args()),
        "adapter_input": cfg.adapter_input,
        "train_config": cfg.model_dump(),
        "complete": bool(epoch >= epochs if complete is None else complete),
        "epoch": epoch,
        "epochs": epochs,
        "asymvlm_version": version("asymvlm"),
        "torch_version": torch.__version__,
        **({"git_commit": commit} if commit != "unknown" else {}),  # run from a git checkout
        **(extra or {}),
    }
    json.dumps(meta, allow_nan=False)  # not JSON: refused before anything is written
    rows = "".join(json.dumps(row, allow_nan=False) + "\n" for row in history or [])
    state = method.state_dict()

    def write(folder: str) -> None:
        write_weights(state, folder)
        if trainer_state is not None:
            torch.save(trainer_state, os.path.join(folder, TRAINER_FILE))
        if history is not None:
            Path(folder, HISTORY_FILE).write_text(rows)
        write_config(meta, folder)

    publish_folder(directory, write)


def save_run_checkpoint(
    directory: str,
    trainer: Trainer,
    history: History | None = None,
    extra: dict[str, Any] | None = None,
    *,
    state: bool = True,
    complete: bool | None = None,
) -> None:
    """The checkpoint of a run where its ``trainer`` stands; with ``state``, what resumes it."""
    save_checkpoint(
        directory,
        trainer.method,
        trainer.cfg,
        trainer.data.dim,
        {**provenance(trainer.data.split), **(extra or {})},
        epoch=trainer.epoch,
        complete=complete,
        trainer_state=trainer.state_dict() if state else None,
        history=history if state else None,
    )


def _torch_load(path: str) -> Any:
    """A ``torch.save`` file on the CPU, weights only (the RNG state must stay on the CPU)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as exc:
        raise CheckpointError(f"{path}: cannot resume from it ({exc})") from exc


def read_run_state(directory: str) -> RunState:
    """The trainer state and history of a checkpoint folder, to resume its run."""
    trainer = _torch_load(os.path.join(directory, TRAINER_FILE))
    history = read_history(directory)
    epoch = trainer.get("epoch") if isinstance(trainer, dict) else None
    if epoch is None or [row.get("epoch") for row in history] != list(range(1, int(epoch) + 1)):
        raise CheckpointError(
            f"{directory}: {HISTORY_FILE} does not hold the epochs of {TRAINER_FILE}; "
            "pass --overwrite to start over"
        )
    return RunState(trainer=trainer, history=history)


def copy_adapter(directory: str, target: str) -> str:
    """Copy the adapter files of checkpoint ``directory`` into ``target``; returns ``target``."""
    os.makedirs(target, exist_ok=True)
    for name in ADAPTER_FILES:
        shutil.copy2(os.path.join(directory, name), os.path.join(target, name))
    return target


def save_pack_checkpoint(directory: str, pack: Any) -> None:
    """A pack's checkpoint: its state and the adapter of every member that has finished."""
    os.makedirs(directory, exist_ok=True)
    torch.save(pack.state_dict(), os.path.join(directory, PACK_STATE_FILE))
    for k, trainer in enumerate(pack.trainers):
        if pack.errors[k] is None and trainer.epoch == trainer.cfg.epochs:
            folder = os.path.join(directory, MEMBER_FOLDER.format(k=k))
            save_run_checkpoint(folder, trainer, state=False)


def read_pack_state(directory: str) -> dict[str, Any]:
    return _torch_load(os.path.join(directory, PACK_STATE_FILE))


def read_checkpoint_meta(directory: str) -> dict[str, Any] | None:
    """The ``config.json`` of a checkpoint folder, or None when it has none."""
    path = os.path.join(directory, CONFIG_FILE)
    if not os.path.isfile(path):
        return None
    try:
        meta = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{directory}: unreadable {CONFIG_FILE} ({exc})") from exc
    if not isinstance(meta, dict) or not {"method", "dim", "complete"} <= meta.keys():
        raise CheckpointError(f"{directory}: {CONFIG_FILE} is not a checkpoint's")
    return meta


def read_history(directory: str) -> History:
    """The rows of ``history.jsonl`` (none when the folder has no history)."""
    path = os.path.join(directory, HISTORY_FILE)
    if not os.path.isfile(path):
        return []
    try:
        return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not JSON lines ({exc.msg})") from exc


def load_checkpoint(
    directory: str, device: str | torch.device = "cpu", *, allow_incomplete: bool = False
) -> tuple[Method, dict[str, Any]]:
    """(method, config) of a checkpoint folder; an incomplete one only with ``allow_incomplete``."""
    meta = read_checkpoint_meta(directory)
    if meta is None:
        raise CheckpointError(f"{directory}: not a checkpoint folder (no {CONFIG_FILE})")
    if not meta["complete"] and not allow_incomplete:
        raise CheckpointError(
            f"{directory}: incomplete checkpoint (epoch {meta.get('epoch')} of "
            f"{meta.get('epochs')}): finish the run with `asymvlm train ... --resume`, or use "
            "it as it is with --allow-incomplete"
        )
    if meta.get("format") == EXPORT_FORMAT:
        check_no_pickle(directory)
    name, dim = meta["method"], meta["dim"]
    if name not in METHODS:
        package = meta.get("method_package") or {}
        install = f"; `pip install {package['name']}=={package['version']}`" if package else ""
        raise CheckpointError(f"{directory}: method {name!r} is not installed here{install}")
    try:
        method = build_method(name, dim, **meta.get("method_kwargs", {}))
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{directory}: cannot rebuild method {name!r}: {exc}") from exc
    weights = os.path.join(directory, WEIGHTS_FILE)
    try:
        state = load_file(weights, device="cpu")
    except Exception as exc:  # safetensors' own error type, or an OSError
        raise CheckpointError(f"{weights}: unreadable ({exc})") from exc
    try:
        method.load_state_dict(state)
    except RuntimeError as exc:
        raise CheckpointError(
            f"{directory}: {WEIGHTS_FILE} does not match {CONFIG_FILE}, which names method "
            f"{name!r} (dim {dim}): {' '.join(str(exc).split())}"
        ) from exc
    return method.to(torch.device(device)).eval(), meta


def check_output(directory: str) -> None:
    """Refuse an output that cannot hold a checkpoint folder (replaced as a whole)."""
    target = sibling_paths(directory)[0]
    if target == os.path.realpath(os.getcwd()):
        raise CheckpointError(f"{directory} is the current folder; name a new folder for it")
    ancestor = target
    while not os.path.lexists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise CheckpointError(f"{directory}: {ancestor} is a file, not a folder")
    parent = os.path.dirname(target) if ancestor == target else ancestor
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CheckpointError(f"{directory}: cannot write a checkpoint ({parent} is read-only)")
    foreign = sorted(set(os.listdir(target)) - set(CHECKPOINT_FILES)) if ancestor == target else []
    if foreign:
        raise CheckpointError(
            f"{directory} holds files that are not part of a checkpoint ({', '.join(foreign[:5])}"
            "); a checkpoint replaces its whole folder: choose a new or empty folder"
        )


def checkpoint_to_resume(
    directory: str, *, resume: bool = False, overwrite: bool = False
) -> dict[str, Any] | None:
    """The config of the checkpoint in ``directory`` to ``resume``, or None to start afresh."""
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
    if meta is None:
        raise CheckpointError(f"{directory}: cannot resume: no {CONFIG_FILE}; pass --overwrite")
    return meta


def check_resumable(
    directory: str, meta: dict[str, Any], cfg: TrainConfig, root: str, split: str
) -> None:
    """Refuse to continue a checkpoint with other settings or embeddings, naming them."""
    ours = json.loads(json.dumps(cfg.model_dump()))
    theirs = dict(meta.get("train_config", {}))
    pairs = [(k, theirs.get(k), ours.get(k)) for k in sorted(set(ours) | set(theirs))]
    for key, now in (("embeddings", absolute(root)), ("split", split)):
        if key in meta:
            pairs.append((key, absolute(meta[key]) if key == "embeddings" else meta[key], now))
    diffs = [
        f"{key} {then!r} (checkpoint) vs {now!r} (now)"
        for key, then, now in pairs
        if key not in RESUME_MAY_DIFFER and then != now
    ]
    if diffs:
        raise CheckpointError(
            f"{directory}: cannot resume with other settings: {'; '.join(diffs)}. Resume with "
            "the checkpoint's settings, or pass --overwrite to start over"
        )
