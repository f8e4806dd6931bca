"""The project's error types, and how an entry point shows them (a leaf: imports no project module).

Every entry point (``asymvlm`` sub-commands, ``pipelines/*.py``) runs through :func:`guarded`:
an error of the project's own types prints ``error: <message>`` (one line, no traceback) and
exits with :data:`EXIT_USER_ERROR` (bad input: config, paths, tables, sources, checkpoints),
:data:`EXIT_DIVERGED` (a training run whose loss or gradient became non-finite) or
:data:`EXIT_UNFINISHED` (the cluster could not finish the work: rerun the same command to go
on). The message
always names what is wrong: the file, row, key or epoch/step. Anything else is a bug: its
traceback is shown.

The types of other layers subclass :class:`AsymVLMError` where they are defined
(:class:`asymvlm.tables.TableError`, :class:`asymvlm.data.sources.SourceError`, ...).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

__all__ = [
    "EXIT_DIVERGED",
    "EXIT_UNFINISHED",
    "EXIT_USER_ERROR",
    "AsymVLMError",
    "CheckpointError",
    "ConfigError",
    "LockError",
    "NonFiniteError",
    "TrialFailed",
    "Unfinished",
    "exit_code",
    "guarded",
    "one_line",
]

EXIT_USER_ERROR = 2
EXIT_DIVERGED = 3
#: sysexits.h's EX_TEMPFAIL: a temporary failure, the user is invited to retry.
EXIT_UNFINISHED = 75


class AsymVLMError(Exception):
    """Base class: an error whose message is meant for the user as it is."""


class ConfigError(AsymVLMError, ValueError):
    """A configuration value, key, flag or path is invalid; the message names it."""


class CheckpointError(AsymVLMError, ValueError):
    """A checkpoint folder is missing, incomplete, inconsistent or would be overwritten."""


class LockError(AsymVLMError, RuntimeError):
    """Another writer holds the output (a local file lock or an object-store lease)."""


class NonFiniteError(AsymVLMError, FloatingPointError):
    """A loss, gradient or model output became NaN/inf (a diverged run). Never a score."""


class TrialFailed(AsymVLMError, RuntimeError):
    """A sweep trial that produced no result; the message is the reason, in one line. (Defined
    here, in the installed package, so that it unpickles as this class on the driver.)"""


class Unfinished(AsymVLMError, RuntimeError):
    """Work the cluster could not finish (no node to run it); what finished is kept, and the
    same command run again goes on from there."""


def one_line(exc: BaseException) -> str:
    """The message of ``exc`` on one line (its type's name when it has none)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def _validation_line(exc: BaseException) -> str | None:
    """A pydantic ``ValidationError`` that escaped the config boundary (which turns them into
    :class:`ConfigError`, :func:`asymvlm.config.validate`) as one line; None for other errors."""
    try:
        from pydantic import ValidationError
    except ImportError:  # pragma: no cover - pydantic is a dependency
        return None
    if not isinstance(exc, ValidationError):
        return None
    problems = [
        f"{'.'.join(map(str, e['loc'])) or exc.title}: {e['msg'].removeprefix('Value error, ')}"
        for e in exc.errors()[:3]
    ]
    return f"{exc.title}: " + "; ".join(problems)


def exit_code(exc: BaseException) -> int | None:
    """The exit code of an error shown to users as one line (the project's own types, and the
    config boundary's validation errors), or None for a bug."""
    if isinstance(exc, NonFiniteError):
        return EXIT_DIVERGED
    if isinstance(exc, Unfinished):
        return EXIT_UNFINISHED
    if isinstance(exc, AsymVLMError) or _validation_line(exc) is not None:
        return EXIT_USER_ERROR
    return None


def guarded(main: Callable[[], int], prefix: str = "error") -> int:
    """Run an entry point: the project's errors print ``error: <message>`` (one line) and give
    their exit code instead of a traceback; anything else (a bug) raises with its traceback.
    ``ASYMVLM_TRACEBACK=1`` re-raises every error, for debugging."""
    try:
        return main()
    except KeyboardInterrupt:
        print(f"{prefix}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        code = exit_code(exc)
        if code is None or os.environ.get("ASYMVLM_TRACEBACK"):
            raise
        print(f"{prefix}: {_validation_line(exc) or one_line(exc)}", file=sys.stderr)
        return code
