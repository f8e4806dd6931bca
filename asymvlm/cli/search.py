"""``asymvlm index`` and ``asymvlm search``: a kappa-aware index of a split's images and
captions, and queries against it (docs/search.md)."""

from __future__ import annotations

import argparse
import json
import logging

from asymvlm.cli.flags import Help, add_tracking_uri
from asymvlm.config import add_model_flags, model_values, validate
from asymvlm.errors import ConfigError
from asymvlm.indexing.settings import IndexSettings

logger = logging.getLogger(__name__)
COMMANDS = {
    "index": "index a split's images and captions for search (FAISS, ranked by the adapter)",
    "search": "search an index by caption or image: results, kappa, confidence, decision",
}


def cmd_index(args: argparse.Namespace) -> int:
    from asymvlm.extras import check_extras
    from asymvlm.indexing import build_index

    if args.tracking_uri:
        check_extras("tracking")  # before the build, not after it
    values = model_values(args, args.index_keys)
    settings = validate(IndexSettings, values, "asymvlm index", flags=True)
    where = (args.embeddings, args.split, args.checkpoint, args.output)
    manifest = build_index(
        *where, settings, tracking_uri=args.tracking_uri, overwrite=args.overwrite
    )
    for shard in manifest.shards:
        for name, record in (("images", shard.images), ("captions", shard.captions)):
            logger.info(
                "%s %s: a %s index of %d rows in %.1f s, recall@10 %.3f against exact search",
                shard.folder,
                name,
                record.spec.kind,
                record.rows,
                record.seconds,
                record.recall_at_10,
            )
    if args.tracking_uri:
        from asymvlm import tracking
        from asymvlm.indexing.build import log_build

        name = f"index {manifest.method}"
        with tracking.run(args.tracking_uri, args.experiment, name, kind="index") as run:
            log_build(run, args.output, manifest)
    counts = {"images": manifest.images, "captions": manifest.captions}
    print(json.dumps({"index": args.output, "method": manifest.method, **counts}))
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    from asymvlm.api import search

    if not args.captions and not args.image:
        raise ConfigError("nothing to search: give captions, or --image FILE")
    if args.k < 1:
        raise ConfigError(f"--k must be >= 1, got {args.k}")
    for result in search(args.index, args.captions, args.image, k=args.k, encoder=args.encoder):
        print(result.model_dump_json())
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "index",
        help=COMMANDS["index"],
        formatter_class=Help,
        description="Stream a split's tables through an adapter into FAISS indexes (exact for "
        "small splits, HNSW or IVF for large ones) and fit the decisions on a validation split.",
    )
    p.add_argument(
        "--embeddings", required=True, metavar="ROOT[:SPLIT]", help="embedding table root"
    )
    p.add_argument("--split", help="split to index (default: test)")
    p.set_defaults(default_split="test")
    p.add_argument("--checkpoint", required=True, metavar="DIR|URI", help="folder, URI, hf-hub:")
    p.add_argument("--output", required=True, metavar="DIR|URI", help="the index folder")
    keys = add_model_flags(p, IndexSettings, metavars={"memory_gib": "GIB", "validation": "SPLIT"})
    p.add_argument("--overwrite", action="store_true", help="replace an index at --output")
    add_tracking_uri(p, "the build is logged to (and runs:/ checkpoints read from)")
    p.add_argument("--experiment", default="asymvlm-index", help="the build's MLflow experiment")
    p.set_defaults(func=cmd_index, index_keys=keys)

    p = sub.add_parser(
        "search",
        help=COMMANDS["search"],
        formatter_class=Help,
        description="Print one JSON object per query: kappa, the probability that the first "
        "result is right, the decision (answer, widen, abstain) and the results.",
    )
    p.add_argument("captions", nargs="*", default=[], metavar="CAPTION", help="text -> image")
    p.add_argument("--image", action="append", default=[], metavar="FILE", help="image -> text")
    p.add_argument("--index", required=True, metavar="DIR|URI", help="an index folder")
    p.add_argument("--k", type=int, default=10, help="results per query (widened: more)")
    p.add_argument("--encoder", metavar="MODEL", help="instead of the one the index names")
    p.set_defaults(func=cmd_search)
