"""``asymvlm score-text``: new captions in, kappa and uncertainty out (:class:`asymvlm.Scorer`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq

from asymvlm import storage
from asymvlm.cli.common import Help
from asymvlm.errors import ConfigError

logger = logging.getLogger("asymvlm.cli")


def read_captions(path: str, column: str) -> list[str]:
    """Captions of a ``.txt`` file (one a line) or a ``.parquet`` file (``column``); an empty or
    missing caption is an error naming its line or row."""
    try:
        if path.endswith(".parquet"):
            names = pq.read_schema(path).names
            if column not in names:
                raise ConfigError(
                    f"{path}: no column {column!r} (columns: {', '.join(names)}); "
                    "choose one with --column"
                )
            values = pq.read_table(path, columns=[column]).column(column).to_pylist()
        else:
            with open(path, encoding="utf-8") as fh:
                values = fh.read().splitlines()
            while values and not values[-1].strip():  # trailing blank lines are no captions
                values.pop()
    except (OSError, pa.ArrowInvalid) as exc:  # missing, unreadable, not Parquet
        raise ConfigError(f"{path}: cannot read the captions ({exc})") from None
    for i, text in enumerate(values):
        if not isinstance(text, str) or not text.strip():
            if path.endswith(".parquet"):
                raise ConfigError(f"{path} row {i}: {column!r} is not a caption ({text!r})")
            raise ConfigError(f"{path} line {i + 1}: empty caption")
    return values


def cmd_score_text(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from asymvlm.scoring import Scorer, ScoringInputError

    if bool(args.captions) == bool(args.input):
        raise ConfigError("give captions on the command line or --input FILE, not both")
    if args.output and not args.output.endswith(".parquet"):
        raise ConfigError(f"--output {args.output}: write a .parquet file")
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {args.batch_size}")
    captions = list(args.captions) or read_captions(args.input, args.column)
    scorer = Scorer.from_checkpoint(
        args.checkpoint,
        encoder=args.encoder,
        device=args.device,
        batch_size=args.batch_size,
        tracking_uri=args.tracking_uri,
    )
    chunk, writer = args.batch_size * 16, None
    with contextlib.ExitStack() as stack:
        quiet = args.quiet or not args.input
        bar = stack.enter_context(
            tqdm(total=len(captions), unit="caption", desc="scoring", disable=quiet)
        )
        for start in range(0, len(captions), chunk):
            try:
                result = scorer.caption_uncertainty(captions[start : start + chunk])
            except ScoringInputError as exc:  # positions are the file's, not the chunk's
                raise exc.moved(start) from None
            if not args.output:
                for record in result.records():
                    print(json.dumps(record, ensure_ascii=False))
            else:
                table = result.table()
                if writer is None:  # written to a temporary name, renamed when complete
                    fs, tmp = stack.enter_context(storage.atomic_path(args.output))
                    writer = stack.enter_context(pq.ParquetWriter(tmp, table.schema, filesystem=fs))
                writer.write_table(table)
            bar.update(len(result.text))
    if writer is not None:
        logger.info("%d captions scored -> %s", len(captions), args.output)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "score-text",
        help="kappa and uncertainty of new captions (text in: the adapter's own encoder)",
        formatter_class=Help,
        description="Embed captions with the frozen encoder the adapter's tables were embedded "
        "with (recorded in its checkpoint) and print one JSON object per caption (text, kappa "
        "where the method has one, uncertainty), or write them to --output as Parquet.",
    )
    p.add_argument("captions", nargs="*", metavar="CAPTION", help="captions to score")
    p.add_argument(
        "--checkpoint",
        required=True,
        metavar="DIR|URI",
        help="checkpoint or model folder, MLflow model URI (runs:/.., models:/..) or "
        "hf-hub:ORG/REPO[@REVISION]",
    )
    p.add_argument("--input", metavar="FILE", help="captions.txt (one a line) or .parquet")
    p.add_argument("--column", default="text", help="the caption column of a .parquet input")
    p.add_argument("--output", metavar="FILE.parquet", help="write text, kappa, uncertainty here")
    p.add_argument(
        "--encoder",
        default=None,
        metavar="MODEL",
        help="the encoder to use instead of the one the checkpoint names (a moved folder)",
    )
    p.add_argument(
        "--tracking-uri",
        default=None,
        help="the MLflow store of a runs:/ or models:/ URI (default: $MLFLOW_TRACKING_URI)",
    )
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    p.add_argument("--batch-size", type=int, default=256, help="captions encoded at once")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_score_text)
