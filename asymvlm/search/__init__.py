"""A kappa-aware search over a split's images and captions (docs/search.md): FAISS indexes
ranked by the method's own score, and a decision per query from its kappa."""

from __future__ import annotations

from asymvlm.search.build import build_index
from asymvlm.search.index import Index
from asymvlm.search.records import Hit, IndexManifest, SearchResult

__all__ = ["Hit", "Index", "IndexManifest", "SearchResult", "build_index"]
