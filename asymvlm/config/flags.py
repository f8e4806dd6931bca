"""Command-line flags made from a schema: the schema is the one place the keys are written."""

from __future__ import annotations

import argparse
import types
from collections.abc import Collection, Mapping, Sequence
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic_core import PydanticUndefined

__all__ = ["add_model_flags", "model_values"]


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
    """One ``--flag`` per scalar field of a pydantic model or dataclass (but ``exclude``), with
    its type, choices (a ``Literal``), default and description; a bool is a switch. Returns the
    field names added (read back with :func:`model_values`)."""
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
