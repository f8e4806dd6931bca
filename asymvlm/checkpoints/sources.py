"""Where an adapter comes from: a checkpoint folder, or an MLflow model of a sweep's trial.

:func:`resolve_checkpoint` turns what a user gives (``--checkpoint``, ``Scorer.from_checkpoint``,
the Serve deployment) into a local checkpoint folder: the folder itself, or -- for an MLflow
model URI (``runs:/<run>/adapter``, ``models:/<name>/<version>``, ``mlflow-artifacts:/...``) --
the adapter checkpoint inside the downloaded model (:func:`asymvlm.tracking.download`).
"""

from __future__ import annotations

import os

from asymvlm.checkpoints.folder import CONFIG_FILE, LEGACY_WEIGHTS_FILE, WEIGHTS_FILE
from asymvlm.errors import CheckpointError

__all__ = ["MLFLOW_SCHEMES", "is_model_uri", "resolve_checkpoint"]

#: Prefixes of MLflow model URIs.
MLFLOW_SCHEMES = ("runs:/", "models:/", "mlflow-artifacts:/")


def is_model_uri(source: str) -> bool:
    """Whether ``source`` names an MLflow model or another URI rather than a local folder."""
    return "://" in source or source.startswith(MLFLOW_SCHEMES)


def resolve_checkpoint(source: str, tracking_uri: str | None = None) -> str:
    """A local checkpoint folder for ``source``: the folder itself (it must hold a
    ``config.json``), or the adapter checkpoint inside the MLflow model ``source`` names,
    downloaded from the store ``tracking_uri`` (default: ``$MLFLOW_TRACKING_URI``)."""
    if not is_model_uri(source):
        if not os.path.isfile(os.path.join(source, CONFIG_FILE)):
            raise CheckpointError(f"{source}: not a checkpoint folder (no {CONFIG_FILE})")
        return source
    from asymvlm.tracking import download

    try:
        local = download(source, tracking_uri)
    except Exception as exc:  # any failure of the store or the URI: one line naming it
        raise CheckpointError(f"{source}: cannot download the model: {exc}") from None
    for folder, _, files in sorted(os.walk(local)):
        if CONFIG_FILE in files and (WEIGHTS_FILE in files or LEGACY_WEIGHTS_FILE in files):
            return folder
    raise CheckpointError(f"{source}: the model holds no adapter checkpoint ({CONFIG_FILE} and "
                          f"{WEIGHTS_FILE})")  # fmt: skip
