"""``asymvlm embed``: a data set into embedding tables with a frozen CLIP/SigLIP (Ray Data).

The one sub-command of the Ray layer: it imports ``pipelines`` (and Ray) when it runs, never
when the CLI starts.
"""

from __future__ import annotations

import argparse
import json

from asymvlm.cli.common import Help
from asymvlm.config import validate


def cmd_embed(args: argparse.Namespace) -> int:
    """The embedding stage (Ray Data) on the local or joined Ray cluster: this sub-command is
    an entry point of the Ray layer, imported only when it runs."""
    from asymvlm.data.embed import EmbedConfig
    from pipelines.embedding import run_embed
    from pipelines.session import RaySession

    doc = {
        name: getattr(args, name) for name in EmbedConfig.__pydantic_fields__ if hasattr(args, name)
    }
    cfg = validate(EmbedConfig, doc, "asymvlm embed", flags=True)
    with RaySession() as session:
        summary = run_embed(cfg, session)
    print(json.dumps(summary, indent=2))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "embed",
        help="embed a data set into tables with a frozen CLIP/SigLIP (Ray Data)",
        description="Read a data set, embed images and captions with a frozen CLIP/SigLIP on a "
        "Ray Data actor pool, write ROOT/manifest.json and ROOT/<split>/{images,texts,errors}. "
        "Re-running resumes an interrupted job and leaves a finished one untouched.",
        formatter_class=Help,
    )
    from asymvlm.data.sources import READERS

    p.add_argument("--dataset", required=True, choices=sorted(READERS), help="the reader")
    p.add_argument("--annotations", default=None, help="annotation file / folder (local or s3://)")
    p.add_argument("--images", default=None, help="image folder (local or s3://)")
    p.add_argument(
        "--model",
        default="openai/clip-vit-base-patch32",
        help="transformers CLIP/SigLIP hub id or folder, or open_clip:ARCH/TAG "
        "(open_clip:ARCH/WEIGHTS-FILE, open_clip:hf-hub:ORG/REPO, "
        "open_clip:local-dir:FOLDER)",
    )
    p.add_argument("--split", required=True, help="split to read (train, val, test...)")
    p.add_argument("--output", required=True, metavar="ROOT", help="tables root (or s3://)")
    p.add_argument("--batch-size", type=int, default=64, help="images per encoder batch")
    p.add_argument("--num-actors", type=int, default=1, help="encoder actors (1 GPU each)")
    p.add_argument("--device", default="auto", help="auto (GPU when the cluster has one) or cpu")
    p.add_argument("--dtype", default="auto", help="auto: bf16/fp16 on GPU, fp32 on CPU")
    p.add_argument("--sample", type=int, default=None, help="CC: sample N pairs (CC-200k)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--id-list", default=None, help="CC: restrict to the ids in this file")
    p.add_argument("--shard-size", type=int, default=2048, help="images per output part")
    p.add_argument(
        "--shards-per-round",
        type=int,
        default=8,
        help="shards embedded per Ray Data pass (1 = a resume point after every shard)",
    )
    p.add_argument(
        "--decode-in",
        choices=["auto", "tasks", "actor"],
        default="auto",
        help="decode images in CPU tasks (GPU clusters) or in the encoder actor (CPU only)",
    )
    p.add_argument(
        "--image-perturbation",
        default=None,
        metavar="KIND:SEVERITY",
        help="OOD suite: perturb images first (gaussian_noise, rotation, zoom_blur, "
        "jpeg, low_resolution; severity 1-5)",
    )
    p.add_argument(
        "--text-perturbation",
        default=None,
        metavar="KIND:SEVERITY",
        help="OOD suite: perturb captions first (typos, word_order, synonyms, "
        "casing; severity 1-5); the original stays in clean_text",
    )
    p.add_argument("--perturbation-seed", type=int, default=0, help="seed of the perturbations")
    p.add_argument(
        "--pre-projection",
        action="store_true",
        help="also write the pre-projection features and ROOT/projection.npz (CLIP "
        "only), which the bayesvlm method needs",
    )
    p.set_defaults(func=cmd_embed)
