"""Checkpoint folders: written as a whole, refused when unsafe, resumed bit for bit."""

from __future__ import annotations

import json
import os
import shutil
from importlib.metadata import version
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

import asymvlm.checkpoints as ck
from asymvlm import tables
from asymvlm.cli import main
from asymvlm.errors import CheckpointError, ConfigError, NonFiniteError
from asymvlm.runner import train
from asymvlm.tables import read_split
from asymvlm.tracking import git_commit
from asymvlm.training import TrainConfig, Trainer
from tests.helpers import nan_losses_from, save_adapter


def _cfg(**kw) -> TrainConfig:
    base = dict(method="asymvlm-vmf", epochs=4, lr=1e-3, optimizer="adamw", batch_size=128)
    return TrainConfig(**{**base, "hidden_dim": 16, "depth": 2, "seed": 0, **kw})


def _meta(folder) -> dict:
    return ck.read_checkpoint_meta(str(folder)) or {}


def test_a_killed_write_leaves_or_recovers_the_old_checkpoint(tmp_path) -> None:
    folder = tmp_path / "ckpt"
    save_adapter(folder)
    before = {name: (folder / name).read_bytes() for name in os.listdir(folder)}

    def dies_halfway(staging: str) -> None:
        Path(staging, "model.safetensors").write_bytes(b"half a file")
        raise KeyboardInterrupt  # as a kill would, mid-write

    with pytest.raises(KeyboardInterrupt):
        ck.publish_folder(str(folder), dies_halfway)
    assert {name: (folder / name).read_bytes() for name in os.listdir(folder)} == before
    # killed after the old folder went aside and before the new one took its place:
    os.rename(folder, tmp_path / ".ckpt.old")
    os.mkdir(tmp_path / ".ckpt.writing")
    ck.recover_checkpoint(str(folder))
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]
    assert ck.load_checkpoint(str(folder))[1]["method"] == "symvlm"


def test_unloadable_checkpoints_are_named(tmp_path) -> None:
    folder = tmp_path / "ckpt"
    save_adapter(folder, epoch=2)
    assert (_meta(folder)["complete"], _meta(folder)["epochs"]) == (False, 4)
    with pytest.raises(CheckpointError, match=r"incomplete checkpoint \(epoch 2 of 4\)"):
        ck.load_checkpoint(str(folder))
    assert ck.load_checkpoint(str(folder), allow_incomplete=True)[0].name == "symvlm"
    meta = {**_meta(folder), "method": "determ-ft", "complete": True}  # another run's config
    (folder / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError) as err:
        ck.load_checkpoint(str(folder))
    assert str(err.value).startswith(
        f"{folder}: model.safetensors does not match config.json, which names method "
        "'determ-ft' (dim 8): "
    )
    assert "key(s) in state_dict" in str(err.value)  # what does not fit, named by torch
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="model.safetensors: unreadable"):
        ck.load_checkpoint(str(folder))


def test_unusable_outputs_are_refused(small_world, tmp_path, monkeypatch) -> None:
    a_file, busy, locked = tmp_path / "file", tmp_path / "busy", tmp_path / "locked"
    a_file.write_text("x")
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, m: str(p) != str(locked) and real_access(p, m))
    monkeypatch.chdir(busy.parent)
    for output, message in [
        (a_file, f"{a_file} is a file, not a folder"),
        (a_file / "ckpt", f"{a_file} is a file, not a folder"),
        (busy, r"not part of a checkpoint \(notes.txt\)"),
        (".", r"^\. is the current folder"),
        (locked / "ckpt", f"\\({locked} is read-only"),
    ]:
        with pytest.raises(CheckpointError, match=message):
            train(small_world, "train", _cfg(), output=str(output))
    assert (busy / "notes.txt").read_text() == "mine"


def test_resume_ends_bit_for_bit_where_an_uninterrupted_run_ends(
    small_world, tmp_path, monkeypatch, one_thread
) -> None:
    cfg, plain, out = _cfg(epochs=5), str(tmp_path / "plain"), str(tmp_path / "resumed")
    _, history = train(small_world, "train", cfg, output=plain, progress=False)
    files = ["config.json", "history.jsonl", "model.safetensors", "trainer.pt"]
    assert sorted(os.listdir(plain)) == files and os.listdir(tmp_path) == ["plain"]
    meta = _meta(plain)
    assert (meta["complete"], meta["epoch"], meta["split"]) == (True, 5, "train")
    assert meta["train_config"]["lr"] == 1e-3 and meta["embeddings"] == os.path.abspath(small_world)
    versions = (meta["asymvlm_version"], meta["torch_version"])
    assert versions == (version("asymvlm"), torch.__version__)
    assert meta.get("git_commit", "unknown") == git_commit()
    split = read_split(small_world, "train")
    fingerprint = tables.fingerprint(
        small_world, "train", split.manifest, split.n_images, split.n_texts
    )
    assert meta["tables_fingerprint"] == split.fingerprint == fingerprint
    assert [r["epoch"] for r in ck.read_history(plain)] == [r["epoch"] for r in history]
    original = Trainer.train_epoch

    class Killed(Exception):
        pass

    def killed_before_epoch_4(self):
        if self.epoch == 3:
            raise Killed
        return original(self)

    with monkeypatch.context() as patch:
        patch.setattr(Trainer, "train_epoch", killed_before_epoch_4)
        with pytest.raises(Killed):
            train(small_world, "train", cfg, output=out, progress=False, checkpoint_every=2)
    assert (_meta(out)["complete"], _meta(out)["epoch"]) == (False, 2)  # epoch 3 was lost
    assert [r["epoch"] for r in ck.read_history(out)] == [1, 2]
    kw = dict(output=out, progress=False, checkpoint_every=2)
    _, history = train(small_world, "train", cfg, resume=True, **kw)
    assert [r["epoch"] for r in history] == [1, 2, 3, 4, 5] and _meta(out)["complete"]
    want, got = (load_file(os.path.join(f, "model.safetensors")) for f in (plain, out))
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    rows = [[r | {"epoch_seconds": 0} for r in ck.read_history(f)] for f in (plain, out)]
    assert rows[0] == rows[1]


def test_the_fingerprint_changes_with_the_tables_not_their_place(small_world, tmp_path) -> None:
    root, out = tmp_path / "moved", str(tmp_path / "ckpt")
    shutil.copytree(small_world, root)
    first = read_split(str(root), "train")
    assert first.fingerprint == read_split(small_world, "train").fingerprint
    assert first.fingerprint != read_split(str(root), "val").fingerprint
    train(str(root), "train", _cfg(epochs=1), output=out, progress=False)
    (Path(out) / "config.json").write_text(json.dumps(_meta(out) | {"complete": False}))
    part = next((root / "train" / "texts").glob("*.parquet"))
    table = pq.read_table(part)
    pq.write_table(table.slice(0, table.num_rows - 1), part)
    assert read_split(str(root), "train").fingerprint not in (None, first.fingerprint)
    with pytest.raises(CheckpointError, match=r"train changed since the checkpoint \(its tables'"):
        train(str(root), "train", _cfg(epochs=1), output=out, resume=True)


def test_resume_starts_fresh_or_with_the_same_settings_only(small_world, tmp_path) -> None:
    out = str(tmp_path / "ckpt")
    _, history = train(small_world, "train", _cfg(epochs=2), output=out, resume=True)
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


def test_a_diverged_run_marks_nothing_complete(small_world, tmp_path, monkeypatch) -> None:
    out, fresh = str(tmp_path / "ckpt"), str(tmp_path / "new")
    nan_losses_from(monkeypatch, epoch=2)  # from epoch 3 on
    with pytest.raises(NonFiniteError) as err:
        train(small_world, "train", _cfg(), output=out, progress=False, checkpoint_every=1)
    assert str(err.value).startswith(
        "non-finite loss and gradient at epoch 3 of 4, step 1 of 7 "
        "(asymvlm-vmf, adamw lr 0.001): the run diverged"
    )
    assert str(err.value).endswith(
        f"{out} keeps the last good checkpoint (epoch 2 of 4, incomplete)"
    )
    assert (_meta(out)["complete"], _meta(out)["epoch"]) == (False, 2)
    assert [r["epoch"] for r in ck.read_history(out)] == [1, 2]
    with pytest.raises(NonFiniteError, match=f"; no checkpoint was written to {fresh}$"):
        train(small_world, "train", _cfg(), output=fresh, progress=False)
    assert not os.path.exists(fresh)


def test_the_cli_refuses_existing_and_incomplete_checkpoints(small_world, tmp_path, capsys) -> None:
    out = str(tmp_path / "ckpt")
    flags = f"--method asymvlm-vmf --epochs 2 --hidden-dim 16 --output {out} --quiet".split()
    argv = ["train", "--embeddings", small_world, *flags]
    assert main(argv) == 0
    capsys.readouterr()
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"error: {out} already holds a checkpoint; pass --resume to continue it or "
        "--overwrite to replace it\n"
    )
    assert main([*argv, "--resume"]) == 0
    err = capsys.readouterr().err
    assert "already holds a complete checkpoint (epoch 2 of 2); nothing to do" in err
    assert main([*argv, "--overwrite", "--seed", "3"]) == 0
    assert _meta(out)["train_config"]["seed"] == 3
    save_adapter(out, "asymvlm-vmf", dim=16, epoch=1)
    metrics = str(tmp_path / "m.json")
    args = ["evaluate", "--embeddings", small_world, "--checkpoint", out, "--output", metrics]
    args.append("--quiet")
    assert main(args) == 2
    assert "incomplete checkpoint (epoch 1 of 4)" in capsys.readouterr().err
    assert not os.path.exists(metrics)
    assert main([*args, "--allow-incomplete"]) == 0 and os.path.exists(metrics)
