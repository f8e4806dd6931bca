"""Cross-modal retrieval metrics (paper App. B) from one memory-bounded pass over caption
chunks: Recall@K both ways, the uncertainty-binned Recall@1 (S, R²), failure prediction,
selective risk, ECE, RSUM and fold averages (COCO 1K). Ties, non-finite scores and the memory
bound: docs/metrics.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from asymvlm.metrics.selective import (
    aurc,
    error_aupr,
    error_auroc,
    expected_calibration_error,
    fpr_at_tpr,
    risk_coverage,
)
from asymvlm.metrics.uncertainty import binned_recall, curve_statistics

__all__ = [
    "DEFAULT_MEMORY_BUDGET",
    "DIRECTIONS",
    "ECE_BINS",
    "RSUM_KS",
    "Ranking",
    "SCORE_WORK_BYTES",
    "ScoreFn",
    "average_folds",
    "chunk_rows",
    "fold_key",
    "image_folds",
    "rank_pass",
    "ranking_metrics",
    "retrieval_metrics",
    "rsum",
]

#: Working memory of one caption chunk, by default (bytes).
DEFAULT_MEMORY_BUDGET = 512 * 2**20
#: Bytes per score of a chunk at its peak: the float32 block, its float64 copy, the float64
#: softmax temporary and the allocator's slack (``benchmarks/eval_scale.py``).
SCORE_WORK_BYTES = 40

ScoreFn = Callable[[int, int], torch.Tensor]
"""``score_fn(start, stop) -> [stop - start, n_image]`` scores of captions ``start..stop-1``
against all images; higher means a better match."""

DIRECTIONS = ("t2i", "i2t")
ECE_BINS = 15  # Guo et al. (2017)
RSUM_KS = (1, 5, 10)
COVERAGE_POINTS = 20  # risk-coverage points at coverage 0.05, 0.10, ..., 1.0
FPR_AT_TPR = 0.95  # the TPR of the reported FPR (FPR@95TPR)


@dataclass
class Ranking:
    """What one pass over the caption chunks keeps (all on the CPU).

    ``miss`` is the rank recorded for a query without a hit among its ``depth`` best items (or
    with a non-finite paired score); every K of Recall@K must be ``<= depth``.
    """

    depth: int
    t2i_rank: torch.Tensor  # [n_text] rank of the paired image, 0-based (``depth``: miss)
    t2i_top: torch.Tensor  # [n_text, top_t2i] the best images per caption, best first
    t2i_confidence: torch.Tensor  # [n_text] max of softmax(scale * scores) over the images
    i2t_rank: torch.Tensor  # [n_image] rank of the first paired caption (``depth``: none)
    i2t_top: torch.Tensor  # [n_image, min(depth, n_text)] the best captions, best first
    i2t_confidence: torch.Tensor  # [n_image] max of softmax(scale * scores) over the captions
    has_caption: torch.Tensor  # [n_image] bool; images without captions are left out of i2t


def chunk_rows(
    n_columns: int, memory_budget: int | None = None, bytes_per_entry: int = SCORE_WORK_BYTES
) -> int:
    """Captions per chunk so that ``rows * n_columns * bytes_per_entry <= memory_budget``
    (:data:`DEFAULT_MEMORY_BUDGET` when None); at least 1."""
    budget = DEFAULT_MEMORY_BUDGET if memory_budget is None else int(memory_budget)
    if budget < 1:
        raise ValueError(f"memory_budget must be a positive number of bytes, got {budget}")
    return max(1, budget // (bytes_per_entry * max(1, n_columns)))


def _top_k(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, rows) of the ``k`` best entries of every column, best first, ties to the lower
    row: the head of a stable descending sort, at the cost of ``torch.topk(k + 1)``."""
    k = min(k, values.shape[0])
    top = torch.topk(values, min(k + 1, values.shape[0]), dim=0)
    rows = top.indices[:k]
    if k < values.shape[0]:  # columns where the cut splits a tie: every entry above the k-th
        kth = top.values[k - 1]  # value and, of those equal to it, the lowest rows
        cols = (kth == top.values[k]).nonzero()[:, 0]
        part, kth = values[:, cols], kth[cols]
        above, level = part > kth, part == kth
        need = k - above.sum(dim=0, dtype=torch.int32)
        chosen = above | (level & (level.cumsum(dim=0, dtype=torch.int32) <= need))
        rows[:, cols] = chosen.T.nonzero()[:, 1].view(-1, k).T
    rows = rows.sort(dim=0).values
    vals = values.gather(0, rows)
    order = torch.sort(vals, dim=0, descending=True, stable=True).indices
    return vals.gather(0, order), rows.gather(0, order)


def _lse_confidence(top: torch.Tensor, lse: torch.Tensor, n: int) -> torch.Tensor:
    """max softmax = exp(top - logsumexp); uniform ``1 / n`` where no score is finite."""
    conf = torch.exp(top - lse)
    return torch.where(torch.isfinite(lse), conf, torch.full_like(conf, 1.0 / n))


@torch.no_grad()
def rank_pass(
    score_fn: ScoreFn,
    n_text: int,
    n_image: int,
    text_to_image: torch.Tensor,
    *,
    depth: int = 10,
    top_t2i: int = 1,
    scale: float = 100.0,
    chunk_size: int | None = None,
    memory_budget: int | None = None,
    progress: bool = False,
) -> Ranking:
    """One pass over chunks of at most ``chunk_size`` captions (None: as many as fit
    ``memory_budget``, :func:`chunk_rows`): the rank of each query's first hit (ties: the lower
    index first; a non-finite score ranks below every finite one), its best ``depth`` captions
    per image / ``top_t2i`` images per caption, and the top-1 probability of
    ``softmax(scale * scores)`` over the gallery (the i2t normaliser accumulated over chunks).
    """
    chunk_size = chunk_size or chunk_rows(n_image, memory_budget)
    text_to_image = torch.as_tensor(text_to_image).long().reshape(-1).cpu()
    k_i2t, k_t2i = min(depth, n_text), min(top_t2i, n_image)
    t2i_rank = torch.empty(n_text, dtype=torch.long)
    t2i_top = torch.empty(n_text, k_t2i, dtype=torch.long)
    t2i_conf = torch.empty(n_text, dtype=torch.float64)
    run_vals = run_idx = run_lse = None  # best captions per image so far, the i2t normaliser
    starts = range(0, n_text, chunk_size)
    for start in tqdm(starts, desc="retrieval", disable=not progress, leave=False):
        stop = min(start + chunk_size, n_text)
        scores = score_fn(start, stop).detach()
        if tuple(scores.shape) != (stop - start, n_image):
            raise ValueError(
                f"score_fn({start}, {stop}) returned shape {tuple(scores.shape)}, "
                f"expected {(stop - start, n_image)}"
            )
        scores = scores if scores.is_floating_point() else scores.float()
        scores = torch.where(torch.isfinite(scores), scores, -math.inf)
        target = text_to_image[start:stop].to(scores.device)[:, None]
        paired = scores.gather(1, target)
        lower = torch.arange(n_image, device=scores.device) < target
        rank = (scores > paired).sum(1) + ((scores == paired) & lower).sum(1)
        t2i_rank[start:stop] = torch.where(paired[:, 0] == -math.inf, depth, rank).cpu()
        best = scores.argmax(dim=1, keepdim=True)  # the first maximum: the lowest index
        t2i_top[start:stop] = (best if k_t2i == 1 else _top_k(scores.T, k_t2i)[1].T).cpu()

        logits = scores.double() * scale
        top = logits.gather(1, best)[:, 0]
        t2i_conf[start:stop] = _lse_confidence(top, torch.logsumexp(logits, 1), n_image).cpu()
        col_lse = torch.logsumexp(logits, dim=0)
        run_lse = col_lse if run_lse is None else torch.logaddexp(run_lse, col_lse)
        del logits

        vals, idx = _top_k(scores, k_i2t)
        if run_vals is not None:  # earlier chunks first: ties keep the lower caption index
            vals, idx = torch.cat([run_vals, vals]), torch.cat([run_idx, idx + start])
            order = torch.sort(vals, dim=0, descending=True, stable=True).indices[:k_i2t]
            run_vals, run_idx = vals.gather(0, order), idx.gather(0, order)
        else:
            run_vals, run_idx = vals, idx

    top_captions, top_scores = run_idx.cpu(), run_vals.cpu()  # [k_i2t, n_image]
    is_pair = (text_to_image[top_captions] == torch.arange(n_image)) & (top_scores != -math.inf)
    pos = torch.arange(top_captions.shape[0])[:, None].expand_as(is_pair)
    return Ranking(
        depth=depth,
        t2i_rank=t2i_rank,
        t2i_top=t2i_top,
        t2i_confidence=t2i_conf,
        i2t_rank=torch.where(is_pair, pos, depth).min(dim=0).values,
        i2t_top=top_captions.T.contiguous(),
        i2t_confidence=_lse_confidence(top_scores[0].double() * scale, run_lse.cpu(), n_text),
        has_caption=torch.bincount(text_to_image, minlength=n_image) > 0,
    )


def _direction_result(
    hit_rank: torch.Tensor,
    confidence: torch.Tensor,
    ks: Sequence[int],
    uncertainty: torch.Tensor | None,
    source: str | None,
    n_bins: int,
) -> dict:
    """One direction's numbers from the rank of each query's first hit (``>= max(ks)``: none);
    the binned curve of a constant uncertainty (no order to bin by) is undefined."""
    out: dict = {f"recall@{k}": float((hit_rank < k).double().mean()) for k in ks}
    hit = hit_rank == 0
    out["ece"] = expected_calibration_error(confidence, hit, ECE_BINS)
    keys = ("binned_recall@1", "spearman", "r2", "auroc", "aupr", "fpr@95tpr", "aurc", "e_aurc")
    out |= dict.fromkeys(keys) | {"risk_coverage": None, "uncertainty_source": None}
    if uncertainty is None:
        return out
    if not bool((uncertainty == uncertainty[0]).all()):
        out["binned_recall@1"] = binned_recall(hit, uncertainty, n_bins)
        out["spearman"], out["r2"] = curve_statistics(out["binned_recall@1"])
    error = ~hit
    out["auroc"] = error_auroc(uncertainty, error)
    out["aupr"] = error_aupr(uncertainty, error)
    out["fpr@95tpr"] = fpr_at_tpr(uncertainty, error, FPR_AT_TPR)
    out["aurc"], out["e_aurc"] = aurc(uncertainty, error.double())
    out["risk_coverage"] = risk_coverage(uncertainty, error.double(), COVERAGE_POINTS)
    out["uncertainty_source"] = source
    return out


def ranking_metrics(
    ranking: Ranking,
    ks: Sequence[int] = (1, 5, 10),
    text_uncertainty: torch.Tensor | None = None,
    image_uncertainty: torch.Tensor | None = None,
    n_bins: int = 10,
) -> dict[str, Any]:
    """Recall@K, uncertainty-binned Recall@1 (App. B), failure prediction, selective risk and
    ECE of both directions: ``{"t2i": {...}, "i2t": {...}, "rsum": float | None}``, each with
    ``recall@K``, ``ece``, ``binned_recall@1``, ``spearman``, ``r2``, ``auroc``, ``aupr``,
    ``fpr@95tpr``, ``aurc``, ``e_aurc``, ``risk_coverage`` and ``uncertainty_source`` (None
    without an uncertainty). The binning uncertainty is the caption's own (t2i) and that of an
    image's top-1 caption (i2t, the authors' protocol), else the image's (i2t) and that of a
    caption's top-1 image (t2i). Images without captions are left out of i2t."""
    has_caption = ranking.has_caption
    if text_uncertainty is not None:
        text_uncertainty = torch.as_tensor(text_uncertainty).detach().reshape(-1).cpu()
        t2i_unc, t2i_src = text_uncertainty, "text"
        i2t_unc = text_uncertainty[ranking.i2t_top[:, 0]][has_caption]
        i2t_src = "retrieved_text"
    elif image_uncertainty is not None:
        image_uncertainty = torch.as_tensor(image_uncertainty).detach().reshape(-1).cpu()
        t2i_unc, t2i_src = image_uncertainty[ranking.t2i_top[:, 0]], "retrieved_image"
        i2t_unc, i2t_src = image_uncertainty[has_caption], "image"
    else:
        t2i_unc = t2i_src = i2t_unc = i2t_src = None

    out: dict[str, Any] = {
        "t2i": _direction_result(
            ranking.t2i_rank, ranking.t2i_confidence, ks, t2i_unc, t2i_src, n_bins
        ),
        "i2t": _direction_result(
            ranking.i2t_rank[has_caption],
            ranking.i2t_confidence[has_caption],
            ks,
            i2t_unc,
            i2t_src,
            n_bins,
        ),
    }
    out["rsum"] = rsum(out)
    return out


@torch.no_grad()
def retrieval_metrics(
    score_fn: ScoreFn,
    n_text: int,
    n_image: int,
    text_to_image: torch.Tensor,
    text_uncertainty: torch.Tensor | None = None,
    image_uncertainty: torch.Tensor | None = None,
    ks: Sequence[int] = (1, 5, 10),
    n_bins: int = 10,
    chunk_size: int | None = None,
    progress: bool = False,
    scale: float = 100.0,
    memory_budget: int | None = None,
) -> dict[str, Any]:
    """:func:`ranking_metrics` of the :func:`rank_pass` over ``score_fn(start, stop)`` (the
    ``[stop - start, n_image]`` scores of captions ``start..stop-1``, higher = better)."""
    ranking = rank_pass(
        score_fn,
        n_text,
        n_image,
        text_to_image,
        depth=max(ks),
        scale=scale,
        chunk_size=chunk_size,
        memory_budget=memory_budget,
        progress=progress,
    )
    return ranking_metrics(ranking, ks, text_uncertainty, image_uncertainty, n_bins)


def rsum(result: Mapping[str, Any]) -> float | None:
    """RSUM: R@1 + R@5 + R@10 of t2i and i2t in percent (0-600), the field's one-number summary
    of retrieval; None when a direction lacks one of these recalls."""
    values = [result.get(d, {}).get(f"recall@{k}") for d in DIRECTIONS for k in RSUM_KS]
    if any(v is None for v in values):
        return None
    return float(100.0 * sum(values))


def image_folds(n_image: int, fold_size: int) -> list[np.ndarray]:
    """Image rows of the folds: ``n_image // fold_size`` runs of ``fold_size`` consecutive
    images (COCO 1K: five folds of 1000 of the 5K test images); :class:`ValueError` unless
    ``fold_size`` divides ``n_image``."""
    if fold_size < 1 or n_image % fold_size:
        raise ValueError(f"{n_image} images do not split into folds of {fold_size}")
    return [np.arange(s, s + fold_size) for s in range(0, n_image, fold_size)]


def fold_key(fold_size: int) -> str:
    """The result key of fold-averaged metrics: ``coco_1k`` for folds of 1000, else
    ``folds_<size>``."""
    return "coco_1k" if fold_size == 1000 else f"folds_{fold_size}"


_NOT_AVERAGED = frozenset({"binned_recall@1", "risk_coverage", "uncertainty_source"})


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def average_folds(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The mean over folds of every number in each direction (``None`` when a fold has none),
    and the RSUM of the mean recalls; curves, lists and names are left out.

    Returns:
        ``{"t2i": {...}, "i2t": {...}, "rsum": float | None, "n_folds": int}``.
    """
    if not results:
        raise ValueError("no folds to average")
    out: dict[str, Any] = {}
    for direction in DIRECTIONS:
        means: dict[str, float | None] = {}
        for key in results[0][direction]:
            if key in _NOT_AVERAGED:
                continue
            values = [r[direction].get(key) for r in results]
            numbers = [float(v) for v in values if _is_number(v)]
            means[key] = float(np.mean(numbers)) if len(numbers) == len(values) else None
        out[direction] = means
    out["rsum"] = rsum(out)
    out["n_folds"] = len(results)
    return out
