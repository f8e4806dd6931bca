"""The config boundary of every entry point: YAML, ``--set key=value``, ``${VAR}`` (never a
credential), validated; each problem one :class:`~asymvlm.errors.ConfigError` line."""

from __future__ import annotations

import argparse
import difflib
import functools
import os
import re
import types
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError
from pydantic_core import PydanticUndefined

from asymvlm.errors import ConfigError

T = TypeVar("T")
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


def _parse(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


def load_yaml(path: str) -> dict[str, Any]:
    """A YAML mapping from ``path``; unreadable files and bad YAML are ConfigErrors."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = _parse(fh.read())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config ({exc.strerror or exc})") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
    if not isinstance(doc, dict | None):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(doc).__name__}")
    return doc or {}


def apply_overrides(doc: dict[str, Any], items: Iterable[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` overrides in place (YAML values; integers index lists)."""
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got {item!r}")
        try:
            value = _parse(raw)
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
        sep = ": " if top else "."
        return {k: _map_strings(v, f"{path}{sep}{k}", fn, False) for k, v in value.items()}
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
    """``${VAR}`` / ``$VAR`` expanded from ``extra``, then the environment (not credentials)."""
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


# -- validation -----------------------------------------------------------------------------------
class StrictModel(BaseModel):
    """A config section: unknown keys are errors and defaults are validated like values."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


@functools.cache
def _adapter(model: Any) -> TypeAdapter:
    return TypeAdapter(model)


def validate(model: type[T], data: Any, source: str, flags: bool = False) -> T:
    """``model`` from ``data``, or a one-line :class:`ConfigError` naming ``source`` and the key."""
    try:
        return _adapter(model).validate_python(data)
    except ValidationError as err:
        raise ConfigError(_message(err, source, model, flags)) from None


def _schema_words(schema: Any) -> tuple[set[str], set[str]]:
    """Every key name and every union tag (a ``kind``) in ``schema``'s JSON schema."""
    names: set[str] = set()
    tags: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            names.update(node.get("properties") or {})
            tags.update((node.get("discriminator") or {}).get("mapping") or {})
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(_adapter(schema).json_schema())
    return names, tags


def _message(err: ValidationError, source: str, schema: Any, flags: bool, limit: int = 3) -> str:
    """``source: key.path: what is wrong`` for each problem (at most ``limit``), on one line."""
    names, tags = _schema_words(schema)
    lines = []
    for e in err.errors()[:limit]:
        loc = list(e["loc"])
        key = loc[-1] if loc else ""
        # a discriminated union puts its tag after a list index: evaluations[3].retrieval.data
        loc = [
            p for i, p in enumerate(loc) if not (i and isinstance(loc[i - 1], int) and p in tags)
        ]
        shown = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
        if flags and isinstance(key, str) and "method_kwargs" not in loc:  # a method's own keys
            shown = "--" + key.replace("_", "-")
        ctx, given, msg = e.get("ctx", {}), e.get("input"), e["msg"].removeprefix("Value error, ")
        if e["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            hint = difflib.get_close_matches(str(key), names - {key}, n=1, cutoff=0.6)
            lines.append(
                f"{shown}: unknown key" + (f" (did you mean {hint[0]!r}?)" if hint else "")
            )
        elif e["type"] == "missing":
            lines.append(f"{shown}: required key is missing")
        elif e["type"] in ("union_tag_invalid", "union_tag_not_found"):
            lines.append(
                f"{shown}.kind = {ctx.get('tag')!r}: must be one of {ctx.get('expected_tags', '')}"
            )
        elif isinstance(given, str | int | float | bool) or given is None:
            lines.append(f"{shown} = {given!r}: {msg}")
        else:
            lines.append(f"{shown}: {msg}")
    more = len(err.errors()) - limit
    text = "; ".join(line.removeprefix(": ") for line in lines)
    return f"{source}: {text}" + (f" (and {more} more)" if more > 0 else "")


# -- command-line flags made from a schema --------------------------------------------------------
def _plain(tp: Any) -> Any:
    """``X`` of ``Annotated[X, ...]`` and ``X | None``."""
    while get_origin(tp) in (Annotated, Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        tp = args[0] if get_origin(tp) is Annotated or len(args) == 1 else str
    return tp


def add_model_flags(
    parser: argparse.ArgumentParser,
    model: Any,
    *,
    exclude: Collection[str] = (),
    required: Collection[str] = (),
    choices: Mapping[str, Sequence[str]] | None = None,
    metavars: Mapping[str, str] | None = None,
) -> list[str]:
    """One ``--flag`` per scalar field of a pydantic model (but ``exclude``), with its type,
    choices, default and description; a bool is a switch. Returns the field names added."""
    added = []
    for name, info in model.__pydantic_fields__.items():
        tp = _plain(info.annotation)
        if name in exclude or tp not in (int, float, str, bool) and get_origin(tp) is not Literal:
            continue
        kwargs: dict[str, Any] = {"help": info.description, "dest": name}
        if tp is bool:
            kwargs["action"] = "store_true"
        elif get_origin(tp) is Literal:
            kwargs["choices"] = list(get_args(tp))
        else:
            kwargs["type"] = tp
        if name in (choices or {}):
            kwargs["choices"] = list(choices[name])  # type: ignore[index]
        if name in (metavars or {}):
            kwargs["metavar"] = metavars[name]  # type: ignore[index]
        if name in required:
            kwargs["required"] = True
        else:
            kwargs["default"] = None if info.default is PydanticUndefined else info.default
        parser.add_argument(f"--{name.replace('_', '-')}", **kwargs)
        added.append(name)
    return added


def model_values(args: argparse.Namespace, names: Sequence[str]) -> dict[str, Any]:
    """The values of the flags made by :func:`add_model_flags` (unset ones left out)."""
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}
