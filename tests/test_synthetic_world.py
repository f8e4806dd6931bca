"""The synthetic world (:mod:`asymvlm.synthetic`): tables, knobs, classification sets, CLI."""

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
from asymvlm.runner import train
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
from asymvlm.synthetic import world as world_module
from asymvlm.synthetic.caption_texts import GENERIC_TEXTS
from asymvlm.synthetic.classification_sets import concept_roots
from asymvlm.synthetic.world import GENERIC_LEVEL, _unit
from asymvlm.training import TrainConfig
from tests.helpers import small_world_config
from tests.world_fingerprint import OLD_WORLDS, RECORDED, compare, fingerprint_world


@pytest.mark.parametrize("name", sorted(OLD_WORLDS))
def test_worlds_of_the_old_knobs_are_those_the_old_code_wrote(name, tmp_path) -> None:
    """Every table and manifest; the far negatives are the one set written beside them."""
    with open(RECORDED) as fh:
        want = json.load(fh)[name]
    got = fingerprint_world(name, str(tmp_path))
    assert set(got) - set(want) <= {"far-negatives"}
    assert compare({role: got[role] for role in want}, want) == []


def test_generic_captions_replace_a_share_of_the_train_captions() -> None:
    """A share p (within 4 SE) become generic captions at the root; all else is unchanged."""
    p, knobs = 0.05, dict(block_images=300, finetune_roots=4, domain_misalignment=0.5)
    cfg = small_world_config(splits={"train": 2000}, caption_words=True, **knobs)
    world = SyntheticWorld(replace(cfg, generic_captions=p))
    plain, got = SyntheticWorld(cfg).sample_split("train", 2000), world.sample_split("train", 2000)
    generic = got["extra_text_columns"]["level"] == GENERIC_LEVEL
    assert abs(generic.mean() - p) < 4 * math.sqrt(p * (1 - p) / len(generic)), generic.mean()
    assert {got["texts"][i] for i in np.flatnonzero(generic)} <= set(GENERIC_TEXTS)
    meaning = got["text_embeddings"].astype(np.float64) @ world.text_rotation @ world.generic
    assert meaning[generic].min() > 0.95 and np.median(meaning[~generic]) < 0.6
    for key in ("image_embeddings", "text_norms"):
        np.testing.assert_array_equal(got[key], plain[key])
    for key in ("text_embeddings", "texts"):  # the other captions as they were
        np.testing.assert_array_equal(np.array(got[key])[~generic], np.array(plain[key])[~generic])


def test_knobs_are_recorded_when_set_and_later_ones_leave_the_world_alone(tmp_path) -> None:
    plain = write_world(str(tmp_path / "plain"), small_world_config())
    later = {"block_images", "caption_words", "pre_dim", "level_probs", "generic_captions"}
    assert not later & set(tables.read_manifest(plain).extra["world"])
    assert WorldConfig.from_manifest(plain) == small_world_config()
    cfg = small_world_config(
        caption_words=True, generic_captions=0.2, level_probs=[0.1, 0.2, 0.3, 0.4]
    )
    root = write_world(str(tmp_path / "g"), cfg)
    world = tables.read_manifest(root).extra["world"]
    assert (world["generic_captions"], world["level_probs"]) == (0.2, [0.1, 0.2, 0.3, 0.4])
    assert WorldConfig.from_manifest(root) == cfg and cfg.level_probs == (0.1, 0.2, 0.3, 0.4)
    assert GENERIC_LEVEL in tables.read_split(root, "train").extra_text_columns["level"]
    assert (tables.read_split(root, "test").extra_text_columns["level"] >= 0).all()
    words = write_world(str(tmp_path / "words"), small_world_config(caption_words=True))
    a, b = tables.read_split(plain, "train"), tables.read_split(words, "train")
    np.testing.assert_array_equal(a.text_embeddings, b.text_embeddings)
    np.testing.assert_array_equal(a.image_embeddings, b.image_embeddings)
    assert a.texts != b.texts
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="generic_captions"):
            small_world_config(generic_captions=bad)


def test_far_negatives_contain_no_positive_concept(tmp_path) -> None:
    """Far negatives sit under the roots holding no positive class; sibling negatives do not."""
    cfg = replace(PRESETS["demo"], splits={"train": 10})
    world = SyntheticWorld(cfg)
    spec = ClassificationSpec(positives=50, negatives=200, zeroshot=20)
    sets = write_classification_sets(str(tmp_path / "w"), cfg, spec)
    info = {r: tables.read_manifest(sets[r]).extra["classification"] for r in sets}
    level = info["positives"]["level"]
    roots = {
        r: set(concept_roots(world, level, np.asarray(info[r]["concepts"])).tolist()) for r in sets
    }
    assert not set(info["far-negatives"]["concepts"]) & set(info["positives"]["concepts"])
    assert roots["far-negatives"] == {4, 5} and roots["negatives"] <= roots["positives"]
    data = load_classification(sets["far-negatives"], "test")
    nearest_root = (data.image_emb.double().numpy() @ world.concepts[0].T).argmax(1)
    assert np.isin(nearest_root, [4, 5]).mean() > 0.9


def test_the_presets_frozen_encoder_is_well_aligned_on_the_zeroshot_domain(tmp_path) -> None:
    """F: without the shared rotation the frozen model is good on the zero-shot domain."""
    accuracy = {}
    for mis in (0.0, 1.0):
        cfg = replace(PRESETS["demo"], splits={"train": 10}, misalignment=mis)
        spec = ClassificationSpec(positives=20, negatives=20, zeroshot=300)
        sets = write_classification_sets(str(tmp_path / f"m{mis}"), cfg, spec)
        data = load_classification(sets["zeroshot"], "test")
        clip, prompts = build_method("clip", 32), data.class_prompts("unit")
        accuracy[mis] = zero_shot_accuracy(clip, data.image_emb, data.labels, prompts)
    assert accuracy[0.0] > 0.9 and accuracy[1.0] < 0.5, accuracy


def test_generic_captions_give_the_dummy_prompts_a_low_kappa(tmp_path, one_thread) -> None:
    """U: generic captions lower the dummy prompts' kappa below the class prompts' (G: above)."""
    groups = {}
    for p in (PRESETS["demo"].generic_captions, 0.0):
        cfg = replace(PRESETS["demo"], generic_captions=p)
        root = write_world(str(tmp_path / f"p{p}"), cfg)
        sets = write_classification_sets(root, cfg, ClassificationSpec(positives=50, negatives=50))
        kw = dict(method="asymvlm-vmf", epochs=12, lr=2e-3, optimizer="adamw", batch_size=256)
        train_cfg = TrainConfig(**kw, hidden_dim=128, device="cpu")
        torch.manual_seed(0)
        method, _ = train(root, "train", train_cfg, output=None, progress=False)
        groups[p] = kappa_by_group(method, root, sets["positives"])
    with_generic, without = groups[PRESETS["demo"].generic_captions], groups[0.0]
    dummies = [f'dummy "{t}"' for t in DUMMY_PROMPTS]
    assert with_generic["level -1"] < with_generic["class prompts"] - 2, with_generic
    assert max(with_generic[d] for d in dummies) < with_generic["class prompts"] - 2, with_generic
    assert "level -1" not in without
    assert max(without[d] for d in dummies) > without["class prompts"] + 2, without


def test_level_probs_set_the_level_frequencies() -> None:
    """Level frequencies within 4 SE of their probabilities; images as in the uniform world."""
    knobs = {"splits": {"train": 4000}, "captions_per_image": 5}
    mixed = SyntheticWorld(small_world_config(**knobs, level_probs=COCO_LEVEL_PROBS))
    got = mixed.sample_split("train", 4000)
    base = SyntheticWorld(small_world_config(**knobs)).sample_split("train", 4000)
    n, p = 20_000, np.asarray(COCO_LEVEL_PROBS)
    for levels, want in (
        (got["extra_text_columns"]["level"], p),
        (base["extra_text_columns"]["level"], 0.25),
    ):
        freq = np.bincount(levels, minlength=4) / n
        assert np.all(np.abs(freq - want) < 4 * np.sqrt(want * (1 - want) / n)), freq
    np.testing.assert_array_equal(got["image_embeddings"], base["image_embeddings"])
    # Images without a detailed caption of their own: 0.5^5 ~ 3 % (uniform: 0.75^5 ~ 24 %).
    detailed = (got["extra_text_columns"]["level"] == 3).reshape(4000, 5).any(axis=1)
    assert abs((1 - detailed.mean()) - 0.5**5) < 0.012


def test_a_blocked_world_is_written_in_whole_blocks_per_part(tmp_path) -> None:
    """Parts of whole blocks read back as the one-part tables and as the split drawn in memory."""
    cfg = small_world_config(block_images=64, caption_words=True, pre_dim=24, splits={"train": 500})
    one = write_world(str(tmp_path / "one"), cfg, shard_images=10_000)
    many = write_world(str(tmp_path / "many"), cfg, shard_images=128)
    parts = sorted(p.name for p in (tmp_path / "many" / "train" / "texts").iterdir())
    assert parts == [f"part-{k:05d}.parquet" for k in range(4)]  # 128, 128, 128, 116 images
    a, b = tables.read_split(one, "train"), tables.read_split(many, "train")
    assert (a.image_ids, a.caption_ids, a.texts) == (b.image_ids, b.caption_ids, b.texts)
    for key in ("image_embeddings", "text_embeddings", "text_features_pre", "image_norms"):
        np.testing.assert_array_equal(getattr(a, key), getattr(b, key), err_msg=key)
    whole = SyntheticWorld(cfg).sample_split("train", 500)
    np.testing.assert_array_equal(whole["text_embeddings"], b.text_embeddings)
    assert b.image_ids[64] == "train-img000064" and len(set(b.image_ids)) == 500
    assert not np.array_equal(b.image_embeddings[:64], b.image_embeddings[64:128])
    unblocked = write_world(str(tmp_path / "u"), replace(cfg, block_images=None), shard_images=128)
    assert len(list((tmp_path / "u" / "train" / "texts").iterdir())) == 1
    assert tables.read_split(unblocked, "train").n_images == 500


@pytest.mark.parametrize("block_images", [250, None])
def test_writing_a_world_bounds_peak_memory(block_images, tmp_path, monkeypatch) -> None:
    """tracemalloc: drawn in blocks or in windows, the writer's peak does not grow with the
    split (beyond the whole split's small draws, ~100 bytes an image)."""
    monkeypatch.setattr(world_module, "WINDOW_IMAGES", 250)
    write_world(str(tmp_path / "warm"), WorldConfig(dim=64, splits={"train": 300}))  # imports
    peaks = {}
    for n in (1500, 3000):
        cfg = WorldConfig(dim=64, splits={"train": n}, block_images=block_images)
        tracemalloc.start()
        write_world(str(tmp_path / f"{n}"), cfg, shard_images=500)
        peaks[n] = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    assert peaks[3000] < 1.1 * peaks[1500] and peaks[3000] < 6, peaks


@pytest.mark.parametrize("block_images", [None, 40])
def test_a_split_drawn_window_by_window_is_the_one_piece_draw(block_images, monkeypatch) -> None:
    """Every phase of every stream (pre-projection, words, generic captions, domains) gives the
    same numbers drawn in windows of 7 images as in one piece."""
    knobs = dict(pre_dim=24, caption_words=True, generic_captions=0.2, finetune_roots=4)
    knobs |= dict(domain_misalignment=0.5, level_probs=COCO_LEVEL_PROBS)
    cfg = small_world_config(splits={"train": 100}, block_images=block_images, **knobs)
    whole = SyntheticWorld(cfg).sample_split("train", 100)
    monkeypatch.setattr(world_module, "WINDOW_IMAGES", 7)
    windows = SyntheticWorld(cfg).sample_split("train", 100)
    levels = whole.pop("extra_text_columns")["level"]
    assert (levels == GENERIC_LEVEL).any()
    np.testing.assert_array_equal(windows.pop("extra_text_columns")["level"], levels)
    for key, value in whole.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_allclose(windows[key], value, rtol=1e-6, atol=1e-7, err_msg=key)
        else:
            assert windows[key] == value, key


def test_word_counts_follow_the_level_with_noise() -> None:
    s = SyntheticWorld(WorldConfig(dim=16, caption_words=True)).sample_split("test", 1500)
    words = np.array([len(t.split()) for t in s["texts"]])
    level = s["extra_text_columns"]["level"]
    assert 0.4 < stats.spearmanr(words, level).statistic < 0.75
    means = [words[level == k].mean() for k in range(4)]
    assert all(b - a == pytest.approx(1.0, abs=0.2) for a, b in zip(means, means[1:], strict=False))
    tags = SyntheticWorld(WorldConfig(dim=16)).sample_split("test", 300)  # tag captions
    tag_words = np.array([len(t.split()) for t in tags["texts"]])
    assert all(len(set(tag_words[tags["extra_text_columns"]["level"] == k])) == 1 for k in range(4))


@pytest.fixture(scope="module")
def class_sets(tmp_path_factory) -> tuple[WorldConfig, dict[str, str]]:
    cfg = small_world_config(dim=32, finetune_roots=4, domain_misalignment=0.5)
    root = write_world(str(tmp_path_factory.mktemp("classes") / "world"), cfg)
    spec = ClassificationSpec(positives=400, negatives=300, zeroshot=300)
    return cfg, write_classification_sets(root, spec=spec)


def test_classification_sets_validate_and_their_concepts_are_apart(class_sets) -> None:
    cfg, roots = class_sets
    assert tuple(roots) == classification_roles(cfg, ClassificationSpec())  # known beforehand
    assert roots["positives"].endswith("world-positives")
    for role, n in (("positives", 400), ("negatives", 300), ("zeroshot", 300)):
        data = load_classification(roots[role], "test")
        n_classes = len(tables.read_manifest(roots[role]).extra["classification"]["concepts"])
        assert data.image_emb.shape == (n, 32)
        assert sorted(data.labels.unique().tolist()) == list(range(n_classes))
        n_prompts = n_classes * len(ClassificationSpec().templates)
        assert data.class_prompts("raw").inputs.shape[0] == n_prompts
        assert list(data.dummy_inputs("raw")) == list(DUMMY_PROMPTS)
        torch.testing.assert_close(data.image_emb.norm(dim=1), torch.ones(n))
    world = SyntheticWorld(cfg)
    info = {r: tables.read_manifest(roots[r]).extra["classification"] for r in roots}
    pos, neg, away = (set(info[r]["concepts"]) for r in ("positives", "negatives", "zeroshot"))
    # 4 fine-tuning roots x 4 level-1 children: 8 classes, 8 negatives; 2 roots x 4 away.
    assert (len(pos), len(neg), len(away)) == (8, 8, 8) and not pos & neg
    assert {world.root_domain[world.parents[1][c]] for c in pos | neg} == {0}
    assert {world.root_domain[world.parents[1][c]] for c in away} == {1}


def _accuracy(data, rotate: np.ndarray | None = None) -> float:
    """CLIP's prompt-ensemble accuracy; ``rotate`` undoes an encoder error on the prompts."""
    p = data.class_prompts("unit")
    inputs = p.inputs if rotate is None else (p.inputs.double() @ torch.from_numpy(rotate)).float()
    prompts = ClassPrompts(inputs=inputs, class_index=p.class_index, n_classes=p.n_classes)
    return zero_shot_accuracy(build_method("clip", 32), data.image_emb, data.labels, prompts)


def test_class_prompts_dummies_and_domains_mean_what_they_say(class_sets) -> None:
    """Prompts name their classes; dummies sit at the root; D: the correction is domain-bound."""
    cfg, roots = class_sets
    world = SyntheticWorld(cfg)
    pos = load_classification(roots["positives"], "test")
    oracle, frozen = _accuracy(pos, world.text_map(0)), _accuracy(pos)
    assert oracle > 0.9 and 1.5 / 8 < frozen < oracle - 0.2, (oracle, frozen)
    rows = pos.prompt_class < 0
    unit = pos.prompt_inputs("unit").numpy() @ world.text_rotation
    to_root = unit @ world.generic
    assert to_root[rows].min() > 0.95 and to_root[rows].min() > to_root[~rows].max()
    assert (unit[rows] @ world.concepts[0].T).std(axis=1).max() < 0.1
    x = _unit(np.random.default_rng(0).standard_normal((2000, 32)))

    def cosines(world: SyntheticWorld, domain: int) -> tuple[float, float]:
        y = world.encode_text(x, domain)
        return np.sum(y * x, 1).mean(), np.sum((y @ world.text_map(0)) * x, 1).mean()

    (f0, t0), (f1, t1) = cosines(world, 0), cosines(world, 1)  # shared 1.0 rad, own 0.5 rad
    assert t0 == pytest.approx(1.0) and 0.4 < f0 < 0.55 and 0.4 < f1 < 0.55 and f1 + 0.2 < t1 < 0.9
    knobs = dict(dim=32, finetune_roots=4, misalignment=0.3, domain_misalignment=1.0)
    f1, t1 = cosines(SyntheticWorld(small_world_config(**knobs)), 1)
    assert t1 < f1 - 0.1
    away = load_classification(roots["zeroshot"], "test")
    accuracy = [_accuracy(away, r) for r in (None, world.text_map(0), world.text_map(1))]
    assert accuracy == sorted(accuracy) and len(set(accuracy)) == 3, accuracy


def test_a_world_with_one_domain_shows_every_concept_and_has_no_zeroshot_set(tmp_path) -> None:
    root = write_world(str(tmp_path / "w"), small_world_config())
    out = write_classification_sets(root, spec=ClassificationSpec(positives=50, negatives=50))
    assert "zeroshot" not in out and {"positives", "negatives"} <= set(out)
    with pytest.raises(ValueError, match="n_classes"):
        write_classification_sets(root, spec=ClassificationSpec(n_classes=24))
    s = SyntheticWorld(small_world_config(finetune_roots=2)).sample_split("train", 400)
    assert {int(t.split("of c")[1].split()[0]) for t in s["texts"]} == {0, 1}


def test_presets() -> None:
    coco = WorldConfig.preset("coco")
    assert (coco.dim, coco.splits["train"], coco.captions_per_image) == (512, 118_287, 5)
    assert PRESETS["demo"].level_probs == coco.level_probs == (0.05, 0.15, 0.30, 0.50)
    demo = WorldConfig.preset("demo", seed=3)
    assert demo.seed == 3 and PRESETS["demo"].seed == 0
    splits = {"train": 1500, "val": 300, "test": 300}
    assert (demo.dim, demo.captions_per_image, demo.splits) == (32, 4, splits)
    assert (demo.generic_captions, demo.misalignment) == (0.004, 0.0)
    with pytest.raises(ValueError, match="unknown world preset"):
        WorldConfig.preset("imagenet")


def test_the_cli_writes_a_preset_its_knobs_and_its_sets(tmp_path, capsys) -> None:
    flags = "--preset demo --generic-captions 0.02 --misalignment 0.3 --train-images 50"
    flags += " --classes --class-images 30"
    assert main(["--output", str(tmp_path / "w"), *flags.split()]) == 0
    assert "wrote positives" in capsys.readouterr().out
    cfg = WorldConfig.from_manifest(str(tmp_path / "w"))
    knobs = (cfg.generic_captions, cfg.misalignment, cfg.level_probs)
    assert knobs == (0.02, 0.3, COCO_LEVEL_PROBS)
    assert tables.read_split(str(tmp_path / "w"), "train").n_texts == 200
    main(["--output", str(tmp_path / "w"), "--only-classes", "--class-images", "20"])
    assert load_classification(str(tmp_path / "w-positives"), "test").labels.shape == (20,)
    flags = "--preset demo --level-probs uniform --train-images 10"
    main(["--output", str(tmp_path / "u"), *flags.split()])
    assert WorldConfig.from_manifest(str(tmp_path / "u")).level_probs is None
    assert main(["--output", str(tmp_path / "x"), "--level-probs", "0.5,0.6,0,0"]) == 2
    assert main(["--output", str(tmp_path / "x"), "--generic-captions", "2"]) == 2
    err = capsys.readouterr().err
    assert "sum to 1" in err and "generic_captions" in err
