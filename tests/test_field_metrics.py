"""The numbers the field reports beside the paper's: ECE of the predictive softmax, risk-coverage
points, RSUM, fold averages (COCO 1K) and their MLflow names."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy.special import softmax

from asymvlm.errors import ConfigError
from asymvlm.evaluation import evaluate_retrieval
from asymvlm.methods import build_method
from asymvlm.metrics import (
    aurc,
    average_folds,
    expected_calibration_error,
    retrieval_metrics,
    risk_coverage,
    rsum,
)
from asymvlm.results import retrieval_metric_names
from asymvlm.splits import SplitTensors
from tests.test_metrics import PAIRS, SCORES, matrix_fn


# -- ECE ----------------------------------------------------------------------------------------
def test_ece_by_hand() -> None:
    # 15 bins of width 1/15: 0.9 -> (13/15, 14/15], 0.25 -> (3/15, 4/15], 0.62 -> (9/15, 10/15].
    conf = [0.9, 0.9, 0.25, 0.62]
    hit = [True, False, False, True]
    expected = 2 / 4 * abs(0.5 - 0.9) + 1 / 4 * abs(0 - 0.25) + 1 / 4 * abs(1 - 0.62)
    assert expected_calibration_error(conf, hit) == pytest.approx(expected)
    # Perfectly calibrated: accuracy equals confidence in every bin.
    assert expected_calibration_error([0.5, 0.5, 1.0], [True, False, True]) == 0.0
    # Bins are right-closed: 1/3 = 5/15 falls in (4/15, 5/15] with 0.3, not with 0.35.
    assert expected_calibration_error([1 / 3, 0.3], [True, True]) == pytest.approx(
        1 - (1 / 3 + 0.3) / 2
    )
    assert expected_calibration_error([], []) is None
    with pytest.raises(ValueError):
        expected_calibration_error([1.5], [True])


def test_ece_matches_sklearn_calibration_curve() -> None:
    calibration = pytest.importorskip("sklearn.calibration")
    rng = np.random.default_rng(0)
    conf = rng.random(2000) ** 0.5
    hit = rng.random(2000) < conf**2  # over-confident
    prob_true, prob_pred = calibration.calibration_curve(hit, conf, n_bins=15)
    counts = np.histogram(conf, bins=np.linspace(0, 1, 16))[0]
    reference = float(np.sum(counts[counts > 0] / conf.size * np.abs(prob_true - prob_pred)))
    assert expected_calibration_error(conf, hit, 15) == pytest.approx(reference, abs=1e-12)
    assert reference > 0.05


def _dense_ece(conf: np.ndarray, hit: np.ndarray, n_bins: int = 15) -> float:
    total = 0.0
    for b in range(n_bins):
        lo, hi = b / n_bins, (b + 1) / n_bins
        member = (conf > lo) & (conf <= hi) if b else (conf <= hi)
        if member.any():
            total += member.sum() / conf.size * abs(hit[member].mean() - conf[member].mean())
    return total


def test_retrieval_ece_by_hand() -> None:
    # c0, c1 both score img0 1 and img1 0; c0 -> img0, c1 -> img1. With scale ln 3 a row's
    # softmax is (3/4, 1/4): t2i confidence 3/4 twice, one hit -> ECE |1/2 - 3/4| = 1/4.
    # i2t: img0's column (1, 1) -> (1/2, 1/2), top-1 c0 (the lower index) is its own: a hit;
    # img1's column (0, 0) -> top-1 c0 again, not its own: a miss. One bin, acc 1/2 = conf.
    scores = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    res = retrieval_metrics(
        matrix_fn(scores), 2, 2, torch.tensor([0, 1]), ks=(1,), n_bins=1, scale=float(np.log(3.0))
    )
    assert res["t2i"]["ece"] == pytest.approx(0.25)
    assert res["i2t"]["ece"] == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("scale", [1.0, 7.5, 100.0])
def test_retrieval_ece_matches_a_dense_softmax_for_every_chunk_size(scale) -> None:
    g = torch.Generator().manual_seed(3)
    n_text, n_image = 300, 70
    pairs = torch.randint(0, n_image - 3, (n_text,), generator=g)
    pairs[: n_image - 3] = torch.arange(n_image - 3)  # the last three images have no caption
    scores = torch.randn(n_text, n_image, generator=g) * 0.2
    scores[torch.arange(n_text), pairs] += 0.3
    s, p = scores.double().numpy(), pairs.numpy()
    t2i = softmax(scale * s, axis=1)
    t2i_ece = _dense_ece(t2i.max(axis=1), t2i.argmax(axis=1) == p)
    i2t = softmax(scale * s, axis=0)  # over the captions, per image
    captioned = np.unique(p)
    i2t_ece = _dense_ece(i2t.max(axis=0)[captioned], p[i2t.argmax(axis=0)][captioned] == captioned)
    assert 0.01 < t2i_ece and 0.01 < i2t_ece
    for chunk_size in (1, 7, 64, 1000):
        res = retrieval_metrics(
            matrix_fn(scores), n_text, n_image, pairs, chunk_size=chunk_size, scale=scale
        )
        assert res["t2i"]["ece"] == pytest.approx(t2i_ece, abs=1e-9)
        assert res["i2t"]["ece"] == pytest.approx(i2t_ece, abs=1e-9)


def test_a_query_without_finite_scores_has_the_uniform_distribution() -> None:
    scores = torch.tensor([[float("nan"), float("nan")], [0.0, 1.0]])
    res = retrieval_metrics(matrix_fn(scores), 2, 2, torch.tensor([0, 1]), ks=(1,), n_bins=1)
    # t2i: c0 has confidence 1/2 and misses; c1 scores (0, 1) * 100: confidence ~1 and hits.
    assert res["t2i"]["ece"] == pytest.approx(0.5 / 2 + (1 - 1 / (1 + np.exp(-100.0))) / 2)


def test_evaluate_uses_the_methods_calibration_scale() -> None:
    g = torch.Generator().manual_seed(0)
    images = torch.nn.functional.normalize(torch.randn(40, 8, generator=g), dim=-1)
    t2i = torch.arange(80) % 40
    texts = images[t2i] + 0.5 * torch.randn(80, 8, generator=g)
    data = SplitTensors(image_emb=images, text_emb=texts, text_to_image=t2i, split=None)
    method = build_method("clip", 8)
    scores = torch.nn.functional.normalize(texts, dim=-1) @ images.T
    eces = []
    for scale in (5.0, 100.0):
        method.calibration_scale = lambda scale=scale: scale
        res = evaluate_retrieval(method, data)
        ref = retrieval_metrics(matrix_fn(scores), 80, 40, t2i, scale=scale)
        for direction in ("t2i", "i2t"):
            assert res[direction]["ece"] == pytest.approx(ref[direction]["ece"], abs=1e-6)
        eces.append(res["t2i"]["ece"])
    assert abs(eces[0] - eces[1]) > 0.05


# -- risk-coverage points -----------------------------------------------------------------------
def test_risk_coverage_by_hand() -> None:
    curve = risk_coverage([0.1, 0.2, 0.3, 0.4], [0, 1, 0, 1], n_points=4)
    assert curve == {"coverage": [0.25, 0.5, 0.75, 1.0], "risk": [0.0, 0.5, 1 / 3, 0.5]}
    # Ties keep the order given, as aurc.
    assert risk_coverage([0.0, 0.0], [1, 0], n_points=2)["risk"] == [1.0, 0.5]


def test_risk_coverage_is_consistent_with_aurc() -> None:
    rng = np.random.default_rng(1)
    unc, err = rng.random(20), (rng.random(20) < 0.4).astype(float)
    curve = risk_coverage(unc, err, n_points=20)  # one point per query
    assert np.mean(curve["risk"]) == pytest.approx(aurc(unc, err)[0])
    # 45 queries at 20 coverages: ceil(c * 45) kept, the last point is the error rate.
    unc, err = rng.random(45), (rng.random(45) < 0.4).astype(float)
    curve = risk_coverage(unc, err)
    order = np.argsort(unc, kind="stable")
    assert curve["coverage"] == pytest.approx([i / 20 for i in range(1, 21)])
    assert curve["risk"][0] == pytest.approx(err[order[:3]].mean())  # ceil(0.05 * 45) = 3
    assert curve["risk"][-1] == pytest.approx(err.mean())


def test_retrieval_reports_risk_coverage_only_with_an_uncertainty() -> None:
    res = retrieval_metrics(matrix_fn(SCORES), 6, 3, PAIRS, n_bins=2)
    assert res["t2i"]["risk_coverage"] is None and res["i2t"]["risk_coverage"] is None
    res = retrieval_metrics(
        matrix_fn(SCORES), 6, 3, PAIRS, n_bins=2, text_uncertainty=torch.arange(6.0)
    )
    curve = res["t2i"]["risk_coverage"]
    assert len(curve["coverage"]) == len(curve["risk"]) == 20
    assert curve["risk"][-1] == pytest.approx(1 - res["t2i"]["recall@1"])
    # Least uncertain caption first: c0 is a hit (risk 0 at coverage 0.05 = 1 of 6 kept).
    assert curve["risk"][0] == 0.0
    json.dumps(res, allow_nan=False)


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


# -- MLflow names ---------------------------------------------------------------------------
def test_metric_names_flatten_the_new_scalars_and_keep_the_old_ones() -> None:
    res = retrieval_metrics(
        matrix_fn(SCORES), 6, 3, PAIRS, n_bins=2, text_uncertainty=torch.arange(6.0)
    )
    names = retrieval_metric_names(res)
    for direction in ("t2i", "i2t"):
        assert names[f"{direction}_ece"] == res[direction]["ece"]
        for key, old in (
            ("recall@1", "recall_at_1"),
            ("recall@5", "recall_at_5"),
            ("recall@10", "recall_at_10"),
            ("spearman", "spearman"),
            ("r2", "r2"),
            ("auroc", "auroc"),
            ("aurc", "aurc"),
            ("e_aurc", "e_aurc"),
        ):
            if res[direction][key] is None:  # undefined values are left out
                assert f"{direction}_{old}" not in names
            else:
                assert names[f"{direction}_{old}"] == res[direction][key]
    assert names["rsum"] == res["rsum"]
    assert not any("risk" in name or "coverage" in name for name in names)
    assert all(isinstance(v, float) for v in names.values())


# -- the command line -------------------------------------------------------------------------
def test_evaluate_cli_writes_the_new_keys(small_world, tmp_path, capsys) -> None:
    from asymvlm.cli import main
    from tests.test_cli import _train

    ckpt = str(tmp_path / "ckpt")
    assert _train(small_world, ckpt) == 0
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
