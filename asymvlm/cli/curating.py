"""``asymvlm curate``: κ for every caption of a pool, and selections by it (Ray Data, started
here on this machine or joined where ``$RAY_ADDRESS`` says)."""

from __future__ import annotations

import argparse
import json
from functools import partial
from typing import TYPE_CHECKING

from asymvlm.cli.flags import Help, add_tracking_uri
from asymvlm.config import add_model_flags, model_values, validate

if TYPE_CHECKING:
    from asymvlm.curation import CurateConfig

COMMANDS = {"curate": "kappa for every caption of an image-text pool, and selections by it"}


def cmd_curate(args: argparse.Namespace) -> int:
    """The curation job on the local or joined Ray cluster (:func:`run_curation`)."""
    from asymvlm.curation import CurateConfig, parse_rule

    values = model_values(args, args.curate_keys) | {"tracking_uri": args.tracking_uri}
    if args.rule:
        values["rules"] = [parse_rule(text) for text in args.rule]
    cfg = validate(CurateConfig, values, "asymvlm curate", flags=True)
    return run_curation(cfg)


def run_curation(cfg: CurateConfig) -> int:
    """Run ``cfg`` on Ray, print its summary; shards left out end it with an error listing them."""
    from asymvlm.curation import curate
    from asymvlm.curation.pools import PoolError
    from asymvlm_ray.curation_actors import score_on_ray
    from asymvlm_ray.session import RaySession

    with RaySession() as session:
        summary = curate(cfg, executor=partial(score_on_ray, session=session))
    kept = {r.name: {"kept": r.kept, "fraction": round(r.fraction, 4)} for r in summary.rules}
    print(json.dumps({"output": cfg.output, "rows": summary.rows, "rules": kept}, indent=2))
    if summary.failed:
        left = "; ".join(f"{o.shard} ({o.error})" for o in summary.failed)
        raise PoolError(f"{len(summary.failed)} shard(s) left out, run again to retry: {left}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from asymvlm.curation import CurateConfig

    p = sub.add_parser(
        "curate",
        help=COMMANDS["curate"],
        description="Score every caption of a pool (img2dataset parquet or WebDataset, "
        "clip-retrieval's npy + metadata, DataComp's parquet + npz, or tables) with an "
        "adapter, shard by shard into OUTPUT/scores/, then write each rule's selection to "
        "OUTPUT/selections/ and a figure of κ. Re-running goes on where a run stopped.",
        formatter_class=Help,
    )
    keys = add_model_flags(
        p, CurateConfig, exclude=("tracking_uri",), required=("pool", "checkpoint", "output")
    )
    rule = "a selection rule NAME:KEY=VALUE[,...], keys kappa_min, most_specific, clip_min, "
    rule += "clip_top (repeatable; default specific-70:most_specific=0.7)"
    p.add_argument("--rule", action="append", default=[], metavar="RULE", help=rule)
    add_tracking_uri(p, "the job is logged to (and runs:/ checkpoints read from)")
    p.set_defaults(func=cmd_curate, curate_keys=keys)
