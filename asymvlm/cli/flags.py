"""What the sub-commands share: the help formatter, the data flags, ``key=value`` pairs."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Sequence

from asymvlm.errors import ConfigError


class Help(argparse.ArgumentDefaultsHelpFormatter):
    """A default shown once: not where the help names it, nor for options without one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "default" in text or default is None or default is False:
            return text
        if default == [] or default == argparse.SUPPRESS:
            return text
        return super()._get_help_string(action)


def parse_kv(items: Sequence[str], flag: str, form: str = "key=value") -> dict[str, str]:
    """``key=value`` pairs of ``flag`` as strings (the schema that takes them converts them)."""
    out: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(f"{flag} expects {form}, got {item!r}")
        out[key] = value
    return out


def add_data_args(p: argparse.ArgumentParser, split_default: str) -> None:
    """``--embeddings ROOT[:SPLIT]``, ``--split`` (see :func:`table_location`), ``--device``,
    ``--quiet``."""
    root = "embedding table root, or ROOT:SPLIT"
    p.add_argument("--embeddings", required=True, metavar="ROOT[:SPLIT]", help=root)
    p.add_argument("--split", help=f"split of the tables (default: {split_default})")
    p.set_defaults(default_split=split_default)
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 ... or auto")
    quiet = "no progress bars (none either off a terminal)"
    p.add_argument("--quiet", action="store_true", help=quiet)


def table_location(args: argparse.Namespace) -> None:
    """``args.embeddings`` and ``args.split`` from ``--embeddings ROOT`` or ``ROOT:SPLIT`` (a
    folder of that name is a root) and ``--split``; a split named twice must agree."""
    from asymvlm.tables import parse_location

    value, named = args.embeddings, None
    if ":" in value and not os.path.isdir(value):
        with contextlib.suppress(ValueError):  # not ROOT:SPLIT (an s3:// root): a root
            value, named = parse_location(value)
    if named and args.split not in (None, named):
        raise ConfigError(
            f"--embeddings {args.embeddings} names split {named}, --split {args.split}"
        )
    args.embeddings, args.split = value, named or args.split or args.default_split


def add_output_file(p: argparse.ArgumentParser, metavar: str, help: str, **kwargs: object) -> None:
    """``--output FILE`` and ``--overwrite`` (a file already there is kept without it)."""
    p.add_argument("--output", metavar=metavar, help=help, **kwargs)
    p.add_argument("--overwrite", action="store_true", help="replace a file already at --output")


def check_output_file(args: argparse.Namespace) -> None:
    """Refuse a file already at ``--output`` unless ``--overwrite``, before any work is done."""
    from asymvlm import storage

    if args.output and not args.overwrite and storage.exists(args.output):
        raise ConfigError(f"--output {args.output} already exists; pass --overwrite to replace it")


def add_tracking_uri(
    p: argparse.ArgumentParser, what: str = "runs:/ and models:/ are read"
) -> None:
    """``--tracking-uri``, the one name of the MLflow store on every sub-command."""
    store = f"the MLflow store {what} (default: $MLFLOW_TRACKING_URI)"
    default = os.environ.get("MLFLOW_TRACKING_URI")
    p.add_argument("--tracking-uri", default=default, metavar="URI", help=store)
