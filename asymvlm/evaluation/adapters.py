"""The trained adapters an evaluation takes, ``"<method>/seed<k>"`` -> method (its
``adapter_input`` set from its checkpoint): checkpoint folders or a sweep's seed runs."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import torch

from asymvlm.checkpoints import is_model_uri, load_checkpoint, resolve_checkpoint
from asymvlm.errors import CheckpointError
from asymvlm.methods import Method

logger = logging.getLogger(__name__)


def _named(method: Method, meta: dict[str, Any]) -> tuple[str, Method]:
    method.adapter_input = meta.get("adapter_input", "raw")
    return f"{meta['method']}/seed{meta.get('train_config', {}).get('seed', 0)}", method


def checkpoint_adapters(
    folders: Iterable[str],
    device: str | torch.device = "cpu",
    *,
    allow_incomplete: bool = False,
    tracking_uri: str | None = None,
) -> dict[str, Method]:
    """The adapters of checkpoint folders or MLflow model URIs, by ``method/seed<k>``."""
    local = (resolve_checkpoint(f, tracking_uri) if is_model_uri(f) else f for f in folders)
    return dict(
        _named(*load_checkpoint(f, device, allow_incomplete=allow_incomplete)) for f in local
    )


def sweep_adapters(tracking_uri: str, sweep_run_id: str) -> dict[str, Method]:
    """The seed-stage adapters of the sweep run ``sweep_run_id`` (its trials' ``adapter``
    models); a run without one is left out with a warning."""
    from asymvlm.tracking import child_runs

    out: dict[str, Method] = {}
    children = child_runs(tracking_uri, sweep_run_id, stage="seeds")
    for child in sorted(children, key=lambda c: (c.data.params["method"], c.data.params["seed"])):
        run_id, params = child.info.run_id, child.data.params
        try:
            folder = resolve_checkpoint(f"runs:/{run_id}/adapter", tracking_uri)
        except CheckpointError:
            logger.warning(
                "trial run %s (%s, seed %s) has no adapter model: left out of the evaluations",
                *(run_id, params["method"], params["seed"]),
            )
            continue
        name, method = _named(*load_checkpoint(folder))
        out[name] = method
    return out
