"""Sweep trials: the per-process split cache, packed trials equal to single ones, resuming."""

from __future__ import annotations

import json
import os

import pytest
import torch

from asymvlm.runner import RunSpec, train_and_evaluate
from asymvlm.splits import SplitCache, load_split
from asymvlm.synthetic import write_world
from asymvlm.training import TrainConfig
from tests.helpers import small_world_config


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("trials-world") / "tables"
    return write_world(str(root), small_world_config(splits={"train": 300, "test": 60}))


def test_the_cache_reads_a_split_once_per_process(world, tmp_path) -> None:
    cache = SplitCache(max_entries=2)
    first = cache.load(world, "train")
    again = cache.load(world, "train", "raw", torch.device("cpu"))
    assert again is first and (cache.hits, cache.misses) == (1, 1)
    assert torch.equal(first.text_emb, load_split(world, "train").text_emb)
    unit = cache.load(world, "train", "unit")  # another input: another entry
    assert unit is not first and cache.misses == 2
    cache.load(world, "test")  # a third entry evicts the least recently used ("raw" train)
    assert cache.load(world, "train", "unit") is unit
    assert cache.load(world, "train") is not first and cache.misses == 4

    # Tables rewritten in place (another manifest) are read again, not served stale.
    copy = write_world(str(tmp_path / "w"), small_world_config(splits={"train": 300}))
    old = cache.load(copy, "train")
    write_world(copy, small_world_config(splits={"train": 200}, seed=7))
    assert cache.load(copy, "train").text_emb.shape[0] != old.text_emb.shape[0]


def test_runs_on_cached_splits_equal_runs_that_read_their_own(world) -> None:
    """Two runs through one cache (the second trains on the first's tensors, hold-out
    included) end exactly where runs that read the tables themselves end."""
    cache = SplitCache()
    for seed, lr in ((0, 5e-3), (1, 1e-2)):
        train = TrainConfig(
            method="asymvlm-vmf", epochs=2, lr=lr, batch_size=64, hidden_dim=16, seed=seed
        )
        spec = RunSpec(embeddings=world, train=train, val_split=None, val_fraction=0.2)
        plain, cached = train_and_evaluate(spec), train_and_evaluate(spec, cache=cache)
        for row in plain["history"] + cached["history"]:  # the clock times differ
            row.pop("epoch_seconds")
        for key in ("history", "val", "test"):
            assert json.dumps(cached[key], sort_keys=True) == json.dumps(plain[key], sort_keys=True)
    # train and test read once; the hold-out made once; the second run only hits
    assert cache.misses == 3 and cache.hits >= 3


@pytest.mark.slow
def test_packed_trials_give_the_results_of_single_trials(ray_session, world, tmp_path) -> None:
    """``pack: 2``: the grid (one lr diverging: a FAILED run, in the failures table, never
    selected) and the seed stage (SIGKILLed once after epoch 2) as packs; each member its own
    MLflow run, every epoch once; selection, metrics and adapters those of one trial per run."""
    import glob

    from mlflow import MlflowClient

    from asymvlm.evaluation.adapters import sweep_adapters
    from asymvlm_ray.schema import sweep_config
    from asymvlm_ray.tuning.staged_search import KEEP_CHECKPOINTS
    from asymvlm_ray.tuning.sweep_driver import run_sweep

    space = {"methods": ["asymvlm-vmf"], "lr": [5e-3, 100.0], "seeds": [0, 1, 2], "epochs": 3}
    sizes = {"optimizer": "sgd", "batch_size": 64, "hidden_dim": 16, "val_fraction": 0.2}
    doc = {"embeddings": world, "checkpoint_every": 1, **space, **sizes}
    outputs = {n: {"output": str(tmp_path / n), "mlflow": {"experiment": n}} for n in ("1", "2")}
    single = run_sweep(sweep_config({**doc, **outputs["1"]}))
    marker = tmp_path / "killed.txt"
    drill = {"epoch": 2, "rank": 0, "marker": str(marker)}
    packed = run_sweep(sweep_config({**doc, **outputs["2"], "pack": 2, "fault_injection": drill}))
    assert marker.exists(), "the failure was injected"
    for out in (single, packed):
        assert [(f.stage, f.lr) for f in out.failed] == [("grid", 100.0)]
        assert "non-finite" in out.failed[0].reason
    assert packed.selection == single.selection
    assert single.summary["asymvlm-vmf"]["n_seeds"] == 3
    for metric, cell in single.summary["asymvlm-vmf"].items():
        if isinstance(cell, dict):
            got = packed.summary["asymvlm-vmf"][metric]["mean"]
            assert got == pytest.approx(cell["mean"], abs=1e-6), metric

    summary = (tmp_path / "1" / "summary.md").read_text()
    assert "1 trial(s) failed" in summary and "non-finite" in summary
    assert "nan" not in summary.lower().replace("non-finite", "")
    client = MlflowClient(single.tracking_uri)
    assert client.get_run(single.parent_run_id).data.metrics["failed_trials"] == 1
    single_runs = [client.get_run(i) for i in single.child_run_ids]
    (failed,) = [r for r in single_runs if r.info.status == "FAILED"]
    assert failed.data.params["lr"] == "100.0" and failed.data.tags["stage"] == "grid"
    assert "non-finite" in failed.data.tags["failure_reason"]

    client = MlflowClient(packed.tracking_uri)
    runs = [client.get_run(i) for i in packed.child_run_ids]
    assert sorted(r.info.status for r in runs) == ["FAILED"] + ["FINISHED"] * 3
    for run in runs:  # every member has its own epochs, once each
        steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "train_loss"))
        assert steps == [1, 2, 3] or (run.info.status == "FAILED" and len(steps) < 3)
    adapters = sweep_adapters(packed.tracking_uri, packed.parent_run_id)
    assert set(adapters) == {f"asymvlm-vmf/seed{s}" for s in (0, 1, 2)}
    for trial in glob.glob(str(tmp_path / "2" / "tune" / "trials" / "*" / "sweep_trial_*")):
        kept = glob.glob(os.path.join(trial, "checkpoint_*"))
        assert 0 < len(kept) <= KEEP_CHECKPOINTS, kept  # of the 3 epochs' checkpoints


def test_a_trainer_state_is_read_on_the_cpu_whatever_the_device(world, tmp_path) -> None:
    """Every resume (Ray Train, Tune, ``asymvlm train --resume``) reads the checkpoint by
    :func:`asymvlm.checkpoints.read_run_state` on the CPU: the RNG state stays a CPU tensor
    (torch.set_rng_state refuses others); the trainer moves the rest to its device."""
    from asymvlm.checkpoints import read_run_state
    from asymvlm.methods import build_method
    from asymvlm.training import Trainer
    from asymvlm_ray.ray_train import checkpoint_folder

    data = load_split(world, "train", "raw", "cpu")
    cfg = TrainConfig(method="asymvlm-vmf", epochs=2, batch_size=64, hidden_dim=16, device="cpu")
    torch.manual_seed(0)
    trainer = Trainer(build_method(cfg.method, data.dim, **cfg.method_args()), cfg, data)
    history = trainer.fit(progress=False)[:1]
    trainer.epoch = 1  # (the state of a run stopped after its first epoch)
    with checkpoint_folder(trainer, history) as folder:  # what a Ray run reports
        state = read_run_state(folder)
    assert state.trainer["torch_rng"].device.type == "cpu"
    assert {t.device.type for t in state.trainer["method"].values()} == {"cpu"}
    assert state.history == history
    torch.manual_seed(1)
    fresh = Trainer(build_method(cfg.method, data.dim, **cfg.method_args()), cfg, data)
    fresh.load_state_dict(state.trainer)
    assert fresh.epoch == 1
    for key, value in trainer.method.state_dict().items():
        assert torch.equal(fresh.method.state_dict()[key], value), key
