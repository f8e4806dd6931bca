"""Retrieval and uncertainty metrics of the paper (Ju et al., NeurIPS 2025, App. B) and the
numbers the field reports beside them.

* :mod:`~asymvlm.metrics.retrieval`: Recall@K both ways from one memory-bounded pass over
  caption chunks, RSUM and the COCO 1K fold average;
* :mod:`~asymvlm.metrics.uncertainty`: Recall@1 per uncertainty bin, Spearman S and R^2;
* :mod:`~asymvlm.metrics.selective`: AUROC, AUPR and FPR@95TPR of uncertainty as a detector of
  top-1 errors, AURC / E-AURC,
  risk-coverage points and the ECE of the predictive softmax;
* :mod:`~asymvlm.metrics.blocks`: the chunk size from a memory budget and the exact top-k
  that keep the ranking pass linear in the scores;
* :mod:`~asymvlm.metrics.eccv`: ECCV Caption mAP@R, R-Precision, R@1 and CxC R@1 on the COCO
  Karpathy 5k test split (the ``eccv_caption`` package's ground truth).
"""

from asymvlm.metrics.blocks import DEFAULT_MEMORY_BUDGET, SCORE_WORK_BYTES, chunk_rows
from asymvlm.metrics.retrieval import (
    DIRECTIONS,
    Ranking,
    ScoreFn,
    average_folds,
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
