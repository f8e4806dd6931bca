"""``python -m asymvlm.synthetic``: write a synthetic world's tables (and classification sets)."""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from asymvlm.synthetic.classes import ClassificationSpec, write_classification_sets
from asymvlm.synthetic.world import DEFAULT_SHARD_IMAGES, PRESETS, WorldConfig, write_world


def _level_probs(parser: argparse.ArgumentParser, text: str) -> tuple[float, ...] | None:
    """``--level-probs``: ``uniform`` -> None, ``0.05,0.15,0.3,0.5`` -> floats."""
    if text.strip() == "uniform":
        return None
    try:
        return tuple(float(p) for p in text.split(","))
    except ValueError:
        parser.error(f"--level-probs: expected comma-separated numbers or 'uniform', got {text!r}")
        raise  # not reached: parser.error exits


def main(argv: list[str] | None = None) -> None:
    """Parse ``argv`` and write the world (and, with ``--classes``, its classification sets)."""
    parser = argparse.ArgumentParser(description="Write the synthetic world's embedding tables.")
    parser.add_argument("--output", required=True, help="table root (local path or s3://)")
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default=None,
        help="a named world (sizes and features); other flags override it",
    )
    parser.add_argument("--dim", type=int, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--train-images", type=int, default=None)
    parser.add_argument("--test-images", type=int, default=None, help="val and test images")
    parser.add_argument(
        "--pre-dim",
        type=int,
        default=None,
        help="also write pre-projection features of this width (> --dim) and projection.npz, "
        "as `asymvlm embed --pre-projection` does (for bayesvlm)",
    )
    parser.add_argument(
        "--block-images",
        type=int,
        default=None,
        help="draw each split in blocks of this many images (a stream per block: another world)",
    )
    parser.add_argument(
        "--caption-words",
        action="store_true",
        default=None,
        help="captions whose word count follows the level with noise",
    )
    parser.add_argument(
        "--level-probs",
        default=None,
        metavar="P0,P1,P2,P3",
        help="probability of each caption level, most general first ('uniform': every level "
        "equally likely; default: the preset's, else uniform)",
    )
    parser.add_argument(
        "--generic-captions",
        type=float,
        default=None,
        metavar="P",
        help="share of the train split's captions that are generic, 'a picture' (default: the "
        "preset's, else 0)",
    )
    parser.add_argument(
        "--misalignment",
        type=float,
        default=None,
        help="angle (rad) of the text encoder's shared rotation (0: the forgetting regime; "
        "default: the preset's, else 1.0)",
    )
    parser.add_argument(
        "--shard-images", type=int, default=DEFAULT_SHARD_IMAGES, help="images per part file"
    )
    parser.add_argument(
        "--classes",
        action="store_true",
        help="also write OUTPUT-positives, OUTPUT-negatives (and OUTPUT-zeroshot, "
        "OUTPUT-far-negatives)",
    )
    parser.add_argument(
        "--only-classes",
        action="store_true",
        help="write only the classification sets, for the world at OUTPUT",
    )
    parser.add_argument("--class-level", type=int, default=1)
    parser.add_argument("--class-images", type=int, default=1000, help="images per set")
    args = parser.parse_args(argv)
    spec = ClassificationSpec(
        level=args.class_level,
        positives=args.class_images,
        negatives=args.class_images,
        zeroshot=args.class_images,
    )
    if args.only_classes:
        for role, where in write_classification_sets(args.output, None, spec).items():
            print(f"wrote {role} to {where}")
        return
    if args.preset:
        cfg = PRESETS[args.preset]
        if args.train_images is not None or args.test_images is not None:
            splits = dict(cfg.splits)
            if args.train_images is not None:
                splits["train"] = args.train_images
            if args.test_images is not None:
                splits["val"] = splits["test"] = args.test_images
            cfg = replace(cfg, splits=splits)
    else:
        cfg = WorldConfig(
            splits={
                "train": args.train_images or 8000,
                "val": args.test_images or 1000,
                "test": args.test_images or 1000,
            }
        )
    overrides = {
        k: v
        for k, v in (
            ("dim", args.dim),
            ("seed", args.seed),
            ("pre_dim", args.pre_dim),
            ("block_images", args.block_images),
            ("caption_words", args.caption_words),
            ("generic_captions", args.generic_captions),
            ("misalignment", args.misalignment),
        )
        if v is not None
    }
    if args.level_probs is not None:
        overrides["level_probs"] = _level_probs(parser, args.level_probs)
    try:
        cfg = replace(cfg, **overrides)
    except ValueError as err:  # a knob out of range: one line, exit 2
        parser.error(str(err))
    t0 = time.perf_counter()
    write_world(args.output, cfg, shard_images=args.shard_images)
    print(f"wrote synthetic world to {args.output} ({time.perf_counter() - t0:.1f} s)")
    if args.classes:
        for role, where in write_classification_sets(args.output, cfg, spec).items():
            print(f"wrote {role} to {where}")


if __name__ == "__main__":
    main()
