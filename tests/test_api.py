"""The public Python API end to end on a small synthetic world, equal to the CLI."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import torch

import asymvlm
from asymvlm.cli import main
from asymvlm.errors import ConfigError
from asymvlm.evaluation.registry import evaluate_split
from asymvlm.splits import load_split


def test_train_evaluate_load_and_score_in_process(small_world, tmp_path) -> None:
    out = str(tmp_path / "ckpt")
    cfg = {"method": "asymvlm-vmf", "epochs": 3, "hidden_dim": 16, "batch_size": 128}
    method, history = asymvlm.train(small_world, "train", cfg, output=out, progress=False)
    assert [row["epoch"] for row in history] == [1, 2, 3]
    result = asymvlm.evaluate(out, small_world, "test", device="cpu", levels=5)
    assert result["split"] == "test" and len(result["t2i"]["binned_recall@1"]) == 5
    direct = evaluate_split("retrieval", method, load_split(small_world, "test"))
    assert result["t2i"]["recall@1"] == direct["t2i"]["recall@1"] > 1 / 60  # above chance

    loaded, meta = asymvlm.load_checkpoint(out, "cpu")
    assert meta["train_config"]["method"] == "asymvlm-vmf" and not loaded.training
    for a, b in zip(method.state_dict().values(), loaded.state_dict().values(), strict=True):
        torch.testing.assert_close(a.cpu(), b)

    scores = asymvlm.score(out, small_world, "test", device="cpu")
    assert scores.num_rows == 180 and scores.column("uncertainty").null_count == 0
    with pytest.raises(ConfigError, match="asymvlm.train.*epochs"):
        asymvlm.train(small_world, "train", {"method": "asymvlm-vmf", "epochs": 0})


def test_the_cli_gives_what_the_api_gives(small_world, tmp_path) -> None:
    flags = "--method asymvlm-vmf --epochs 2 --hidden-dim 16 --batch-size 128 --quiet"
    cli, api = str(tmp_path / "cli"), str(tmp_path / "api")
    assert main(["train", "--embeddings", small_world, *flags.split(), "--output", cli]) == 0
    cfg = {"method": "asymvlm-vmf", "epochs": 2, "hidden_dim": 16, "batch_size": 128}
    asymvlm.train(small_world, "train", cfg, output=api, progress=False)

    metrics, scores = tmp_path / "m.json", str(tmp_path / "s.parquet")
    where = ["--embeddings", small_world, "--checkpoint", cli, "--device", "cpu", "--quiet"]
    assert main(["evaluate", *where, "--output", str(metrics)]) == 0
    assert main(["score", *where, "--output", scores]) == 0
    result = asymvlm.evaluate(api, small_world, device="cpu")
    assert json.loads(metrics.read_text())["t2i"] == json.loads(json.dumps(result["t2i"]))
    expected = asymvlm.score(api, small_world, device="cpu")
    assert pq.read_table(scores).equals(expected)
