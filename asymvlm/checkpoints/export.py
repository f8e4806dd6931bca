"""A trained adapter as a Hugging Face model folder (``asymvlm export``): ``model.safetensors``,
``config.json`` (the checkpoint's, plus ``format``, protocol, input calibration, the source run
and its metrics, the weights' SHA-256; the tables' path cut to its last component) and the
``README.md`` model card, published as a whole. Publishing is ``hf upload ORG/REPO FOLDER``."""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any

from asymvlm.checkpoints.card import model_card, package_version
from asymvlm.checkpoints.folder import (
    CARD_FILE,
    CONFIG_FILE,
    EXPORT_FORMAT,
    HASHES_KEY,
    WEIGHTS_FILE,
    file_sha256,
    load_checkpoint,
    publish_folder,
    read_checkpoint_meta,
    sibling_paths,
    state_tensors,
    write_weights,
)
from asymvlm.checkpoints.sources import is_hub_name, is_model_uri, resolve_checkpoint
from asymvlm.errors import CheckpointError

__all__ = ["EXPORT_FILES", "export_adapter"]

logger = logging.getLogger(__name__)

#: The files of an exported model folder.
EXPORT_FILES = (CONFIG_FILE, WEIGHTS_FILE, CARD_FILE)
#: Config keys a published folder does not carry: where the checkpoint lay on this machine.
_LOCAL_ONLY = ("embeddings",)


def _run_of(source: str, tracking_uri: str | None) -> dict[str, Any] | None:
    """The MLflow run that logged ``source`` (None for folders and Hub models)."""
    if not is_model_uri(source) or is_hub_name(source):
        return None
    from asymvlm.tracking import model_run

    try:
        return model_run(source, tracking_uri)
    except Exception as exc:  # the store cannot say: the card says no run was recorded
        logger.warning(
            "%s: the run that logged it cannot be read (%s); the model card has no evaluation",
            source,
            " ".join(str(exc).split())[:200],
        )
        return None


def _check_target(output: str, source_folder: str, overwrite: bool) -> None:
    """Refuse to write over the checkpoint itself, over a file, over a folder holding anything
    but an earlier export, and over an earlier export unless ``overwrite``."""
    target = sibling_paths(output)[0]
    if target == os.path.realpath(source_folder):
        raise CheckpointError(f"{output}: the checkpoint's own folder; export to a new folder")
    if os.path.lexists(target) and not os.path.isdir(target):
        raise CheckpointError(f"{output} is a file, not a folder")
    if os.path.isdir(target) and os.listdir(target):
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
    weights = state_tensors(method.state_dict())
    run = _run_of(source, tracking_uri)
    train = dict(meta.get("train_config") or {})
    config: dict[str, Any] = {k: v for k, v in meta.items() if k not in (HASHES_KEY, *_LOCAL_ONLY)}
    if meta.get("embeddings"):
        config["embeddings"] = os.path.basename(str(meta["embeddings"]).rstrip("/"))
    config.update(
        format=EXPORT_FORMAT,
        asymvlm_version=package_version(),
        protocol=train.get("protocol") or (meta.get("method_kwargs") or {}).get("protocol"),
        input_calibration={
            k: float(v) for k, v in weights.items() if k.endswith("input_scale") and v.numel() == 1
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
        path = write_weights(weights, os.path.join(staging, WEIGHTS_FILE))
        config[HASHES_KEY] = {WEIGHTS_FILE: file_sha256(path)}
        with open(os.path.join(staging, CONFIG_FILE), "w") as fh:
            fh.write(json.dumps(config, indent=2, allow_nan=False) + "\n")
        with open(os.path.join(staging, CARD_FILE), "w", encoding="utf-8") as fh:
            fh.write(card)

    publish_folder(output, write)
    logger.info("exported %s (%s) -> %s", source, meta["method"], output)
    return config
