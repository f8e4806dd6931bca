"""Where an adapter comes from: a checkpoint folder, an MLflow model URI or
``hf-hub:ORG/REPO[@REVISION]`` (through ``huggingface_hub``: its cache, ``HF_HUB_OFFLINE``,
revisions, ``HF_TOKEN``), resolved to a local folder; a model folder is checked first
(:func:`check_model_folder`: no pickle, the recorded SHA-256)."""

from __future__ import annotations

import os
import re

from asymvlm.checkpoints.folder import (
    CONFIG_FILE,
    EXPORT_FORMAT,
    HASHES_KEY,
    WEIGHTS_FILE,
    check_hashes,
    check_no_pickle,
    read_checkpoint_meta,
)
from asymvlm.errors import CheckpointError

__all__ = [
    "HUB_PREFIX",
    "MLFLOW_SCHEMES",
    "check_model_folder",
    "is_hub_name",
    "is_model_uri",
    "parse_hub_name",
    "resolve_checkpoint",
]

#: Prefixes of MLflow model URIs.
MLFLOW_SCHEMES = ("runs:/", "models:/", "mlflow-artifacts:/")
#: The prefix of a model folder on the Hugging Face Hub: ``hf-hub:ORG/REPO[@REVISION]``.
HUB_PREFIX = "hf-hub:"
_REPO = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def is_hub_name(source: str) -> bool:
    """Whether ``source`` names a Hub repository (``hf-hub:ORG/REPO[@REVISION]``)."""
    return source.startswith(HUB_PREFIX)


def is_model_uri(source: str) -> bool:
    """Whether ``source`` names an MLflow model, a Hub repository or another URI rather than a
    local folder."""
    return "://" in source or source.startswith(MLFLOW_SCHEMES) or is_hub_name(source)


def parse_hub_name(source: str) -> tuple[str, str | None]:
    """``hf-hub:ORG/REPO[@REVISION]`` -> (``ORG/REPO``, revision or None: the default branch)."""
    name = source.removeprefix(HUB_PREFIX)
    repo, at, revision = name.partition("@")
    if not _REPO.fullmatch(repo) or (at and not revision):
        raise CheckpointError(
            f"{source}: not a Hub model name (hf-hub:ORG/REPO or hf-hub:ORG/REPO@REVISION)"
        )
    return repo, revision or None


def check_model_folder(folder: str, source: str | None = None) -> dict:
    """Refuse a model folder that could run code when loaded or that changed since it was
    written: a pickle file anywhere in it, weights not in ``model.safetensors``, no SHA-256
    recorded for them, or a file whose SHA-256 differs from the recorded one; each
    :class:`CheckpointError` names the file. Returns the folder's ``config.json``."""
    label = source or folder
    check_no_pickle(folder, label)
    meta = read_checkpoint_meta(folder)
    if meta is None:
        raise CheckpointError(f"{label}: not a model folder (no {CONFIG_FILE})")
    if not os.path.isfile(os.path.join(folder, WEIGHTS_FILE)):
        raise CheckpointError(f"{label}: no {WEIGHTS_FILE} (a partial copy or upload?)")
    if WEIGHTS_FILE not in (meta.get(HASHES_KEY) or {}):
        raise CheckpointError(
            f"{label}: {CONFIG_FILE} records no SHA-256 of {WEIGHTS_FILE}; "
            "write the folder with `asymvlm export`"
        )
    try:
        check_hashes(folder, meta)
    except CheckpointError as err:
        raise CheckpointError(f"{label}: {err}") from None
    return meta


def _hub_snapshot(source: str) -> str:
    """The local snapshot of the Hub repository ``source`` names (downloaded, or from the
    cache when offline or when the revision is a cached commit)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    repo, revision = parse_hub_name(source)
    quiet_before = are_progress_bars_disabled()
    disable_progress_bars()  # a few small files: no bars on the console
    try:
        return snapshot_download(repo_id=repo, revision=revision, repo_type="model")
    except GatedRepoError:
        reason = "the repository is gated: accept its terms and log in (hf auth login)"
    except RevisionNotFoundError:
        reason = f"the repository has no revision {revision!r}"
    except RepositoryNotFoundError:
        reason = "no such repository on the Hub (or it is private: log in with hf auth login)"
    except LocalEntryNotFoundError:
        reason = (
            "not in the Hugging Face cache, and the Hub cannot be reached or HF_HUB_OFFLINE is set"
        )
    except Exception as exc:  # a proxy, a server error, a full disk...
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
    finally:
        if not quiet_before:
            enable_progress_bars()
    raise CheckpointError(f"{source}: cannot download the model: {reason}")


def resolve_checkpoint(
    source: str, tracking_uri: str | None = None, *, pretrained: bool = False
) -> str:
    """A local checkpoint folder for ``source``: the folder itself (it must hold a
    ``config.json``), the adapter checkpoint inside the MLflow model ``source`` names
    (downloaded from the store ``tracking_uri``, default ``$MLFLOW_TRACKING_URI``), or the
    snapshot of the Hub repository ``hf-hub:ORG/REPO[@REVISION]``.

    A Hub snapshot, a folder written by ``asymvlm export`` and -- with ``pretrained`` -- any
    folder are model folders: :func:`check_model_folder` refuses one with a pickle or a
    changed file."""
    if is_hub_name(source):
        folder = _hub_snapshot(source)
        check_model_folder(folder, source)
        return folder
    if not is_model_uri(source):
        if not os.path.isfile(os.path.join(source, CONFIG_FILE)):
            raise CheckpointError(f"{source}: not a checkpoint folder (no {CONFIG_FILE})")
        meta = read_checkpoint_meta(source) or {}
        if pretrained or meta.get("format") == EXPORT_FORMAT:
            check_model_folder(source)
        return source
    from asymvlm.tracking import download

    try:
        local = download(source, tracking_uri)
    except Exception as exc:  # any failure of the store or the URI: one line naming it
        raise CheckpointError(f"{source}: cannot download the model: {exc}") from None
    for folder, _, files in sorted(os.walk(local)):
        if CONFIG_FILE in files and WEIGHTS_FILE in files:
            if pretrained:
                check_model_folder(folder, source)
            return folder
    raise CheckpointError(
        f"{source}: the model holds no adapter checkpoint ({CONFIG_FILE} and {WEIGHTS_FILE})"
    )
