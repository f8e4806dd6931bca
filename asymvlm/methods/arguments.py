"""The keyword arguments a method takes, read from its constructor's signature, and their
validation: unknown keys refused, values converted to the declared types (docs/methods.md)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from functools import cache
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model, model_validator
from pydantic_core import PydanticCustomError

from asymvlm.methods.base import METHODS, Method, check_method_name

#: Constructor arguments the training config sets itself (``dim``, ``protocol``, the sizes).
RESERVED = ("dim", "protocol", "hidden_dim", "depth")
_PASSED_ON = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def _parameters(cls: type[Method]) -> dict[str, inspect.Parameter]:
    """A method's constructor parameters but ``self``, through ``**kwargs`` handed to a base."""
    out: dict[str, inspect.Parameter] = {}
    for klass in cls.__mro__:
        if klass is Method or not issubclass(klass, Method):
            break
        if "__init__" not in vars(klass):
            continue
        params = inspect.signature(vars(klass)["__init__"], eval_str=True).parameters
        for name, p in list(params.items())[1:]:
            if p.kind not in _PASSED_ON:
                out.setdefault(name, p)
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            break
    return out


def method_arguments(method: str | type[Method]) -> dict[str, inspect.Parameter]:
    """The user keys of a method's constructor: name -> parameter (:data:`RESERVED` left out)."""
    cls = METHODS[check_method_name(method)] if isinstance(method, str) else method
    return {k: p for k, p in _parameters(cls).items() if k not in RESERVED}


def adapter_size(method: str, protocol: str, given: Mapping[str, Any]) -> dict[str, int]:
    """The ``hidden_dim`` and ``depth`` of the adapter that ``build_method`` builds for
    ``method`` under ``protocol`` with the arguments ``given`` (empty: it has no adapter MLP)."""
    cls = METHODS[check_method_name(method)]
    params, chosen = _parameters(cls), {**cls.PROTOCOL_KWARGS.get(protocol, {}), **given}
    sizes = {k: chosen.get(k, params[k].default) for k in ("hidden_dim", "depth") if k in params}
    return sizes if all(isinstance(v, int) for v in sizes.values()) else {}


def argument_type(p: inspect.Parameter) -> Any:
    """The declared type of ``p``; unannotated: its default's type (``Any`` without one)."""
    if p.annotation is not p.empty:
        return p.annotation
    return Any if p.default in (p.empty, None) else type(p.default)


@cache
def arguments_model(method: str) -> type[BaseModel]:
    """A pydantic model of ``method``'s keyword arguments; an unknown key is refused by name."""
    params = method_arguments(method)
    known = ", ".join(params) or "no arguments"

    def known_keys(cls: type[BaseModel], data: Any) -> Any:
        unknown = sorted(set(data) - set(params)) if isinstance(data, dict) else []
        error = PydanticCustomError("unknown_argument", f"unknown key; {method} takes {known}")
        problems = [{"type": error, "loc": (k,), "input": data[k]} for k in unknown]
        if problems:
            raise ValidationError.from_exception_data(cls.__name__, problems)
        return data

    fields = {
        n: (argument_type(p), ... if p.default is p.empty else p.default) for n, p in params.items()
    }
    return create_model(
        f"{method} arguments",
        __config__=ConfigDict(arbitrary_types_allowed=True, frozen=True),
        __validators__={"known_keys": model_validator(mode="before")(known_keys)},
        **fields,
    )


def check_method_kwargs(method: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` converted to the types ``method`` declares ("false" -> False, "0.5" -> 0.5)."""
    return arguments_model(method).model_validate(kwargs).model_dump(exclude_unset=True)
