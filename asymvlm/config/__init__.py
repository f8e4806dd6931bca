"""The config boundary shared by every entry point: documents in, typed objects out.

A config file is read once (:func:`load_yaml`, YAML 1.2 floats), overridden with the one
``--set key.sub=value`` syntax (:func:`apply_overrides`), expanded from the environment without
ever taking a credential (:func:`expand_env`, :func:`check_no_credentials`, :func:`redact`) and
validated into a typed object (:func:`validate`): unknown keys (with a "did you mean"), types
and ranges become one :class:`~asymvlm.errors.ConfigError` line naming the file and key path.

The schemas themselves live with what they describe: :class:`asymvlm.training.TrainConfig`,
:class:`asymvlm.protocol.RunSpec`, :class:`asymvlm.data.embed.EmbedConfig`, the evaluation
specs of :mod:`asymvlm.evaluation.registry`; the schemas of sweeps, pipelines and Serve (the Ray
layer) in ``pipelines/schema.py``.
"""

from asymvlm.config.documents import apply_overrides, load_yaml, parse_yaml, walk
from asymvlm.config.environment import (
    CREDENTIAL_NAME,
    check_no_credentials,
    expand_env,
    redact,
)
from asymvlm.config.flags import add_model_flags, model_values
from asymvlm.config.validation import StrictModel, validate, validation_message

__all__ = [
    "CREDENTIAL_NAME",
    "StrictModel",
    "add_model_flags",
    "apply_overrides",
    "check_no_credentials",
    "expand_env",
    "load_yaml",
    "model_values",
    "parse_yaml",
    "redact",
    "validate",
    "validation_message",
    "walk",
]
