"""Building blocks of the memory-bounded ranking pass (:func:`asymvlm.metrics.rank_pass`): the
chunk size from a memory budget, an exact top-k and a cheap finiteness check."""

from __future__ import annotations

import math

import torch

__all__ = ["DEFAULT_MEMORY_BUDGET", "SCORE_WORK_BYTES", "all_finite", "chunk_rows", "top_k"]

#: Working memory of one caption chunk, by default (bytes).
DEFAULT_MEMORY_BUDGET = 512 * 2**20
#: Bytes per score of a chunk at its peak: the float32 block, its float64 copy and the float64
#: temporary of the softmax normaliser (21-23 bytes), with room for the allocator's heap
#: (``benchmarks/eval_scale.py``: peak RSS minus the tables).
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
    """Whether every entry of ``x`` is finite: one sum (NaN or inf make it non-finite), the
    exact check only when the sum is not finite."""
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
    """(values, row indices) ``[min(k, m), n]`` of the ``k`` best entries of every column,
    best first, ties to the lower row: the head of a stable descending ``torch.sort`` at the
    cost of ``torch.topk(k + 1)`` (columns tied across the cut take the cut value by row).
    ``values`` must hold no NaN. Pass ``x.T`` for the best entries per row.
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
