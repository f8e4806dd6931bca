"""The paper's evaluations: named in :mod:`~asymvlm.evaluation.specs` (no torch: what the
command line builds its flags from), computed by :mod:`~asymvlm.evaluation.registry` on tables
(:mod:`~asymvlm.evaluation.suite`), for the adapters of :mod:`~asymvlm.evaluation.adapters`."""

from typing import Any

__all__ = ["caption_scores", "encode_split", "evaluate_retrieval"]


def __getattr__(name: str) -> Any:
    """The retrieval evaluation's functions (:mod:`.retrieval`), imported on first use."""
    if name in __all__:
        from asymvlm.evaluation import retrieval

        return getattr(retrieval, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
