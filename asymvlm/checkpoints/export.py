"""A trained adapter as a Hugging Face model folder (``asymvlm export``): ``model.safetensors``,
``config.json`` (the checkpoint's, plus ``format``, protocol, input calibration, the source run
and its metrics; the tables' path cut to its last component) and the ``README.md`` model card,
published as a whole. Publishing is ``hf upload ORG/REPO FOLDER``."""

from __future__ import annotations

import logging
import math
import os
from typing import Any

from asymvlm.checkpoints.card import model_card, package_version
from asymvlm.checkpoints.folder import (
    EXPORT_FORMAT,
    load_checkpoint,
    publish_folder,
    read_checkpoint_meta,
    sibling_paths,
    write_config,
    write_weights,
)
from asymvlm.checkpoints.sources import HUB_PREFIX, is_model_uri, resolve_checkpoint
from asymvlm.errors import CheckpointError

__all__ = ["export_adapter"]

logger = logging.getLogger(__name__)


def _run_of(source: str, tracking_uri: str | None) -> dict[str, Any] | None:
    """The MLflow run that logged ``source`` (None for folders and Hub models)."""
    if not is_model_uri(source) or source.startswith(HUB_PREFIX):
        return None
    from asymvlm.tracking import model_run

    try:
        return model_run(source, tracking_uri)
    except Exception as exc:  # the store cannot say: the card says no run was recorded
        reason = " ".join(str(exc).split())[:200]
        logger.warning(
            "%s: its run cannot be read (%s); the card has no evaluation", source, reason
        )
        return None


def _check_target(output: str, source_folder: str, overwrite: bool) -> None:
    """Refuse to write over the checkpoint itself, a file, a folder holding anything but an
    earlier export, and an earlier export unless ``overwrite``."""
    target = sibling_paths(output)[0]
    if target == os.path.realpath(source_folder):
        raise CheckpointError(f"{output}: the checkpoint's own folder; export to a new folder")
    if os.path.lexists(target) and not os.path.isdir(target):
        raise CheckpointError(f"{output} is a file, not a folder")
    if not os.path.isdir(target) or not os.listdir(target):
        return
    try:
        earlier = (read_checkpoint_meta(target) or {}).get("format") == EXPORT_FORMAT
    except CheckpointError:  # an unreadable config.json: not ours
        earlier = False
    if not earlier:
        raise CheckpointError(
            f"{output} already holds files that are not an exported model; "
            "choose a new or empty folder"
        )
    if not overwrite:
        raise CheckpointError(
            f"{output} already holds an exported model; pass --overwrite to replace it"
        )


def export_adapter(
    source: str,
    output: str,
    *,
    tracking_uri: str | None = None,
    repo: str | None = None,
    license: str = "apache-2.0",
    overwrite: bool = False,
) -> dict[str, Any]:
    """Export the adapter of ``source`` (a checkpoint folder or an MLflow model URI) into the
    model folder ``output``; returns its ``config.json``. ``repo`` (``ORG/REPO``) is named in
    the card's snippets; ``license`` goes into its metadata block."""
    folder = resolve_checkpoint(source, tracking_uri)
    method, meta = load_checkpoint(folder, "cpu")
    _check_target(output, folder, overwrite)
    state = method.state_dict()
    run = _run_of(source, tracking_uri)
    config = dict(meta)
    if meta.get("embeddings"):  # no path of this machine in a published folder
        config["embeddings"] = os.path.basename(str(meta["embeddings"]).rstrip("/"))
    config.update(
        format=EXPORT_FORMAT,
        asymvlm_version=package_version(),
        protocol=(meta.get("train_config") or {}).get("protocol")
        or (meta.get("method_kwargs") or {}).get("protocol"),
        input_calibration={
            k: float(v) for k, v in state.items() if k.endswith("input_scale") and v.numel() == 1
        },
    )
    metrics: dict[str, float] = {}
    if run is not None:
        metrics = {
            k: float(v)
            for k, v in sorted(run["metrics"].items())
            if isinstance(v, int | float) and math.isfinite(v)
        }
        config["source"] = {
            "mlflow_run_id": run["run_id"],
            "run_name": run["run_name"],
            "experiment": run["experiment"],
        }
        config["metrics"] = metrics
    card = model_card(config, metrics=metrics, source=run, repo=repo, license=license)

    def write(staging: str) -> None:
        write_weights(state, staging)
        write_config(config, staging)
        with open(os.path.join(staging, "README.md"), "w", encoding="utf-8") as fh:
            fh.write(card)

    publish_folder(output, write)
    logger.info("exported %s (%s) -> %s", source, meta["method"], output)
    return config
