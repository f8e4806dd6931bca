"""open_clip backbones: names, preprocessing, the embedding stage and the scorer, against
open_clip's own transform, tokenizer, ``encode_image`` and ``encode_text``.

The model is a tiny randomly initialised open_clip CLIP saved as a ``local-dir`` folder
(:func:`asymvlm.data.tiny.save_tiny_open_clip`); real HierarCaps images and captions go through
it, so the plumbing is exercised on real inputs; the embeddings mean nothing.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from asymvlm import tables
from asymvlm.cli import main as cli_main
from asymvlm.data.encoder import files_sha256, load_encoder
from asymvlm.data.encoder.names import parse_name
from tests.helpers import HIERARCAPS, hierarcaps_subset, requires_hierarcaps

open_clip = pytest.importorskip("open_clip")  # a dependency: skipped only outside the project env


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, str]:
    from asymvlm.data.tiny import save_tiny_open_clip

    folder = tmp_path_factory.mktemp("open_clip") / "tiny"
    return {"name": save_tiny_open_clip(str(folder)), "folder": str(folder)}


@pytest.fixture(scope="module")
def reference(tiny):
    """open_clip's own model, inference transform and tokenizer for the tiny folder."""
    model, _, transform = open_clip.create_model_and_transforms(f"local-dir:{tiny['folder']}")
    return model.eval(), transform, open_clip.get_tokenizer(f"local-dir:{tiny['folder']}")


@pytest.fixture(scope="module")
def image_files() -> list[str]:
    if HIERARCAPS is None:
        pytest.skip("HierarCaps images not available")
    return [str(p) for p in sorted((HIERARCAPS / "images").glob("*.jpg"))[:5]]


CAPTIONS = [
    "a dog",
    "a golden retriever catching a red frisbee in a park on a sunny day " * 4,
    "two people",
    "Ünïcödé, punctuation; and   spaces!",
]


# -- names -----------------------------------------------------------------------------------
def test_names_are_taken_apart_and_local_paths_made_absolute(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    tag = parse_name("open_clip:ViT-B-32/laion2b_s34b_b79k")
    assert (tag.model_name, tag.pretrained, tag.local) == ("ViT-B-32", "laion2b_s34b_b79k", None)
    assert tag.name == "open_clip:ViT-B-32/laion2b_s34b_b79k"
    folder = parse_name("open_clip:local-dir:models/oc")
    assert folder.local == str(tmp_path / "models" / "oc")
    assert folder.name == f"open_clip:local-dir:{tmp_path}/models/oc"
    assert folder.model_name == f"local-dir:{tmp_path}/models/oc" and folder.pretrained is None
    weights = parse_name("open_clip:ViT-B-32/w/epoch_3.pt")
    assert weights.pretrained == weights.local == str(tmp_path / "w" / "epoch_3.pt")
    assert weights.name == f"open_clip:ViT-B-32/{tmp_path}/w/epoch_3.pt"
    hub = parse_name("open_clip:hf-hub:timm/ViT-B-16-SigLIP")
    assert (hub.model_name, hub.pretrained, hub.local) == (
        "hf-hub:timm/ViT-B-16-SigLIP",
        None,
        None,
    )
    for bad, why in [
        ("open_clip:ViT-B-32", "names no weights"),
        ("open_clip:", "no architecture"),
        ("open_clip:local-dir:", "no folder"),
        ("open_clip:hf-hub:", "no repo"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_name(bad)


def test_unknown_tags_and_missing_files_are_refused_with_what_exists(tmp_path) -> None:
    with pytest.raises(OSError, match="'nosuchtag' is not a known tag.*tags of ViT-B-32: openai"):
        load_encoder("open_clip:ViT-B-32/nosuchtag", device="cpu")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_encoder(f"open_clip:local-dir:{tmp_path / 'nowhere'}", device="cpu")
    with pytest.raises(ValueError, match="names no weights"):
        load_encoder("open_clip:ViT-B-32", device="cpu")


# -- preprocessing and encoding ----------------------------------------------------------------
@requires_hierarcaps
@pytest.mark.parametrize("library", ["open_clip", "transformers"])
def test_preprocessing_equals_the_librarys_own_on_real_images(
    library, tiny, reference, image_files, tmp_path
) -> None:
    """The encoder, the preprocessing-only encoder and the stage's decode step give the pixels
    of open_clip's inference transform / the transformers image processor."""
    import pyarrow as pa
    from transformers import AutoImageProcessor

    from asymvlm.data.encode import decode_batch
    from asymvlm.data.tiny import save_tiny_clip

    pil = [Image.open(p).convert("RGB") for p in image_files]
    if library == "open_clip":
        name = tiny["name"]
        want = torch.stack([reference[1](im) for im in pil]).numpy()
    else:
        name = save_tiny_clip(str(tmp_path / "clip"))
        want = AutoImageProcessor.from_pretrained(name)(images=pil, return_tensors="np")
        want = want["pixel_values"]
    assert want.shape == (len(pil), 3, 64, 64)
    np.testing.assert_array_equal(load_encoder(name, device="cpu").preprocess_images(pil), want)
    light = load_encoder(name, device="cpu", load_model=False)
    assert light.model is None
    np.testing.assert_array_equal(light.preprocess_images(pil), want)
    n = len(pil)
    rows = pa.table(
        {"image_id": [f"i{k}" for k in range(n)], "path": image_files, "shard": [0] * n}
    )
    decoded = decode_batch(rows, name)
    assert list(decoded["error"]) == [""] * n
    np.testing.assert_array_equal(decoded["pixel_values"], want)


@requires_hierarcaps
def test_embeddings_equal_encode_image_and_encode_text(tiny, reference, image_files) -> None:
    model, transform, tokenizer = reference
    encoder = load_encoder(tiny["name"], device="cpu")
    pil = [Image.open(p).convert("RGB") for p in image_files]
    with torch.no_grad():
        image_raw = model.encode_image(torch.stack([transform(im) for im in pil]))
        text_raw = model.encode_text(tokenizer(CAPTIONS))
    for raw, (unit, norm) in [
        (image_raw, encoder.encode_pixels(encoder.preprocess_images(pil))),
        (text_raw, encoder.encode_texts(CAPTIONS)),
    ]:
        assert unit.shape == (len(raw), 24) and unit.dtype == norm.dtype == np.float32
        np.testing.assert_allclose(norm, raw.norm(dim=-1).numpy(), rtol=1e-6)
        np.testing.assert_allclose(unit * norm[:, None], raw.numpy(), rtol=1e-5, atol=1e-6)
    # the over-long caption is truncated as open_clip truncates (to its context length)
    assert encoder.tokenize(CAPTIONS)["text"].shape == (len(CAPTIONS), 32)
    info = encoder.info.to_dict()
    assert info["family"] == "open_clip" and info["dim"] == 24
    assert info["model"] == f"open_clip:local-dir:{os.path.abspath(tiny['folder'])}"
    assert info["files_sha256"] == files_sha256(tiny["folder"])
    assert info["preprocessing"]["size"] == [64, 64]
    assert info["preprocessing"]["resize_mode"] == "shortest"
    with pytest.raises(ValueError, match="context length"):
        load_encoder(tiny["name"], device="cpu", max_text_length=8)
    with pytest.raises(ValueError, match="transformers CLIP models only"):
        encoder.encode_texts(["a dog"], pre=True)


# -- the embedding stage and the scorer -------------------------------------------------------
@pytest.fixture(scope="module")
def embedded(ray_session, tiny, tmp_path_factory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("open_clip_stage")
    csv, images = hierarcaps_subset(base / "hc", n=6)
    root = str(base / "tables")
    assert (
        cli_main(
            [
                "embed",
                "--dataset",
                "hierarcaps",
                "--annotations",
                csv,
                "--images",
                images,
                "--model",
                tiny["name"],
                "--split",
                "test",
                "--output",
                root,
                "--batch-size",
                "4",
            ]
        )
        == 0
    )
    return {"tables": root, "images": images, "base": str(base)}


@requires_hierarcaps
@pytest.mark.slow
def test_the_stage_writes_open_clips_embeddings_and_names_the_model(
    tiny, reference, embedded
) -> None:
    model, transform, tokenizer = reference
    split = tables.read_split(embedded["tables"], "test")
    files = {os.path.splitext(n)[0]: n for n in os.listdir(embedded["images"])}
    pil = [
        Image.open(os.path.join(embedded["images"], files[i])).convert("RGB")
        for i in split.image_ids
    ]
    with torch.no_grad():
        image_raw = model.encode_image(torch.stack([transform(im) for im in pil])).numpy()
        text_raw = model.encode_text(tokenizer(list(split.texts))).numpy()
    for raw, unit, norm in [
        (image_raw, split.image_embeddings, split.image_norms),
        (text_raw, split.text_embeddings, split.text_norms),
    ]:
        unit, norm = np.asarray(unit), np.asarray(norm)
        np.testing.assert_allclose(norm, np.linalg.norm(raw, axis=1), rtol=1e-5)
        np.testing.assert_allclose(unit * norm[:, None], raw, rtol=1e-4, atol=1e-5)
    manifest = tables.read_manifest(embedded["tables"]).to_dict()
    assert manifest["model"] == tiny["name"]
    assert manifest["family"] == "open_clip" and manifest["dim"] == 24
    assert manifest["files_sha256"] == files_sha256(tiny["folder"])
    # the same job again is done already; pre-projection features are CLIP-transformers only
    assert (
        cli_main(
            [
                "embed",
                "--dataset",
                "hierarcaps",
                "--annotations",
                os.path.join(embedded["base"], "hc", "hierarcaps_test.csv"),
                "--images",
                embedded["images"],
                "--model",
                tiny["name"],
                "--split",
                "test",
                "--output",
                embedded["tables"],
                "--pre-projection",
            ]
        )
        == 2
    )


@requires_hierarcaps
@pytest.mark.slow
def test_the_scorer_reloads_the_open_clip_model_of_the_checkpoint(
    tiny, embedded, tmp_path, capsys
) -> None:
    from asymvlm import Scorer
    from asymvlm.errors import CheckpointError

    checkpoint = str(tmp_path / "adapter")
    assert (
        cli_main(
            [
                "train",
                "--embeddings",
                embedded["tables"],
                "--split",
                "test",
                "--method",
                "asymvlm-vmf",
                "--epochs",
                "3",
                "--optimizer",
                "adamw",
                "--lr",
                "1e-2",
                "--output",
                checkpoint,
                "--quiet",
            ]
        )
        == 0
    )
    meta = json.load(open(os.path.join(checkpoint, "config.json")))
    assert meta["encoder"]["model"] == tiny["name"] and meta["encoder"]["family"] == "open_clip"
    scores = str(tmp_path / "scores.parquet")
    assert (
        cli_main(
            [
                "score",
                "--embeddings",
                embedded["tables"],
                "--split",
                "test",
                "--checkpoint",
                checkpoint,
                "--output",
                scores,
                "--quiet",
            ]
        )
        == 0
    )
    split = tables.read_split(embedded["tables"], "test")
    want = pq.read_table(scores)
    got = Scorer.from_checkpoint(checkpoint, device="cpu").caption_uncertainty(list(split.texts))
    np.testing.assert_allclose(got.kappa, want.column("kappa").to_numpy(), rtol=2e-5)
    capsys.readouterr()
    assert cli_main(["score-text", "--checkpoint", checkpoint, "a dog"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["text"] == "a dog" and printed["kappa"] > 0
    # the MLflow text model of such a checkpoint: the same numbers, open_clip in its requirements
    import mlflow
    import pandas as pd

    from asymvlm import tracking
    from asymvlm.scoring.models import log_adapter_models

    uri = tracking.default_tracking_uri(str(tmp_path))
    run = tracking.open_run(uri, "e", "trial", kind="trial")
    log_adapter_models(run, checkpoint)
    run.end()
    mlflow.set_tracking_uri(uri)
    model = mlflow.pyfunc.load_model(f"runs:/{run.id}/text-adapter")
    served = model.predict(pd.DataFrame({"text": ["a dog"]}))
    np.testing.assert_allclose(served["kappa"], [printed["kappa"]], rtol=1e-6)
    requirements = mlflow.pyfunc.get_model_dependencies(f"runs:/{run.id}/text-adapter")
    assert "open_clip_torch" in open(requirements).read()
    # the weights changed in place: refused, named
    from safetensors.torch import load_file, save_file

    weights = os.path.join(tiny["folder"], "open_clip_model.safetensors")
    state = load_file(weights)
    try:
        save_file({k: v + 1e-3 for k, v in state.items()}, weights)
        with pytest.raises(CheckpointError, match="encoder files .*differ from the ones"):
            Scorer.from_checkpoint(checkpoint, device="cpu")
    finally:
        save_file(state, weights)
