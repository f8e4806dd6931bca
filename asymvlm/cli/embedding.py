"""``asymvlm embed``: a data set into embedding tables (Ray Data, imported when it runs)."""

from __future__ import annotations

import argparse
import json

from asymvlm.cli.flags import Help
from asymvlm.config import add_model_flags, model_values, validate

COMMANDS = {"embed": "embed a data set into tables with a frozen CLIP/SigLIP (Ray Data)"}


def cmd_embed(args: argparse.Namespace) -> int:
    """The embedding stage on the local or joined Ray cluster."""
    from asymvlm.embedding.embed_config import EmbedConfig
    from asymvlm_ray.embedding import run_embed
    from asymvlm_ray.session import RaySession

    cfg = validate(EmbedConfig, model_values(args, args.embed_keys), "asymvlm embed", flags=True)
    with RaySession() as session:
        summary = run_embed(cfg, session)
    print(json.dumps(summary, indent=2))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from asymvlm.embedding.embed_config import EmbedConfig

    p = sub.add_parser(
        "embed",
        help=COMMANDS["embed"],
        description="Read a data set, embed images and captions with a frozen CLIP/SigLIP on a "
        "Ray Data actor pool, write ROOT/manifest.json and ROOT/SPLIT/{images,texts,errors}. "
        "Re-running resumes an interrupted job and leaves a finished one untouched.",
        formatter_class=Help,
    )
    perturbation = "KIND:SEVERITY"
    keys = add_model_flags(
        p,
        EmbedConfig,
        required=("dataset", "split", "output"),
        metavars={"image_perturbation": perturbation, "text_perturbation": perturbation},
    )
    p.set_defaults(func=cmd_embed, embed_keys=keys, model="openai/clip-vit-base-patch32")
