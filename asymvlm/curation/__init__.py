"""κ for every caption of an image-text pool, and selections by it (docs/curate.md): the pools'
formats (:mod:`.pools`), one shard's scores (:mod:`.shard_scores`), the rules (:mod:`.selection`)
and the job (:mod:`.job`).

Importing this package imports no torch; :func:`curate` and :func:`plan_job` load it on first
use."""

from __future__ import annotations

import importlib
from typing import Any

from asymvlm.curation.curate_config import CurateConfig, SelectionRule, parse_rule

_LAZY = {"CurationSummary": "job", "curate": "job", "plan_job": "job"}
__all__ = ["CurateConfig", "SelectionRule", "parse_rule", *_LAZY]


def __getattr__(name: str) -> Any:
    """:data:`_LAZY`'s names, imported on first use."""
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
