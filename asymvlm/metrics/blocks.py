"""Building blocks of the memory-bounded ranking pass (:func:`asymvlm.metrics.rank_pass`).

* :func:`chunk_rows`: how many captions one chunk may hold so that its working memory (the
  ``[chunk, n_image]`` score block and the temporaries made from it) stays within a budget;
* :func:`top_k`: the ``k`` best entries of every column, in the exact order of a stable
  descending sort (ties: lower row first) at the cost of a ``torch.topk``;
* :func:`all_finite`: a cheap NaN/inf check of a large tensor.
"""

from __future__ import annotations

import math

import torch

__all__ = ["DEFAULT_MEMORY_BUDGET", "SCORE_WORK_BYTES", "all_finite", "chunk_rows", "top_k"]

#: Working memory of one caption chunk, by default (bytes). What one chunk costs on top of the
#: tables (embeddings, encodings, the per-query results) is about this, whatever the gallery.
DEFAULT_MEMORY_BUDGET = 512 * 2**20

#: Bytes of working memory per score entry at the peak of a chunk of
#: :func:`~asymvlm.metrics.rank_pass`: the float32 score block (4) and, while the predictive
#: softmax is normalised, its float64 copy (8) and the float64 temporary of
#: ``torch.logsumexp`` (8), 21-23 bytes measured with the bool masks; rounded up for the
#: allocator: glibc keeps freed blocks below its (dynamic, up to 32 MiB) mmap threshold in the
#: heap, which adds up to ~50 % over many chunks (``benchmarks/eval_scale.py``, peak RSS minus
#: the tables).
SCORE_WORK_BYTES = 40


def chunk_rows(
    n_columns: int, memory_budget: int | None = None, bytes_per_entry: int = SCORE_WORK_BYTES
) -> int:
    """Captions per chunk so that ``rows * n_columns * bytes_per_entry <= memory_budget``
    (:data:`DEFAULT_MEMORY_BUDGET` when None); at least 1."""
    budget = DEFAULT_MEMORY_BUDGET if memory_budget is None else int(memory_budget)
    if budget < 1:
        raise ValueError(f"memory_budget must be a positive number of bytes, got {budget}")
    return max(1, budget // (bytes_per_entry * max(1, n_columns)))


def all_finite(x: torch.Tensor) -> bool:
    """Whether every entry of ``x`` is finite.

    One sum instead of a bool tensor of ``x``'s size: a NaN or inf makes the sum non-finite
    (inf - inf = NaN); only when the sum is not finite (or overflows) is the exact check run.
    """
    if not x.is_floating_point():
        return True
    if x.numel() == 0 or bool(torch.isfinite(x.sum())):
        return True
    return bool(torch.isfinite(x).all())


def _sorted_top(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    order = torch.sort(values, dim=0, descending=True, stable=True).indices[:k]
    return values.gather(0, order), order


def _ordered(values: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` [k, n] (ascending per column) reordered best first, ties keeping row order."""
    vals = values.gather(0, rows)
    order = torch.sort(vals, dim=0, descending=True, stable=True).indices
    return vals.gather(0, order), rows.gather(0, order)


def _top_k_at_ties(
    values: torch.Tensor, k: int, kth: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`top_k` of columns whose k-th best value ``kth`` [n] is tied with the (k+1)-th:
    every entry above it and, of the entries equal to it, the ``k - #above`` of lowest row.
    Linear passes only (comparisons and a cumulative count), no sort of the column."""
    above = values > kth
    level = values == kth
    need = (k - above.sum(dim=0)).to(torch.int32)
    chosen = above | (level & (level.cumsum(dim=0, dtype=torch.int32) <= need))
    del above, level
    # Exactly k chosen per column; nonzero of the transpose lists them column by column with
    # ascending rows.
    rows = chosen.T.nonzero()[:, 1].view(-1, k).T
    return _ordered(values, rows)


def top_k(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, row indices) ``[min(k, m), n]`` of the ``k`` best entries of every column of
    ``values`` ``[m, n]``, best first, ties broken by the lower row.

    Exactly the first ``k`` rows of ``torch.sort(values, dim=0, descending=True,
    stable=True)``, but from ``torch.topk(values, k + 1)``: where the k-th best value of a
    column is strictly above the (k+1)-th, the top-k set is unique and only needs ordering; in
    the other columns (a tie across the cut: float32 log-likelihoods near 1e3 tie often) the
    entries at the cut value are taken by row, a quarter of the columns at a time. Memory and
    work are linear in ``values``. ``values`` must hold no NaN (mask it to -inf first). Pass
    ``x.T`` for the best entries per row.
    """
    m, n = values.shape
    k = min(k, m)
    if m <= k + 1:
        return _sorted_top(values, k)
    top = torch.topk(values, k + 1, dim=0, largest=True, sorted=True)
    clear = top.values[k - 1] > top.values[k]  # the top-k set of the column is unique
    vals, rows = _ordered(values, top.indices[:k].sort(dim=0).values)
    tied = (~clear).nonzero()[:, 0]
    if tied.numel():
        kth = top.values[k - 1]
        for block in tied.split(max(1, math.ceil(n / 4))):
            block_vals, block_rows = _top_k_at_ties(values[:, block], k, kth[block])
            vals[:, block], rows[:, block] = block_vals, block_rows
    return vals, rows
