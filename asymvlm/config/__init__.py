"""The config boundary shared by every entry point: documents in, typed objects out.

A file is read once (:func:`load_yaml`), overridden with ``--set key.sub=value``
(:func:`apply_overrides`), expanded from the environment without a credential
(:func:`expand_env`) and validated (:func:`validate`) into the schema that lives with what it
describes (``TrainConfig``, ``RunSpec``, ``EmbedConfig``, the Ray layer's ``pipelines.schema``);
every problem is one :class:`~asymvlm.errors.ConfigError` line naming the file and key.
"""

from asymvlm.config.documents import (
    CREDENTIAL_NAME,
    apply_overrides,
    check_no_credentials,
    expand_env,
    load_yaml,
    parse_yaml,
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
]
