"""Ray Train runs and the Ray Tune sweep, tracked in MLflow, on a small synthetic world."""

from __future__ import annotations

import json
import os
import pickle
import re

import numpy as np
import pytest
import torch

from asymvlm import results, tracking
from asymvlm.splits import hold_out_images, load_split
from asymvlm.synthetic import write_world
from asymvlm.tables import Location
from asymvlm.training import TrainConfig
from tests.conftest import small_world_config

EPOCHS = 4


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("sweep-world") / "tables"
    cfg = small_world_config(splits={"train": 400, "val": 80, "test": 80})
    return write_world(str(root), cfg)


def _run_spec(world: str):
    from asymvlm.protocol import RunSpec

    train = TrainConfig(
        method="asymvlm-vmf",
        epochs=EPOCHS,
        lr=5e-3,
        optimizer="adamw",
        batch_size=128,
        hidden_dim=32,
        seed=3,
    )
    return RunSpec(embeddings=world, train=train, checkpoint_every=2)


@pytest.mark.slow
def test_killed_worker_resumes_to_the_same_result(ray_session, world, tmp_path) -> None:
    from pipelines.ray_train import run_training
    from pipelines.schema import FaultInjection

    plain = run_training(
        _run_spec(world), name="plain", storage_path=str(tmp_path / "ray"), num_workers=2
    )
    marker = tmp_path / "killed.txt"
    broken = run_training(
        _run_spec(world),
        fault=FaultInjection(epoch=3, rank=1, marker=str(marker)),
        name="broken",
        storage_path=str(tmp_path / "ray"),
        num_workers=2,
        max_failures=1,
    )
    assert marker.exists(), "the failure was injected"
    assert [row["epoch"] for row in broken["history"]] == list(range(1, EPOCHS + 1))
    for a, b in zip(plain["history"], broken["history"], strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-6, abs=1e-7)
    for split in ("val", "test"):
        for direction in ("t2i", "i2t"):
            assert plain[split][direction] == broken[split][direction]
    # ... and the run really learnt something: AsymVLM beats chance by far.
    assert plain["test"]["t2i"]["recall@1"] > 5 / 80


@pytest.mark.slow
def test_sweep_lands_nested_runs_with_metrics_artifacts_and_summary(
    ray_session, world, tmp_path
) -> None:
    import mlflow
    from mlflow import MlflowClient

    from pipelines.schema import sweep_config as resolve_config
    from pipelines.tuning.sweep import run_sweep

    cfg = resolve_config(
        {
            "embeddings": world,
            "methods": ["asymvlm-vmf", "determ-ft"],
            "lr": [1e-3, 1e-2],
            "seeds": [0, 1],
            "epochs": 3,
            "batch_size": 128,
            "optimizer": "adamw",
            "num_workers": 1,  # trials in place (TorchTrainer trials: test_trials.py)
            "hidden_dim": 32,
            "checkpoint_every": 2,
            "output": str(tmp_path / "sweep"),
            "mlflow": {"experiment": "ci-sweep"},
        }
    )
    out = run_sweep(cfg)
    assert out["tracking_uri"] == "sqlite:///" + str(tmp_path / "sweep" / "mlflow.db")
    client = MlflowClient(out["tracking_uri"])
    location = client.get_experiment(out["experiment_id"]).artifact_location
    assert location == "file://" + str(tmp_path / "sweep" / "mlartifacts")  # not ./mlruns
    children = client.search_runs(
        [out["experiment_id"]], f"tags.mlflow.parentRunId = '{out['parent_run_id']}'"
    )
    # 2 methods x 2 lrs (seed 0) + 2 methods x seed 1: stage 2 reuses seed 0 at the best lr
    assert len(children) == 6
    assert sorted(c.data.tags["stage"] for c in children).count("seeds") == 2
    members = [c for c in children if c.data.tags.get("seed_stage") == "true"]
    assert sorted((c.data.params["method"], c.data.params["seed"]) for c in members) == [
        ("asymvlm-vmf", "0"),
        ("asymvlm-vmf", "1"),
        ("determ-ft", "0"),
        ("determ-ft", "1"),
    ]
    for c in members:  # the reused stage-1 trial is the one at the chosen lr
        assert float(c.data.params["lr"]) == out["selection"][c.data.params["method"]]["lr"]
    names = [
        f"{d}_{m}" for d in ("t2i", "i2t") for m in ("recall_at_1", "recall_at_5", "recall_at_10")
    ]
    for child in children:
        metrics, params = child.data.metrics, child.data.params
        assert set(names) <= set(metrics)
        assert {"method", "lr", "seed", "dataset", "embedding_model", "git_commit"} <= set(params)
        if params["method"] == "asymvlm-vmf":  # has uncertainty: S and R² of the bin curve
            assert {"t2i_spearman", "t2i_r2", "i2t_spearman", "i2t_r2"} <= set(metrics)
            kappa = client.get_metric_history(child.info.run_id, "kappa_mean")
            assert [m.step for m in kappa] == [1, 2, 3]
        loss = client.get_metric_history(child.info.run_id, "train_loss")
        assert [m.step for m in loss] == [1, 2, 3]
        artifacts = {a.path for a in client.list_artifacts(child.info.run_id)}
        assert {"binned_recall.json", "binned_recall.png"} <= artifacts
    parent = client.get_run(out["parent_run_id"])
    artifacts = {a.path for a in client.list_artifacts(out["parent_run_id"])}
    assert {"summary.md", "summary.csv", "selection.json", "config.yaml"} <= artifacts
    assert parent.data.params["best_lr/asymvlm-vmf"] in ("0.001", "0.01")

    # The lr was chosen on validation: the winner has the best val score of its method.
    grid = [c for c in children if c.data.tags["stage"] == "grid"]
    for method, pick in out["selection"].items():
        scores = {
            float(c.data.params["lr"]): c.data.metrics["val_mean_recall_at_1"]
            for c in grid
            if c.data.params["method"] == method
        }
        assert pick["lr"] == max(scores, key=lambda lr: (scores[lr], -lr))

    # The summary is the mean ± std of the seed runs' test metrics.
    seeds = members
    for method in ("asymvlm-vmf", "determ-ft"):
        values = [
            c.data.metrics["t2i_recall_at_1"] for c in seeds if c.data.params["method"] == method
        ]
        assert len(values) == 2
        want_mean, want_std = np.mean(values), np.std(values, ddof=1)
        got = out["summary"][method]["t2i_recall_at_1"]
        assert got["mean"] == pytest.approx(want_mean) and got["std"] == pytest.approx(want_std)
        assert parent.data.metrics[f"{method}/t2i_recall_at_1_mean"] == pytest.approx(want_mean)
    with open(os.path.join(cfg.output, "sweep.json")) as fh:
        assert json.load(fh)["parent_run_id"] == out["parent_run_id"]
    table = open(os.path.join(cfg.output, "summary.md")).read()
    assert "asymvlm-vmf" in table and "determ-ft" in table and "±" in table

    # The report shows the sweep (Table 1 analogue, Fig. 3 analogue).
    from asymvlm.report import build_report

    report = open(build_report(out["tracking_uri"], "ci-sweep", str(tmp_path / "report"))).read()
    assert "Table 1 analogue" in report
    assert re.search(r"\|\s*asymvlm-vmf\s*\|\s*2\s*\|", report)  # two seeds
    assert len(list((tmp_path / "report").glob("fig3_*.png"))) == 1

    # The seed adapters come back from MLflow for the evaluations (here: the world's levels).
    from asymvlm.evaluation.adapters import sweep_adapters as adapters_from_sweep
    from asymvlm.evaluation.suite import evaluate_hierarcaps

    adapters = adapters_from_sweep(out["tracking_uri"], out["parent_run_id"])
    assert set(adapters) == {f"{m}/seed{s}" for m in ("asymvlm-vmf", "determ-ft") for s in (0, 1)}
    hier = evaluate_hierarcaps(adapters, Location(world, "test"))
    assert hier["asymvlm-vmf/seed0"]["monotone_fraction"] is not None
    assert hier["determ-ft/seed0"]["monotone_fraction"] is None

    # The logged adapter scores caption uncertainty from embeddings.
    vmf = next(c for c in seeds if c.data.params["method"] == "asymvlm-vmf")
    mlflow.set_tracking_uri(out["tracking_uri"])
    model = mlflow.pyfunc.load_model(f"runs:/{vmf.info.run_id}/adapter")
    test = load_split(world, "test")
    import pandas as pd

    frame = pd.DataFrame(
        {"embedding": list(test.split.text_embeddings[:5]), "norm": test.split.text_norms[:5]}
    )
    scored = model.predict(frame)
    assert list(scored.columns) == ["uncertainty", "kappa"]
    np.testing.assert_allclose(scored["uncertainty"], 1.0 / scored["kappa"], rtol=1e-5)
    assert np.all(scored["kappa"] > 0)
    # ... and the sweep left every seed-stage adapter as a checkpoint folder: the same weights
    from asymvlm.checkpoints import load_checkpoint

    assert {m: sorted(s) for m, s in out["adapters"].items()} == {
        "asymvlm-vmf": ["0", "1"],
        "determ-ft": ["0", "1"],
    }
    assert out["adapters"]["asymvlm-vmf"]["1"] == str(
        tmp_path / "sweep" / "adapters" / "asymvlm-vmf" / "seed1"
    )
    exported, meta = load_checkpoint(out["adapters"]["asymvlm-vmf"]["1"], "cpu")
    logged = model.unwrap_python_model().method.state_dict()
    assert meta["train_config"]["seed"] == 1 and meta["embedding_model"] == "synthetic-world"
    for name, value in exported.state_dict().items():
        torch.testing.assert_close(value, logged[name].cpu(), rtol=0, atol=0)
    record = json.load(open(tmp_path / "sweep" / "sweep.json"))
    assert record["adapters"] == out["adapters"]


@pytest.mark.slow
def test_untrained_methods_of_a_sweep_come_back_for_the_evaluations(ray_session, tmp_path) -> None:
    """``clip`` (frozen) and ``bayesvlm`` (fitted post hoc) have no epochs, yet their trials
    keep a checkpoint and log an adapter: the evaluations load them like trained ones, and the
    loaded BayesVLM is the fitted one (its test Recall@1 is the trial's). ``pack`` packs only
    methods trained by SGD: these trials run one by one."""
    from asymvlm.evaluation import evaluate_retrieval
    from asymvlm.evaluation.adapters import sweep_adapters
    from asymvlm.evaluation.suite import evaluate_hierarcaps
    from pipelines.schema import sweep_config as resolve_config
    from pipelines.tuning.sweep import run_sweep

    world = write_world(str(tmp_path / "tables"), small_world_config(pre_dim=24))
    cfg = resolve_config(
        {
            "embeddings": world,
            "methods": ["clip", "bayesvlm"],
            "lr": [1e-3],
            "seeds": [0, 1],
            "pack": 2,
            "epochs": 2,
            "batch_size": 64,
            "output": str(tmp_path / "sweep"),
            "mlflow": {"experiment": "ci-untrained"},
        }
    )
    out = run_sweep(cfg)
    assert not out["failed"]
    adapters = sweep_adapters(out["tracking_uri"], out["parent_run_id"])
    assert set(adapters) == {f"{m}/seed{s}" for m in ("bayesvlm", "clip") for s in (0, 1)}
    want = {"bayesvlm": ["0", "1"], "clip": ["0", "1"]}
    assert {m: sorted(s) for m, s in out["adapters"].items()} == want
    logged = out["summary"]["bayesvlm"]["t2i_recall_at_1"]["mean"]
    test = load_split(world, "test", adapters["bayesvlm/seed0"].adapter_input)
    got = evaluate_retrieval(adapters["bayesvlm/seed0"], test)["t2i"]["recall@1"]
    assert got == pytest.approx(logged, abs=1e-9)
    hier = evaluate_hierarcaps(adapters, Location(world, "test"))
    assert hier["bayesvlm/seed0"]["monotone_fraction"] is not None  # it has an uncertainty
    assert hier["clip/seed0"]["monotone_fraction"] is None


def test_a_seed_run_without_an_adapter_is_left_out_with_a_warning(tmp_path, caplog) -> None:
    uri = tracking.default_tracking_uri(str(tmp_path))
    with tracking.run(uri, "ci-no-adapter", "sweep", kind="sweep") as sweep:
        trial = tracking.open_run(
            uri,
            "ci-no-adapter",
            "clip",
            kind="trial",
            parent=sweep,
            params={"method": "clip", "seed": 0},
            tags={"stage": "seeds"},
        )
        trial.end("FINISHED")
    from asymvlm.evaluation.adapters import sweep_adapters

    with caplog.at_level("WARNING", logger="asymvlm.evaluation.adapters"):
        assert sweep_adapters(uri, sweep.id) == {}
    assert "has no adapter model" in caplog.text and "clip, seed 0" in caplog.text


def test_hold_out_images_keeps_captions_with_their_image(small_world) -> None:
    data = load_split(small_world, "train")
    rest, held = hold_out_images(data, 0.2, seed=0)
    assert held.split.n_images == 60 and rest.split.n_images == 240
    assert held.split.n_texts + rest.split.n_texts == data.split.n_texts
    assert not set(held.split.image_ids) & set(rest.split.image_ids)
    for part in (rest, held):  # every caption still points at its own image's embedding
        owner = [part.split.image_ids[i] for i in part.text_to_image.tolist()]
        by_id = dict(zip(data.split.caption_ids, data.split.text_image_index, strict=True))
        want = [data.split.image_ids[by_id[c]] for c in part.split.caption_ids]
        assert owner == want
        assert torch.equal(
            part.image_emb[part.text_to_image[:3]],
            torch.as_tensor(
                np.stack(
                    [data.split.image_embeddings[data.split.image_ids.index(i)] for i in owner[:3]]
                )
            ),
        )
    again = hold_out_images(data, 0.2, seed=0)[1]
    assert again.split.image_ids == held.split.image_ids
    with pytest.raises(ValueError, match="fraction"):
        hold_out_images(data, 1.0)


def test_lr_selection_and_summary_numbers() -> None:
    from pipelines.tuning.sweep import failures_markdown, select_lr
    from pipelines.tuning.trials import SELECTION_METRIC

    grid = [
        {"method": "a", "lr": 1e-3, SELECTION_METRIC: 0.2},
        {"method": "a", "lr": 1e-2, SELECTION_METRIC: 0.3},
        {"method": "b", "lr": 1e-3, SELECTION_METRIC: 0.5},
        {"method": "b", "lr": 1e-2, SELECTION_METRIC: 0.5},  # tie: the smaller lr
    ]
    picks = select_lr(grid)
    assert picks["a"]["lr"] == 1e-2 and picks["b"]["lr"] == 1e-3
    grid = [  # failed (non-finite) trials are never selected
        {"method": "a", "lr": 0.5, SELECTION_METRIC: float("nan")},
        {"method": "a", "lr": 1e-3, SELECTION_METRIC: 0.2},
        {"method": "a", "lr": 1e-2, SELECTION_METRIC: float("inf")},
        {"method": "b", "lr": 1e-3, SELECTION_METRIC: float("nan")},
    ]
    assert select_lr(grid) == {"a": {"lr": 1e-3, "score": 0.2, "scores_by_lr": {"0.001": 0.2}}}
    text = failures_markdown(
        [{"stage": "grid", "method": "b", "lr": 1e-3, "seed": 0, "reason": "non-finite loss | x"}]
    )
    assert (
        "| grid | b | 0.001 | 0 | non-finite loss \\| x |" in text and "1 trial(s) failed" in text
    )
    assert failures_markdown([]) == ""
    summary = results.seed_summary(
        [{"method": "a", "t2i_recall_at_1": v, "i2t_recall_at_1": 0.5} for v in (0.1, 0.2, 0.6)]
    )
    cell = summary["a"]["t2i_recall_at_1"]
    assert cell["mean"] == pytest.approx(0.3) and cell["std"] == pytest.approx(
        np.std([0.1, 0.2, 0.6], ddof=1)
    )
    md = results.summary_markdown(summary)
    row = next(line for line in md.splitlines() if line.startswith("| a "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells == ["a", "3", "50.00 ± 0.00", "–", "–", "30.00 ± 26.46", "–", "–"]
    csv_text = results.summary_csv(summary)
    assert csv_text.splitlines()[0].startswith("method,n_seeds,i2t_recall_at_1_mean")


def test_config_errors_name_the_problem(tmp_path, capsys) -> None:
    from pipelines.schema import load_sweep as load_config
    from pipelines.sweep import main

    path = tmp_path / "space.yaml"
    path.write_text("methods: [asymvlm-vmf]\nlr: [0.001]\n")
    with pytest.raises(ValueError, match="space.yaml: embeddings: required key is missing"):
        load_config(str(path))
    path.write_text(
        "embeddings: x\nmethods: [nope]\nlr: [0.001]\nseeds: [0]\nepochs: 1\nbatch_size: 8\n"
        "optimizer: sgd\nnum_workers: 1\nmlflow: {experiment: e}\n"
    )
    with pytest.raises(ValueError, match="methods\\[0\\] = 'nope': unknown method 'nope'"):
        load_config(str(path))
    cfg = load_config(str(path), ["methods=[determ-ft]", "mlflow.experiment=other"])
    assert cfg.methods == ["determ-ft"] and cfg.mlflow.experiment == "other"
    assert cfg.mlflow.tracking_uri.startswith("sqlite:///")
    assert main(["--config", str(tmp_path / "absent.yaml")]) == 2
    # Missing tables fail before any trial starts, naming the path; relative paths are made
    # absolute (trials run in their own working directories).
    assert cfg.embeddings == os.path.abspath("x")
    capsys.readouterr()
    args = ["--config", str(path), "--set", "methods=[determ-ft]"]
    assert main([*args, "--set", f"embeddings={tmp_path / 'nowhere'}"]) == 2
    assert str(tmp_path / "nowhere") in capsys.readouterr().err


def test_shipped_tune_spaces_parse() -> None:
    from pipelines.schema import load_sweep as load_config

    folder = os.path.join(os.path.dirname(__file__), "..", "tune_spaces")
    names = sorted(f for f in os.listdir(folder) if f.endswith(".yaml"))
    assert {"coco-clip.yaml", "flickr30k-siglip.yaml", "cc200k-clip.yaml", "cpu-small.yaml"} <= set(
        names
    )
    for name in names:
        cfg = load_config(os.path.join(folder, name))
        if name != "cpu-small.yaml":  # the paper's protocol
            assert cfg.lr == [1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2]
            assert cfg.seeds == [0, 1, 2, 3, 4] and cfg.epochs == 200
            assert cfg.batch_size == 2048 and cfg.protocol == "official"
            assert cfg.optimizer is None  # the authors' optimiser per method
        # it crosses the Tune boundary as it is (pickled), its validated runs with it
        again = pickle.loads(pickle.dumps(cfg))
        assert again == cfg
        method = cfg.methods[0]
        assert again.run_spec(method, cfg.lr[-1], 4) == cfg.run_spec(method, cfg.lr[-1], 4)


def test_a_sweep_whose_mlflow_store_cannot_open_stops_with_the_reason(
    ray_session, world, tmp_path
) -> None:
    """Before any trial starts, naming the key and the cause."""
    from asymvlm.errors import ConfigError
    from pipelines.schema import sweep_config as resolve_config
    from pipelines.tuning.sweep import run_sweep

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    uri = f"sqlite:///{blocker}/mlflow.db"
    cfg = resolve_config(
        {
            "embeddings": world,
            "methods": ["asymvlm-vmf"],
            "lr": [1e-3],
            "seeds": [0],
            "output": str(tmp_path / "sweep"),
            "mlflow": {"experiment": "no-store", "tracking_uri": uri},
        }
    )
    with pytest.raises(ConfigError, match=r"mlflow.tracking_uri: cannot open the MLflow store"):
        run_sweep(cfg)
    assert not (tmp_path / "sweep" / "tune").exists()


def test_failure_reasons_dig_through_ray_wrappers() -> None:
    from ray.exceptions import RayTaskError
    from ray.train import WorkerGroupError

    from asymvlm.errors import NonFiniteError, TrialFailed
    from pipelines.tuning.trials import failure_reason

    diverged = NonFiniteError("non-finite loss at epoch 2, step 3 of 4 (asymvlm-vmf, lr 0.5)")
    group = WorkerGroupError("rank 0 failed", {0: diverged})
    assert failure_reason(group) == str(diverged)
    wrapped = RuntimeError("trial failed")
    wrapped.__cause__ = group
    assert failure_reason(wrapped) == str(diverged)
    task = RayTaskError("sweep_trial", "Traceback ...", TrialFailed("worker died twice"))
    assert failure_reason(task) == "worker died twice"
    dual = task.as_instanceof_cause()  # what Tune hands back: a RayTaskError(TrialFailed)
    assert isinstance(dual, TrialFailed) and failure_reason(dual) == "worker died twice"
    assert failure_reason(KeyError("x")) == "KeyError: 'x'"
    trace = "Traceback (most recent call last):\n  File x\nray.exceptions.ActorDiedError: died\n"
    assert failure_reason(trace) == "ray.exceptions.ActorDiedError: died"
    assert failure_reason(None) == "unknown error"
