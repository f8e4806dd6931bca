"""``asymvlm export``: a trained adapter as a Hugging Face model folder
(:func:`asymvlm.checkpoints.export_adapter`)."""

from __future__ import annotations

import argparse
import logging
import shlex

from asymvlm.cli.flags import Help, add_tracking_uri

logger = logging.getLogger(__name__)
COMMANDS = {"export": "write an adapter as a Hugging Face model folder (safetensors + model card)"}


def cmd_export(args: argparse.Namespace) -> int:
    from asymvlm.checkpoints import export_adapter

    options = {k: getattr(args, k) for k in ("tracking_uri", "repo", "license", "overwrite")}
    export_adapter(args.checkpoint, args.output, **options)
    repo = shlex.quote(args.repo) if args.repo else "ORG/REPO"
    logger.info("publish it with: hf upload %s %s", repo, shlex.quote(args.output))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help=COMMANDS["export"],
        formatter_class=Help,
        description="Write the adapter of a checkpoint folder or an MLflow model as a Hugging "
        "Face model folder: model.safetensors, config.json and README.md (the model card). Load "
        "it with --checkpoint FOLDER or, once uploaded, --checkpoint hf-hub:ORG/REPO.",
    )
    p.add_argument("--checkpoint", required=True, metavar="DIR|URI", help="folder or MLflow URI")
    p.add_argument("--output", required=True, metavar="FOLDER", help="the model folder to write")
    p.add_argument("--repo", metavar="ORG/REPO", help="the Hub repository named in the card")
    p.add_argument("--license", default="apache-2.0", help="the card's license")
    add_tracking_uri(p, "the model and its run are read from")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier export there")
    p.set_defaults(func=cmd_export)
