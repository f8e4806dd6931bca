"""Command-line flags made from a schema: the schema is the one place the keys are written."""

from __future__ import annotations

import argparse
import types
from collections.abc import Collection, Mapping, Sequence
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

__all__ = ["add_model_flags", "model_values"]


def _plain(tp: Any) -> Any:
    """``X`` of ``Annotated[X, ...]`` and ``X | None``."""
    while True:
        origin = get_origin(tp)
        if origin is Annotated:
            tp = get_args(tp)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in get_args(tp) if a is not type(None)]
            tp = args[0] if len(args) == 1 else str
        else:
            return tp


def add_model_flags(
    parser: argparse.ArgumentParser,
    model: type[BaseModel],
    *,
    exclude: Collection[str] = (),
    required: Collection[str] = (),
    choices: Mapping[str, Sequence[str]] | None = None,
    metavars: Mapping[str, str] | None = None,
) -> list[str]:
    """One ``--flag`` per field of ``model`` of a scalar type (but ``exclude``), with the
    field's type, choices (a ``Literal``), default and description. Returns the field names
    added (read back with :func:`model_values`)."""
    added = []
    for name, info in model.model_fields.items():
        tp = _plain(info.annotation)
        if name in exclude or tp not in (int, float, str, bool) and get_origin(tp) is not Literal:
            continue
        kwargs: dict[str, Any] = {"help": info.description, "dest": name}
        if get_origin(tp) is Literal:
            kwargs["choices"] = list(get_args(tp))
        else:
            kwargs["type"] = tp
        if (choices or {}).get(name) is not None:
            kwargs["choices"] = list(choices[name])  # type: ignore[index]
        if (metavars or {}).get(name):
            kwargs["metavar"] = metavars[name]  # type: ignore[index]
        if name in required:
            kwargs["required"] = True
        else:
            default = info.default
            kwargs["default"] = None if default is PydanticUndefined else default
        parser.add_argument(f"--{name.replace('_', '-')}", **kwargs)
        added.append(name)
    return added


def model_values(args: argparse.Namespace, names: Sequence[str]) -> dict[str, Any]:
    """The values of the flags made by :func:`add_model_flags` (unset ones left out)."""
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}
