"""The config boundary: a document validated into a typed object, every problem one line.

:func:`validate` runs pydantic (a model or a pydantic dataclass, through ``TypeAdapter``) and
shapes its ``ValidationError`` into one :class:`~asymvlm.errors.ConfigError` line naming the
file and the key path, with a "did you mean" for an unknown key.
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import fields, is_dataclass
from typing import Any, Literal, TypeVar, get_args, get_origin

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from asymvlm.errors import ConfigError

__all__ = ["StrictModel", "validate", "validation_message"]

T = TypeVar("T")


class StrictModel(BaseModel):
    """A config section: unknown keys are errors and defaults are validated like values."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


def validate(model: type[T], data: Any, source: str, flags: bool = False) -> T:
    """``model`` validated from ``data``; errors as one :class:`ConfigError` line naming
    ``source`` and the key (``flags``: keys spelt as command-line flags)."""
    try:
        return _adapter(model).validate_python(data)
    except ValidationError as err:
        raise ConfigError(validation_message(err, source, model, flags=flags)) from None


@functools.cache
def _adapter(model: Any) -> TypeAdapter:
    return TypeAdapter(model)


def _fields(tp: Any) -> dict[str, Any]:
    """Field name -> annotation of a pydantic model or (pydantic) dataclass, else ``{}``."""
    infos = getattr(tp, "__pydantic_fields__", None)
    if isinstance(tp, type) and infos is not None:
        return {name: info.annotation for name, info in infos.items()}
    return {f.name: f.type for f in fields(tp)} if is_dataclass(tp) else {}


def _schema_words(schema: Any) -> tuple[set[str], set[str]]:
    """Every key name and every union tag (a ``kind: Literal[...]``) reachable in ``schema``."""
    names: set[str] = set()
    tags: set[str] = set()
    seen: set[int] = set()
    stack = [schema]
    while stack:
        tp = stack.pop()
        if id(tp) in seen:
            continue
        seen.add(id(tp))
        found = _fields(tp)
        names.update(found)
        if get_origin(found.get("kind")) is Literal:
            tags.update(str(v) for v in get_args(found["kind"]))
        stack += [*found.values(), *get_args(tp)]
    return names, tags


def validation_message(
    err: ValidationError, source: str, schema: Any = None, flags: bool = False, limit: int = 3
) -> str:
    """``source: key.path: what is wrong`` for each problem (at most ``limit``), on one line;
    ``flags=True`` spells keys as command-line flags (``--hidden-dim``)."""
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
        if flags and isinstance(key, str):
            shown = "--" + key.replace("_", "-")
        ctx, given = e.get("ctx", {}), e.get("input")
        if e["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            hint = difflib.get_close_matches(str(key), names, n=1, cutoff=0.6)
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
            lines.append(f"{shown} = {given!r}: {e['msg'].removeprefix('Value error, ')}")
        else:
            lines.append(f"{shown}: {e['msg'].removeprefix('Value error, ')}")
    more = len(err.errors()) - limit
    return (
        f"{source}: "
        + "; ".join(line.removeprefix(": ") for line in lines)
        + (f" (and {more} more)" if more > 0 else "")
    )
