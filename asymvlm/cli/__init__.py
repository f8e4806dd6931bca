"""The ``asymvlm`` command line on cached embedding tables (one process), a module per group of
sub-commands. Building the parser imports no torch, Ray or MLflow (every ``--help`` is quick):
a command imports what it needs when it runs."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from asymvlm import __version__
from asymvlm.cli import embed, evaluation, export, runs, text, training
from asymvlm.cli.common import table_location
from asymvlm.errors import ArgumentParser, guarded

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="asymvlm",
        description="Probabilistic adapters for frozen VLM embeddings (AsymVLM and baselines).",
    )
    parser.add_argument("--version", action="version", version=f"asymvlm {__version__}")
    parser.add_argument(
        "--verbose", action="store_true", help="show every library's messages (Ray, MLflow...) too"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for group in (training, evaluation, text, export, embed, runs):
        group.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: bad input prints one ``error:`` line, exits 2; a diverged run exits 3."""
    from asymvlm import logs

    def run() -> int:
        args = build_parser().parse_args(argv)
        logs.configure(verbose=args.verbose)
        if not sys.stderr.isatty():  # progress bars on a terminal only, not as a log's long line
            args.quiet = True
        if hasattr(args, "default_split"):
            table_location(args)
        return args.func(args)

    return guarded(run)
