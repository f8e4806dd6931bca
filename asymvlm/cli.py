"""The ``asymvlm`` command line: train, evaluate and score on cached embedding tables.

Single process, CPU or one GPU; the Ray pipelines in ``pipelines/`` wrap the same functions.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence

import pyarrow.parquet as pq

from asymvlm import __version__
from asymvlm.config import validate
from asymvlm.errors import CheckpointError, ConfigError, guarded
from asymvlm.methods import METHODS
from asymvlm.training import TrainConfig, load_checkpoint, load_split, resolve_device, train

logger = logging.getLogger("asymvlm.cli")


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults shown once: appended unless the help already speaks of its default, and never
    for options without one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default in (None, False, [], argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)


_DEFAULTS = TrainConfig()


def _json_default(obj: object) -> object:
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _write_json(path: str, payload: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(payload, fh, indent=2, default=_json_default, allow_nan=False)
    os.replace(tmp, path)


def _parse_kv(items: Sequence[str]) -> dict[str, object]:
    """``key=value`` pairs; values parsed as JSON when possible (numbers, true/false)."""
    out: dict[str, object] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--method-arg expects key=value, got {item!r}")
        key, value = item.split("=", 1)
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _cmd_train(args: argparse.Namespace) -> int:
    from asymvlm.training import check_resumable, checkpoint_to_resume

    if args.checkpoint_every is not None and args.checkpoint_every < 1:
        raise ConfigError(f"--checkpoint-every must be >= 1, got {args.checkpoint_every}")
    fields = (
        "method",
        "protocol",
        "epochs",
        "lr",
        "optimizer",
        "momentum",
        "weight_decay",
        "batch_size",
        "min_lr",
        "hidden_dim",
        "depth",
        "seed",
        "adapter_input",
        "device",
        "precision",
        "stream",
        "stream_memory_bytes",
        "shuffle_buffer",
    )
    cfg = validate(TrainConfig, {**{k: getattr(args, k) for k in fields},
                                 "method_kwargs": _parse_kv(args.method_arg)},
                   "asymvlm train", flags=True)  # fmt: skip
    device = resolve_device(cfg.device)
    previous = checkpoint_to_resume(args.output, resume=args.resume, overwrite=args.overwrite)
    if previous is not None:
        check_resumable(args.output, previous, cfg, args.embeddings, args.split)
        epoch = previous.get("epoch")
        where = "" if epoch is None else f" (epoch {epoch} of {previous.get('epochs')})"
        if previous["complete"]:
            logger.info("%s already holds a complete checkpoint%s; nothing to do", args.output,
                        where)  # fmt: skip
            return 0
        logger.info("resuming %s%s", args.output, where)
    if METHODS[cfg.method].trainable:
        logger.info(
            "training %s on %s/%s (%d epochs, %s lr=%g, batch %d, device %s)", cfg.method,
            args.embeddings, args.split, cfg.epochs, cfg.optimizer, cfg.lr, cfg.batch_size, device,
        )  # fmt: skip
    else:  # nothing is trained: fitted post hoc (bayesvlm) or used as is (clip)
        logger.info("fitting %s on %s/%s (no training; device %s)", cfg.method,
                    args.embeddings, args.split, device)  # fmt: skip
    _, history = train(
        args.embeddings,
        args.split,
        cfg,
        output=args.output,
        progress=not args.quiet,
        checkpoint_every=args.checkpoint_every,
        resume=args.resume,
        overwrite=args.overwrite,
    )
    if history:
        last = history[-1]
        logger.info("final train_loss %.4f", last["train_loss"])
    logger.info("checkpoint written to %s", args.output)
    return 0


def _load(args: argparse.Namespace):
    device = resolve_device(args.device)
    method, meta = load_checkpoint(args.checkpoint, device, allow_incomplete=args.allow_incomplete)
    adapter_input = args.adapter_input or meta.get("adapter_input", "raw")
    data = load_split(args.embeddings, args.split, adapter_input, device)
    if data.dim != meta["dim"]:
        raise CheckpointError(
            f"checkpoint {args.checkpoint} expects dim {meta['dim']}, "
            f"but {args.embeddings}/{args.split} has dim {data.dim}"
        )
    return method, data


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from asymvlm.evaluation import evaluate_retrieval

    for flag, value in (("--levels", args.levels), ("--chunk-size", args.chunk_size),
                        ("--memory-budget", args.memory_budget)):  # fmt: skip
        if value is not None and value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}")
    if args.fold_size is not None and args.fold_size < 1:
        raise ConfigError(f"--fold-size must be >= 1, got {args.fold_size}")
    method, data = _load(args)
    result = evaluate_retrieval(
        method, data, n_bins=args.levels, chunk_size=args.chunk_size, progress=not args.quiet,
        fold_size=args.fold_size,
        **({"memory_budget": args.memory_budget} if args.memory_budget else {}),
    )  # fmt: skip
    result.update(checkpoint=args.checkpoint, embeddings=args.embeddings, split=args.split)
    _write_json(args.output, result)
    for direction in ("t2i", "i2t"):
        r = result[direction]
        s = "n/a" if r["spearman"] is None else f"{r['spearman']:+.3f}"
        r2 = "n/a" if r["r2"] is None else f"{r['r2']:.3f}"
        print(
            f"{direction}: R@1 {r['recall@1']:.4f}  R@5 {r['recall@5']:.4f}  "
            f"R@10 {r['recall@10']:.4f}  S {s}  R2 {r2}"
        )
    logger.info("metrics written to %s", args.output)
    return 0


def _cmd_score(args: argparse.Namespace) -> int:
    from asymvlm.evaluation import caption_scores

    method, data = _load(args)
    table = caption_scores(method, data)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    tmp = args.output + ".tmp"
    pq.write_table(table, tmp)
    os.replace(tmp, args.output)
    unc = table.column("uncertainty")
    if unc.null_count == len(unc):
        logger.info("%s defines no caption uncertainty (column is null)", method.name)
    logger.info("%d captions scored -> %s", table.num_rows, args.output)
    return 0


def _read_captions(path: str, column: str) -> list[str]:
    """Captions of a ``.txt`` file (one a line) or a ``.parquet`` file (``column``); an empty or
    missing caption is an error naming its line or row."""
    if path.endswith(".parquet"):
        schema = pq.read_schema(path)
        if column not in schema.names:
            names = ", ".join(schema.names)
            raise ConfigError(f"{path}: no column {column!r} (columns: {names}); "
                              "choose one with --column")  # fmt: skip
        values = pq.read_table(path, columns=[column]).column(column).to_pylist()
        for row, text in enumerate(values):
            if not isinstance(text, str) or not text.strip():
                raise ConfigError(f"{path} row {row}: {column!r} is not a caption "
                                  f"({text!r})")  # fmt: skip
        return values
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            raise ConfigError(f"{path} line {number}: empty caption")
    return lines


def _cmd_score_text(args: argparse.Namespace) -> int:
    import json

    from tqdm import tqdm

    from asymvlm.scoring import Scorer, ScoringInputError

    if bool(args.captions) == bool(args.input):
        raise ConfigError("give captions on the command line or --input FILE, not both")
    if args.output and not args.output.endswith(".parquet"):
        raise ConfigError(f"--output {args.output}: write a .parquet file")
    captions = list(args.captions) or _read_captions(args.input, args.column)
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {args.batch_size}")
    scorer = Scorer.from_checkpoint(args.checkpoint, encoder=args.encoder, device=args.device,
                                    batch_size=args.batch_size,
                                    tracking_uri=args.tracking_uri)  # fmt: skip
    chunk = args.batch_size * 16
    writer, tmp = None, None
    try:
        with tqdm(total=len(captions), unit="caption", disable=args.quiet or not args.input,
                  desc="scoring") as bar:  # fmt: skip
            for start in range(0, len(captions), chunk):
                try:
                    result = scorer.caption_uncertainty(captions[start : start + chunk])
                except ScoringInputError as exc:  # positions are the file's, not the chunk's
                    raise exc.moved(start) from None
                if args.output:
                    table = result.table()
                    if writer is None:
                        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
                        tmp = args.output + ".tmp"
                        writer = pq.ParquetWriter(tmp, table.schema)
                    writer.write_table(table)
                else:
                    for record in result.records():
                        print(json.dumps(record, ensure_ascii=False))
                bar.update(len(result.text))
        if writer is not None:
            writer.close()
            writer = None
            os.replace(tmp, args.output)
            logger.info("%d captions scored -> %s", len(captions), args.output)
    finally:
        if writer is not None:  # failed half way: nothing half-written is left
            writer.close()
            os.remove(tmp)
    return 0


def _cmd_import_official(args: argparse.Namespace) -> int:
    import torch

    from asymvlm.methods import official
    from asymvlm.training import (
        TrainConfig,
        check_output,
        checkpoint_to_resume,
        save_checkpoint,
    )

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
    check_output(args.output)
    checkpoint_to_resume(args.output, resume=False, overwrite=args.overwrite)  # refuses one
    cfg = TrainConfig(method=method, protocol="official", device="cpu")
    save_checkpoint(args.output, model, cfg, official.official_dim(method, state),
                    {"imported_from": os.path.abspath(args.checkpoint)})  # fmt: skip
    logger.info("%s (official %s, %d parameters) -> %s", method, args.method,
                sum(p.numel() for p in model.parameters()), args.output)  # fmt: skip
    return 0


def _add_data_args(p: argparse.ArgumentParser, split_default: str) -> None:
    p.add_argument("--embeddings", required=True, metavar="ROOT", help="embedding table root")
    p.add_argument("--split", default=split_default, help="split of the tables")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 ... or auto")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asymvlm",
        description="Probabilistic adapters for frozen VLM embeddings (AsymVLM and baselines).",
    )
    parser.add_argument("--version", action="version", version=f"asymvlm {__version__}")
    parser.add_argument("--verbose", action="store_true",
                        help="show every library's messages (Ray, MLflow...) too")  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "train",
        help="train a method on cached embeddings",
        description="Train one method; paper defaults: SGD momentum 0.9, cosine to 1e-6, "
        "batch 2048 (App. B.4).",
        formatter_class=_Help,
    )
    _add_data_args(p, "train")
    p.add_argument("--method", required=True, choices=sorted(METHODS), help="method name")
    p.add_argument("--epochs", type=int, default=_DEFAULTS.epochs, help="passes over the data")
    p.add_argument("--protocol", choices=["improved", "official"], default=_DEFAULTS.protocol,
                   help="official = the authors' code for the method (architecture, init, loss, "
                        "uncertainty, optimiser defaults); improved = this project's (README "
                        "'Protocols')")  # fmt: skip
    p.add_argument("--lr", type=float, default=None,
                   help="peak learning rate (default: the protocol's for the method; improved: "
                        "1e-2)")  # fmt: skip
    p.add_argument("--optimizer", choices=["sgd", "adamw"], default=None,
                   help="sgd with momentum or adamw (default: the protocol's for the method; "
                        "improved: sgd, as the paper)")  # fmt: skip
    p.add_argument("--momentum", type=float, default=None,
                   help="SGD momentum (default: 0.9)")  # fmt: skip
    p.add_argument("--weight-decay", type=float, default=None,
                   help="L2 weight decay (default: the protocol's for the method; improved: "
                        "5e-4)")  # fmt: skip
    p.add_argument("--batch-size", type=int, default=_DEFAULTS.batch_size,
                   help="pairs per step (the global batch of the contrastive loss)")  # fmt: skip
    p.add_argument("--min-lr", type=float, default=_DEFAULTS.min_lr,
                   help="end of the cosine schedule")  # fmt: skip
    p.add_argument("--hidden-dim", type=int, default=None,
                   help="width of the adapter's hidden layers (default: 1024)")  # fmt: skip
    p.add_argument("--depth", type=int, default=None,
                   help="hidden layers (default: 3; the official ProbVLM backbone: 2)")  # fmt: skip
    p.add_argument("--seed", type=int, default=_DEFAULTS.seed, help="initialisation and order")
    p.add_argument(
        "--adapter-input",
        choices=["raw", "unit"],
        default=_DEFAULTS.adapter_input,
        help="raw = unnormalised text projection (embedding * norm), as the official code",
    )
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"], default="auto",
                   help="auto: bf16 autocast on CUDA, fp32 on CPU")  # fmt: skip
    p.add_argument("--stream", choices=["auto", "always", "never"], default=_DEFAULTS.stream,
                   help="stream the training captions from the parquet parts instead of loading "
                        "the split (docs/streaming.md); auto: when the split's float32 size "
                        "exceeds --stream-memory-bytes")  # fmt: skip
    p.add_argument("--stream-memory-bytes", type=int, default=None, metavar="BYTES",
                   help="auto streams above this many bytes (default: a quarter of the free "
                        "memory, at most half the free GPU memory)")  # fmt: skip
    p.add_argument("--shuffle-buffer", type=int, default=_DEFAULTS.shuffle_buffer,
                   metavar="ROWS", help="rows mixed across parts when streaming")  # fmt: skip
    p.add_argument(
        "--method-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra method constructor argument (repeatable)",
    )
    p.add_argument("--output", required=True, metavar="DIR",
                   help="checkpoint folder (config.json, model.pt, history.jsonl, trainer.pt), "
                        "written as a whole")  # fmt: skip
    p.add_argument("--checkpoint-every", type=int, default=None, metavar="N",
                   help="also write an incomplete checkpoint every N epochs, to --resume from "
                        "(default: only the final one)")  # fmt: skip
    again = p.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true",
                       help="continue the checkpoint in --output (same flags, --epochs too); a "
                            "complete one is left as it is; without one, start fresh")  # fmt: skip
    again.add_argument("--overwrite", action="store_true",
                       help="replace a checkpoint already in --output")  # fmt: skip
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser(
        "evaluate",
        help="retrieval + uncertainty metrics of a checkpoint",
        description="Recall@{1,5,10} both ways, binned Recall@1 by uncertainty, Spearman S, R2.",
        formatter_class=_Help,
    )
    _add_data_args(p, "test")
    p.add_argument("--checkpoint", required=True, metavar="DIR", help="a checkpoint folder")
    p.add_argument("--levels", type=int, default=10, help="uncertainty bins")
    p.add_argument("--chunk-size", type=int, default=None,
                   help="captions scored at once (default: as many as --memory-budget allows)")
    p.add_argument("--memory-budget", type=int, default=None, metavar="BYTES",
                   help="working memory of one chunk of scores (default 512 MiB)")
    p.add_argument("--fold-size", type=int, default=None, metavar="N",
                   help="also average the metrics over folds of N consecutive images and "
                        "their captions (1000 on the COCO 5K test split: COCO 1K)")  # fmt: skip
    p.add_argument("--adapter-input", choices=["raw", "unit"], default=None,
                   help="override what the checkpoint says it reads")  # fmt: skip
    p.add_argument(
        "--allow-incomplete",
        action="store_true",
        help="accept an incomplete checkpoint (a run in progress, killed or diverged)",
    )
    p.add_argument("--output", required=True, metavar="FILE.json", help="metrics as JSON")
    p.set_defaults(func=_cmd_evaluate)

    p = sub.add_parser(
        "score",
        help="per-caption kappa and uncertainty as Parquet",
        formatter_class=_Help,
    )
    _add_data_args(p, "test")
    p.add_argument("--checkpoint", required=True, metavar="DIR", help="a checkpoint folder")
    p.add_argument("--adapter-input", choices=["raw", "unit"], default=None,
                   help="override what the checkpoint says it reads")  # fmt: skip
    p.add_argument(
        "--allow-incomplete",
        action="store_true",
        help="accept an incomplete checkpoint (a run in progress, killed or diverged)",
    )
    p.add_argument("--output", required=True, metavar="FILE.parquet",
                   help="one row per caption: kappa, uncertainty")  # fmt: skip
    p.set_defaults(func=_cmd_score)

    p = sub.add_parser(
        "score-text",
        help="kappa and uncertainty of new captions (text in: the adapter's own encoder)",
        formatter_class=_Help,
        description="Embed captions with the frozen encoder the adapter's tables were embedded "
        "with (recorded in its checkpoint) and print one JSON object per caption (text, kappa "
        "where the method has one, uncertainty), or write them to --output as Parquet.",
    )
    p.add_argument("captions", nargs="*", metavar="CAPTION", help="captions to score")
    p.add_argument("--checkpoint", required=True, metavar="DIR|URI",
                   help="checkpoint folder or MLflow model URI (runs:/.., models:/..)")
    p.add_argument("--input", metavar="FILE", help="captions.txt (one a line) or .parquet")
    p.add_argument("--column", default="text", help="the caption column of a .parquet input")
    p.add_argument("--output", metavar="FILE.parquet", help="write text, kappa, uncertainty here")
    p.add_argument("--encoder", default=None, metavar="MODEL",
                   help="the encoder to use instead of the one the checkpoint names (a moved "
                   "folder)")  # fmt: skip
    p.add_argument("--tracking-uri", default=None,
                   help="the MLflow store of a runs:/ or models:/ URI (default: "
                   "$MLFLOW_TRACKING_URI)")  # fmt: skip
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    p.add_argument("--batch-size", type=int, default=256, help="captions encoded at once")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_score_text)

    p = sub.add_parser(
        "embed",
        help="embed a data set into tables with a frozen CLIP/SigLIP (Ray Data)",
        description="Read a data set, embed images and captions with a frozen CLIP/SigLIP on a "
        "Ray Data actor pool, write ROOT/manifest.json and ROOT/<split>/{images,texts,errors}. "
        "Re-running resumes an interrupted job and leaves a finished one untouched.",
        formatter_class=_Help,
    )
    from asymvlm.data.sources import READERS

    p.add_argument("--dataset", required=True, choices=sorted(READERS), help="the reader")
    p.add_argument("--annotations", default=None, help="annotation file / folder (local or s3://)")
    p.add_argument("--images", default=None, help="image folder (local or s3://)")
    p.add_argument("--model", default="openai/clip-vit-base-patch32",
                   help="transformers CLIP/SigLIP hub id or folder, or open_clip:ARCH/TAG "
                   "(open_clip:ARCH/WEIGHTS-FILE, open_clip:hf-hub:ORG/REPO, "
                   "open_clip:local-dir:FOLDER)")  # fmt: skip
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
    p.add_argument("--image-perturbation", default=None, metavar="KIND:SEVERITY",
                   help="OOD suite: perturb images first (gaussian_noise, rotation, zoom_blur, "
                        "jpeg, low_resolution; severity 1-5)")  # fmt: skip
    p.add_argument("--text-perturbation", default=None, metavar="KIND:SEVERITY",
                   help="OOD suite: perturb captions first (typos, word_order, synonyms, "
                        "casing; severity 1-5); the original stays in clean_text")  # fmt: skip
    p.add_argument("--perturbation-seed", type=int, default=0, help="seed of the perturbations")
    p.add_argument("--pre-projection", action="store_true",
                   help="also write the pre-projection features and ROOT/projection.npz (CLIP "
                        "only), which the bayesvlm method needs")  # fmt: skip
    p.set_defaults(func=_cmd_embed)

    _add_analyze(sub)

    p = sub.add_parser(
        "report",
        help="gather an MLflow experiment into report.md / report.html with tables and figures",
        formatter_class=_Help,
    )
    p.add_argument("--mlflow-uri", default=os.environ.get("MLFLOW_TRACKING_URI"),
                   help="tracking URI, e.g. sqlite:///runs/demo/mlflow.db (default: "
                        "$MLFLOW_TRACKING_URI)")  # fmt: skip
    p.add_argument("--experiment", required=True, help="MLflow experiment to gather")
    p.add_argument("--output", required=True, help="folder for report.md and the figures")
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser(
        "ui",
        help="open a pipeline's MLflow store in the MLflow UI",
        description="Runs `mlflow ui` on OUTPUT/mlflow.db (a store copied or moved elsewhere "
        "is pointed at the mlartifacts folder beside it first).",
        formatter_class=_Help,
    )
    p.add_argument("output", help="the pipeline's output folder (holding mlflow.db)")
    p.add_argument("--port", type=int, default=5000, help="port of the UI")
    p.add_argument("--host", default="127.0.0.1", help="address the UI listens on")
    p.set_defaults(func=_cmd_ui)

    p = sub.add_parser(
        "import-official",
        help="turn a checkpoint of the authors' train.py into one of this project",
        description="Reads torch.save(adaptor.state_dict()) of the authors' code "
        "(li-ju666/asymvlm) and writes a complete checkpoint of the same method under "
        "protocol official, for asymvlm evaluate/score.",
        formatter_class=_Help,
    )
    p.add_argument("--method", required=True,
                   help="the official --method key (asymvlm-vmf, asymvlm-psd, probvlm, pfe, "
                        "pcmepp, prolip) or this project's name")  # fmt: skip
    p.add_argument("--checkpoint", required=True, metavar="FILE",
                   help="the official .pt (checkpoints/<data>/<seed>/<method>.pt)")  # fmt: skip
    p.add_argument("--output", required=True, metavar="DIR", help="checkpoint folder to write")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a checkpoint already in --output")  # fmt: skip
    p.set_defaults(func=_cmd_import_official)

    p = sub.add_parser("methods", help="list the registered methods and their uncertainty")
    p.set_defaults(func=_cmd_methods)
    return parser


def _add_analyze(sub) -> None:
    """``asymvlm analyze <kind>``: one sub-command per evaluation of the registry, each with
    only its own options."""
    from asymvlm.evaluation.registry import EVALUATIONS

    p = sub.add_parser(
        "analyze",
        help="the paper's evaluations: " + ", ".join(EVALUATIONS),
        description="Run one evaluation of the paper (Tables 2-3, Fig. 5) or the OOD suite on "
        "embedding tables, for adapters from checkpoint folders or a sweep's seed runs; "
        "prints JSON, optionally logs an MLflow run that `asymvlm report` picks up. "
        "`asymvlm analyze KIND --help` lists the options of one.",
    )
    kinds = p.add_subparsers(dest="kind", required=True, metavar="KIND")
    for ev in EVALUATIONS.values():
        k = kinds.add_parser(ev.kind, help=ev.title, description=ev.title[0].upper()
                             + ev.title[1:] + ". Locations are ROOT:SPLIT of embedding tables.",
                             formatter_class=_Help)  # fmt: skip
        for inp in ev.inputs:
            repeat = inp.form == "named"
            k.add_argument(inp.flag, dest=inp.key, required=inp.required and not repeat,
                           action="append" if repeat else "store", default=None,
                           metavar=inp.metavar or ("ROOT:SPLIT" if inp.form == "location"
                                                   else "TEXT"),
                           help=inp.help)  # fmt: skip
        k.add_argument("--checkpoint", action="append", default=[],
                       help="adapter folder (repeat)")  # fmt: skip
        k.add_argument("--sweep", default=None, help="a sweep's MLflow run id: its seed adapters")
        k.add_argument("--frozen", action="store_true", help="also the frozen model (clip)")
        k.add_argument("--output", default=None, help="write the JSON here too")
        k.add_argument("--mlflow-uri", default=os.environ.get("MLFLOW_TRACKING_URI"),
                       help="log the result to this tracking store (default: "
                            "$MLFLOW_TRACKING_URI; none: not logged)")  # fmt: skip
        k.add_argument("--experiment", default="asymvlm", help="MLflow experiment")
        k.set_defaults(func=_cmd_analyze)


def _cmd_analyze(args: argparse.Namespace) -> int:
    from asymvlm import tracking
    from asymvlm.evaluation import registry

    ev = registry.EVALUATIONS[args.kind]
    spec: dict[str, object] = {}
    for inp in ev.inputs:
        value = getattr(args, inp.key)
        if inp.form == "named" and value:
            pairs = {}
            for item in value:
                name, eq, where = item.partition("=")
                if not eq:
                    raise ConfigError(f"{inp.flag} expects {inp.metavar}, got {item!r}")
                pairs[name] = where
            value = pairs
        spec[inp.key] = value
    methods = {}
    for path in args.checkpoint:
        method, meta = load_checkpoint(path)
        method.adapter_input = meta.get("adapter_input", "raw")
        seed = meta.get("train_config", {}).get("seed", 0)
        methods[f"{meta['method']}/seed{seed}"] = method
    if args.sweep:
        if not args.mlflow_uri:
            raise ConfigError("--sweep needs --mlflow-uri (or $MLFLOW_TRACKING_URI)")
        methods.update(tracking.load_sweep_adapters(args.mlflow_uri, args.sweep))
    if args.frozen or not methods:
        methods = registry.with_frozen(args.kind, methods, spec)
    result = registry.evaluate(args.kind, methods, spec)
    text = json.dumps(result, indent=2, default=float)
    print(text)
    if args.output:
        with open(args.output, "w") as fh:
            fh.write(text + "\n")
    if args.mlflow_uri:
        params = {k: v for k, v in spec.items() if isinstance(v, str)}
        if args.kind == "zeroshot":
            params.setdefault("fine_tuned_on", "?")
        run_id = registry.log_evaluation(args.mlflow_uri, args.experiment, args.kind, result,
                                         params=params)  # fmt: skip
        logger.info("logged as MLflow run %s", run_id)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from asymvlm.report import build_report

    if not args.mlflow_uri:
        raise ConfigError("report: give --mlflow-uri or set MLFLOW_TRACKING_URI")
    path = build_report(args.mlflow_uri, args.experiment, args.output)
    logger.info("report written to %s (and report.html beside it)", path)
    return 0


def _cmd_ui(args: argparse.Namespace) -> int:
    from asymvlm import tracking

    database = os.path.join(os.path.abspath(args.output), "mlflow.db")
    if not os.path.isfile(database):
        raise ConfigError(f"{args.output}: no mlflow.db here (a pipeline's output folder holds "
                          "one when it ran with the local default store)")  # fmt: skip
    uri = "sqlite:///" + database
    tracking.relocate_local_store(uri)
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
               "--host", args.host, "--port", str(args.port)]  # fmt: skip
    logger.info("MLflow UI on http://%s:%d (Ctrl-C stops it)", args.host, args.port)
    os.execv(sys.executable, command)
    return 0  # not reached


def _cmd_embed(args: argparse.Namespace) -> int:
    from asymvlm.data.embed import EmbedConfig
    from pipelines.embedding import run_embed

    cfg = EmbedConfig(
        dataset=args.dataset,
        annotations=args.annotations,
        images=args.images,
        model=args.model,
        split=args.split,
        output=args.output,
        batch_size=args.batch_size,
        num_actors=args.num_actors,
        device=args.device,
        dtype=args.dtype,
        sample=args.sample,
        seed=args.seed,
        id_list=args.id_list,
        shard_size=args.shard_size,
        shards_per_round=args.shards_per_round,
        decode_in=args.decode_in,
        image_perturbation=args.image_perturbation,
        text_perturbation=args.text_perturbation,
        perturbation_seed=args.perturbation_seed,
        pre_projection=args.pre_projection,
    )
    summary = run_embed(cfg)
    print(json.dumps(summary, indent=2))
    return 0


def _cmd_methods(args: argparse.Namespace) -> int:
    for name in sorted(METHODS):
        cls = METHODS[name]
        doc = (cls.__doc__ or "").strip().splitlines()[0]
        print(f"{name:22s} {doc}\n{'':22s} uncertainty: {cls.uncertainty_doc}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: bad input (flags, paths, tables, checkpoints) prints one ``error:`` line and
    exits 2; a diverged training run exits 3 (:mod:`asymvlm.errors`); no traceback."""
    args = build_parser().parse_args(argv)
    from asymvlm import logs

    logs.configure(verbose=args.verbose)
    return guarded(lambda: args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
