"""Generic training captions (assumption U), far negatives, the forgetting regime (F) and the
worlds of the old knobs (:mod:`asymvlm.synthetic`)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from asymvlm import tables
from asymvlm.evaluation.kappa_groups import kappa_by_group
from asymvlm.evaluation.suite import load_classification
from asymvlm.evaluation.zeroshot import zero_shot_accuracy
from asymvlm.methods import build_method
from asymvlm.protocol import train
from asymvlm.synthetic import (
    DUMMY_PROMPTS,
    PRESETS,
    ClassificationSpec,
    SyntheticWorld,
    WorldConfig,
    write_classification_sets,
    write_world,
)
from asymvlm.synthetic.captions import GENERIC_TEXTS
from asymvlm.synthetic.classes import concept_roots
from asymvlm.synthetic.world import GENERIC_LEVEL, concat_splits
from asymvlm.training import TrainConfig
from tests.conftest import small_world_config
from tests.world_fingerprint import OLD_WORLDS, RECORDED, compare, fingerprint_world


# -- worlds of the old knobs ---------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(OLD_WORLDS))
def test_worlds_of_the_old_knobs_are_those_the_old_code_wrote(name, tmp_path) -> None:
    """Every table and manifest of a world of the old knobs, and of its classification sets,
    against the fingerprints recorded by running the code before generic captions and far
    negatives existed; the far negatives are the one new set written beside them."""
    with open(RECORDED) as fh:
        want = json.load(fh)[name]
    got = fingerprint_world(name, str(tmp_path))
    assert set(got) - set(want) <= {"far-negatives"}
    assert compare({role: got[role] for role in want}, want) == []


# -- generic captions (U) ------------------------------------------------------------------------
def _pair(p: float, **knobs) -> tuple[SyntheticWorld, dict, dict]:
    cfg = small_world_config(splits={"train": 2000, "test": 100}, **knobs)
    plain, generic = SyntheticWorld(cfg), SyntheticWorld(replace(cfg, generic_captions=p))
    return generic, plain.sample_split("train", 2000), generic.sample_split("train", 2000)


_DEMO_LIKE = {
    "block_images": 300,
    "finetune_roots": 4,
    "domain_misalignment": 0.5,
    "caption_words": True,
}


@pytest.mark.parametrize("knobs", [{}, _DEMO_LIKE])
def test_generic_captions_replace_a_share_of_the_train_captions(knobs) -> None:
    """A share p of the captions (within 4 standard errors) become generic: level -1, a text of
    GENERIC_TEXTS, meaning the hierarchy's root (after the shared encoder error is undone); every
    other caption, every image and every norm is that of the world without them."""
    p = 0.05
    world, plain, got = _pair(p, **knobs)
    generic = got["extra_text_columns"]["level"] == GENERIC_LEVEL
    n = len(generic)
    assert abs(generic.mean() - p) < 4 * math.sqrt(p * (1 - p) / n), generic.mean()
    assert {got["texts"][i] for i in np.flatnonzero(generic)} <= set(GENERIC_TEXTS)
    meaning = got["text_embeddings"][generic].astype(np.float64) @ world.text_rotation
    assert (meaning @ world.generic).min() > 0.95  # the root, with paraphrase noise
    concept = got["text_embeddings"][~generic].astype(np.float64) @ world.text_rotation
    assert np.median(concept @ world.generic) < 0.6  # other captions are not near the root
    np.testing.assert_array_equal(got["image_embeddings"], plain["image_embeddings"])
    np.testing.assert_array_equal(got["text_norms"], plain["text_norms"])
    np.testing.assert_array_equal(
        got["text_embeddings"][~generic], plain["text_embeddings"][~generic]
    )
    np.testing.assert_array_equal(
        got["extra_text_columns"]["level"][~generic], plain["extra_text_columns"]["level"][~generic]
    )
    assert [t for t, g in zip(got["texts"], generic, strict=True) if not g] == [
        t for t, g in zip(plain["texts"], generic, strict=True) if not g
    ]


def test_only_the_train_split_has_generic_captions() -> None:
    world = SyntheticWorld(small_world_config(generic_captions=0.2))
    assert world.has_generic("train") and not world.has_generic("test")
    test = world.sample_split("test", 200)
    assert (test["extra_text_columns"]["level"] >= 0).all()


def test_generic_captions_drawn_window_by_window_are_those_of_one_piece() -> None:
    """Unblocked worlds are written a window at a time (:mod:`asymvlm.synthetic.stream`): the
    generic stream's windows hold the numbers of the one-piece draw."""
    world = SyntheticWorld(small_world_config(generic_captions=0.1, caption_words=True))
    one = world.sample_split("train", 1200)
    pieces = concat_splits(
        [piece for _, piece in world.iter_pieces("train", 1200, window_images=300)]
    )
    for key in ("image_embeddings", "text_embeddings", "text_norms"):
        np.testing.assert_array_equal(one[key], pieces[key])
    np.testing.assert_array_equal(
        one["extra_text_columns"]["level"], pieces["extra_text_columns"]["level"]
    )
    assert one["texts"] == pieces["texts"]


def test_generic_captions_in_the_manifest_and_their_range(tmp_path) -> None:
    plain = write_world(str(tmp_path / "plain"), small_world_config())
    assert "generic_captions" not in tables.read_manifest(plain).extra["world"]
    cfg = small_world_config(generic_captions=0.01)
    root = write_world(str(tmp_path / "g"), cfg)
    assert tables.read_manifest(root).extra["world"]["generic_captions"] == 0.01
    assert WorldConfig.from_manifest(root) == cfg
    levels = tables.read_split(root, "train").extra_text_columns["level"]
    assert GENERIC_LEVEL in set(np.asarray(levels).tolist())
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="generic_captions"):
            small_world_config(generic_captions=bad)


# -- far negatives -------------------------------------------------------------------------------
def test_far_negatives_contain_no_positive_concept(tmp_path) -> None:
    """The far negatives' classes sit under level-0 concepts that hold no positive class; their
    images are nearest to those level-0 concepts; the sibling negatives share roots with the
    positives."""
    cfg = replace(PRESETS["demo"], splits={"train": 10})
    world = SyntheticWorld(cfg)
    sets = write_classification_sets(
        str(tmp_path / "w"), cfg, ClassificationSpec(positives=200, negatives=300)
    )
    info = {r: tables.read_manifest(sets[r]).extra["classification"] for r in sets}
    level = info["positives"]["level"]
    roots = {
        r: set(concept_roots(world, level, np.asarray(info[r]["concepts"])).tolist()) for r in sets
    }
    far = set(info["far-negatives"]["concepts"])
    assert far and not far & set(info["positives"]["concepts"])
    assert not roots["far-negatives"] & roots["positives"]
    assert roots["negatives"] <= roots["positives"]  # siblings, in the demo's world
    # 4 fine-tuning roots all hold a positive class: the far ones are the 2 zero-shot roots.
    assert roots["far-negatives"] == {4, 5}
    data = load_classification(sets["far-negatives"], "test")
    assert data.image_emb.shape == (300, cfg.dim)
    nearest_root = (data.image_emb.double().numpy() @ world.concepts[0].T).argmax(1)
    assert np.isin(nearest_root, sorted(roots["far-negatives"])).mean() > 0.9


# -- the forgetting regime (F) and the mechanism of U ---------------------------------------------
def test_the_presets_frozen_encoder_is_well_aligned_on_the_zeroshot_domain(tmp_path) -> None:
    """F: without the shared rotation the frozen model classifies the zero-shot domain well
    (measured 0.964), so fine-tuning can only lose accuracy there; with the old shared rotation
    (1 rad) it could gain (frozen 0.38)."""
    frozen = build_method("clip", 32)
    accuracy = {}
    for mis in (0.0, 1.0):
        cfg = replace(PRESETS["demo"], splits={"train": 10}, misalignment=mis)
        sets = write_classification_sets(str(tmp_path / f"m{mis}"), cfg, ClassificationSpec())
        data = load_classification(sets["zeroshot"], "test")
        accuracy[mis] = zero_shot_accuracy(
            frozen, data.image_emb, data.labels, data.class_prompts("unit")
        )
    assert accuracy[0.0] > 0.9 and accuracy[1.0] < 0.5, accuracy


def test_generic_captions_give_the_dummy_prompts_a_low_kappa(tmp_path, one_thread) -> None:
    """The mechanism of U, read off a trained adapter (the demo's world and training, seed 0):
    with the presets' generic captions, generic captions and every dummy prompt get a lower kappa
    (a broader distribution) than the class prompts; without them (G) the ReLU adapter
    extrapolates and a dummy prompt gets a higher kappa than the class prompts."""
    groups = {}
    for p in (PRESETS["demo"].generic_captions, 0.0):
        cfg = replace(PRESETS["demo"], generic_captions=p)
        root = write_world(str(tmp_path / f"p{p}"), cfg)
        sets = write_classification_sets(root, cfg, ClassificationSpec(positives=50, negatives=50))
        train_cfg = TrainConfig(
            method="asymvlm-vmf",
            epochs=12,
            lr=2e-3,
            optimizer="adamw",
            batch_size=256,
            hidden_dim=128,
            seed=0,
            device="cpu",
        )
        torch.manual_seed(0)
        method, _ = train(root, "train", train_cfg, output=None, progress=False)
        groups[p] = kappa_by_group(method, root, sets["positives"])
    with_generic, without = groups[PRESETS["demo"].generic_captions], groups[0.0]
    dummies = [f'dummy "{t}"' for t in DUMMY_PROMPTS]
    assert with_generic["level -1"] < with_generic["class prompts"] - 2, with_generic
    assert max(with_generic[d] for d in dummies) < with_generic["class prompts"] - 2, with_generic
    assert "level -1" not in without
    assert max(without[d] for d in dummies) > without["class prompts"] + 2, without


def test_the_cli_sets_generic_captions_and_misalignment(tmp_path, capsys) -> None:
    from asymvlm.synthetic import main

    flags = "--preset demo --generic-captions 0.02 --misalignment 0.3 --train-images 50"
    assert main(["--output", str(tmp_path / "w"), *flags.split(), "--test-images", "10"]) == 0
    cfg = WorldConfig.from_manifest(str(tmp_path / "w"))
    assert (cfg.generic_captions, cfg.misalignment) == (0.02, 0.3)
    assert PRESETS["demo"].generic_captions == 0.004 and PRESETS["demo"].misalignment == 0.0
    assert main(["--output", str(tmp_path / "x"), "--generic-captions", "2"]) == 2
    assert "generic_captions" in capsys.readouterr().err
