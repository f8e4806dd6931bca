"""Uncertainty calibration of retrieval (paper App. B): Recall@1 per uncertainty bin and the
Spearman S / R^2 of that curve against bin index."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np
import torch
from scipy import stats

__all__ = ["binned_recall", "curve_statistics", "spearman_uncertainty"]


def to_numpy_1d(x: torch.Tensor | np.ndarray | Sequence[float], name: str) -> np.ndarray:
    """``x`` as a 1-D float64 array; :class:`ValueError` naming ``name`` otherwise."""
    if isinstance(x, torch.Tensor):
        arr = x.detach().to("cpu", torch.float64).numpy()
    else:
        arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(arr.shape)}")
    return arr


def binned_recall(hits: torch.Tensor, uncertainty: torch.Tensor, n_bins: int = 10) -> list[float]:
    """Mean of ``hits`` per uncertainty bin (paper App. B): items stable-sorted by ascending
    ``uncertainty`` into ``n_bins`` bins of ``n // n_bins``, the most uncertain remainder
    dropped as in the authors' code."""
    hits = torch.as_tensor(hits).detach().to("cpu", torch.float64)
    uncertainty = torch.as_tensor(uncertainty).detach().to("cpu", torch.float64)
    if hits.ndim != 1 or uncertainty.ndim != 1:
        raise ValueError("hits and uncertainty must be 1-D")
    if hits.shape[0] != uncertainty.shape[0]:
        raise ValueError(
            f"hits ({hits.shape[0]}) and uncertainty ({uncertainty.shape[0]}) differ in length"
        )
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    n = hits.shape[0]
    if n < n_bins:
        raise ValueError(f"cannot split {n} items into {n_bins} bins")
    order = torch.sort(uncertainty, stable=True).indices
    size = n // n_bins
    sorted_hits = hits[order[: size * n_bins]].view(n_bins, size)
    return [float(v) for v in sorted_hits.mean(dim=1)]


def curve_statistics(binned: Sequence[float]) -> tuple[float | None, float | None]:
    """Spearman S and R^2 (``linregress`` r²) of a binned Recall@1 curve against bin index
    (paper App. B); None where undefined (under two bins, constant or non-finite)."""
    y = np.asarray(list(binned), dtype=np.float64)
    if y.ndim != 1 or y.shape[0] < 2 or not np.all(np.isfinite(y)) or np.all(y == y[0]):
        return None, None
    x = np.arange(y.shape[0], dtype=np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rho = float(stats.spearmanr(x, y).statistic)
        r2 = float(stats.linregress(x, y).rvalue) ** 2
    return (rho if math.isfinite(rho) else None), (r2 if math.isfinite(r2) else None)


def spearman_uncertainty(
    uncertainty: torch.Tensor | np.ndarray | Sequence[float],
    reference: torch.Tensor | np.ndarray | Sequence[float],
) -> float:
    """Spearman correlation of two 1-D arrays, e.g. uncertainty vs abstraction level (paper
    Sec. 5); NaN when one is constant."""
    u = to_numpy_1d(uncertainty, "uncertainty")
    r = to_numpy_1d(reference, "reference")
    if u.shape[0] != r.shape[0]:
        raise ValueError(f"lengths differ: {u.shape[0]} vs {r.shape[0]}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(stats.spearmanr(u, r).statistic)
