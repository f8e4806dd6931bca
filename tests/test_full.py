"""pipelines/full.py: configuration, overrides and resumable stages (no Ray needed here)."""

from __future__ import annotations

import os

import pytest

from pipelines import full

DEMO = os.path.join(os.path.dirname(__file__), "..", "configs", "demo.yaml")


def test_demo_config_resolves(tmp_path) -> None:
    cfg = full.load_config(DEMO, [f"output={tmp_path}", "sweeps.0.epochs=3"])
    assert cfg["output"] == str(tmp_path)
    assert cfg["mlflow"]["tracking_uri"] == "sqlite:///" + str(tmp_path / "mlflow.db")
    assert cfg["sweeps"][0]["epochs"] == 3 and cfg["sweeps"][0]["name"] == "synthetic"
    kinds = [e["kind"] for e in cfg["evaluations"]]
    assert {"hierarcaps", "zeroshot", "nota", "ood"} <= set(kinds)
    scfg = full._sweep_config(cfg, cfg["sweeps"][1])
    assert scfg["output"] == str(tmp_path / "sweeps" / "hierarcaps-tiny")
    assert scfg["val_fraction"] == 0.2 and scfg["mlflow"] == cfg["mlflow"]


def test_bad_configs_fail_naming_the_problem(tmp_path, capsys) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("sweeps: [{name: a}, {name: a}]\n")
    with pytest.raises(ValueError, match="unique name"):
        full.load_config(str(path))
    path.write_text("sweeps: [{name: a}]\nevaluations: [{kind: hierarcaps, sweep: b}]\n")
    with pytest.raises(ValueError, match="unknown sweep 'b'"):
        full.load_config(str(path))
    path.write_text("evaluations: [{kind: tables}]\n")
    with pytest.raises(ValueError, match="evaluations\\[0\\].kind"):
        full.load_config(str(path))
    assert full.main(["--config", DEMO, "--stages", "embed,dance"]) == 2
    assert "unknown stages ['dance']" in capsys.readouterr().err


def test_finished_sweeps_and_evaluations_are_skipped(tmp_path, capsys) -> None:
    cfg = full.load_config(DEMO, [f"output={tmp_path}"])
    for sweep in cfg["sweeps"]:
        folder = tmp_path / "sweeps" / sweep["name"]
        folder.mkdir(parents=True)
        (folder / "sweep.json").write_text("{}")
    full.stage_sweep(cfg)  # would start Ray and train otherwise
    (tmp_path / "evaluations").mkdir()
    for i, ev in enumerate(cfg["evaluations"]):
        (tmp_path / "evaluations" / f"{i:02d}-{ev['kind']}.json").write_text("{}")
    full.stage_evaluate(cfg)
    err = capsys.readouterr().err
    assert err.count("done already") == len(cfg["sweeps"]) + len(cfg["evaluations"])
