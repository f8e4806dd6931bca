"""Failure prediction, selective retrieval and calibration (the numbers the field reports
beside the paper's): the top-1 error of each query is the event, its uncertainty the predictor.
"""

from __future__ import annotations

import numpy as np
from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve

from asymvlm.metrics.uncertainty import to_numpy_1d

__all__ = [
    "aurc",
    "error_aupr",
    "error_auroc",
    "expected_calibration_error",
    "fpr_at_tpr",
    "risk_coverage",
]


def _pair(a, b, names: tuple[str, str]) -> tuple[np.ndarray, np.ndarray]:
    x, y = to_numpy_1d(a, names[0]), to_numpy_1d(b, names[1])
    if x.shape != y.shape:
        raise ValueError(f"lengths differ: {x.shape[0]} vs {y.shape[0]}")
    return x, y


def _detection(uncertainty, error) -> tuple[np.ndarray, np.ndarray] | None:
    """(uncertainty, error as bools); None when every query errs or none does."""
    u, e = _pair(uncertainty, error, ("uncertainty", "error"))
    e = e.astype(bool)
    return None if e.all() or not e.any() else (u, e)


def error_auroc(uncertainty, error) -> float | None:
    """AUROC of ``uncertainty`` as a detector of top-1 ``error`` (ties count half)."""
    got = _detection(uncertainty, error)
    return None if got is None else float(roc_auc_score(got[1], got[0]))


def error_aupr(uncertainty, error) -> float | None:
    """AUPR (average precision) of ``uncertainty`` as a detector of ``error``; chance is the
    error rate."""
    got = _detection(uncertainty, error)
    return None if got is None else float(average_precision_score(got[1], got[0]))


def fpr_at_tpr(uncertainty, error, tpr: float = 0.95) -> float | None:
    """FPR at the first ROC point whose TPR reaches ``tpr`` (FPR@95TPR; lower is better)."""
    if not 0 < tpr <= 1:
        raise ValueError(f"tpr must lie in (0, 1], got {tpr}")
    got = _detection(uncertainty, error)
    if got is None:
        return None
    fpr, tprs, _ = roc_curve(got[1], got[0], drop_intermediate=False)
    return float(fpr[np.searchsorted(tprs, tpr, side="left")])


def _selective_risk(uncertainty, error) -> tuple[np.ndarray, np.ndarray]:
    """Error rate among the k least uncertain queries for k = 1..n (ties: the order given)."""
    u, e = _pair(uncertainty, error, ("uncertainty", "error"))
    if u.size == 0:
        raise ValueError("need at least one query")
    return np.cumsum(e[np.argsort(u, kind="stable")]) / np.arange(1, u.size + 1), e


def aurc(uncertainty, error) -> tuple[float, float]:
    """(AURC, E-AURC): the mean selective risk over coverages 1/n..1 (Geifman & El-Yaniv,
    2017) and its excess over the best order of the same errors."""
    risk, e = _selective_risk(uncertainty, error)
    best = np.cumsum(np.sort(e)) / np.arange(1, e.size + 1)
    return float(risk.mean()), float(risk.mean()) - float(best.mean())


def risk_coverage(uncertainty, error, n_points: int = 20) -> dict[str, list[float]]:
    """``{"coverage", "risk"}`` at coverage ``i / n_points``: the error rate of the
    ``ceil(c * n)`` least uncertain queries."""
    if n_points < 1:
        raise ValueError(f"n_points must be >= 1, got {n_points}")
    risk, e = _selective_risk(uncertainty, error)
    steps = np.arange(1, n_points + 1)
    kept = np.maximum(1, (steps * e.size + n_points - 1) // n_points)
    return {"coverage": (steps / n_points).tolist(), "risk": risk[kept - 1].tolist()}


def expected_calibration_error(confidence, correct, n_bins: int = 15) -> float | None:
    """ECE = sum_b |B_b| / n |acc(B_b) - conf(B_b)| over right-closed equal-width confidence
    bins (Guo et al., 2017, Eq. 3); None for no queries."""
    conf, hit = _pair(confidence, correct, ("confidence", "correct"))
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    if conf.size == 0:
        return None
    if not np.all((conf >= 0) & (conf <= 1)):
        raise ValueError("confidence must lie in [0, 1]")
    bins = np.searchsorted(np.linspace(0.0, 1.0, n_bins + 1)[1:-1], conf, side="left")
    gap = np.abs(np.bincount(bins, hit, n_bins) - np.bincount(bins, conf, n_bins))
    return float(gap.sum() / conf.size)
