"""Evaluation runs in MLflow -> report.md with the paper's tables, figures and paper numbers."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pytest

from asymvlm import tables
from asymvlm.cli import main
from asymvlm.evaluation.registry import log_evaluation
from asymvlm.evaluation.suite import evaluate_hierarcaps, evaluate_ood
from asymvlm.methods import build_method
from asymvlm.report import build_report
from asymvlm.training import TrainConfig, save_checkpoint
from tests.test_hierarchy import _write as write_hierarchy
from tests.test_ood import _pair
from tests.test_zeroshot import IdentityVMF


def _store(tmp_path) -> str:
    return "sqlite:///" + str(tmp_path / "mlflow.db")


def test_report_gathers_tables_figures_and_paper_numbers(tmp_path) -> None:
    uri, exp = _store(tmp_path), "report-test"
    nota = {
        "dummy": {"a photo": {
            "asymvlm-vmf/seed0": {"pos_acc": 0.8, "neg_acc": 0.6},
            "asymvlm-vmf/seed1": {"pos_acc": 0.9, "neg_acc": 0.4},
            "clip": {"pos_acc": 0.95, "neg_acc": 0.0},
        }},
        "rejection": {"threshold": {"pos_acc": 0.7, "neg_acc": 0.5, "cut": 0.3}},
    }  # fmt: skip
    log_evaluation(uri, exp, "nota", nota)
    zero = {"asymvlm-vmf/seed0": {"cifar10": 0.5, "stl10": 0.9},
            "asymvlm-vmf/seed1": {"cifar10": 0.7, "stl10": 0.9}}  # fmt: skip
    log_evaluation(uri, exp, "zeroshot", zero, params={
        "fine_tuned_on": "coco", "embedding_model": "openai/clip-vit-base-patch32"})  # fmt: skip
    write_hierarchy(str(tmp_path / "hc"), np.tile([2.0, 5.0, 12.0, 30.0], (6, 1)))
    from asymvlm.training import load_split

    hier = evaluate_hierarcaps({"identity/seed0": _with_input(IdentityVMF(8))},
                               str(tmp_path / "hc"), "test")  # fmt: skip
    log_evaluation(uri, exp, "hierarcaps", hier)
    _pair(tmp_path, noise=3.0, kappa_scale=0.2)
    ood = evaluate_ood({"identity/seed0": _with_input(IdentityVMF(16))},
                       (str(tmp_path / "clean"), "test"),
                       {"typos:3": (str(tmp_path / "typos"), "test")})  # fmt: skip
    log_evaluation(uri, exp, "ood", ood)
    assert load_split(str(tmp_path / "hc"), "test").split.n_texts == 24

    path = build_report(uri, exp, str(tmp_path / "report"))
    text = open(path).read()
    assert '| "a photo" | asymvlm-vmf | 0.850 ± 0.071 | 0.500 ± 0.141 | 0.857, 0.587 |' in text
    assert '| "a photo" | clip | 0.950 | 0.000 | 0.888, 0.009 |' in text
    assert "| (none) | threshold-based (frozen) | 0.700 | 0.500 | 0.646, 0.560 |" in text
    assert "| coco | asymvlm-vmf | 0.600 ± 0.141 | 0.900 ± 0.000 |" in text
    assert "| coco | asymvlm-vmf (paper) | 0.837 | 0.940 |" in text  # CIFAR-10, STL-10
    row = next(line for line in text.splitlines() if line.startswith("| identity | -0.9"))
    assert row.endswith("| 1.000 |")  # every hierarchy's uncertainty falls with level
    assert "| identity | typos:3 |" in text
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
    images = pa.table({
        "image_id": [f"i{k}" for k in range(len(labels))],
        "embedding": pa.FixedSizeListArray.from_arrays(pa.array(emb.ravel(), pa.float32()), d),
        "label": labels,
    })  # fmt: skip
    texts = [f"a photo of a c{c}." for c in range(3)] + ["a photo"]
    prompt = np.vstack([basis[:3], np.full((1, d), 1 / np.sqrt(d))])
    prompts = pa.table({
        "class_index": [0, 1, 2, -1], "class_name": ["c0", "c1", "c2", ""],
        "template": ["a photo of a {}."] * 3 + [""], "text": texts,
        "embedding": pa.FixedSizeListArray.from_arrays(pa.array(prompt.ravel(), pa.float32()), d),
        "norm": pa.array([20.0, 20.0, 20.0, 0.5], pa.float32()),
    })  # fmt: skip
    tables.write_part(root, "test", "images", "part-00000", images)
    tables.write_part(root, "test", "prompts", "part-00000", prompts)


def test_cli_analyze_logs_runs_that_the_report_shows(tmp_path, capsys) -> None:
    pos, neg = str(tmp_path / "cifar10"), str(tmp_path / "cifar100")
    _classification(pos, 5, 3, offset=0, seed=0)
    _classification(neg, 5, 3, offset=4, seed=1)  # images near none of the classes
    ckpt = str(tmp_path / "ckpt")
    method = build_method("asymvlm-vmf", 8, hidden_dim=16)
    save_checkpoint(ckpt, method, TrainConfig(method="asymvlm-vmf", hidden_dim=16, seed=3), 8)
    uri = _store(tmp_path)
    rc = main(["analyze", "nota", "--checkpoint", ckpt, "--frozen", "--positives",
               f"{pos}:test", "--negatives", f"{neg}:test", "--mlflow-uri", uri,
               "--experiment", "cli"])  # fmt: skip
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["dummy"]["a photo"]) == {"asymvlm-vmf/seed3", "clip"}
    assert out["dummy"]["a photo"]["clip"]["pos_acc"] == 1.0  # positives sit on their class
    rc = main(["analyze", "zeroshot", "--checkpoint", ckpt, "--set", f"cifar10={pos}:test",
               "--fine-tuned-on", "coco", "--mlflow-uri", uri, "--experiment", "cli"])  # fmt: skip
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
        "error: nota: --positives: expected ROOT:SPLIT, got 'nowhere'"
    )
    with pytest.raises(SystemExit) as exc:  # argparse: a missing option, with the usage
        main(["analyze", "nota", "--positives", f"{pos}:test"])
    assert exc.value.code == 2
    assert "--negatives" in capsys.readouterr().err
