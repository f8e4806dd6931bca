"""The synthetic world's tables: worlds of the old knobs byte-identical to the recorded ones,
later features on streams of their own, blocked (sharded) writing, word and generic captions,
classification sets, domains, presets and the CLI (:mod:`asymvlm.synthetic`)."""

from __future__ import annotations

import json
import math
import tracemalloc
from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy import stats

from asymvlm import tables
from asymvlm.evaluation.kappa_groups import kappa_by_group
from asymvlm.evaluation.suite import load_classification
from asymvlm.evaluation.zeroshot import ClassPrompts, zero_shot_accuracy
from asymvlm.methods import build_method
from asymvlm.protocol import train
from asymvlm.synthetic import (
    COCO_LEVEL_PROBS,
    DUMMY_PROMPTS,
    PRESETS,
    ClassificationSpec,
    SyntheticWorld,
    WorldConfig,
    classification_roles,
    main,
    write_classification_sets,
    write_world,
)
from asymvlm.synthetic.captions import GENERIC_TEXTS
from asymvlm.synthetic.classes import concept_roots
from asymvlm.synthetic.world import GENERIC_LEVEL, _unit
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


def test_generic_captions_replace_a_share_of_the_train_captions() -> None:
    """A share p of the captions (within 4 standard errors) become generic: level -1, a text of
    GENERIC_TEXTS, meaning the hierarchy's root (after the shared encoder error is undone); every
    other caption, every image and every norm is that of the world without them."""
    p = 0.05
    world, plain, got = _pair(p, **_DEMO_LIKE)
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


def test_knobs_are_recorded_in_the_manifest_and_checked(tmp_path) -> None:
    """generic_captions (the train split only) and level_probs: recorded when set and read
    back; out of range refused."""
    plain = write_world(str(tmp_path / "plain"), small_world_config())
    assert not {"generic_captions", "level_probs"} & set(tables.read_manifest(plain).extra["world"])
    cfg = small_world_config(generic_captions=0.2, level_probs=[0.1, 0.2, 0.3, 0.4])
    assert cfg.level_probs == (0.1, 0.2, 0.3, 0.4) and WorldConfig().level_probs is None
    root = write_world(str(tmp_path / "g"), cfg)
    world = tables.read_manifest(root).extra["world"]
    assert (world["generic_captions"], world["level_probs"]) == (0.2, [0.1, 0.2, 0.3, 0.4])
    assert WorldConfig.from_manifest(root) == cfg
    assert GENERIC_LEVEL in tables.read_split(root, "train").extra_text_columns["level"]
    assert (tables.read_split(root, "test").extra_text_columns["level"] >= 0).all()
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
    flags = "--preset demo --generic-captions 0.02 --misalignment 0.3 --train-images 50"
    assert main(["--output", str(tmp_path / "w"), *flags.split(), "--test-images", "10"]) == 0
    cfg = WorldConfig.from_manifest(str(tmp_path / "w"))
    assert (cfg.generic_captions, cfg.misalignment) == (0.02, 0.3)
    assert PRESETS["demo"].generic_captions == 0.004 and PRESETS["demo"].misalignment == 0.0
    assert main(["--output", str(tmp_path / "x"), "--generic-captions", "2"]) == 2
    assert "generic_captions" in capsys.readouterr().err


# -- later features ------------------------------------------------------------------------------
def test_later_features_leave_todays_outputs_and_manifest_alone(tmp_path) -> None:
    """Word captions, domain rotations and classification sets draw from streams of their own:
    with them off the manifest has no new key; with words on, only the text column changes."""
    plain = write_world(str(tmp_path / "plain"), small_world_config())
    world = tables.read_manifest(plain).extra["world"]
    assert not {
        "block_images",
        "caption_words",
        "finetune_roots",
        "domain_misalignment",
        "filler_words",
        "pre_dim",
        "level_probs",
    } & set(world)
    assert WorldConfig.from_manifest(plain) == small_world_config()
    words = write_world(str(tmp_path / "words"), small_world_config(caption_words=True))
    a, b = tables.read_split(plain, "train"), tables.read_split(words, "train")
    np.testing.assert_array_equal(a.text_embeddings, b.text_embeddings)
    np.testing.assert_array_equal(a.image_embeddings, b.image_embeddings)
    assert a.texts != b.texts
    written = write_classification_sets(plain)
    assert tuple(written) == classification_roles(small_world_config(), ClassificationSpec())
    c = tables.read_split(plain, "train")
    np.testing.assert_array_equal(a.text_embeddings, c.text_embeddings)


# -- caption-level mix ---------------------------------------------------------------------------
def test_level_probs_set_the_level_frequencies() -> None:
    """The COCO-like mix: each level's frequency within 4 standard errors of its probability
    (20,000 captions), and a chi-square test does not reject it; images and objects come before
    the levels in the stream, so they are those of the uniform world."""
    knobs = {"splits": {"train": 4000}, "captions_per_image": 5}
    mixed = SyntheticWorld(small_world_config(**knobs, level_probs=COCO_LEVEL_PROBS))
    plain = SyntheticWorld(small_world_config(**knobs))
    got, base = mixed.sample_split("train", 4000), plain.sample_split("train", 4000)
    levels = got["extra_text_columns"]["level"]
    n = len(levels)
    assert n == 20_000
    p = np.asarray(COCO_LEVEL_PROBS)
    freq = np.bincount(levels, minlength=4) / n
    assert np.all(np.abs(freq - p) < 4 * np.sqrt(p * (1 - p) / n)), freq
    assert stats.chisquare(np.bincount(levels, minlength=4), p * n).pvalue > 1e-3
    # The uniform world's levels are uniform (the same test), and differ from the mix.
    base_freq = np.bincount(base["extra_text_columns"]["level"], minlength=4) / n
    assert np.all(np.abs(base_freq - 0.25) < 4 * np.sqrt(0.25 * 0.75 / n)), base_freq
    np.testing.assert_array_equal(got["image_embeddings"], base["image_embeddings"])
    # Images without a detailed caption of their own: 0.5^5 ~ 3 % (uniform: 0.75^5 ~ 24 %).
    detailed = (levels == 3).reshape(4000, 5).any(axis=1)
    assert abs((1 - detailed.mean()) - 0.5**5) < 0.012


# -- blocks and parts ----------------------------------------------------------------------------
def _columns(root: str, split: str) -> dict:
    s = tables.read_split(root, split)
    return {
        "image_ids": s.image_ids,
        "caption_ids": s.caption_ids,
        "texts": s.texts,
        "img": s.image_embeddings,
        "txt": s.text_embeddings,
        "norm": s.text_norms,
        "level": s.extra_text_columns["level"],
    }


def _assert_same(a: dict, b: dict) -> None:
    for key in a:
        if isinstance(a[key], np.ndarray):
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
        else:
            assert list(a[key]) == list(b[key]), key


@pytest.mark.parametrize("block", [None, 64])
def test_sharded_writing_gives_the_tables_of_one_piece(tmp_path, block) -> None:
    cfg = small_world_config(
        block_images=block, caption_words=True, pre_dim=24, splits={"train": 500, "test": 130}
    )
    one = write_world(str(tmp_path / "one"), cfg, shard_images=10_000)
    many = write_world(str(tmp_path / "many"), cfg, shard_images=128)
    parts = sorted(p.name for p in (tmp_path / "many" / "train" / "texts").iterdir())
    assert parts == [f"part-{k:05d}.parquet" for k in range(4)]  # 128, 128, 128, 116 images
    assert len(list((tmp_path / "one" / "train" / "texts").iterdir())) == 1
    for split in ("train", "test"):
        _assert_same(_columns(one, split), _columns(many, split))
        a, b = tables.read_split(one, split), tables.read_split(many, split)
        np.testing.assert_array_equal(a.text_features_pre, b.text_features_pre)
        np.testing.assert_array_equal(a.image_norms, b.image_norms)
    whole = SyntheticWorld(cfg).sample_split("train", 500)
    np.testing.assert_array_equal(
        whole["text_embeddings"], tables.read_split(many, "train").text_embeddings
    )


def test_a_blocked_world_has_the_structure_of_the_unblocked_one() -> None:
    """Blocks are other draws of the same process: same level balance, ids run on."""
    cfg = small_world_config(block_images=100, splits={"train": 1000})
    s = SyntheticWorld(cfg).sample_split("train", 1000)
    assert s["image_ids"][100] == "train-img000100" and len(set(s["image_ids"])) == 1000
    levels = s["extra_text_columns"]["level"]
    assert np.all(np.abs(np.bincount(levels) / len(levels) - 0.25) < 0.04)
    blocks = s["image_embeddings"].reshape(10, 100, -1)
    assert not np.array_equal(blocks[0], blocks[1])


def test_writing_a_blocked_world_bounds_peak_memory(tmp_path) -> None:
    """tracemalloc (numpy's allocations): drawn in blocks, the writer's peak stays near one
    block and does not grow with the split."""
    write_world(str(tmp_path / "warm"), WorldConfig(dim=64, splits={"train": 300}))  # imports
    peaks = {}
    for n in (1500, 3000):
        cfg = WorldConfig(dim=64, splits={"train": n}, block_images=250)
        tracemalloc.start()
        write_world(str(tmp_path / f"{n}"), cfg, shard_images=500)
        peaks[n] = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    assert peaks[3000] < 1.3 * peaks[1500] and peaks[3000] < 12, peaks


# -- word captions -------------------------------------------------------------------------------
def test_word_counts_follow_the_level_with_noise() -> None:
    cfg = WorldConfig(dim=16, splits={"test": 1500}, caption_words=True)
    s = SyntheticWorld(cfg).sample_split("test", 1500)
    words = np.array([len(t.split()) for t in s["texts"]])
    level = s["extra_text_columns"]["level"]
    rho = stats.spearmanr(words, level).statistic
    assert 0.4 < rho < 0.75, rho
    means = [words[level == k].mean() for k in range(4)]
    assert all(b - a == pytest.approx(1.0, abs=0.2) for a, b in zip(means, means[1:], strict=False))
    # Tag captions: the word count is a function of the level.
    tags = SyntheticWorld(WorldConfig(dim=16, splits={"test": 300})).sample_split("test", 300)
    tag_words = np.array([len(t.split()) for t in tags["texts"]])
    tag_level = tags["extra_text_columns"]["level"]
    assert all(len(set(tag_words[tag_level == k])) == 1 for k in range(4))
    # An uncertainty that is exactly the abstraction: perfect with levels, not with words.
    unc = -level.astype(float)
    assert stats.spearmanr(-words, unc).statistic == pytest.approx(rho)


# -- classification sets -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def class_sets(tmp_path_factory) -> tuple[WorldConfig, dict[str, str]]:
    cfg = small_world_config(dim=32, finetune_roots=4, domain_misalignment=0.5)
    root = write_world(str(tmp_path_factory.mktemp("classes") / "world"), cfg)
    spec = ClassificationSpec(positives=400, negatives=300, zeroshot=300)
    return cfg, write_classification_sets(root, spec=spec)


def test_classification_sets_validate_through_the_readers(class_sets) -> None:
    cfg, roots = class_sets
    assert set(roots) == {"positives", "negatives", "zeroshot", "far-negatives"}
    assert tuple(roots) == classification_roles(cfg, ClassificationSpec())  # known beforehand
    assert roots["positives"].endswith("world-positives")
    n_templates = len(ClassificationSpec().templates)
    for role, n in (("positives", 400), ("negatives", 300), ("zeroshot", 300)):
        data = load_classification(roots[role], "test")
        manifest = tables.read_manifest(roots[role])
        n_classes = len(manifest.extra["classification"]["concepts"])
        assert data.image_emb.shape == (n, 32) and manifest.dim == 32
        assert sorted(data.labels.unique().tolist()) == list(range(n_classes))
        prompts = data.class_prompts("raw")
        assert prompts.n_classes == n_classes
        assert prompts.inputs.shape[0] == n_classes * n_templates
        assert list(data.dummy_inputs("raw")) == list(DUMMY_PROMPTS)
        torch.testing.assert_close(data.image_emb.norm(dim=1), torch.ones(n))


def test_negatives_are_of_concepts_outside_the_positives(class_sets) -> None:
    cfg, roots = class_sets
    world = SyntheticWorld(cfg)
    info = {r: tables.read_manifest(roots[r]).extra["classification"] for r in roots}
    pos, neg, away = (set(info[r]["concepts"]) for r in ("positives", "negatives", "zeroshot"))
    assert pos and neg and not pos & neg and not (pos | neg) & away
    # 4 fine-tuning roots x 4 level-1 children: 8 classes, 8 negatives; 2 roots x 4 away.
    assert (len(pos), len(neg), len(away)) == (8, 8, 8)
    root_of = world.parents[1]
    assert all(world.root_domain[root_of[c]] == 0 for c in pos | neg)
    assert all(world.root_domain[root_of[c]] == 1 for c in away)


def _accuracy(data, rotate: np.ndarray | None = None) -> float:
    """CLIP's prompt-ensemble accuracy; ``rotate`` undoes an encoder error on the prompts."""
    p = data.class_prompts("unit")
    inputs = (
        p.inputs
        if rotate is None
        else torch.as_tensor(p.inputs.numpy() @ rotate, dtype=torch.float32)
    )
    prompts = ClassPrompts(inputs=inputs, class_index=p.class_index, n_classes=p.n_classes)
    return zero_shot_accuracy(build_method("clip", 32), data.image_emb, data.labels, prompts)


def test_class_prompts_and_dummies_mean_what_they_say(class_sets) -> None:
    cfg, roots = class_sets
    world = SyntheticWorld(cfg)
    pos = load_classification(roots["positives"], "test")
    n_classes = int(pos.labels.max()) + 1
    # With the encoder's error undone, the prompts name their classes: high accuracy; frozen
    # (misaligned) CLIP is far worse but above chance.
    oracle = _accuracy(pos, world.text_map(0))
    frozen = _accuracy(pos)
    assert oracle > 0.9 and 1.5 / n_classes < frozen < oracle - 0.2, (oracle, frozen)
    # Dummies: after the shared error is undone, closer to the hierarchy's root than any class
    # prompt is, and about as close to every level-0 concept.
    rows = pos.prompt_class < 0
    unit = pos.prompt_inputs("unit").numpy() @ world.text_rotation
    to_root = unit @ world.generic
    assert to_root[rows].min() > 0.95 and to_root[rows].min() > to_root[~rows].max()
    to_concepts = unit[rows] @ world.concepts[0].T
    assert to_concepts.std(axis=1).max() < 0.1


def test_domain_shift_statistics(class_sets) -> None:
    """Assumption D in numbers: the fine-tuning domain's ideal correction is exact there and
    partial on the zero-shot domain; with a larger domain part it makes things worse."""
    cfg, roots = class_sets
    x = _unit(np.random.default_rng(0).standard_normal((2000, 32)))

    def cosines(world: SyntheticWorld, domain: int) -> tuple[float, float]:
        y = world.encode_text(x, domain)
        frozen = float(np.mean(np.sum(y * x, 1)))
        tuned = float(np.mean(np.sum((y @ world.text_map(0)) * x, 1)))
        return frozen, tuned

    world = SyntheticWorld(cfg)  # shared 1.0 rad, own 0.5 rad
    f0, t0 = cosines(world, 0)
    f1, t1 = cosines(world, 1)
    assert t0 == pytest.approx(1.0) and 0.4 < f0 < 0.55 and 0.4 < f1 < 0.55
    assert f1 + 0.2 < t1 < 0.9  # helps elsewhere, not fully
    forget = SyntheticWorld(
        small_world_config(dim=32, finetune_roots=4, misalignment=0.3, domain_misalignment=1.0)
    )
    f1, t1 = cosines(forget, 1)
    assert t1 < f1 - 0.1  # fine-tuning's correction hurts the other domain
    # On the zero-shot set: the fine-tuning correction helps CLIP, the exact one helps more.
    away = load_classification(roots["zeroshot"], "test")
    frozen, tuned, exact = (
        _accuracy(away, r) for r in (None, world.text_map(0), world.text_map(1))
    )
    assert frozen < tuned < exact, (frozen, tuned, exact)


def test_a_world_with_one_domain_has_no_zeroshot_set(tmp_path) -> None:
    root = write_world(str(tmp_path / "w"), small_world_config())
    out = write_classification_sets(root, spec=ClassificationSpec(positives=50, negatives=50))
    assert "zeroshot" not in out and {"positives", "negatives"} <= set(out)
    with pytest.raises(ValueError, match="n_classes"):
        write_classification_sets(root, spec=ClassificationSpec(n_classes=24))


# -- domains in the retrieval tables, presets, CLI -----------------------------------------------
def test_finetuning_splits_show_only_the_finetuning_domain() -> None:
    cfg = small_world_config(finetune_roots=2, splits={"train": 400})
    world = SyntheticWorld(cfg)
    s = world.sample_split("train", 400)
    first = [int(t.split("of c")[1].split()[0]) for t in s["texts"]]
    assert set(first) == {0, 1}


def test_presets() -> None:
    coco = WorldConfig.preset("coco")
    assert coco.dim == 512 and coco.splits["train"] == 118_287 and coco.captions_per_image == 5
    assert coco.block_images is not None
    assert PRESETS["demo"].level_probs == coco.level_probs == (0.05, 0.15, 0.30, 0.50)
    demo = WorldConfig.preset("demo", seed=3)
    assert demo.seed == 3 and PRESETS["demo"].seed == 0
    assert (demo.dim, demo.captions_per_image, demo.splits) == (
        32,
        4,
        {"train": 1500, "val": 300, "test": 300},
    )  # the demo's world size
    with pytest.raises(ValueError, match="unknown world preset"):
        WorldConfig.preset("imagenet")


def test_cli_writes_the_demo_preset_and_its_sets(tmp_path, capsys) -> None:
    main(
        ["--output", str(tmp_path / "w"), "--preset", "demo", "--classes", "--class-images", "200"]
    )
    out = capsys.readouterr().out
    assert "wrote positives" in out and "wrote zeroshot" in out
    split = tables.read_split(str(tmp_path / "w"), "train")
    assert split.n_images == 1500 and split.n_texts == 6000
    assert load_classification(str(tmp_path / "w-negatives"), "test").labels.shape == (200,)
    main(["--output", str(tmp_path / "w"), "--only-classes", "--class-images", "20"])
    assert load_classification(str(tmp_path / "w-positives"), "test").labels.shape == (20,)
    assert WorldConfig.from_manifest(str(tmp_path / "w")).level_probs == COCO_LEVEL_PROBS
    main(
        [
            "--output",
            str(tmp_path / "u"),
            "--preset",
            "demo",
            "--level-probs",
            "uniform",
            "--train-images",
            "10",
            "--test-images",
            "5",
        ]
    )
    assert WorldConfig.from_manifest(str(tmp_path / "u")).level_probs is None
    assert main(["--output", str(tmp_path / "x"), "--level-probs", "0.5,0.6,0,0"]) == 2
    assert "sum to 1" in capsys.readouterr().err


def test_the_coco_preset_is_written_in_parts(tmp_path) -> None:
    """The COCO-sized preset (d = 512, drawn in blocks) at a few thousand images: whole blocks
    per part, every row once (memory: test_writing_a_blocked_world_bounds_peak_memory)."""
    import pyarrow.parquet as pq

    cfg = WorldConfig.preset("coco", splits={"train": 3000})
    write_world(str(tmp_path / "coco"), cfg, shard_images=2048)
    texts = sorted((tmp_path / "coco" / "train" / "texts").glob("*.parquet"))
    images = sorted((tmp_path / "coco" / "train" / "images").glob("*.parquet"))
    assert len(texts) == 2
    assert [pq.ParquetFile(f).metadata.num_rows for f in images] == [2048, 952]
    assert sum(pq.ParquetFile(f).metadata.num_rows for f in texts) == 5 * 3000
