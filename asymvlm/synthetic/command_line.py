"""``python -m asymvlm.synthetic``: write a synthetic world's tables (and classification sets)."""

from __future__ import annotations

import argparse
import time

from asymvlm.entry import ArgumentParser, guarded
from asymvlm.synthetic.classification_sets import ClassificationSpec, write_classification_sets
from asymvlm.synthetic.knobs import PRESETS, WorldConfig
from asymvlm.synthetic.world import DEFAULT_SHARD_IMAGES, write_world

#: The :class:`WorldConfig` knobs given as flags: name, type, help.
KNOBS = (
    ("dim", int, "embedding width (the preset's, else 64)"),
    ("seed", int, "the world's random seed (the preset's, else 0)"),
    ("pre_dim", int, "also write pre-projection features of this width (> --dim)"),
    ("block_images", int, "draw each split in blocks of this many images (another world)"),
    ("generic_captions", float, "share of the train split's generic captions ('a picture')"),
    ("misalignment", float, "angle (rad) of the text encoder's shared rotation"),
    ("caption_words", bool, "captions whose word count follows the level with noise"),
)


def _level_probs(text: str) -> tuple[float, ...] | None:
    """``uniform`` -> None, ``0.05,0.15,0.3,0.5`` -> floats."""
    try:
        return None if text.strip() == "uniform" else tuple(map(float, text.split(",")))
    except ValueError:
        raise argparse.ArgumentTypeError("expected comma-separated numbers or 'uniform'") from None


def build_parser() -> argparse.ArgumentParser:
    """The flags of ``python -m asymvlm.synthetic``; a knob not given is the preset's."""
    p = ArgumentParser(
        prog="python -m asymvlm.synthetic",
        description="Write the synthetic world's embedding tables.",
    )
    p.add_argument("--output", required=True, help="table root (local path or s3://)")
    p.add_argument("--preset", choices=sorted(PRESETS), help="a named world; flags override it")
    p.add_argument("--train-images", type=int, help="training images (the preset's, else 8000)")
    p.add_argument("--test-images", type=int, help="val and test images (the preset's, else 1000)")
    for name, kind, text in KNOBS:
        flag = "--" + name.replace("_", "-")
        if kind is bool:
            p.add_argument(flag, action="store_true", default=None, help=text)
        else:
            p.add_argument(flag, type=kind, help=text)
    p.add_argument(
        "--level-probs",
        type=_level_probs,
        default=argparse.SUPPRESS,
        metavar="P0,P1,P2,P3",
        help="probability of each caption level, most general first ('uniform': all equal)",
    )
    p.add_argument(
        "--shard-images",
        type=int,
        default=DEFAULT_SHARD_IMAGES,
        help=f"images per Parquet part (default {DEFAULT_SHARD_IMAGES})",
    )
    p.add_argument("--classes", action="store_true", help="also write OUTPUT-<role> sets")
    p.add_argument("--only-classes", action="store_true", help="only the sets, for OUTPUT's world")
    p.add_argument(
        "--class-level",
        type=int,
        default=1,
        help="the concept level whose concepts are the classes (0: the most general; default 1)",
    )
    p.add_argument("--class-images", type=int, default=1000, help="images per set (default 1000)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Write the world (with ``--classes`` its classification sets); bad input: one line, exit 2."""

    def run() -> int:
        args = build_parser().parse_args(argv)
        n = args.class_images
        spec = ClassificationSpec(args.class_level, positives=n, negatives=n, zeroshot=n)
        cfg = None
        if not args.only_classes:
            knobs = {k: getattr(args, k) for k, _, _ in KNOBS if getattr(args, k) is not None}
            if hasattr(args, "level_probs"):  # None: uniform
                knobs["level_probs"] = args.level_probs
            sizes = {"train": args.train_images, "val": args.test_images, "test": args.test_images}
            cfg, t0 = WorldConfig.preset(args.preset, sizes, **knobs), time.perf_counter()
            write_world(args.output, cfg, shard_images=args.shard_images)
            print(f"wrote synthetic world to {args.output} ({time.perf_counter() - t0:.1f} s)")
        if args.classes or args.only_classes:
            for role, where in write_classification_sets(args.output, cfg, spec).items():
                print(f"wrote {role} to {where}")
        return 0

    return guarded(run)
