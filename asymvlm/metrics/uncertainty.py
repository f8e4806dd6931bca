"""Uncertainty metrics of retrieval: Recall@1 per uncertainty bin with its Spearman S and R^2
(paper App. B), and beside them failure prediction (AUROC, AUPR, FPR@95TPR), selective risk
(AURC, E-AURC, risk-coverage) and calibration (ECE) of each query's top-1 error."""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import torch
from scipy import stats
from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve


def _array(x: Any) -> np.ndarray:
    """A tensor, array or sequence as a 1-D float64 array."""
    return torch.as_tensor(x, dtype=torch.float64).detach().cpu().numpy().reshape(-1)


#: Values closer than this share of the largest magnitude count as one uncertainty level.
LEVEL_RTOL = 1e-6


def distinct_levels(uncertainty: Any) -> int:
    """How many distinct values ``uncertainty`` takes, values within :data:`LEVEL_RTOL` of its
    largest magnitude counted as one (float noise on a constant is one level)."""
    u = _array(uncertainty)
    u = u[np.isfinite(u)]
    if u.size == 0:
        return 0
    return int(np.unique(np.round(u / (np.abs(u).max() or 1.0) / LEVEL_RTOL)).size)


def binned_recall(hits: Any, uncertainty: Any, n_bins: int = 10) -> list[float]:
    """Mean of ``hits`` per uncertainty bin (App. B): items stable-sorted by ascending
    uncertainty into ``n_bins`` bins of ``n // n_bins``, the most uncertain remainder dropped
    as in the authors' code."""
    h, u = _array(hits), _array(uncertainty)
    size = len(h) // n_bins
    if size < 1:
        raise ValueError(f"cannot split {len(h)} items into {n_bins} bins")
    return h[np.argsort(u, kind="stable")[: size * n_bins]].reshape(n_bins, size).mean(1).tolist()


def curve_statistics(binned: Any) -> tuple[float | None, float | None]:
    """Spearman S and R^2 of a binned Recall@1 curve against bin index (App. B); None where
    undefined (under two bins, constant or non-finite)."""
    y = np.asarray(binned, dtype=np.float64)
    if len(y) < 2 or not np.isfinite(y).all() or (y == y[0]).all():
        return None, None
    x = np.arange(len(y), dtype=np.float64)
    return float(stats.spearmanr(x, y).statistic), float(stats.linregress(x, y).rvalue) ** 2


def spearman_uncertainty(uncertainty: Any, reference: Any) -> float | None:
    """Spearman correlation of two 1-D arrays, e.g. uncertainty vs abstraction level (Sec. 5);
    None (undefined) when one is constant."""
    u, r = _array(uncertainty), _array(reference)
    if len(u) != len(r):
        raise ValueError(f"lengths differ: {len(u)} vs {len(r)}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rho = float(stats.spearmanr(u, r).statistic)
    return None if math.isnan(rho) else rho


def _detection(uncertainty: Any, error: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """(uncertainty, error as bools); None when every query errs or none does."""
    u, e = _array(uncertainty), _array(error).astype(bool)
    return None if e.all() or not e.any() else (u, e)


def error_auroc(uncertainty: Any, error: Any) -> float | None:
    """AUROC of ``uncertainty`` as a detector of top-1 ``error`` (ties count half)."""
    got = _detection(uncertainty, error)
    return None if got is None else float(roc_auc_score(got[1], got[0]))


def error_aupr(uncertainty: Any, error: Any) -> float | None:
    """AUPR (average precision) of ``uncertainty`` as a detector of ``error``."""
    got = _detection(uncertainty, error)
    return None if got is None else float(average_precision_score(got[1], got[0]))


def fpr_at_tpr(uncertainty: Any, error: Any, tpr: float = 0.95) -> float | None:
    """FPR at the first ROC point whose TPR reaches ``tpr`` (FPR@95TPR; lower is better)."""
    got = _detection(uncertainty, error)
    if got is None:
        return None
    fpr, tprs, _ = roc_curve(got[1], got[0], drop_intermediate=False)
    return float(fpr[np.searchsorted(tprs, tpr, side="left")])


def _selective_risk(uncertainty: Any, error: Any) -> tuple[np.ndarray, np.ndarray]:
    """Error rate among the k least uncertain queries for k = 1..n (ties: the order given)."""
    u, e = _array(uncertainty), _array(error)
    return np.cumsum(e[np.argsort(u, kind="stable")]) / np.arange(1, u.size + 1), e


def aurc(uncertainty: Any, error: Any) -> tuple[float, float]:
    """(AURC, E-AURC): the mean selective risk over coverages 1/n..1 (Geifman & El-Yaniv,
    2017) and its excess over the best order of the same errors."""
    risk, e = _selective_risk(uncertainty, error)
    best = np.cumsum(np.sort(e)) / np.arange(1, e.size + 1)
    return float(risk.mean()), float(risk.mean()) - float(best.mean())


def risk_coverage(uncertainty: Any, error: Any, n_points: int = 20) -> dict[str, list[float]]:
    """``{"coverage", "risk"}`` at coverage ``i / n_points``: the error rate of the
    ``ceil(c * n)`` least uncertain queries."""
    risk, e = _selective_risk(uncertainty, error)
    steps = np.arange(1, n_points + 1)
    kept = np.maximum(1, (steps * e.size + n_points - 1) // n_points)
    return {"coverage": (steps / n_points).tolist(), "risk": risk[kept - 1].tolist()}


def expected_calibration_error(confidence: Any, correct: Any, n_bins: int = 15) -> float:
    """ECE = sum_b |B_b| / n |acc(B_b) - conf(B_b)| over right-closed equal-width confidence
    bins (Guo et al., 2017, Eq. 3)."""
    conf, hit = _array(confidence), _array(correct)
    bins = np.searchsorted(np.linspace(0.0, 1.0, n_bins + 1)[1:-1], conf, side="left")
    gap = np.abs(np.bincount(bins, hit, n_bins) - np.bincount(bins, conf, n_bins))
    return float(gap.sum() / conf.size)
