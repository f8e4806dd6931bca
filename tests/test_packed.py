"""Packed trials: K configurations trained as one batched model end as their unpacked runs do."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest
import torch

from asymvlm.errors import ConfigError
from asymvlm.methods import build_method
from asymvlm.runner import RunSpec, train_and_evaluate, train_and_evaluate_packed
from asymvlm.splits import load_split
from asymvlm.training import PackedTrainer, TrainConfig, Trainer, check_packable
from tests.world_fingerprint import flatten

RTOL = 1e-5
#: (lr, seed) of the three members: different learning rates AND seeds.
MEMBERS = ((5e-3, 1), (1e-2, 2), (2e-3, 3))


def _cfg(method: str, lr: float, seed: int, **kw: Any) -> TrainConfig:
    base = dict(epochs=3, batch_size=64, hidden_dim=16, depth=2, device="cpu")
    return TrainConfig(**{**base, "method": method, "lr": lr, "seed": seed, **kw})


def _specs(root: str, method: str, members=MEMBERS, **kw: Any) -> list[RunSpec]:
    return [RunSpec(embeddings=root, train=_cfg(method, lr, seed, **kw)) for lr, seed in members]


def _flat(x: Any) -> dict[str, Any]:
    """Nested dicts / lists as {path: leaf}, without the wall times."""
    return {k: v for k, v in flatten(x).items() if "epoch_seconds" not in k.split("/")}


def _assert_close(packed: Any, alone: Any) -> None:
    """Histories, evaluations: equal to float tolerance."""
    p, a = _flat(packed), _flat(alone)
    assert p.keys() == a.keys()
    for k, v in a.items():
        assert p[k] == (
            pytest.approx(v, rel=RTOL, abs=1e-7, nan_ok=True) if isinstance(v, float) else v
        ), k


def _unpacked(cfg: TrainConfig, data) -> tuple[torch.nn.Module, list[dict]]:
    """What TrainingRun does for one run: seed, build, train with a Trainer."""
    torch.manual_seed(cfg.seed)
    method = build_method(cfg.method, data.dim, **cfg.method_args())
    return method, Trainer(method, cfg, data).fit(progress=False)


# -- equality with unpacked runs ------------------------------------------------------------------
def test_the_packed_protocol_equals_three_unpacked_runs(small_world, one_thread) -> None:
    """Each member's history and evaluation are its unpacked run's; a diverging member stops
    alone, with the unpacked run's message and history."""
    members = ((1e-2, 1), (1e6, 2), (5e-3, 3))
    specs = _specs(small_world, "asymvlm-vmf", members=members, optimizer="sgd")
    packed = train_and_evaluate_packed(specs)
    alone = [train_and_evaluate(spec) for spec in specs]
    where = r"at epoch \d+ of 3, step \d+ of 14 \(asymvlm-vmf, sgd lr 1e\+06\)"
    assert re.match(rf"non-finite .* {where}", alone[1]["diverged"])
    assert packed[1] == alone[1]  # the same message, the same history before it
    for k in (0, 2):
        p, a = packed[k], alone[k]
        assert sorted(a) == ["dim", "epochs_run", "history", "test", "val"]
        assert a["epochs_run"] == 3 and len(a["history"]) == 3
        _assert_close(p, a)
    assert packed[0]["history"][-1]["train_loss"] != packed[2]["history"][-1]["train_loss"]


@pytest.mark.parametrize("method", ["asymvlm-ps", "elip"])
def test_packed_members_end_with_the_parameters_of_their_unpacked_runs(
    small_world, one_thread, method
) -> None:
    # elip draws its galleries from the global RNG in fit_start: each member's own stream
    data = load_split(small_world, "train", "raw", "cpu")
    cfgs = [_cfg(method, lr, seed, epochs=2) for lr, seed in MEMBERS]
    pack = PackedTrainer(cfgs, data)
    histories = pack.fit()
    assert pack.errors == [None, None, None]
    for k, cfg in enumerate(cfgs):
        method_alone, history = _unpacked(cfg, data)
        _assert_close(histories[k], history)
        mine, theirs = pack.methods[k].state_dict(), method_alone.state_dict()
        assert sorted(mine) == sorted(theirs)
        for key in theirs:
            torch.testing.assert_close(mine[key], theirs[key], rtol=RTOL, atol=1e-5, msg=key)
    # after training every member owns its parameters again (not a row of the pack's)
    for p in pack.methods[1].parameters():
        assert p.untyped_storage().nbytes() == p.numel() * p.element_size()


def test_the_frozen_reference_packs_as_its_own_runs(small_world, one_thread) -> None:
    specs = _specs(small_world, "clip", members=((1e-2, 0), (1e-2, 1)))
    packed = train_and_evaluate_packed(specs)
    for p, spec in zip(packed, specs, strict=True):
        alone = train_and_evaluate(spec)
        assert p["history"] == alone["history"] == []
        _assert_close(p["test"], alone["test"])


# -- what cannot be packed ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "change",
    [{"epochs": 4}, {"method": "asymvlm-ps"}, {"method_kwargs": {"init_temperature": 2.0}}],
)
def test_configurations_differing_in_more_than_lr_and_seed_are_refused(small_world, change):
    cfgs = [_cfg("asymvlm-vmf", lr, seed, optimizer="adamw") for lr, seed in ((1e-2, 0), (2e-2, 1))]
    cfgs[1] = TrainConfig(**{**cfgs[1].model_dump(), **change})
    field = next(iter(change))
    with pytest.raises(ConfigError, match=rf"configuration 1 differs .* in {field} "):
        check_packable(cfgs)
    data = load_split(small_world, "train", "raw", "cpu")
    with pytest.raises(ConfigError, match=field):
        PackedTrainer(cfgs, data)
    with pytest.raises(ConfigError, match=field):
        train_and_evaluate_packed([RunSpec(embeddings=small_world, train=c) for c in cfgs])


def test_runs_on_other_data_are_refused(small_world) -> None:
    specs = _specs(small_world, "asymvlm-vmf", members=((1e-2, 0), (1e-2, 1)))
    specs[1] = specs[1].model_copy(update={"test_split": None})
    with pytest.raises(ConfigError, match=r"run 1 differs from run 0 in test_split"):
        train_and_evaluate_packed(specs)
    with pytest.raises(ConfigError, match="at least one"):
        train_and_evaluate_packed([])


# -- resuming ------------------------------------------------------------------------------------
class _Killed(Exception):
    """Stands for the process dying right after a checkpoint."""


def _roundtrip(state: dict) -> dict:
    """Through a file, as a checkpoint travels (loaded on the CPU)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    return torch.load(io.BytesIO(buf.getvalue()), map_location="cpu", weights_only=False)


def test_a_pack_resumed_from_its_state_ends_as_the_uninterrupted_pack(small_world, one_thread):
    """Stopped after epoch 2 of 4, saved, loaded into a fresh pack and trained on: the rows and
    parameters of the pack never stopped, bit for bit; a diverged member stays stopped."""
    data = load_split(small_world, "train", "raw", "cpu")
    members = ((5e-3, 1), (1e6, 2), (2e-3, 3))  # member 1 diverges in its first epoch
    cfgs = [_cfg("asymvlm-vmf", lr, seed, epochs=4, optimizer="sgd") for lr, seed in members]
    whole = PackedTrainer(cfgs, data)
    whole.fit()
    assert whole.errors[1] is not None and whole.errors[0] is whole.errors[2] is None

    saved: list[dict] = []

    def stop_at_second(pack: PackedTrainer) -> None:
        saved.append(_roundtrip(pack.state_dict()))
        if len(saved) == 2:
            raise _Killed

    first = PackedTrainer(cfgs, data)
    with pytest.raises(_Killed):
        first.fit(on_state=stop_at_second)
    state = saved[-1]
    # every tensor of the state owns its storage (not a view of the pack's stacked leaves)
    for tensor in state["trainers"][2]["method"].values():
        assert tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
    resumed = PackedTrainer(cfgs, data)
    resumed.load_state_dict(state)
    resumed.fit()
    assert resumed.errors == whole.errors
    assert resumed.histories[1] == whole.histories[1] == []  # diverged in its first epoch
    for k in range(3):  # every epoch logged once, as in the pack never stopped
        _assert_close(resumed.histories[k], whole.histories[k])
        assert resumed.trainers[k].epoch == whole.trainers[k].epoch
        mine, theirs = resumed.methods[k].state_dict(), whole.methods[k].state_dict()
        for key in theirs:
            torch.testing.assert_close(mine[key], theirs[key], rtol=0, atol=0, equal_nan=True)
    assert len(resumed.histories[0]) == 4


def test_a_pack_never_streams_it_says_so(small_world, tmp_path) -> None:
    """A pack holds its split in memory: streaming is refused."""
    from asymvlm_ray.schema import sweep_config

    doc = dict(embeddings=small_world, methods=["asymvlm-vmf"], lr=[1e-3, 1e-2], seeds=[0])
    doc.update(output=str(tmp_path / "o"), pack=2, stream="always")
    with pytest.raises(ConfigError, match="pack > 1 .* cannot stream it"):
        sweep_config(doc, "space.yaml")
    sweep_config({**doc, "stream": "never"}, "space.yaml")  # in memory: fine
    always = [_cfg("asymvlm-vmf", lr, 0, stream="always") for lr in (1e-3, 1e-2)]
    with pytest.raises(ConfigError, match="cannot stream it"):
        check_packable(always)
    tight = [_cfg("asymvlm-vmf", lr, 0, stream_memory_bytes=1) for lr in (1e-3, 1e-2)]
    with pytest.raises(ConfigError, match="larger than the memory budget .* set pack: 1"):
        train_and_evaluate_packed([RunSpec(embeddings=small_world, train=c) for c in tight])
