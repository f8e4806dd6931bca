"""Cross-modal retrieval metrics (paper App. B) from one memory-bounded pass over caption
chunks; ties, non-finite scores and the memory bound: docs/metrics.md."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from asymvlm.metrics.uncertainty import (
    aurc,
    binned_recall,
    curve_statistics,
    distinct_levels,
    error_aupr,
    error_auroc,
    expected_calibration_error,
    fpr_at_tpr,
    risk_coverage,
)

#: Working memory of one caption chunk, by default (bytes).
DEFAULT_MEMORY_BUDGET = 512 * 2**20
#: Bytes per score of a chunk at its peak: the float32 block, its float64 copy, the float64
#: softmax temporary and the allocator's slack (``benchmarks/eval_scale.py``).
SCORE_WORK_BYTES = 40

#: ``score_fn(start, stop)``: captions ``start..stop-1`` x all images, higher = a better match.
ScoreFn = Callable[[int, int], torch.Tensor]

DIRECTIONS = ("t2i", "i2t")
ECE_BINS = 15  # Guo et al. (2017)


@dataclass
class Ranking:
    """What one pass over the caption chunks keeps (on the CPU); ``depth``: the rank of a
    query without a hit among its ``depth`` best."""

    depth: int
    t2i_rank: torch.Tensor  # [n_text] rank of the paired image, 0-based
    t2i_top: torch.Tensor  # [n_text, top_t2i] the best images per caption, best first
    t2i_confidence: torch.Tensor  # [n_text] max of softmax(scale * scores) over the images
    i2t_rank: torch.Tensor  # [n_image] rank of the first paired caption
    i2t_top: torch.Tensor  # [n_image, min(depth, n_text)] the best captions, best first
    i2t_confidence: torch.Tensor  # [n_image] max of softmax(scale * scores) over the captions
    has_caption: torch.Tensor  # [n_image] bool; images without captions are left out of i2t


def chunk_rows(n_columns: int, memory_budget: int | None = None) -> int:
    """Captions per chunk within ``memory_budget`` (None: :data:`DEFAULT_MEMORY_BUDGET`), >= 1."""
    budget = memory_budget or DEFAULT_MEMORY_BUDGET
    return max(1, budget // (SCORE_WORK_BYTES * max(1, n_columns)))


def _top(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, rows) of the ``k`` best entries of every column, best first, ties to the lower
    row: a stable descending sort's head, at the cost of one ``torch.topk(k + 1)``."""
    n = values.shape[0]
    k = min(k, n)
    top = torch.topk(values, min(k + 1, n), dim=0)
    rows = top.indices[:k]
    if k < n:  # columns where the cut splits a tie: the lowest rows of the tie
        cols = (top.values[k - 1] == top.values[k]).nonzero()[:, 0]
        part, kth = values[:, cols], top.values[k - 1, cols]
        above, level = part > kth, part == kth
        need = k - above.sum(dim=0, dtype=torch.int32)
        chosen = above | (level & (level.cumsum(dim=0, dtype=torch.int32) <= need))
        rows[:, cols] = chosen.T.nonzero()[:, 1].view(-1, k).T
    rows = rows.sort(dim=0).values
    vals = values.gather(0, rows)
    order = torch.sort(vals, dim=0, descending=True, stable=True).indices
    return vals.gather(0, order), rows.gather(0, order)


def _confidence(top: torch.Tensor, lse: torch.Tensor, n: int) -> torch.Tensor:
    """max softmax = exp(top - logsumexp); uniform ``1 / n`` where no score is finite."""
    return torch.where(torch.isfinite(lse), torch.exp(top - lse), 1.0 / n)


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
    """One pass over chunks of ``chunk_size`` captions (None: :func:`chunk_rows`): each query's
    first-hit rank, its best ``depth`` captions / ``top_t2i`` images and the top-1 probability
    of ``softmax(scale * scores)``."""
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
        scores = scores if scores.is_floating_point() else scores.float()
        scores = scores.nan_to_num(-math.inf, posinf=-math.inf, neginf=-math.inf)
        target = text_to_image[start:stop].to(scores.device)[:, None]
        paired = scores.gather(1, target)
        lower = torch.arange(n_image, device=scores.device) < target
        rank = (scores > paired).sum(1) + ((scores == paired) & lower).sum(1)
        t2i_rank[start:stop] = torch.where(paired[:, 0] == -math.inf, depth, rank).cpu()
        best = scores.argmax(dim=1, keepdim=True)  # the first maximum: the lowest index
        t2i_top[start:stop] = (best if k_t2i == 1 else _top(scores.T, k_t2i)[1].T).cpu()

        logits = scores.double() * scale
        top = logits.gather(1, best)[:, 0]
        t2i_conf[start:stop] = _confidence(top, torch.logsumexp(logits, 1), n_image).cpu()
        col_lse = torch.logsumexp(logits, dim=0)
        run_lse = col_lse if run_lse is None else torch.logaddexp(run_lse, col_lse)
        del logits

        vals, idx = _top(scores, k_i2t)
        if run_vals is not None:  # earlier chunks first: ties keep the lower caption index
            vals, order = _top(torch.cat([run_vals, vals]), k_i2t)
            idx = torch.cat([run_idx, idx + start]).gather(0, order)
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
        i2t_confidence=_confidence(top_scores[0].double() * scale, run_lse.cpu(), n_text),
        has_caption=torch.bincount(text_to_image, minlength=n_image) > 0,
    )


def _direction_result(
    hit_rank: torch.Tensor,
    confidence: torch.Tensor,
    ks: Sequence[int],
    uncertainty: torch.Tensor | None,
    source: str | None,
    n_bins: int,
) -> dict[str, Any]:
    """One direction's numbers from the rank of each query's first hit; the uncertainty ones
    None for an uncertainty with fewer :func:`distinct_levels` than ``n_bins``."""
    out: dict[str, Any] = {f"recall@{k}": float((hit_rank < k).double().mean()) for k in ks}
    hit = hit_rank == 0
    out["ece"] = expected_calibration_error(confidence, hit, ECE_BINS)
    keys = ("binned_recall@1", "spearman", "r2", "auroc", "aupr", "fpr@95tpr", "aurc", "e_aurc")
    out |= dict.fromkeys(keys) | {"risk_coverage": None, "uncertainty_source": None}
    if uncertainty is None or distinct_levels(uncertainty) < n_bins:
        return out
    out["binned_recall@1"] = binned_recall(hit, uncertainty, n_bins)
    out["spearman"], out["r2"] = curve_statistics(out["binned_recall@1"])
    error = ~hit
    out["auroc"] = error_auroc(uncertainty, error)
    out["aupr"] = error_aupr(uncertainty, error)
    out["fpr@95tpr"] = fpr_at_tpr(uncertainty, error)
    out["aurc"], out["e_aurc"] = aurc(uncertainty, error)
    out["risk_coverage"] = risk_coverage(uncertainty, error)
    out["uncertainty_source"] = source
    return out


def ranking_metrics(
    ranking: Ranking,
    ks: Sequence[int] = (1, 5, 10),
    text_uncertainty: torch.Tensor | None = None,
    image_uncertainty: torch.Tensor | None = None,
    n_bins: int = 10,
) -> dict[str, Any]:
    """``{"t2i": {...}, "i2t": {...}, "rsum"}`` (docs/metrics.md). The uncertainty is the
    caption's (t2i) and that of an image's top-1 caption (i2t, the authors' protocol), else the
    image's (i2t) and that of a caption's top-1 image (t2i)."""
    has_caption = ranking.has_caption
    t2i_unc = t2i_src = i2t_unc = i2t_src = None
    if text_uncertainty is not None:
        text_uncertainty = torch.as_tensor(text_uncertainty).detach().reshape(-1).cpu()
        t2i_unc, t2i_src = text_uncertainty, "text"
        i2t_unc, i2t_src = text_uncertainty[ranking.i2t_top[:, 0]][has_caption], "retrieved_text"
    elif image_uncertainty is not None:
        image_uncertainty = torch.as_tensor(image_uncertainty).detach().reshape(-1).cpu()
        t2i_unc, t2i_src = image_uncertainty[ranking.t2i_top[:, 0]], "retrieved_image"
        i2t_unc, i2t_src = image_uncertainty[has_caption], "image"
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
    scale: float = 100.0,
) -> dict[str, Any]:
    """:func:`ranking_metrics` of the :func:`rank_pass` over ``score_fn``."""
    ranking = rank_pass(
        score_fn, n_text, n_image, text_to_image, depth=max(ks), scale=scale, chunk_size=chunk_size
    )
    return ranking_metrics(ranking, ks, text_uncertainty, image_uncertainty, n_bins)


def rsum(result: Mapping[str, Any]) -> float | None:
    """RSUM: R@1 + R@5 + R@10 of t2i and i2t in percent; None when one is missing."""
    values = [result.get(d, {}).get(f"recall@{k}") for d in DIRECTIONS for k in (1, 5, 10)]
    return None if None in values else float(100.0 * sum(values))


def average_folds(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The mean over folds of every number of each direction (None if a fold has none), the
    RSUM of the mean recalls and ``n_folds``; curves left out."""
    out: dict[str, Any] = {}
    for d in DIRECTIONS:
        out[d] = {}
        for key in results[0][d]:
            if key in ("binned_recall@1", "risk_coverage", "uncertainty_source"):
                continue
            values = [r[d][key] for r in results]
            out[d][key] = None if None in values else float(np.mean(values))
    return out | {"rsum": rsum(out), "n_folds": len(results)}
