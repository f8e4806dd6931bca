"""Zero-shot prompt templates per data set (CLIP's evaluation lists) and their use by the
readers and the embed stage."""

from __future__ import annotations

import re

import numpy as np
import pyarrow.compute as pc
import pytest

from asymvlm.data.sources import read_source
from asymvlm.data.templates import (
    GENERIC_TEMPLATES,
    IMAGENET_CLASSES,
    TEMPLATES,
    imagenet_class_names,
    templates_for,
)


@pytest.mark.parametrize(
    ("dataset", "count"),
    [("cifar10", 18), ("cifar100", 18), ("stl10", 2), ("imagenet", 80), ("ImageNet1k", 80)],
)
def test_template_counts_per_data_set(dataset: str, count: int) -> None:
    templates = templates_for(dataset)
    assert len(templates) == count == len(set(templates))
    assert templates[0] in ("a photo of a {}.", "a bad photo of a {}.")


def test_other_data_sets_get_the_generic_templates() -> None:
    assert templates_for("coco") == templates_for("no-such-set") == GENERIC_TEMPLATES
    assert len(GENERIC_TEMPLATES) == 5


def test_every_template_has_exactly_one_slot() -> None:
    for templates in (*TEMPLATES.values(), GENERIC_TEMPLATES):
        for template in templates:
            assert template.count("{}") == 1 and not re.search(r"\{[^}]", template), template
            assert template.format("dog").count("dog") == 1


def test_imagenet_class_names_are_clips_for_ilsvrc_synsets() -> None:
    wnids = list(IMAGENET_CLASSES)
    assert len(wnids) == 1000 and wnids == sorted(wnids)
    assert all(re.fullmatch(r"n\d{8}", w) for w in wnids)
    # CLIP's curated names, not WordNet's first lemma ("cock", "hammerhead", "water ouzel").
    assert imagenet_class_names(["n01514668", "n01494475", "n01601694"]) == [
        "rooster",
        "hammerhead shark",
        "American dipper",
    ]
    assert imagenet_class_names(["n01514668", "cats"]) is None
    assert imagenet_class_names([]) is None


def test_imagenet_reader_uses_clip_names_and_templates(tmp_path) -> None:
    for folder in ("n01514668", "n15075141"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "a.JPEG").write_bytes(b"x")
    data = read_source("imagenet", annotations=None, images=str(tmp_path), split="val")
    assert data.description["classes"] == ["rooster", "toilet paper"]
    assert data.prompts.num_rows == 2 * 80
    assert data.prompts["text"][80].as_py() == "a bad photo of a toilet paper."
    (tmp_path / "cats").mkdir()  # not an ImageNet synset: the folder names stay
    data = read_source("imagenet", annotations=None, images=str(tmp_path), split="val")
    assert data.description["classes"] == ["cats", "n01514668", "n15075141"]


@pytest.mark.slow
def test_embed_stage_writes_one_prompt_row_per_class_and_cifar_template(
    ray_session, tmp_path
) -> None:
    from asymvlm import tables
    from asymvlm.data.embed import EmbedConfig
    from asymvlm.data.tiny import save_tiny_clip
    from pipelines.embedding import run_embed
    from tests.test_embed_sources import _write_cifar10

    _write_cifar10(tmp_path / "cifar")  # classes cat, dog, ship
    out = str(tmp_path / "tables")
    run_embed(
        EmbedConfig(
            dataset="cifar10",
            images=str(tmp_path / "cifar"),
            model=save_tiny_clip(str(tmp_path / "clip")),
            split="test",
            output=out,
            batch_size=16,
        )
    )
    prompts = tables.read_parts(out, "test", "prompts")
    classes = prompts.filter(pc.greater_equal(prompts["class_index"], 0))
    cifar = templates_for("cifar10")
    assert classes.num_rows == 3 * 18
    assert classes["template"].to_pylist() == list(cifar) * 3
    assert classes["class_index"].to_pylist() == [c for c in range(3) for _ in range(18)]
    want = [t.format(name) for name in ("cat", "dog", "ship") for t in cifar]
    assert classes["text"].to_pylist() == want
    emb = np.stack(classes["embedding"].to_numpy(zero_copy_only=False))
    assert len({row.tobytes() for row in emb}) == 3 * 18  # each prompt embedded on its own
    assert prompts.num_rows == 3 * 18 + 3  # and the three dummy prompts
