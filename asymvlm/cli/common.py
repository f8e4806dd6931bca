"""What the sub-commands share: the help formatter, the data flags, ``key=value`` pairs."""

from __future__ import annotations

import argparse
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


def parse_kv(items: Sequence[str], flag: str = "--method-arg") -> dict[str, str]:
    """``key=value`` pairs as strings; the schema that takes them converts the values."""
    out: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(f"{flag} expects key=value, got {item!r}")
        out[key] = value
    return out


def add_data_args(p: argparse.ArgumentParser, split_default: str) -> None:
    p.add_argument("--embeddings", required=True, metavar="ROOT", help="embedding table root")
    p.add_argument("--split", default=split_default, help="split of the tables")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 ... or auto")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def add_tracking_uri(
    p: argparse.ArgumentParser, what: str = "runs:/ and models:/ are read"
) -> None:
    """``--tracking-uri``, the one name of the MLflow store on every sub-command."""
    p.add_argument(
        "--tracking-uri",
        default=os.environ.get("MLFLOW_TRACKING_URI"),
        metavar="URI",
        help=f"the MLflow store {what} (default: $MLFLOW_TRACKING_URI)",
    )
