"""Ray Train runs and the Ray Tune sweep, tracked in MLflow, on a small synthetic world."""

from __future__ import annotations

import json
import re
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from asymvlm import tracking
from asymvlm.evaluation.adapters import sweep_adapters
from asymvlm.report import seed_tables
from asymvlm.splits import hold_out_images, load_split
from asymvlm.tables import Location
from asymvlm.training import TrainConfig
from asymvlm_ray.schema import FaultInjection, sweep_config

EPOCHS = 3
METHODS = ("asymvlm-vmf", "bayesvlm", "clip")


@pytest.mark.slow
def test_killed_worker_resumes_to_the_same_result(ray_session, pre_world, tmp_path) -> None:
    from asymvlm.runner import RunSpec
    from asymvlm_ray.ray_train import run_training

    train = TrainConfig(method="asymvlm-vmf", epochs=EPOCHS, lr=5e-3, batch_size=128, seed=3)
    spec = RunSpec(embeddings=pre_world, train=train, checkpoint_every=2)
    workers = {"storage_path": str(tmp_path / "ray"), "num_workers": 2}
    plain = run_training(spec, name="plain", **workers)
    marker = tmp_path / "killed.txt"
    fault = FaultInjection(epoch=2, rank=1, marker=str(marker))
    broken = run_training(spec, fault=fault, name="broken", max_failures=1, **workers)
    assert marker.exists(), "the failure was injected"
    assert [row["epoch"] for row in broken["history"]] == list(range(1, EPOCHS + 1))
    for a, b in zip(plain["history"], broken["history"], strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-6, abs=1e-7)
    for split in ("val", "test"):
        assert plain[split] == broken[split]
    assert plain["test"]["t2i"]["recall@1"] > 5 / 80  # it learnt: far above chance


@pytest.fixture(scope="module")
def swept(ray_session, pre_world, tmp_path_factory) -> SimpleNamespace:
    """One sweep of a trained (asymvlm-vmf), a post hoc (bayesvlm) and a frozen (clip) method at
    2 lrs and 2 seeds: its result, its trial runs and those of the seed stage."""
    from mlflow import MlflowClient

    from asymvlm_ray.tuning.sweep_driver import run_sweep

    folder = tmp_path_factory.mktemp("swept")
    space = {"methods": list(METHODS), "lr": [1e-3, 1e-2], "seeds": [0, 1], "epochs": EPOCHS}
    sizes = {"batch_size": 128, "optimizer": "adamw", "hidden_dim": 32, "checkpoint_every": 2}
    where = {"embeddings": pre_world, "output": str(folder / "sweep")}
    doc = {**space, **sizes, **where, "mlflow": {"experiment": "ci-sweep"}}
    out = run_sweep(sweep_config(doc))
    client = MlflowClient(out.tracking_uri)
    children = [client.get_run(i) for i in out.child_run_ids]
    seed_runs = [c for c in children if c.data.tags.get("seed_stage") == "true"]
    return SimpleNamespace(
        out=out, doc=doc, folder=folder, client=client, children=children, seed_runs=seed_runs
    )


@pytest.mark.slow
def test_a_sweep_runs_each_trial_once_reusing_the_grid_trial_as_first_seed(swept) -> None:
    out = swept.out
    assert not out.failed
    assert out.tracking_uri == "sqlite:///" + str(swept.folder / "sweep" / "mlflow.db")  # default
    # 3 methods x 2 lrs (seed 0) + 3 methods x seed 1: stage 2 reuses seed 0 at the best lr
    assert len(swept.children) == 9
    pairs = sorted((c.data.params["method"], c.data.params["seed"]) for c in swept.seed_runs)
    assert pairs == [(m, s) for m in METHODS for s in ("0", "1")]
    for c in swept.seed_runs:  # the reused stage-1 trial is the one at the chosen lr
        assert float(c.data.params["lr"]) == out.selection[c.data.params["method"]].lr


@pytest.mark.slow
def test_each_trial_run_has_params_final_metrics_curves_and_every_epoch_once(swept) -> None:
    names = [f"{d}_recall_at_{k}" for d in ("t2i", "i2t") for k in (1, 5, 10)]
    for child in swept.children:
        metrics, params, run_id = child.data.metrics, child.data.params, child.info.run_id
        assert set(names) <= set(metrics)
        assert {"method", "lr", "seed", "dataset", "embedding_model", "git_commit"} <= set(params)
        artifacts = {a.path for a in swept.client.list_artifacts(run_id)}
        assert {"binned_recall.json", "binned_recall.png"} <= artifacts
        if params["method"] == "asymvlm-vmf":  # has uncertainty: S and R² of the bin curve
            assert {"t2i_spearman", "t2i_r2", "i2t_spearman", "i2t_r2"} <= set(metrics)
            for key in ("kappa_mean", "train_loss"):
                steps = [m.step for m in swept.client.get_metric_history(run_id, key)]
                assert steps == [1, 2, 3]


@pytest.mark.slow
def test_the_lr_is_chosen_on_validation_and_logged_on_the_sweep_run(swept) -> None:
    parent = swept.client.get_run(swept.out.parent_run_id)
    for method, pick in swept.out.selection.items():
        scores = {
            float(c.data.params["lr"]): c.data.metrics["val_mean_recall_at_1"]
            for c in swept.children
            if c.data.tags["stage"] == "grid" and c.data.params["method"] == method
        }
        assert pick.lr == max(scores, key=lambda lr: (scores[lr], -lr))  # ties: the smaller lr
        assert parent.data.params[f"best_lr/{method}"] == str(pick.lr)


@pytest.mark.slow
def test_the_summary_is_the_mean_and_std_of_the_seed_runs(swept) -> None:
    parent = swept.client.get_run(swept.out.parent_run_id)
    artifacts = {a.path for a in swept.client.list_artifacts(parent.info.run_id)}
    assert {"summary.md", "summary.csv", "selection.json", "config.yaml"} <= artifacts
    for method in METHODS:
        runs = [c for c in swept.seed_runs if c.data.params["method"] == method]
        values = [c.data.metrics["t2i_recall_at_1"] for c in runs]
        got = swept.out.summary[method]["t2i_recall_at_1"]
        assert got["mean"] == pytest.approx(np.mean(values))
        assert got["std"] == pytest.approx(np.std(values, ddof=1))
        assert parent.data.metrics[f"{method}/t2i_recall_at_1_mean"] == pytest.approx(got["mean"])
    record = json.loads((swept.folder / "sweep" / "sweep.json").read_text())
    assert record["parent_run_id"] == swept.out.parent_run_id
    assert record["adapters"] == swept.out.adapters
    assert "±" in (swept.folder / "sweep" / "summary.md").read_text()


@pytest.mark.slow
def test_the_report_has_the_sweeps_table_and_figure(swept, tmp_path) -> None:
    from asymvlm.report.document import build_report

    report = open(build_report(swept.out.tracking_uri, "ci-sweep", str(tmp_path))).read()
    assert "Table 1 analogue" in report
    assert re.search(r"\|\s*asymvlm-vmf\s*\|\s*2\s*\|", report)  # two seeds
    assert len(list(tmp_path.glob("fig3_*.png"))) == 1


@pytest.mark.slow
def test_the_seed_adapters_come_back_from_mlflow_for_the_evaluations(swept, pre_world) -> None:
    """The loaded BayesVLM is the fitted one: its test Recall@1 is the trial's."""
    from asymvlm.evaluation import evaluate_retrieval
    from asymvlm.evaluation.suite import evaluate_hierarcaps

    adapters = sweep_adapters(swept.out.tracking_uri, swept.out.parent_run_id)
    assert set(adapters) == {f"{m}/seed{s}" for m in METHODS for s in (0, 1)}
    hier = evaluate_hierarcaps(adapters, Location(pre_world, "test"))
    assert hier["asymvlm-vmf/seed0"]["monotone_fraction"] is not None
    assert hier["bayesvlm/seed0"]["monotone_fraction"] is not None
    assert hier["clip/seed0"]["monotone_fraction"] is None
    test = load_split(pre_world, "test", adapters["bayesvlm/seed0"].adapter_input)
    got = evaluate_retrieval(adapters["bayesvlm/seed0"], test)["t2i"]["recall@1"]
    (bayes,) = [
        c
        for c in swept.seed_runs
        if c.data.params["method"] == "bayesvlm" and c.data.params["seed"] == "0"
    ]
    assert got == pytest.approx(bayes.data.metrics["t2i_recall_at_1"], abs=1e-9)


@pytest.mark.slow
def test_each_logged_model_is_the_adapter_folder_without_pickles(swept) -> None:
    """Loaded by the installed package: no pickle, no code of its own."""
    models = list((swept.folder / "sweep" / "mlartifacts").rglob("MLmodel"))
    assert len(models) == len(swept.children)  # one adapter model per trial
    for mlmodel in models:
        text, files = mlmodel.read_text(), {p.name for p in mlmodel.parent.rglob("*")}
        assert "loader_module: asymvlm.scoring.models" in text and "pickle" not in text
        assert {"config.json", "model.safetensors"} <= files and "code" not in files
        assert not [f for f in files if f.endswith((".pkl", ".pt", ".bin"))]


@pytest.mark.slow
def test_the_sweep_exports_each_seed_adapter_as_logged(swept) -> None:
    from asymvlm.checkpoints import load_checkpoint

    out = swept.out
    assert {m: sorted(s) for m, s in out.adapters.items()} == {m: ["0", "1"] for m in METHODS}
    where = out.adapters["asymvlm-vmf"]["1"]
    assert where == str(swept.folder / "sweep" / "adapters" / "asymvlm-vmf" / "seed1")
    exported, meta = load_checkpoint(where, "cpu")
    assert meta["train_config"]["seed"] == 1 and meta["embedding_model"] == "synthetic-world"
    logged = sweep_adapters(out.tracking_uri, out.parent_run_id)["asymvlm-vmf/seed1"]
    for name, value in exported.state_dict().items():
        torch.testing.assert_close(value, logged.state_dict()[name].cpu(), rtol=0, atol=0)


@pytest.mark.slow
def test_a_rerun_with_other_settings_is_refused_before_writing(swept, tmp_path, capsys) -> None:
    """One line naming the settings: the MLflow runs and adapters would mix two trainings."""
    from pipelines import sweep as sweep_script

    path = tmp_path / "sweep.yaml"
    path.write_text(json.dumps(swept.doc))
    files = [p for p in (swept.folder / "sweep").rglob("*") if p.is_file()]
    stamps = {p: p.stat().st_mtime_ns for p in files}
    capsys.readouterr()
    assert sweep_script.main(["--config", str(path), "--set", f"epochs={EPOCHS + 1}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"epochs {EPOCHS} (then) vs {EPOCHS + 1} (now)" in err, err
    assert "Run it with those settings to go on" in err
    assert stamps == {p: p.stat().st_mtime_ns for p in files}
    runs = tracking.child_runs(swept.out.tracking_uri, swept.out.parent_run_id)
    assert len(runs) == len(swept.children)


def test_a_seed_run_without_an_adapter_is_left_out_with_a_warning(tmp_path, caplog) -> None:
    uri = tracking.default_tracking_uri(str(tmp_path))
    with tracking.run(uri, "ci-no-adapter", "sweep", kind="sweep") as sweep:
        meta = {"params": {"method": "clip", "seed": 0}, "tags": {"stage": "seeds"}}
        trial = tracking.open_run(uri, "ci-no-adapter", "clip", kind="trial", parent=sweep, **meta)
        trial.end("FINISHED")
    with caplog.at_level("WARNING", logger="asymvlm.evaluation.adapters"):
        assert sweep_adapters(uri, sweep.id) == {}
    assert "has no adapter model" in caplog.text and "clip, seed 0" in caplog.text


def test_hold_out_images_keeps_captions_with_their_image(small_world) -> None:
    data = load_split(small_world, "train")
    rest, held = hold_out_images(data, 0.2, seed=0)
    assert held.split.n_images == 60 and rest.split.n_images == 240
    assert held.split.n_texts + rest.split.n_texts == data.split.n_texts
    assert not set(held.split.image_ids) & set(rest.split.image_ids)
    by_id = dict(zip(data.split.caption_ids, data.split.text_image_index, strict=True))
    for part in (rest, held):  # every caption still points at its own image's embedding
        owner = [part.split.image_ids[i] for i in part.text_to_image.tolist()]
        assert owner == [data.split.image_ids[by_id[c]] for c in part.split.caption_ids]
        rows = [data.split.image_ids.index(i) for i in owner[:3]]
        want = torch.as_tensor(np.stack([data.split.image_embeddings[r] for r in rows]))
        assert torch.equal(part.image_emb[part.text_to_image[:3]], want)
    assert hold_out_images(data, 0.2, seed=0)[1].split.image_ids == held.split.image_ids
    with pytest.raises(ValueError, match="fraction"):
        hold_out_images(data, 1.0)


def test_lr_selection_and_summary_numbers() -> None:
    from asymvlm_ray.tuning.lr_selection import select_lr
    from asymvlm_ray.tuning.records import FailedTrial, LrSelection, TrialOutcome
    from asymvlm_ray.tuning.sweep_driver import failures_markdown

    rows = [("a", 1e-3, 0.2), ("a", 1e-2, 0.3), ("b", 1e-2, 0.5), ("b", 1e-3, 0.5)]
    rows += [("a", 0.5, float("nan")), ("c", 1e-3, float("inf"))]  # failed: never selected
    grid = [
        TrialOutcome(method=m, lr=lr, seed=0, stage="grid", val_mean_recall_at_1=v, outcome={})
        for m, lr, v in rows
    ]
    picks = select_lr(grid)
    assert picks["a"] == LrSelection(lr=1e-2, score=0.3, scores_by_lr={"0.001": 0.2, "0.01": 0.3})
    assert picks["b"].lr == 1e-3 and "c" not in picks  # a tie: the smaller lr
    failed = [FailedTrial(stage="grid", method="b", lr=1e-3, seed=0, reason="nan | x")]
    text = failures_markdown(failed)
    assert "| grid | b | 0.001 | 0 | nan \\| x |" in text and "1 trial(s) failed" in text
    assert failures_markdown([]) == ""
    summary = seed_tables.seed_summary(
        [{"method": "a", "t2i_recall_at_1": v, "i2t_recall_at_1": 0.5} for v in (0.1, 0.2, 0.6)]
    )
    md = seed_tables.summary_markdown(summary)
    row = next(line for line in md.splitlines() if line.startswith("| a "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells == ["a", "3", "50.00 ± 0.00", "–", "–", "30.00 ± 26.46", "–", "–"]
    assert seed_tables.summary_csv(summary).startswith("method,n_seeds,i2t_recall_at_1_mean")


def test_the_sweep_command_fails_in_one_line(tmp_path, capsys) -> None:
    """A missing config or missing tables: exit code 2 and one line naming the path."""
    from pipelines.sweep import main

    path = tmp_path / "space.yaml"
    path.write_text(f"embeddings: {tmp_path / 'nowhere'}\nmethods: [clip]\nlr: [0.1]\nseeds: [0]\n")
    assert main(["--config", str(tmp_path / "absent.yaml")]) == 2
    assert main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "absent.yaml" in err and str(tmp_path / "nowhere") in err and "Traceback" not in err


def _one_lr(world: str, **extra) -> dict:
    doc = {"embeddings": world, "methods": ["asymvlm-vmf"], "lr": [1e-3], "seeds": [0]}
    return {**doc, "batch_size": 128, "hidden_dim": 32, **extra}


def test_a_store_that_cannot_open_stops_the_sweep_before_a_trial_ends(
    ray_session, pre_world, tmp_path
) -> None:
    """The run opens while Tune starts the trials: Tune's first event stops the sweep with the
    reason, no trial trains to its end, no sweep record."""
    from asymvlm.errors import ConfigError
    from asymvlm_ray.tuning.sweep_driver import SWEEP_RECORD, run_sweep

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    mlflow = {"experiment": "no-store", "tracking_uri": f"sqlite:///{blocker}/mlflow.db"}
    doc = _one_lr(pre_world, epochs=300, checkpoint_every=300, mlflow=mlflow)
    with pytest.raises(ConfigError, match=r"mlflow.tracking_uri: cannot open the MLflow store"):
        run_sweep(sweep_config({**doc, "output": str(tmp_path / "sweep")}))
    assert not list((tmp_path / "sweep").rglob("checkpoint_0*"))  # its only one: after 300
    assert not (tmp_path / "sweep" / SWEEP_RECORD).exists()


def test_a_sweep_whose_every_trial_fails_stops_naming_the_cause(
    ray_session, pre_world, tmp_path
) -> None:
    """Every trial failing (a table cut short): one error naming the cause, no sweep record."""
    from asymvlm_ray.tuning.sweep_driver import SWEEP_RECORD, NoResults, run_sweep

    tables = shutil.copytree(pre_world, tmp_path / "tables")
    (part,) = (tables / "train" / "texts").glob("*.parquet")
    part.write_bytes(part.read_bytes()[:300])  # a half-written file
    doc = _one_lr(str(tables), seeds=[0, 1], epochs=1, max_failures=0)
    with pytest.raises(NoResults, match=f"every trial failed; first: {part.parent}: cannot read"):
        run_sweep(sweep_config({**doc, "output": str(tmp_path / "o")}))
    assert not (tmp_path / "o" / SWEEP_RECORD).exists()


def test_failure_reasons_dig_through_ray_wrappers() -> None:
    from ray.exceptions import RayTaskError

    from asymvlm.errors import TrialFailed
    from asymvlm_ray.tuning.trials import failure_reason

    task = RayTaskError("sweep_trial", "Traceback ...", TrialFailed("worker  died\ntwice"))
    assert failure_reason(task) == "worker died twice"
    dual = task.as_instanceof_cause()  # what Tune hands back: a RayTaskError(TrialFailed)
    assert isinstance(dual, TrialFailed) and failure_reason(dual) == "worker died twice"
    assert failure_reason(KeyError("x")) == "KeyError: 'x'"
    trace = "Traceback (most recent call last):\n  File x\nray.exceptions.ActorDiedError: died\n"
    assert failure_reason(trace) == "ray.exceptions.ActorDiedError: died"
    pip = "Failed to set up runtime environment.\n  ...\n    ERROR: Could not install x.whl\n"
    assert failure_reason(RuntimeError(pip)) == "Could not install x.whl"
    assert failure_reason(None) == failure_reason("") == "unknown error"
