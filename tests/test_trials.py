"""Sweep trials that run the protocol in place: the per-process split cache, the same results
as through a TorchTrainer, and resuming a killed trial."""

from __future__ import annotations

import json
import os

import pytest
import torch

from asymvlm.protocol import RunSpec, run_protocol
from asymvlm.splits import SplitCache, load_split
from asymvlm.synthetic import write_world
from asymvlm.training import TrainConfig
from tests.conftest import small_world_config


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


def test_a_trial_runs_as_many_torch_threads_as_cpus_it_reserved() -> None:
    """A process that imported torch before its trial (a reused actor, a preloaded worker)
    keeps its first thread count unless the trial sets it."""
    from types import SimpleNamespace

    from pipelines.tuning.trials import use_reserved_cpus

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        use_reserved_cpus(SimpleNamespace(cpus_per_worker=1.0))
        assert torch.get_num_threads() == 1
        use_reserved_cpus(SimpleNamespace(cpus_per_worker=0.5))  # a fraction: one thread
        assert torch.get_num_threads() == 1
        use_reserved_cpus(SimpleNamespace(cpus_per_worker=3))
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_runs_on_cached_splits_equal_runs_that_read_their_own(world) -> None:
    """Two runs through one cache (the second trains on the first's tensors, hold-out
    included) end exactly where runs that read the tables themselves end."""
    cache = SplitCache()
    for seed, lr in ((0, 5e-3), (1, 1e-2)):
        train = TrainConfig(
            method="asymvlm-vmf",
            epochs=2,
            lr=lr,
            optimizer="adamw",
            batch_size=64,
            hidden_dim=16,
            seed=seed,
        )
        spec = RunSpec(embeddings=world, train=train, val_split=None, val_fraction=0.2)
        plain = run_protocol(spec)
        cached = run_protocol(spec, cache=cache)
        assert plain is not None and cached is not None
        assert [r["train_loss"] for r in cached["history"]] == [
            r["train_loss"] for r in plain["history"]
        ]
        for split in ("val", "test"):
            assert json.dumps(cached[split], sort_keys=True) == json.dumps(
                plain[split], sort_keys=True
            )
    # train and test read once; the hold-out made once; the second run only hits
    assert cache.misses == 3 and cache.hits >= 3


def _sweep_cfg(world: str, tmp_path, name: str, **extra):
    from pipelines.schema import sweep_config

    return sweep_config(
        {
            "embeddings": world,
            "methods": ["asymvlm-vmf", "determ-ft"],
            "lr": [1e-3, 1e-2],
            "seeds": [0, 1],
            "epochs": 3,
            "batch_size": 64,
            "optimizer": "adamw",
            "hidden_dim": 16,
            "num_workers": 1,
            "checkpoint_every": 2,
            "val_fraction": 0.2,
            "output": str(tmp_path / name),
            "mlflow": {"experiment": name},
            **extra,
        }
    )


@pytest.mark.slow
def test_trials_in_place_give_the_results_of_torch_trainer_trials(
    ray_session, world, tmp_path
) -> None:
    """The issue's acceptance: on the same config the selected lrs and the seed metrics of the
    new trials equal those of the earlier design (every trial a TorchTrainer)."""
    from pipelines.tuning.sweep import run_sweep

    # One method: what differs is the runner, not the method (each TorchTrainer trial costs
    # ~15 s of Ray Train start-up on 2 CPUs).
    one = {"methods": ["asymvlm-vmf"]}
    fast = run_sweep(_sweep_cfg(world, tmp_path, "in-place", **one))
    old = run_sweep(
        _sweep_cfg(world, tmp_path, "torch-trainer", trial_runner="torch_trainer", **one)
    )
    assert not fast["failed"] and not old["failed"]
    assert {m: p["lr"] for m, p in fast["selection"].items()} == {
        m: p["lr"] for m, p in old["selection"].items()
    }
    for method in ("asymvlm-vmf",):
        for metric, cell in old["summary"][method].items():
            if isinstance(cell, dict):
                assert fast["summary"][method][metric]["mean"] == pytest.approx(
                    cell["mean"], abs=1e-6
                ), (method, metric)
    assert fast["selection"]["asymvlm-vmf"]["scores_by_lr"] == pytest.approx(
        old["selection"]["asymvlm-vmf"]["scores_by_lr"], abs=1e-6
    )


def _plain_and_killed(world: str, tmp_path, prefix: str, space: dict) -> tuple[dict, dict]:
    """The sweep of ``space`` run plainly, then with its trial's process SIGKILLed right after
    epoch 2's checkpoint; the second must finish with the first one's summary."""
    from pipelines.tuning.sweep import run_sweep

    plain = run_sweep(_sweep_cfg(world, tmp_path, prefix + "plain", **space))
    marker = tmp_path / f"{prefix}killed.txt"
    drill = {"epoch": 2, "rank": 0, "marker": str(marker)}
    killed = run_sweep(
        _sweep_cfg(world, tmp_path, prefix + "killed", fault_injection=drill, **space)
    )
    assert marker.exists(), "the failure was injected"
    assert not killed["failed"]
    assert killed["summary"] == plain["summary"]
    return plain, killed


@pytest.mark.slow
def test_a_killed_trial_resumes_from_its_checkpoint(ray_session, world, tmp_path) -> None:
    """The trial's process is SIGKILLed after epoch 2's checkpoint; Tune retries it
    (``max_failures``) from that checkpoint and it ends where an uninterrupted trial ends."""

    one = {
        "methods": ["asymvlm-vmf"],
        "lr": [5e-3],
        "seeds": [0],
        "epochs": 4,
        "checkpoint_every": 1,
        "max_failures": 1,
    }
    _, killed = _plain_and_killed(world, tmp_path, "", one)
    # Resumed, not started over: epochs 1-2 before the kill, 3-4 after, each logged once.
    from mlflow import MlflowClient

    (run_id,) = killed["child_run_ids"]
    steps = [
        m.step
        for m in MlflowClient(killed["tracking_uri"]).get_metric_history(run_id, "train_loss")
    ]
    assert sorted(steps) == [1, 2, 3, 4]


@pytest.mark.slow
def test_a_killed_pack_resumes_from_its_checkpoint(ray_session, world, tmp_path) -> None:
    """A pack of two lrs is SIGKILLed right after epoch 2's checkpoint; Tune's retry resumes
    it from there (``max_failures``): both members end as in the uninterrupted sweep, each
    epoch in MLflow once, and the trial keeps only its latest checkpoints."""
    import glob

    from mlflow import MlflowClient

    from pipelines.tuning.sweep import KEEP_CHECKPOINTS

    space = {
        "methods": ["asymvlm-vmf"],
        "lr": [1e-3, 5e-3],
        "seeds": [0],
        "epochs": 4,
        "checkpoint_every": 1,
        "max_failures": 1,
        "pack": 2,
    }
    plain, killed = _plain_and_killed(world, tmp_path, "pack-", space)
    assert killed["selection"] == plain["selection"]
    client = MlflowClient(killed["tracking_uri"])
    assert len(killed["child_run_ids"]) == 2
    for run_id in killed["child_run_ids"]:  # resumed at epoch 2, not started over
        steps = [m.step for m in client.get_metric_history(run_id, "train_loss")]
        assert sorted(steps) == [1, 2, 3, 4]
    trial_dirs = glob.glob(str(tmp_path / "pack-killed" / "tune" / "trials" / "direct_trial_*"))
    assert len(trial_dirs) == 1
    kept = glob.glob(os.path.join(trial_dirs[0], "checkpoint_*"))
    assert 0 < len(kept) <= KEEP_CHECKPOINTS, kept  # of the 4 epochs' checkpoints


@pytest.mark.slow
def test_a_packed_method_fitted_post_hoc_leaves_its_adapters(ray_session, world, tmp_path) -> None:
    """``pack`` packs only methods trained by SGD: the frozen reference's trials run one by one
    and every seed's adapter reaches MLflow and the sweep's adapter folders."""
    from asymvlm.evaluation.adapters import sweep_adapters
    from pipelines.tuning.sweep import run_sweep

    out = run_sweep(
        _sweep_cfg(world, tmp_path, "clip-pack", methods=["clip"], lr=[1e-3], seeds=[0, 1], pack=2)
    )
    assert not out["failed"]
    adapters = sweep_adapters(out["tracking_uri"], out["parent_run_id"])
    assert set(adapters) == {"clip/seed0", "clip/seed1"}
    assert set(out["adapters"]["clip"]) == {"0", "1"}
    for uri in out["adapters"]["clip"].values():
        assert os.path.exists(os.path.join(uri, "config.json"))


@pytest.mark.slow
def test_packed_trials_give_the_results_of_single_trials(ray_session, world, tmp_path) -> None:
    """``pack: 3``: the grid (three lrs, one diverging) is one pack, stage 2 (two seeds)
    another; each member keeps its own MLflow run, a diverging member fails alone, and the
    selection, seed metrics and adapters equal those of one trial per run."""
    from mlflow import MlflowClient

    from asymvlm.evaluation.adapters import sweep_adapters
    from pipelines.tuning.sweep import run_sweep

    space = {
        "methods": ["asymvlm-vmf"],
        "lr": [1e-3, 5e-3, 100.0],
        "seeds": [0, 1, 2],
        "optimizer": "sgd",
        "epochs": 3,
    }
    single = run_sweep(_sweep_cfg(world, tmp_path, "single", **space))
    packed = run_sweep(_sweep_cfg(world, tmp_path, "packed", pack=3, **space))
    for out in (single, packed):
        assert [(f["stage"], f["lr"]) for f in out["failed"]] == [("grid", 100.0)]
        assert "non-finite" in out["failed"][0]["reason"]
    assert packed["selection"]["asymvlm-vmf"]["lr"] == single["selection"]["asymvlm-vmf"]["lr"]
    cells = single["summary"]["asymvlm-vmf"]
    assert packed["summary"]["asymvlm-vmf"]["n_seeds"] == cells["n_seeds"] == 3
    for metric, cell in cells.items():
        if isinstance(cell, dict):
            assert packed["summary"]["asymvlm-vmf"][metric]["mean"] == pytest.approx(
                cell["mean"], abs=1e-6
            ), metric

    client = MlflowClient(packed["tracking_uri"])
    runs = [client.get_run(i) for i in packed["child_run_ids"]]
    assert sorted(r.info.status for r in runs) == ["FAILED"] + ["FINISHED"] * 4
    for run in runs:  # every member has its own epochs
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")]
        assert steps == [1, 2, 3] or (run.info.status == "FAILED" and len(steps) < 3)
    adapters = sweep_adapters(packed["tracking_uri"], packed["parent_run_id"])
    assert set(adapters) == {f"asymvlm-vmf/seed{s}" for s in (0, 1, 2)}


def test_a_trainer_state_is_read_on_the_cpu_whatever_the_device(world, tmp_path) -> None:
    """Every resume (a Ray Train run, a Tune trial, ``asymvlm train --resume``) reads the one
    checkpoint layout through :func:`asymvlm.checkpoints.read_run_state`, on the CPU: the RNG
    state must stay a CPU tensor (torch.set_rng_state refuses others), the trainer moves the
    rest to its device."""
    from asymvlm.checkpoints import read_run_state
    from asymvlm.methods import build_method
    from asymvlm.training import Trainer
    from pipelines.ray_train import checkpoint_folder

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
