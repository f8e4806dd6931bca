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

from asymvlm.metrics.blocks import all_finite, chunk_rows, top_k
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
    "DIRECTIONS",
    "ECE_BINS",
    "RSUM_KS",
    "Ranking",
    "ScoreFn",
    "average_folds",
    "fold_key",
    "image_folds",
    "rank_pass",
    "ranking_metrics",
    "retrieval_metrics",
    "rsum",
]

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
    ``memory_budget``, :func:`~asymvlm.metrics.blocks.chunk_rows`): the rank of each query's
    first hit, its best ``depth`` captions per image / ``top_t2i`` images per caption, and the
    top-1 probability of ``softmax(scale * scores)`` over the gallery (the i2t normaliser is
    accumulated across chunks). Work per chunk is linear in its scores.
    """
    if n_text < 1 or n_image < 1:
        raise ValueError(f"need n_text >= 1 and n_image >= 1, got {n_text}, {n_image}")
    if chunk_size is None:
        chunk_size = chunk_rows(n_image, memory_budget)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if depth < 1 or top_t2i < 1:
        raise ValueError(f"depth and top_t2i must be >= 1, got {depth}, {top_t2i}")
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive number, got {scale}")
    text_to_image = torch.as_tensor(text_to_image).long().reshape(-1).cpu()
    if text_to_image.shape[0] != n_text:
        raise ValueError(f"text_to_image has {text_to_image.shape[0]} entries, expected {n_text}")
    if int(text_to_image.min()) < 0 or int(text_to_image.max()) >= n_image:
        raise ValueError("text_to_image has indices outside [0, n_image)")

    k_i2t = min(depth, n_text)  # captions kept per image in the running top-k
    k_t2i = min(top_t2i, n_image)

    t2i_rank = torch.empty(n_text, dtype=torch.long)  # rank of the paired image, 0-based
    t2i_top = torch.empty(n_text, k_t2i, dtype=torch.long)
    t2i_conf = torch.empty(n_text, dtype=torch.float64)
    run_vals: torch.Tensor | None = None  # [<= k_i2t, n_image] best caption scores per image
    run_idx: torch.Tensor | None = None  # [<= k_i2t, n_image] their caption indices
    run_lse: torch.Tensor | None = None  # [n_image] logsumexp over captions of scale * score
    pairs_dev: torch.Tensor | None = None

    starts = range(0, n_text, chunk_size)
    for start in tqdm(starts, desc="retrieval", disable=not progress, leave=False):
        stop = min(start + chunk_size, n_text)
        scores = score_fn(start, stop)
        if tuple(scores.shape) != (stop - start, n_image):
            raise ValueError(
                f"score_fn({start}, {stop}) returned shape {tuple(scores.shape)}, "
                f"expected {(stop - start, n_image)}"
            )
        scores = scores.detach()
        if not scores.is_floating_point():
            scores = scores.float()
        device = scores.device
        if pairs_dev is None or pairs_dev.device != device:
            pairs_dev = text_to_image.to(device)
        target = pairs_dev[start:stop]
        # Non-finite scores become -inf: below every finite score, so they never outrank one
        # (a copy, never the caller's tensor; only made when the chunk has a non-finite entry).
        if not all_finite(scores):
            scores = scores.masked_fill(~torch.isfinite(scores), -math.inf)

        # --- t2i: rank of the paired image (ties: lower image index first) -------------------
        target_score = scores.gather(1, target[:, None])
        # (int32 counts: summing bools into int64 is half as fast on the CPU)
        rank = (scores > target_score).sum(dim=1, dtype=torch.int32)
        # Rows where another image ties with the paired one also count the tied images of
        # lower index (only those rows: two comparison passes for the others).
        level = scores == target_score
        ties = level.sum(dim=1, dtype=torch.int32) > 1
        tied = (ties & (target_score[:, 0] != -math.inf)).nonzero()[:, 0]
        if tied.numel():
            image_ids = torch.arange(n_image, device=device)
            lower = image_ids[None, :] < target[tied, None]
            rank[tied] += (level.index_select(0, tied) & lower).sum(dim=1, dtype=torch.int32)
            del lower
        del level
        # A non-finite paired score is a miss at every K (rank `depth` is outside every top-K).
        rank = torch.where(target_score[:, 0] == -math.inf, depth, rank)
        t2i_rank[start:stop] = rank.cpu()
        best = scores.argmax(dim=1, keepdim=True)  # first maximum = lowest index
        if k_t2i == 1:
            t2i_top[start:stop] = best.cpu()
        else:
            t2i_top[start:stop] = top_k(scores.T, k_t2i)[1].T.cpu()

        # --- predictive softmax(scale * scores): t2i per caption, i2t normaliser per image ---
        # max(scale * x) = scale * max(x) exactly (rounding is monotone), so the row maximum
        # comes from the argmax instead of a pass over the float64 logits.
        logits = scores.to(torch.float64, copy=True).mul_(scale)
        row_lse = torch.logsumexp(logits, dim=1)
        row_max = scores.gather(1, best)[:, 0].double() * scale
        t2i_conf[start:stop] = _lse_confidence(row_max, row_lse, n_image).cpu()
        col_lse = torch.logsumexp(logits, dim=0)
        run_lse = col_lse if run_lse is None else torch.logaddexp(run_lse.to(device), col_lse)
        del logits

        # --- i2t: merge the chunk into the running top-k captions per image ------------------
        # Ties go to the lower caption index, so a caption of this chunk enters an image's
        # top-k only when it scores strictly above the image's k-th best caption so far.
        if run_vals is None:
            run_vals, run_idx = top_k(scores, k_i2t)
            run_idx += start
        else:
            run_vals, run_idx = run_vals.to(device), run_idx.to(device)
            cols: torch.Tensor | None = None  # None: every image
            if run_vals.shape[0] == k_i2t:
                cols = (scores > run_vals[-1]).any(dim=0).nonzero()[:, 0]
                if cols.numel() == n_image:
                    cols = None
            if cols is None or cols.numel():
                part = scores if cols is None else scores.index_select(1, cols)
                chunk_vals, chunk_idx = top_k(part, k_i2t)
                del part
                # Running entries come first and have lower caption indices, so a stable sort
                # keeps "lower caption index first" among ties regardless of chunking.
                old_vals = run_vals if cols is None else run_vals[:, cols]
                old_idx = run_idx if cols is None else run_idx[:, cols]
                cand_vals = torch.cat([old_vals, chunk_vals], dim=0)
                cand_idx = torch.cat([old_idx, chunk_idx + start], dim=0)
                keep = min(k_i2t, cand_vals.shape[0])
                order = torch.sort(cand_vals, dim=0, descending=True, stable=True).indices[:keep]
                new_vals, new_idx = cand_vals.gather(0, order), cand_idx.gather(0, order)
                if cols is None:
                    run_vals, run_idx = new_vals, new_idx
                else:
                    run_vals[:, cols], run_idx[:, cols] = new_vals, new_idx
        del scores

    assert run_idx is not None and run_vals is not None and run_lse is not None
    top_captions = run_idx.cpu()  # [k_i2t, n_image]
    top_scores = run_vals.cpu()

    # i2t rank of the first paired caption among the top-k (`depth` when none is there); a
    # non-finite score (-inf here, sorted after every finite one) is never a hit.
    image_ids = torch.arange(n_image)
    is_pair = text_to_image[top_captions] == image_ids[None, :]  # [k_i2t, n_image]
    is_pair &= top_scores != -math.inf
    pos = torch.arange(top_captions.shape[0])[:, None].expand_as(is_pair)
    i2t_rank = torch.where(is_pair, pos, torch.full_like(pos, depth)).min(dim=0).values
    i2t_conf = _lse_confidence(top_scores[0].double() * scale, run_lse.cpu(), n_text)
    return Ranking(
        depth=depth,
        t2i_rank=t2i_rank,
        t2i_top=t2i_top,
        t2i_confidence=t2i_conf,
        i2t_rank=i2t_rank,
        i2t_top=top_captions.T.contiguous(),
        i2t_confidence=i2t_conf,
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
    """The metrics of :func:`retrieval_metrics` from a :class:`Ranking` (see there)."""
    ks = [int(k) for k in ks]
    if not ks or min(ks) < 1:
        raise ValueError(f"ks must be non-empty positive integers, got {ks}")
    if max(ks) > ranking.depth:
        raise ValueError(f"K = {max(ks)} exceeds the ranking's depth {ranking.depth}")
    n_text, n_image = ranking.t2i_rank.shape[0], ranking.i2t_rank.shape[0]
    if text_uncertainty is not None:
        text_uncertainty = torch.as_tensor(text_uncertainty).detach().reshape(-1).cpu()
        if text_uncertainty.shape[0] != n_text:
            raise ValueError("text_uncertainty must have n_text entries")
    if image_uncertainty is not None:
        image_uncertainty = torch.as_tensor(image_uncertainty).detach().reshape(-1).cpu()
        if image_uncertainty.shape[0] != n_image:
            raise ValueError("image_uncertainty must have n_image entries")
    has_caption = ranking.has_caption

    # --- uncertainty sources -----------------------------------------------------------------
    if text_uncertainty is not None:
        t2i_unc, t2i_src = text_uncertainty, "text"
        i2t_unc = text_uncertainty[ranking.i2t_top[:, 0]][has_caption]
        i2t_src = "retrieved_text"
    elif image_uncertainty is not None:
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
    """Recall@K, uncertainty-binned Recall@1, failure prediction, selective risk and ECE in
    both directions from ``score_fn(start, stop)`` (the ``[stop - start, n_image]`` scores of
    captions ``start..stop-1``, higher = better).

    Returns ``{"t2i": {...}, "i2t": {...}, "rsum": float | None}``, each direction with
    ``recall@K``, ``ece``, ``binned_recall@1``, ``spearman``, ``r2``, ``auroc``, ``aupr``,
    ``fpr@95tpr``, ``aurc``, ``e_aurc``, ``risk_coverage`` and ``uncertainty_source`` (None
    without an uncertainty). The binning uncertainty is the caption's own (t2i) and that of an
    image's top-1 caption (i2t, the authors' protocol), else the image's (i2t) and that of a
    caption's top-1 image (t2i). Images without captions are left out of i2t.
    """
    ks = [int(k) for k in ks]
    if not ks or min(ks) < 1:
        raise ValueError(f"ks must be non-empty positive integers, got {ks}")
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
