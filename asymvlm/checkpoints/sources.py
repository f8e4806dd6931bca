"""Where an adapter comes from: a checkpoint folder, an MLflow model URI or
``hf-hub:ORG/REPO[@REVISION]`` (``huggingface_hub``'s ``snapshot_download``: its cache,
``HF_HUB_OFFLINE``, revisions, ``HF_TOKEN``), resolved to a local folder."""

from __future__ import annotations

import os
import re

from asymvlm.checkpoints.folder import (
    CONFIG_FILE,
    EXPORT_FORMAT,
    WEIGHTS_FILE,
    check_no_pickle,
    read_checkpoint_meta,
)
from asymvlm.errors import CheckpointError

__all__ = ["HUB_PREFIX", "is_model_uri", "resolve_checkpoint"]

#: The prefix of a model folder on the Hugging Face Hub: ``hf-hub:ORG/REPO[@REVISION]``.
HUB_PREFIX = "hf-hub:"
_REPO = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def is_model_uri(source: str) -> bool:
    """Whether ``source`` names an MLflow model (``runs:/``, ``models:/``, any URI) or a Hub
    repository rather than a local folder."""
    return "://" in source or source.startswith(
        ("runs:/", "models:/", "mlflow-artifacts:/", HUB_PREFIX)
    )


def check_model_folder(folder: str, label: str) -> None:
    """Refuse a model folder that could run code when loaded (a pickle anywhere in it) or has
    no ``config.json``/``model.safetensors``, naming it."""
    check_no_pickle(folder, label)
    if read_checkpoint_meta(folder) is None:
        raise CheckpointError(f"{label}: not a model folder (no {CONFIG_FILE})")
    if not os.path.isfile(os.path.join(folder, WEIGHTS_FILE)):
        raise CheckpointError(f"{label}: no {WEIGHTS_FILE} (a partial copy or upload?)")


def _hub_snapshot(source: str) -> str:
    """The local snapshot of the Hub repository ``hf-hub:ORG/REPO[@REVISION]`` (downloaded, or
    from the cache when offline or when the revision is a cached commit)."""
    from huggingface_hub import errors as hub
    from huggingface_hub import snapshot_download, utils

    repo, at, revision = source.removeprefix(HUB_PREFIX).partition("@")
    if not _REPO.fullmatch(repo) or (at and not revision):
        raise CheckpointError(
            f"{source}: not a Hub model name (hf-hub:ORG/REPO or hf-hub:ORG/REPO@REVISION)"
        )
    quiet = utils.are_progress_bars_disabled()
    utils.disable_progress_bars()  # a few small files: no bars on the console
    try:
        return snapshot_download(repo, revision=revision or None)
    except hub.GatedRepoError:
        reason = "the repository is gated: accept its terms and log in (hf auth login)"
    except hub.RevisionNotFoundError:
        reason = f"the repository has no revision {revision!r}"
    except hub.RepositoryNotFoundError:
        reason = "no such repository on the Hub (or it is private: log in with hf auth login)"
    except hub.LocalEntryNotFoundError:
        reason = (
            "not in the Hugging Face cache, and the Hub cannot be reached or HF_HUB_OFFLINE is set"
        )
    except Exception as exc:  # a proxy, a server error, a full disk...
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
    finally:
        if not quiet:
            utils.enable_progress_bars()
    raise CheckpointError(f"{source}: cannot download the model: {reason}")


def resolve_checkpoint(
    source: str, tracking_uri: str | None = None, *, pretrained: bool = False
) -> str:
    """A local checkpoint folder for ``source``: the folder itself, the adapter inside the
    MLflow model ``source`` names (from the store ``tracking_uri``, default
    ``$MLFLOW_TRACKING_URI``), or the snapshot of ``hf-hub:ORG/REPO[@REVISION]``. A Hub
    snapshot, a folder of ``asymvlm export`` and, with ``pretrained``, any folder are model
    folders: one holding a pickle is refused."""
    if source.startswith(HUB_PREFIX):
        folder = _hub_snapshot(source)
        check_model_folder(folder, source)
        return folder
    if not is_model_uri(source):
        meta = read_checkpoint_meta(source)
        if meta is None:
            raise CheckpointError(f"{source}: not a checkpoint folder (no {CONFIG_FILE})")
        if pretrained or meta.get("format") == EXPORT_FORMAT:
            check_model_folder(source, source)
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
