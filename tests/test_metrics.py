"""Retrieval metrics: Recall@K both ways, the binned-uncertainty protocol (App. B), RSUM, the
COCO 1K fold averages and their MLflow names; the chunked ranking pass equals the whole-matrix
ranking and its largest tensor is one chunk of scores."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy import stats

from asymvlm.evaluation import evaluate_retrieval
from asymvlm.methods import build_method
from asymvlm.metrics import (
    DEFAULT_MEMORY_BUDGET,
    SCORE_WORK_BYTES,
    Ranking,
    average_folds,
    binned_recall,
    chunk_rows,
    curve_statistics,
    rank_pass,
    retrieval_metrics,
    rsum,
    spearman_uncertainty,
)
from asymvlm.results import retrieval_metric_names
from asymvlm.splits import SplitTensors, load_split

NAN, INF = float("nan"), float("inf")

# 3 images, 6 captions; captions 0,1 -> image 0; 2,3 -> image 1; 4,5 -> image 2.
#
#            img0  img1  img2     t2i ranking         paired  rank  hit@1 hit@2
# c0       [ 0.9,  0.1,  0.0 ]   0, 1, 2              0       0     1     1
# c1       [ 0.2,  0.8,  0.1 ]   1, 0, 2              0       1     0     1
# c2       [ 0.1,  0.7,  0.3 ]   1, 2, 0              1       0     1     1
# c3       [ 0.6,  0.2,  0.5 ]   0, 2, 1              1       2     0     0
# c4       [ 0.0,  0.3,  0.4 ]   2, 1, 0              2       0     1     1
# c5       [ 0.5,  0.4,  0.7 ]   2, 0, 1              2       0     1     1
# t2i: R@1 = 4/6, R@2 = 5/6, R@5 = 6/6.
#
# i2t (columns):
# img0: c0 .9, c3 .6, c5 .5, c1 .2, ...   top1 c0 (img0)            -> rank 0
# img1: c1 .8, c2 .7, c5 .4, ...          top1 c1 (img0), c2 (img1) -> rank 1
# img2: c5 .7, c3 .5, c4 .4, ...          top1 c5 = second caption  -> rank 0
# i2t: R@1 = 2/3, R@2 = 3/3, R@5 = 3/3.
SCORES = torch.tensor(
    [
        [0.9, 0.1, 0.0],
        [0.2, 0.8, 0.1],
        [0.1, 0.7, 0.3],
        [0.6, 0.2, 0.5],
        [0.0, 0.3, 0.4],
        [0.5, 0.4, 0.7],
    ]
)
PAIRS = torch.tensor([0, 0, 1, 1, 2, 2])


def matrix_fn(scores: torch.Tensor):
    def score_fn(start: int, stop: int) -> torch.Tensor:
        return scores[start:stop]

    return score_fn


def run_small(**kwargs):
    kwargs.setdefault("ks", (1, 2, 5))
    return retrieval_metrics(matrix_fn(SCORES), 6, 3, PAIRS, **kwargs)


# -- hand-computed retrieval -------------------------------------------------------------------
def test_hand_computed_recall():
    res = run_small(chunk_size=4)
    assert res["t2i"]["recall@1"] == pytest.approx(4 / 6)
    assert res["t2i"]["recall@2"] == pytest.approx(5 / 6)
    assert res["t2i"]["recall@5"] == pytest.approx(1.0)
    assert res["i2t"]["recall@1"] == pytest.approx(2 / 3)
    assert res["i2t"]["recall@2"] == pytest.approx(1.0)
    assert res["i2t"]["recall@5"] == pytest.approx(1.0)
    for d in ("t2i", "i2t"):
        assert res[d]["binned_recall@1"] is None
        assert res[d]["spearman"] is None
        assert res[d]["r2"] is None
        assert res[d]["uncertainty_source"] is None
        assert all(isinstance(res[d][f"recall@{k}"], float) for k in (1, 2, 5))
    json.dumps(res)


def test_default_ks_keys():
    res = retrieval_metrics(matrix_fn(SCORES), 6, 3, PAIRS)
    assert {"recall@10", "spearman", "fpr@95tpr", "e_aurc", "risk_coverage"} <= set(res["t2i"])
    assert res["rsum"] == pytest.approx(100 * (4 / 6 + 1 + 1 + 2 / 3 + 1 + 1))
    # k larger than the gallery: everything is a hit
    assert res["t2i"]["recall@10"] == 1.0
    assert res["i2t"]["recall@10"] == 1.0


def test_bad_input_raises():
    with pytest.raises(ValueError, match="shape"):
        retrieval_metrics(lambda a, b: torch.zeros(b - a, 2), 6, 3, PAIRS)
    with pytest.raises(ValueError, match="bins"):
        run_small(text_uncertainty=TEXT_UNC, n_bins=4)  # i2t has 3 images < 4 bins
    with pytest.raises(ValueError):
        binned_recall(torch.ones(3), torch.ones(4), 2)


# -- uncertainty sources -----------------------------------------------------------------------
TEXT_UNC = torch.tensor([0.5, 0.1, 0.9, 0.3, 0.2, 0.7])


def test_text_uncertainty_binning():
    res = run_small(text_uncertainty=TEXT_UNC, n_bins=3)
    # t2i hits@1 [1,0,1,0,1,1]; sorted by own uncertainty:
    # c1 .1 (0), c4 .2 (1) | c3 .3 (0), c0 .5 (1) | c5 .7 (1), c2 .9 (1) -> [.5, .5, 1]
    assert res["t2i"]["uncertainty_source"] == "text"
    assert res["t2i"]["binned_recall@1"] == [0.5, 0.5, 1.0]
    rho, r2 = res["t2i"]["spearman"], res["t2i"]["r2"]
    assert rho == pytest.approx(stats.spearmanr([0, 1, 2], [0.5, 0.5, 1.0]).statistic)
    assert r2 == pytest.approx(0.75)  # x=[0,1,2], y=[.5,.5,1]: sxy=.5, sxx=2, syy=1/6


def test_i2t_uses_retrieved_caption_uncertainty():
    res = run_small(text_uncertainty=TEXT_UNC, n_bins=3)
    # Top-1 retrieved captions: img0 -> c0 (.5), img1 -> c1 (.1), img2 -> c5 (.7).
    # i2t hits@1 [1, 0, 1]; order img1, img0, img2 -> [0, 1, 1].
    # (The images' own first captions c0 .5, c2 .9, c4 .2 would give [1, 1, 0] instead.)
    assert res["i2t"]["uncertainty_source"] == "retrieved_text"
    assert res["i2t"]["binned_recall@1"] == [0.0, 1.0, 1.0]
    both = run_small(text_uncertainty=TEXT_UNC, image_uncertainty=torch.zeros(3), n_bins=3)
    assert both["i2t"] == res["i2t"]  # the text's uncertainty takes precedence
    # y = [0, 1, 1]: Spearman = sqrt(3)/2, R^2 = 0.75 (sxy = 1, sxx = 2, syy = 2/3)
    assert res["i2t"]["spearman"] == pytest.approx(np.sqrt(3) / 2)
    assert res["i2t"]["r2"] == pytest.approx(0.75)


def test_image_uncertainty_fallbacks():
    # 2 images; c0, c1 -> img0; c2, c3 -> img1.
    #        img0 img1   top1  hit@1
    # c0   [ .9,  .1 ]   0     1
    # c1   [ .2,  .8 ]   1     0
    # c2   [ .3,  .7 ]   1     1
    # c3   [ .1,  .6 ]   1     1
    scores = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.3, 0.7], [0.1, 0.6]])
    pairs = torch.tensor([0, 0, 1, 1])
    img_unc = torch.tensor([0.9, 0.1])
    res = retrieval_metrics(
        matrix_fn(scores), 4, 2, pairs, image_uncertainty=img_unc, ks=(1,), n_bins=2
    )
    # t2i: retrieved-image uncertainties [.9, .1, .1, .1] -> stable order c1, c2, c3, c0
    # -> hits 0, 1 | 1, 1 -> [.5, 1]. (The paired image's uncertainty [.9, .9, .1, .1] would
    # give order c2, c3, c0, c1 -> [1, .5].)
    assert res["t2i"]["uncertainty_source"] == "retrieved_image"
    assert res["t2i"]["binned_recall@1"] == [0.5, 1.0]
    assert res["t2i"]["spearman"] == pytest.approx(1.0)
    assert res["t2i"]["r2"] == pytest.approx(1.0)
    # i2t: img0 column top c0 (hit); img1 column top c1 (img0, miss) -> hits [1, 0].
    # own uncertainty order img1 (.1), img0 (.9) -> [0, 1]
    assert res["i2t"]["uncertainty_source"] == "image"
    assert res["i2t"]["binned_recall@1"] == [0.0, 1.0]
    assert res["i2t"]["recall@1"] == pytest.approx(0.5)


def test_constant_curve_gives_none_and_is_json():
    # all hits -> constant binned curve -> spearman/r2 None
    scores = torch.eye(3).repeat_interleave(2, dim=0)
    res = retrieval_metrics(
        matrix_fn(scores), 6, 3, PAIRS, text_uncertainty=TEXT_UNC, n_bins=3, ks=(1,)
    )
    assert res["t2i"]["binned_recall@1"] == [1.0, 1.0, 1.0]
    assert res["t2i"]["spearman"] is None
    assert res["t2i"]["r2"] is None
    assert "NaN" not in json.dumps(res)


# -- binned_recall / curve_statistics / spearman_uncertainty -----------------------------------
def test_binned_recall_drops_the_most_uncertain_remainder_and_keeps_ties_in_order():
    unc = torch.arange(22, dtype=torch.float32).flip(0)  # 22 items in 4 bins of 5
    hits = torch.zeros(22)
    hits[0] = hits[1] = 1.0  # the two most uncertain: dropped
    hits[21] = 1.0  # the least uncertain: bin 0
    assert binned_recall(hits, unc, 4) == pytest.approx([0.2, 0.0, 0.0, 0.0])
    # All uncertainties equal: the stable order is the original item order.
    hits = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    assert binned_recall(hits, torch.zeros(6), 3) == pytest.approx([1.0, 0.0, 0.5])
    # Partial ties: items 1 and 4 share .2; 1 comes first.
    unc = torch.tensor([0.1, 0.2, 0.9, 0.8, 0.2, 0.7])
    hits = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    # order 0, 1, 4, 5, 3, 2 -> hits 1, 0, 1, 0, 1, 0 (bins of 1)
    assert binned_recall(hits, unc, 6) == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]


def test_curve_statistics():
    assert curve_statistics([0.9 - 0.05 * i for i in range(10)]) == pytest.approx((-1.0, 1.0))
    assert curve_statistics([0.1, 0.2, 0.3]) == pytest.approx((1.0, 1.0))
    for undefined in ([0.5] * 10, [0.5], [0.1, float("nan"), 0.3]):
        assert curve_statistics(undefined) == (None, None)
    y = np.random.default_rng(1).random(10)
    rho, r2 = curve_statistics(list(y))
    assert rho == pytest.approx(stats.spearmanr(np.arange(10), y).statistic)
    assert r2 == pytest.approx(stats.linregress(np.arange(10), y).rvalue ** 2)


def test_spearman_uncertainty():
    u = torch.tensor([0.1, 0.4, 0.2, 0.9])
    assert spearman_uncertainty(u, [1, 3, 2, 4]) == pytest.approx(1.0)
    assert spearman_uncertainty(u.numpy(), torch.tensor([4, 2, 3, 1])) == pytest.approx(-1.0)
    rng = np.random.default_rng(2)
    a, b = rng.random(50), rng.random(50)
    assert spearman_uncertainty(a, b) == pytest.approx(stats.spearmanr(a, b).statistic)
    with pytest.raises(ValueError):
        spearman_uncertainty(a, b[:10])


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


# -- rank_pass: every chunk size gives the whole-matrix ranking -------------------------------
@pytest.mark.parametrize("kind", ["plain", "ties", "nonfinite"])
@pytest.mark.parametrize(("depth", "top_t2i"), [(5, 3), (12, 1)])
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
    assert chunk_rows(40_000) == DEFAULT_MEMORY_BUDGET // (SCORE_WORK_BYTES * 40_000)
    assert chunk_rows(10**9, 1) == 1  # never 0
    with pytest.raises(ValueError, match="memory_budget"):
        chunk_rows(10, 0)


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


def test_the_largest_allocation_is_one_chunk_of_scores() -> None:
    n_text, n_image, dim = 900, 400, 8
    data = _split(n_text, n_image, dim)
    torch.manual_seed(0)
    method = build_method("asymvlm-vmf", dim, hidden_dim=16, depth=1)
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


# -- RSUM and folds -----------------------------------------------------------------------------
def test_rsum() -> None:
    res = retrieval_metrics(matrix_fn(SCORES), 6, 3, PAIRS, ks=(1, 2, 5, 10))
    recalls = [res[d][f"recall@{k}"] for d in ("t2i", "i2t") for k in (1, 5, 10)]
    assert res["rsum"] == pytest.approx(100 * sum(recalls))
    assert retrieval_metrics(matrix_fn(SCORES), 6, 3, PAIRS, ks=(1, 5))["rsum"] is None
    assert rsum({"t2i": {"recall@1": 0.5, "recall@5": 1, "recall@10": 1}}) is None


def test_folds_average_the_metrics_of_consecutive_images(small_world) -> None:
    data = load_split(small_world, "test")  # 60 images, 3 captions each
    res = evaluate_retrieval(build_method("clip", data.dim), data, fold_size=20)
    folds = res["folds_20"]
    text, image = (
        torch.nn.functional.normalize(x, dim=-1) for x in (data.text_emb, data.image_emb)
    )
    per_fold = []
    for start in range(0, 60, 20):
        rows = torch.nonzero((data.text_to_image >= start) & (data.text_to_image < start + 20))
        rows = rows[:, 0]
        scores = text[rows] @ image[start : start + 20].T
        per_fold.append(
            retrieval_metrics(matrix_fn(scores), len(rows), 20, data.text_to_image[rows] - start)
        )
    assert folds["n_folds"] == 3 and folds["fold_size"] == 20
    for direction in ("t2i", "i2t"):
        for key in ("recall@1", "recall@5", "recall@10", "ece"):
            expected = np.mean([f[direction][key] for f in per_fold])
            assert folds[direction][key] == pytest.approx(expected, abs=1e-6), (direction, key)
        assert folds[direction]["spearman"] is None  # the frozen model has no uncertainty
        assert "binned_recall@1" not in folds[direction]
    assert folds["rsum"] == pytest.approx(rsum(folds))
    names = retrieval_metric_names(res, prefix="val_")
    assert names["val_folds20_t2i_recall_at_1"] == folds["t2i"]["recall@1"]
    assert names["val_folds20_rsum"] == folds["rsum"]


def test_average_folds_leaves_undefined_means_undefined() -> None:
    a = {"t2i": {"recall@1": 0.2, "auroc": 0.6, "risk_coverage": {}}, "i2t": {"recall@1": 0.4}}
    b = {"t2i": {"recall@1": 0.4, "auroc": None, "risk_coverage": {}}, "i2t": {"recall@1": 0.6}}
    out = average_folds([a, b])
    assert out["t2i"] == {"recall@1": pytest.approx(0.3), "auroc": None}
    assert out["i2t"] == {"recall@1": pytest.approx(0.5)} and out["n_folds"] == 2


# -- MLflow names -------------------------------------------------------------------------------
def test_metric_names_flatten_every_scalar_and_leave_undefined_out() -> None:
    res = retrieval_metrics(
        matrix_fn(SCORES), 6, 3, PAIRS, n_bins=2, text_uncertainty=torch.arange(6.0)
    )
    names = retrieval_metric_names(res)
    mlflow = {"recall@1": "recall_at_1", "fpr@95tpr": "fpr_at_95tpr"}
    for direction in ("t2i", "i2t"):
        for key, value in res[direction].items():
            name = f"{direction}_{mlflow.get(key, key).replace('@', '_at_')}"
            if value is None or not isinstance(value, float):  # undefined, curves, names
                assert name not in names
            else:
                assert names[name] == value
    assert names["rsum"] == res["rsum"] and "t2i_aupr" in names and "i2t_spearman" in names
    assert all(isinstance(v, float) for v in names.values())


# -- the command line -------------------------------------------------------------------------
def test_evaluate_cli_writes_the_new_keys(small_world, tmp_path, capsys) -> None:
    from asymvlm.checkpoints import save_checkpoint
    from asymvlm.cli import main
    from asymvlm.training import TrainConfig

    ckpt = str(tmp_path / "ckpt")
    method = build_method("asymvlm-vmf", 16, hidden_dim=16)
    save_checkpoint(ckpt, method, TrainConfig(method="asymvlm-vmf", hidden_dim=16), 16)
    args = [
        "evaluate",
        "--embeddings",
        small_world,
        "--split",
        "test",
        "--checkpoint",
        ckpt,
        "--quiet",
        "--output",
    ]
    out = str(tmp_path / "m.json")
    assert main([*args, out, "--fold-size", "20"]) == 0
    res = json.loads(open(out).read())
    for direction in ("t2i", "i2t"):
        assert 0.0 <= res[direction]["ece"] <= 1.0
        assert len(res[direction]["risk_coverage"]["risk"]) == 20
    assert res["rsum"] == pytest.approx(rsum(res))
    assert res["folds_20"]["n_folds"] == 3 and "eccv" not in res  # a synthetic table
    capsys.readouterr()
    assert main([*args, str(tmp_path / "bad.json"), "--fold-size", "7"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fold size 7" in err[0] and "60 images" in err[0]
    assert not (tmp_path / "bad.json").exists()
