"""Retrieval metrics, and the chunked ranking equal to the whole-matrix one."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy import stats

from asymvlm.evaluation import evaluate_retrieval
from asymvlm.methods import build_method
from asymvlm.methods.base import unit
from asymvlm.metrics import (
    DEFAULT_MEMORY_BUDGET,
    SCORE_WORK_BYTES,
    binned_recall,
    chunk_rows,
    curve_statistics,
    distinct_levels,
    rank_pass,
    rsum,
    spearman_uncertainty,
)
from asymvlm.metrics.glossary import retrieval_metric_names
from asymvlm.metrics.uncertainty import aurc, error_aupr, error_auroc, fpr_at_tpr, risk_coverage
from asymvlm.metrics.uncertainty import expected_calibration_error as ece
from asymvlm.splits import SplitTensors, load_split
from tests.helpers import PAIRS, SCORES, retrieval

NAN, INF = float("nan"), float("inf")

TEXT_UNC = torch.tensor([0.5, 0.1, 0.9, 0.3, 0.2, 0.7])


def test_hand_computed_recall_and_rsum():
    res = retrieval(chunk_size=4)
    recalls = [res[d][f"recall@{k}"] for d in ("t2i", "i2t") for k in (1, 2, 5)]
    assert recalls == pytest.approx([4 / 6, 5 / 6, 1, 2 / 3, 1, 1])
    for d in ("t2i", "i2t"):
        for key in ("binned_recall@1", "spearman", "auroc", "risk_coverage", "uncertainty_source"):
            assert res[d][key] is None
    assert res["rsum"] is None  # no R@10
    res = retrieval(ks=(1, 5, 10))  # K beyond the gallery: every query hits
    assert res["t2i"]["recall@10"] == res["i2t"]["recall@10"] == 1.0
    assert res["rsum"] == pytest.approx(100 * (4 / 6 + 1 + 1 + 2 / 3 + 1 + 1)) == rsum(res)


def test_captions_bin_t2i_by_their_own_and_i2t_by_the_retrieved_captions_uncertainty():
    res = retrieval(text_uncertainty=TEXT_UNC, n_bins=3)
    # t2i hits@1 [1,0,1,0,1,1]; sorted by own uncertainty:
    # c1 .1 (0), c4 .2 (1) | c3 .3 (0), c0 .5 (1) | c5 .7 (1), c2 .9 (1) -> [.5, .5, 1]
    assert res["t2i"]["uncertainty_source"] == "text"
    assert res["t2i"]["binned_recall@1"] == [0.5, 0.5, 1.0]
    assert res["t2i"]["spearman"] == pytest.approx(stats.spearmanr([0, 1, 2], [1, 1, 2])[0])
    assert res["t2i"]["r2"] == pytest.approx(0.75)  # sxy=.5, sxx=2, syy=1/6
    # Top-1 retrieved captions: img0 -> c0 (.5), img1 -> c1 (.1), img2 -> c5 (.7).
    # i2t hits@1 [1, 0, 1]; order img1, img0, img2 -> [0, 1, 1]. (The images' own first
    # captions c0 .5, c2 .9, c4 .2 would give [1, 1, 0] instead.)
    assert res["i2t"]["uncertainty_source"] == "retrieved_text"
    assert res["i2t"]["binned_recall@1"] == [0.0, 1.0, 1.0]
    assert res["i2t"]["spearman"] == pytest.approx(np.sqrt(3) / 2)
    both = retrieval(text_uncertainty=TEXT_UNC, image_uncertainty=torch.zeros(3), n_bins=3)
    assert both["i2t"] == res["i2t"]  # the text's uncertainty takes precedence


def test_image_uncertainty_bins_t2i_by_the_retrieved_image():
    # 2 images; c0, c1 -> img0; c2, c3 -> img1. t2i top-1: 0, 1, 1, 1; hits 1, 0, 1, 1.
    scores = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.3, 0.7], [0.1, 0.6]])
    res = retrieval(
        scores, torch.tensor([0, 0, 1, 1]), image_uncertainty=torch.tensor([0.9, 0.1]), n_bins=2
    )
    # t2i: retrieved-image uncertainties [.9, .1, .1, .1] -> stable order c1, c2, c3, c0
    # -> hits 0, 1 | 1, 1 -> [.5, 1] (the paired image's would give [1, .5]).
    assert res["t2i"]["uncertainty_source"] == "retrieved_image"
    assert res["t2i"]["binned_recall@1"] == [0.5, 1.0] and res["t2i"]["r2"] == pytest.approx(1)
    # i2t: img0's top c0 (hit), img1's top c1 (miss); own uncertainty order img1, img0.
    assert res["i2t"]["uncertainty_source"] == "image"
    assert res["i2t"]["binned_recall@1"] == [0.0, 1.0]


def test_a_constant_curve_or_uncertainty_has_no_statistics():
    hits = torch.eye(3).repeat_interleave(2, dim=0)
    all_hits = retrieval(hits, text_uncertainty=TEXT_UNC, n_bins=3)
    assert all_hits["t2i"]["binned_recall@1"] == [1.0, 1.0, 1.0]
    assert all_hits["t2i"]["spearman"] is None and all_hits["t2i"]["r2"] is None
    assert "NaN" not in json.dumps(all_hits)
    undefined = ("binned_recall@1", "spearman", "r2", "auroc", "aupr", "fpr@95tpr", "aurc")
    undefined += ("e_aurc", "risk_coverage", "uncertainty_source")
    # A constant uncertainty, exactly or up to float noise, and one of 2 levels for 3 bins.
    noisy = 0.25 + 1e-9 * torch.randn(6, generator=torch.Generator().manual_seed(0))
    plain = retrieval()
    for unc in (torch.ones(6), noisy, torch.tensor([0.1, 0.1, 0.1, 0.9, 0.9, 0.9])):
        blind = retrieval(text_uncertainty=unc, n_bins=3)
        for d in ("t2i", "i2t"):
            assert {k: blind[d][k] for k in undefined} == dict.fromkeys(undefined)
            assert blind[d]["recall@1"] == plain[d]["recall@1"] and blind[d]["ece"] is not None
        assert retrieval_metric_names(blind).keys() == retrieval_metric_names(plain).keys()
    assert [distinct_levels(u) for u in (torch.ones(6), noisy, TEXT_UNC)] == [1, 1, 6]
    assert distinct_levels(torch.tensor([0.0, NAN, INF])) == 1


def test_binned_recall_drops_the_most_uncertain_remainder_and_keeps_ties_in_order():
    unc = torch.arange(22, dtype=torch.float32).flip(0)  # 22 items in 4 bins of 5
    hits = torch.zeros(22)
    hits[0] = hits[1] = 1.0  # the two most uncertain: dropped
    hits[21] = 1.0  # the least uncertain: bin 0
    assert binned_recall(hits, unc, 4) == pytest.approx([0.2, 0.0, 0.0, 0.0])
    hits = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    # Items 1 and 4 share .2; 1 comes first: order 0, 1, 4, 5, 3, 2.
    unc = torch.tensor([0.1, 0.2, 0.9, 0.8, 0.2, 0.7])
    assert binned_recall(hits, unc, 6) == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="bins"):
        binned_recall(hits, unc, 7)


def test_curve_statistics_and_spearman():
    for undefined in ([0.5] * 10, [0.5], [0.1, NAN, 0.3]):
        assert curve_statistics(undefined) == (None, None)
    y = np.random.default_rng(1).random(10)
    rho, r2 = curve_statistics(list(y))
    assert rho == pytest.approx(stats.spearmanr(np.arange(10), y).statistic)
    assert r2 == pytest.approx(stats.linregress(np.arange(10), y).rvalue ** 2)
    u = torch.tensor([0.1, 0.4, 0.2, 0.9])
    assert spearman_uncertainty(u.numpy(), torch.tensor([4, 2, 3, 1])) == pytest.approx(-1.0)
    assert spearman_uncertainty(torch.ones(4), [4, 2, 3, 1]) is None  # constant: undefined
    with pytest.raises(ValueError):
        spearman_uncertainty(u, [1, 2])


# -- failure prediction, selective risk, calibration ------------------------------------------
def test_detectors_by_hand() -> None:
    unc = [0.1, 0.2, 0.3, 0.4]
    assert error_auroc([0.5, 0.5, 0.5], [True, False, False]) == 0.5  # ties count half
    # Flagged from the most uncertain down: e, ok, e, ok -> AP = 1/2 * 1 + 1/2 * 2/3.
    assert error_aupr([0.9, 0.8, 0.7, 0.1], [1, 0, 1, 0]) == pytest.approx(0.5 + 1 / 3)
    assert error_aupr([0.5, 0.5], [1, 0]) == pytest.approx(0.5)  # ties flagged together
    # 20 errors at 1..20, 10 hits at 0.5, 5.5, ...: flagging 19 errors flags 9 of 10 hits.
    u = np.r_[np.arange(1.0, 21.0), np.arange(10) * 5.0 + 0.5]
    assert fpr_at_tpr(u, np.r_[np.ones(20), np.zeros(10)]) == pytest.approx(0.9)
    for detector in (error_auroc, error_aupr, fpr_at_tpr):  # nothing to detect
        assert detector(unc, [False] * 4) is None and detector(unc, [True] * 4) is None


def test_aurc_and_risk_coverage_by_hand() -> None:
    unc = [0.1, 0.2, 0.3, 0.4]
    assert aurc(unc, [0, 0, 1, 1]) == pytest.approx(((0 + 0 + 1 / 3 + 2 / 4) / 4, 0.0))
    value, excess = aurc(unc, [1, 1, 0, 0])  # the worst order
    assert value == pytest.approx((1 + 1 + 2 / 3 + 2 / 4) / 4)
    assert excess == pytest.approx(value - (1 / 3 + 2 / 4) / 4)
    curve = risk_coverage(unc, [0, 1, 0, 1], n_points=4)
    assert curve == {"coverage": [0.25, 0.5, 0.75, 1.0], "risk": [0.0, 0.5, 1 / 3, 0.5]}
    assert risk_coverage([0.0, 0.0], [1, 0], n_points=2)["risk"] == [1.0, 0.5]  # ties: as given
    err = np.arange(45) % 3 == 0
    assert risk_coverage(np.arange(45.0), err)["risk"][0] == 1 / 3  # ceil(45 / 20) = 3 kept


def test_ece_by_hand_and_against_scikit_learn() -> None:
    # 15 bins of width 1/15: 0.9 -> (13/15, 14/15], 0.25 -> (3/15, 4/15], 0.62 -> (9/15, 10/15].
    expected = 2 / 4 * abs(0.5 - 0.9) + 1 / 4 * abs(0 - 0.25) + 1 / 4 * abs(1 - 0.62)
    got = ece([0.9, 0.9, 0.25, 0.62], [1, 0, 0, 1])
    assert got == pytest.approx(expected)
    # Right-closed bins: 1/3 = 5/15 falls in (4/15, 5/15] with 0.3.
    assert ece([1 / 3, 0.3], [1, 1]) == pytest.approx(1 - (1 / 3 + 0.3) / 2)
    from sklearn.calibration import calibration_curve

    rng = np.random.default_rng(0)
    conf = rng.random(2000) ** 0.5
    hit = rng.random(2000) < conf**2  # over-confident
    prob_true, prob_pred = calibration_curve(hit, conf, n_bins=15)
    counts = np.histogram(conf, bins=np.linspace(0, 1, 16))[0]
    reference = float(np.sum(counts[counts > 0] / conf.size * np.abs(prob_true - prob_pred)))
    assert ece(conf, hit) == pytest.approx(reference, abs=1e-12)


def test_each_direction_reports_the_detectors_of_its_top1_errors() -> None:
    unc = torch.tensor([0.5, 0.1, 0.9, 0.3, 0.7, 0.2])
    t2i = retrieval(n_bins=2, text_uncertainty=unc)["t2i"]
    error = np.asarray(SCORES).argmax(axis=1) != np.asarray(PAIRS)
    assert t2i["auroc"] == error_auroc(unc, error) and t2i["aupr"] == error_aupr(unc, error)
    assert t2i["fpr@95tpr"] == fpr_at_tpr(unc, error)
    assert (t2i["aurc"], t2i["e_aurc"]) == aurc(unc, error)
    assert t2i["risk_coverage"] == risk_coverage(unc, error)


def test_retrieval_ece_by_hand() -> None:
    # With scale ln 3 a row (1, 0) has softmax (3/4, 1/4): t2i confidence 3/4 twice, one hit.
    # i2t: img0's column (1, 1) -> top-1 c0, its own; img1's (0, 0) -> c0 again, a miss.
    scores, pairs = torch.tensor([[1.0, 0.0], [1.0, 0.0]]), torch.tensor([0, 1])
    res = retrieval(scores, pairs, ks=(1,), n_bins=1, scale=float(np.log(3.0)))
    assert res["t2i"]["ece"] == pytest.approx(0.25)
    assert res["i2t"]["ece"] == pytest.approx(0.0, abs=1e-12)
    # A query without finite scores has the uniform distribution.
    scores = torch.tensor([[NAN, NAN], [0.0, 1.0]])
    res = retrieval(scores, torch.tensor([0, 1]), ks=(1,), n_bins=1)
    assert res["t2i"]["ece"] == pytest.approx(0.5 / 2 + (1 - 1 / (1 + np.exp(-100.0))) / 2)


def _split(n_text: int, n_image: int, dim: int, noise: float = 0.3) -> SplitTensors:
    g = torch.Generator().manual_seed(0)
    images = unit(torch.randn(n_image, dim, generator=g))
    pairs = torch.arange(n_text) % n_image
    texts = images[pairs] + noise * torch.randn(n_text, dim, generator=g)
    return SplitTensors(image_emb=images, text_emb=texts, text_to_image=pairs, split=None)


def test_evaluate_uses_the_methods_calibration_scale() -> None:
    data = _split(80, 40, 8, noise=0.5)
    method = build_method("clip", 8)
    method.calibration_scale = lambda: 5.0
    res = evaluate_retrieval(method, data)
    scores = unit(data.text_emb) @ data.image_emb.T
    for scale in (5.0, 100.0):  # the method's scale, not the default 100
        ref = retrieval(scores, data.text_to_image, ks=(1, 5, 10), scale=scale)
        for direction in ("t2i", "i2t"):
            same = res[direction]["ece"] == pytest.approx(ref[direction]["ece"], abs=1e-6)
            assert same == (scale == 5.0), (scale, direction)


# -- rank_pass: every chunk size gives the whole-matrix ranking -------------------------------
def _scores(n_text: int, n_image: int, kind: str, seed: int = 0) -> torch.Tensor:
    """Random scores: ``plain``, ``ties`` (a few levels) or ``nonfinite`` (NaN / +-inf)."""
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
    logits = s.double() * scale
    return {
        "t2i_rank": t2i_rank,
        "t2i_top": rows[:, : min(top_t2i, n_image)],
        "i2t_rank": torch.where(hit, pos, torch.full_like(pos, depth)).min(dim=0).values,
        "i2t_top": cols.T,
        "t2i_confidence": torch.softmax(logits, dim=1).max(dim=1).values,
        "i2t_confidence": torch.softmax(logits, dim=0).max(dim=0).values,
    }


@pytest.mark.parametrize("kind", ["plain", "ties", "nonfinite"])
@pytest.mark.parametrize(("depth", "top_t2i"), [(5, 3), (12, 1)])
def test_every_chunk_size_gives_the_whole_matrix_ranking(kind, depth, top_t2i) -> None:
    n_text, n_image = 23, 9  # 23 is prime: every chunk size but 1 and 23 leaves a ragged tail
    scores = _scores(n_text, n_image, kind, seed=depth)
    pairs = torch.arange(n_text) % (n_image - 1)  # the last image has no caption
    ref, before = _reference(scores, pairs, depth, top_t2i, scale=10.0), scores.clone()
    kw = dict(depth=depth, top_t2i=top_t2i, scale=10.0)
    whole = rank_pass(lambda a, b: scores[a:b], n_text, n_image, pairs, chunk_size=n_text, **kw)
    for chunk_size in (1, 2, 4, 7, 22, 24):
        got = rank_pass(
            lambda a, b: scores[a:b], n_text, n_image, pairs, chunk_size=chunk_size, **kw
        )
        for name in ("t2i_rank", "t2i_top", "i2t_rank", "i2t_top"):
            assert torch.equal(getattr(got, name).long(), ref[name].long()), (name, chunk_size)
        assert torch.equal(got.t2i_confidence, whole.t2i_confidence)  # row by row: exact
        # The i2t normaliser is accumulated over chunks: equal up to rounding.
        torch.testing.assert_close(got.i2t_confidence, whole.i2t_confidence, rtol=1e-12, atol=0)
        for name in ("t2i_confidence", "i2t_confidence"):
            if kind != "nonfinite":  # no finite score at all: uniform, not softmax of -inf
                torch.testing.assert_close(getattr(got, name), ref[name], rtol=1e-10, atol=0)
        assert got.has_caption.tolist() == [True] * (n_image - 1) + [False]
    assert torch.equal(scores.nan_to_num(), before.nan_to_num())  # the caller's, as it was


class _LargestTensor(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the most elements of any tensor an aten op returns."""

    largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_a_budget_sizes_the_chunks_and_the_largest_tensor_is_one_chunk() -> None:
    n_text, n_image, dim = 300, 200, 8
    data = _split(n_text, n_image, dim)
    torch.manual_seed(0)
    method = build_method("asymvlm-vmf", dim, hidden_dim=16, depth=1)
    budget = 30 * n_image * SCORE_WORK_BYTES + 5  # room for 30 captions per chunk
    assert chunk_rows(n_image, budget) == 30 and chunk_rows(10**9, 1) == 1
    assert chunk_rows(40_000) == DEFAULT_MEMORY_BUDGET // (SCORE_WORK_BYTES * 40_000)
    shapes: list[tuple[int, ...]] = []
    score = method.score

    def recording(texts, images, **kw):
        out = score(texts, images, **kw)
        shapes.append(tuple(out.shape))
        return out

    method.score = recording  # type: ignore[method-assign]
    with _LargestTensor() as mode:
        res = evaluate_retrieval(method, data, memory_budget=budget)
    assert max(s[0] for s in shapes) == 30 and sum(s[0] for s in shapes) == n_text
    assert mode.largest <= 30 * n_image < n_text * n_image  # never all the scores at once
    method.score = score  # type: ignore[method-assign]
    ref = evaluate_retrieval(method, data, chunk_size=n_text)
    for direction in ("t2i", "i2t"):
        for key in ("recall@1", "recall@5", "recall@10", "binned_recall@1", "auroc", "aurc"):
            assert res[direction][key] == ref[direction][key], (direction, key)
        assert res[direction]["ece"] == pytest.approx(ref[direction]["ece"], abs=1e-12)


# -- folds and MLflow names -------------------------------------------------------------------
def test_folds_average_the_metrics_of_consecutive_images(small_world) -> None:
    data = load_split(small_world, "test")  # 60 images, 3 captions each
    res = evaluate_retrieval(build_method("clip", data.dim), data, fold_size=20)
    folds = res["folds_20"]
    text, image = unit(data.text_emb), unit(data.image_emb)
    per_fold = []
    for start in range(0, 60, 20):
        rows = torch.nonzero((data.text_to_image >= start) & (data.text_to_image < start + 20))
        scores = text[rows[:, 0]] @ image[start : start + 20].T
        per_fold.append(retrieval(scores, data.text_to_image[rows[:, 0]] - start, ks=(1, 5, 10)))
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


def test_metric_names_flatten_every_scalar_and_leave_undefined_out() -> None:
    res = retrieval(ks=(1, 5, 10), n_bins=2, text_uncertainty=torch.arange(6.0))
    names = retrieval_metric_names(res)
    for direction in ("t2i", "i2t"):
        for key, value in res[direction].items():
            name = f"{direction}_{key.replace('@', '_at_')}"
            assert names.get(name) == (value if isinstance(value, float) else None), name
    assert names["rsum"] == res["rsum"] and "t2i_aupr" in names and "i2t_spearman" in names


def test_evaluate_cli_writes_the_metrics_and_refuses_a_bad_fold_size(
    small_world, tmp_path, capsys
) -> None:
    from asymvlm.checkpoints import save_checkpoint
    from asymvlm.cli import main
    from asymvlm.training import TrainConfig

    ckpt = str(tmp_path / "ckpt")
    method = build_method("asymvlm-vmf", 16, hidden_dim=16)
    save_checkpoint(ckpt, method, TrainConfig(method="asymvlm-vmf", hidden_dim=16), 16)
    args = ["evaluate", "--embeddings", small_world, "--split", "test", "--checkpoint", ckpt]
    out = str(tmp_path / "m.json")
    assert main([*args, "--quiet", "--output", out, "--fold-size", "20"]) == 0
    res = json.loads(open(out).read())
    for direction in ("t2i", "i2t"):
        assert 0.0 <= res[direction]["ece"] <= 1.0
        assert len(res[direction]["risk_coverage"]["risk"]) == 20
    assert res["folds_20"]["n_folds"] == 3 and "eccv" not in res  # a synthetic table
    capsys.readouterr()
    assert main([*args, "--quiet", "--output", str(tmp_path / "bad.json"), "--fold-size", "7"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fold size 7" in err[0] and "60 images" in err[0]
    assert not (tmp_path / "bad.json").exists()
