"""Evaluation runs in MLflow -> report.md with the paper's tables, figures and paper numbers."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pytest

from asymvlm import tables
from asymvlm.checkpoints import save_checkpoint
from asymvlm.cli import main
from asymvlm.evaluation.registry import log_evaluation
from asymvlm.evaluation.suite import evaluate_hierarcaps, evaluate_ood
from asymvlm.methods import build_method
from asymvlm.report import build_report
from asymvlm.results import mean_std, seed_stats
from asymvlm.tables import Location
from asymvlm.training import TrainConfig
from tests.test_hierarchy import _write as write_hierarchy
from tests.test_ood import _pair
from tests.test_zeroshot import IdentityVMF


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


def test_mean_std_cells_leave_undefined_values_out() -> None:
    """One value: bare or ± 0; none defined (None, NaN: a constant uncertainty's Spearman): –."""
    rows = [
        {"m": "a", "x": 0.5, "y": float("nan")},
        {"m": "a", "x": 0.7, "y": None},
        {"m": "b", "x": 0.25, "y": 1.0},
    ]
    stats = seed_stats(rows, "m", ["x", "y"])
    assert stats["seeds"].tolist() == [2, 1]
    assert mean_std(stats, "x") == ["0.600 ± 0.141", "0.250 ± 0.000"]
    assert mean_std(stats, "y", scale=100, digits=1, bare=True) == ["–", "100.0"]


def test_report_gathers_tables_figures_and_paper_numbers(store, tmp_path) -> None:
    uri, exp = store, "report-test"
    nota = {
        "dummy": {
            "a photo": {
                "asymvlm-vmf/seed0": {"pos_acc": 0.8, "neg_acc": 0.6},
                "asymvlm-vmf/seed1": {"pos_acc": 0.9, "neg_acc": 0.4},
                "clip": {"pos_acc": 0.95, "neg_acc": 0.0},
            }
        },
        "rejection": {"threshold": {"pos_acc": 0.7, "neg_acc": 0.5, "cut": 0.3}},
    }
    log_evaluation(uri, exp, "nota", nota)
    zero = {
        "asymvlm-vmf/seed0": {"cifar10": 0.5, "stl10": 0.9},
        "asymvlm-vmf/seed1": {"cifar10": 0.7, "stl10": 0.9},
    }
    log_evaluation(
        uri,
        exp,
        "zeroshot",
        zero,
        params={"fine_tuned_on": "coco", "embedding_model": "openai/clip-vit-base-patch32"},
    )
    write_hierarchy(str(tmp_path / "hc"), np.tile([2.0, 5.0, 12.0, 30.0], (6, 1)))
    from asymvlm.splits import load_split

    hier = evaluate_hierarcaps(
        {"identity/seed0": _with_input(IdentityVMF(8))}, Location(str(tmp_path / "hc"), "test")
    )
    log_evaluation(uri, exp, "hierarcaps", hier)
    _pair(tmp_path, noise=3.0, kappa_scale=0.2)
    ood = evaluate_ood(
        {"identity/seed0": _with_input(IdentityVMF(16))},
        Location(str(tmp_path / "clean"), "test"),
        {"typos:3": Location(str(tmp_path / "typos"), "test")},
    )
    log_evaluation(uri, exp, "ood", ood)
    assert load_split(str(tmp_path / "hc"), "test").split.n_texts == 24

    path = build_report(uri, exp, str(tmp_path / "report"))
    text = open(path).read()
    assert row(text, '"a photo"', "asymvlm-vmf")[2:] == [
        "2",
        "0.850 ± 0.071",
        "0.500 ± 0.141",
        "0.857, 0.587",
    ]
    assert row(text, '"a photo"', "clip")[2:] == ["1", "0.950", "0.000", "0.888, 0.009"]
    assert row(text, "(none)")[1:] == [
        "threshold-based (frozen)",
        "1",
        "0.700",
        "0.500",
        "0.646, 0.560",
    ]
    assert "(positives: CIFAR-10, negatives: CIFAR-100)" in text  # no set names logged
    assert "CLIP ViT-B/32 on real data: CIFAR-10 positives, CIFAR-100 negatives" in text
    assert row(text, "coco", "asymvlm-vmf")[2:] == ["2", "0.600 ± 0.141", "0.900 ± 0.000"]
    assert row(text, "coco", "asymvlm-vmf (paper)")[2:] == ["–", "0.837", "0.940"]
    hierarchy = row(text, "identity")
    assert hierarchy[1].startswith("-0.9") and hierarchy[3] == "1.000"  # uncertainty falls
    assert row(text, "identity", "typos:3")
    for name in ("fig5_hierarcaps.png", "fig_ood_typos.png"):
        assert open(os.path.join(tmp_path / "report", name), "rb").read(4) == b"\x89PNG"
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(exp)
    reports = client.search_runs([experiment.experiment_id], "tags.kind = 'report'")
    logged = {a.path for a in client.list_artifacts(reports[0].info.run_id)}
    assert {"report.md", "fig5_hierarcaps.png", "fig_ood_typos.png"} <= logged
    with pytest.raises(ValueError, match="no MLflow experiment"):
        build_report(uri, "nope", str(tmp_path / "r2"))


def _with_input(method, adapter_input: str = "raw"):
    method.adapter_input = adapter_input
    return method


def _classification(root: str, n_per_class: int, classes: int, offset: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    d = 8
    basis = np.eye(d)
    labels = np.repeat(np.arange(classes), n_per_class)
    emb = basis[labels + offset] + 0.2 * rng.standard_normal((len(labels), d))
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    images = pa.table(
        {
            "image_id": [f"i{k}" for k in range(len(labels))],
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(emb.ravel(), pa.float32()), d),
            "label": labels,
        }
    )
    texts = [f"a photo of a c{c}." for c in range(3)] + ["a photo"]
    prompt = np.vstack([basis[:3], np.full((1, d), 1 / np.sqrt(d))])
    prompts = pa.table(
        {
            "class_index": [0, 1, 2, -1],
            "class_name": ["c0", "c1", "c2", ""],
            "template": ["a photo of a {}."] * 3 + [""],
            "text": texts,
            "embedding": pa.FixedSizeListArray.from_arrays(
                pa.array(prompt.ravel(), pa.float32()), d
            ),
            "norm": pa.array([20.0, 20.0, 20.0, 0.5], pa.float32()),
        }
    )
    tables.write_part(root, "test", "images", "part-00000", images)
    tables.write_part(root, "test", "prompts", "part-00000", prompts)


def test_cli_analyze_logs_runs_that_the_report_shows(store, tmp_path, capsys) -> None:
    pos, neg = str(tmp_path / "cifar10"), str(tmp_path / "cifar100")
    _classification(pos, 5, 3, offset=0, seed=0)
    _classification(neg, 5, 3, offset=4, seed=1)  # images near none of the classes
    ckpt = str(tmp_path / "ckpt")
    method = build_method("asymvlm-vmf", 8, hidden_dim=16)
    save_checkpoint(ckpt, method, TrainConfig(method="asymvlm-vmf", hidden_dim=16, seed=3), 8)
    uri = store
    rc = main(
        [
            "analyze",
            "nota",
            "--checkpoint",
            ckpt,
            "--frozen",
            "--positives",
            f"{pos}:test",
            "--negatives",
            f"{neg}:test",
            "--mlflow-uri",
            uri,
            "--experiment",
            "cli",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["dummy"]["a photo"]) == {"asymvlm-vmf/seed3", "clip"}
    assert out["dummy"]["a photo"]["clip"]["pos_acc"] == 1.0  # positives sit on their class
    rc = main(
        [
            "analyze",
            "zeroshot",
            "--checkpoint",
            ckpt,
            "--set",
            f"cifar10={pos}:test",
            "--fine-tuned-on",
            "coco",
            "--mlflow-uri",
            uri,
            "--experiment",
            "cli",
        ]
    )
    assert rc == 0
    capsys.readouterr()
    os.environ["MLFLOW_TRACKING_URI"] = uri  # asymvlm report honours it (no --mlflow-uri)
    try:
        assert main(["report", "--experiment", "cli", "--output", str(tmp_path / "rep")]) == 0
    finally:
        del os.environ["MLFLOW_TRACKING_URI"]
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "Table 2 analogue" in text and "Table 3 analogue" in text
    page = (tmp_path / "rep" / "report.html").read_text()
    assert "<table>" in page and "Table 2 analogue" in page
    capsys.readouterr()
    assert main(["analyze", "nota", "--positives", "nowhere", "--negatives", f"{neg}:test"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: asymvlm analyze nota: --positives = 'nowhere': expected ROOT:SPLIT (a table root "
        "and a split name)"
    )
    with pytest.raises(SystemExit) as exc:  # argparse: a missing option, with the usage
        main(["analyze", "nota", "--positives", f"{pos}:test"])
    assert exc.value.code == 2
    assert "--negatives" in capsys.readouterr().err


# -- Table 1 analogue: selective-retrieval columns, protocol, risk-coverage figure ---------------
def _curve(scale: float) -> dict[str, list[float]]:
    coverage = [(k + 1) / 20 for k in range(20)]
    return {"coverage": coverage, "risk": [scale * c for c in coverage]}


def _test_results(r1: float, auroc: float, aurc: float, ece: float, rsum: float) -> dict:
    """A trial's test results as ``evaluate_retrieval`` returns them (i2t: t2i + 0.01)."""
    out: dict = {"rsum": rsum}
    for d, shift in (("t2i", 0.0), ("i2t", 0.01)):
        out[d] = {
            "recall@1": r1 + shift,
            "spearman": -0.9 + shift,
            "r2": 0.8 + shift,
            "auroc": auroc + shift,
            "aupr": auroc / 2 + shift,
            "fpr@95tpr": 1 - auroc + shift,
            "aurc": aurc + shift,
            "ece": ece + shift,
            "binned_recall@1": [r1 + shift] * 3,
            "risk_coverage": _curve(aurc + shift),
        }
    return out


def _log_sweep(uri: str, exp: str, name: str, trials: list[tuple], protocol: str | None) -> None:
    """A sweep run as the report reads it: a parent ``kind=sweep`` and one seed run per trial
    (method, test results) with its ``results.json``."""
    from asymvlm import tracking

    params = {"dataset": "synthetic", "embedding_model": "tiny"}
    methods = json.dumps(sorted({m for m, _ in trials}, reverse=True))  # not the logged order
    parent_params = {**params, "methods": methods, **({"protocol": protocol} if protocol else {})}
    with tracking.run(
        uri, exp, f"sweep {name}", kind="sweep", params=parent_params, tags={"sweep": name}
    ) as parent:
        for k, (method, test) in enumerate(trials):
            with tracking.run(
                uri,
                exp,
                f"{method} seed{k}",
                kind="trial",
                parent=parent,
                params={**params, "method": method, "seed": k},
                tags={"stage": "seeds"},
            ) as child:
                child.log_json("results.json", {"test": test, "val": {}})


def _ms(values: list[float], scale: float = 1.0, digits: int = 3) -> str:
    vals = [scale * v for v in values]
    return f"{np.mean(vals):.{digits}f} ± {np.std(vals, ddof=1):.{digits}f}"


@pytest.mark.slow
def test_table1_has_selective_columns_protocol_and_risk_coverage_figure(store, tmp_path) -> None:
    uri, exp = store, "table1"
    vmf = [_test_results(0.30, 0.70, 0.40, 0.10, 2.1), _test_results(0.34, 0.76, 0.36, 0.14, 2.4)]
    ft = [_test_results(0.40, 0.5, 0.5, 0.2, 3.0), _test_results(0.44, 0.5, 0.5, 0.3, 3.2)]
    for test in ft:  # no uncertainty: no binned curve, S, detectors or risk-coverage
        for d in ("t2i", "i2t"):
            test[d] = {k: v for k, v in test[d].items() if k in ("recall@1", "ece")}
    trials = [("asymvlm-vmf", vmf[0]), ("determ-ft", ft[0]), ("asymvlm-vmf", vmf[1])]
    _log_sweep(uri, exp, "official", trials, "official")
    _log_sweep(uri, exp, "second", [("determ-ft", t) for t in ft], protocol=None)

    out = tmp_path / "report"
    text = open(build_report(uri, exp, str(out))).read()
    first = "### Table 1 analogue — sweep official: synthetic (tiny)"
    second = "### Table 1 analogue — sweep second: synthetic (tiny)"
    assert text.index(first) < text.index(second)
    lines = text.splitlines()
    assert lines[lines.index(first) + 2] == "*Protocol: official (the authors' code).*"
    assert lines[lines.index(second) + 2] == (
        "*Protocol: improved (this project's defaults; see README 'Protocols').*"
    )
    heads = ["R@1 (%)", "S", "R²", "AUROC", "AUPR", "FPR@95", "AURC", "ECE"]
    head = row(text, "Method")
    assert head == ["Method", "seeds", *(f"{d} {h}" for d in ("i2t", "t2i") for h in heads), "RSUM"]
    official = text[text.index(first) : text.index(second)]
    assert official.index("| determ-ft") < official.index("| asymvlm-vmf")  # config order
    cells = dict(zip(head, row(official, "asymvlm-vmf"), strict=True))
    assert cells["seeds"] == "2"
    keys = ["spearman", "r2", "auroc", "aupr", "fpr@95tpr", "aurc", "ece"]
    for d in ("i2t", "t2i"):
        assert cells[f"{d} R@1 (%)"] == _ms([t[d]["recall@1"] for t in vmf], 100, 2)
        for key, name in zip(keys, heads[1:], strict=True):
            digits = 2 if key in ("spearman", "r2") else 3
            assert cells[f"{d} {name}"] == _ms([t[d][key] for t in vmf], digits=digits)
    assert cells["RSUM"] == _ms([t["rsum"] for t in vmf], digits=2)
    cells = dict(zip(head, row(text[text.index(second) :], "determ-ft"), strict=True))
    assert cells["t2i ECE"] == _ms([t["t2i"]["ece"] for t in ft])
    assert cells["t2i AUROC"] == cells["i2t S"] == "–"  # undefined without an uncertainty

    # Figures: the risk-coverage figure beside fig3 only where a sweep has curves; the second
    # sweep of the same data set gets its own names.
    for name in ("fig3_synthetic.png", "fig_risk_coverage_synthetic.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
        assert f"]({name})" in text
    assert (out / "fig3_synthetic_sweep_second.png").exists()
    assert not (out / "fig_risk_coverage_synthetic_sweep_second.png").exists()
    page = (out / "report.html").read_text()
    assert "fig_risk_coverage_synthetic.png" not in page  # inlined as a data URI
    assert page.count('<img src="data:image/png;base64,') == text.count("![")
    assert "Protocol: official (the authors" in page
