"""Adapters as Hub-style model folders: ``asymvlm export`` (safetensors, config.json, a model
card), loading them back (folders, ``hf-hub:`` names through a stand-in Hub on 127.0.0.1), and
the refusals (a pickle, a changed file)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from asymvlm.checkpoints import (
    export_adapter,
    load_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
)
from asymvlm.cli import main as cli_main
from asymvlm.errors import CheckpointError
from asymvlm.evaluation.retrieval import caption_scores, encode_split
from asymvlm.protocol import train
from asymvlm.scoring import Scorer, TableEncoder
from asymvlm.splits import load_split
from asymvlm.training import TrainConfig
from tests.conftest import small_world_config
from tests.hub_server import FakeHub, serve_hub

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CAPTIONS = ["a dog", "a golden retriever catching a red frisbee", "a photo"]


def _cfg(method: str, **kw) -> TrainConfig:
    base = dict(
        method=method,
        epochs=1,
        lr=1e-3,
        optimizer="adamw",
        batch_size=128,
        hidden_dim=16,
        depth=2,
        seed=0,
    )
    return TrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> str:
    """A small world with pre-projection features, so that every method trains on it."""
    from asymvlm.synthetic import write_world

    root = tmp_path_factory.mktemp("export-world") / "tables"
    return write_world(str(root), small_world_config(pre_dim=24))


@pytest.fixture(scope="module")
def vmf(world, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("vmf") / "ckpt")
    train(world, "train", _cfg("asymvlm-vmf", epochs=2), output=out, progress=False)
    return out


def _outputs(folder: str, world: str) -> dict[str, np.ndarray]:
    """kappa, uncertainty and the score matrix of the adapter in ``folder`` on the test split."""
    method, meta = load_checkpoint(folder)
    method.adapter_input = meta.get("adapter_input", "raw")
    data = load_split(world, "test", method.adapter_input)
    table = caption_scores(method, data)
    out = {}
    for name in ("kappa", "uncertainty"):
        column = table.column(name)
        if column.null_count < len(column):
            out[name] = np.asarray(column.to_pylist(), np.float64)
    with torch.no_grad():
        texts, images = encode_split(method, data)
        out["scores"] = method.score(texts, images).double().numpy()
    return out


# -- export -> load, every method ----------------------------------------------------------------
@pytest.mark.parametrize("name", ["asymvlm-ps", "bayesvlm", "elip"])  # fitted buffers too
def test_export_then_load_gives_the_checkpoints_numbers(name, world, tmp_path) -> None:
    checkpoint, exported = str(tmp_path / "ckpt"), str(tmp_path / "exported")
    train(world, "train", _cfg(name), output=checkpoint, progress=False)
    method, _ = load_checkpoint(checkpoint)
    if not method.state_dict():
        pytest.skip(f"{name} has no weights (the frozen model)")
    export_adapter(checkpoint, exported)
    assert sorted(os.listdir(exported)) == ["README.md", "config.json", "model.safetensors"]
    before, after = _outputs(checkpoint, world), _outputs(exported, world)
    assert before.keys() == after.keys() and "scores" in before
    for key in before:
        np.testing.assert_allclose(after[key], before[key], rtol=1e-6, atol=0, err_msg=key)
    weights, saved = load_file(os.path.join(exported, "model.safetensors")), method.state_dict()
    assert weights.keys() == saved.keys()
    assert all(torch.equal(weights[k], saved[k].cpu()) for k in saved)


# -- the folder ---------------------------------------------------------------------------------
def test_the_folder_has_the_hub_layout_and_a_card(vmf, tmp_path) -> None:
    from huggingface_hub import ModelCard

    out = tmp_path / "exported"
    config = export_adapter(vmf, str(out), repo="someone/asymvlm-vmf-demo")
    on_disk = json.loads((out / "config.json").read_text())
    assert on_disk == config
    import hashlib

    digest = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    assert config["sha256"] == {"model.safetensors": digest}
    assert config["format"] == "asymvlm-adapter" and config["protocol"] == "improved"
    assert (config["method"], config["dim"], config["adapter_input"]) == ("asymvlm-vmf", 16, "raw")
    scale = float(load_file(os.path.join(vmf, "model.safetensors"))["text_adapter.input_scale"])
    assert config["input_calibration"] == {"text_adapter.input_scale": pytest.approx(scale)}
    assert config["embeddings"] == "tables"  # no path of this machine in a published folder
    card = ModelCard((out / "README.md").read_text())
    assert card.data.library_name == "asymvlm" and card.data.license == "apache-2.0"
    assert "asymvlm-vmf" in card.data.tags and "base_model" not in card.data.to_dict()
    text = card.text
    for heading in (
        "## Method",
        "## Training data and protocol",
        "## Evaluation",
        "## How to use",
        "## Intended use",
        "## Limits",
    ):
        assert heading in text
    assert "1/kappa" in text and "hf-hub:someone/asymvlm-vmf-demo" in text
    assert "synthetic world" in text  # its limits say what the adapter is for


def test_the_card_of_an_mlflow_run_holds_its_numbers(vmf, tmp_path) -> None:
    from asymvlm import tracking
    from asymvlm.scoring.models import log_adapter_models

    uri = tracking.default_tracking_uri(str(tmp_path))
    run = tracking.open_run(uri, "export", "trial", kind="trial")
    run.log_metrics(
        {
            "t2i_recall_at_1": 0.5,
            "t2i_aupr": 0.25,
            "val_i2t_spearman": -0.75,
            "rsum": 321.0,
            "train_loss": 1.5,
        }
    )
    log_adapter_models(run, vmf)
    run.end()
    out = tmp_path / "exported"
    config = export_adapter(f"runs:/{run.id}/adapter", str(out), tracking_uri=uri)
    assert config["source"]["mlflow_run_id"] == run.id
    assert config["source"]["experiment"] == "export"
    assert config["metrics"]["t2i_recall_at_1"] == 0.5
    card = (out / "README.md").read_text()
    assert "| metric | t2i (test) | i2t (validation) |" in card
    assert "| recall_at_1 | 0.5000 | – |" in card and "| spearman | – | -0.7500 |" in card
    assert "| aupr | 0.2500 | – |" in card
    assert "RSUM (both directions, %): 321.00 (test)." in card
    assert "* `aupr`: AUPR: average precision" in card and "train_loss" not in card
    assert f"MLflow run `{run.id}` (experiment `export`)" in card


def test_an_export_replaces_only_an_earlier_export(vmf, tmp_path) -> None:
    out = tmp_path / "exported"
    export_adapter(vmf, str(out))
    with pytest.raises(CheckpointError, match="already holds an exported model; pass --overwrite"):
        export_adapter(vmf, str(out))
    export_adapter(vmf, str(out), overwrite=True)
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("keep me")
    with pytest.raises(CheckpointError, match="files that are not an exported model"):
        export_adapter(vmf, str(other), overwrite=True)
    assert (other / "todo.txt").read_text() == "keep me"
    with pytest.raises(CheckpointError, match="the checkpoint's own folder"):
        export_adapter(vmf, vmf, overwrite=True)


# -- refusals -----------------------------------------------------------------------------------
def test_a_folder_with_a_pickle_or_a_changed_file_is_refused_by_name(vmf, world, tmp_path) -> None:
    out = tmp_path / "exported"
    export_adapter(vmf, str(out))
    (out / "extra.bin").write_bytes(b"\x80\x04K\x01.")  # a pickle beside the weights
    for load in (load_checkpoint, lambda f: resolve_checkpoint(f, pretrained=True)):
        with pytest.raises(CheckpointError, match=r"holds extra\.bin, a pickle"):
            load(str(out))
    os.remove(out / "extra.bin")
    weights = load_file(out / "model.safetensors")
    weights["text_adapter.input_scale"] = weights["text_adapter.input_scale"] * 2
    save_file(weights, out / "model.safetensors")  # a valid file, other numbers
    with pytest.raises(
        CheckpointError,
        match=r"model\.safetensors: its SHA-256 differs from the "
        "one config.json records",
    ):
        Scorer.from_pretrained(str(out), encoder=TableEncoder(world))
    # A training checkpoint is no model folder: its optimiser state is a pickle.
    with pytest.raises(CheckpointError, match=r"holds trainer\.pt, a pickle"):
        resolve_checkpoint(vmf, pretrained=True)


# -- hf-hub: names --------------------------------------------------------------------------------
@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A Hub on 127.0.0.1 and an empty Hugging Face cache."""
    from huggingface_hub import constants

    with serve_hub(FakeHub()) as hub:
        monkeypatch.setattr(constants, "ENDPOINT", hub.url)
        monkeypatch.setattr(
            constants,
            "HUGGINGFACE_CO_URL_TEMPLATE",
            hub.url + "/{repo_id}/resolve/{revision}/{filename}",
        )
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        yield hub


def test_hub_names_resolve_with_revisions_cache_and_offline_mode(
    vmf, world, hub, tmp_path, monkeypatch
) -> None:
    from huggingface_hub import constants

    first = tmp_path / "v1"
    export_adapter(vmf, str(first))
    commit = hub.add("someone/adapter", str(first), branch="v1")
    second = tmp_path / "v2"
    other = str(tmp_path / "ckpt2")
    train(world, "train", _cfg("asymvlm-vmf", epochs=1, seed=1), output=other, progress=False)
    export_adapter(other, str(second))
    hub.add("someone/adapter", str(second), branch="main")
    encoder = TableEncoder(world, ["test"])
    captions = encoder.captions()[:12]

    def kappa(source: str, **kw) -> np.ndarray:
        return (
            Scorer.from_checkpoint(source, encoder=encoder, **kw)
            .caption_uncertainty(captions)
            .kappa
        )

    np.testing.assert_allclose(kappa("hf-hub:someone/adapter@v1"), kappa(vmf), rtol=1e-6)
    np.testing.assert_allclose(kappa(f"hf-hub:someone/adapter@{commit}"), kappa(vmf), rtol=1e-6)
    np.testing.assert_allclose(kappa("hf-hub:someone/adapter"), kappa(other), rtol=1e-6)
    assert not np.allclose(kappa(vmf), kappa(other))
    scorer = Scorer.from_pretrained("hf-hub:someone/adapter@v1", encoder=encoder)
    np.testing.assert_allclose(scorer.caption_uncertainty(captions).kappa, kappa(vmf), rtol=1e-6)
    # offline: the cache answers for what was downloaded, and says what it lacks
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    served = len(hub.requests)
    np.testing.assert_allclose(kappa(f"hf-hub:someone/adapter@{commit}"), kappa(vmf), rtol=1e-6)
    assert len(hub.requests) == served
    with pytest.raises(
        CheckpointError,
        match=r"hf-hub:someone/other: cannot download the "
        r"model: not in the Hugging Face cache",
    ):
        resolve_checkpoint("hf-hub:someone/other")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(CheckpointError, match="no such repository"):
        resolve_checkpoint("hf-hub:someone/other")
    with pytest.raises(CheckpointError, match="has no revision 'v9'"):
        resolve_checkpoint("hf-hub:someone/adapter@v9")
    with pytest.raises(CheckpointError, match="not a Hub model name"):
        resolve_checkpoint("hf-hub:no-slash")


def test_a_hub_repository_with_a_pickle_or_a_changed_file_is_refused(vmf, hub, tmp_path) -> None:
    folder = tmp_path / "exported"
    export_adapter(vmf, str(folder))
    pickled = tmp_path / "pickled"
    shutil.copytree(folder, pickled)
    torch.save({"x": torch.ones(1)}, pickled / "pytorch_model.bin")
    hub.add("someone/pickled", str(pickled))
    with pytest.raises(
        CheckpointError,
        match=r"^hf-hub:someone/pickled: holds "
        r"pytorch_model\.bin, a pickle",
    ):
        resolve_checkpoint("hf-hub:someone/pickled")
    changed = tmp_path / "changed"
    shutil.copytree(folder, changed)
    weights = load_file(changed / "model.safetensors")
    weights = {k: v + 1e-3 if v.is_floating_point() else v for k, v in weights.items()}
    save_file(weights, changed / "model.safetensors")
    hub.add("someone/changed", str(changed))
    with pytest.raises(
        CheckpointError,
        match=r"^hf-hub:someone/changed: .*model\.safetensors: "
        r"its SHA-256 differs",
    ):
        Scorer.from_pretrained("hf-hub:someone/changed")


# -- the command line: export, then score-text from the folder and from the Hub -----------------
@pytest.fixture(scope="module")
def text_adapter(tmp_path_factory) -> dict[str, str]:
    """An AsymVLM adapter whose checkpoint names a (tiny, random) CLIP as its encoder."""
    from asymvlm.data.encoder import files_sha256
    from asymvlm.data.tiny import save_tiny_clip
    from asymvlm.synthetic import write_world

    base = tmp_path_factory.mktemp("text-adapter")
    model = save_tiny_clip(str(base / "tiny-clip"))
    world = write_world(str(base / "world"), small_world_config(dim=24))
    cfg = _cfg("asymvlm-vmf", epochs=2)
    trained, _ = train(world, "train", cfg, progress=False)
    checkpoint = str(base / "ckpt")
    encoder = {
        "model": model,
        "revision": None,
        "family": "clip",
        "files_sha256": files_sha256(model),
        "dim": 24,
    }
    save_checkpoint(checkpoint, trained, cfg, 24, {"embedding_model": model, "encoder": encoder})
    return {"checkpoint": checkpoint, "base": str(base)}


def _score_text(capsys, source: str) -> list[dict]:
    capsys.readouterr()
    assert cli_main(["score-text", "--checkpoint", source, "--device", "cpu", *CAPTIONS]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


@pytest.mark.slow
def test_export_then_score_text_from_the_folder_and_the_hub(text_adapter, hub, capsys) -> None:
    folder = os.path.join(text_adapter["base"], "exported")
    assert (
        cli_main(
            [
                "export",
                "--checkpoint",
                text_adapter["checkpoint"],
                "--output",
                folder,
                "--repo",
                "someone/tiny-adapter",
            ]
        )
        == 0
    )
    assert not [f for f in os.listdir(folder) if f.endswith((".pt", ".bin", ".pkl"))]
    hub.add("someone/tiny-adapter", folder)
    expected = _score_text(capsys, text_adapter["checkpoint"])
    assert [r["text"] for r in expected] == CAPTIONS and all(r["kappa"] > 0 for r in expected)
    assert _score_text(capsys, folder) == expected
    assert _score_text(capsys, "hf-hub:someone/tiny-adapter") == expected
    # the same from a process of its own, the Hub named by HF_ENDPOINT
    env = {
        **os.environ,
        "HF_ENDPOINT": hub.url,
        "HF_HUB_CACHE": os.path.join(text_adapter["base"], "cache2"),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "asymvlm.cli",
            "score-text",
            "--checkpoint",
            "hf-hub:someone/tiny-adapter",
            "--device",
            "cpu",
            *CAPTIONS,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line) for line in proc.stdout.splitlines()] == expected
    # a Hub name that cannot be had: one line, exit 2
    capsys.readouterr()
    assert cli_main(["score-text", "--checkpoint", "hf-hub:someone/missing", "a dog"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "hf-hub:someone/missing: cannot download the model" in err[0]


def test_evaluate_takes_model_folders_and_hub_names(vmf, world, hub, tmp_path, capsys) -> None:
    folder = tmp_path / "exported"
    export_adapter(vmf, str(folder))
    hub.add("someone/vmf", str(folder))
    results = []
    for source in (vmf, str(folder), "hf-hub:someone/vmf"):
        out = tmp_path / f"m{len(results)}.json"
        assert (
            cli_main(
                [
                    "evaluate",
                    "--embeddings",
                    world,
                    "--split",
                    "test",
                    "--checkpoint",
                    source,
                    "--quiet",
                    "--output",
                    str(out),
                ]
            )
            == 0
        )
        result = json.loads(out.read_text())
        results.append({d: result[d] for d in ("t2i", "i2t")})
    assert results[0] == results[1] == results[2]
    assert results[0]["t2i"]["aupr"] is not None
