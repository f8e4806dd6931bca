"""Errors that reach a user as one line (no traceback).

Every entry point (``asymvlm`` sub-commands, ``pipelines/*.py``) prints ``error: <message>`` for
these and exits with :data:`EXIT_USER_ERROR` (bad input: config, paths, tables, checkpoints) or
:data:`EXIT_DIVERGED` (a training run whose loss or gradient became non-finite). The message
always names what is wrong: the file, row, key or epoch/step.
"""

from __future__ import annotations

__all__ = [
    "EXIT_DIVERGED",
    "EXIT_USER_ERROR",
    "AsymVLMError",
    "CheckpointError",
    "ConfigError",
    "LockError",
    "NonFiniteError",
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
