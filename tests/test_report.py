"""MLflow runs -> report.md: the paper's tables, figures and claims (asymvlm.report)."""

from __future__ import annotations

import json
import math
import os
import statistics
import time
import types

import numpy as np
import pyarrow as pa
import pytest
import torch
from mlflow import MlflowClient

from asymvlm import tables, tracking
from asymvlm.cli import main
from asymvlm.evaluation.registry import EvaluationResult, log_evaluation, logged_evaluations
from asymvlm.evaluation.suite import evaluate_hierarcaps, evaluate_ood
from asymvlm.methods import Roles
from asymvlm.methods.asymvlm import AsymVLM
from asymvlm.metrics import retrieval_metrics
from asymvlm.metrics.glossary import retrieval_metric_names
from asymvlm.report import claims, document, sweep_sections
from asymvlm.tables import Location
from tests.helpers import IdentityVMF, free_port, write_hierarchies, write_perturbed_pair

COVERAGE = [(k + 1) / 20 for k in range(20)]
RETRIEVAL_KEYS = ("recall@1", "spearman", "r2", "auroc", "aupr", "fpr@95tpr", "aurc", "ece")
CURVE_RUN = "docs/synthetic-world/generic_captions.json"


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """One MLflow store for the module's tests, each in its own experiment."""
    return "sqlite:///" + str(tmp_path_factory.mktemp("mlflow") / "mlflow.db")


def row(text: str, *first: str) -> list[str]:
    """The cells of the first markdown table row whose leading cells are ``first``."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[: len(first)] == list(first):
            return cells
    raise AssertionError(f"no table row {first}")


@pytest.fixture(scope="module")
def built(store, tmp_path_factory) -> types.SimpleNamespace:
    """One experiment with two sweeps and every evaluation kind, reported once: the report's
    text, folder and experiment, and the seed runs' test results of the first sweep."""
    tmp, exp = tmp_path_factory.mktemp("runs"), "report-test"
    vmf = [_test_results(0.30, 0.70, 0.40, 0.10, 2.1), _test_results(0.34, 0.76, 0.36, 0.14, 2.4)]
    ft = [_test_results(0.40, 0.5, 0.5, 0.2, 3.0), _test_results(0.44, 0.5, 0.5, 0.3, 3.2)]
    for test in ft:  # no uncertainty: no binned curve, S, detectors or risk-coverage
        for d in ("t2i", "i2t"):
            test[d] = {k: v for k, v in test[d].items() if k in ("recall@1", "ece")}
    trials = [("asymvlm-vmf", vmf[0]), ("determ-ft", ft[0]), ("asymvlm-vmf", vmf[1])]
    _log_sweep(store, exp, "official", trials, "official")
    _log_sweep(store, exp, "second", [("determ-ft", t) for t in ft], protocol=None)
    nota = _nota_result()
    nota["rejection"] = {"threshold": {"pos_acc": 0.7, "neg_acc": 0.5, "cut": 0.3}}
    nota["settings"] = {
        "template_aggregation": "mean",
        "positives": {"world": {"generic_captions": 0.004, "misalignment": 0.0}},
        "negatives": {"name": "w-negatives"},
        "far_negatives": {"name": "w-far-negatives"},
    }
    log_evaluation(store, exp, "nota", nota, params={"sweep": "synthetic"})
    zero = {f"asymvlm-vmf/seed{s}": {"zeroshot": 0.75 + 0.01 * s} for s in range(3)}
    zero |= {f"determ-ft/seed{s}": {"zeroshot": 0.74 + 0.01 * s} for s in range(3)}
    zero["clip"] = {"zeroshot": 0.2}
    log_evaluation(store, exp, "zeroshot", zero, params={"sweep": "synthetic", **SYNTHETIC})
    zero = {f"asymvlm-vmf/seed{s}": {"cifar10": 0.5 + 0.2 * s, "stl10": 0.9} for s in range(2)}
    log_evaluation(store, exp, "zeroshot", zero, params={**PAPERS, "note": "plumbing only"})
    write_hierarchies(str(tmp / "hc"), np.tile([2.0, 5.0, 12.0, 30.0], (6, 1)))
    identity = {"identity/seed0": IdentityVMF(8)}
    hier = evaluate_hierarcaps(identity, Location(str(tmp / "hc"), "test"))
    log_evaluation(store, exp, "hierarcaps", hier)
    write_perturbed_pair(tmp, noise=3.0, kappa_scale=0.2)
    perturbed = {"typos:3": Location(str(tmp / "typos"), "test")}
    identity = {"identity/seed0": IdentityVMF(16)}
    log_evaluation(
        store, exp, "ood", evaluate_ood(identity, Location(str(tmp / "clean"), "test"), perturbed)
    )
    folder = tmp_path_factory.mktemp("report")
    text = open(document.build_report(store, exp, str(folder))).read()
    return types.SimpleNamespace(text=text, folder=folder, experiment=exp, vmf=vmf, ft=ft)


SYNTHETIC = {"fine_tuned_on": "synthetic"}
PAPERS = {"fine_tuned_on": "coco", "embedding_model": "openai/clip-vit-base-patch32"}
FIRST = "### Table 1 analogue — sweep official: synthetic (tiny)"
SECOND = "### Table 1 analogue — sweep second: synthetic (tiny)"
HEADS = ["R@1 (%)", "S", "R²", "AUROC", "AUPR", "FPR@95", "AURC", "ECE"]
FIGURES = ["fig3_synthetic.png", "fig_risk_coverage_synthetic.png", "fig5_hierarcaps.png"]
KINDS = {"nota": 1, "zeroshot": 2, "hierarcaps": 1, "ood": 1}  # evaluation runs of each kind


def test_table1_names_the_protocol_of_each_sweep(built) -> None:
    lines = built.text.splitlines()
    assert lines[lines.index(FIRST) + 2] == "*Protocol: official (the authors' code).*"
    # a sweep logging no protocol ran this project's defaults
    assert lines[lines.index(SECOND) + 2] == (
        "*Protocol: improved (this project's defaults; see README 'Protocols').*"
    )


def test_table1_is_mean_and_std_over_seeds_in_config_order(built) -> None:
    head = row(built.text, "Method")
    assert head == ["Method", "seeds", *(f"{d} {h}" for d in ("i2t", "t2i") for h in HEADS), "RSUM"]
    official = built.text[built.text.index(FIRST) : built.text.index(SECOND)]
    assert official.index("| determ-ft") < official.index("| asymvlm-vmf")  # the config's order
    cells = dict(zip(head, row(official, "asymvlm-vmf"), strict=True))
    assert cells["seeds"] == "2"
    for d in ("i2t", "t2i"):
        assert cells[f"{d} R@1 (%)"] == _ms([t[d]["recall@1"] for t in built.vmf], 100, 2)
        for key, name in zip(RETRIEVAL_KEYS[1:], HEADS[1:], strict=True):
            digits = 2 if key in ("spearman", "r2") else 3
            assert cells[f"{d} {name}"] == _ms([t[d][key] for t in built.vmf], digits=digits)
    assert cells["RSUM"] == _ms([t["rsum"] for t in built.vmf], digits=2)


def test_table1_leaves_the_uncertainty_cells_of_a_method_without_one_undefined(built) -> None:
    head = row(built.text, "Method")
    cells = dict(zip(head, row(built.text[built.text.index(SECOND) :], "determ-ft"), strict=True))
    assert cells["t2i ECE"] == _ms([t["t2i"]["ece"] for t in built.ft])  # R@1 and ECE stay
    assert cells["t2i AUROC"] == cells["i2t S"] == "–"


def test_table2_names_its_sets_and_shows_the_papers_numbers_beside_ours(built) -> None:
    text = built.text
    # sets named by the run where it names them, CIFAR-10 (the paper's) where it does not
    assert "(positives: CIFAR-10, negatives: w-negatives, far negatives: w-far-negatives)" in text
    assert row(text, '"a photo"', "asymvlm-vmf")[2:] == [
        *("3", "0.900 ± 0.000", "0.510 ± 0.010", "0.300 ± 0.000", "0.857, 0.587")
    ]
    # the frozen model: one value, bare; the rejection baselines as rows of their own
    assert row(text, '"a photo"', "clip")[2:] == ["1", "0.950", "0.100", "0.600", "0.888, 0.009"]
    assert row(text, "(none)")[1:] == [
        *("threshold-based (frozen)", "1", "0.700", "0.500", "–", "0.646, 0.560")
    ]
    assert "CLIP ViT-B/32 on real data: CIFAR-10 positives, CIFAR-100 negatives" in text
    assert "the mean of the log-likelihoods over the class's prompt templates" in text


def test_table3_shows_the_papers_numbers_of_our_setup_or_else_of_coco(built) -> None:
    text = built.text
    assert row(text, "coco", "asymvlm-vmf")[2:] == [  # the paper's set-up: its coco rows
        *("2", "0.600 ± 0.141", "0.900 ± 0.000", "0.837 / 0.477 / 0.940 / 0.507")
    ]
    assert "CLIP ViT-B/32 fine-tuned on coco, real data" in text
    synthetic = text[text.index("fine-tuning — synthetic") :]
    assert row(synthetic, "fine-tuned on")[3:] == [  # another set-up: COCO's, labelled so
        "zeroshot",
        "paper (CLIP ViT-B/32 fine-tuned on COCO, real data: "
        "CIFAR-10 / CIFAR-100 / STL-10 / ImageNet)",
    ]
    assert row(synthetic, "synthetic", "asymvlm-vmf")[2:] == [
        *("3", "0.760 ± 0.010", "0.837 / 0.477 / 0.940 / 0.507")
    ]
    assert row(synthetic, "– (frozen)", "clip")[2:] == [
        *("1", "0.200", "0.888 / 0.642 / 0.974 / 0.632")
    ]


def test_the_hierarcaps_table_shows_uncertainty_falling_with_the_level(built) -> None:
    hierarchy = row(built.text, "identity")
    assert hierarchy[1].startswith("-0.9") and hierarchy[3] == "1.000"


def test_the_ood_table_has_a_row_per_method_and_perturbation(built) -> None:
    assert row(built.text, "identity", "typos:3")


def test_claims_are_judged_by_rule_leaving_plumbing_runs_out(built) -> None:
    text = built.text
    assert "## The paper's claims, judged by rule" in text and claims.RULE in text
    claim = "Table 2: asymvlm-vmf rejects more negatives than Determ. FT"
    cells = row(text, "nota (synthetic)", claim, "sibling negatives")
    assert cells[4:6] == ["+0.310 ± 0.008", "**supports**"]
    assert row(
        text, "sweep official", "Table 1: Recall@1 falls as asymvlm-vmf's uncertainty rises (S < 0)"
    )
    assert "| zeroshot (–) |" not in text  # the plumbing-only zero-shot run: shown, not judged


def test_the_closing_note_lists_unsupported_claims_and_what_the_world_shows(built) -> None:
    closing = built.text.split("## Closing note", 1)[1]
    assert "5 of 8 judged claims are supported by their rule." in closing
    assert (
        "- Table 3, asymvlm-vmf keeps more zero-shot accuracy after fine-tuning than "
        "Determ. FT, on zeroshot (zeroshot (synthetic)): +0.010 ± 0.008 — not "
        "supported."
    ) in closing
    assert "p = 0.004" in closing and row(closing, "0.02")[1] == "6.8 / 15.6"  # the p curve
    assert "forgetting regime" in closing and "**no mechanism**" in closing


def test_figures_are_drawn_named_per_sweep_and_inlined_in_the_page(built) -> None:
    names = [*FIGURES, "fig_ood_typos.png", "fig3_synthetic_sweep_second.png"]
    for name in names:  # a second sweep of the same data set gets names of its own
        assert (built.folder / name).read_bytes()[:4] == b"\x89PNG"
        assert f"]({name})" in built.text
    # risk-coverage only where a sweep has the curves
    assert not (built.folder / "fig_risk_coverage_synthetic_sweep_second.png").exists()
    page = (built.folder / "report.html").read_text()
    assert "fig_risk_coverage_synthetic.png" not in page  # inlined as a data URI
    assert page.count('<img src="data:image/png;base64,') == built.text.count("![")
    assert "Protocol: official (the authors" in page


def test_the_report_is_logged_as_a_run_with_its_figures(built, store) -> None:
    client = MlflowClient(store)
    experiment = client.get_experiment_by_name(built.experiment)
    reports = client.search_runs([experiment.experiment_id], "tags.kind = 'report'")
    logged = {a.path for a in client.list_artifacts(reports[0].info.run_id)}
    assert {"report.md", "report.html", *FIGURES} <= logged


def test_evaluation_runs_are_read_back_as_records(built, store) -> None:
    """The report reads each evaluation run as an EvaluationResult: its numbers, what ran it."""
    got = logged_evaluations(store, tracking.experiment_runs(store, built.experiment)[1])
    assert {kind: len(results) for kind, results in got.items()} == KINDS
    plumbing = next(r for r in got["zeroshot"] if r.note)
    assert plumbing == EvaluationResult(
        "zeroshot", plumbing.numbers, note="plumbing only", **PAPERS
    )
    assert plumbing.plumbing_only and plumbing.numbers["asymvlm-vmf/seed1"]["stl10"] == 0.9
    (hierarcaps,) = got["hierarcaps"]  # nothing logged beside it: the defaults
    assert hierarcaps == EvaluationResult("hierarcaps", hierarcaps.numbers)


def _classification(root: str, offset: int, seed: int) -> None:
    """15 images of 3 classes near basis vectors ``offset + class``; class and dummy prompts."""
    labels = np.repeat(np.arange(3), 5)
    emb = np.eye(8)[labels + offset] + 0.2 * np.random.default_rng(seed).standard_normal((15, 8))
    prompt = np.vstack([np.eye(8)[:3], np.full((1, 8), 1 / np.sqrt(8))])

    def vectors(x: np.ndarray) -> pa.Array:
        return pa.FixedSizeListArray.from_arrays(pa.array(x.ravel(), pa.float32()), 8)

    images = {"image_id": [f"i{k}" for k in range(15)], "label": labels}
    images["embedding"] = vectors(emb / np.linalg.norm(emb, axis=1, keepdims=True))
    prompts = {"class_index": [0, 1, 2, -1], "class_name": ["c0", "c1", "c2", ""]}
    prompts |= {"template": ["a photo of a {}."] * 3 + [""], "embedding": vectors(prompt)}
    prompts |= {"text": [f"a photo of a c{c}." for c in range(3)] + ["a photo"]}
    prompts["norm"] = pa.array([20.0, 20.0, 20.0, 0.5], pa.float32())
    tables.write_part(root, "test", "images", "part-00000", pa.table(images))
    tables.write_part(root, "test", "prompts", "part-00000", pa.table(prompts))


def test_cli_analyze_logs_runs_that_the_report_shows(store, tmp_path, capsys, monkeypatch) -> None:
    from tests.helpers import save_adapter

    pos, neg = str(tmp_path / "cifar10"), str(tmp_path / "cifar100")
    _classification(pos, offset=0, seed=0)
    _classification(neg, offset=4, seed=1)  # images near none of the classes
    ckpt = str(tmp_path / "ckpt")
    save_adapter(ckpt, "asymvlm-vmf", seed=3)
    log = ["--checkpoint", ckpt, "--tracking-uri", store, "--experiment", "cli"]
    sets = ["--positives", f"{pos}:test", "--negatives", f"{neg}:test"]
    assert main(["analyze", "nota", "--frozen", *sets, *log]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["dummy"]["a photo"]) == {"asymvlm-vmf/seed3", "clip"}
    assert out["dummy"]["a photo"]["clip"]["pos_acc"] == 1.0  # positives sit on their class
    zeroshot = ["--set", f"cifar10={pos}:test", "--fine-tuned-on", "coco"]
    assert main(["analyze", "zeroshot", *zeroshot, *log]) == 0
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)  # asymvlm report honours it
    assert main(["report", "--experiment", "cli", "--output", str(tmp_path / "rep")]) == 0
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "Table 2 analogue" in text and "Table 3 analogue" in text
    page = (tmp_path / "rep" / "report.html").read_text()
    assert "<table>" in page and "Table 2 analogue" in page


def test_the_report_of_an_unknown_experiment_fails_in_one_line(store, tmp_path, capsys) -> None:
    out = ["--output", str(tmp_path / "r2")]
    assert main(["report", "--tracking-uri", store, "--experiment", "nope", *out]) == 2
    assert capsys.readouterr().err == f"error: no MLflow experiment 'nope' at {store}\n"
    assert not (tmp_path / "r2").exists()  # nothing written


def test_analyze_names_a_bad_or_missing_set_in_one_line(capsys) -> None:
    assert main(["analyze", "nota", "--positives", "nowhere", "--negatives", "n:test"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: asymvlm analyze nota: --positives = 'nowhere': expected ROOT:SPLIT (a table root "
        "and a split name)"
    )
    assert main(["analyze", "nota", "--positives", "p:test"]) == 2  # argparse's, in one line
    err = capsys.readouterr().err
    assert err.startswith("error: asymvlm analyze nota: ") and "--negatives" in err
    assert err.count("\n") == 1


# -- Table 1 analogue: sweeps as the report reads them ---------------------------------------
def _test_results(r1: float, auroc: float, aurc: float, ece: float, rsum: float) -> dict:
    """A trial's test results as ``evaluate_retrieval`` returns them (i2t: t2i + 0.01)."""
    out: dict = {"rsum": rsum}
    for d, shift in (("t2i", 0.0), ("i2t", 0.01)):
        values = (r1, -0.9, 0.8, auroc, auroc / 2, 1 - auroc, aurc, ece)
        out[d] = {k: v + shift for k, v in zip(RETRIEVAL_KEYS, values, strict=True)}
        out[d] |= {
            "binned_recall@1": [r1 + shift] * 3,
            "risk_coverage": {"coverage": COVERAGE, "risk": [(aurc + shift) * c for c in COVERAGE]},
        }
    return out


def _log_sweep(uri: str, exp: str, name: str, trials: list[tuple], protocol: str | None) -> None:
    """A parent ``kind=sweep`` run and one seed run per (method, test results)."""
    params = {"dataset": "synthetic", "embedding_model": "tiny"}
    methods = json.dumps(sorted({m for m, _ in trials}, reverse=True))  # not the logged order
    parent_params = {**params, "methods": methods, **({"protocol": protocol} if protocol else {})}
    sweep = {"kind": "sweep", "params": parent_params, "tags": {"sweep": name}}
    with tracking.run(uri, exp, f"sweep {name}", **sweep) as parent:
        for k, (method, test) in enumerate(trials):
            trial = {"params": {**params, "method": method, "seed": k}, "parent": parent}
            trial |= {"kind": "trial", "tags": {"stage": "seeds"}}
            with tracking.run(uri, exp, f"{method} seed{k}", **trial) as child:
                child.log_json("results.json", {"test": test, "val": {}})


def _ms(values: list[float], scale: float = 1.0, digits: int = 3) -> str:
    vals = [scale * v for v in values]
    return f"{np.mean(vals):.{digits}f} ± {np.std(vals, ddof=1):.{digits}f}"


# -- the paper's claims, judged by their rule (asymvlm.report.claims) ---------------------------
@pytest.mark.parametrize(
    ("a", "b", "direction", "verdict"),
    [
        ([0.60, 0.62, 0.64], [0.40, 0.42, 0.44], 1, "supports"),
        ([0.60, 0.62, 0.64], [0.40, 0.42, 0.44], -1, "contradicts"),
        ([0.40, 0.60, 0.50], [0.45, 0.55, 0.45], 1, "not supported"),  # within 2 SE
        ([0.999, 0.999, 0.999], [0.998, 0.998, 0.998], 1, "not supported"),  # below 0.01
        ([0.50, 0.60], [0.46, 0.46], 1, "not supported"),  # 0.09 < 2 SE = 0.1
        ([0.50, 0.60], [0.40, 0.40], 1, "supports"),  # 0.15 > 2 SE
        ([-0.9, -0.95, -0.97], [0.0], -1, "supports"),  # Table 1: S below 0
        ([0.6], [0.4], 1, "undetermined (no seeds to estimate an error)"),
    ],
)
def test_the_rule(a, b, direction, verdict) -> None:
    """Beyond 2 SE of the difference of two means (one value counting as exact) and 0.01."""
    diff, se, got = claims.judge(a, b, direction)
    assert got == verdict
    assert diff == pytest.approx(statistics.fmean(a) - statistics.fmean(b))
    want = math.sqrt(sum(statistics.variance(x) / len(x) for x in (a, b) if len(x) > 1))
    assert se == pytest.approx(want)


def _nota_result() -> dict:
    cells = {}
    for dummy, shift in (("a photo", 0.0), ("a photo of something", 0.02)):
        cells[dummy] = {"clip": {"pos_acc": 0.95, "neg_acc": 0.1, "far_neg_acc": 0.6}}
        for s in range(3):
            vmf = {"pos_acc": 0.9, "neg_acc": 0.5 + 0.01 * s + shift, "far_neg_acc": 0.3}
            ft = {"pos_acc": 0.8, "neg_acc": 0.2 + 0.01 * s, "far_neg_acc": 0.3 + 0.01 * s}
            cells[dummy] |= {f"asymvlm-vmf/seed{s}": vmf, f"determ-ft/seed{s}": ft}
    return {"dummy": cells, "rejection": {}}


def test_an_evaluation_run_holds_the_headline_numbers_and_the_rest_in_its_json(store) -> None:
    """Metrics: per method (mean over seeds), direction and set; every number in results.json."""
    retrieval = {
        f"asymvlm-vmf/seed{s}": _test_results(0.3 + 0.1 * s, 0.7, 0.4, 0.1, 2) for s in (0, 1)
    }
    retrieval["clip"] = _test_results(0.5, 0.6, 0.4, 0.1, 2)
    runs = {"retrieval": retrieval, "nota": _nota_result()}
    ids = [log_evaluation(store, "headline", kind, result) for kind, result in runs.items()]
    got, nota = (MlflowClient(store).get_run(i).data.metrics for i in ids)
    keys = ("recall_at_1", "spearman", "r2", "auroc")  # recall@5/10 not in these results
    assert set(got) == {
        f"{m}/{d}_{k}" for m in ("asymvlm-vmf", "clip") for d in ("t2i", "i2t") for k in keys
    }
    assert got["asymvlm-vmf/i2t_recall_at_1"] == pytest.approx(0.36)  # (0.31 + 0.41) / 2
    assert got["asymvlm-vmf/t2i_spearman"] == pytest.approx(-0.9) and got["clip/t2i_auroc"] == 0.6
    assert tracking.json_artifact(store, ids[0], "results.json") == retrieval  # curves included
    assert nota == pytest.approx(
        {"clip/pos_acc": 0.95, "clip/neg_acc": 0.1, "clip/far_neg_acc": 0.6}
        | {"asymvlm-vmf/pos_acc": 0.9, "asymvlm-vmf/neg_acc": 0.52, "asymvlm-vmf/far_neg_acc": 0.3}
        | {"determ-ft/pos_acc": 0.8, "determ-ft/neg_acc": 0.21, "determ-ft/far_neg_acc": 0.31}
    )


def test_table2_claims_are_judged_on_each_seeds_mean_over_the_dummy_prompts() -> None:
    verdicts = {(v.claim, v.where): v for v in claims.table2_verdicts(_nota_result())}
    sib = verdicts["asymvlm-vmf rejects more negatives than Determ. FT", "sibling negatives"]
    assert sib.a == pytest.approx((0.51, 0.52, 0.53)) and sib.b == pytest.approx((0.2, 0.21, 0.22))
    assert sib.verdict == "supports" and sib.paper.startswith("0.576 vs 0.092")
    far = verdicts["asymvlm-vmf rejects more negatives than the frozen model", "far negatives"]
    assert far.b == (0.6,) and far.verdict == "contradicts"
    far = verdicts["asymvlm-vmf rejects more negatives than Determ. FT", "far negatives"]
    assert far.verdict == "not supported"
    pos = verdicts["asymvlm-vmf keeps more positives than Determ. FT", "positives"]
    assert pos.verdict == "supports"
    assert not any("asymvlm-ps" in claim for claim, _ in verdicts)  # not evaluated: not judged


def test_table3_claims_are_judged_per_evaluation_set() -> None:
    res = {f"asymvlm-vmf/seed{s}": {"zs": 0.75 + 0.01 * s, "pos": 0.99} for s in range(5)}
    res |= {f"determ-ft/seed{s}": {"zs": 0.70 + 0.01 * s, "pos": 0.99} for s in range(5)}
    res["clip"] = {"zs": 0.96, "pos": 0.99}
    got = {v.where: v for v in claims.table3_verdicts(res)}
    assert set(got) == {"pos", "zs"} and got["pos"].verdict == "not supported"
    assert got["zs"].difference == pytest.approx(0.05)
    assert got["zs"].se == pytest.approx(0.01) and got["zs"].verdict == "supports"


def test_the_generic_curve_is_the_recorded_benchmark() -> None:
    """:data:`GENERIC_CURVE` (printed by the report) holds the means of the run kept in docs."""
    with open(os.path.join(os.path.dirname(__file__), "..", CURVE_RUN)) as fh:
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


class ConstKappa(AsymVLM):
    """A plugin's method: one kappa shared by every caption."""

    roles = Roles(claims=True, ablation_of="asymvlm-vmf")


@pytest.fixture
def plugin(add_method) -> None:
    add_method("vmf-const", ConstKappa)


def cells(table: str, method: str) -> dict[str, str]:
    """A markdown table's row of ``method`` by heading."""
    return dict(zip(row(table, "Method"), row(table, method), strict=True))


def _seed_rows(method: str, uncertainty, seeds: int = 2) -> list[dict]:
    """One Table 1 row per seed: 60 captions of 60 images, noisy scores, ``uncertainty(seed)``."""
    rows = []
    for seed in range(seeds):
        gen = torch.Generator().manual_seed(seed)
        scores = torch.eye(60) + 3 * torch.rand(60, 60, generator=gen)
        res = retrieval_metrics(
            lambda a, b, s=scores: s[a:b], 60, 60, torch.arange(60), uncertainty(seed, scores)
        )
        rows.append({"method": method, **retrieval_metric_names(res)})
    return rows


def _paired(seed: int, scores: torch.Tensor) -> torch.Tensor:
    return -scores.diagonal()  # uncertain where the pair scores low


def test_a_constant_uncertainty_is_undefined_in_table1_and_not_judged(plugin) -> None:
    """A constant uncertainty's columns show "–" and enter no claim; R@1 and ECE stay."""
    rows = _seed_rows("asymvlm-vmf", _paired) + _seed_rows("vmf-const", lambda *_: torch.ones(60))
    rows += _seed_rows("no-roles", _paired, seeds=1)
    text = sweep_sections.table1(rows, "T", {})
    const = cells(text, "vmf-const")
    for d in ("i2t", "t2i"):
        for h in ("S", "R²", "AUROC", "AUPR", "FPR@95", "AURC"):
            assert const[f"{d} {h}"] == "–"
        assert const[f"{d} R@1 (%)"] != "–" and const[f"{d} ECE"] != "–"
    vmf = cells(text, "asymvlm-vmf")
    assert vmf["t2i S"] != "–" and vmf["t2i AUROC"] != "–"
    assert row(text, "no-roles")[1] == "1"
    judged = claims.table1_verdicts(rows)
    assert {(v.claim, v.where) for v in judged} == {
        ("Recall@1 falls as asymvlm-vmf's uncertainty rises (S < 0)", d) for d in ("i2t", "t2i")
    }


def test_the_demo_table_shows_an_undefined_correlation_as_a_dash() -> None:
    """The demo's table: a constant uncertainty's undefined Spearman is "—"."""
    from asymvlm.demo import results_table
    from asymvlm.metrics import spearman_uncertainty

    undefined = spearman_uncertainty([0.5] * 4, [4, 2, 3, 1])
    side = {"recall@1": 0.5, "r2": None, "spearman": undefined}
    result = {"i2t": side, "t2i": side, "seconds": 1.0}
    result["spearman_uncertainty_abstraction"] = undefined
    text = results_table({"vmf-const": result})
    got = dict(zip(row(text, "method"), row(text, "vmf-const"), strict=True))
    assert got["i2t R@1"] == "0.500" and got["t2i S"] == got["S(u, abstraction)"] == "—"
    assert "nan" not in text


def test_an_undefined_seed_value_is_left_out_of_mean_and_std() -> None:
    """NaN and None in one seed's cell: mean ± std over the other seeds, and judged on them."""
    rows = [{"method": "asymvlm-vmf", "t2i_spearman": v} for v in (-0.9, math.nan, None, -0.7)]
    rows.append({"method": "determ-ft", "t2i_spearman": math.nan})
    text = sweep_sections.table1(rows, "T", {})
    assert cells(text, "asymvlm-vmf")["t2i S"] == "-0.80 ± 0.14"
    assert cells(text, "determ-ft")["t2i S"] == "–"
    (verdict,) = claims.table1_verdicts(rows)
    assert verdict.a == (-0.9, -0.7) and verdict.ours().startswith("S -0.800 ± 0.141 (n=2)")


def test_the_ablation_figure_takes_the_ablations_and_what_they_ablate(plugin) -> None:
    """Fig. 4's methods by their ``Roles(ablation_of=...)``, a plugin's too; none: no figure."""
    results = dict.fromkeys(["determ-ft", "symvlm", "asymvlm-vmf", "vmf-const", "unknown", "clip"])
    assert list(sweep_sections.ablations(results)) == ["symvlm", "asymvlm-vmf", "vmf-const"]
    assert list(sweep_sections.ablations({"determ-ft": 0, "unknown": 0})) == []


def test_a_plugin_with_the_claims_role_is_judged_without_paper_numbers(plugin) -> None:
    nota = _nota_result()
    for cells in nota["dummy"].values():
        cells |= {f"vmf-const/seed{s}": cells[f"asymvlm-vmf/seed{s}"] for s in range(3)}
    judged = claims.table2_verdicts(nota)
    const = [v for v in judged if v.a_name == "vmf-const"]
    assert len(const) == len(judged) / 2 == 5 and {v.paper for v in const} == {"–"}
    zero = {f"vmf-const/seed{s}": {"zs": 0.8} for s in range(2)} | {"determ-ft/seed0": {"zs": 0.7}}
    (verdict,) = claims.table3_verdicts(zero)
    assert verdict.paper == "–" and verdict.a_name == "vmf-const"


def test_a_method_declaring_no_uncertainty_shows_none(monkeypatch, add_method) -> None:
    """``Roles(uncertainty=False)``: the report blanks the numbers its uncertainty gave."""
    t2i = {"recall@1": 0.5, "spearman": -0.5, "e_aurc": 0.1, "binned_recall@1": [0.6, 0.4]}
    monkeypatch.setattr(sweep_sections.tracking, "json_artifact", lambda *_: {"test": {"t2i": t2i}})
    flat = type("Flat", (AsymVLM,), {"roles": Roles(uncertainty=False)})
    add_method("flat", flat)
    ns = types.SimpleNamespace
    got = {
        m: sweep_sections.seed_row("", ns(info=ns(run_id=""), data=ns(params={"method": m})))
        for m in ("flat", "asymvlm-vmf")
    }
    vmf = [got["asymvlm-vmf"][f"t2i_{k}"] for k in ("spearman", "e_aurc", "binned_recall@1")]
    assert vmf == [-0.5, 0.1, [0.6, 0.4]]
    kept = {k: v for k, v in got["flat"].items() if v is not None}
    assert kept == {"method": "flat", "t2i_recall_at_1": 0.5}


def test_the_ui_starts_one_quiet_worker_that_lists_the_runs(tmp_path) -> None:
    """``asymvlm ui``: one server process, no job runner, no warning, the store's runs shown."""
    import subprocess
    import sys
    import urllib.request

    log_evaluation(f"sqlite:///{tmp_path}/mlflow.db", "ui", "zeroshot", {"clip": {"a": 0.5}})
    port = free_port()
    command = [sys.executable, "-m", "asymvlm.cli", "ui", str(tmp_path), "--port", str(port)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    ui = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/ajax-api/2.0/mlflow/runs/search"
    try:
        for _ in range(600):
            try:
                query = json.dumps({"experiment_ids": ["1"]}).encode()
                request = urllib.request.Request(url, query, {"Content-Type": "application/json"})
                runs = json.load(urllib.request.urlopen(request, timeout=5))["runs"]
                break
            except OSError:
                assert ui.poll() is None, ui.stdout.read().decode()
                time.sleep(0.2)
    finally:
        ui.terminate()
        out = ui.communicate(timeout=60)[0].decode()
    assert [r["info"]["run_name"] for r in runs] == ["eval zeroshot"]
    assert out.count("Started server process") == 1, out
    assert "Warning" not in out and "huey" not in out.lower(), out
