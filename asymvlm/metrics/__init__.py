"""Retrieval and uncertainty metrics of the paper (Ju et al., NeurIPS 2025, App. B) and the
numbers the field reports beside them (docs/metrics.md)."""

from asymvlm.metrics.retrieval import (
    DEFAULT_MEMORY_BUDGET,
    DIRECTIONS,
    SCORE_WORK_BYTES,
    Ranking,
    ScoreFn,
    average_folds,
    chunk_rows,
    fold_key,
    image_folds,
    rank_pass,
    ranking_metrics,
    retrieval_metrics,
    rsum,
)
from asymvlm.metrics.selective import (
    aurc,
    error_aupr,
    error_auroc,
    expected_calibration_error,
    fpr_at_tpr,
    risk_coverage,
)
from asymvlm.metrics.uncertainty import binned_recall, curve_statistics, spearman_uncertainty

__all__ = [
    "DEFAULT_MEMORY_BUDGET",
    "DIRECTIONS",
    "Ranking",
    "SCORE_WORK_BYTES",
    "ScoreFn",
    "aurc",
    "average_folds",
    "binned_recall",
    "chunk_rows",
    "curve_statistics",
    "error_aupr",
    "error_auroc",
    "expected_calibration_error",
    "fpr_at_tpr",
    "fold_key",
    "image_folds",
    "rank_pass",
    "ranking_metrics",
    "retrieval_metrics",
    "risk_coverage",
    "rsum",
    "spearman_uncertainty",
]
