"""Selective retrieval and calibration (beyond the paper; the numbers the field reports).

With the top-1 error of each query as the event and the query's uncertainty as the predictor:

* :func:`error_auroc`: AUROC of the uncertainty as a predictor of an error (0.5: it says nothing
  about errors, 1: every error is more uncertain than every hit);
* :func:`error_aupr`: AUPR, the average precision of the uncertainty as a detector of errors
  (errors are the positives; chance is the error rate, 1 is perfect);
* :func:`fpr_at_tpr`: FPR at 95 % TPR, the share of correct queries flagged when the threshold
  on the uncertainty flags 95 % of the errors (lower is better) -- with AUROC and AUPR the
  numbers failure predictors report (e.g. ViLU, ICCV 2025);
* :func:`aurc`: the area under the risk-coverage curve (Geifman & El-Yaniv, 2017; lower is
  better) and E-AURC, its excess over the best order of the same errors;
* :func:`risk_coverage`: points of that curve, for figures.

:func:`expected_calibration_error` is the ECE of a predictive distribution's top-1 confidence
(Naeini et al., 2015; Guo et al., 2017, Eq. 3): equal-width confidence bins, the gap between
accuracy and mean confidence weighted by the share of queries in each bin.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from asymvlm.metrics.uncertainty import to_numpy_1d

__all__ = [
    "aurc",
    "error_aupr",
    "error_auroc",
    "expected_calibration_error",
    "fpr_at_tpr",
    "risk_coverage",
]


def _errors_and_hits(uncertainty, error) -> tuple[np.ndarray, np.ndarray, int, int] | None:
    """``(uncertainty, error as bools, number of errors, number of hits)`` as arrays of the same
    length; None when every query errs or none does (nothing to detect)."""
    u = to_numpy_1d(uncertainty, "uncertainty")
    e = to_numpy_1d(error, "error").astype(bool)
    if u.shape != e.shape:
        raise ValueError(f"lengths differ: {u.shape[0]} vs {e.shape[0]}")
    n_err, n_ok = int(e.sum()), int((~e).sum())
    if n_err == 0 or n_ok == 0:
        return None
    return u, e, n_err, n_ok


def error_auroc(uncertainty, error) -> float | None:
    """AUROC of ``uncertainty`` as a predictor of ``error`` (a bool per query): the probability
    that an erring query is more uncertain than a correct one, ties counting half
    (Mann-Whitney U). None when every query errs or none does."""
    checked = _errors_and_hits(uncertainty, error)
    if checked is None:
        return None
    u, e, n_err, n_ok = checked
    ranks = stats.rankdata(u)  # average ranks: ties count half
    return float((ranks[e].sum() - n_err * (n_err + 1) / 2) / (n_err * n_ok))


def _detection_curve(uncertainty, error) -> tuple[np.ndarray, np.ndarray, int, int] | None:
    """(true positives, false positives) at every distinct threshold on ``uncertainty``, from
    the highest down (a query is flagged when its uncertainty is at least the threshold; tied
    queries are flagged together), with the numbers of errors and of hits; None when every
    query errs or none does."""
    checked = _errors_and_hits(uncertainty, error)
    if checked is None:
        return None
    u, e, n_err, n_ok = checked
    order = np.argsort(-u, kind="stable")
    ranked = u[order]
    last = np.r_[np.flatnonzero(ranked[1:] != ranked[:-1]), u.size - 1]  # end of each tie run
    tp = np.cumsum(e[order])[last]
    return tp, last + 1 - tp, n_err, n_ok


def error_aupr(uncertainty, error) -> float | None:
    """AUPR of ``uncertainty`` as a detector of ``error`` (errors are the positives): the
    average precision sum_k (R_k - R_{k-1}) P_k over the distinct thresholds from the highest
    uncertainty down (scikit-learn's ``average_precision_score``; tied queries are flagged
    together). Chance level is the error rate, 1 a perfect detector. None when every query
    errs or none does."""
    curve = _detection_curve(uncertainty, error)
    if curve is None:
        return None
    tp, fp, n_err, _ = curve
    recall = tp / n_err
    precision = tp / (tp + fp)
    return float(np.sum(np.diff(recall, prepend=0.0) * precision))


def fpr_at_tpr(uncertainty, error, tpr: float = 0.95) -> float | None:
    """FPR at ``tpr`` TPR: flagging the queries whose ``uncertainty`` reaches a threshold,
    the share of correct queries flagged at the highest threshold that flags at least ``tpr``
    of the errors (the first point of the ROC curve with TPR >= ``tpr``; tied queries are
    flagged together). 0 is a perfect detector, ``tpr`` a blind one on average. None when every
    query errs or none does."""
    if not 0 < tpr <= 1:
        raise ValueError(f"tpr must lie in (0, 1], got {tpr}")
    curve = _detection_curve(uncertainty, error)
    if curve is None:
        return None
    tp, fp, n_err, n_ok = curve
    first = int(np.argmax(tp / n_err >= tpr))  # the last point has TPR 1
    return float(fp[first] / n_ok)


def _selective_risk(uncertainty, error) -> tuple[np.ndarray, np.ndarray]:
    """(risk at coverage k/n for k = 1..n, the errors as float64): the error rate among the k
    least uncertain queries (ties: the order given)."""
    u = to_numpy_1d(uncertainty, "uncertainty")
    e = to_numpy_1d(error, "error")
    if u.shape != e.shape or u.size == 0:
        raise ValueError(f"need equal, non-zero lengths, got {u.shape[0]} and {e.shape[0]}")
    kept = np.arange(1, u.size + 1)
    return np.cumsum(e[np.argsort(u, kind="stable")]) / kept, e


def aurc(uncertainty, error) -> tuple[float, float]:
    """(AURC, E-AURC): the mean selective risk over coverages 1/n..n/n when queries are kept in
    order of increasing ``uncertainty`` (ties: the order given), and its excess over the best
    possible order of the same errors (every error last)."""
    risk, e = _selective_risk(uncertainty, error)
    best = np.cumsum(np.sort(e)) / np.arange(1, e.size + 1)
    value = float(risk.mean())
    return value, value - float(best.mean())


def risk_coverage(uncertainty, error, n_points: int = 20) -> dict[str, list[float]]:
    """Points of the risk-coverage curve whose mean over all coverages is :func:`aurc`.

    At coverage ``c = i / n_points`` (``i = 1..n_points``) the ``k = ceil(c * n)`` least
    uncertain queries are kept (ties: the order given) and the risk is their error rate.

    Returns:
        ``{"coverage": [c_1, ..., 1.0], "risk": [r_1, ..., overall error rate]}``.
    """
    if n_points < 1:
        raise ValueError(f"n_points must be >= 1, got {n_points}")
    risk, e = _selective_risk(uncertainty, error)
    n = e.size
    steps = np.arange(1, n_points + 1)
    kept = np.maximum(1, (steps * n + n_points - 1) // n_points)  # ceil(i * n / n_points)
    return {
        "coverage": [float(i / n_points) for i in steps],
        "risk": [float(r) for r in risk[kept - 1]],
    }


def expected_calibration_error(confidence, correct, n_bins: int = 15) -> float | None:
    """ECE = sum_b |B_b| / n * |acc(B_b) - conf(B_b)| (Guo et al., 2017, Eq. 3).

    ``B_b`` holds the queries whose ``confidence`` (the top-1 probability, in ``[0, 1]``) lies in
    ``((b - 1) / n_bins, b / n_bins]`` (a confidence of 0 falls in the first bin); ``acc`` is the
    share of ``correct`` (top-1 hits) and ``conf`` the mean confidence within the bin.
    None for no queries.
    """
    conf = to_numpy_1d(confidence, "confidence")
    hit = to_numpy_1d(correct, "correct")
    if conf.shape != hit.shape:
        raise ValueError(f"lengths differ: {conf.shape[0]} vs {hit.shape[0]}")
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    if conf.size == 0:
        return None
    if not np.all((conf >= 0) & (conf <= 1)):
        raise ValueError("confidence must lie in [0, 1]")
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    bins = np.searchsorted(edges[1:-1], conf, side="left")  # right-closed bins
    count = np.bincount(bins, minlength=n_bins)
    gap = np.abs(np.bincount(bins, hit, n_bins) - np.bincount(bins, conf, n_bins))
    # sum_b |B_b|/n * |acc_b - conf_b| = sum_b |sum_{B_b} hit - sum_{B_b} conf| / n
    return float(gap[count > 0].sum() / conf.size)
