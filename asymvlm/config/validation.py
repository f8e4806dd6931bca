"""The config boundary: a document validated into a typed object, every problem one line.

:func:`validate` runs a pydantic model (or pydantic dataclass) on a parsed document and turns a
``ValidationError`` into a :class:`~asymvlm.errors.ConfigError` whose one-line message names the
file and the key path (:func:`validation_message`): unknown keys with a "did you mean" suggestion
(``hiden_dim`` -> ``hidden_dim``), missing keys, bad types and ranges. Schemas derive from
:class:`StrictModel` (unknown keys are errors, defaults are validated too).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import fields, is_dataclass
from types import UnionType
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError

from asymvlm.errors import ConfigError

__all__ = ["StrictModel", "validate", "validation_message"]

T = TypeVar("T")


class StrictModel(BaseModel):
    """A config section: unknown keys are errors and defaults are validated like values."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


def validate(model: type[T], data: Any, source: str, flags: bool = False) -> T:
    """``model`` validated from ``data`` (a pydantic model or dataclass), errors as one
    :class:`ConfigError` line naming ``source`` and the key (``flags``: spelt as flags)."""
    try:
        if isinstance(model, type) and issubclass(model, BaseModel):
            return model.model_validate(data)
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a mapping, got {type(data).__name__}")
        return model(**data)
    except ValidationError as err:
        raise ConfigError(validation_message(err, source, model, flags=flags)) from None


# -- error messages -----------------------------------------------------------------------------
def _field_names(tp: Any) -> list[str]:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return list(tp.model_fields)
    if is_dataclass(tp):
        return [f.name for f in fields(tp)]
    return []


def _unwrap(tp: Any) -> list[Any]:
    """The model/dataclass types reachable through Optional/Union/list/dict/Annotated."""
    origin = get_origin(tp)
    if origin is Annotated:
        return _unwrap(get_args(tp)[0])
    if origin in (Union, UnionType, list, tuple, dict):  # X | Y has origin UnionType
        return [t for arg in get_args(tp) for t in _unwrap(arg)]
    return [tp] if _field_names(tp) else []


def _annotation(model: Any, name: str) -> Any:
    if isinstance(model, type) and issubclass(model, BaseModel):
        info = model.model_fields.get(name)
        return None if info is None else info.annotation
    if is_dataclass(model):
        for f in fields(model):
            if f.name == name:
                return f.type if not isinstance(f.type, str) else Any
    return None


def _tag_values(model: Any) -> list[str]:
    """The values of a discriminated union member's ``kind`` tag (``Literal[...]``)."""
    tag = _annotation(model, "kind")
    if tag is not None and get_origin(tag) is Literal:
        return [str(v) for v in get_args(tag)]
    return []


def _tags(schema: Any) -> set[str]:
    """Every union tag value reachable in ``schema`` (pydantic puts the tag into ``loc``)."""
    out: set[str] = set()
    seen: set[int] = set()
    stack = list(_unwrap(schema)) if schema is not None else []
    while stack:
        model = stack.pop()
        if id(model) in seen:
            continue
        seen.add(id(model))
        out.update(_tag_values(model))
        for name in _field_names(model):
            stack += _unwrap(_annotation(model, name))
    return out


def _loc_text(loc: Iterable[Any], tags: set[str]) -> str:
    out = ""
    previous: Any = None
    for part in loc:
        tag = isinstance(previous, int) and part in tags  # a discriminated union's tag
        previous = part
        if tag:
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _siblings(root: Any, loc: tuple[Any, ...]) -> list[str]:
    """The valid key names next to the bad one at ``loc`` (walking the schema)."""
    current = [root]
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        nxt: list[Any] = []
        for model in current:
            annotation = _annotation(model, part)
            if annotation is not None:
                nxt += _unwrap(annotation)
            # discriminated unions: the tag is part of loc (e.g. 'hierarcaps'); keep going
            if not nxt and isinstance(part, str):
                nxt += [t for t in _unwrap(model) if part in _tag_values(t)]
        current = nxt or current
    names: list[str] = []
    for model in current:
        names += _field_names(model)
    return names


def validation_message(
    err: ValidationError, source: str, schema: Any = None, flags: bool = False, limit: int = 3
) -> str:
    """One line per problem (at most ``limit``): ``source: key.path: what is wrong``.

    ``flags=True`` spells keys as command-line flags (``--hidden-dim``)."""
    lines = []
    errors = err.errors()
    tags = _tags(schema)
    for e in errors[:limit]:
        loc = tuple(e["loc"])
        key = loc[-1] if loc else ""
        shown = _loc_text(loc, tags)
        if flags and isinstance(key, str):
            shown = "--" + key.replace("_", "-")
        if e["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            names = _siblings(schema, loc) if schema is not None else []
            hint = difflib.get_close_matches(str(key), names, n=1, cutoff=0.6)
            suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
            lines.append(f"{shown}: unknown key{suggestion}")
        elif e["type"] == "missing":
            lines.append(f"{shown}: required key is missing")
        elif e["type"] in ("union_tag_invalid", "union_tag_not_found"):
            expected = e.get("ctx", {}).get("expected_tags", "")
            given = e.get("ctx", {}).get("tag")
            lines.append(f"{shown}.kind = {given!r}: must be one of {expected}")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            given = e.get("input")
            if isinstance(given, str | int | float | bool) or given is None:
                lines.append(f"{shown} = {given!r}: {msg}")
            else:
                lines.append(f"{shown}: {msg}")
    more = f" (and {len(errors) - limit} more)" if len(errors) > limit else ""
    return f"{source}: " + "; ".join(lines) + more
