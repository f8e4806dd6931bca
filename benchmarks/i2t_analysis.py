"""Why does the i2t uncertainty curve of the synthetic world rise instead of fall?

    python benchmarks/i2t_analysis.py [--epochs 20] [--method asymvlm-vmf] [--seed 0]
                                      [--train-images 8000] [--test-images 1000] [--output DIR]

The paper (Fig. 3) bins image-to-text retrieval by the text uncertainty (1/kappa) of each image's
top-1 retrieved caption and finds Recall@1 falling with it (Spearman S of bin index against
recall close to -1). On the default synthetic world (:class:`asymvlm.synthetic.WorldConfig`)
t2i reproduces, i2t gives S close to +1 after the 20-epoch run. This script measures where the
i2t curve comes from. It trains ``--method`` once on the world as :func:`write_world` writes it
and, for that model, reports on the world's test split and on test splits with other
statistics (drawn here, same concepts and text encoder, the same generative process as
:meth:`SyntheticWorld.sample_split` with extra knobs):

* per uncertainty bin: recall, the abstraction level of the retrieved captions, how many images
  retrieve the same caption (hubness), how many images have no detailed caption of their own;
* per retrieved level: share of images, hit rate, uncertainty; hits on an image's own vague
  caption (level 0-2) versus its detailed one;
* the model's kappa per caption level and the t2i Recall@1 per level;
* images whose top-1 is vague versus detailed: do they have detailed captions of their own, are
  their own detailed captions retrieved in t2i, how close is their nearest other image;
* counterfactual binnings: by the retrieved caption's true level (an oracle uncertainty), within
  detailed retrievals only, with captions ranked by mu^T z alone (kappa kept out of the
  ranking, still used for the binning), and a "semantic" hit (the retrieved caption describes
  the image's concept at its level, as ECCV Caption would count it);
* test splits with 1-3 captions per image, a gallery of detailed captions only, a COCO-like
  level mix (``--coco-levels``), near-duplicate images (two views of each object);
* ``--propose``: the proposed world change (the COCO-like level mix in training and test),
  trained and analysed like the world itself.

Prints one JSON object to stdout; progress goes to stderr. ``--epochs`` takes several values
(one model per value) to see how the answer depends on training length.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy import stats

from asymvlm import tables
from asymvlm.evaluation.retrieval import encode_split, evaluate_retrieval
from asymvlm.methods import Method
from asymvlm.metrics import binned_recall, curve_statistics
from asymvlm.runner import train
from asymvlm.splits import SplitTensors, load_split
from asymvlm.synthetic import SyntheticWorld, WorldConfig, write_world
from asymvlm.training import TrainConfig

DETAILED = 3  # level of a caption that describes the object itself (0 = most general)
COCO_LEVELS = (0.05, 0.15, 0.30, 0.50)  # proposed mix: mostly detailed, some generic captions


def log(msg: str) -> None:
    """Progress to stderr (stdout carries the JSON)."""
    print(f"[i2t-analysis] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Test splits with other statistics, drawn from the same world
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Knobs:
    """How a split drawn by :func:`sample_split` departs from the world's own sampler.

    ``level_probs``: probability of each caption level (None: uniform, as the world);
    ``views_per_object``: images per object (2: near-duplicate pairs, two views of one object);
    ``captions_per_image``: None takes the world's.
    """

    level_probs: tuple[float, ...] | None = None
    views_per_object: int = 1
    captions_per_image: int | None = None


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _offset(rng: np.random.Generator, centers: np.ndarray, scale: float) -> np.ndarray:
    """normalise(c + scale * random unit vector): the world's offset of a point around c."""
    return _unit(centers + scale * _unit(rng.standard_normal(centers.shape)))


def sample_split(
    world: SyntheticWorld, name: str, n_images: int, seed: int, knobs: Knobs
) -> tuple[dict[str, Any], np.ndarray]:
    """Draw a split with the world's generative process (``SyntheticWorld.sample_split``), its
    concepts and text encoder, changed as ``knobs`` say; returns (split for
    :func:`asymvlm.tables.write_split`, [n_images, n_concept_levels] concept path per image)."""
    cfg = world.config
    rng = np.random.default_rng(seed)
    n_obj = -(-n_images // knobs.views_per_object)
    leaves_obj = rng.integers(0, len(world.concepts[-1]), n_obj)
    objects_obj = _offset(rng, world.concepts[-1][leaves_obj], cfg.object_spread)
    obj = np.repeat(np.arange(n_obj), knobs.views_per_object)[:n_images]
    objects, leaves = objects_obj[obj], leaves_obj[obj]
    images = _offset(rng, objects, cfg.image_noise)
    path = world.ancestors(leaves)

    n_cap = knobs.captions_per_image or cfg.captions_per_image
    cap_image = np.repeat(np.arange(n_images), n_cap)
    if knobs.level_probs is None:
        levels = rng.integers(0, world.n_levels, n_images * n_cap)
    else:
        levels = rng.choice(world.n_levels, n_images * n_cap, p=np.asarray(knobs.level_probs))
    targets = np.empty((len(cap_image), cfg.dim))
    for level in range(world.n_levels):
        rows = levels == level
        if level < len(world.concepts):
            targets[rows] = world.concepts[level][path[level][cap_image[rows]]]
        else:
            targets[rows] = objects[cap_image[rows]]
    text = _unit(_offset(rng, targets, cfg.caption_noise) @ world.text_rotation.T)
    norms = cfg.norm_mean * np.exp(cfg.norm_log_sd * rng.standard_normal(len(text)))
    image_ids = [f"{name}-img{i:06d}" for i in range(n_images)]
    split = {
        "image_ids": image_ids,
        "image_embeddings": images.astype(np.float32),
        "caption_ids": [f"{image_ids[i]}-c{j}" for i in range(n_images) for j in range(n_cap)],
        "caption_image_ids": [image_ids[i] for i in cap_image],
        "texts": [
            f"level {lv} caption of object {obj[i]}"
            for i, lv in zip(cap_image, levels, strict=True)
        ],
        "text_embeddings": text.astype(np.float32),
        "text_norms": norms.astype(np.float32),
        "extra_text_columns": {"level": levels.astype(np.int64)},
    }
    return split, np.stack(path, axis=1)


def write_sampled_world(
    root: str, world: SyntheticWorld, splits: dict[str, int], knobs: Knobs, seed: int
) -> dict[str, np.ndarray]:
    """Write a world drawn by :func:`sample_split` (every split with ``knobs``) under ``root``;
    returns the concept paths per split."""
    tables.write_manifest(root, {"dim": world.config.dim, "model": "synthetic-world-variant"})
    paths = {}
    for i, (name, n_images) in enumerate(splits.items()):
        split, paths[name] = sample_split(world, name, n_images, seed + 1000 * i, knobs)
        tables.write_split(root, name, **split)
    return paths


# --------------------------------------------------------------------------------------------
# Measurements on one trained model and one split
# --------------------------------------------------------------------------------------------


def _spearman(x: np.ndarray, y: np.ndarray) -> float | None:
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return round(float(stats.spearmanr(x, y).statistic), 4)


def _r(x: float | None, digits: int = 4) -> float | None:
    return None if x is None or not np.isfinite(x) else round(float(x), digits)


def _mean(x: np.ndarray) -> float | None:
    return _r(float(np.mean(x))) if len(x) else None


def _curve(hits: np.ndarray, unc: np.ndarray, n_bins: int) -> dict[str, Any]:
    """Binned Recall@1 and its Spearman S, exactly as :mod:`asymvlm.metrics` bins it."""
    if len(hits) < n_bins:
        return {"n": int(len(hits)), "binned": None, "spearman": None}
    binned = binned_recall(torch.as_tensor(hits), torch.as_tensor(unc), n_bins)
    rho, _ = curve_statistics(binned)
    return {"n": int(len(hits)), "binned": [round(b, 3) for b in binned], "spearman": _r(rho)}


@torch.no_grad()
def _rankings(method: Method, data: SplitTensors, chunk: int = 2048) -> dict[str, np.ndarray]:
    """Per image: its top-1 caption; per caption: its t2i top-1 image; uncertainty, kappa."""
    texts, images = encode_split(method, data)
    unc = method.text_uncertainty_from(texts)
    if unc is None:
        raise SystemExit(f"{method.name} has no text uncertainty; this analysis needs one")
    n_text = data.text_emb.shape[0]
    best_val = torch.full((data.image_emb.shape[0],), -torch.inf, dtype=torch.float64)
    best_idx = torch.zeros(data.image_emb.shape[0], dtype=torch.long)
    cosine = "mu" in texts and "mu" in images  # rank by mu^T z alone, kappa left out
    cos_val, cos_idx = best_val.clone(), best_idx.clone()
    t2i_top = torch.empty(n_text, dtype=torch.long)
    for start in range(0, n_text, chunk):
        stop = min(start + chunk, n_text)
        s = method.score({k: v[start:stop] for k, v in texts.items()}, images).double()
        t2i_top[start:stop] = s.argmax(dim=1)
        val, idx = s.max(dim=0)  # first maximum: the lower caption index wins ties
        better = val > best_val
        best_val = torch.where(better, val, best_val)
        best_idx = torch.where(better, idx + start, best_idx)
        if cosine:
            val, idx = (texts["mu"][start:stop] @ images["mu"].T).double().max(dim=0)
            better = val > cos_val
            cos_val = torch.where(better, val, cos_val)
            cos_idx = torch.where(better, idx + start, cos_idx)
    kappa = texts.get("kappa")
    return {
        "i2t_top": best_idx.numpy(),
        "i2t_top_cosine": cos_idx.numpy() if cosine else None,
        "t2i_top": t2i_top.numpy(),
        "uncertainty": unc.double().cpu().numpy(),
        "kappa": None if kappa is None else kappa.double().cpu().numpy(),
    }


def analyse(
    method: Method, data: SplitTensors, n_bins: int = 10, path: np.ndarray | None = None
) -> dict[str, Any]:
    """Every measurement of the module docstring on one split (``path``: concept path per image,
    for the semantic hit; None where unknown)."""
    level = np.asarray(data.split.extra_text_columns["level"])
    owner = data.text_to_image.cpu().numpy()
    n_img = data.image_emb.shape[0]
    rk = _rankings(method, data)
    unc, top = rk["uncertainty"], rk["i2t_top"]
    has_caption = np.bincount(owner, minlength=n_img) > 0
    images = np.flatnonzero(has_caption)
    top = top[images]
    hit = owner[top] == images
    top_level, top_unc = level[top], unc[top]
    n_detailed = np.bincount(owner[level == DETAILED], minlength=n_img)[images]
    in_degree = np.bincount(top, minlength=len(level))  # images retrieving each caption first

    lib = evaluate_retrieval(method, data, n_bins=n_bins, eccv=False)
    out: dict[str, Any] = {
        "n_images": int(n_img),
        "n_captions": int(len(level)),
        "caption_level_share": [_r(np.mean(level == lv), 3) for lv in range(DETAILED + 1)],
        "images_without_detailed_caption": _r(np.mean(n_detailed == 0), 3),
        "library": {
            d: {
                "recall@1": _r(lib[d]["recall@1"]),
                "spearman": _r(lib[d]["spearman"]),
                "binned_recall@1": [round(b, 3) for b in lib[d]["binned_recall@1"]],
            }
            for d in ("t2i", "i2t")
        },
    }
    i2t = _curve(hit, top_unc, n_bins)
    out["i2t_recomputed_spearman"] = i2t["spearman"]  # equals library.i2t.spearman

    # --- the model's uncertainty per caption level, t2i per level ----------------------------
    t2i_hit = rk["t2i_top"] == owner
    out["per_caption_level"] = {
        str(lv): {
            "median_kappa": _r(np.median(rk["kappa"][level == lv]), 2)
            if rk["kappa"] is not None
            else None,
            "median_uncertainty": _r(np.median(unc[level == lv])),
            "t2i_recall@1": _mean(t2i_hit[level == lv]),
        }
        for lv in range(DETAILED + 1)
    }
    out["spearman_uncertainty_level"] = _spearman(unc, level)
    out["spearman_uncertainty_level_2_vs_3"] = _spearman(unc[level >= 2], level[level >= 2])

    # --- per i2t uncertainty bin ---------------------------------------------------------------
    order = np.argsort(top_unc, kind="stable")
    size = len(order) // n_bins
    bins = []
    for b in range(n_bins):
        rows = order[b * size : (b + 1) * size]
        lv, h = top_level[rows], hit[rows]
        bins.append(
            {
                "recall@1": _mean(h),
                "mean_uncertainty": _mean(top_unc[rows]),
                "retrieved_level_counts": np.bincount(lv, minlength=DETAILED + 1).tolist(),
                "hit_rate_detailed": _mean(h[lv == DETAILED]),
                "hit_rate_vague": _mean(h[lv < DETAILED]),
                "mean_in_degree": _mean(in_degree[top[rows]]),
                "images_without_detailed_caption": _mean(n_detailed[rows] == 0),
            }
        )
    out["i2t_bins"] = bins

    # --- per retrieved level ------------------------------------------------------------------
    out["i2t_per_retrieved_level"] = {
        str(lv): {
            "share_of_images": _r(np.mean(top_level == lv), 3),
            "hit_rate": _mean(hit[top_level == lv]),
            "median_uncertainty": _r(np.median(top_unc[top_level == lv]))
            if np.any(top_level == lv)
            else None,
            "mean_in_degree": _mean(in_degree[top[top_level == lv]]),
        }
        for lv in range(DETAILED + 1)
    }
    out["hits_on_own_vague_caption"] = _r(np.mean(hit & (top_level < DETAILED)), 4)
    out["vague_retrieved_belongs_to_other_image"] = _mean(~hit[top_level < DETAILED])

    # --- who retrieves vague captions: easy or hard images? -----------------------------------
    gram = data.image_emb @ data.image_emb.T
    gram.fill_diagonal_(-2.0)
    nn_cos = gram.max(dim=1).values.cpu().numpy()[images]
    own_t2i = np.bincount(owner, weights=t2i_hit & (level == DETAILED), minlength=n_img)[images]
    groups = {}
    for key, rows in (
        ("top1_vague", top_level < DETAILED),
        ("top1_detailed", top_level == DETAILED),
    ):
        has = rows & (n_detailed > 0)
        groups[key] = {
            "share_of_images": _r(np.mean(rows), 3),
            "hit_rate": _mean(hit[rows]),
            "images_without_detailed_caption": _mean(n_detailed[rows] == 0),
            "mean_own_detailed_captions": _mean(n_detailed[rows]),
            "t2i_recall@1_own_detailed": _r(own_t2i[has].sum() / max(n_detailed[has].sum(), 1)),
            "nearest_other_image_cos": _mean(nn_cos[rows]),
        }
    out["images_by_top1"] = groups
    out["i2t_by_own_detailed_captions"] = {
        str(c): {
            "share_of_images": _r(np.mean(n_detailed == c), 3),
            "hit_rate": _mean(hit[n_detailed == c]),
            "top1_vague": _mean(top_level[n_detailed == c] < DETAILED),
        }
        for c in range(int(n_detailed.max()) + 1)
        if np.any(n_detailed == c)
    }

    # --- hubness: confident captions are retrieved by many images -----------------------------
    retrieved = np.flatnonzero(in_degree > 0)
    out["hubness"] = {
        "spearman_uncertainty_in_degree": _spearman(unc[retrieved], in_degree[retrieved]),
        "images_per_retrieved_caption": _r(len(images) / max(len(retrieved), 1), 3),
    }

    # --- counterfactual binnings ----------------------------------------------------------------
    jitter = top_unc / (top_unc.max() + 1.0)  # ties between levels broken by the model
    out["i2t_counterfactual"] = {
        "oracle_level_uncertainty": _curve(hit, (DETAILED - top_level) + jitter, n_bins),
        "detailed_retrievals_only": _curve(
            hit[top_level == DETAILED], top_unc[top_level == DETAILED], n_bins
        ),
        "images_with_detailed_caption_only": _curve(
            hit[n_detailed > 0], top_unc[n_detailed > 0], n_bins
        ),
    }
    if rk["i2t_top_cosine"] is not None:  # kappa out of the ranking, still used for binning
        top_cos = rk["i2t_top_cosine"][images]
        hit_cos = owner[top_cos] == images
        cos_curve = _curve(hit_cos, unc[top_cos], n_bins)
        cos_curve["recall@1"] = _mean(hit_cos)
        cos_curve["retrieved_level_share"] = [
            _r(np.mean(level[top_cos] == lv), 3) for lv in range(DETAILED + 1)
        ]
        out["i2t_counterfactual"]["cosine_ranking"] = cos_curve
    if path is not None:  # a vague caption of the image's concept is a correct description
        owner_path = path[owner[top]]
        lv_c = np.minimum(top_level, path.shape[1] - 1)
        same = owner_path[np.arange(len(top)), lv_c] == path[images, lv_c]
        semantic = np.where(top_level == DETAILED, hit, same)
        out["i2t_counterfactual"]["semantic_hit"] = _curve(semantic, top_unc, n_bins)
        out["i2t_counterfactual"]["semantic_hit"]["recall@1"] = _mean(semantic)
        out["same_leaf_images_per_image"] = _r(
            np.mean(np.bincount(path[:, -1])[path[images, -1]] - 1), 2
        )
    return out


def _subset(data: SplitTensors, caption_rows: np.ndarray) -> SplitTensors:
    """The images that keep a caption, with the captions ``caption_rows``."""
    owner = data.text_to_image.cpu().numpy()
    images = np.unique(owner[caption_rows])
    return data.subset(images, np.sort(caption_rows))


def first_k_captions(data: SplitTensors, k: int) -> np.ndarray:
    """Caption rows: the first ``k`` captions of every image."""
    owner = data.text_to_image.cpu().numpy()
    rank = np.zeros(len(owner), dtype=np.int64)
    seen: dict[int, int] = {}
    for row, img in enumerate(owner):
        rank[row] = seen.get(int(img), 0)
        seen[int(img)] = rank[row] + 1
    return np.flatnonzero(rank < k)


# --------------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------------


def train_method(root: str, args: argparse.Namespace, epochs: int) -> Method:
    """Train ``args.method`` on ``ROOT/train`` as ``benchmarks/protocols.py`` does (improved)."""
    cfg = TrainConfig(
        method=args.method,
        protocol=args.protocol,
        epochs=epochs,
        hidden_dim=args.hidden_dim,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.train_seed,
        device="cpu",
    )
    t0 = time.perf_counter()
    method, _ = train(root, "train", cfg, output=None, progress=False)
    log(f"trained {args.method} for {epochs} epochs on {root} in {time.perf_counter() - t0:.0f}s")
    return method


def summary(result: dict[str, Any]) -> str:
    """One line for stderr."""
    lib = result["library"]
    return (
        f"t2i R@1 {lib['t2i']['recall@1']} S {lib['t2i']['spearman']}; "
        f"i2t R@1 {lib['i2t']['recall@1']} S {lib['i2t']['spearman']}"
    )


def run_world(args: argparse.Namespace, world_cfg: WorldConfig, output: str) -> dict[str, Any]:
    """Train per ``--epochs`` on the world as written, analyse its test split and the variants."""
    world = SyntheticWorld(world_cfg)
    root = os.path.join(output, "world")
    if not os.path.exists(os.path.join(root, "manifest.json")):
        write_world(root, world_cfg)
    variants_root = os.path.join(output, "test-variants")
    n_test = args.test_images
    test_knobs = {
        "control": Knobs(),
        "coco_levels": Knobs(level_probs=tuple(args.coco_levels)),
        "near_duplicates": Knobs(views_per_object=2),
    }
    if not os.path.exists(os.path.join(variants_root, "manifest.json")):
        tables.write_manifest(variants_root, {"dim": world_cfg.dim, "model": "synthetic-variant"})
    paths = {}
    for i, (name, knobs) in enumerate(test_knobs.items()):
        split, paths[name] = sample_split(world, name, n_test, args.seed * 7919 + 17 + i, knobs)
        tables.write_split(variants_root, name, **split)

    out: dict[str, Any] = {}
    for epochs in args.epochs:
        method = train_method(root, args, epochs)
        res: dict[str, Any] = {"world_test": analyse(method, load_split(root, "test"), args.bins)}
        log(f"epochs {epochs} world test: {summary(res['world_test'])}")
        for name in test_knobs:
            data = load_split(variants_root, name)
            res[f"test_{name}"] = analyse(method, data, args.bins, paths[name])
            log(f"epochs {epochs} test {name}: {summary(res[f'test_{name}'])}")
            if name != "control":
                continue
            level = np.asarray(data.split.extra_text_columns["level"])
            for k in (1, 2, 3):
                sub = _subset(data, first_k_captions(data, k))
                keep = np.unique(data.text_to_image.cpu().numpy()[first_k_captions(data, k)])
                res[f"test_control_{k}_captions"] = analyse(
                    method, sub, args.bins, paths[name][keep]
                )
                log(
                    f"epochs {epochs} control, {k} captions: "
                    f"{summary(res[f'test_control_{k}_captions'])}"
                )
            rows = np.flatnonzero(level == DETAILED)
            keep = np.unique(data.text_to_image.cpu().numpy()[rows])
            res["test_control_detailed_only"] = analyse(
                method, _subset(data, rows), args.bins, paths[name][keep]
            )
            log(
                f"epochs {epochs} control, detailed captions only: "
                f"{summary(res['test_control_detailed_only'])}"
            )
        out[str(epochs)] = res
    return out


def run_proposed(args: argparse.Namespace, world_cfg: WorldConfig, output: str) -> dict[str, Any]:
    """The proposed change: the COCO-like level mix in training and test (retrained)."""
    world = SyntheticWorld(world_cfg)
    root = os.path.join(output, "proposed-world")
    splits = {"train": args.train_images, "test": args.test_images}
    paths = write_sampled_world(
        root, world, splits, Knobs(level_probs=tuple(args.coco_levels)), seed=args.seed * 7919 + 101
    )
    out = {}
    for epochs in args.epochs:
        method = train_method(root, args, epochs)
        out[str(epochs)] = analyse(method, load_split(root, "test"), args.bins, paths["test"])
        log(f"epochs {epochs} proposed world: {summary(out[str(epochs)])}")
    return out


def main(argv: list[str] | None = None) -> int:
    """Parse options, run, print the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="asymvlm-vmf")
    parser.add_argument("--protocol", default="improved", choices=("improved", "official"))
    parser.add_argument("--epochs", type=int, nargs="+", default=[20])
    parser.add_argument("--hidden-dim", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--lr", type=float, default=None, help="default: the protocol's")
    parser.add_argument("--seed", type=int, default=0, help="world seed (WorldConfig.seed)")
    parser.add_argument("--train-seed", type=int, default=0)
    parser.add_argument("--train-images", type=int, default=8000)
    parser.add_argument("--test-images", type=int, default=1000)
    parser.add_argument("--bins", type=int, default=10)
    parser.add_argument(
        "--coco-levels",
        type=float,
        nargs=4,
        default=list(COCO_LEVELS),
        metavar="P",
        help="level 0..3 probabilities of the COCO-like mix",
    )
    parser.add_argument("--no-propose", action="store_true", help="skip the proposed world")
    parser.add_argument("--output", default=None, help="folder for the tables (default: temp)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args(argv)
    if abs(sum(args.coco_levels) - 1.0) > 1e-6:
        parser.error("--coco-levels must sum to 1")
    torch.set_num_threads(args.threads)
    output = args.output or tempfile.mkdtemp(prefix="i2t-analysis-")
    world_cfg = WorldConfig(
        seed=args.seed,
        splits={"train": args.train_images, "val": args.test_images, "test": args.test_images},
    )
    t0 = time.perf_counter()
    result: dict[str, Any] = {
        "method": args.method,
        "protocol": args.protocol,
        "epochs": args.epochs,
        "hidden_dim": args.hidden_dim,
        "batch_size": args.batch_size,
        "seed": args.seed,
        "train_seed": args.train_seed,
        "world": {
            "train_images": args.train_images,
            "test_images": args.test_images,
            "captions_per_image": world_cfg.captions_per_image,
        },
        "coco_levels": args.coco_levels,
        "default_world": run_world(args, world_cfg, output),
    }
    if not args.no_propose:
        result["proposed_world"] = run_proposed(args, world_cfg, output)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
