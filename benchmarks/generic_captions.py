"""How the share p of generic training captions (assumption U) decides none-of-the-above.

    python benchmarks/generic_captions.py [--p 0,0.005,0.01,0.02,0.05] [--seeds 0,1]
                                          [--methods asymvlm-vmf,asymvlm-ps,determ-ft]
                                          [--epochs 12] [--preset demo] [--class-images 1000]

For each p, the world of ``--preset`` (the demo's, :data:`asymvlm.synthetic.PRESETS`) with
``generic_captions = p`` is written with its classification sets, and every method is trained
on its ``train`` split as the demo's sweep trains it (configs/demo.yaml: 12 epochs, AdamW,
lr 2e-3, batch 256, hidden width 128), once per seed. Then, per method and seed:

* the median kappa the text adapter gives each group of texts
  (:func:`asymvlm.evaluation.kappa_groups.kappa_by_group`): training captions per level
  (-1: generic), class prompts, dummy prompts;
* none-of-the-above (Table 2) with the dummy prompt "a photo": positives kept, sibling
  negatives rejected, far negatives rejected; and the mean over the three dummy prompts;
* zero-shot accuracy (Table 3) on the positives' classes and on the zero-shot domain.

The frozen model (cosine, no kappa) is measured once per p. Prints one JSON object to stdout
(per p: every seed's numbers and their mean); progress goes to stderr. docs/synthetic-world.md
records a run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import replace
from typing import Any

from _common import loadavg, logger, machine

from asymvlm.evaluation.kappa_groups import kappa_by_group
from asymvlm.evaluation.suite import evaluate_none_of_the_above, evaluate_zero_shot
from asymvlm.methods import Method, build_method
from asymvlm.runner import train
from asymvlm.synthetic import (
    DUMMY_PROMPTS,
    PRESETS,
    ClassificationSpec,
    write_classification_sets,
    write_world,
)
from asymvlm.training import TrainConfig

log = logger("generic_captions")
DUMMY = DUMMY_PROMPTS[0]  # "a photo", the paper's first dummy prompt


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def train_method(root: str, method: str, seed: int, args: argparse.Namespace) -> Method:
    """``method`` trained on ``ROOT/train`` with the demo sweep's settings."""
    cfg = TrainConfig(
        method=method,
        epochs=args.epochs,
        lr=args.lr,
        optimizer="adamw",
        batch_size=args.batch_size,
        hidden_dim=args.hidden_dim,
        seed=seed,
        device="cpu",
    )
    trained, _ = train(root, "train", cfg, output=None, progress=False)
    return trained


def measure(methods: dict[str, Method], root: str, sets: dict[str, str]) -> dict[str, dict]:
    """Per model: kappa by text group, none-of-the-above and zero-shot numbers."""
    nota = evaluate_none_of_the_above(
        methods,
        (sets["positives"], "test"),
        (sets["negatives"], "test"),
        (sets["far-negatives"], "test"),
    )
    zero = evaluate_zero_shot(methods, {k: (sets[k], "test") for k in ("positives", "zeroshot")})
    out: dict[str, dict] = {}
    for name, method in methods.items():
        cells = [nota["dummy"][text][name] for text in DUMMY_PROMPTS]
        out[name] = {
            "kappa": kappa_by_group(method, root, sets["positives"]),
            "pos_acc": nota["dummy"][DUMMY][name]["pos_acc"],
            "sibling_rejected": nota["dummy"][DUMMY][name]["neg_acc"],
            "far_rejected": nota["dummy"][DUMMY][name]["far_neg_acc"],
            "sibling_rejected_mean_dummies": statistics.fmean(c["neg_acc"] for c in cells),
            "far_rejected_mean_dummies": statistics.fmean(c["far_neg_acc"] for c in cells),
            "zeroshot_acc": zero[name]["zeroshot"],
            "positives_zeroshot_acc": zero[name]["positives"],
        }
    return out


def _mean(values: list[Any]) -> Any:
    """Mean of numbers, or key by key of dicts of numbers (None where a value is None)."""
    if values[0] is None:
        return None
    if isinstance(values[0], dict):
        return {k: _mean([v[k] for v in values]) for k in values[0]}
    return round(statistics.fmean(values), 4)


def one_p(p: float, args: argparse.Namespace, folder: str) -> dict[str, Any]:
    """The world with ``generic_captions = p``, every method and seed trained and measured."""
    cfg = replace(PRESETS[args.preset], generic_captions=p, seed=args.world_seed)
    root = write_world(f"{folder}/p{p}", cfg)
    spec = ClassificationSpec(
        positives=args.class_images, negatives=args.class_images, zeroshot=args.class_images
    )
    sets = write_classification_sets(root, cfg, spec)
    frozen = build_method("clip", cfg.dim)
    frozen.adapter_input = "unit"
    per: dict[str, list[dict]] = {"clip": [measure({"clip": frozen}, root, sets)["clip"]]}
    for method in args.methods:
        for seed in args.seeds:
            t0 = time.perf_counter()
            trained = train_method(root, method, seed, args)
            cell = measure({method: trained}, root, sets)[method]
            per.setdefault(method, []).append(cell)
            kappa = (cell["kappa"] or {}).get(f'dummy "{DUMMY}"')
            log(
                f"p={p} {method} seed {seed}: kappa('{DUMMY}') {kappa}, sibling rejected "
                f"{cell['sibling_rejected']:.3f}, far {cell['far_rejected']:.3f}, positives "
                f"{cell['pos_acc']:.3f} ({time.perf_counter() - t0:.0f} s)"
            )
    return {
        "p": p,
        "seeds": args.seeds,
        "mean": {m: _mean(cells) for m, cells in per.items()},
        "per_seed": per,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--p", type=_floats, default=[0.0, 0.005, 0.01, 0.02, 0.05])
    parser.add_argument("--seeds", type=lambda t: [int(v) for v in t.split(",")], default=[0, 1])
    parser.add_argument(
        "--methods", type=lambda t: t.split(","), default=["asymvlm-vmf", "asymvlm-ps", "determ-ft"]
    )
    parser.add_argument("--preset", default="demo", choices=sorted(PRESETS))
    parser.add_argument("--world-seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--hidden-dim", type=int, default=128)
    parser.add_argument("--class-images", type=int, default=1000)
    args = parser.parse_args()
    load = loadavg()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        curve = [one_p(p, args, folder) for p in args.p]
    result = {
        "benchmark": "generic_captions",
        "preset": args.preset,
        "world_seed": args.world_seed,
        "epochs": args.epochs,
        "methods": args.methods,
        "dummy": DUMMY,
        "curve": curve,
        "seconds": round(time.perf_counter() - t0, 1),
        "machine": machine(load),
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
