"""The frozen encoders (CLIP, SigLIP, open_clip) against the libraries' own processors and
models, on tiny random checkpoints and real HierarCaps inputs."""

from __future__ import annotations

import csv
import itertools
import shutil

import numpy as np
import pyarrow as pa
import pytest
import torch
from PIL import Image

from asymvlm.data.tiny import save_tiny_clip
from asymvlm.embedding.encoders import files_sha256, load_encoder
from asymvlm.embedding.encoders.names import parse_name
from asymvlm.embedding.encoding import decode_batch, encode_texts_by_length, perturb_captions
from tests.helpers import HIERARCAPS, requires_hierarcaps, tiny_encoders

pytestmark = requires_hierarcaps
FAMILIES = ("clip", "siglip", "open_clip")
DIMS = {"clip": 24, "siglip": 32, "open_clip": 24}
MAX_TEXT = {"clip": 77, "siglip": 64, "open_clip": 32}


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(scope="module")
def data() -> dict[str, list]:
    """Real HierarCaps captions (every level of 6 rows) and 4 of its image files."""
    with open(HIERARCAPS / "hierarcaps_test.csv", newline="", encoding="utf-8") as handle:
        rows = list(itertools.islice(csv.DictReader(handle), 6))
    captions = [c.strip() for row in rows for c in row["captions"].split("=>")]
    paths = [str(p) for p in sorted((HIERARCAPS / "images").glob("*.jpg"))[:4]]
    images = [Image.open(p).convert("RGB") for p in paths]
    return {"captions": captions, "paths": paths, "images": images}


@pytest.fixture(scope="module")
def models(tmp_path_factory, data) -> dict[str, str]:
    return tiny_encoders(tmp_path_factory.mktemp("encoders"))


@pytest.fixture(scope="module")
def encoders(models) -> dict:
    return {family: load_encoder(name, device="cpu") for family, name in models.items()}


def _reference(family: str, name: str, images: list, captions: list[str]):
    """The library's own pixels, raw image projections and raw caption projections."""
    if family == "open_clip":
        import open_clip

        model, _, transform = open_clip.create_model_and_transforms(name.removeprefix("open_clip:"))
        pixels = torch.stack([transform(im) for im in images])
        tokens = open_clip.get_tokenizer(name.removeprefix("open_clip:"))(captions)
        with torch.no_grad():
            return pixels.numpy(), model.eval().encode_image(pixels), model.encode_text(tokens)
    from transformers import AutoProcessor, CLIPModel, SiglipModel

    model = (CLIPModel if family == "clip" else SiglipModel).from_pretrained(name).eval()
    processor = AutoProcessor.from_pretrained(name)
    pixels = processor(images=images, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        image = model.get_image_features(pixel_values=pixels)
        if family == "clip":
            text = model.get_text_features(
                **processor.tokenizer(captions, padding=True, return_tensors="pt")
            )
        else:  # SigLIP: padded to max_length, no attention mask, as it was trained
            tokens = processor.tokenizer(captions, padding="max_length", return_tensors="pt")
            text = model.get_text_features(input_ids=tokens["input_ids"])
    image, text = (getattr(x, "pooler_output", x) for x in (image, text))
    return pixels.numpy(), image, text


@pytest.mark.parametrize("family", FAMILIES)
def test_embeddings_are_the_librarys_own(family, models, encoders, data) -> None:
    """Pixels, unit embeddings and raw norms equal the library's processor and projections."""
    encoder, name, images = encoders[family], models[family], data["images"]
    pixels, image_raw, text_raw = _reference(family, name, images, data["captions"])
    assert pixels.shape == (len(images), 3, 64, 64)
    np.testing.assert_array_equal(encoder.preprocess_images(images), pixels)
    light = load_encoder(name, device="cpu", load_model=False)
    assert light.model is None and light.info == encoder.info
    np.testing.assert_array_equal(light.preprocess_images(images), pixels)
    with pytest.raises(RuntimeError, match="load_model=False"):
        light.encode_texts(["a dog"])
    n = len(images)
    rows = pa.table(
        {"image_id": [f"i{k}" for k in range(n)], "path": data["paths"], "shard": [0] * n}
    )
    decoded = decode_batch(rows, name)
    assert list(decoded["error"]) == [""] * n
    np.testing.assert_array_equal(decoded["pixel_values"], pixels)
    noisy = decode_batch(rows, name, perturbation="jpeg:5")["pixel_values"]
    assert np.abs(noisy - pixels).mean() > 1e-3  # the OOD suite perturbs before preprocessing
    for raw, (unit, norm) in [
        (image_raw, encoder.encode_pixels(pixels)),
        (text_raw, encoder.encode_texts(data["captions"])),
    ]:
        assert unit.shape == (len(raw), DIMS[family]) and unit.dtype == norm.dtype == np.float32
        np.testing.assert_allclose(norm, raw.norm(dim=-1).numpy(), rtol=1e-5)
        np.testing.assert_allclose(unit * norm[:, None], raw.numpy(), rtol=1e-4, atol=1e-5)
    unit, norm = encoder.encode_texts([])
    assert unit.shape == (0, DIMS[family]) and norm.shape == (0,)
    assert encoder.encode_pixels(encoder.preprocess_images([]))[0].shape == (0, DIMS[family])


@pytest.mark.parametrize("family", FAMILIES)
def test_captions_truncated_batched_and_sorted_by_length(family, encoders, data) -> None:
    """Long captions are cut; padding does not leak; length-sorted chunks keep the order."""
    encoder, captions = encoders[family], data["captions"]
    long_caption = " ".join((captions[-1] + " and a dog").split() * 30)
    tokens = next(iter(encoder.tokenize([long_caption, captions[0]]).values()))
    assert tokens.shape[1] == MAX_TEXT[family]
    unit, _ = encoder.encode_texts([long_caption, long_caption + " with more words"])
    np.testing.assert_allclose(unit[0], unit[1], atol=1e-6)  # the tail was cut off
    texts = [*captions[:7], "", "a"]
    one_by_one = [encoder.encode_texts([t]) for t in texts]
    unit, norms = encode_texts_by_length(encoder, texts, batch_size=4)
    np.testing.assert_allclose(unit, np.concatenate([u for u, _ in one_by_one]), atol=1e-5)
    np.testing.assert_allclose(norms, np.concatenate([n for _, n in one_by_one]), rtol=1e-5)
    assert encode_texts_by_length(encoder, [], batch_size=4)[0].shape == (0, DIMS[family])


def test_perturbed_captions_keep_the_clean_text() -> None:
    texts = ["a dog on a red bike", "two cats"]
    caps = pa.table({"caption_id": ["a", "b"], "image_id": ["i", "i"], "text": texts})
    out = perturb_captions(caps, "typos:5", seed=0)
    assert out["clean_text"].to_pylist() == texts
    assert out["text"].to_pylist() == ["ay dog on a red bike", "two cts"]


def test_provenance(models, encoders, tmp_path) -> None:
    """The info stored beside the tables; the hash is of the model files' content."""
    clip = encoders["clip"].info
    want = (models["clip"], "clip", 24, "float32")
    assert (clip.model, clip.family, clip.dim, clip.dtype) == want
    assert clip.revision is None  # a local directory, not a hub snapshot
    pre = clip.preprocessing
    assert pre["image_size"] == 64 and pre["max_text_length"] == 77 and len(pre["image_mean"]) == 3
    assert pre["image_backend"] in ("TorchvisionBackend", "PilBackend")  # they resize differently
    oc = encoders["open_clip"].info
    assert (oc.model, oc.family) == (models["open_clip"], "open_clip")
    assert oc.preprocessing["size"] == [64, 64]
    assert oc.files_sha256 == files_sha256(parse_name(models["open_clip"]).local)
    copy = shutil.copytree(models["clip"], tmp_path / "copy")
    (copy / "unrelated.log").write_text("not a model file")
    assert files_sha256(copy) == clip.files_sha256 and len(clip.files_sha256) == 64
    with open(copy / "config.json", "a", encoding="utf-8") as handle:
        handle.write("\n")
    assert files_sha256(copy) != clip.files_sha256


def test_pre_projection_is_clip_only(encoders, data) -> None:
    clip = encoders["clip"]
    unit, norm, pre = clip.encode_texts(data["captions"][:3], pre=True)
    np.testing.assert_allclose(pre @ clip.projections()["text"].T, unit * norm[:, None], atol=1e-5)
    for family in ("siglip", "open_clip"):
        with pytest.raises(ValueError, match="CLIP models only"):
            encoders[family].encode_texts(["a dog"], pre=True)


def test_names_are_taken_apart_and_local_paths_made_absolute(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    parts = parse_name("open_clip:ViT-B-32/laion2b_s34b_b79k")[1:]
    assert parts == ("ViT-B-32", "laion2b_s34b_b79k", None)
    folder = parse_name("open_clip:local-dir:models/oc")
    assert folder.local == str(tmp_path / "models" / "oc")
    assert folder.name == f"open_clip:local-dir:{tmp_path}/models/oc"
    weights = parse_name("open_clip:ViT-B-32/w/epoch_3.pt")
    assert weights.pretrained == weights.local == str(tmp_path / "w" / "epoch_3.pt")
    hub = parse_name("open_clip:hf-hub:timm/ViT-B-16-SigLIP")
    assert (hub.model_name, hub.pretrained) == ("hf-hub:timm/ViT-B-16-SigLIP", None)
    for bad, why in [("", "no architecture"), ("local-dir:", "no folder"), ("hf-hub:", "no repo")]:
        with pytest.raises(ValueError, match=why):
            parse_name("open_clip:" + bad)


def _bert(folder) -> str:
    from transformers import BertConfig

    BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2).save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize(
    ("model", "kwargs", "error", "match"),
    [
        (lambda tmp, m: str(tmp / "no-such-model"), {}, OSError, "no-such-model"),
        (lambda tmp, m: "asymvlm-test/not-a-model", {}, OSError, "asymvlm-test/not-a-model"),
        (lambda tmp, m: _bert(tmp), {}, ValueError, "bert"),
        (lambda tmp, m: m["clip"], {"dtype": "float8"}, ValueError, "dtype"),
        (lambda tmp, m: "open_clip:ViT-B-32/nosuchtag", {}, OSError, "tags of ViT-B-32: openai"),
        (lambda tmp, m: f"open_clip:local-dir:{tmp}/nowhere", {}, FileNotFoundError, "not exist"),
        (lambda tmp, m: "open_clip:ViT-B-32", {}, ValueError, "names no weights"),
    ],
)
def test_what_cannot_load_is_named(tmp_path, models, model, kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        load_encoder(model(tmp_path, models), device="cpu", **kwargs)


def test_hub_id_from_cache_records_commit(tmp_path, monkeypatch) -> None:
    import huggingface_hub.constants

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--asymvlm-test--tiny-clip"
    save_tiny_clip(repo / "snapshots" / commit, seed=1)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    info = load_encoder("asymvlm-test/tiny-clip", device="cpu").info
    assert (info.revision, info.family, info.dim) == (commit, "clip", 24)
