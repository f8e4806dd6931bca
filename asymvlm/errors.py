"""The project's error types and the exit code of each (:func:`asymvlm.entry.guarded` shows
them); a leaf: imports no project module. Other layers subclass :class:`AsymVLMError`."""

from __future__ import annotations

#: Bad input; a diverged training run; work the cluster could not finish (sysexits' TEMPFAIL).
EXIT_USER_ERROR, EXIT_DIVERGED, EXIT_UNFINISHED = 2, 3, 75


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
    """A sweep trial that produced no result; the message is the reason, in one line."""


class Unfinished(AsymVLMError, RuntimeError):
    """Work the cluster could not finish; what finished is kept, the same command goes on."""


def one_line(exc: BaseException) -> str:
    """The message of ``exc`` on one line (its type's name when it has none)."""
    return " ".join(str(exc).split()) or type(exc).__name__
