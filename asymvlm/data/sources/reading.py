"""What every reader shares: schemas, errors, the request and the id_list / sample selection."""

from __future__ import annotations

import posixpath
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import AfterValidator, StrictInt, StrictStr, TypeAdapter, ValidationError

from asymvlm import storage
from asymvlm.errors import AsymVLMError

join_url = storage.uri_join
_STR, _INT = pa.string(), pa.int64()
IMAGE_SCHEMA = pa.schema(
    dict(image_id=_STR, path=_STR, offset=_INT, length=_INT, data=pa.binary(), label=_INT)
)
CAPTION_SCHEMA = pa.schema({"caption_id": _STR, "image_id": _STR, "text": _STR})
PROMPT_SCHEMA = pa.schema({"class_index": _INT, "class_name": _STR, "template": _STR, "text": _STR})
#: A JSON id (integer or string, not a boolean), read as a string.
Ident = Annotated[StrictInt | StrictStr, AfterValidator(str)]


class SourceError(AsymVLMError, ValueError):
    """A malformed annotation file; the message names the file and the line, row or key."""


@dataclass
class SourceData:
    """What a reader returns (columns: docs/data.md)."""

    images: pa.Table
    captions: pa.Table
    prompts: pa.Table | None = None
    description: dict[str, Any] = field(default_factory=dict)


def read_bytes(url: str) -> bytes:
    raw = storage.read_bytes(url)
    if raw is None:
        raise SourceError(f"{url}: no such file")
    return raw


def read_text(url: str) -> str:
    raw = read_bytes(url)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise SourceError(f"{url}: line {line}: not UTF-8 ({e.reason})") from None


def numbered_lines(url: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, line) of the non-blank lines of the text file at ``url``."""
    for number, line in enumerate(read_text(url).split("\n"), 1):
        if line.strip():
            yield number, line.rstrip("\r")


def stem(name: str) -> str:
    return posixpath.splitext(posixpath.basename(name))[0]


def parse_json(url: str, adapter: TypeAdapter[Any]) -> Any:
    """The JSON document at ``url`` as ``adapter``'s type (errors name the file and key path)."""
    try:
        return adapter.validate_json(read_text(url))
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in first["loc"])
        where = where.lstrip(".") + ": " if where else ""
        raise SourceError(f"{url}: {where}{first['msg']}") from None


def images_table(image_id: Sequence[str], **columns: Any) -> pa.Table:
    arrays = {f.name: pa.nulls(len(image_id), f.type) for f in IMAGE_SCHEMA}
    for name, values in {"image_id": image_id, **columns}.items():
        if values is not None:
            arrays[name] = pa.array(values, IMAGE_SCHEMA.field(name).type)
    return pa.table(arrays, schema=IMAGE_SCHEMA)


def captions_table(rows: Sequence[tuple[str, str, str]], **extra: pa.Array) -> pa.Table:
    """A caption table of ``(caption_id, image_id, text)`` rows and ``extra`` columns."""
    table = pa.table(list(zip(*rows, strict=True)) or [[], [], []], schema=CAPTION_SCHEMA)
    for name, values in extra.items():
        table = table.append_column(name, values)
    return table


def prompts_table(names: Sequence[str], templates: Sequence[str]) -> pa.Table:
    rows = [
        {"class_index": k, "class_name": n, "template": t, "text": t.format(n.replace("_", " "))}
        for k, n in enumerate(names)
        for t in templates
    ]
    return pa.Table.from_pylist(rows, schema=PROMPT_SCHEMA)


@dataclass
class Request:
    dataset: str
    annotations: str | None
    images: str | None
    split: str
    templates: tuple[str, ...]
    sample: int | None = None
    seed: int = 0
    id_list: str | None = None
    chosen: pa.Array | None = None  # the selected ids, sorted, once decided

    def need(self, name: str) -> str:
        if getattr(self, name) is None:
            raise ValueError(f"{self.dataset}: needs {name}=")
        return getattr(self, name)

    def selected(self, ids: Sequence[str]) -> np.ndarray:
        """Indices of ``ids`` kept by ``id_list`` then a seeded ``sample`` (decided once, on the
        first ids seen, so that pixel sets encode only the kept images)."""
        if self.sample is None and self.id_list is None:
            return np.arange(len(ids))
        if self.chosen is None:
            pool = sorted(set(ids))
            if self.id_list is not None:
                lines, known = list(numbered_lines(self.id_list)), set(pool)
                for number, line in lines:
                    if line.strip() not in known:
                        raise SourceError(
                            f"{self.id_list}: line {number}: unknown id {line.strip()!r} "
                            f"(not among the {len(pool)} ids of the data set)"
                        )
                pool = sorted({line.strip() for _, line in lines})
            if self.sample is not None:
                if self.sample > len(pool):
                    raise SourceError(
                        f"sample={self.sample} but only {len(pool)} ids are available"
                    )
                rng = np.random.default_rng(self.seed)
                pool = [pool[i] for i in np.sort(rng.choice(len(pool), self.sample, replace=False))]
            self.chosen = pa.array(pool, _STR)
        mask = pc.is_in(pa.array(ids, _STR), value_set=self.chosen)
        return np.flatnonzero(mask.to_numpy(zero_copy_only=False))
