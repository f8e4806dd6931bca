"""A Hub model that cannot be had is named before any worker starts, with exit 2."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from asymvlm.embedding.embed_config import EmbedConfig, check_model
from asymvlm.embedding.encoders.hub import check_hub_model, hub_files
from asymvlm.errors import ConfigError
from tests.hub_server import serve_hub

LAION = "laion/CLIP-ViT-B-32-laion2B-s34B-b79K"
CLIP = "openai/clip-vit-base-patch32"


@pytest.fixture
def hub(hub_cache, monkeypatch, tmp_path) -> Iterator[Callable[..., None]]:
    """``hub(repo, *files)`` publishes a repository on the stand-in Hub."""

    def add(repo: str, *files: str) -> None:
        folder = tmp_path / "repos" / repo
        folder.mkdir(parents=True)
        for name in files:
            (folder / name).write_text("{}")
        server.add(repo, str(folder))

    with serve_hub(monkeypatch) as server:
        yield add


def test_which_files_a_name_is_fetched_by(tmp_path) -> None:
    siglip = "timm/ViT-B-16-SigLIP"
    assert hub_files(CLIP) == (CLIP, ("config.json",))
    weights = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
    assert hub_files("open_clip:ViT-B-32/laion2b_s34b_b79k") == (LAION, weights)
    assert hub_files(f"open_clip:hf-hub:{siglip}") == (siglip, ("open_clip_config.json",))
    # local folders and files are never the Hub's
    assert hub_files(str(tmp_path)) is None and hub_files("./models/clip") is None
    assert hub_files(f"open_clip:local-dir:{tmp_path}") is None
    assert hub_files(f"open_clip:ViT-B-32/{tmp_path}/weights.pt") is None


def test_the_cache_answers_when_the_hub_cannot(hub_cache, monkeypatch) -> None:
    """The Hub is a closed port: only the cache can answer, or the error says why not."""
    from huggingface_hub import constants

    message = rf"'{CLIP}' is not in the Hugging Face cache \(.*hf-cache\) and the Hub cannot be "
    with pytest.raises(ValueError, match=message + r"asked for it \(.*\); download"):
        check_hub_model(CLIP)
    hub_cache(CLIP, "config.json")
    check_hub_model(CLIP)
    hub_cache(LAION, "open_clip_pytorch_model.bin")  # either weights file will do
    check_hub_model("open_clip:ViT-B-32/laion2b_s34b_b79k")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match="HF_HUB_OFFLINE is set"):
        check_hub_model("google/siglip-base-patch16-224")


def test_the_hub_says_whether_it_has_the_model(hub) -> None:
    hub(CLIP, "config.json")
    check_hub_model(CLIP)
    hub(LAION, "open_clip_pytorch_model.bin")  # the second name open_clip tries
    check_hub_model("open_clip:ViT-B-32/laion2b_s34b_b79k")
    with pytest.raises(ValueError, match=r"the Hub has no repository 'someone/no-such-model'"):
        check_hub_model("someone/no-such-model")
    hub("someone/not-a-model", "README.md")
    with pytest.raises(ValueError, match=r"'someone/not-a-model' has none of config\.json"):
        check_hub_model("someone/not-a-model")


def test_embed_names_the_model_with_exit_2_and_writes_nothing(
    hub_cache, tmp_path, monkeypatch, capsys
) -> None:
    """Offline, the command stops before Ray or any worker: one line, exit 2, no output."""
    from huggingface_hub import constants

    from asymvlm.cli import main as cli_main

    out = tmp_path / "tables"
    cfg = EmbedConfig(dataset="hierarcaps", split="test", model=CLIP, output=str(out))
    with pytest.raises(ConfigError, match=rf"^model '{CLIP}' is not in"):
        cfg.check_inputs()
    with pytest.raises(ConfigError, match=r"^model: 'open_clip:ViT-B-32' names no weights"):
        check_model("open_clip:ViT-B-32")
    annotations = tmp_path / "hc.csv"
    annotations.write_text("caption\n")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    args = ["--dataset", "hierarcaps", "--annotations", str(annotations), "--images"]
    args += [str(tmp_path), "--split", "test", "--model", CLIP]
    assert cli_main(["embed", *args, "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: model '{CLIP}' is not in the Hugging Face")
    assert "HF_HUB_OFFLINE is set" in err and "\n" not in err
    assert not out.exists()
