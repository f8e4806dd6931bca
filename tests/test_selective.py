"""Failure prediction, selective risk and calibration: AUROC, AUPR and FPR@95TPR of the
uncertainty as a detector of top-1 errors, AURC / risk-coverage and the ECE of the predictive
softmax, by hand and per direction in the retrieval result."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from asymvlm.evaluation import evaluate_retrieval
from asymvlm.methods import build_method
from asymvlm.metrics import (
    aurc,
    error_aupr,
    error_auroc,
    expected_calibration_error,
    fpr_at_tpr,
    retrieval_metrics,
    risk_coverage,
)
from asymvlm.splits import SplitTensors
from tests.test_metrics import PAIRS, SCORES, matrix_fn


def test_detectors_by_hand() -> None:
    unc = [0.1, 0.2, 0.3, 0.4]
    assert error_auroc(unc, [False, False, True, True]) == 1.0  # errors the most uncertain
    assert error_auroc(unc, [True, True, False, False]) == 0.0
    assert error_auroc([0.5, 0.5, 0.5], [True, False, False]) == 0.5  # ties count half
    # Flagged from the most uncertain down: e, ok, e, ok -> AP = 1/2 * 1 + 1/2 * 2/3.
    assert error_aupr([0.9, 0.8, 0.7, 0.1], [1, 0, 1, 0]) == pytest.approx(0.5 + 1 / 3)
    assert error_aupr([0, 1, 2, 3], [1, 0, 0, 0]) == pytest.approx(1 / 4)  # chance: error rate
    assert error_aupr([0.5, 0.5], [1, 0]) == pytest.approx(0.5)  # ties flagged together
    # 20 errors at 1..20, 10 hits at 0.5, 5.5, ...: flagging 19 errors flags 9 of 10 hits.
    u = np.r_[np.arange(1.0, 21.0), np.arange(10) * 5.0 + 0.5]
    assert fpr_at_tpr(u, np.r_[np.ones(20), np.zeros(10)]) == pytest.approx(0.9)
    assert fpr_at_tpr([5, 4, 3, 2, 1], [1, 1, 0, 0, 0]) == 0.0
    assert fpr_at_tpr([1, 2, 3, 4, 5], [1, 1, 0, 0, 0]) == 1.0
    for detector in (error_auroc, error_aupr, fpr_at_tpr):  # nothing to detect
        assert detector(unc, [False] * 4) is None and detector(unc, [True] * 4) is None
    with pytest.raises(ValueError, match="tpr must lie in"):
        fpr_at_tpr([1, 2], [0, 1], tpr=0.0)


def test_aurc_and_risk_coverage_by_hand() -> None:
    unc = [0.1, 0.2, 0.3, 0.4]
    assert aurc(unc, [0, 0, 1, 1]) == pytest.approx(((0 + 0 + 1 / 3 + 2 / 4) / 4, 0.0))
    value, excess = aurc(unc, [1, 1, 0, 0])  # the worst order
    assert value == pytest.approx((1 + 1 + 2 / 3 + 2 / 4) / 4)
    assert excess == pytest.approx(value - (1 / 3 + 2 / 4) / 4)
    curve = risk_coverage(unc, [0, 1, 0, 1], n_points=4)
    assert curve == {"coverage": [0.25, 0.5, 0.75, 1.0], "risk": [0.0, 0.5, 1 / 3, 0.5]}
    assert risk_coverage([0.0, 0.0], [1, 0], n_points=2)["risk"] == [1.0, 0.5]  # ties: as given
    rng = np.random.default_rng(1)
    unc, err = rng.random(20), (rng.random(20) < 0.4).astype(float)
    assert np.mean(risk_coverage(unc, err)["risk"]) == pytest.approx(aurc(unc, err)[0])
    unc, err = rng.random(45), (rng.random(45) < 0.4).astype(float)
    curve = risk_coverage(unc, err)  # ceil(c * 45) kept at 20 coverages
    assert curve["risk"][0] == pytest.approx(err[np.argsort(unc, kind="stable")[:3]].mean())
    assert curve["risk"][-1] == pytest.approx(err.mean())


def test_ece_by_hand_and_against_scikit_learn() -> None:
    # 15 bins of width 1/15: 0.9 -> (13/15, 14/15], 0.25 -> (3/15, 4/15], 0.62 -> (9/15, 10/15].
    expected = 2 / 4 * abs(0.5 - 0.9) + 1 / 4 * abs(0 - 0.25) + 1 / 4 * abs(1 - 0.62)
    assert expected_calibration_error([0.9, 0.9, 0.25, 0.62], [1, 0, 0, 1]) == pytest.approx(
        expected
    )
    assert expected_calibration_error([0.5, 0.5, 1.0], [True, False, True]) == 0.0
    # Right-closed bins: 1/3 = 5/15 falls in (4/15, 5/15] with 0.3.
    assert expected_calibration_error([1 / 3, 0.3], [1, 1]) == pytest.approx(1 - (1 / 3 + 0.3) / 2)
    assert expected_calibration_error([], []) is None
    with pytest.raises(ValueError):
        expected_calibration_error([1.5], [True])
    from sklearn.calibration import calibration_curve

    rng = np.random.default_rng(0)
    conf = rng.random(2000) ** 0.5
    hit = rng.random(2000) < conf**2  # over-confident
    prob_true, prob_pred = calibration_curve(hit, conf, n_bins=15)
    counts = np.histogram(conf, bins=np.linspace(0, 1, 16))[0]
    reference = float(np.sum(counts[counts > 0] / conf.size * np.abs(prob_true - prob_pred)))
    assert expected_calibration_error(conf, hit) == pytest.approx(reference, abs=1e-12)


def test_each_direction_reports_the_detectors_of_its_top1_errors() -> None:
    unc = torch.tensor([0.5, 0.1, 0.9, 0.3, 0.7, 0.2])
    res = retrieval_metrics(matrix_fn(SCORES), 6, 3, PAIRS, n_bins=2, text_uncertainty=unc)
    error = np.asarray(SCORES).argmax(axis=1) != np.asarray(PAIRS)
    t2i = res["t2i"]
    assert t2i["auroc"] == error_auroc(unc, error) and t2i["aupr"] == error_aupr(unc, error)
    assert t2i["fpr@95tpr"] == fpr_at_tpr(unc, error)
    assert (t2i["aurc"], t2i["e_aurc"]) == aurc(unc, error.astype(float))
    curve = t2i["risk_coverage"]
    assert len(curve["risk"]) == 20 and curve["risk"][-1] == pytest.approx(error.mean())
    json.dumps(res, allow_nan=False)
    without = retrieval_metrics(matrix_fn(SCORES), 6, 3, PAIRS, n_bins=2)
    for key in ("auroc", "aupr", "fpr@95tpr", "aurc", "risk_coverage", "binned_recall@1"):
        assert without["t2i"][key] is None and without["i2t"][key] is None


def test_a_constant_uncertainty_has_no_binned_curve() -> None:
    res = retrieval_metrics(
        matrix_fn(SCORES), 6, 3, PAIRS, n_bins=2, text_uncertainty=torch.ones(6)
    )
    for d in ("t2i", "i2t"):
        assert res[d]["binned_recall@1"] is None and res[d]["spearman"] is None
        assert res[d]["auroc"] == 0.5  # blind, but defined


def test_retrieval_ece_by_hand() -> None:
    # With scale ln 3 a row (1, 0) has softmax (3/4, 1/4): t2i confidence 3/4 twice, one hit.
    # i2t: img0's column (1, 1) -> top-1 c0, its own; img1's (0, 0) -> c0 again, a miss.
    scores = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    res = retrieval_metrics(
        matrix_fn(scores), 2, 2, torch.tensor([0, 1]), ks=(1,), n_bins=1, scale=float(np.log(3.0))
    )
    assert res["t2i"]["ece"] == pytest.approx(0.25)
    assert res["i2t"]["ece"] == pytest.approx(0.0, abs=1e-12)
    # A query without finite scores has the uniform distribution.
    scores = torch.tensor([[float("nan"), float("nan")], [0.0, 1.0]])
    res = retrieval_metrics(matrix_fn(scores), 2, 2, torch.tensor([0, 1]), ks=(1,), n_bins=1)
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
