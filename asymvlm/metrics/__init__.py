"""Retrieval and uncertainty metrics of the paper (Ju et al., NeurIPS 2025, App. B) and the
numbers the field reports beside them (docs/metrics.md)."""

from asymvlm.metrics.recall import (
    DEFAULT_MEMORY_BUDGET,
    SCORE_WORK_BYTES,
    average_folds,
    chunk_rows,
    rank_pass,
    ranking_metrics,
    retrieval_metrics,
    rsum,
)
from asymvlm.metrics.uncertainty import (
    binned_recall,
    curve_statistics,
    distinct_levels,
    spearman_uncertainty,
)

__all__ = [
    "DEFAULT_MEMORY_BUDGET",
    "SCORE_WORK_BYTES",
    "average_folds",
    "binned_recall",
    "chunk_rows",
    "curve_statistics",
    "distinct_levels",
    "rank_pass",
    "ranking_metrics",
    "retrieval_metrics",
    "rsum",
    "spearman_uncertainty",
]
