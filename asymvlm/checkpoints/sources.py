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

HUB_PREFIX = "hf-hub:"
_REPO = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def is_model_uri(source: str) -> bool:
    """Whether ``source`` names an MLflow model (``runs:/``, ``models:/``, any URI) or a Hub
    repository rather than a local folder."""
    return "://" in source or source.startswith(
        ("runs:/", "models:/", "mlflow-artifacts:/", HUB_PREFIX)
    )


def _hub_snapshot(source: str) -> str:
    """The local snapshot of ``hf-hub:ORG/REPO[@REVISION]`` (downloaded, or from the cache)."""
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
    except hub.RevisionNotFoundError:
        reason = f"the repository has no revision {revision!r}"
    except hub.RepositoryNotFoundError:  # gated ones too
        reason = "no such repository on the Hub (or it is private or gated: hf auth login)"
    except hub.LocalEntryNotFoundError:
        reason = "not in the Hugging Face cache, and the Hub cannot be reached (or HF_HUB_OFFLINE)"
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
    MLflow model ``source`` names (from the store ``tracking_uri``), or the snapshot of
    ``hf-hub:ORG/REPO[@REVISION]``. A Hub snapshot, a folder of ``asymvlm export`` and, with
    ``pretrained``, any folder are model folders: one holding a pickle is refused."""
    if source.startswith(HUB_PREFIX):
        folder, pretrained = _hub_snapshot(source), True
    elif not is_model_uri(source):
        folder = source
        meta = read_checkpoint_meta(source) or {}
        pretrained = pretrained or meta.get("format") == EXPORT_FORMAT
    else:
        from asymvlm.tracking import download

        try:
            local = download(source, tracking_uri)
        except Exception as exc:  # any failure of the store or the URI: one line naming it
            raise CheckpointError(f"{source}: cannot download the model: {exc}") from None
        found = [d for d, _, files in sorted(os.walk(local)) if CONFIG_FILE in files]
        folder = found[0] if found else local
    if pretrained:
        check_no_pickle(folder, source)
    if read_checkpoint_meta(folder) is None:
        raise CheckpointError(f"{source}: not a checkpoint folder (no {CONFIG_FILE})")
    if not os.path.isfile(os.path.join(folder, WEIGHTS_FILE)):
        raise CheckpointError(f"{source}: no {WEIGHTS_FILE} (a partial copy or upload?)")
    return folder
