"""Adapters as Hub-style model folders: ``asymvlm export`` (safetensors, config.json, a model
card), loading them back (folders, ``hf-hub:`` names through a stand-in Hub on 127.0.0.1), the
refusal of a folder holding a pickle, and the adapter as an MLflow model (embeddings in)."""

from __future__ import annotations

import json
import math
import os
import shutil
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from asymvlm.checkpoints import export_adapter, load_checkpoint, resolve_checkpoint, save_checkpoint
from asymvlm.cli import main as cli_main
from asymvlm.errors import CheckpointError
from asymvlm.protocol import train
from asymvlm.scoring import Scorer, TableEncoder
from asymvlm.scoring.models import CaptionUncertaintyModel
from asymvlm.training import TrainConfig
from tests.conftest import small_world_config
from tests.hub_server import serve_hub

CAPTIONS = ["a dog", "a golden retriever catching a red frisbee", "a photo"]


def _cfg(method: str, **kw) -> TrainConfig:
    base = dict(method=method, epochs=1, lr=1e-3, optimizer="adamw", batch_size=128)
    return TrainConfig(**{**base, "hidden_dim": 16, "depth": 2, "seed": 0, **kw})


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


# -- export -> load, every method ----------------------------------------------------------------
@pytest.mark.parametrize("name", ["asymvlm-ps", "elip"])  # fitted buffers too
def test_export_then_load_gives_the_checkpoints_numbers(name, world, tmp_path) -> None:
    checkpoint, exported = str(tmp_path / "ckpt"), str(tmp_path / "exported")
    train(world, "train", _cfg(name), output=checkpoint, progress=False)
    method, _ = load_checkpoint(checkpoint)
    export_adapter(checkpoint, exported)
    assert sorted(os.listdir(exported)) == ["README.md", "config.json", "model.safetensors"]
    loaded, _ = load_checkpoint(exported)
    weights, saved = loaded.state_dict(), method.state_dict()
    assert weights.keys() == saved.keys() and all(torch.equal(weights[k], saved[k]) for k in saved)


# -- the folder ---------------------------------------------------------------------------------
def test_the_folder_has_the_hub_layout_and_a_card(vmf, tmp_path) -> None:
    from huggingface_hub import ModelCard

    out = tmp_path / "exported"
    config = export_adapter(vmf, str(out), repo="someone/asymvlm-vmf-demo")
    on_disk = json.loads((out / "config.json").read_text())
    assert on_disk == config
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
    assert "| t2i_recall_at_1 | test | 0.5000 |" in card and "| rsum | test | 321.0000 |" in card
    assert "| val_i2t_spearman | validation | -0.7500 |" in card
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
def test_a_folder_with_a_pickle_is_refused_by_name(vmf, tmp_path) -> None:
    out = tmp_path / "exported"
    export_adapter(vmf, str(out))
    (out / "extra.bin").write_bytes(b"\x80\x04K\x01.")  # a pickle beside the weights
    for load in (load_checkpoint, lambda f: resolve_checkpoint(f, pretrained=True)):
        with pytest.raises(CheckpointError, match=r"holds extra\.bin, a pickle"):
            load(str(out))
    # A training checkpoint is no model folder: its optimiser state is a pickle.
    with pytest.raises(CheckpointError, match=r"holds trainer\.pt, a pickle"):
        resolve_checkpoint(vmf, pretrained=True)


# -- hf-hub: names --------------------------------------------------------------------------------
@pytest.fixture
def hub(hub_cache, monkeypatch):
    """A Hub on 127.0.0.1 and an empty Hugging Face cache."""
    from huggingface_hub import constants

    with serve_hub() as hub:
        monkeypatch.setattr(constants, "ENDPOINT", hub.url)
        template = hub.url + "/{repo_id}/resolve/{revision}/{filename}"
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
        yield hub


def test_hub_names_resolve_with_revisions_cache_and_offline_mode(
    vmf, world, hub, tmp_path, monkeypatch
) -> None:
    from huggingface_hub import constants

    first, second, other = tmp_path / "v1", tmp_path / "v2", str(tmp_path / "ckpt2")
    export_adapter(vmf, str(first))
    commit = hub.add("someone/adapter", str(first), branch="v1")
    train(world, "train", _cfg("asymvlm-vmf", seed=1), output=other, progress=False)
    export_adapter(other, str(second))
    hub.add("someone/adapter", str(second), branch="main")
    encoder = TableEncoder(world, ["test"])
    captions = encoder.captions()[:12]

    def kappa(source: str, load=Scorer.from_checkpoint) -> np.ndarray:
        return load(source, encoder=encoder).caption_uncertainty(captions).kappa

    want = kappa(vmf)
    np.testing.assert_allclose(kappa("hf-hub:someone/adapter@v1"), want, rtol=1e-6)
    np.testing.assert_allclose(kappa(f"hf-hub:someone/adapter@{commit}"), want, rtol=1e-6)
    np.testing.assert_allclose(kappa("hf-hub:someone/adapter"), kappa(other), rtol=1e-6)
    assert not np.allclose(want, kappa(other))
    np.testing.assert_allclose(kappa("hf-hub:someone/adapter@v1", Scorer.from_pretrained), want)
    # a repository holding a pickle is refused by name
    shutil.copytree(first, tmp_path / "pickled")
    torch.save({"x": torch.ones(1)}, tmp_path / "pickled" / "pytorch_model.bin")
    hub.add("someone/pickled", str(tmp_path / "pickled"))
    with pytest.raises(CheckpointError, match=r"^hf-hub:someone/pickled: holds pytorch_model\.bin"):
        resolve_checkpoint("hf-hub:someone/pickled")
    with pytest.raises(CheckpointError, match="no such repository"):
        resolve_checkpoint("hf-hub:someone/other")
    with pytest.raises(CheckpointError, match="has no revision 'v9'"):
        resolve_checkpoint("hf-hub:someone/adapter@v9")
    with pytest.raises(CheckpointError, match="not a Hub model name"):
        resolve_checkpoint("hf-hub:no-slash")
    # offline: the cache answers for what was downloaded, and says what it lacks
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    served = len(hub.requests)
    np.testing.assert_allclose(kappa(f"hf-hub:someone/adapter@{commit}"), want, rtol=1e-6)
    assert len(hub.requests) == served
    with pytest.raises(CheckpointError, match=r"someone/other: cannot download the model: not in"):
        resolve_checkpoint("hf-hub:someone/other")


def test_evaluate_takes_model_folders_and_hub_names(vmf, world, hub, tmp_path) -> None:
    folder = tmp_path / "exported"
    export_adapter(vmf, str(folder))
    hub.add("someone/vmf", str(folder))
    results = []
    for source in (vmf, str(folder), "hf-hub:someone/vmf"):
        out = tmp_path / f"m{len(results)}.json"
        args = ["evaluate", "--embeddings", world, "--split", "test", "--checkpoint", source]
        assert cli_main([*args, "--quiet", "--output", str(out)]) == 0
        result = json.loads(out.read_text())
        results.append({d: result[d] for d in ("t2i", "i2t")})
    assert results[0] == results[1] == results[2]
    assert results[0]["t2i"]["aupr"] is not None


@pytest.mark.slow
def test_export_then_score_text_from_the_folder_and_the_hub(hub, tmp_path, capsys) -> None:
    """An adapter whose checkpoint names a (tiny, random) CLIP: the same numbers from its
    checkpoint, its exported folder and its Hub repository; a missing one in one line."""
    from asymvlm.data.encoder import files_sha256
    from asymvlm.data.tiny import save_tiny_clip
    from asymvlm.synthetic import write_world

    model = save_tiny_clip(str(tmp_path / "tiny-clip"))
    world = write_world(str(tmp_path / "world"), small_world_config(dim=24))
    cfg = _cfg("asymvlm-vmf", epochs=2)
    trained, _ = train(world, "train", cfg, progress=False)
    checkpoint, folder = str(tmp_path / "ckpt"), str(tmp_path / "exported")
    encoder = {"model": model, "revision": None, "family": "clip", "dim": 24}
    extra = {"embedding_model": model, "encoder": {**encoder, "files_sha256": files_sha256(model)}}
    save_checkpoint(checkpoint, trained, cfg, 24, extra)
    args = ["export", "--checkpoint", checkpoint, "--output", folder, "--repo", "someone/tiny"]
    assert cli_main(args) == 0
    hub.add("someone/tiny", folder)

    def score_text(source: str) -> list[dict]:
        capsys.readouterr()
        assert cli_main(["score-text", "--checkpoint", source, "--device", "cpu", *CAPTIONS]) == 0
        return [json.loads(line) for line in capsys.readouterr().out.splitlines()]

    expected = score_text(checkpoint)
    assert [r["text"] for r in expected] == CAPTIONS and all(r["kappa"] > 0 for r in expected)
    assert score_text(folder) == expected == score_text("hf-hub:someone/tiny")
    capsys.readouterr()
    assert cli_main(["score-text", "--checkpoint", "hf-hub:someone/missing", "a dog"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "hf-hub:someone/missing: cannot download the model" in err[0]


# -- the adapter as an MLflow model: embeddings in ----------------------------------------------
UNIT = [1.0] + [0.0] * 15  # the world's dim is 16


def _adapter(folder: str) -> CaptionUncertaintyModel:
    model = CaptionUncertaintyModel()
    model.load_context(SimpleNamespace(artifacts={"checkpoint": folder}))
    return model


@pytest.mark.parametrize(
    ("embedding", "norm", "message"),
    [
        (UNIT[:8], 8.0, "row 1: 'embedding' must be 16 finite numbers"),
        ([math.inf, *UNIT[1:]], 8.0, "row 1: 'embedding' must be 16 finite numbers"),
        (["a"] * 16, 8.0, "row 1: 'embedding' must be 16 finite numbers"),
        (UNIT, -1.0, "row 1: 'norm' must be a positive finite number, not -1.0"),
        (UNIT, "big", "row 1: 'norm' must be a positive finite number, not 'big'"),
    ],
)
def test_a_bad_row_is_an_invalid_parameter_naming_it(vmf, embedding, norm, message) -> None:
    from mlflow.exceptions import MlflowException

    frame = pd.DataFrame({"embedding": [UNIT, embedding], "norm": [8.0, norm]})
    with pytest.raises(MlflowException) as err:
        _adapter(vmf).predict(None, frame)
    assert err.value.error_code == "INVALID_PARAMETER_VALUE" and err.value.message == message
    assert err.value.get_http_status_code() == 400


def test_the_embedding_model_answers_finite_numbers_or_null(vmf, world, tmp_path) -> None:
    from mlflow.exceptions import MlflowException

    model = _adapter(vmf)
    rows = model.predict(None, pd.DataFrame({"embedding": [UNIT, UNIT[::-1]], "norm": [8.0, 7.5]}))
    assert (rows["kappa"] > 0).all() and np.isfinite(rows["kappa"]).all()
    np.testing.assert_allclose(rows["uncertainty"], 1.0 / rows["kappa"], rtol=1e-5)
    for frame, message in (
        (pd.DataFrame({"embedding": [UNIT]}), "input needs a 'norm' column"),
        (pd.DataFrame({"text": ["a dog"]}), "input needs a 'embedding' column"),
        (pd.DataFrame({"embedding": [], "norm": []}), "input has no rows"),
    ):
        with pytest.raises(MlflowException, match=message):
            model.predict(None, frame)
    clip = str(tmp_path / "clip")  # a method without kappa: null, not NaN
    train(world, "train", TrainConfig(method="clip"), output=clip, progress=False)
    result = _adapter(clip).predict(None, pd.DataFrame({"embedding": [UNIT], "norm": [8.0]}))
    assert result.to_dict("records") == [{"uncertainty": None, "kappa": None}]
