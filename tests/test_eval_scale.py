"""Evaluation at scale: the ranking pass is exact for every chunk size, linear in the scores
(an exact top-k instead of sorting a chunk) and its largest tensor is bounded by the chunk
that the memory budget allows."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from asymvlm.evaluation import encode_split, evaluate_retrieval
from asymvlm.evaluation.hierarcaps import _monotone_fraction
from asymvlm.evaluation.retrieval import _encode_chunked
from asymvlm.methods import build_method
from asymvlm.metrics import SCORE_WORK_BYTES, Ranking, chunk_rows, rank_pass
from asymvlm.metrics.blocks import DEFAULT_MEMORY_BUDGET, all_finite, top_k
from asymvlm.splits import SplitTensors

NAN, INF = float("nan"), float("inf")


def _scores(n_text: int, n_image: int, kind: str, seed: int = 0) -> torch.Tensor:
    """Random scores: ``plain``; ``ties`` (a few levels, ties everywhere, like float32
    log-likelihoods near 1e3); ``nonfinite`` (NaN / +inf / -inf entries)."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(n_text, n_image, generator=g)
    if kind == "ties":
        s = (s * 2).round() / 2
    elif kind == "nonfinite":
        for value, share in ((NAN, 0.2), (INF, 0.05), (-INF, 0.1)):
            s[torch.rand(n_text, n_image, generator=g) < share] = value
    return s


def _reference(scores: torch.Tensor, pairs: torch.Tensor, depth: int, top_t2i: int, scale: float):
    """The whole-matrix ranking by stable sorts (what a chunked pass must reproduce)."""
    s = torch.where(torch.isfinite(scores), scores, torch.full_like(scores, -INF))
    n_text, n_image = s.shape
    rows = torch.sort(s, dim=1, descending=True, stable=True).indices
    t2i_rank = (rows == pairs[:, None]).int().argmax(dim=1)
    t2i_rank[s.gather(1, pairs[:, None])[:, 0] == -INF] = depth
    cols = torch.sort(s, dim=0, descending=True, stable=True).indices[: min(depth, n_text)]
    hit = (pairs[cols] == torch.arange(n_image)) & (s.gather(0, cols) != -INF)
    pos = torch.arange(cols.shape[0])[:, None].expand_as(hit)
    i2t_rank = torch.where(hit, pos, torch.full_like(pos, depth)).min(dim=0).values
    logits = s.double() * scale
    return {
        "t2i_rank": t2i_rank,
        "t2i_top": rows[:, : min(top_t2i, n_image)],
        "i2t_rank": i2t_rank,
        "i2t_top": cols.T,
        "t2i_confidence": torch.softmax(logits, dim=1).max(dim=1).values,
        "i2t_confidence": torch.softmax(logits, dim=0).max(dim=0).values,
    }


def _pass(scores: torch.Tensor, pairs: torch.Tensor, chunk_size: int | None, **kw) -> Ranking:
    return rank_pass(
        lambda a, b: scores[a:b],
        scores.shape[0],
        scores.shape[1],
        pairs,
        chunk_size=chunk_size,
        **kw,
    )


# -- top_k ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["plain", "ties", "constant", "neg_inf"])
@pytest.mark.parametrize("k", [1, 3, 9, 10, 11, 40])
def test_top_k_is_the_head_of_a_stable_descending_sort(kind, k) -> None:
    values = _scores(10 if k > 3 else 30, 17, "ties" if kind == "ties" else "plain", seed=k)
    if kind == "constant":
        values = torch.full_like(values, 868.25)
    elif kind == "neg_inf":
        values[values < 0.5] = -INF
    order = torch.sort(values, dim=0, descending=True, stable=True).indices[:k]
    got_values, got_rows = top_k(values, k)
    assert torch.equal(got_rows, order)
    assert torch.equal(got_values, values.gather(0, order))
    per_row = torch.sort(values.T, dim=0, descending=True, stable=True).indices[:k]
    assert torch.equal(top_k(values.T, k)[1], per_row)  # the best entries per row of `values`


def test_top_k_of_float64_and_a_tie_in_some_columns_only() -> None:
    values = torch.randn(50, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    values[:, 2] = 0.0  # one column all tied
    values[[4, 9, 30], 5] = values[:, 5].max() + 1.0  # three tied at the top, k = 2 cuts them
    for k in (2, 3, 5):
        order = torch.sort(values, dim=0, descending=True, stable=True).indices[:k]
        assert torch.equal(top_k(values, k)[1], order)


# -- rank_pass: every chunk size gives the whole-matrix ranking -------------------------------
@pytest.mark.parametrize("kind", ["plain", "ties", "nonfinite"])
@pytest.mark.parametrize(("depth", "top_t2i"), [(1, 1), (5, 3), (12, 1)])
def test_every_chunk_size_gives_the_whole_matrix_ranking(kind, depth, top_t2i) -> None:
    n_text, n_image = 23, 9  # 23 is prime: every chunk size but 1 and 23 leaves a ragged tail
    scores = _scores(n_text, n_image, kind, seed=depth)
    pairs = torch.arange(n_text) % (n_image - 1)  # the last image has no caption
    ref = _reference(scores, pairs, depth, top_t2i, scale=10.0)
    whole = _pass(scores, pairs, n_text, depth=depth, top_t2i=top_t2i, scale=10.0)
    for chunk_size in range(1, n_text + 2):
        got = _pass(scores, pairs, chunk_size, depth=depth, top_t2i=top_t2i, scale=10.0)
        for name in ("t2i_rank", "t2i_top", "i2t_rank", "i2t_top"):
            assert torch.equal(getattr(got, name).long(), ref[name].long()), (name, chunk_size)
        assert torch.equal(got.t2i_confidence, whole.t2i_confidence)  # row by row: exact
        # The i2t normaliser is accumulated over chunks: equal up to rounding.
        torch.testing.assert_close(got.i2t_confidence, whole.i2t_confidence, rtol=1e-12, atol=0)
        for name in ("t2i_confidence", "i2t_confidence"):
            if kind != "nonfinite":  # no finite score at all: uniform, not softmax of -inf
                torch.testing.assert_close(getattr(got, name), ref[name], rtol=1e-10, atol=0)
        assert got.has_caption.tolist() == [True] * (n_image - 1) + [False]


def test_a_budget_picks_the_chunk_and_gives_the_same_ranking() -> None:
    scores, pairs = _scores(200, 30, "ties"), torch.arange(200) % 30
    calls: list[int] = []

    def score_fn(start: int, stop: int) -> torch.Tensor:
        calls.append(stop - start)
        return scores[start:stop]

    budget = 7 * 30 * SCORE_WORK_BYTES + 5  # room for 7 captions
    got = rank_pass(score_fn, 200, 30, pairs, memory_budget=budget)
    assert max(calls) == 7 == chunk_rows(30, budget) and sum(calls) == 200
    whole = _pass(scores, pairs, 200)
    for name in ("t2i_rank", "t2i_top", "i2t_rank", "i2t_top", "t2i_confidence"):
        assert torch.equal(getattr(got, name), getattr(whole, name)), name


def test_chunk_rows() -> None:
    assert chunk_rows(40_000) == DEFAULT_MEMORY_BUDGET // (SCORE_WORK_BYTES * 40_000)
    assert chunk_rows(1000, 64_000, bytes_per_entry=32) == 2
    assert chunk_rows(10**9, 1) == 1  # never 0
    with pytest.raises(ValueError, match="memory_budget"):
        chunk_rows(10, 0)


def test_all_finite() -> None:
    x = torch.ones(4, 5)
    assert all_finite(x) and all_finite(torch.arange(5)) and all_finite(torch.empty(0))
    for value in (NAN, INF, -INF):
        y = x.clone()
        y[2, 3] = value
        assert not all_finite(y)
    assert all_finite(torch.full((4,), 3e38))  # the sum overflows; every entry is finite


# -- evaluate_retrieval: what it allocates ----------------------------------------------------
def _split(n_text: int, n_image: int, dim: int, seed: int = 0) -> SplitTensors:
    g = torch.Generator().manual_seed(seed)
    images = torch.nn.functional.normalize(torch.randn(n_image, dim, generator=g), dim=-1)
    pairs = torch.arange(n_text) % n_image
    texts = images[pairs] + 0.3 * torch.randn(n_text, dim, generator=g)
    return SplitTensors(image_emb=images, text_emb=texts, text_to_image=pairs, split=None)


class _LargestTensor(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the most elements of any tensor an aten op returns."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("method_name", ["clip", "asymvlm-vmf"])
def test_the_largest_allocation_is_one_chunk_of_scores(method_name) -> None:
    n_text, n_image, dim = 900, 400, 8
    data = _split(n_text, n_image, dim)
    torch.manual_seed(0)
    kwargs = {"hidden_dim": 16, "depth": 1} if method_name != "clip" else {}
    method = build_method(method_name, dim, **kwargs)
    budget = 50 * n_image * SCORE_WORK_BYTES  # 50 captions per chunk
    shapes: list[tuple[int, ...]] = []
    score = method.score

    def recording(texts, images, **kw):
        out = score(texts, images, **kw)
        shapes.append(tuple(out.shape))
        return out

    method.score = recording  # type: ignore[method-assign]
    with _LargestTensor() as mode:
        res = evaluate_retrieval(method, data, memory_budget=budget)
    assert shapes and all(s[0] <= 50 and s[1] == n_image for s in shapes)
    assert sum(s[0] for s in shapes) == n_text
    # Nothing larger than one chunk of scores: never n_text x n_image (a 4.5x larger tensor).
    assert mode.largest <= 50 * n_image < n_text * n_image
    method.score = score  # type: ignore[method-assign]
    ref = evaluate_retrieval(method, data, chunk_size=n_text)
    for direction in ("t2i", "i2t"):
        for key in ("recall@1", "recall@5", "recall@10", "binned_recall@1", "auroc", "aurc"):
            assert res[direction][key] == ref[direction][key], (direction, key)
        assert res[direction]["ece"] == pytest.approx(ref[direction]["ece"], abs=1e-12)


@pytest.mark.parametrize("chunk_size", [1, 7, 64, 100, 1000])
def test_chunked_encodings_equal_one_call(chunk_size) -> None:
    torch.manual_seed(0)
    method = build_method("asymvlm-vmf", 8, hidden_dim=16, depth=1).eval()
    x = torch.randn(100, 8)
    with torch.no_grad():
        parts = [method.encode_texts(x[i : i + chunk_size]) for i in range(0, 100, chunk_size)]
        got = _encode_chunked(method.encode_texts, x, chunk_size)
    assert got.keys() == parts[0].keys()
    for key in got:  # written in place: the concatenated parts, bit for bit
        assert torch.equal(got[key], torch.cat([p[key] for p in parts]))
    texts, images = encode_split(method, _split(30, 10, 8))
    assert texts["kappa"].shape == (30,) and images["mu"].shape == (10, 8)
    assert math.isfinite(float(texts["kappa"].sum()))


# -- HierarCaps: the monotone fraction without a loop per caption -----------------------------
def _monotone_by_image(owner, levels, unc) -> tuple[float, int]:
    hits = total = 0
    for image in sorted(set(owner.tolist())):
        rows = np.flatnonzero(owner == image)
        rows = rows[np.argsort(levels[rows], kind="stable")]
        if len(rows) >= 2 and len(set(levels[rows].tolist())) == len(rows):
            total += 1
            hits += bool(np.all(np.diff(unc[rows]) < 0))
    return (hits / total if total else float("nan")), total


def test_monotone_fraction_matches_a_loop_over_images() -> None:
    rng = np.random.default_rng(0)
    for trial in range(200):
        n = int(rng.integers(0, 40))
        owner, levels = rng.integers(0, 8, n), rng.integers(0, 4, n)
        unc = np.round(rng.normal(size=n), 1 if trial % 2 else 6)
        if trial % 3 == 0:  # complete hierarchies, mostly falling
            levels, owner = np.arange(n) % 4, np.arange(n) // 4
            unc = -levels + 0.3 * rng.normal(size=n)
        if trial % 5 == 0 and n:
            unc[rng.integers(0, n)] = np.nan
        got, want = _monotone_fraction(owner, levels, unc), _monotone_by_image(owner, levels, unc)
        assert got[1] == want[1]
        assert got[0] == want[0] or (math.isnan(got[0]) and math.isnan(want[0]))
