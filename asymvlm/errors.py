"""The project's error types and how an entry point shows them (:func:`guarded`); a leaf:
imports no project module. Other layers subclass :class:`AsymVLMError` where they live."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import NoReturn

#: Bad input; a diverged training run; work the cluster could not finish (sysexits' TEMPFAIL).
EXIT_USER_ERROR, EXIT_DIVERGED, EXIT_UNFINISHED = 2, 3, 75


class AsymVLMError(Exception):
    """Base class: an error whose message is meant for the user as it is."""


class ConfigError(AsymVLMError, ValueError):
    """A configuration value, key, flag or path is invalid; the message names it."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors (its sub-parsers' too) are a :class:`ConfigError` naming the
    command and flag: one line under :func:`guarded`, not the whole usage text."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{self.prog}: {message}")


class CheckpointError(AsymVLMError, ValueError):
    """A checkpoint folder is missing, incomplete, inconsistent or would be overwritten."""


class LockError(AsymVLMError, RuntimeError):
    """Another writer holds the output (a local file lock or an object-store lease)."""


class NonFiniteError(AsymVLMError, FloatingPointError):
    """A loss, gradient or model output became NaN/inf (a diverged run). Never a score."""


class TrialFailed(AsymVLMError, RuntimeError):
    """A sweep trial that produced no result; the message is the reason, in one line."""


class Unfinished(AsymVLMError, RuntimeError):
    """Work the cluster could not finish; what finished is kept, and the same command run again
    goes on from there."""


def one_line(exc: BaseException) -> str:
    """The message of ``exc`` on one line (its type's name when it has none)."""
    return " ".join(str(exc).split()) or type(exc).__name__


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


#: The extra (``pip install 'asymvlm[EXTRA]'``) that provides each optional top-level module.
EXTRAS = {
    "ray": "ray",
    "fastapi": "ray",
    "mlflow": "tracking",
    "matplotlib": "report",
    "tabulate": "report",
    "markdown_it": "report",
    "transformers": "embed",
    "open_clip": "embed",
    "PIL": "embed",
    "s3fs": "s3",
    "eccv_caption": "eccv",
}


def missing_extra(exc: BaseException) -> str | None:
    """The extra to install, when ``exc`` (or its cause) is an optional module's ImportError."""
    cause: BaseException | None = exc
    while cause is not None:
        module = (getattr(cause, "name", None) or "").split(".")[0]
        if isinstance(cause, ImportError) and module in EXTRAS:
            return f"{module} is not installed: pip install 'asymvlm[{EXTRAS[module]}]'"
        cause = cause.__cause__
    return None


def check_extras(*extras: str) -> None:
    """Raise the ImportError of the first module of ``extras`` that is not installed."""
    for module, extra in EXTRAS.items():
        if extra in extras and importlib.util.find_spec(module) is None:
            raise ModuleNotFoundError(f"No module named {module!r}", name=module)


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
