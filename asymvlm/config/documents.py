"""Config documents: YAML files, ``--set`` overrides and ``${VAR}`` from the environment.

One YAML dialect (YAML 1.1 with YAML 1.2 floats), one override syntax for every entry point
(``--set key.sub=value``, YAML-typed values, integers index lists), and an environment that
never lends a credential to a config (configs are logged: MLflow, Tune, Ray).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import yaml

from asymvlm.errors import ConfigError

__all__ = [
    "CREDENTIAL_NAME",
    "apply_overrides",
    "check_no_credentials",
    "expand_env",
    "load_yaml",
    "parse_yaml",
    "redact",
]

#: Environment variable names that look like credentials (never expanded into a config).
CREDENTIAL_NAME = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@:\s]*):[^/@\s]*@")
_FLOAT = r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+][0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$"""


class _Loader(yaml.SafeLoader):
    """YAML 1.1 with YAML 1.2 floats: ``1e-3`` is a number (PyYAML reads it as a string)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(_FLOAT, re.X), list("-+0123456789.")
)


def parse_yaml(text: str) -> Any:
    """``yaml.safe_load`` with YAML 1.2 floats."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


def load_yaml(path: str) -> dict[str, Any]:
    """A YAML mapping from ``path``; unreadable files and bad YAML are ConfigErrors."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = parse_yaml(fh.read())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config ({exc.strerror or exc})") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
    if not isinstance(doc, dict | None):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(doc).__name__}")
    return doc or {}


def apply_overrides(doc: dict[str, Any], items: Iterable[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` overrides in place (YAML-typed values; integers index lists:
    ``sweeps.0.epochs=5``)."""
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got {item!r}")
        try:
            value = parse_yaml(raw)
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {item!r}: the value is not valid YAML ({exc})") from None
        parts: list[Any] = key.strip().split(".")
        target: Any = doc
        for depth, part in enumerate(parts):
            if isinstance(target, list):
                if not part.lstrip("-").isdigit():
                    shown = ".".join(parts[: depth + 1])
                    raise ConfigError(f"--set {key}: {shown} indexes a list; use a number")
                part = int(part)
                if not -len(target) <= part < len(target):
                    raise ConfigError(
                        f"--set {key}: index {part} is out of range ({len(target)} entries)"
                    )
            elif not isinstance(target, dict):
                raise ConfigError(f"--set {key}: {'.'.join(parts[:depth])} is not a mapping")
            elif depth < len(parts) - 1 and target.get(part) is None:
                target[part] = {}
            if depth == len(parts) - 1:
                target[part] = value
            else:
                target = target[part]
    return doc


def _map_strings(value: Any, path: str, fn: Callable[[str, str], str], top: bool = True) -> Any:
    """``value`` with ``fn(text, key path)`` applied to every string nested in it."""
    if isinstance(value, str):
        return fn(value, path)
    if isinstance(value, list | tuple):
        return [_map_strings(v, f"{path}[{i}]", fn, False) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {
            k: _map_strings(v, f"{path}: {k}" if top else f"{path}.{k}", fn, False)
            for k, v in value.items()
        }
    return value


def redact(text: str) -> str:
    """``scheme://user:password@host`` -> ``scheme://user:***@host`` (anything else unchanged)."""
    return _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)


def check_no_credentials(value: Any, where: str = "config") -> None:
    """Refuse a URI with an embedded password anywhere in a (parsed) config."""

    def check(text: str, path: str) -> str:
        if _USERINFO.search(text):
            raise ConfigError(
                f"{path}: {redact(text)!r} carries a password in the URI; give credentials "
                "through the environment instead (MLFLOW_TRACKING_USERNAME/PASSWORD, AWS_* or "
                "an instance role, a Kubernetes secret) so they never reach logs or MLflow"
            )
        return text

    _map_strings(value, where, check)


def expand_env(value: Any, where: str = "config", extra: Mapping[str, str] | None = None) -> Any:
    """Expand ``${VAR}`` / ``$VAR`` in every string of ``value`` from ``extra`` then the
    environment. Credential-looking names are refused; an unset variable is an error."""
    extra = dict(extra or {})

    def expand(text: str, path: str) -> str:
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

    return _map_strings(value, where, expand)
