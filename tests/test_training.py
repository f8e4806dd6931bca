"""The single-process trainer: batching, determinism, resume, checkpoints."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from asymvlm import tables
from asymvlm.errors import CheckpointError
from asymvlm.methods import build_method
from asymvlm.training import (
    SplitTensors,
    TrainConfig,
    Trainer,
    load_checkpoint,
    load_split,
    save_checkpoint,
    steps_per_epoch,
    train,
)


def _toy_split(n_image: int = 40, n_text: int = 100, dim: int = 8, seed: int = 0) -> SplitTensors:
    g = torch.Generator().manual_seed(seed)
    images = torch.nn.functional.normalize(torch.randn(n_image, dim, generator=g), dim=-1)
    t2i = torch.randint(0, n_image, (n_text,), generator=g)
    texts = 5.0 * (images[t2i] + 0.3 * torch.randn(n_text, dim, generator=g))
    return SplitTensors(image_emb=images, text_emb=texts, text_to_image=t2i, split=None)


def _cfg(**kw) -> TrainConfig:
    base = dict(epochs=4, lr=1e-2, batch_size=32, hidden_dim=16, depth=2, optimizer="sgd")
    base.update(kw)
    return TrainConfig(**base)


def test_steps_per_epoch_drops_ragged_tail() -> None:
    assert steps_per_epoch(100, 32) == 3
    assert steps_per_epoch(96, 32) == 3
    assert steps_per_epoch(10, 32) == 1


def test_each_epoch_visits_distinct_captions_with_their_images() -> None:
    data = _toy_split()
    method = build_method("asymvlm-vmf", 8, hidden_dim=16, depth=2)
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    original = method.loss_features

    def spy(image_emb, text_emb):
        seen.append((image_emb.clone(), text_emb.clone()))
        return original(image_emb, text_emb)

    method.loss_features = spy  # type: ignore[method-assign]
    trainer = Trainer(method, _cfg(), data)
    trainer.train_epoch()
    assert len(seen) == 3 and all(t.shape == (32, 8) for _, t in seen)
    rows = torch.cat([t for _, t in seen])
    # Every text row is a distinct caption of the split ...
    match = (rows[:, None, :] == data.text_emb[None]).all(-1)
    idx = match.float().argmax(1)
    assert match.any(1).all() and len(set(idx.tolist())) == 96
    # ... and each is paired with its own image.
    images = torch.cat([i for i, _ in seen])
    assert torch.equal(images, data.image_emb[data.text_to_image[idx]])
    # A new epoch draws a new permutation.
    seen.clear()
    trainer.train_epoch()
    rows2 = torch.cat([t for _, t in seen])
    assert not torch.equal(rows, rows2)


def test_cosine_schedule_reaches_min_lr() -> None:
    trainer = Trainer(build_method("asymvlm-vmf", 8, hidden_dim=16, depth=2), _cfg(), _toy_split())
    lrs = [trainer.train_epoch()["lr"] for _ in range(4)]
    assert lrs[0] < 1e-2 and all(a > b for a, b in zip(lrs, lrs[1:], strict=False))
    assert lrs[-1] == pytest.approx(1e-6)


def test_training_is_deterministic_and_resume_matches_uninterrupted() -> None:
    def fresh() -> Trainer:
        torch.manual_seed(123)
        return Trainer(build_method("asymvlm-ps", 8, hidden_dim=16, depth=2), _cfg(), _toy_split())

    full = fresh()
    full.fit(progress=False)

    first = fresh()
    first.start()
    first.train_epoch()
    first.train_epoch()
    state = first.state_dict()

    resumed = fresh()  # new process: different init, overwritten by the checkpoint
    with torch.no_grad():
        for p in resumed.method.parameters():
            p.add_(1.0)
    resumed.load_state_dict(state)
    history = resumed.fit(progress=False)
    assert [row["epoch"] for row in history] == [3, 4]
    for a, b in zip(
        full.method.state_dict().values(), resumed.method.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b)


def test_loss_falls_and_stats_are_logged() -> None:
    torch.manual_seed(0)
    trainer = Trainer(
        build_method("asymvlm-vmf", 8, hidden_dim=32, depth=2),
        _cfg(epochs=30, optimizer="adamw", lr=3e-3),
        _toy_split(),
    )
    history = trainer.fit(progress=False)
    assert history[-1]["train_loss"] < 0.8 * history[0]["train_loss"]
    for key in ("lr", "temperature", "kappa_mean", "kappa_p05", "kappa_p50", "kappa_p95"):
        assert key in history[-1] and np.isfinite(history[-1][key])
    assert history[-1]["kappa_p05"] <= history[-1]["kappa_p50"] <= history[-1]["kappa_p95"]


def test_bad_optimizer_is_rejected() -> None:
    with pytest.raises(ValueError, match="optimizer"):
        Trainer(
            build_method("pfe", 8, hidden_dim=8, depth=1), _cfg(optimizer="lbfgs"), _toy_split()
        )


def test_checkpoint_round_trip(tmp_path) -> None:
    data = _toy_split()
    method = build_method("symvlm", 8, hidden_dim=16, depth=2)
    cfg = _cfg(method="symvlm")
    save_checkpoint(str(tmp_path), method, cfg, dim=8)
    loaded, meta = load_checkpoint(str(tmp_path))
    assert meta["method"] == "symvlm" and meta["method_kwargs"]["hidden_dim"] == 16
    method.eval()
    torch.testing.assert_close(
        loaded.log_likelihood(data.image_emb, data.text_emb),
        method.log_likelihood(data.image_emb, data.text_emb),
    )
    with pytest.raises(CheckpointError, match="nope: no checkpoint there"):
        load_checkpoint(str(tmp_path / "nope"))


def test_train_from_tables_writes_checkpoint_and_history(small_world, tmp_path) -> None:
    out = tmp_path / "ckpt"
    cfg = TrainConfig(method="asymvlm-vmf", epochs=3, batch_size=128, hidden_dim=32, depth=2)
    method, history = train(small_world, "train", cfg, output=str(out), progress=False)
    assert len(history) == 3
    lines = (out / "history.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [1, 2, 3]
    meta = json.loads((out / "config.json").read_text())
    assert meta["embedding_model"] == "synthetic-world" and meta["adapter_input"] == "raw"
    assert os.path.exists(out / "model.pt")


def test_frozen_reference_needs_no_training(small_world, tmp_path) -> None:
    method, history = train(small_world, "train", TrainConfig(method="clip"), output=str(tmp_path))
    assert history == [] and not list(method.parameters())
    loaded, _ = load_checkpoint(str(tmp_path))
    assert loaded.name == "clip"


def test_adapter_input_raw_uses_the_stored_norm(small_world) -> None:
    raw = load_split(small_world, "test", "raw")
    unit = load_split(small_world, "test", "unit")
    norms = raw.text_emb.norm(dim=-1)
    split = tables.read_split(small_world, "test")
    np.testing.assert_allclose(norms.numpy(), split.text_norms, rtol=1e-5)
    torch.testing.assert_close(unit.text_emb.norm(dim=-1), torch.ones(len(norms)))


def test_fit_start_calibrates_the_adapter_input_scale(tmp_path) -> None:
    data = _toy_split()
    trainer = Trainer(build_method("asymvlm-vmf", 8, hidden_dim=16, depth=2), _cfg(), data)
    adapter = trainer.method.text_adapter
    assert float(adapter.input_scale) == 1.0  # the official code's scale before calibration
    trainer.start()
    expected = (8 / data.text_emb.pow(2).sum(-1).mean()).sqrt()
    torch.testing.assert_close(adapter.input_scale, expected)
    # Unit RMS per coordinate at the first layer.
    scaled = data.text_emb * adapter.input_scale
    assert abs(float(scaled.pow(2).mean()) - 1.0) < 1e-5
    save_checkpoint(str(tmp_path), trainer.method, _cfg(), dim=8)
    loaded, _ = load_checkpoint(str(tmp_path))
    torch.testing.assert_close(loaded.text_adapter.input_scale, expected)

    off = build_method("asymvlm-vmf", 8, hidden_dim=16, depth=2, calibrate_input=False)
    off.fit_start(data.image_emb, data.text_emb)
    assert float(off.text_adapter.input_scale) == 1.0
