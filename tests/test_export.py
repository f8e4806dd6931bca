"""Adapters as Hub-style model folders: ``asymvlm export``, loading back, ``hf-hub:``, MLflow."""

from __future__ import annotations

import json
import math
import os
import shutil
from importlib.metadata import version

import numpy as np
import pandas as pd
import pytest
import torch
from mlflow.exceptions import MlflowException
from safetensors.torch import load_file

from asymvlm.checkpoints import export_adapter, load_checkpoint, resolve_checkpoint
from asymvlm.cli import main as cli_main
from asymvlm.errors import CheckpointError
from asymvlm.runner import train
from asymvlm.scoring import Scorer, TableEncoder
from asymvlm.scoring.models import CaptionUncertaintyModel, _load_pyfunc
from asymvlm.training import TrainConfig
from tests.hub_server import serve_hub


def _cfg(method: str, **kw) -> TrainConfig:
    return TrainConfig(**{"method": method, "epochs": 1, "hidden_dim": 16, "depth": 2, **kw})


@pytest.fixture(scope="module")
def vmf(pre_world, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("vmf") / "ckpt")
    train(pre_world, "train", _cfg("asymvlm-vmf", epochs=2), output=out, progress=False)
    return out


@pytest.mark.parametrize("name", ["asymvlm-ps", "elip"])  # fitted buffers too
def test_export_then_load_gives_the_checkpoints_numbers(name, pre_world, tmp_path) -> None:
    checkpoint, exported = str(tmp_path / "ckpt"), str(tmp_path / "exported")
    train(pre_world, "train", _cfg(name), output=checkpoint, progress=False)
    method, _ = load_checkpoint(checkpoint)
    export_adapter(checkpoint, exported)
    assert sorted(os.listdir(exported)) == ["README.md", "config.json", "model.safetensors"]
    loaded, _ = load_checkpoint(exported)
    weights, saved = loaded.state_dict(), method.state_dict()
    assert weights.keys() == saved.keys() and all(torch.equal(weights[k], saved[k]) for k in saved)


def test_the_folder_has_the_hub_layout_and_a_card(vmf, tmp_path) -> None:
    from huggingface_hub import ModelCard

    out = tmp_path / "exported"
    config = export_adapter(vmf, str(out), repo="someone/asymvlm-vmf-demo")
    assert json.loads((out / "config.json").read_text()) == config
    assert config["format"] == "asymvlm-adapter" and config["protocol"] == "improved"
    assert (config["method"], config["dim"], config["adapter_input"]) == ("asymvlm-vmf", 16, "raw")
    scale = float(load_file(os.path.join(vmf, "model.safetensors"))["text_adapter.input_scale"])
    assert config["input_calibration"] == {"text_adapter.input_scale": pytest.approx(scale)}
    assert config["embeddings"] == "tables"  # no path of this machine in a published folder
    versions = (config["torch_version"], config["asymvlm_version"])
    assert versions == (torch.__version__, version("asymvlm"))
    assert config["tables_fingerprint"].startswith("sha256:")
    card = ModelCard((out / "README.md").read_text())
    settings = (
        f"| trained with | `asymvlm {config['asymvlm_version']}, torch {torch.__version__}` |"
    )
    assert settings in card.text and f"| `{config['tables_fingerprint']}` |" in card.text
    assert card.data.library_name == "asymvlm" and card.data.license == "apache-2.0"
    assert "asymvlm-vmf" in card.data.tags and "base_model" not in card.data.to_dict()
    sections = "Method", "Training data and protocol", "Evaluation", "How to use", "Limits"
    assert all(f"\n## {name}\n" in card.text for name in sections)
    assert "1/kappa" in card.text and "hf-hub:someone/asymvlm-vmf-demo" in card.text
    assert "synthetic world" in card.text  # its limits say what the adapter is for


@pytest.mark.parametrize(
    ("encoder", "label", "local"),
    [
        ("open_clip:ViT-B-32/laion2b_s34b_b79k", "open_clip:ViT-B-32/laion2b_s34b_b79k", False),
        ("open_clip:hf-hub:org/clip", "open_clip:hf-hub:org/clip", False),
        ("openai/clip-vit-base-patch32", "openai/clip-vit-base-patch32", False),
        ("/data/models/my-clip", "my-clip (a local folder)", True),
        ("open_clip:local-dir:/data/oc", "oc (a local folder)", True),
    ],
)
def test_the_card_names_the_encoder_and_the_adapter_that_was_built(encoder, label, local):
    """A hub model is named as is (a local folder by its name, where --encoder takes its
    copy); the adapter's sizes are the ones built (official ProbVLM: depth 2, not 3)."""
    from asymvlm.checkpoints.sharing import model_card

    cfg = TrainConfig(method="probvlm", protocol="official")
    config = {"method": "probvlm", "train_config": cfg.model_dump(), "embedding_model": encoder}
    config["adapter_size"] = {"hidden_dim": 1024, "depth": 2}
    card = model_card(config)
    assert f"| frozen encoder | `{label}` |" in card
    assert "| adapter width x depth | `1024 x 2` |" in card
    assert ("a local folder (" in card) == local and ("its path in `config.json`" in card) == local
    assert "None" not in card


def test_the_checkpoint_records_the_sizes_built_and_every_file_is_readable(pre_world, tmp_path):
    """model.safetensors is written with the umask's mode like config.json (safetensors' own
    writer makes it 0600: unreadable to a colleague on a shared disk)."""
    from asymvlm.checkpoints import save_checkpoint
    from asymvlm.methods import build_method

    umask = os.umask(0o022)
    try:
        out, exported, trained = tmp_path / "ckpt", tmp_path / "exported", tmp_path / "trained"
        cfg = TrainConfig(method="probvlm", protocol="official")
        save_checkpoint(str(out), build_method("probvlm", 16, **cfg.method_args()), cfg, 16)
        export_adapter(str(out), str(exported))
        train(pre_world, "train", _cfg("asymvlm-vmf"), output=str(trained), progress=False)
    finally:
        os.umask(umask)
    meta = json.loads((out / "config.json").read_text())
    assert meta["adapter_size"] == {"hidden_dim": 1024, "depth": 2}
    assert meta["train_config"]["hidden_dim"] is None  # what was asked: the method's default
    for folder in (out, exported, trained):
        modes = {f.name: oct(f.stat().st_mode & 0o777) for f in folder.iterdir()}
        assert set(modes.values()) == {"0o644"}, modes
    assert "| adapter width x depth | `1024 x 2` |" in (exported / "README.md").read_text()


def test_an_export_replaces_only_an_earlier_export_and_holds_no_pickle(vmf, tmp_path) -> None:
    out, other = tmp_path / "exported", tmp_path / "notes"
    export_adapter(vmf, str(out))
    with pytest.raises(CheckpointError, match="already holds an exported model; pass --overwrite"):
        export_adapter(vmf, str(out))
    export_adapter(vmf, str(out), overwrite=True)
    other.mkdir()
    (other / "todo.txt").write_text("keep me")
    with pytest.raises(CheckpointError, match="files that are not an exported model"):
        export_adapter(vmf, str(other), overwrite=True)
    assert (other / "todo.txt").read_text() == "keep me"
    with pytest.raises(CheckpointError, match="the checkpoint's own folder"):
        export_adapter(vmf, vmf, overwrite=True)
    (out / "extra.bin").write_bytes(b"\x80\x04K\x01.")  # a pickle beside the weights
    for load in (load_checkpoint, lambda f: resolve_checkpoint(f, pretrained=True)):
        with pytest.raises(CheckpointError, match=r"holds extra\.bin, a pickle"):
            load(str(out))
    # A training checkpoint is no model folder: its optimiser state is a pickle.
    with pytest.raises(CheckpointError, match=r"holds trainer\.pt, a pickle"):
        resolve_checkpoint(vmf, pretrained=True)


@pytest.fixture
def hub(hub_cache, monkeypatch):
    with serve_hub(monkeypatch) as hub:
        yield hub


def test_hub_names_resolve_with_revisions_cache_and_offline_mode(
    vmf, pre_world, hub, tmp_path, monkeypatch
) -> None:
    from huggingface_hub import constants

    first, second, other = tmp_path / "v1", tmp_path / "v2", str(tmp_path / "ckpt2")
    export_adapter(vmf, str(first))
    commit = hub.add("someone/adapter", str(first), branch="v1")
    train(pre_world, "train", _cfg("asymvlm-vmf", seed=1), output=other, progress=False)
    export_adapter(other, str(second))
    hub.add("someone/adapter", str(second), branch="main")
    encoder = TableEncoder(pre_world, ["test"])
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
    results = []  # `asymvlm evaluate` takes folders, model folders and Hub names alike
    for source in (vmf, str(first), "hf-hub:someone/adapter@v1"):
        out = tmp_path / f"m{len(results)}.json"
        args = ["evaluate", "--embeddings", pre_world, "--split", "test", "--checkpoint", source]
        assert cli_main([*args, "--quiet", "--output", str(out)]) == 0
        results.append({d: json.loads(out.read_text())[d] for d in ("t2i", "i2t")})
    assert results[0] == results[1] == results[2] and results[0]["t2i"]["aupr"] is not None
    # offline: the cache answers for what was downloaded, and says what it lacks
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    served = len(hub.requests)
    np.testing.assert_allclose(kappa(f"hf-hub:someone/adapter@{commit}"), want, rtol=1e-6)
    assert len(hub.requests) == served
    with pytest.raises(CheckpointError, match=r"someone/other: cannot download the model: not in"):
        resolve_checkpoint("hf-hub:someone/other")


UNIT = [1.0] + [0.0] * 15  # the world's dim is 16


def _adapter(folder: str) -> CaptionUncertaintyModel:
    return _load_pyfunc(folder)  # as MLflow loads a logged adapter


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
    frame = pd.DataFrame({"embedding": [UNIT, embedding], "norm": [8.0, norm]})
    with pytest.raises(MlflowException) as err:
        _adapter(vmf).predict(frame)
    assert err.value.error_code == "INVALID_PARAMETER_VALUE" and err.value.message == message
    assert err.value.get_http_status_code() == 400


def test_the_embedding_model_answers_finite_numbers_or_null(vmf, pre_world, tmp_path) -> None:
    model = _adapter(vmf)
    rows = model.predict(pd.DataFrame({"embedding": [UNIT, UNIT[::-1]], "norm": [8.0, 7.5]}))
    assert (rows["kappa"] > 0).all() and np.isfinite(rows["kappa"]).all()
    np.testing.assert_allclose(rows["uncertainty"], 1.0 / rows["kappa"], rtol=1e-5)
    for frame, message in (
        (pd.DataFrame({"embedding": [UNIT]}), "input needs a 'norm' column"),
        (pd.DataFrame({"text": ["a dog"]}), "input needs a 'embedding' column"),
        (pd.DataFrame({"embedding": [], "norm": []}), "input has no rows"),
    ):
        with pytest.raises(MlflowException, match=message):
            model.predict(frame)
    clip = str(tmp_path / "clip")  # a method without kappa: null, not NaN
    train(pre_world, "train", TrainConfig(method="clip"), output=clip, progress=False)
    result = _adapter(clip).predict(pd.DataFrame({"embedding": [UNIT], "norm": [8.0]}))
    assert result.to_dict("records") == [{"uncertainty": None, "kappa": None}]
