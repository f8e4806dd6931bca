"""Retrieval and uncertainty metrics of the paper (Ju et al., NeurIPS 2025, App. B).

Protocol (App. B and the official code):

* Recall@K for text-to-image (t2i) and image-to-text (i2t) retrieval with several captions per
  image. For i2t an image counts as a hit at K when *any* of its captions is among the K
  best-scoring captions.
* Uncertainty calibration: the queries are sorted by uncertainty and cut into ``n_bins``
  equal-count bins (bin 0 = lowest uncertainty); Recall@1 is computed per bin. The curve is then
  summarised by Spearman's S between bin index and per-bin Recall@1 (``-1``: recall falls
  monotonically as uncertainty rises) and by the R^2 of a least-squares line through it.

Selective retrieval (beyond the paper; the numbers the field reports): with the top-1 error of
each query as the event and the query's uncertainty as the predictor, :func:`error_auroc` is the
AUROC (0.5: the uncertainty says nothing about errors, 1: every error is more uncertain than
every hit), :func:`aurc` the area under the risk-coverage curve (Geifman & El-Yaniv, 2017;
lower is better) and ``e_aurc`` its excess over the best order of the same errors.

Everything is memory-bounded: :func:`retrieval_metrics` asks ``score_fn`` for blocks of at most
``chunk_size`` captions against all images and never materialises the full
``n_text x n_image`` score matrix (peak memory ``O(chunk_size * n_image)``).

Tie-breaking is deterministic and independent of ``chunk_size``: among equal scores the lower
index (image for t2i, caption for i2t) ranks first.

Non-finite scores (NaN, +inf, -inf) are never hits: they rank below every finite score, a caption
whose paired image scores non-finite is a miss at every K (t2i), and a caption with a non-finite
score never counts for an image (i2t), even when all of that image's candidates are non-finite.
A broken model therefore scores Recall@K = 0, not 1 (``NaN > x`` is false for every ``x``, so
counting better-scoring items would rank a NaN target first). Finite scores rank exactly as they
would without the non-finite ones.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence

import numpy as np
import torch
from scipy import stats
from tqdm.auto import tqdm

__all__ = [
    "ScoreFn",
    "aurc",
    "binned_recall",
    "error_auroc",
    "curve_statistics",
    "retrieval_metrics",
    "spearman_uncertainty",
]

ScoreFn = Callable[[int, int], torch.Tensor]
"""``score_fn(start, stop) -> [stop - start, n_image]`` scores of captions ``start..stop-1``
against all images; higher means a better match."""


def _to_numpy_1d(x: torch.Tensor | np.ndarray | Sequence[float], name: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        arr = x.detach().to("cpu", torch.float64).numpy()
    else:
        arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(arr.shape)}")
    return arr


def binned_recall(hits: torch.Tensor, uncertainty: torch.Tensor, n_bins: int = 10) -> list[float]:
    """Recall per uncertainty bin (paper App. B).

    Items are stable-sorted by ascending ``uncertainty`` and cut into ``n_bins`` bins of
    ``len(hits) // n_bins`` items each; bin 0 holds the least uncertain items. The remainder
    (the most uncertain items at the end of the order) is dropped, as in the official code.

    Args:
        hits: ``[n]`` bool or float hit indicators (e.g. hit@1 per query).
        uncertainty: ``[n]`` uncertainty per item, higher = more uncertain.
        n_bins: number of bins.

    Returns:
        ``n_bins`` python floats, the mean of ``hits`` within each bin.
    """
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
    """Spearman S and R^2 of a binned Recall@1 curve against bin index (paper App. B).

    S is ``scipy.stats.spearmanr(bin_index, binned)``; R^2 is ``linregress(...).rvalue ** 2``.
    Both are ``None`` when undefined (fewer than two bins, a constant curve, or non-finite
    values), so the result is always JSON-serialisable.
    """
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
    """Plain Spearman correlation between two 1-D arrays (``scipy.stats.spearmanr``).

    Used e.g. for Spearman(uncertainty, abstraction level) (paper Sec. 5). May be NaN when one
    input is constant.
    """
    u = _to_numpy_1d(uncertainty, "uncertainty")
    r = _to_numpy_1d(reference, "reference")
    if u.shape[0] != r.shape[0]:
        raise ValueError(f"lengths differ: {u.shape[0]} vs {r.shape[0]}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(stats.spearmanr(u, r).statistic)


def error_auroc(uncertainty, error) -> float | None:
    """AUROC of ``uncertainty`` as a predictor of ``error`` (a bool per query): the probability
    that an erring query is more uncertain than a correct one, ties counting half
    (Mann-Whitney U). None when every query errs or none does."""
    u = _to_numpy_1d(uncertainty, "uncertainty")
    e = _to_numpy_1d(error, "error").astype(bool)
    if u.shape != e.shape:
        raise ValueError(f"lengths differ: {u.shape[0]} vs {e.shape[0]}")
    n_err, n_ok = int(e.sum()), int((~e).sum())
    if n_err == 0 or n_ok == 0:
        return None
    ranks = stats.rankdata(u)  # average ranks: ties count half
    return float((ranks[e].sum() - n_err * (n_err + 1) / 2) / (n_err * n_ok))


def aurc(uncertainty, error) -> tuple[float, float]:
    """(AURC, E-AURC): the mean selective risk over coverages 1/n..n/n when queries are kept in
    order of increasing ``uncertainty`` (ties: the order given), and its excess over the best
    possible order of the same errors (every error last)."""
    u = _to_numpy_1d(uncertainty, "uncertainty")
    e = _to_numpy_1d(error, "error")
    if u.shape != e.shape or u.size == 0:
        raise ValueError(f"need equal, non-zero lengths, got {u.shape[0]} and {e.shape[0]}")
    kept = np.arange(1, u.size + 1)
    risk = np.cumsum(e[np.argsort(u, kind="stable")]) / kept
    best = np.cumsum(np.sort(e)) / kept
    value = float(risk.mean())
    return value, value - float(best.mean())


def _direction_result(
    hit_rank: torch.Tensor,
    ks: Sequence[int],
    uncertainty: torch.Tensor | None,
    source: str | None,
    n_bins: int,
) -> dict:
    """Assemble one direction's result from the rank of the first hit (``>= max(ks)``: none)."""
    out: dict = {}
    for k in ks:
        out[f"recall@{k}"] = float((hit_rank < k).double().mean())
    if uncertainty is None:
        out["binned_recall@1"] = None
        out["spearman"] = None
        out["r2"] = None
        out["auroc"] = out["aurc"] = out["e_aurc"] = None
        out["uncertainty_source"] = None
    else:
        binned = binned_recall(hit_rank == 0, uncertainty, n_bins)
        rho, r2 = curve_statistics(binned)
        out["binned_recall@1"] = binned
        out["spearman"] = rho
        out["r2"] = r2
        error = hit_rank != 0
        out["auroc"] = error_auroc(uncertainty, error)
        out["aurc"], out["e_aurc"] = aurc(uncertainty, error.double())
        out["uncertainty_source"] = source
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
    chunk_size: int = 1024,
    progress: bool = False,
) -> dict[str, dict]:
    """Recall@K and uncertainty-binned Recall@1 in both directions (paper App. B).

    Args:
        score_fn: ``score_fn(start, stop)`` returns the ``[stop - start, n_image]`` scores of
            captions ``start..stop-1`` against all images (higher = better). It is called once
            per chunk, with at most ``chunk_size`` captions.
        n_text: number of captions.
        n_image: number of images.
        text_to_image: ``[n_text]`` index of each caption's paired image.
        text_uncertainty: optional ``[n_text]`` caption uncertainty (higher = more uncertain).
        image_uncertainty: optional ``[n_image]`` image uncertainty.
        ks: the K of Recall@K.
        n_bins: number of equal-count uncertainty bins.
        chunk_size: captions scored per ``score_fn`` call.
        progress: show a tqdm bar over chunks.

    Returns:
        ``{"t2i": {...}, "i2t": {...}}``; each holds ``"recall@K"`` per K, ``"binned_recall@1"``
        (list or ``None``), ``"spearman"``, ``"r2"``, ``"auroc"``, ``"aurc"``, ``"e_aurc"``
        (top-1 errors against the binning uncertainty; float or ``None``) and
        ``"uncertainty_source"``.

    Semantics:
        * t2i: caption m hits at K when its paired image is among the K best images.
          Binning uses the caption's own uncertainty (``"text"``), else the uncertainty of its
          top-1 retrieved image (``"retrieved_image"``).
        * i2t: image n hits at K when any caption paired with n is among the K best captions.
          Images without any caption are excluded from i2t (recall and binning). Binning uses
          the uncertainty of the image's top-1 retrieved caption (``"retrieved_text"``, the
          official protocol), else the image's own uncertainty (``"image"``).
        * A non-finite score (NaN, +inf, -inf) ranks below every finite one and is never a hit:
          a caption whose paired image scores non-finite misses at every K, and a caption scoring
          non-finite against an image never counts for it in i2t.
    """
    if n_text < 1 or n_image < 1:
        raise ValueError(f"need n_text >= 1 and n_image >= 1, got {n_text}, {n_image}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    ks = [int(k) for k in ks]
    if not ks or min(ks) < 1:
        raise ValueError(f"ks must be non-empty positive integers, got {ks}")
    text_to_image = torch.as_tensor(text_to_image).long().reshape(-1)
    if text_to_image.shape[0] != n_text:
        raise ValueError(f"text_to_image has {text_to_image.shape[0]} entries, expected {n_text}")
    if int(text_to_image.min()) < 0 or int(text_to_image.max()) >= n_image:
        raise ValueError("text_to_image has indices outside [0, n_image)")
    if text_uncertainty is not None:
        text_uncertainty = torch.as_tensor(text_uncertainty).detach().reshape(-1).cpu()
        if text_uncertainty.shape[0] != n_text:
            raise ValueError("text_uncertainty must have n_text entries")
    if image_uncertainty is not None:
        image_uncertainty = torch.as_tensor(image_uncertainty).detach().reshape(-1).cpu()
        if image_uncertainty.shape[0] != n_image:
            raise ValueError("image_uncertainty must have n_image entries")

    k_max = max(ks)
    k_i2t = min(k_max, n_text)  # captions kept per image in the running top-k

    t2i_rank = torch.empty(n_text, dtype=torch.long)  # rank of the paired image, 0-based
    t2i_top1 = torch.empty(n_text, dtype=torch.long)  # best image per caption
    run_vals: torch.Tensor | None = None  # [<= k_i2t, n_image] best caption scores per image
    run_idx: torch.Tensor | None = None  # [<= k_i2t, n_image] their caption indices
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
        finite = torch.isfinite(scores)
        if not bool(finite.all()):
            scores = scores.masked_fill(~finite, -math.inf)

        # --- t2i: rank of the paired image (ties: lower image index first) -------------------
        target_score = scores.gather(1, target[:, None])
        image_ids = torch.arange(n_image, device=device)
        rank = (scores > target_score).sum(dim=1) + (
            (scores == target_score) & (image_ids[None, :] < target[:, None])
        ).sum(dim=1)
        # A non-finite paired score is a miss at every K (rank k_max is outside every top-K).
        rank = torch.where(target_score[:, 0] == -math.inf, k_max, rank)
        t2i_rank[start:stop] = rank.cpu()
        t2i_top1[start:stop] = scores.argmax(dim=1).cpu()  # first maximum = lowest index

        # --- i2t: merge the chunk into the running top-k captions per image ------------------
        chunk_ids = torch.arange(start, stop, device=device)[:, None].expand(-1, n_image)
        if run_vals is None:
            cand_vals, cand_idx = scores, chunk_ids
        else:
            # Running entries come first and have lower caption indices, so a stable sort
            # keeps "lower caption index first" among ties regardless of chunking.
            cand_vals = torch.cat([run_vals.to(device), scores], dim=0)
            cand_idx = torch.cat([run_idx.to(device), chunk_ids], dim=0)
        keep = min(k_i2t, cand_vals.shape[0])
        order = torch.sort(cand_vals, dim=0, descending=True, stable=True).indices[:keep]
        run_vals = cand_vals.gather(0, order)
        run_idx = cand_idx.gather(0, order)
        del scores, cand_vals, cand_idx, order

    assert run_idx is not None and run_vals is not None
    top_captions = run_idx.cpu()  # [k_i2t, n_image]

    # i2t rank of the first paired caption among the top-k (k_max when none is there); a
    # non-finite score (-inf here, sorted after every finite one) is never a hit.
    image_ids = torch.arange(n_image)
    is_pair = text_to_image[top_captions] == image_ids[None, :]  # [k_i2t, n_image]
    is_pair &= run_vals.cpu() != -math.inf
    pos = torch.arange(top_captions.shape[0])[:, None].expand_as(is_pair)
    i2t_rank = torch.where(is_pair, pos, torch.full_like(pos, k_max)).min(dim=0).values
    has_caption = torch.bincount(text_to_image, minlength=n_image) > 0
    i2t_rank = i2t_rank[has_caption]

    # --- uncertainty sources -----------------------------------------------------------------
    if text_uncertainty is not None:
        t2i_unc, t2i_src = text_uncertainty, "text"
        i2t_unc, i2t_src = text_uncertainty[top_captions[0]][has_caption], "retrieved_text"
    elif image_uncertainty is not None:
        t2i_unc, t2i_src = image_uncertainty[t2i_top1], "retrieved_image"
        i2t_unc, i2t_src = image_uncertainty[has_caption], "image"
    else:
        t2i_unc = t2i_src = i2t_unc = i2t_src = None

    return {
        "t2i": _direction_result(t2i_rank, ks, t2i_unc, t2i_src, n_bins),
        "i2t": _direction_result(i2t_rank, ks, i2t_unc, i2t_src, n_bins),
    }
