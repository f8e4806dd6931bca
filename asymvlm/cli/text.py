"""``asymvlm score-text``: new captions in, kappa and uncertainty out (:class:`asymvlm.Scorer`)."""

from __future__ import annotations

import argparse
import json
import logging

from asymvlm.cli.flags import Help, add_output_file, add_tracking_uri, check_output_file
from asymvlm.errors import ConfigError

logger = logging.getLogger(__name__)
COMMANDS = {
    "score-text": "kappa and uncertainty of new captions (text in: the adapter's own encoder)"
}


def read_captions(path: str, column: str) -> list[str]:
    """Captions of a ``.txt`` file (one a line) or a ``.parquet`` file (``column``), none empty."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not path.endswith((".txt", ".parquet")):
        raise ConfigError(f"--input {path}: give a .txt file (a caption a line) or a .parquet file")
    parquet = path.endswith(".parquet")
    try:
        if parquet:
            table = pq.read_table(path)
            if column not in table.column_names:
                raise ConfigError(
                    f"{path}: no column {column!r} (columns: {', '.join(table.column_names)}); "
                    "choose one with --column"
                )
            values = table.column(column).to_pylist()
        else:
            with open(path, encoding="utf-8") as fh:
                values = fh.read().rstrip().splitlines()  # trailing blank lines are no captions
    except (OSError, pa.ArrowInvalid) as exc:  # missing, unreadable, not Parquet
        raise ConfigError(f"{path}: cannot read the captions ({exc})") from None
    for i, text in enumerate(values):
        if parquet and not (isinstance(text, str) and text.strip()):
            raise ConfigError(f"{path} row {i}: {column!r} is not a caption ({text!r})")
        if not text.strip():
            raise ConfigError(f"{path} line {i + 1}: empty caption")
    if not values:
        raise ConfigError(f"{path}: no captions in it")
    return values


def cmd_score_text(args: argparse.Namespace) -> int:
    import pyarrow.parquet as pq

    from asymvlm import storage
    from asymvlm.scoring import Scorer

    if not args.captions and not args.input:
        raise ConfigError("no captions given: give them on the command line or --input FILE")
    if args.output and not args.output.endswith(".parquet"):
        raise ConfigError(f"--output {args.output}: write a .parquet file")
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {args.batch_size}")
    check_output_file(args)
    captions = list(args.captions) or read_captions(args.input, args.column)
    options = {k: getattr(args, k) for k in ("encoder", "device", "batch_size", "tracking_uri")}
    scorer = Scorer.from_checkpoint(args.checkpoint, **options)
    result = scorer.caption_uncertainty(captions)
    if not args.output:
        for record in result.records():
            print(json.dumps(record, ensure_ascii=False))
        return 0
    with storage.atomic_path(args.output) as (fs, tmp):
        pq.write_table(result.table(), tmp, filesystem=fs)
    logger.info("%d captions scored -> %s", len(captions), args.output)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "score-text",
        help=COMMANDS["score-text"],
        formatter_class=Help,
        description="Embed captions with the frozen encoder the adapter's tables were embedded "
        "with (recorded in its checkpoint) and print one JSON object per caption (text, kappa "
        "where the method has one, uncertainty), or write them to --output as Parquet.",
    )
    given = p.add_mutually_exclusive_group()  # the default makes CAPTION optional to argparse
    given.add_argument("captions", nargs="*", default=[], metavar="CAPTION", help="to score")
    given.add_argument("--input", metavar="FILE", help="captions.txt (one a line) or .parquet")
    p.add_argument("--checkpoint", required=True, metavar="DIR|URI", help="folder, URI, hf-hub:")
    p.add_argument("--column", default="text", help="the caption column of a .parquet input")
    add_output_file(p, "FILE.parquet", "write text, kappa, uncertainty here")
    p.add_argument("--encoder", metavar="MODEL", help="instead of the one the checkpoint names")
    add_tracking_uri(p)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    p.add_argument("--batch-size", type=int, default=256, help="captions encoded at once")
    p.set_defaults(func=cmd_score_text)
