"""Does a query's kappa tell the search when to answer, widen or abstain? The synthetic world's
answer, where the images a caption truly describes are known (every image under its concept).

    python benchmarks/search_decisions.py [--seeds 0,1,2,3,4] [--methods asymvlm-vmf,asymvlm-ps]

For each seed and method it writes a synthetic world, trains the adapter as the demo's sweep does
(AdamW, lr 2e-3, batch 256, width 128), fits the decisions on the validation split
(:func:`asymvlm.indexing.validation.fit_policies`, target risk ``--target-risk``) and measures
on the test split, every caption a text -> image query and every image an image -> text query:

* AURC of abstention ordered by kappa against ordering by the top cosine (max-cosine) and by
  the margin between the first two cosines (top-1 margin), each of the frozen model (what the
  field's search tools have) and of the adapter's mu, and at random (lower is better);
* Recall@1 at 80 % coverage (the 80 % most certain queries by kappa) against full coverage;
* the ECE of the calibrated confidence (fitted on validation);
* the Spearman correlation of the widened k with the true number of relevant test images.

Prints one JSON object: per method the mean ± std over seeds and every seed's numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np
from scipy.stats import spearmanr

from asymvlm.evaluation.retrieval import encode_split
from asymvlm.indexing.forms import inner_product_form
from asymvlm.indexing.validation import fit_policies, query_outcomes
from asymvlm.methods.base import unit
from asymvlm.metrics.uncertainty import aurc, expected_calibration_error
from asymvlm.runner import train
from asymvlm.splits import load_split
from asymvlm.synthetic import WorldConfig, write_world

TRAIN = {"epochs": 12, "optimizer": "adamw", "lr": 2e-3, "batch_size": 256, "hidden_dim": 128}


def relevant_counts(texts: list[str], image_of_caption: np.ndarray) -> np.ndarray:
    """Per caption, the test images under its concept: the images having a caption whose tag
    path ("a photo of c3 / c17 ...") extends the caption's own (its object: its image alone)."""
    paths = [t.removeprefix("a photo of ").split(" / ") for t in texts]
    image_paths: dict[int, set[tuple[str, ...]]] = {}
    for path, image in zip(paths, image_of_caption, strict=True):
        concepts = tuple(p for p in path if not p.startswith("object"))
        image_paths.setdefault(int(image), set()).update(
            concepts[:n] for n in range(1, len(concepts) + 1)
        )
    counts = np.empty(len(paths), np.int64)
    for row, path in enumerate(paths):
        if path[-1].startswith("object"):
            counts[row] = 1
        else:
            counts[row] = sum(tuple(path) in known for known in image_paths.values())
    return counts


def measure(root: str, method_name: str, seed: int, target_risk: float, epochs: int) -> dict:
    checkpoint = os.path.join(root, f"ck-{method_name}")
    cfg = {**TRAIN, "method": method_name, "seed": seed, "epochs": epochs}
    method, _ = train(root, "train", cfg, output=checkpoint, overwrite=True, progress=False)
    method.adapter_input = "raw"
    form = inner_product_form(method)
    policies = fit_policies(method, form, root, "val", target_risk, widen_max=100)
    test = load_split(root, "test", "raw")
    outcome = query_outcomes(method, form, test)
    texts, images = encode_split(method, test)
    cosines = {
        "frozen": unit(test.text_emb) @ test.image_emb.T,
        "adapter": texts["mu"] @ images["mu"].T,
    }
    rng = np.random.default_rng(seed)
    out: dict = {}
    for direction, kappa, hit in (
        ("t2i", outcome.kappa, outcome.hit_first),
        ("i2t", outcome.image_kappa, outcome.image_hit_first),
    ):
        error = ~hit
        orders = {"kappa": 1.0 / kappa, "random": rng.random(len(hit))}
        for name, cosine in cosines.items():
            top2 = (cosine if direction == "t2i" else cosine.T).topk(2, dim=1).values.double()
            orders[f"max_cosine_{name}"] = -top2[:, 0].numpy()
            orders[f"margin_{name}"] = -(top2[:, 0] - top2[:, 1]).numpy()
        row = {f"aurc_{name}": aurc(u, error)[0] for name, u in orders.items()}
        kept = np.argsort(-kappa, kind="stable")[: int(round(0.8 * len(kappa)))]
        row["recall@1"] = float(hit.mean())
        row["recall@1_at_80"] = float(hit[kept].mean())
        confidence = policies[direction].confidence(kappa)
        row["ece"] = expected_calibration_error(confidence, hit)
        out[direction] = row
    relevant = relevant_counts(list(test.captions), test.text_to_image.numpy())
    out["t2i"]["spearman_widened_k_relevant"] = float(
        spearmanr(outcome.widened_k, relevant).statistic
    )
    out["t2i"]["decisions"] = {
        d: float(np.mean([policies["t2i"].decide(k) == d for k in outcome.kappa]))
        for d in ("answer", "widen", "abstain")
    }
    return out


def summarise(rows: list[dict]) -> dict:
    out = {}
    for direction in rows[0]:
        keys = [k for k, v in rows[0][direction].items() if isinstance(v, float)]
        out[direction] = {
            k: {
                "mean": float(np.mean([r[direction][k] for r in rows])),
                "std": float(np.std([r[direction][k] for r in rows])),
            }
            for k in keys
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--methods", default="asymvlm-vmf,asymvlm-ps")
    parser.add_argument("--target-risk", type=float, default=0.5)
    parser.add_argument("--images", default="4000,1000,1000", help="train,val,test images")
    parser.add_argument("--epochs", type=int, default=TRAIN["epochs"])
    args = parser.parse_args(argv)
    sizes = dict(zip(("train", "val", "test"), map(int, args.images.split(",")), strict=True))
    seeds = [int(s) for s in args.seeds.split(",")]
    train = {**TRAIN, "epochs": args.epochs}
    config = {"seeds": seeds, "train": train, "images": sizes, "target_risk": args.target_risk}
    result: dict = {"config": config}
    started = time.perf_counter()
    for method in args.methods.split(","):
        rows = []
        for seed in seeds:
            with tempfile.TemporaryDirectory() as root:
                write_world(root, WorldConfig(splits=sizes, seed=seed))
                rows.append(measure(root, method, seed, args.target_risk, args.epochs))
            print(
                f"[search_decisions] {method} seed {seed}: {json.dumps(rows[-1])}", file=sys.stderr
            )
        result[method] = {"summary": summarise(rows), "seeds": rows}
    result["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
