"""What a κ filter keeps, on the synthetic world (whose caption generality is known).

    python benchmarks/curate_filter.py [--seeds 0,1,2,3,4] [--images 4000,1000,1000]
                                       [--epochs 12] [--drops 10,30,50] [--preset NAME]

For each seed it writes a synthetic world (:class:`asymvlm.synthetic.WorldConfig`, default
knobs: caption levels 0-3 equally likely, level 0 the most general ("a photo of c3"), level 3
the object's own caption; the level is the world's truth, stored in the captions' ``level``
column), trains asymvlm-vmf on its train split as the demo's sweep does (AdamW, lr 2e-3,
batch 256, width 128) and scores the train split as a pool with the curation job
(:func:`asymvlm.curation.curate`, format ``tables``, in-process). Then:

1. per X in ``--drops``, the rule ``most_specific = 1 - X`` (drop the X % most vague): of the
   dropped captions the share at each level, and of each level the share dropped (the pool's
   level shares are what a random drop would give);
2. the CLIP-score rule ``clip_top = 0.3`` against the κ rules keeping 30 % and 70 %: Jaccard
   and containment of the kept caption sets, and what each rule keeps per level;
3. an adapter retrained (same seed and settings) on what each rule keeps -- a new tables root
   whose train split holds only the kept captions (and their images), val/test copied
   unchanged -- and on a random subset of the same number of captions (the control), each
   evaluated on the unchanged test split as ``asymvlm evaluate`` does
   (:func:`asymvlm.evaluation.retrieval.evaluate_retrieval`, 10 bins): Recall@1 t2i/i2t and S
   (Spearman of the binned-recall curve; -1 best), t2i Recall@1 per caption level, and the
   Spearman of κ with the caption level on test. The first adapter (whole train split) is the
   reference. Epochs are the same for every train set, so a smaller set gets fewer steps --
   the random control of the same size carries the same handicap.

Prints one JSON object (per seed, and mean ± std over seeds); progress goes to stderr.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import tempfile
import time
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from _common import loadavg, logger, machine
from scipy.stats import spearmanr

from asymvlm import tables
from asymvlm.curation import CurateConfig, SelectionRule, curate
from asymvlm.evaluation.retrieval import caption_scores, encode_split, evaluate_retrieval
from asymvlm.runner import train
from asymvlm.splits import load_split
from asymvlm.synthetic import PRESETS, WorldConfig, write_world

log = logger("curate_filter")
TRAIN = {
    "optimizer": "adamw",
    "lr": 2e-3,
    "batch_size": 256,
    "hidden_dim": 128,
    "adapter_input": "raw",
    "device": "cpu",
}
METHOD = "asymvlm-vmf"
#: The rules whose kept captions an adapter is retrained on (each with its random control).
RETRAINED = ("kappa-keep-70", "kappa-keep-30", "clip-top-30", "clip-top-70")


def rules(drops: list[int]) -> list[SelectionRule]:
    """κ rules dropping each X %, κ keeping 30 % and 70 %, CLIP score keeping 30 % and 70 %."""
    kappa = sorted({100 - x for x in drops} | {30, 70}, reverse=True)
    out = [SelectionRule(name=f"kappa-keep-{k}", most_specific=k / 100) for k in kappa]
    return out + [SelectionRule(name=f"clip-top-{k}", clip_top=k / 100) for k in (30, 70)]


def train_adapter(root: str, seed: int, epochs: int, output: str | None = None):
    cfg = {**TRAIN, "method": METHOD, "seed": seed, "epochs": epochs}
    method, _ = train(root, "train", cfg, output=output, overwrite=True, progress=False)
    return method


def filtered_root(root: str, out: str, keys: set[str]) -> str:
    """A tables root: ``root``'s manifest, its train split's captions in ``keys`` and their
    images only, every other split copied unchanged."""
    tables.write_manifest(out, tables.read_manifest(root))
    texts = tables.read_parts(root, "train", tables.TEXTS_DIR)
    texts = texts.filter(pc.is_in(texts["caption_id"], pa.array(sorted(keys), pa.string())))
    images = tables.read_parts(root, "train", tables.IMAGES_DIR)
    images = images.filter(pc.is_in(images["image_id"], texts["image_id"].unique()))
    tables.write_part(out, "train", tables.IMAGES_DIR, "part-00000", images)
    tables.write_part(out, "train", tables.TEXTS_DIR, "part-00000", texts)
    for split in tables.list_splits(root):
        if split != "train":
            shutil.copytree(os.path.join(root, split), os.path.join(out, split))
    return out


def per_level(levels: np.ndarray, chosen: np.ndarray, names: list[int]) -> dict[str, Any]:
    """Of the ``chosen`` captions the share at each level; of each level the share chosen."""
    n = max(int(chosen.sum()), 1)
    return {
        "share_of_set": {
            str(lv): round(float((chosen & (levels == lv)).sum() / n), 4) for lv in names
        },
        "fraction_of_level": {
            str(lv): round(float(chosen[levels == lv].mean()), 4) for lv in names
        },
    }


def overlap(a: set[str], b: set[str]) -> dict[str, float]:
    both = len(a & b)
    return {
        "jaccard": round(both / max(len(a | b), 1), 4),
        "share_of_first_in_second": round(both / max(len(a), 1), 4),
        "share_of_second_in_first": round(both / max(len(b), 1), 4),
    }


@torch.no_grad()
def test_metrics(method, root: str) -> dict[str, Any]:
    """Recall@1 and S per direction on the test split, t2i Recall@1 per caption level and the
    Spearman of κ with the level."""
    data = load_split(root, "test", TRAIN["adapter_input"])
    lib = evaluate_retrieval(method, data, n_bins=10, eccv=False)
    out: dict[str, Any] = {
        f"{d}_{k}": round(float(lib[d][k]), 4)
        for d in ("t2i", "i2t")
        for k in ("recall@1", "spearman")
    }
    level = np.asarray(data.split.extra_text_columns["level"])
    texts, images = encode_split(method, data)
    hit = (method.score(texts, images).argmax(1) == data.text_to_image).cpu().numpy()
    assert abs(hit.mean() - lib["t2i"]["recall@1"]) < 2e-3, (hit.mean(), lib["t2i"]["recall@1"])
    out["t2i_recall@1_by_level"] = {
        str(lv): round(float(hit[level == lv].mean()), 4) for lv in np.unique(level)
    }
    kappa = caption_scores(method, data)["kappa"].to_numpy(zero_copy_only=False)
    out["spearman_kappa_level"] = round(float(spearmanr(kappa, level).statistic), 4)
    return out


def one_seed(folder: str, world: WorldConfig, seed: int, args: argparse.Namespace) -> dict:
    t0 = time.perf_counter()
    root = write_world(f"{folder}/world", replace(world, seed=seed))
    checkpoint = f"{folder}/adapter"
    reference = train_adapter(root, seed, args.epochs, checkpoint)
    chosen_rules = rules(args.drops)
    summary = curate(
        CurateConfig(
            pool=root,
            split="train",
            format="tables",
            checkpoint=checkpoint,
            output=f"{folder}/curated",
            device="cpu",
            rules=chosen_rules,
        )
    )
    # the pool with the world's truth: each caption's level, joined on key = caption_id
    scores = pa.concat_tables(
        pq.read_table(p) for p in sorted(glob.glob(f"{folder}/curated/scores/*.parquet"))
    )
    truth = tables.read_parts(root, "train", tables.TEXTS_DIR)
    level_of = dict(zip(truth["caption_id"].to_pylist(), truth["level"].to_pylist(), strict=True))
    keys = scores["key"].to_pylist()
    levels = np.array([level_of[k] for k in keys])
    names = sorted(set(levels.tolist()))
    kappa = scores["kappa"].to_numpy(zero_copy_only=False)
    # the job's κ against the evaluation's own (caption_scores) on the same captions
    own = caption_scores(reference, load_split(root, "train", TRAIN["adapter_input"]))
    own_kappa = dict(zip(own["caption_id"].to_pylist(), own["kappa"].to_pylist(), strict=True))
    ratio = np.array([k / own_kappa[c] for k, c in zip(kappa, keys, strict=True)])
    kept = {
        r.name: set(pq.read_table(r.files[0], columns=["key"])["key"].to_pylist())
        for r in summary.rules
    }
    in_set = {name: np.array([k in s for k in keys]) for name, s in kept.items()}
    out: dict[str, Any] = {
        "seed": seed,
        "pool_captions": len(keys),
        "pool_level_share": {str(lv): round(float((levels == lv).mean()), 4) for lv in names},
        "job_kappa_vs_caption_scores_max_rel_diff": round(float(np.abs(ratio - 1).max()), 6),
        "spearman_kappa_level_train_pool": round(float(spearmanr(kappa, levels).statistic), 4),
        "spearman_clip_score_level_train_pool": round(
            float(spearmanr(scores["clip_score"].to_numpy(zero_copy_only=False), levels).statistic),
            4,
        ),
        "kept_fraction": {r.name: round(r.fraction, 4) for r in summary.rules},
    }
    out["drop"] = {
        str(x): per_level(levels, ~in_set[f"kappa-keep-{100 - x}"], names) for x in args.drops
    }
    out["kept_by_level"] = {
        name: per_level(levels, in_set[name], names)["share_of_set"] for name in kept
    }
    out["overlap"] = {
        "clip-top-30_vs_kappa-keep-30": overlap(kept["clip-top-30"], kept["kappa-keep-30"]),
        "clip-top-30_vs_kappa-keep-70": overlap(kept["clip-top-30"], kept["kappa-keep-70"]),
        "clip-top-70_vs_kappa-keep-70": overlap(kept["clip-top-70"], kept["kappa-keep-70"]),
    }
    log(f"seed {seed}: scored {len(keys)} captions, drops {json.dumps(out['drop'])}")
    # retrained adapters: each rule's kept captions and a random set of as many
    rng = np.random.default_rng(seed)
    retrain = {"all": reference}
    for name in RETRAINED:
        random_keys = set(rng.choice(keys, size=len(kept[name]), replace=False).tolist())
        for label, chosen in ((name, kept[name]), (f"random-as-{name}", random_keys)):
            sub = filtered_root(root, f"{folder}/{label}", chosen)
            retrain[label] = train_adapter(sub, seed, args.epochs)
    out["retrained"] = {}
    for label, method in retrain.items():
        out["retrained"][label] = test_metrics(method, root)
        log(f"seed {seed} {label}: {json.dumps(out['retrained'][label])}")
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def summarise(values: list[Any]) -> Any:
    """Key by key, the mean ± std over seeds of every number."""
    if isinstance(values[0], dict):
        return {k: summarise([v[k] for v in values]) for k in values[0]}
    if isinstance(values[0], (int, float)) and not isinstance(values[0], bool):
        return {"mean": round(float(np.mean(values)), 4), "std": round(float(np.std(values)), 4)}
    return values[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--images", default="4000,1000,1000", help="train,val,test images")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--drops", default="10,30,50", help="X: drop the X %% most vague")
    parser.add_argument("--preset", default=None, choices=sorted(PRESETS), help="default: none")
    args = parser.parse_args(argv)
    args.drops = [int(x) for x in args.drops.split(",")]
    sizes = dict(zip(("train", "val", "test"), map(int, args.images.split(",")), strict=True))
    seeds = [int(s) for s in args.seeds.split(",")]
    world = WorldConfig.preset(args.preset, sizes)
    load = loadavg()
    started = time.perf_counter()
    rows = []
    for seed in seeds:
        with tempfile.TemporaryDirectory() as folder:
            rows.append(one_seed(folder, world, seed, args))
    per_seed_keys = [k for k in rows[0] if k not in ("seed", "seconds")]
    result = {
        "benchmark": "curate_filter",
        "config": {
            "seeds": seeds,
            "images": sizes,
            "preset": args.preset,
            "method": METHOD,
            "train": {**TRAIN, "epochs": args.epochs},
            "drops_percent": args.drops,
            "retrained": list(RETRAINED),
        },
        "summary": {k: summarise([r[k] for r in rows]) for k in per_seed_keys},
        "seeds": rows,
        "seconds": round(time.perf_counter() - started, 1),
        "machine": machine(load),
    }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
