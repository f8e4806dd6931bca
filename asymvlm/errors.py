"""Errors that reach a user as one line (no traceback).

Every entry point (``asymvlm`` sub-commands, ``pipelines/*.py``) prints ``error: <message>`` for
these and exits with :data:`EXIT_USER_ERROR` (bad input: config, paths, tables, checkpoints) or
:data:`EXIT_DIVERGED` (a training run whose loss or gradient became non-finite). The message
always names what is wrong: the file, row, key or epoch/step.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

__all__ = [
    "EXIT_DIVERGED",
    "EXIT_USER_ERROR",
    "AsymVLMError",
    "CheckpointError",
    "ConfigError",
    "LockError",
    "NonFiniteError",
    "TrialFailed",
    "exit_code",
    "guarded",
]

EXIT_USER_ERROR = 2
EXIT_DIVERGED = 3


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


class TrialFailed(RuntimeError):
    """A sweep trial that produced no result; the message is the reason, in one line. (Defined
    here, in the installed package, so that it unpickles as this class on the driver.)"""


def _user_error_types() -> tuple[type[BaseException], ...]:
    from pydantic import ValidationError

    from asymvlm.data.sources import SourceError
    from asymvlm.tables import TableError

    return (AsymVLMError, TableError, SourceError, ValidationError, OSError, ValueError)


def exit_code(exc: BaseException) -> int | None:
    """The exit code for an error shown to users as one line, or None for a bug."""
    if isinstance(exc, NonFiniteError):
        return EXIT_DIVERGED
    if isinstance(exc, _user_error_types()):
        return EXIT_USER_ERROR
    return None


def guarded(main: Callable[[], int], prefix: str = "error") -> int:
    """Run an entry point: user errors print ``error: <message>`` (one line) and give their
    exit code instead of a traceback; ``ASYMVLM_TRACEBACK=1`` re-raises them for debugging."""
    try:
        return main()
    except KeyboardInterrupt:
        print(f"{prefix}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        code = exit_code(exc)
        if code is None or os.environ.get("ASYMVLM_TRACEBACK"):
            raise
        from pydantic import ValidationError

        if isinstance(exc, ValidationError):
            from asymvlm.config import validation_message

            message = validation_message(exc, exc.title)
        else:
            message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"{prefix}: {message}", file=sys.stderr)
        return code
