"""The paper's claims judged by their rule (:mod:`asymvlm.claims`) and in the report."""

from __future__ import annotations

import json
import math
import os
import statistics

import pytest

from asymvlm import claims
from asymvlm.claims import judge, standard_error_of_difference
from asymvlm.evaluation.registry import log_evaluation
from asymvlm.report import build_report
from tests.test_report import row

HERE = os.path.dirname(__file__)


def test_the_standard_error_is_that_of_a_difference_of_two_means() -> None:
    a, b = [0.5, 0.7, 0.6], [0.2, 0.4]
    want = math.sqrt(statistics.variance(a) / 3 + statistics.variance(b) / 2)
    assert standard_error_of_difference(a, b) == pytest.approx(want)
    assert standard_error_of_difference(a, [0.1]) == pytest.approx(
        math.sqrt(statistics.variance(a) / 3)
    )  # the frozen model: one exact value


@pytest.mark.parametrize(
    ("a", "b", "direction", "verdict"),
    [
        ([0.60, 0.62, 0.64], [0.40, 0.42, 0.44], 1, "supports"),
        ([0.60, 0.62, 0.64], [0.40, 0.42, 0.44], -1, "contradicts"),
        ([0.40, 0.60, 0.50], [0.45, 0.55, 0.45], 1, "not supported"),  # within 2 SE
        ([0.999, 0.999, 0.999], [0.998, 0.998, 0.998], 1, "not supported"),  # below 0.01
        ([-0.9, -0.95, -0.97], [0.0], -1, "supports"),  # Table 1: S below 0
        ([0.6], [0.4], 1, "undetermined (no seeds to estimate an error)"),
    ],
)
def test_the_rule(a, b, direction, verdict) -> None:
    diff, se, got = judge(a, b, direction)
    assert got == verdict
    assert diff == pytest.approx(statistics.fmean(a) - statistics.fmean(b))


def test_a_difference_just_inside_two_standard_errors_is_not_supported() -> None:
    a, b = [0.50, 0.60], [0.40, 0.40]
    diff, se, _ = judge(a, b)
    assert diff == pytest.approx(0.15) and se == pytest.approx(math.sqrt(0.005 / 2))
    assert judge(a, b)[2] == "supports"  # 0.15 > 2 x 0.05
    assert judge([0.50, 0.60], [0.46, 0.46])[2] == "not supported"  # 0.09 < 0.1


def _nota_result() -> dict:
    cells = {}
    for dummy, shift in (("a photo", 0.0), ("a photo of something", 0.02)):
        cells[dummy] = {
            **{
                f"asymvlm-vmf/seed{s}": {
                    "pos_acc": 0.9,
                    "neg_acc": 0.5 + 0.01 * s + shift,
                    "far_neg_acc": 0.3,
                }
                for s in range(3)
            },
            **{
                f"determ-ft/seed{s}": {
                    "pos_acc": 0.8,
                    "neg_acc": 0.2 + 0.01 * s,
                    "far_neg_acc": 0.3 + 0.01 * s,
                }
                for s in range(3)
            },
            "clip": {"pos_acc": 0.95, "neg_acc": 0.1, "far_neg_acc": 0.6},
        }
    return {"dummy": cells, "rejection": {}}


def test_table2_claims_average_the_dummy_prompts_per_seed() -> None:
    verdicts = {(v.claim, v.where): v for v in claims.table2_verdicts(_nota_result())}
    sib = verdicts["asymvlm-vmf rejects more negatives than Determ. FT", "sibling negatives"]
    assert sib.a == pytest.approx((0.51, 0.52, 0.53)) and sib.b == pytest.approx((0.2, 0.21, 0.22))
    assert sib.verdict == "supports" and sib.paper.startswith("0.576 vs 0.092")
    far = verdicts["asymvlm-vmf rejects more negatives than the frozen model", "far negatives"]
    assert far.b == (0.6,) and far.verdict == "contradicts"
    assert (
        verdicts["asymvlm-vmf rejects more negatives than Determ. FT", "far negatives"].verdict
        == "not supported"
    )
    assert verdicts["asymvlm-vmf keeps more positives than Determ. FT", "positives"].verdict == (
        "supports"
    )
    assert not any("asymvlm-ps" in claim for claim, _ in verdicts)  # not evaluated: not judged


def test_table3_claims_per_evaluation_set() -> None:
    res = {
        f"asymvlm-vmf/seed{s}": {"zeroshot": 0.75 + 0.01 * s, "positives": 0.99} for s in range(5)
    }
    res |= {
        f"determ-ft/seed{s}": {"zeroshot": 0.70 + 0.01 * s, "positives": 0.99} for s in range(5)
    }
    res["clip"] = {"zeroshot": 0.96, "positives": 0.99}
    got = {v.where: v for v in claims.table3_verdicts(res)}
    assert set(got) == {"positives", "zeroshot"}
    assert got["zeroshot"].difference == pytest.approx(0.05)
    assert got["zeroshot"].se == pytest.approx(0.01)  # sqrt(2 x 0.00025 / 5)
    assert got["zeroshot"].verdict == "supports"  # 0.05 > 2 x 0.01
    assert got["positives"].verdict == "not supported"


def test_the_generic_curve_is_the_recorded_benchmark() -> None:
    """:data:`GENERIC_CURVE` (printed by the report) holds the means of the run kept in docs."""
    with open(os.path.join(HERE, "..", "docs", "synthetic-world", "generic_captions.json")) as fh:
        run = json.load(fh)
    assert [c["p"] for c in run["curve"]] == list(claims.GENERIC_CURVE)
    for point in run["curve"]:
        kappa, sibling, far = claims.GENERIC_CURVE[point["p"]]
        for k, method in enumerate(claims.CURVE_METHODS):
            mean = point["mean"][method]
            assert sibling[k] == pytest.approx(mean["sibling_rejected"], abs=6e-4)
            assert far[k] == pytest.approx(mean["far_rejected"], abs=6e-4)
            if k < 2:  # kappa: the probabilistic methods
                assert kappa[2 * k] == pytest.approx(mean["kappa"]['dummy "a photo"'], abs=0.06)
                assert kappa[2 * k + 1] == pytest.approx(mean["kappa"]["class prompts"], abs=0.06)


def test_the_report_judges_the_claims_and_closes_with_what_is_not_supported(tmp_path) -> None:
    uri, exp = "sqlite:///" + str(tmp_path / "mlflow.db"), "claims"
    nota = _nota_result()
    nota["settings"] = {
        "template_aggregation": "mean",
        "positives": {
            "name": "w-positives",
            "role": "positives",
            "world": {"generic_captions": 0.004, "misalignment": 0.0},
        },
        "negatives": {"name": "w-negatives"},
        "far_negatives": {"name": "w-far-negatives"},
    }
    log_evaluation(uri, exp, "nota", nota, params={"sweep": "synthetic"})
    zero = {f"asymvlm-vmf/seed{s}": {"zeroshot": 0.75 + 0.01 * s} for s in range(3)}
    zero |= {f"determ-ft/seed{s}": {"zeroshot": 0.74 + 0.01 * s} for s in range(3)}
    zero["clip"] = {"zeroshot": 0.2}
    log_evaluation(
        uri, exp, "zeroshot", zero, params={"sweep": "synthetic", "fine_tuned_on": "synthetic"}
    )
    text = open(build_report(uri, exp, str(tmp_path / "report"))).read()
    assert (
        "(positives: w-positives, negatives: w-negatives, far negatives: w-far-negatives)"
    ) in text
    assert row(text, '"a photo"', "asymvlm-vmf")[2:] == [
        "3",
        "0.900 ± 0.000",
        "0.510 ± 0.010",
        "0.300 ± 0.000",
        "0.857, 0.587",
    ]
    assert "the mean of the log-likelihoods over the class's prompt templates" in text
    # Table 3 of a synthetic world: the paper's real-data numbers in a labelled column.
    head = row(text, "fine-tuned on")
    assert head[3:] == [
        "zeroshot",
        "paper (CLIP ViT-B/32 fine-tuned on COCO, real data: "
        "CIFAR-10 / CIFAR-100 / STL-10 / ImageNet)",
    ]
    assert row(text, "synthetic", "asymvlm-vmf")[2:] == [
        "3",
        "0.760 ± 0.010",
        "0.837 / 0.477 / 0.940 / 0.507",
    ]
    assert row(text, "– (frozen)", "clip")[2:] == ["1", "0.200", "0.888 / 0.642 / 0.974 / 0.632"]
    assert " (paper)" not in text  # no paper rows pretending to be on our sets
    assert "## The paper's claims, judged by rule" in text and claims.RULE in text
    cells = row(
        text,
        "nota (synthetic)",
        "Table 2: asymvlm-vmf rejects more negatives than Determ. FT",
        "sibling negatives",
    )
    assert cells[4:6] == ["+0.310 ± 0.008", "**supports**"]
    closing = text.split("## Closing note", 1)[1]
    assert "3 of 6 judged claims are supported by their rule." in closing
    assert (
        "- Table 3, asymvlm-vmf keeps more zero-shot accuracy after fine-tuning than "
        "Determ. FT, on zeroshot (zeroshot (synthetic)): +0.010 ± 0.008 — not "
        "supported."
    ) in closing
    assert "p = 0.004" in closing and row(closing, "0.02")[1] == "6.8 / 15.6"
    assert "forgetting regime" in closing and "**no mechanism**" in closing
