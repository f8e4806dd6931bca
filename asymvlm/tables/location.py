"""Where a split is: ``ROOT:SPLIT`` parsed once into a :class:`Location`."""

from __future__ import annotations

from typing import Annotated, Any, NamedTuple

from pydantic import BeforeValidator, PlainSerializer


class Location(NamedTuple):
    """A split of embedding tables: its ``root`` (a folder or object-store URI) and ``split``."""

    root: str
    split: str

    def __str__(self) -> str:
        return f"{self.root}:{self.split}"


def parse_location(value: Any) -> Location:
    """``"ROOT:SPLIT"`` (or a ``(root, split)`` pair) -> :class:`Location`; URIs keep their
    ``://``. Anything else is a ``ValueError`` saying what is expected."""
    if isinstance(value, Location):
        return value
    if isinstance(value, tuple | list) and len(value) == 2:
        root, split = (str(v) for v in value)
    else:
        root, _, split = str(value or "").rpartition(":")
    if not root or not split or root.endswith(":/") or "/" in split:
        raise ValueError("expected ROOT:SPLIT (a table root and a split name)")
    return Location(root, split)


#: A config field holding a :class:`Location` (written ``ROOT:SPLIT``, dumped the same way).
LocationField = Annotated[
    Location, BeforeValidator(parse_location), PlainSerializer(str, return_type=str)
]
