"""The frozen-encoder wrapper, on tiny random CLIP / SigLIP checkpoints built offline.

Real HierarCaps images and captions go through the tiny models, so the plumbing (processors,
tokenisers, truncation, batching, provenance) is exercised on real inputs; the embeddings
themselves mean nothing.
"""

from __future__ import annotations

import csv
import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from asymvlm.data.encoder import Encoder, EncoderInfo, files_sha256, load_encoder
from asymvlm.data.tiny import save_tiny_clip, save_tiny_siglip
from tests.helpers import HIERARCAPS

DIMS = {"clip": 24, "siglip": 32}
MAX_TEXT = {"clip": 77, "siglip": 64}
BUILDERS = {"clip": save_tiny_clip, "siglip": save_tiny_siglip}


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    """Offline for these tests only (the environment is restored after each, so a later test's
    subprocess does not inherit it); huggingface_hub reads HF_HUB_OFFLINE at import, so its
    constant is forced too."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(scope="session")
def captions() -> list[str]:
    """Real HierarCaps captions, every level of the first rows (1 to ~20 words)."""
    if HIERARCAPS is None:
        pytest.skip("HierarCaps test captions not available")
    path = HIERARCAPS / "hierarcaps_test.csv"
    if not path.exists():
        pytest.skip("HierarCaps test captions not available")
    with open(path, newline="", encoding="utf-8") as handle:
        rows = [row["captions"] for _, row in zip(range(6), csv.DictReader(handle), strict=False)]
    return [level.strip() for row in rows for level in row.split("=>")]


@pytest.fixture(scope="session")
def images() -> list[Image.Image]:
    """A few real COCO images (opened read-only)."""
    if HIERARCAPS is None:
        pytest.skip("HierarCaps images not available")
    folder = HIERARCAPS / "images"
    if not folder.is_dir():
        pytest.skip("HierarCaps images not available")
    paths = sorted(folder.glob("*.jpg"))[:4]
    out = []
    for path in paths:
        with Image.open(path) as img:
            out.append(img.convert("RGB"))
    return out


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory, captions) -> dict[str, str]:
    root = tmp_path_factory.mktemp("tiny_encoders")
    return {family: build(root / family, captions) for family, build in BUILDERS.items()}


@pytest.fixture(scope="session")
def encoders(tiny_dirs) -> dict[str, Encoder]:
    return {family: load_encoder(path, device="cpu") for family, path in tiny_dirs.items()}


@pytest.fixture(params=sorted(BUILDERS))
def family(request) -> str:
    return request.param


def _assert_unit(unit: np.ndarray, norms: np.ndarray, n: int, dim: int) -> None:
    assert unit.shape == (n, dim) and unit.dtype == np.float32
    assert norms.shape == (n,) and norms.dtype == np.float32
    assert np.isfinite(unit).all() and np.isfinite(norms).all()
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-5)
    assert (norms > 0).all()


def test_tiny_checkpoints_are_deterministic(tmp_path, family):
    build = BUILDERS[family]
    first = build(tmp_path / "a", ["a man with a dog"], seed=3)
    again = build(tmp_path / "b", ["a man with a dog"], seed=3)
    other = build(tmp_path / "c", ["a man with a dog"], seed=4)
    assert files_sha256(first) == files_sha256(again)
    assert files_sha256(first) != files_sha256(other)


def test_unit_vectors_raw_norms_deterministic_and_empty(encoders, family, images, captions):
    encoder = encoders[family]
    assert encoder.dim == DIMS[family]
    pixels = encoder.preprocess_images(images)
    assert pixels.shape == (len(images), 3, 64, 64) and pixels.dtype == np.float32
    np.testing.assert_array_equal(pixels, encoder.preprocess_images(images))
    _assert_unit(*encoder.encode_pixels(pixels), len(images), DIMS[family])
    _assert_unit(*encoder.encode_texts(captions), len(captions), DIMS[family])
    for a, b in zip(encoder.encode_texts(captions), encoder.encode_texts(captions), strict=True):
        np.testing.assert_array_equal(a, b)
    unit, norms = encoder.encode_texts([])
    assert unit.shape == (0, DIMS[family]) and norms.shape == (0,)
    assert encoder.encode_pixels(encoder.preprocess_images([]))[0].shape == (0, DIMS[family])
    assert encoder.preprocess_images([images[0].convert("L")]).shape == (1, 3, 64, 64)


def test_batch_invariance(encoders, family, images, captions):
    encoder = encoders[family]
    pixels = encoder.preprocess_images(images[:2])
    together = encoder.encode_pixels(pixels)
    apart = [encoder.encode_pixels(pixels[i : i + 1]) for i in range(2)]
    for k in range(2):  # unit vectors, then norms
        np.testing.assert_allclose(together[k], np.concatenate([a[k] for a in apart]), atol=1e-5)
    # Captions of different lengths: CLIP pads to the longest, so padding must not leak in.
    texts = [captions[0], captions[3]]
    assert len(texts[0].split()) != len(texts[1].split())
    together = encoder.encode_texts(texts)
    apart = [encoder.encode_texts([t]) for t in texts]
    for k in range(2):
        np.testing.assert_allclose(
            together[k], np.concatenate([a[k] for a in apart]), atol=1e-5, rtol=1e-5
        )


def test_length_sorted_chunks_keep_order_and_values(encoders, family, captions):
    from asymvlm.data.embed import encode_texts_by_length

    encoder = encoders[family]
    texts = captions + ["", "a"]
    one_by_one = [encoder.encode_texts([t]) for t in texts]
    unit, norms = encode_texts_by_length(encoder, texts, batch_size=5)
    np.testing.assert_allclose(unit, np.concatenate([u for u, _ in one_by_one]), atol=1e-5)
    np.testing.assert_allclose(norms, np.concatenate([n for _, n in one_by_one]), rtol=1e-5)
    empty_unit, empty_norms = encode_texts_by_length(encoder, [], batch_size=5)
    assert empty_unit.shape == (0, DIMS[family]) and empty_norms.shape == (0,)


def test_matches_transformers_directly(tiny_dirs, encoders, family, images, captions):
    from transformers import AutoProcessor, CLIPModel, SiglipModel

    encoder = encoders[family]
    path = tiny_dirs[family]
    model = (CLIPModel if family == "clip" else SiglipModel).from_pretrained(path).eval()
    processor = AutoProcessor.from_pretrained(path)
    with torch.no_grad():
        pixels = processor(images=images, return_tensors="pt")["pixel_values"]
        image_out = model.get_image_features(pixel_values=pixels)
        if family == "clip":
            tokens = processor.tokenizer(captions, padding=True, return_tensors="pt")
            text_out = model.get_text_features(**tokens)
        else:  # SigLIP: padded to max_length, no attention mask, as it was trained
            tokens = processor.tokenizer(captions, padding="max_length", return_tensors="pt")
            text_out = model.get_text_features(input_ids=tokens["input_ids"])
    for out, (unit, norms) in [
        (image_out, encoder.encode_pixels(encoder.preprocess_images(images))),
        (text_out, encoder.encode_texts(captions)),
    ]:
        projected = out.pooler_output if not isinstance(out, torch.Tensor) else out
        assert projected.shape[-1] == DIMS[family]
        raw = projected.norm(dim=-1)
        np.testing.assert_allclose(norms, raw.numpy(), rtol=1e-5)
        np.testing.assert_allclose(unit, (projected / raw[:, None]).numpy(), atol=1e-5)


def test_long_captions_are_truncated(encoders, family, captions):
    encoder = encoders[family]
    words = f"{captions[-1]} and a dog".split()
    long_caption = " ".join(words[i % len(words)] for i in range(200))
    tokens = encoder.tokenize([long_caption, captions[0]])["input_ids"]
    assert tokens.shape[1] == MAX_TEXT[family]
    assert tokens[0, -1].item() == encoder.tokenizer.eos_token_id
    unit, norms = encoder.encode_texts([long_caption, long_caption + " with more words", "", "a"])
    _assert_unit(unit, norms, 4, DIMS[family])
    np.testing.assert_allclose(unit[0], unit[1], atol=1e-6)  # the tail was cut off


def test_shorter_max_text_length(tiny_dirs):
    encoder = load_encoder(tiny_dirs["clip"], device="cpu", max_text_length=8)
    assert encoder.tokenize(["a " * 50])["input_ids"].shape[1] == 8
    assert encoder.info.preprocessing["max_text_length"] == 8


def test_projection_accepts_tensor_or_model_output():
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    from asymvlm.data.encoder.hf import _projection

    x = torch.randn(2, 5)
    assert _projection(x) is x
    assert _projection(BaseModelOutputWithPooling(pooler_output=x)) is x
    with pytest.raises(TypeError):
        _projection(BaseModelOutputWithPooling(last_hidden_state=x))


# ------------------------------------------------------------------------------- provenance
def test_info_fields(encoders, tiny_dirs, family):
    info = encoders[family].info
    assert isinstance(info, EncoderInfo)
    assert info.model == tiny_dirs[family]
    assert info.family == family and info.dim == DIMS[family]
    assert info.dtype == "float32" and info.device == "cpu"
    assert info.revision is None  # a local directory, not a hub snapshot
    assert info.preprocessing["image_size"] == 64
    assert info.preprocessing["max_text_length"] == MAX_TEXT[family]
    assert len(info.preprocessing["image_mean"]) == 3 and len(info.preprocessing["image_std"]) == 3
    # which of transformers' image backends ran (torchvision and PIL resize slightly differently)
    backend = encoders[family].image_processor
    assert info.preprocessing["image_backend"] in {c.__name__ for c in type(backend).__mro__}
    assert info.preprocessing["image_backend"] in ("TorchvisionBackend", "PilBackend")
    json.dumps(info.to_dict())  # stored beside the embedding tables


def test_files_sha256_is_stable_and_tracks_changes(tiny_dirs, tmp_path, family):
    source = tiny_dirs[family]
    first = load_encoder(source, device="cpu", load_model=False).info.files_sha256
    second = load_encoder(source, device="cpu", load_model=False).info.files_sha256
    assert first == second and len(first) == 64
    copy = shutil.copytree(source, tmp_path / "copy")
    assert files_sha256(copy) == first  # content, not location
    (copy / "unrelated.log").write_text("not a model file")
    assert files_sha256(copy) == first
    with open(copy / "config.json", "a", encoding="utf-8") as handle:
        handle.write("\n")
    assert files_sha256(copy) != first


def test_processor_only_encoder(tiny_dirs, images):
    encoder = load_encoder(tiny_dirs["siglip"], device="cpu", load_model=False)
    assert encoder.preprocess_images(images[:1]).shape == (1, 3, 64, 64)
    with pytest.raises(RuntimeError, match="load_model=False"):
        encoder.encode_texts(["a dog"])


def _bert(tmp_path) -> str:
    from transformers import BertConfig

    BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2).save_pretrained(tmp_path)
    return str(tmp_path)


@pytest.mark.parametrize(
    ("model", "kwargs", "error", "match"),
    [
        (lambda tmp, dirs: str(tmp / "no-such-model"), {}, OSError, "no-such-model"),
        (lambda tmp, dirs: "asymvlm-test/not-a-model", {}, OSError, "asymvlm-test/not-a-model"),
        (lambda tmp, dirs: _bert(tmp), {}, ValueError, "bert"),
        (lambda tmp, dirs: dirs["clip"], {"dtype": "float8"}, ValueError, "dtype"),
        (lambda tmp, dirs: dirs["clip"], {"max_text_length": 500}, ValueError, "max_text_length"),
    ],
)
def test_what_cannot_load_is_named(tmp_path, tiny_dirs, model, kwargs, error, match):
    with pytest.raises(error, match=match):
        load_encoder(model(tmp_path, tiny_dirs), device="cpu", **kwargs)


def test_hub_id_from_cache_records_commit(tmp_path, monkeypatch):
    """A hub id resolved from a (fake, offline) Hugging Face cache records its snapshot commit."""
    import huggingface_hub.constants

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--asymvlm-test--tiny-clip"
    save_tiny_clip(repo / "snapshots" / commit, seed=1)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    info = load_encoder("asymvlm-test/tiny-clip", device="cpu").info
    assert info.revision == commit
    assert info.family == "clip" and info.dim == DIMS["clip"]
