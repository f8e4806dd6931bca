"""The Ray Data embedding stage on real HierarCaps files and generated data sets."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from asymvlm import tables
from asymvlm.data.embed import EmbedConfig
from pipelines.embedding import run_embed
from tests.helpers import HIERARCAPS, hierarcaps_subset, requires_hierarcaps

pytestmark = requires_hierarcaps


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory) -> str:
    from asymvlm.data.tiny import save_tiny_clip

    return save_tiny_clip(str(tmp_path_factory.mktemp("tiny-clip")))


@pytest.fixture(scope="module")
def hierarcaps_copy(tmp_path_factory) -> dict[str, str]:
    """The first 48 real HierarCaps hierarchies and images, one image truncated, one deleted."""
    csv, images = hierarcaps_subset(tmp_path_factory.mktemp("hierarcaps"), n=48)
    names = sorted(os.listdir(images))
    truncated, deleted = names[10], names[20]
    data = (Path(images) / truncated).read_bytes()
    (Path(images) / truncated).write_bytes(data[: len(data) // 3])
    os.remove(Path(images) / deleted)
    return {"csv": csv, "images": images, "truncated": truncated, "deleted": deleted}


def _snapshot(root: str) -> dict[str, bytes]:
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, root)] = open(path, "rb").read()
    return out


@pytest.mark.slow
def test_hierarcaps_acceptance(ray_session, tiny_clip, hierarcaps_copy, tmp_path) -> None:
    out = str(tmp_path / "tables")
    cfg = EmbedConfig(
        dataset="hierarcaps",
        annotations=hierarcaps_copy["csv"],
        images=hierarcaps_copy["images"],
        model=tiny_clip,
        split="test",
        output=out,
        batch_size=16,
        shard_size=20,
    )
    summary = run_embed(cfg)
    assert summary["n_images"] == 46 and summary["n_image_errors"] == 2
    split = tables.read_split(out, "test")  # validates ids, norms, dims
    assert split.n_images == 46 and split.n_texts == 46 * 4
    levels = split.extra_text_columns["level"]
    assert sorted(set(levels.tolist())) == [0, 1, 2, 3]
    assert np.bincount(levels).tolist() == [46] * 4
    np.testing.assert_allclose(np.linalg.norm(split.image_embeddings, axis=1), 1, atol=1e-5)
    assert split.text_norms is not None and np.all(split.text_norms > 0)
    manifest = tables.read_manifest(out)
    assert manifest.dim == split.image_embeddings.shape[1] == 24
    assert manifest.model == tiny_clip

    errors = tables.read_parts(out, "test", "errors").to_pylist()
    image_errors = {
        os.path.basename(e["path"]): e["reason"] for e in errors if e["kind"] == "image"
    }
    assert set(image_errors) == {hierarcaps_copy["truncated"], hierarcaps_copy["deleted"]}
    assert "truncated" in image_errors[hierarcaps_copy["truncated"]].lower()
    assert "FileNotFoundError" in image_errors[hierarcaps_copy["deleted"]]
    caption_errors = [e for e in errors if e["kind"] == "caption"]
    assert len(caption_errors) == 8 and all("failed" in e["reason"] for e in caption_errors)

    # Every row is what the frozen encoder gives for that very image / caption.
    from PIL import Image

    from asymvlm.data.encoder import load_encoder

    encoder = load_encoder(tiny_clip, device="cpu")
    rng = np.random.default_rng(0)
    rows = rng.choice(split.n_images, 12, replace=False)
    pictures = [
        Image.open(os.path.join(hierarcaps_copy["images"], f"{split.image_ids[i]}.jpg")).convert(
            "RGB"
        )
        for i in rows
    ]
    unit, norm = encoder.encode_pixels(encoder.preprocess_images(pictures))
    np.testing.assert_allclose(split.image_embeddings[rows], unit, atol=1e-5)
    np.testing.assert_allclose(split.image_norms[rows], norm, rtol=1e-5)
    rows = rng.choice(split.n_texts, 40, replace=False)
    unit, norm = encoder.encode_texts([split.texts[i] for i in rows])
    np.testing.assert_allclose(split.text_embeddings[rows], unit, atol=1e-5)
    np.testing.assert_allclose(split.text_norms[rows], norm, rtol=1e-5)

    before = _snapshot(out)
    again = run_embed(cfg)
    assert again["skipped"] is True
    assert _snapshot(out) == before


@pytest.mark.slow
def test_interrupted_run_resumes_without_duplicates(
    ray_session, tiny_clip, hierarcaps_copy, tmp_path
) -> None:
    """Losing shard 1 (its marker and one file) and re-running restores exactly that shard."""
    out = str(tmp_path / "tables")
    cfg = EmbedConfig(
        dataset="hierarcaps",
        annotations=hierarcaps_copy["csv"],
        images=hierarcaps_copy["images"],
        model=tiny_clip,
        split="test",
        output=out,
        batch_size=8,
        shard_size=16,
        decode_in="tasks",  # the GPU-cluster layout: decode in CPU tasks, stream to the actors
    )
    run_embed(cfg)
    complete = tables.read_split(out, "test")
    # Simulate a crash in shard 1: marker and texts part gone, success marker gone.
    os.remove(os.path.join(out, "test", "_parts", "part-00001.json"))
    os.remove(os.path.join(out, "test", "texts", "part-00001.parquet"))
    os.remove(os.path.join(out, "test", "_SUCCESS.json"))
    untouched = open(os.path.join(out, "test", "images", "part-00000.parquet"), "rb").read()
    summary = run_embed(cfg)
    assert "skipped" not in summary
    resumed = tables.read_split(out, "test")
    assert resumed.caption_ids == complete.caption_ids
    assert resumed.image_ids == complete.image_ids
    np.testing.assert_allclose(resumed.text_embeddings, complete.text_embeddings, atol=1e-6)
    assert open(os.path.join(out, "test", "images", "part-00000.parquet"), "rb").read() == untouched


@pytest.mark.slow
def test_perturbed_copies_for_the_ood_suite(ray_session, tiny_clip, hierarcaps_copy, tmp_path):
    base = dict(
        dataset="hierarcaps",
        annotations=hierarcaps_copy["csv"],
        images=hierarcaps_copy["images"],
        model=tiny_clip,
        split="test",
        sample=24,
    )
    clean = str(tmp_path / "clean")
    run_embed(EmbedConfig(output=clean, **base))
    noisy = str(tmp_path / "noisy")
    run_embed(
        EmbedConfig(output=noisy, image_perturbation="jpeg:5", text_perturbation="typos:5", **base)
    )
    a, b = tables.read_split(clean, "test"), tables.read_split(noisy, "test")
    assert a.image_ids == b.image_ids and a.caption_ids == b.caption_ids
    assert b.extra_text_columns["clean_text"].tolist() == a.texts
    assert sum(x != y for x, y in zip(a.texts, b.texts, strict=True)) > len(a.texts) // 2
    moved = np.linalg.norm(a.image_embeddings - b.image_embeddings, axis=1)
    assert np.all(moved > 1e-4)  # every image was re-encoded from its perturbed pixels
    with pytest.raises(ValueError, match="KIND:SEVERITY"):
        EmbedConfig(output=noisy, image_perturbation="blur:9", **base)


def test_pre_projection_columns_and_projection(ray_session, tiny_clip, tmp_path) -> None:
    """--pre-projection: W @ pre is the raw projection (embedding * norm) of every row, the
    columns round-trip through read_split / load_split, and the manifest records pre_dim."""
    from asymvlm.cli import main as cli_main
    from asymvlm.splits import load_split

    csv, images = hierarcaps_subset(tmp_path / "hc", n=6)
    out = str(tmp_path / "tables")
    code = cli_main(
        [
            "embed",
            "--dataset",
            "hierarcaps",
            "--annotations",
            csv,
            "--images",
            images,
            "--model",
            tiny_clip,
            "--split",
            "test",
            "--output",
            out,
            "--batch-size",
            "4",
            "--shard-size",
            "4",
            "--pre-projection",
        ]
    )
    assert code == 0
    manifest = tables.read_manifest(out)
    assert manifest.pre_dim == {"image": 32, "text": 32}  # the tiny CLIP's hidden sizes
    projection = tables.read_projection(out)
    assert projection["image"].shape == projection["text"].shape == (manifest.dim, 32)
    split = tables.read_split(out, "test")
    assert split.image_features_pre.shape == (6, 32)
    assert split.text_features_pre.shape == (24, 32)
    raw_images = split.image_embeddings * split.image_norms[:, None]
    raw_texts = split.text_embeddings * split.text_norms[:, None]
    np.testing.assert_allclose(
        split.image_features_pre @ projection["image"].T, raw_images, atol=1e-5
    )
    np.testing.assert_allclose(split.text_features_pre @ projection["text"].T, raw_texts, atol=1e-5)
    # The features are the frozen encoder's for that very caption.
    from asymvlm.data.encoder import load_encoder

    encoder = load_encoder(tiny_clip, device="cpu")
    _, _, pre = encoder.encode_texts(split.texts[:5], pre=True)
    np.testing.assert_allclose(split.text_features_pre[:5], pre, atol=1e-5)
    data = load_split(out, "test")
    np.testing.assert_array_equal(data.text_pre.numpy(), split.text_features_pre)
    np.testing.assert_array_equal(data.image_pre.numpy(), split.image_features_pre)
    np.testing.assert_array_equal(data.image_projection.numpy(), projection["image"])
    np.testing.assert_array_equal(data.image_norm.numpy(), split.image_norms)


def test_pre_projection_is_refused_for_siglip(tmp_path, capsys) -> None:
    from asymvlm.cli import main as cli_main
    from asymvlm.data.tiny import save_tiny_siglip

    siglip = save_tiny_siglip(str(tmp_path / "siglip"))
    csv, images = os.path.join(HIERARCAPS, "hierarcaps_test.csv"), str(tmp_path)
    code = cli_main(
        [
            "embed",
            "--dataset",
            "hierarcaps",
            "--annotations",
            csv,
            "--images",
            images,
            "--model",
            siglip,
            "--split",
            "test",
            "--output",
            str(tmp_path / "out"),
            "--pre-projection",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "pre_projection" in err and "CLIP models only" in err and "Traceback" not in err
    assert not os.path.exists(tmp_path / "out")
