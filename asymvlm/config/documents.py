"""Config documents: YAML files and ``--set`` overrides.

One YAML dialect (YAML 1.1 with YAML 1.2 floats, :func:`parse_yaml`) and one override syntax
for every entry point (``--set key.sub=value``, YAML-typed values, integers index lists:
``sweeps.0.epochs=5``, :func:`apply_overrides`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import yaml

from asymvlm.errors import ConfigError

__all__ = ["apply_overrides", "child", "load_yaml", "parse_yaml", "walk"]


class _Loader(yaml.SafeLoader):
    """YAML 1.1 with YAML 1.2 floats: ``1e-3`` is a number (PyYAML reads it as a string)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+][0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def parse_yaml(text: str) -> Any:
    """``yaml.safe_load`` with YAML 1.2 floats (see :class:`_Loader`)."""
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
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(doc).__name__}")
    return doc


def apply_overrides(doc: dict[str, Any], items: Iterable[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` overrides in place (YAML-typed values; integers index lists:
    ``sweeps.0.epochs=5``). The one ``--set`` syntax of every entry point."""
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got {item!r}")
        try:
            value = parse_yaml(raw)
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {item!r}: the value is not valid YAML ({exc})") from None
        parts = key.strip().split(".")
        target: Any = doc
        for depth, part in enumerate(parts):
            last = depth == len(parts) - 1
            shown = ".".join(parts[: depth + 1])
            if isinstance(target, list):
                if not part.lstrip("-").isdigit():
                    raise ConfigError(f"--set {key}: {shown} indexes a list; use a number")
                index = int(part)
                if not -len(target) <= index < len(target):
                    raise ConfigError(
                        f"--set {key}: index {index} is out of range ({len(target)} entries)"
                    )
                if last:
                    target[index] = value
                else:
                    target = target[index]
            elif isinstance(target, dict):
                if last:
                    target[part] = value
                else:
                    if target.get(part) is None:
                        target[part] = {}
                    target = target[part]
            else:
                raise ConfigError(f"--set {key}: {'.'.join(parts[:depth])} is not a mapping")
    return doc


def child(path: str, key: Any, root: str) -> str:
    """``root: key`` at the top, ``path.key`` below."""
    return f"{root}: {key}" if path == root else f"{path}.{key}"


def walk(value: Any, path: str, root: str | None = None) -> Iterable[tuple[str, Any]]:
    """``(key path, item)`` for ``value`` and everything nested in it."""
    root = path if root is None else root
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from walk(v, child(path, k, root), root)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from walk(v, f"{path}[{i}]", root)
