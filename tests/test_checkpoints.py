"""Checkpoint folders: written as a whole, refused when unsafe, resumed bit for bit."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from asymvlm.checkpoints import (
    load_checkpoint,
    publish_folder,
    read_history,
    recover_checkpoint,
    save_checkpoint,
)
from asymvlm.cli import main
from asymvlm.errors import CheckpointError, ConfigError, NonFiniteError
from asymvlm.methods import build_method
from asymvlm.protocol import train
from asymvlm.training import TrainConfig


def _cfg(**kw) -> TrainConfig:
    base = dict(method="asymvlm-vmf", epochs=4, lr=1e-3, optimizer="adamw", batch_size=128)
    return TrainConfig(**{**base, "hidden_dim": 16, "depth": 2, "seed": 0, **kw})


def _assert_same_weights(a, b) -> None:
    wa, wb = (load_file(os.path.join(f, "model.safetensors")) for f in (a, b))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def _rows(folder) -> list[dict]:
    """history.jsonl without the wall-clock column."""
    return [{k: v for k, v in r.items() if k != "epoch_seconds"} for r in read_history(folder)]


def _meta(folder) -> dict:
    with open(os.path.join(folder, "config.json")) as fh:
        return json.load(fh)


def _save(folder, method: str = "symvlm", **kw) -> None:
    cfg = _cfg(method=method, hidden_dim=8, depth=1)
    save_checkpoint(str(folder), build_method(method, 8, **cfg.method_args()), cfg, 8, **kw)


# -- the folder and its atomic publication -----------------------------------------------------
def test_a_killed_write_leaves_or_recovers_the_old_checkpoint(tmp_path) -> None:
    folder = tmp_path / "ckpt"
    _save(folder)
    before = {name: (folder / name).read_bytes() for name in os.listdir(folder)}

    def dies_halfway(staging: str) -> None:
        Path(staging, "model.safetensors").write_bytes(b"half a file")
        raise KeyboardInterrupt  # as a kill would, mid-write

    with pytest.raises(KeyboardInterrupt):
        publish_folder(str(folder), dies_halfway)
    assert {name: (folder / name).read_bytes() for name in os.listdir(folder)} == before
    # killed after the old folder went aside and before the new one took its place:
    os.rename(folder, tmp_path / ".ckpt.previous")
    os.mkdir(tmp_path / ".ckpt.writing")
    recover_checkpoint(str(folder))
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]
    assert load_checkpoint(str(folder))[1]["method"] == "symvlm"


# -- load_checkpoint ---------------------------------------------------------------------------
def test_unloadable_checkpoints_are_named(tmp_path) -> None:
    folder = tmp_path / "ckpt"
    _save(folder, epoch=2)
    assert (_meta(folder)["complete"], _meta(folder)["epochs"]) == (False, 4)
    with pytest.raises(CheckpointError, match=r"incomplete checkpoint \(epoch 2 of 4\)"):
        load_checkpoint(str(folder))
    assert load_checkpoint(str(folder), allow_incomplete=True)[0].name == "symvlm"
    meta = {**_meta(folder), "method": "determ-ft", "complete": True}  # another run's config
    (folder / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(str(folder))
    assert str(err.value).startswith(
        f"{folder}: model.safetensors does not match config.json, which "
        "names method 'determ-ft' (dim 8): "
    )
    assert "key(s) in state_dict" in str(err.value)  # what does not fit, named by torch
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="model.safetensors: unreadable"):
        load_checkpoint(str(folder))


# -- train(): refusal, overwrite, resume -----------------------------------------------------
def test_unusable_outputs_are_refused(small_world, tmp_path, monkeypatch) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for output in (a_file, a_file / "ckpt"):
        with pytest.raises(CheckpointError, match=f"{a_file} is a file, not a folder"):
            train(small_world, "train", _cfg(), output=str(output))
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError, match=r"not part of a checkpoint \(notes.txt\)"):
        train(small_world, "train", _cfg(), output=str(busy))
    assert (busy / "notes.txt").read_text() == "mine"
    monkeypatch.chdir(busy.parent)
    with pytest.raises(CheckpointError, match=r"^\. is the current folder"):
        train(small_world, "train", _cfg(), output=".")
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda p, m: False if str(p) == str(locked) else real_access(p, m)
    )
    with pytest.raises(CheckpointError, match=f"\\({locked} is read-only"):
        train(small_world, "train", _cfg(), output=str(locked / "ckpt"))


class _Killed(Exception):
    pass


def _die_before_epoch(monkeypatch, epoch: int) -> None:
    """The process 'dies' as epoch ``epoch`` (1-based) would start."""
    from asymvlm.training import Trainer

    original = Trainer.train_epoch

    def train_epoch(self):
        if self.epoch + 1 == epoch:
            raise _Killed
        return original(self)

    monkeypatch.setattr(Trainer, "train_epoch", train_epoch)


def test_resume_ends_bit_for_bit_where_an_uninterrupted_run_ends(
    small_world, tmp_path, monkeypatch, one_thread
) -> None:
    cfg = _cfg(epochs=5)
    plain = str(tmp_path / "plain")
    _, history = train(small_world, "train", cfg, output=plain, progress=False)
    files = ["config.json", "history.jsonl", "model.safetensors", "trainer.pt"]
    assert sorted(os.listdir(plain)) == files and os.listdir(tmp_path) == ["plain"]
    meta = _meta(plain)
    assert (meta["complete"], meta["epoch"], meta["split"]) == (True, 5, "train")
    assert meta["train_config"]["lr"] == 1e-3 and meta["embeddings"] == os.path.abspath(small_world)
    assert (
        [r["epoch"] for r in read_history(plain)]
        == [1, 2, 3, 4, 5]
        == [r["epoch"] for r in history]
    )
    out = str(tmp_path / "resumed")
    with monkeypatch.context() as patch:
        _die_before_epoch(patch, 4)
        with pytest.raises(_Killed):
            train(small_world, "train", cfg, output=out, progress=False, checkpoint_every=2)
    meta = _meta(out)
    assert (meta["complete"], meta["epoch"]) == (False, 2)  # epoch 3 was lost with the process
    assert [r["epoch"] for r in read_history(out)] == [1, 2]
    _, history = train(
        small_world, "train", cfg, output=out, progress=False, checkpoint_every=2, resume=True
    )
    assert [r["epoch"] for r in history] == [1, 2, 3, 4, 5]
    assert _meta(out)["complete"] is True
    _assert_same_weights(plain, out)
    assert _rows(out) == _rows(plain)


def test_resume_starts_fresh_or_with_the_same_settings_only(small_world, tmp_path) -> None:
    out = str(tmp_path / "ckpt")
    _, history = train(
        small_world, "train", _cfg(epochs=2), output=out, progress=False, resume=True
    )
    assert [r["epoch"] for r in history] == [1, 2] and _meta(out)["complete"] is True
    with pytest.raises(CheckpointError) as err:
        train(small_world, "train", _cfg(epochs=3, lr=2e-3), output=out, resume=True)
    assert str(err.value) == (
        f"{out}: cannot resume with other settings: epochs 2 (checkpoint) vs 3 (now); lr 0.001 "
        "(checkpoint) vs 0.002 (now). Resume with the checkpoint's settings, or pass "
        "--overwrite to start over"
    )
    with pytest.raises(CheckpointError, match=r"split 'train' \(checkpoint\) vs 'val' \(now\)"):
        train(small_world, "val", _cfg(epochs=2), output=out, resume=True)
    with pytest.raises(ConfigError, match="exclude each other"):
        train(small_world, "train", _cfg(), output=out, resume=True, overwrite=True)


def _diverge_from_epoch(monkeypatch, epoch: int) -> None:
    """Every loss from epoch ``epoch`` (1-based) on is NaN."""
    from asymvlm.distributed import GlobalBatchLoss

    original = GlobalBatchLoss.forward

    def forward(self, image_emb, text_emb, e=0):
        loss = original(self, image_emb, text_emb, e)
        return loss * float("nan") if e + 1 >= epoch else loss

    monkeypatch.setattr(GlobalBatchLoss, "forward", forward)


def test_a_diverged_run_marks_nothing_complete(small_world, tmp_path, monkeypatch) -> None:
    out = str(tmp_path / "ckpt")
    _diverge_from_epoch(monkeypatch, 3)
    with pytest.raises(NonFiniteError) as err:
        train(small_world, "train", _cfg(), output=out, progress=False, checkpoint_every=1)
    message = str(err.value)
    assert message.startswith(
        "non-finite loss and gradient at epoch 3 of 4, step 1 of 7 "
        "(asymvlm-vmf, adamw lr 0.001): the run diverged"
    )
    assert message.endswith(f"; {out} keeps the last good checkpoint (epoch 2 of 4, incomplete)")
    meta = _meta(out)
    assert (meta["complete"], meta["epoch"]) == (False, 2)
    assert [r["epoch"] for r in read_history(out)] == [1, 2]
    with pytest.raises(CheckpointError, match="incomplete checkpoint"):
        load_checkpoint(out)

    fresh = str(tmp_path / "fresh")
    with pytest.raises(NonFiniteError, match=f"; no checkpoint was written to {fresh}$"):
        train(small_world, "train", _cfg(), output=fresh, progress=False)
    assert not os.path.exists(fresh)


# -- the command line ---------------------------------------------------------------------------
def _argv(world: str, out: str, *extra: str) -> list[str]:
    flags = "--method asymvlm-vmf --epochs 2 --lr 1e-3 --optimizer adamw --batch-size 128"
    flags += " --hidden-dim 16 --depth 2 --quiet"
    return ["train", "--embeddings", world, *flags.split(), "--output", out, *extra]


def test_cli_refuses_an_existing_checkpoint_in_one_line(small_world, tmp_path, capsys) -> None:
    out = str(tmp_path / "ckpt")
    assert main(_argv(small_world, out)) == 0
    capsys.readouterr()
    assert main(_argv(small_world, out)) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: {out} already holds a checkpoint; pass --resume to continue it or "
        "--overwrite to replace it\n"
    )
    assert main(_argv(small_world, out, "--resume")) == 0
    assert "already holds a complete checkpoint (epoch 2 of 2); nothing to do" in (
        capsys.readouterr().err
    )
    assert main(_argv(small_world, out, "--overwrite", "--seed", "3")) == 0
    assert _meta(out)["train_config"]["seed"] == 3


def test_cli_evaluate_refuses_an_incomplete_checkpoint(small_world, tmp_path, capsys) -> None:
    out = tmp_path / "ckpt"
    save_checkpoint(
        str(out), build_method("asymvlm-vmf", 16, hidden_dim=16, depth=2), _cfg(), 16, epoch=1
    )
    metrics = str(tmp_path / "m.json")
    args = ["evaluate", "--embeddings", small_world, "--checkpoint", str(out), "--quiet"]
    args += ["--output", metrics]
    assert main(args) == 2
    assert "incomplete checkpoint (epoch 1 of 4)" in capsys.readouterr().err
    assert not os.path.exists(metrics)
    assert main([*args, "--allow-incomplete"]) == 0 and os.path.exists(metrics)
