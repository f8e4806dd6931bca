"""The embedding stage end to end on generated data sets, SigLIP, the CLI and s3:// storage."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from asymvlm import tables
from asymvlm.cli import main as cli_main
from asymvlm.data.embed import EmbedConfig
from asymvlm.data.templates import templates_for
from pipelines.embedding import run_embed
from tests.helpers import hierarcaps_subset, requires_hierarcaps
from tests.test_sources import cifar_rows, dump, write_shards


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory) -> dict[str, str]:
    from asymvlm.data.tiny import save_tiny_clip, save_tiny_siglip

    base = tmp_path_factory.mktemp("models")
    return {
        "clip": save_tiny_clip(str(base / "clip")),
        "siglip": save_tiny_siglip(str(base / "siglip")),
    }


def test_cc_webdataset_shards_with_siglip(ray_session, tiny_models, tmp_path) -> None:
    expected = write_shards(tmp_path / "shards")
    out = str(tmp_path / "tables")
    summary = run_embed(
        EmbedConfig(
            dataset="cc",
            annotations=str(tmp_path / "shards"),
            model=tiny_models["siglip"],
            split="train",
            output=out,
            batch_size=4,
        )
    )
    split = tables.read_split(out, "train")
    assert summary["n_images"] == split.n_images == len(expected) == 8
    assert sorted(split.image_ids) == sorted(expected)
    assert sorted(split.texts) == sorted(caption for _, caption in expected.values())
    manifest = tables.read_manifest(out)
    assert manifest.dim == 32 and manifest.extra["family"] == "siglip"
    np.testing.assert_allclose(np.linalg.norm(split.text_embeddings, axis=1), 1, atol=1e-5)


def _write_cifar10(folder) -> None:
    root = folder / "cifar-10-batches-py"
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    dump(root / "batches.meta", {b"label_names": [b"cat", b"dog", b"ship"]})
    for b in range(1, 6):
        _, flat = cifar_rows(rng, 2)
        dump(root / f"data_batch_{b}", {b"labels": [0, 1], b"data": flat})
    _, flat = cifar_rows(rng, 6)
    dump(root / "test_batch", {b"labels": [0, 1, 2, 2, 1, 0], b"data": flat})


def test_cifar10_images_with_labels_and_class_prompts(ray_session, tiny_models, tmp_path) -> None:
    _write_cifar10(tmp_path / "cifar")  # classes cat, dog, ship
    out = str(tmp_path / "tables")
    run_embed(
        EmbedConfig(
            dataset="cifar10",
            images=str(tmp_path / "cifar"),
            model=tiny_models["clip"],
            split="test",
            output=out,
            batch_size=4,
        )
    )
    images = tables.read_parts(out, "test", "images")
    assert images.column("label").to_pylist() == [0, 1, 2, 2, 1, 0]
    prompts = tables.read_parts(out, "test", "prompts")
    cifar = templates_for("cifar10")
    classes = prompts.slice(0, 3 * 18)  # one row per class and template, then the dummies
    assert classes["template"].to_pylist() == list(cifar) * 3
    assert classes["class_index"].to_pylist() == [c for c in range(3) for _ in range(18)]
    want = [t.format(name) for name in ("cat", "dog", "ship") for t in cifar]
    assert classes["text"].to_pylist() == want
    dummies = prompts.slice(3 * 18)
    assert dummies["class_index"].to_pylist() == [-1] * 3
    assert dummies["text"].to_pylist() == [
        "a photo",
        "a photo of an object",
        "a photo of something",
    ]
    emb = np.stack(prompts.column("embedding").to_numpy(zero_copy_only=False))
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1, atol=1e-5)
    assert len({row.tobytes() for row in emb}) == 3 * 18 + 3  # each prompt embedded on its own


@requires_hierarcaps
def test_cli_embed_and_pipeline_config(ray_session, tiny_models, tmp_path, capsys) -> None:
    csv, images = hierarcaps_subset(tmp_path / "hc")
    out = str(tmp_path / "cli-tables")
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
            tiny_models["clip"],
            "--split",
            "test",
            "--output",
            out,
            "--batch-size",
            "8",
        ]
    )
    assert code == 0
    assert json.loads(capsys.readouterr().out)["n_captions"] == 24

    from pipelines.embed import main as pipeline_main
    from pipelines.schema import load_embed_jobs as load_jobs

    # The same job from a YAML file finds the CLI's finished output: nothing is embedded again.
    config = tmp_path / "embed.yaml"
    config.write_text(
        f"defaults: {{model: {tiny_models['clip']}, batch_size: 8}}\n"
        f"jobs:\n  - {{dataset: hierarcaps, annotations: {csv}, images: {images}, "
        f"split: test, output: {out}}}\n"
    )
    assert pipeline_main(["--config", str(config)]) == 0
    assert json.loads(capsys.readouterr().out)[0]["skipped"] is True
    bad = tmp_path / "bad.yaml"
    bad.write_text("dataset: hierarcaps\nmodel: x\nsplit: t\noutput: o\nbatchsize: 3\n")
    with pytest.raises(
        ValueError, match="bad.yaml: batchsize: unknown key \\(did you mean 'batch_size'\\?\\)"
    ):
        load_jobs(str(bad))


@requires_hierarcaps
def test_s3_input_and_output(ray_on_s3_nodes, tiny_models, tmp_path) -> None:
    s3_server = ray_on_s3_nodes
    import s3fs

    csv, images = hierarcaps_subset(tmp_path / "hc", n=5)
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_server})
    fs.mkdir("data")
    fs.put(os.path.dirname(csv) + "/", "data/hc/", recursive=True)
    cfg = EmbedConfig(
        dataset="hierarcaps",
        annotations="s3://data/hc/hierarcaps_test.csv",
        images="s3://data/hc/images",
        model=tiny_models["clip"],
        split="test",
        output="s3://data/tables",
        batch_size=4,
    )
    summary = run_embed(cfg)
    assert summary["n_images"] == 5 and summary["n_captions"] == 20
    split = tables.read_split("s3://data/tables", "test")
    assert split.n_images == 5 and sorted(set(split.extra_text_columns["level"])) == [0, 1, 2, 3]
    assert fs.exists("data/tables/manifest.json") and fs.exists("data/tables/test/_SUCCESS.json")
    assert run_embed(cfg)["skipped"] is True
