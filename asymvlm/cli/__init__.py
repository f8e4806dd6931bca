"""The ``asymvlm`` command line on cached embedding tables (one process), a module per group of
sub-commands (its ``COMMANDS``: name -> one-line help, its ``register``: their flags). :func:`main`
builds the given command's flags only, importing no torch, Ray or MLflow; a command imports them."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from asymvlm import __version__
from asymvlm.cli import curating, embedding, evaluation, export, search, text, tracking, training
from asymvlm.cli.flags import table_location
from asymvlm.entry import ArgumentParser, guarded

__all__ = ["build_parser", "main"]


GROUPS = (training, evaluation, text, search, export, embedding, curating, tracking)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every sub-command with its flags; given a ``command`` (``""``: none), only its group's
    flags, the other sub-commands named with their help."""
    parser = ArgumentParser(
        prog="asymvlm",
        description="Probabilistic adapters for frozen VLM embeddings (AsymVLM and baselines).",
    )
    parser.add_argument("--version", action="version", version=f"asymvlm {__version__}")
    verbose = "show every library's messages (Ray, MLflow...) too"
    parser.add_argument("--verbose", action="store_true", help=verbose)
    sub = parser.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        if command is None or command in group.COMMANDS:
            group.register(sub)
        else:
            for name, help in group.COMMANDS.items():
                sub.add_parser(name, help=help)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: bad input prints one ``error:`` line, exits 2; a diverged run exits 3."""
    from asymvlm import logs

    def run() -> int:
        given = sys.argv[1:] if argv is None else argv
        command = next((a for a in given if not a.startswith("-")), "")  # no top flag takes a value
        args = build_parser(command).parse_args(given)
        logs.configure(verbose=args.verbose)
        if not sys.stderr.isatty():  # progress bars on a terminal only, not as a log's long line
            args.quiet = True
        if hasattr(args, "default_split"):
            table_location(args)
        return args.func(args)

    return guarded(run)
