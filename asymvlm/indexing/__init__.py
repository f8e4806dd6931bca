"""A kappa-aware search over a split's images and captions (docs/search.md): FAISS indexes
ranked by the method's own score, and a decision per query from its kappa.

Importing this package imports no torch or FAISS; :class:`Index` and :func:`build_index` load
them on first use."""

from __future__ import annotations

import importlib
from typing import Any

from asymvlm.indexing.settings import IndexSettings

_LAZY = {
    "Index": "index_folder",
    "build_index": "build",
    "Hit": "records",
    "IndexManifest": "records",
    "SearchResult": "records",
}
__all__ = ["IndexSettings", *_LAZY]


def __getattr__(name: str) -> Any:
    """:data:`_LAZY`'s names, imported on first use."""
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
