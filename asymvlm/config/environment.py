"""What a config takes from the environment: ``${VAR}``, and never a credential.

Configs are logged (MLflow, Tune, Ray), so credentials reach the code through the environment's
own chain (node environment, instance roles, Kubernetes secrets), never through a config:
:func:`expand_env` never expands a credential-looking name (:data:`CREDENTIAL_NAME`), a URI with
``user:password@`` in a config is refused (:func:`check_no_credentials`), and :func:`redact`
hides a password wherever a URI from the environment is printed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from asymvlm.config.documents import child, walk
from asymvlm.errors import ConfigError

__all__ = ["CREDENTIAL_NAME", "check_no_credentials", "expand_env", "redact"]

#: Environment variable names that look like credentials (never expanded into a config).
CREDENTIAL_NAME = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_URI_USERINFO = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@:\s]*):(?P<pw>[^/@\s]*)@"
)


def redact(text: str) -> str:
    """``scheme://user:password@host`` -> ``scheme://user:***@host`` (anything else unchanged)."""
    return _URI_USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)


def check_no_credentials(value: Any, where: str = "config") -> None:
    """Refuse a URI with an embedded password anywhere in a (parsed) config."""
    for path, item in walk(value, where):
        if isinstance(item, str) and _URI_USERINFO.search(item):
            raise ConfigError(
                f"{path}: {redact(item)!r} carries a password in the URI; give credentials "
                "through the environment instead (MLFLOW_TRACKING_USERNAME/PASSWORD, AWS_* or "
                "an instance role, a Kubernetes secret) so they never reach logs or MLflow"
            )


def expand_env(value: Any, where: str = "config", extra: Mapping[str, str] | None = None) -> Any:
    """Expand ``${VAR}`` / ``$VAR`` in every string of ``value`` from ``extra`` then the
    environment. Credential-looking names are refused; an unset variable is an error."""
    extra = dict(extra or {})

    def one(text: str, path: str) -> str:
        def sub(match: re.Match[str]) -> str:
            name = match.group(1) or match.group(2)
            if name in extra:
                return extra[name]
            if CREDENTIAL_NAME.search(name):
                raise ConfigError(
                    f"{path}: refusing to expand ${{{name}}}: it looks like a credential, and "
                    "configs are logged (MLflow, Tune, Ray). Leave credentials in the "
                    "environment; the libraries read them from there"
                )
            if name not in os.environ:
                raise ConfigError(f"{path}: ${{{name}}} is not set in the environment")
            return os.environ[name]

        return _ENV_REF.sub(sub, text)

    def expand(item: Any, path: str) -> Any:
        if isinstance(item, str):
            return one(item, path)
        if isinstance(item, list):
            return [expand(v, f"{path}[{i}]") for i, v in enumerate(item)]
        if isinstance(item, dict):
            return {k: expand(v, child(path, k, where)) for k, v in item.items()}
        return item

    return expand(value, where)
