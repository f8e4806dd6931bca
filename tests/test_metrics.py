"""Retrieval metrics: Recall@K both ways, the binned-uncertainty protocol (App. B), RSUM, the
COCO 1K fold averages and their MLflow names."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy import stats

from asymvlm.errors import ConfigError
from asymvlm.evaluation import evaluate_retrieval
from asymvlm.methods import build_method
from asymvlm.metrics import (
    average_folds,
    binned_recall,
    curve_statistics,
    retrieval_metrics,
    rsum,
    spearman_uncertainty,
)
from asymvlm.results import retrieval_metric_names
from asymvlm.splits import SplitTensors

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


# --------------------------------------------------------------------------------------------
# Hand-computed retrieval
# --------------------------------------------------------------------------------------------


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
    assert set(res["t2i"]) == {
        "recall@1",
        "recall@5",
        "recall@10",
        "binned_recall@1",
        "spearman",
        "r2",
        "auroc",
        "aupr",
        "fpr@95tpr",
        "aurc",
        "e_aurc",
        "ece",
        "risk_coverage",
        "uncertainty_source",
    }
    assert res["rsum"] == pytest.approx(100 * (4 / 6 + 1 + 1 + 2 / 3 + 1 + 1))
    # k larger than the gallery: everything is a hit
    assert res["t2i"]["recall@10"] == 1.0
    assert res["i2t"]["recall@10"] == 1.0


def test_i2t_hit_through_second_caption_only():
    # 2 images, captions 0,1 -> img0, 2,3 -> img1. For img1 its first caption (c2) is the
    # worst-scoring caption of the column; only its second caption (c3) ranks first.
    scores = torch.tensor(
        [
            [0.9, 0.5],  # c0
            [0.8, 0.4],  # c1
            [0.1, 0.0],  # c2 (img1, but lowest for img1)
            [0.2, 0.9],  # c3 (img1) top for img1
        ]
    )
    pairs = torch.tensor([0, 0, 1, 1])
    res = retrieval_metrics(matrix_fn(scores), 4, 2, pairs, ks=(1, 2))
    # img0 column: c0 top -> hit; img1 column: c3 top -> hit.
    assert res["i2t"]["recall@1"] == 1.0
    # Now make c3 only second-best for img1: c0 .95 > c3 .9 > c1 .4 > c2 .0
    scores[0, 1] = 0.95
    res = retrieval_metrics(matrix_fn(scores), 4, 2, pairs, ks=(1, 2))
    assert res["i2t"]["recall@1"] == pytest.approx(0.5)
    assert res["i2t"]["recall@2"] == pytest.approx(1.0)


def test_image_without_caption_excluded_from_i2t():
    # Add image 3 with no caption; it scores highest for caption 0 in t2i.
    extra = torch.tensor([[0.95], [0.0], [0.0], [0.0], [0.0], [0.0]])
    scores = torch.cat([SCORES, extra], dim=1)
    res = retrieval_metrics(matrix_fn(scores), 6, 4, PAIRS, ks=(1, 2), chunk_size=2)
    # t2i: c0 now ranks img3 first -> miss@1, hit@2 => R@1 = 3/6, R@2 = 5/6
    assert res["t2i"]["recall@1"] == pytest.approx(3 / 6)
    assert res["t2i"]["recall@2"] == pytest.approx(5 / 6)
    # i2t over the 3 captioned images only (unchanged from the small case).
    assert res["i2t"]["recall@1"] == pytest.approx(2 / 3)
    # image uncertainty source: only captioned images are binned (3 items, 3 bins)
    res = retrieval_metrics(
        matrix_fn(scores),
        6,
        4,
        PAIRS,
        image_uncertainty=torch.tensor([0.3, 0.1, 0.5, 0.0]),
        ks=(1,),
        n_bins=3,
    )
    # i2t hits@1 [1, 0, 1] sorted by [0.3, 0.1, 0.5] -> img1, img0, img2 -> [0, 1, 1]
    assert res["i2t"]["binned_recall@1"] == [0.0, 1.0, 1.0]


def test_bad_input_raises():
    with pytest.raises(ValueError, match="shape"):
        retrieval_metrics(lambda a, b: torch.zeros(b - a, 2), 6, 3, PAIRS)
    with pytest.raises(ValueError, match="bins"):
        run_small(text_uncertainty=TEXT_UNC, n_bins=4)  # i2t has 3 images < 4 bins
    with pytest.raises(ValueError):
        binned_recall(torch.ones(3), torch.ones(4), 2)


# --------------------------------------------------------------------------------------------
# Uncertainty sources
# --------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------
# binned_recall / curve_statistics / spearman_uncertainty
# --------------------------------------------------------------------------------------------


def test_binned_recall_hand_example():
    # 20 items, uncertainty = a permutation; hits defined on the sorted order.
    sorted_hits = torch.tensor([1, 1, 1, 1, 1, 1, 1, 0, 1, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0])
    # bins of 5: [5/5, 3/5, 2/5, 0/5]
    perm = torch.randperm(20, generator=torch.Generator().manual_seed(0))
    unc = torch.empty(20)
    hits = torch.empty(20, dtype=torch.bool)
    unc[perm] = torch.arange(20, dtype=torch.float32)
    hits[perm] = sorted_hits.bool()
    assert binned_recall(hits, unc, 4) == pytest.approx([1.0, 0.6, 0.4, 0.0])
    assert binned_recall(hits.float(), unc, 4) == pytest.approx([1.0, 0.6, 0.4, 0.0])


def test_binned_recall_drops_highest_uncertainty_remainder():
    # 22 items, 4 bins -> size 5, the 2 most uncertain items are dropped.
    unc = torch.arange(22, dtype=torch.float32).flip(0)  # item i has uncertainty 21 - i
    hits = torch.zeros(22)
    hits[0] = hits[1] = 1.0  # the two most uncertain -> dropped
    hits[21] = 1.0  # least uncertain -> bin 0
    assert binned_recall(hits, unc, 4) == pytest.approx([0.2, 0.0, 0.0, 0.0])


def test_binned_recall_stable_ties():
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


# --------------------------------------------------------------------------------------------
# Chunking invariance vs a brute-force reference, and the memory bound
# --------------------------------------------------------------------------------------------


def brute_force(scores, pairs, ks, text_unc, n_bins):
    """Full-matrix reference; ties broken by lower index (stable sorts)."""
    n_text, n_image = scores.shape
    s = scores.numpy().astype(np.float64)
    p = pairs.numpy()
    # t2i
    order = np.argsort(-s, axis=1, kind="stable")
    t2i_rank = np.array([int(np.nonzero(order[m] == p[m])[0][0]) for m in range(n_text)])
    # i2t
    col_order = np.argsort(-s, axis=0, kind="stable")  # [n_text, n_image]
    captioned = [n for n in range(n_image) if np.any(p == n)]
    i2t_rank = np.array([int(np.nonzero(p[col_order[:, n]] == n)[0][0]) for n in captioned])
    out = {"t2i": {}, "i2t": {}}
    for k in ks:
        out["t2i"][f"recall@{k}"] = float(np.mean(t2i_rank < k))
        out["i2t"][f"recall@{k}"] = float(np.mean(i2t_rank < k))
    u = text_unc.numpy()
    i2t_unc = u[col_order[0, captioned]]
    for d, rank, unc in (("t2i", t2i_rank, u), ("i2t", i2t_rank, i2t_unc)):
        srt = np.argsort(unc, kind="stable")
        size = len(rank) // n_bins
        hits = (rank == 0)[srt][: size * n_bins].reshape(n_bins, size)
        out[d]["binned_recall@1"] = list(hits.mean(axis=1))
    return out


@pytest.mark.parametrize("quantize", [False, True])
def test_chunking_invariance_matches_brute_force(quantize):
    g = torch.Generator().manual_seed(123)
    n_text, n_image = 300, 70
    pairs = torch.randint(0, n_image - 3, (n_text,), generator=g)  # last images uncaptioned
    pairs[: n_image - 3] = torch.arange(n_image - 3)
    scores = torch.randn(n_text, n_image, generator=g)
    scores[torch.arange(n_text), pairs] += 1.5  # make retrieval non-trivial
    if quantize:  # many exact ties
        scores = (scores * 2).round() / 2
    text_unc = torch.rand(n_text, generator=g)
    ks = (1, 5, 10)
    ref = brute_force(scores, pairs, ks, text_unc, 10)
    results = []
    for chunk_size in (1, 7, 64, 1000):
        res = retrieval_metrics(
            matrix_fn(scores),
            n_text,
            n_image,
            pairs,
            text_uncertainty=text_unc,
            ks=ks,
            chunk_size=chunk_size,
        )
        for d in ("t2i", "i2t"):
            for k in ks:
                assert res[d][f"recall@{k}"] == pytest.approx(ref[d][f"recall@{k}"], abs=1e-12)
            assert res[d]["binned_recall@1"] == pytest.approx(ref[d]["binned_recall@1"])
        results.append(res)
    # Identical for every chunk size, up to float rounding of the i2t softmax normaliser that
    # is accumulated across chunks (which moves tied confidences that sit exactly on a bin edge,
    # e.g. 1/3, between bins: only checked without ties).
    eces = [[r[d].pop("ece") for d in ("t2i", "i2t")] for r in results]
    if not quantize:
        assert all(e == pytest.approx(eces[0], abs=1e-12) for e in eces[1:])
    assert all(r == results[0] for r in results[1:])
    # sanity: the reference is not degenerate
    assert 0.0 < ref["t2i"]["recall@1"] < ref["t2i"]["recall@10"] <= 1.0
    assert 0.0 < ref["i2t"]["recall@1"] < 1.0


def test_memory_bound():
    n_text, n_image, chunk = 1000, 600, 64
    pairs = torch.arange(n_text) % n_image
    seen = []

    def score_fn(start, stop):
        seen.append((start, stop))
        g = torch.Generator().manual_seed(start)
        s = torch.rand(stop - start, n_image, generator=g)
        s[torch.arange(stop - start), pairs[start:stop]] += 0.999  # paired nearly always best
        return s

    res = retrieval_metrics(
        score_fn, n_text, n_image, pairs, text_uncertainty=torch.rand(n_text), chunk_size=chunk
    )
    assert seen == [(a, min(a + chunk, n_text)) for a in range(0, n_text, chunk)]
    assert res["t2i"]["recall@1"] > 0.99 and res["i2t"]["recall@1"] > 0.99
    assert len(res["t2i"]["binned_recall@1"]) == 10


# -- RSUM and folds -----------------------------------------------------------------------------
def test_rsum() -> None:
    res = retrieval_metrics(matrix_fn(SCORES), 6, 3, PAIRS, ks=(1, 2, 5, 10))
    recalls = [res[d][f"recall@{k}"] for d in ("t2i", "i2t") for k in (1, 5, 10)]
    assert res["rsum"] == pytest.approx(100 * sum(recalls))
    assert retrieval_metrics(matrix_fn(SCORES), 6, 3, PAIRS, ks=(1, 5))["rsum"] is None
    assert rsum({"t2i": {"recall@1": 0.5, "recall@5": 1, "recall@10": 1}}) is None


def _toy(n_image: int = 40, per_image: int = 2, seed: int = 0) -> SplitTensors:
    g = torch.Generator().manual_seed(seed)
    images = torch.nn.functional.normalize(torch.randn(n_image, 8, generator=g), dim=-1)
    t2i = torch.randperm(n_image * per_image, generator=g) % n_image
    texts = images[t2i] + 0.6 * torch.randn(len(t2i), 8, generator=g)
    return SplitTensors(image_emb=images, text_emb=texts, text_to_image=t2i, split=None)


def test_folds_average_the_metrics_of_consecutive_images() -> None:
    data = _toy()
    method = build_method("clip", 8)
    res = evaluate_retrieval(method, data, fold_size=10, ks=(1, 5, 10))
    folds = res["folds_10"]
    unit = torch.nn.functional.normalize(data.text_emb, dim=-1)
    per_fold = []
    for start in range(0, 40, 10):
        rows = torch.nonzero((data.text_to_image >= start) & (data.text_to_image < start + 10))
        rows = rows[:, 0]
        scores = unit[rows] @ data.image_emb[start : start + 10].T
        per_fold.append(
            retrieval_metrics(matrix_fn(scores), len(rows), 10, data.text_to_image[rows] - start)
        )
    assert folds["n_folds"] == 4 and folds["fold_size"] == 10
    for direction in ("t2i", "i2t"):
        for key in ("recall@1", "recall@5", "recall@10", "ece"):
            expected = np.mean([f[direction][key] for f in per_fold])
            assert folds[direction][key] == pytest.approx(expected, abs=1e-6), (direction, key)
        assert folds[direction]["spearman"] is None  # the frozen model has no uncertainty
        assert "binned_recall@1" not in folds[direction]
    assert folds["rsum"] == pytest.approx(rsum(folds))
    assert folds["t2i"]["recall@1"] > res["t2i"]["recall@1"]  # 10 images are easier than 40
    names = retrieval_metric_names(res, prefix="val_")
    assert names["val_folds10_t2i_recall_at_1"] == folds["t2i"]["recall@1"]
    assert names["val_folds10_rsum"] == folds["rsum"]


def test_folds_of_1000_are_coco_1k() -> None:
    res = evaluate_retrieval(build_method("clip", 8), _toy(2000, 1), fold_size=1000)
    assert res["coco_1k"]["n_folds"] == 2 and "folds_1000" not in res
    names = retrieval_metric_names(res)
    assert names["coco1k_i2t_recall_at_5"] == res["coco_1k"]["i2t"]["recall@5"]


def test_a_fold_size_that_does_not_divide_the_images_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="40 images, not a multiple of it"):
        evaluate_retrieval(build_method("clip", 8), _toy(), fold_size=7)
    with pytest.raises(ConfigError):
        evaluate_retrieval(build_method("clip", 8), _toy(), fold_size=0)


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
