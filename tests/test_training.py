"""The single-process trainer: batching, determinism, resume, checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from asymvlm.checkpoints import load_checkpoint, save_checkpoint
from asymvlm.evaluation.registry import evaluate_split
from asymvlm.methods import Method, build_method
from asymvlm.methods.base import info_nce
from asymvlm.runner import RunSpec, train, train_and_evaluate
from asymvlm.splits import SplitTensors, hold_out_images, load_split
from asymvlm.training import TrainConfig, Trainer
from asymvlm.training.trainer import steps_per_epoch
from tests.helpers import nan_losses_from, toy_config, toy_split


def test_each_epoch_visits_distinct_captions_with_their_images() -> None:
    data, seen = toy_split(), []
    method = build_method("asymvlm-vmf", 8, hidden_dim=16, depth=2)
    original = method.loss_features
    method.loss_features = lambda i, t: seen.append((i, t)) or original(i, t)  # type: ignore
    trainer = Trainer(method, toy_config(), data)
    trainer.train_epoch()
    assert steps_per_epoch(100, 32) == steps_per_epoch(96, 32) == 3  # the ragged tail dropped
    assert steps_per_epoch(10, 32) == 1  # unless it is the only batch
    assert len(seen) == 3 and all(t.shape == (32, 8) for _, t in seen)
    rows = torch.cat([t for _, t in seen])
    # Every text row is a distinct caption of the split, paired with its own image.
    match = (rows[:, None, :] == data.text_emb[None]).all(-1)
    idx = match.float().argmax(1)
    assert match.any(1).all() and len(set(idx.tolist())) == 96
    assert torch.equal(torch.cat([i for i, _ in seen]), data.image_emb[data.text_to_image[idx]])
    seen.clear()
    trainer.train_epoch()
    assert not torch.equal(rows, torch.cat([t for _, t in seen]))  # a new permutation


def test_loss_falls_lr_follows_the_cosine_and_stats_are_logged() -> None:
    torch.manual_seed(0)
    method = build_method("asymvlm-vmf", 8, hidden_dim=32, depth=2)
    trainer = Trainer(method, toy_config(epochs=12, optimizer="adamw", lr=1e-2), toy_split())
    history = trainer.fit(progress=False)
    assert history[-1]["train_loss"] < 0.8 * history[0]["train_loss"]
    lrs = [row["lr"] for row in history]
    assert lrs[0] < 1e-2 and all(a > b for a, b in zip(lrs, lrs[1:], strict=False))
    assert lrs[-1] == pytest.approx(1e-6)
    for key in ("temperature", "kappa_mean", "kappa_p05", "kappa_p50", "kappa_p95"):
        assert key in history[-1] and np.isfinite(history[-1][key])
    assert history[-1]["kappa_p05"] <= history[-1]["kappa_p50"] <= history[-1]["kappa_p95"]


def test_frozen_reference_needs_no_training(small_world, tmp_path) -> None:
    method, history = train(small_world, "train", TrainConfig(method="clip"), output=str(tmp_path))
    assert history == [] and not list(method.parameters())
    loaded, _ = load_checkpoint(str(tmp_path))
    assert loaded.name == "clip"


def test_fit_start_calibrates_the_adapter_input_scale(tmp_path) -> None:
    """Unit RMS per coordinate at the first layer, kept in the checkpoint; 1 when switched off."""
    data = toy_split()
    trainer = Trainer(build_method("asymvlm-vmf", 8, hidden_dim=16, depth=2), toy_config(), data)
    assert float(trainer.method.text_adapter.input_scale) == 1.0
    trainer.start()
    expected = (8 / data.text_emb.pow(2).sum(-1).mean()).sqrt()
    torch.testing.assert_close(trainer.method.text_adapter.input_scale, expected)
    save_checkpoint(str(tmp_path), trainer.method, toy_config(), dim=8)
    torch.testing.assert_close(load_checkpoint(str(tmp_path))[0].text_adapter.input_scale, expected)
    off = build_method("asymvlm-vmf", 8, hidden_dim=16, depth=2, calibrate_input=False)
    off.fit_start(data.image_emb, data.text_emb)
    assert float(off.text_adapter.input_scale) == 1.0


# -- the protocol: one run of the paper's protocol, without Ray ---------------------------------
def _spec(root: str, epochs: int = 4, **kw) -> RunSpec:
    train = dict(epochs=epochs, lr=5e-3, optimizer="adamw", batch_size=64, hidden_dim=16, depth=2)
    return RunSpec(embeddings=root, train=TrainConfig(**train, seed=3, device="cpu"), **kw)


@pytest.mark.parametrize(
    ("method", "epochs", "due"),
    [("asymvlm-vmf", range(1, 6), [False, True, False, True, True]), ("clip", [0], [True])],
)
def test_the_protocol_reports_every_epoch_with_a_checkpoint_when_due(
    small_world, one_thread, method, epochs, due
) -> None:
    """Every epoch, the last with a checkpoint due; the frozen ``clip`` once (at epoch 0)."""
    from asymvlm.evaluation import evaluate_retrieval

    cfg = _spec(small_world).train.model_copy(update={"method": method, "epochs": 5})
    calls, rows = [], []

    def on_epoch(row, trainer, history, due) -> None:
        calls.append((row["epoch"], trainer.epoch, len(history), due))
        rows.append(dict(row))

    spec = RunSpec(embeddings=small_world, train=cfg, checkpoint_every=2)
    out = train_and_evaluate(spec, on_epoch=on_epoch)
    assert sorted(out) == ["dim", "epochs_run", "history", "test", "val"]
    assert calls == [(e, e, e, d) for e, d in zip(epochs, due, strict=True)]
    if method == "clip":
        assert rows == [{"epoch": 0}] and (out["epochs_run"], out["history"]) == (0, [])
        frozen = evaluate_retrieval(build_method("clip", 16), load_split(small_world, "test"))
        for d in ("t2i", "i2t"):
            assert out["test"][d]["recall@1"] == frozen[d]["recall@1"]


def test_the_protocol_holds_out_validation_images_when_the_tables_have_none(small_world) -> None:
    shards: list[int] = []

    def on_epoch(row, trainer, history, due) -> None:
        shards.append(len(trainer.data.text_emb))

    spec = _spec(small_world, epochs=1, val_split="nope", val_fraction=0.2, test_split=None)
    out = train_and_evaluate(spec, on_epoch=on_epoch)
    rest, held = hold_out_images(load_split(small_world, "train"), 0.2, seed=0)
    assert shards == [rest.split.n_texts] and "test" not in out
    assert out["val"]["n_image"] == held.split.n_images
    assert out["val"]["n_text"] == held.split.n_texts
    # With a validation split in the tables the fraction is not used.
    spec = _spec(small_world, epochs=1, val_fraction=0.2, test_split=None)
    out = train_and_evaluate(spec, on_epoch=on_epoch)
    assert shards[1] == load_split(small_world, "train").split.n_texts
    assert out["val"]["n_image"] == 60


def test_a_diverged_protocol_run_returns_the_reason_and_history(small_world, monkeypatch) -> None:
    nan_losses_from(monkeypatch, epoch=1)  # from the second epoch on
    out = train_and_evaluate(_spec(small_world, epochs=3))
    assert sorted(out) == ["diverged", "history"]
    assert out["diverged"].startswith("non-finite loss and gradient at epoch 2 of 3, step 1 ")
    assert [row["epoch"] for row in out["history"]] == [1]


def test_the_ray_train_entry_point_without_lr_takes_the_protocols(
    small_world, monkeypatch, capsys
) -> None:
    """The run is validated (its lr the protocol's) and named before Ray starts."""
    import contextlib

    import pipelines.train as entry

    runs: list[tuple[RunSpec, str]] = []
    monkeypatch.setattr(entry, "RaySession", lambda **kw: contextlib.nullcontext())
    monkeypatch.setattr(
        entry,
        "run_training",
        lambda spec, *, name, **kw: runs.append((spec, name)) or {"history": [], "dim": 16},
    )
    argv = f"--embeddings {small_world} --method asymvlm-vmf --epochs 2 --set hidden_dim=16"
    assert entry.main([*argv.split(), "--val-split", ""]) == 0
    ((spec, name),) = runs
    assert (spec.train.lr, spec.train.optimizer, spec.train.hidden_dim) == (1e-2, "sgd", 16)
    assert spec.val_split is None and spec.test_split == "test"
    assert name == "asymvlm-vmf-lr0.01-seed0"
    assert entry.main(["--embeddings", small_world, "--lr", "-1"]) == 2
    assert "--lr = -1.0: Input should be greater than 0" in capsys.readouterr().err
    assert len(runs) == 1


class _TokenCount(Method):
    """Cosine with a learned temperature; its text rows carry each caption's token count."""

    name = "token-count"

    def __init__(self, dim: int) -> None:
        super().__init__(dim)
        self.temperature = torch.nn.Parameter(torch.tensor(10.0))
        self.seen: list[torch.Tensor] = []

    def split_inputs(self, data: SplitTensors) -> tuple[torch.Tensor, torch.Tensor]:
        images, texts = super().split_inputs(data)
        counts = torch.tensor([len(c.split()) for c in data.captions], dtype=texts.dtype)
        return images, torch.cat([texts, counts[:, None].to(texts.device)], 1)

    def encode(self, side: str, x: torch.Tensor) -> dict[str, torch.Tensor]:
        if side == "text":
            self.seen.append(x.detach().clone())
            x = x[:, :-1]
        return {"mu": torch.nn.functional.normalize(x, dim=-1)}

    def pair_loss(self, images, texts, *, epoch: int = 0) -> torch.Tensor:
        return info_nce(self.temperature * texts["mu"] @ images["mu"].T)


def test_a_method_sees_the_same_per_caption_inputs_in_training_and_evaluation(small_world):
    method = _TokenCount(0)
    for split in ("train", "test"):
        data = load_split(small_world, split)
        counts = torch.tensor([float(len(c.split())) for c in data.captions])
        method.seen.clear()
        if split == "train":
            Trainer(method, toy_config(epochs=1, batch_size=64), data).train_epoch()
        else:
            evaluate_split("retrieval", method, data)
        rows = torch.cat(method.seen)
        assert len(rows) >= 64 and len(counts.unique()) > 1
        distance, caption = torch.cdist(
            rows[:, :-1], data.text_emb, compute_mode="donot_use_mm_for_euclid_dist"
        ).min(dim=1)
        assert distance.max() == 0  # every row is a caption's embedding ...
        torch.testing.assert_close(rows[:, -1], counts[caption])  # ... with its token count
