"""``asymvlm train``, ``asymvlm import-official`` and ``asymvlm methods``."""

from __future__ import annotations

import argparse
import logging
import os

from asymvlm.cli.flags import Help, add_data_args, parse_kv
from asymvlm.config import add_model_flags, model_values, validate
from asymvlm.errors import CheckpointError, ConfigError
from asymvlm.methods import method_names
from asymvlm.training import TrainConfig

logger = logging.getLogger(__name__)
OVERWRITE = "replace a checkpoint already in --output"
COMMANDS = {
    "train": "train a method on cached embeddings",
    "import-official": "turn a checkpoint of the authors' train.py into one of this project",
    "methods": "list the registered methods, their uncertainty and arguments",
}


def cmd_train(args: argparse.Namespace) -> int:
    from asymvlm.runner import train

    doc = {
        **model_values(args, args.train_keys),
        "device": args.device,
        "method_kwargs": parse_kv(args.method_arg, "--method-arg"),
    }
    cfg = validate(TrainConfig, doc, "asymvlm train", flags=True)
    flags = {k: getattr(args, k) for k in ("output", "checkpoint_every", "resume", "overwrite")}
    _, history = train(args.embeddings, args.split, cfg, progress=not args.quiet, **flags)
    if history:
        logger.info("final train_loss %.4f", history[-1]["train_loss"])
    logger.info("checkpoint in %s", args.output)
    return 0


def cmd_import_official(args: argparse.Namespace) -> int:
    import torch

    from asymvlm.checkpoints import checkpoint_to_resume, save_checkpoint
    from asymvlm.methods import official

    try:
        method = official.method_name(args.method)
    except KeyError as err:
        raise ConfigError(f"--method: {err.args[0]}") from None
    if not os.path.isfile(args.checkpoint):
        raise CheckpointError(f"--checkpoint {args.checkpoint}: no such file")
    try:
        state = torch.load(args.checkpoint, map_location="cpu", weights_only=True)
    except Exception as err:  # pickle/zip errors of a file that is not a torch checkpoint
        raise CheckpointError(
            f"{args.checkpoint}: not a torch state dict ({type(err).__name__}: {err})"
        ) from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{args.checkpoint}: expected a state dict of tensors")
    try:
        model = official.load_official(method, state)
    except (KeyError, ValueError, StopIteration) as err:
        detail = err.args[0] if err.args else "no layer found"
        raise CheckpointError(f"{args.checkpoint}: {detail}") from None
    checkpoint_to_resume(args.output, resume=False, overwrite=args.overwrite)  # refuses one
    cfg = TrainConfig(method=method, protocol="official", device="cpu")
    dim, source = official.official_dim(method, state), os.path.abspath(args.checkpoint)
    save_checkpoint(args.output, model, cfg, dim, {"imported_from": source})
    size = sum(p.numel() for p in model.parameters())
    logger.info("%s (official %s, %d parameters) -> %s", method, args.method, size, args.output)
    return 0


def cmd_methods(args: argparse.Namespace) -> int:
    from asymvlm.methods import METHODS, method_arguments
    from asymvlm.methods.arguments import argument_type

    for name in [args.name] if args.name else sorted(METHODS):
        cls = METHODS[name]
        doc = (cls.__doc__ or "").strip().splitlines()[0]
        print(f"{name:22s} {doc}\n{'':22s} uncertainty: {cls.uncertainty_doc}")
        official = cls.PROTOCOL_KWARGS.get("official", {})
        arguments = method_arguments(cls) if args.name or args.verbose else None
        if arguments == {}:
            print(f"{'':22s} arguments: none")
        for key, p in (arguments or {}).items():
            kind = argument_type(p)
            kind = kind.__name__ if isinstance(kind, type) else str(kind).replace("typing.", "")
            default = "required" if p.default is p.empty else f"default {p.default!r}"
            extra = f", official {official[key]!r}" if key in official else ""
            print(f"{'':22s}   --method-arg {key}: {kind} ({default}{extra})")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help=COMMANDS["train"],
        description="Train one method; paper defaults: SGD momentum 0.9, cosine to 1e-6, "
        "batch 2048 (App. B.4).",
        formatter_class=Help,
    )
    add_data_args(p, "train")
    keys = add_model_flags(
        p,
        TrainConfig,
        exclude=("device",),
        required=("method",),
        choices={"method": method_names()},
        metavars={"stream_memory_bytes": "BYTES", "shuffle_buffer": "ROWS"},
    )
    own = "the method's own argument (repeatable; `asymvlm methods NAME` lists them)"
    p.add_argument("--method-arg", action="append", default=[], metavar="KEY=VALUE", help=own)
    folder = "checkpoint folder (config.json, model.safetensors, history.jsonl)"
    p.add_argument("--output", required=True, metavar="DIR", help=folder)
    every = "also write a checkpoint every N epochs to --resume from (default: the final only)"
    p.add_argument("--checkpoint-every", type=int, metavar="N", help=every)
    again = p.add_mutually_exclusive_group()
    resume = "continue the checkpoint in --output (same flags); a complete one is left as it is"
    again.add_argument("--resume", action="store_true", help=resume)
    again.add_argument("--overwrite", action="store_true", help=OVERWRITE)
    p.set_defaults(func=cmd_train, train_keys=keys, adapter_input=None)  # None: the tables say

    p = sub.add_parser(
        "import-official",
        help=COMMANDS["import-official"],
        description="Reads torch.save(adaptor.state_dict()) of the authors' code and writes a "
        "checkpoint of the same method under protocol official.",
        formatter_class=Help,
    )
    p.add_argument("--method", required=True, help="the official --method key or this project's")
    official = "the official .pt (checkpoints/DATA/SEED/METHOD.pt)"
    p.add_argument("--checkpoint", required=True, metavar="FILE", help=official)
    p.add_argument("--output", required=True, metavar="DIR", help="checkpoint folder to write")
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE)
    p.set_defaults(func=cmd_import_official)

    p = sub.add_parser("methods", help=COMMANDS["methods"], formatter_class=Help)
    name = "this method and its arguments"
    p.add_argument("name", nargs="?", choices=method_names(), metavar="NAME", help=name)
    p.add_argument("--verbose", action="store_true", help="every method's arguments (--method-arg)")
    p.set_defaults(func=cmd_methods)
