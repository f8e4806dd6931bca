"""What every entry point shares (the ``asymvlm`` command line, ``python -m asymvlm.*``, the
scripts of ``pipelines/``): its :class:`ArgumentParser`, the extras it needs (:func:`require`)
and :func:`guarded`, which turns the project's errors into one line and their exit code."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import NoReturn

from asymvlm.errors import (
    EXIT_DIVERGED,
    EXIT_UNFINISHED,
    EXIT_USER_ERROR,
    AsymVLMError,
    ConfigError,
    NonFiniteError,
    Unfinished,
    one_line,
)
from asymvlm.extras import check_extras, missing_extra


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors (its sub-parsers' too) are a :class:`ConfigError` naming the
    command and flag: one line under :func:`guarded`, not the whole usage text."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{self.prog}: {message}")


def job_parser(description: str, keys: str, example: str) -> ArgumentParser:
    """A job script's flags: ``--config FILE`` (``keys``: what the file holds), ``--set
    KEY=VALUE`` overrides (``example``: one) and ``--verbose``."""
    parser = ArgumentParser(description=description)
    parser.add_argument("--config", required=True, help=keys)
    override = f"override a key (YAML value; dots and list indices: {example})"
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=override)
    parser.add_argument("--verbose", action="store_true", help="everything on the console")
    return parser


def _validation_line(exc: BaseException) -> str | None:
    """A pydantic ``ValidationError`` that escaped the config boundary, on one line (else None)."""
    from pydantic import ValidationError

    if not isinstance(exc, ValidationError):
        return None
    problems = [
        f"{'.'.join(map(str, e['loc'])) or exc.title}: {e['msg'].removeprefix('Value error, ')}"
        for e in exc.errors()[:3]
    ]
    return f"{exc.title}: " + "; ".join(problems)


def require(*extras: str) -> None:
    """:func:`check_extras` for an entry point: the missing extra printed, exit 2."""
    try:
        check_extras(*extras)
    except ModuleNotFoundError as exc:
        print(f"error: {missing_extra(exc)}", file=sys.stderr)
        raise SystemExit(EXIT_USER_ERROR) from None


def exit_code(exc: BaseException) -> int | None:
    """The exit code of an error shown as one line, or None for a bug."""
    for kind, code in ((NonFiniteError, EXIT_DIVERGED), (Unfinished, EXIT_UNFINISHED)):
        if isinstance(exc, kind):
            return code
    user = isinstance(exc, AsymVLMError) or bool(_validation_line(exc) or missing_extra(exc))
    return EXIT_USER_ERROR if user else None


def guarded(main: Callable[[], int], prefix: str = "error") -> int:
    """Run an entry point: the project's errors print ``error: <message>`` and give their exit
    code; a bug raises with its traceback. ``ASYMVLM_TRACEBACK=1`` re-raises every error."""
    try:
        return main()
    except KeyboardInterrupt:
        print(f"{prefix}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        code = exit_code(exc)
        if code is None or os.environ.get("ASYMVLM_TRACEBACK"):
            raise
        line = _validation_line(exc) or missing_extra(exc) or one_line(exc)
        print(f"{prefix}: {line}", file=sys.stderr)
        return code
