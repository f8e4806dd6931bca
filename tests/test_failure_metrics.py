"""Failure prediction: AUPR and FPR@95TPR of the uncertainty as a detector of top-1 errors, by
hand and against scikit-learn (a test-only reference), per direction in the retrieval result,
under MLflow names and in Table 1."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from asymvlm.metrics import error_aupr, error_auroc, fpr_at_tpr, retrieval_metrics
from asymvlm.report import table1_markdown
from asymvlm.results import retrieval_metric_names
from tests.test_metrics import PAIRS, SCORES, matrix_fn


def test_aupr_by_hand() -> None:
    # Flagged from the most uncertain down: e, ok, e, ok -> precision 1, 1/2, 2/3, 1/2 at
    # recall 1/2, 1/2, 1, 1: AP = 1/2 * 1 + 1/2 * 2/3.
    assert error_aupr([0.9, 0.8, 0.7, 0.1], [1, 0, 1, 0]) == pytest.approx(0.5 + 1 / 3)
    # Every error above every hit: 1; every error below: the curve's last step, the error rate.
    assert error_aupr([3, 2, 1, 0], [1, 1, 0, 0]) == pytest.approx(1.0)
    assert error_aupr([0, 1, 2, 3], [1, 0, 0, 0]) == pytest.approx(1 / 4)
    # Ties are flagged together: one threshold holding both queries, precision 1/2 at recall 1.
    assert error_aupr([0.5, 0.5], [1, 0]) == pytest.approx(0.5)
    assert error_aupr([1, 2], [0, 0]) is None and error_aupr([1, 2], [1, 1]) is None


def test_fpr_at_95_tpr_by_hand() -> None:
    # 20 errors at uncertainty 1..20, 10 hits at 0.5, 5.5, 10.5, ...: flagging 19 errors needs
    # the threshold 2, which also flags the hits above 2 (9 of 10).
    errors = np.arange(1.0, 21.0)
    hits = np.arange(10) * 5.0 + 0.5
    u = np.r_[errors, hits]
    e = np.r_[np.ones(20), np.zeros(10)]
    assert fpr_at_tpr(u, e) == pytest.approx(0.9)
    # The errors all above the hits: no hit flagged; all below: every hit flagged.
    assert fpr_at_tpr([5, 4, 3, 2, 1], [1, 1, 0, 0, 0]) == 0.0
    assert fpr_at_tpr([1, 2, 3, 4, 5], [1, 1, 0, 0, 0]) == 1.0
    assert fpr_at_tpr([1, 2], [0, 0]) is None
    with pytest.raises(ValueError, match="tpr must lie in"):
        fpr_at_tpr([1, 2], [0, 1], tpr=0.0)


@pytest.mark.parametrize("seed", range(5))
def test_against_scikit_learn(seed: int) -> None:
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(seed)
    n = 500
    error = rng.random(n) < 0.3
    # informative but noisy, and rounded so that many queries tie
    u = np.round(error * 0.8 + rng.normal(0, 1, n), 1)
    assert len(np.unique(u)) < n / 2
    assert error_aupr(u, error) == pytest.approx(
        metrics.average_precision_score(error, u), rel=1e-12
    )
    fpr, tpr, _ = metrics.roc_curve(error, u, drop_intermediate=False)
    reference = fpr[np.searchsorted(tpr, 0.95, side="left")]
    assert fpr_at_tpr(u, error) == pytest.approx(reference, rel=1e-12)
    assert error_auroc(u, error) == pytest.approx(metrics.roc_auc_score(error, u), rel=1e-12)
    # an informative uncertainty beats chance on every number
    assert error_aupr(u, error) > error.mean() and fpr_at_tpr(u, error) < 0.95


def test_every_direction_reports_them_and_mlflow_names_them() -> None:
    res = retrieval_metrics(
        matrix_fn(SCORES), 6, 3, PAIRS, n_bins=2, text_uncertainty=torch.arange(6.0)
    )
    names = retrieval_metric_names(res)
    for direction in ("t2i", "i2t"):
        r = res[direction]
        assert set(r) >= {"aupr", "fpr@95tpr"}
        for key, name in (("aupr", "aupr"), ("fpr@95tpr", "fpr_at_95tpr")):
            if r[key] is None:
                assert f"{direction}_{name}" not in names
            else:
                assert names[f"{direction}_{name}"] == r[key]
    assert res["t2i"]["aupr"] is not None and res["t2i"]["fpr@95tpr"] is not None
    without = retrieval_metrics(matrix_fn(SCORES), 6, 3, PAIRS, n_bins=2)
    assert without["t2i"]["aupr"] is None and without["t2i"]["fpr@95tpr"] is None


def test_the_retrieval_numbers_match_the_detector_on_the_errors() -> None:
    """The per-direction values are the functions applied to the top-1 errors and the binning
    uncertainty (t2i: the caption's own)."""
    unc = torch.tensor([0.5, 0.1, 0.9, 0.3, 0.7, 0.2])
    res = retrieval_metrics(matrix_fn(SCORES), 6, 3, PAIRS, n_bins=2, text_uncertainty=unc)
    top1 = np.asarray(SCORES).argmax(axis=1)
    error = top1 != np.asarray(PAIRS)
    assert error.tolist() == [False, True, False, True, False, False]
    assert res["t2i"]["aupr"] == pytest.approx(error_aupr(unc, error))
    assert res["t2i"]["fpr@95tpr"] == pytest.approx(fpr_at_tpr(unc, error))
    assert res["t2i"]["auroc"] == pytest.approx(error_auroc(unc, error))


def test_table1_shows_them_per_direction() -> None:
    rows = [
        {
            "method": "asymvlm-vmf",
            "t2i_aupr": 0.25,
            "t2i_fpr_at_95tpr": 0.5,
            "i2t_aupr": 0.75,
            "i2t_fpr_at_95tpr": 0.125,
        }
    ]
    text = table1_markdown(rows, "Table 1", "caption")
    head = text.splitlines()[4]
    assert "i2t AUPR" in head and "t2i FPR@95" in head
    cells = dict(
        zip(
            head.strip("| ").split(" | "),
            text.splitlines()[6].strip("| ").split(" | "),
            strict=True,
        )
    )
    assert cells["t2i AUPR"] == "0.250 ± 0.000" and cells["i2t FPR@95"] == "0.125 ± 0.000"
