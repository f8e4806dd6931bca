"""What every reader shares: schemas, errors, file reading, JSON records, table builders and the
``id_list`` / ``sample`` selection.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import AfterValidator, StrictInt, StrictStr, TypeAdapter, ValidationError

from asymvlm.data.templates import GENERIC_TEMPLATES
from asymvlm.errors import AsymVLMError
from asymvlm.storage import fsspec_filesystem, uri_join

#: Templates of data sets without their own list (:func:`asymvlm.data.templates.templates_for`).
DEFAULT_TEMPLATES: tuple[str, ...] = GENERIC_TEMPLATES
T = TypeVar("T")

IMAGE_SCHEMA = pa.schema(
    [
        ("image_id", pa.string()),
        ("path", pa.string()),
        ("offset", pa.int64()),
        ("length", pa.int64()),
        ("data", pa.binary()),
        ("label", pa.int64()),
    ]
)
CAPTION_SCHEMA = pa.schema(
    [("caption_id", pa.string()), ("image_id", pa.string()), ("text", pa.string())]
)
PROMPT_SCHEMA = pa.schema(
    [
        ("class_index", pa.int64()),
        ("class_name", pa.string()),
        ("template", pa.string()),
        ("text", pa.string()),
    ]
)


class SourceError(AsymVLMError, ValueError):
    """A malformed annotation file; the message names the file and the line or JSON key path."""


@dataclass
class SourceData:
    """What a reader returns; see the package docstring (:mod:`asymvlm.data.sources`) for the
    columns."""

    images: pa.Table
    captions: pa.Table
    prompts: pa.Table | None = None
    description: dict[str, Any] = field(default_factory=dict)


# -- file systems ------------------------------------------------------------------------------
open_fs = fsspec_filesystem  # the storage layer's resolver (s3 honours AWS_ENDPOINT_URL)
join_url = uri_join


def read_bytes(url: str) -> bytes:
    fs, path = open_fs(url)
    try:
        with fs.open(path, "rb") as f:
            return f.read()
    except IsADirectoryError:
        raise SourceError(f"{url}: a folder; this reads a file (give the file in it)") from None


def read_text(url: str) -> str:
    raw = read_bytes(url)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise SourceError(f"{url}: line {line}: not UTF-8 ({e.reason})") from None


def numbered_lines(text: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, line) for the non-blank lines (only \\n ends a line)."""
    for number, line in enumerate(text.split("\n"), 1):
        line = line.rstrip("\r")
        if line.strip():
            yield number, line


def parent_url(url: str) -> str:
    head, _, _ = url.rstrip("/").rpartition("/")
    return head or "."


def is_absolute(path: str) -> bool:
    return "://" in path or path.startswith("/")


def stem(name: str) -> str:
    return posixpath.splitext(posixpath.basename(name))[0]


def with_protocol(fs: fsspec.AbstractFileSystem, path: str, like: str) -> str:
    """A listed path in the form of the URL it came from (plain path stays plain)."""
    return fs.unstrip_protocol(path) if "://" in like else path


def require(value: str | None, name: str, dataset: str) -> str:
    if value is None:
        raise ValueError(f"{dataset}: needs {name}=")
    return os.fspath(value)


# -- JSON records (pydantic) ------------------------------------------------------------------
#: A JSON id (integer or string, not a boolean), read as a string.
Ident = Annotated[StrictInt | StrictStr, AfterValidator(str)]


def parse_json(url: str, adapter: TypeAdapter[T]) -> T:
    """The JSON document at ``url`` as ``adapter``'s type (errors name the file and key path)."""
    try:
        return adapter.validate_json(read_text(url))
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in first["loc"])
        raise SourceError(
            f"{url}: {where.lstrip('.') + ': ' if where else ''}{first['msg']}"
        ) from None


# -- table builders ----------------------------------------------------------------------------
def images_table(image_id: Sequence[str], **columns: Any) -> pa.Table:
    n = len(image_id)
    arrays = [pa.array(image_id, pa.string())]
    for f in list(IMAGE_SCHEMA)[1:]:
        values = columns.pop(f.name, None)
        arrays.append(pa.nulls(n, f.type) if values is None else pa.array(values, f.type))
    if columns:
        raise TypeError(f"unknown image columns {sorted(columns)}")
    return pa.Table.from_arrays(arrays, schema=IMAGE_SCHEMA)


def captions_table(
    caption_id: Sequence[str],
    image_id: Sequence[str],
    text: Sequence[str],
    extra: dict[str, pa.Array] | None = None,
) -> pa.Table:
    table = pa.Table.from_arrays(
        [
            pa.array(caption_id, pa.string()),
            pa.array(image_id, pa.string()),
            pa.array(text, pa.string()),
        ],
        schema=CAPTION_SCHEMA,
    )
    for name, values in (extra or {}).items():
        table = table.append_column(name, values)
    return table


def prompts_table(names: Sequence[str], templates: Sequence[str]) -> pa.Table:
    rows = [
        (k, name, t, t.format(name.replace("_", " ")))
        for k, name in enumerate(names)
        for t in templates
    ]
    return pa.Table.from_arrays(
        [pa.array([r[i] for r in rows], f.type) for i, f in enumerate(PROMPT_SCHEMA)],
        schema=PROMPT_SCHEMA,
    )


def empty_captions() -> pa.Table:
    return captions_table([], [], [])


# -- selection ---------------------------------------------------------------------------------
class Selector:
    """``id_list`` restriction, then a seeded sample; decided once, on the first id list seen."""

    def __init__(self, sample: int | None, seed: int, id_list: str | None):
        if sample is not None and sample < 0:
            raise ValueError(f"sample must be >= 0, got {sample}")
        self.sample, self.seed, self.id_list = sample, seed, id_list
        self.chosen: pa.Array | None = None  # sorted selected ids

    @property
    def active(self) -> bool:
        return self.sample is not None or self.id_list is not None

    def mask(self, ids: pa.Array | pa.ChunkedArray) -> pa.Array | None:
        """Boolean mask of the selected ``ids``, or None when everything is kept."""
        if not self.active:
            return None
        if self.chosen is None:
            self.chosen = self._resolve(ids)
        return pc.is_in(ids, value_set=self.chosen)

    def _resolve(self, ids: pa.Array | pa.ChunkedArray) -> pa.Array:
        pool = pc.unique(ids)
        if isinstance(pool, pa.ChunkedArray):
            pool = pool.combine_chunks()
        pool = pool.take(pc.sort_indices(pool))
        if self.id_list is not None:
            numbers, wanted = [], []
            for number, line in numbered_lines(read_text(self.id_list)):
                numbers.append(number)
                wanted.append(line.strip())
            known = pc.is_in(pa.array(wanted, pa.string()), value_set=pool).to_numpy(
                zero_copy_only=False
            )
            if not known.all():
                k = int(np.flatnonzero(~known)[0])
                raise SourceError(
                    f"{self.id_list}: line {numbers[k]}: unknown id {wanted[k]!r} "
                    f"(not among the {len(pool)} ids of the data set)"
                )
            pool = pa.array(sorted(set(wanted)), pa.string())
        if self.sample is not None:
            if self.sample > len(pool):
                raise SourceError(f"sample={self.sample} but only {len(pool)} ids are available")
            picked = np.random.default_rng(self.seed).choice(
                len(pool), size=self.sample, replace=False
            )
            pool = pool.take(pa.array(np.sort(picked)))
        return pool


@dataclass(frozen=True)
class Request:
    dataset: str
    annotations: str | None
    images: str | None
    split: str
    templates: tuple[str, ...]
    select: Selector

    def need(self, name: str) -> str:
        return require(getattr(self, name), name, self.dataset)

    def root(self) -> str:
        """The data folder of a pixel set: ``images``, else ``annotations``."""
        value = self.images if self.images is not None else self.annotations
        return require(value, "images", self.dataset)

    def selected(self, ids: Sequence[str]) -> np.ndarray:
        """Indices of ``ids`` that survive the selection (to skip work on the others)."""
        mask = self.select.mask(pa.array(ids, pa.string()))
        if mask is None:
            return np.arange(len(ids))
        return np.flatnonzero(mask.to_numpy(zero_copy_only=False))


# -- format by file extension ------------------------------------------------------------------
def by_extension(url: str, table: dict[str, Callable], default: Callable | None = None):
    lower = url.lower().rstrip("/")
    for ext, fn in table.items():
        if lower.endswith(ext):
            return fn
    if default is None:
        raise SourceError(f"{url}: cannot tell the format (expected one of {sorted(table)})")
    return default


# -- checks of a reader's output ---------------------------------------------------------------
def check_unique(table: pa.Table, column: str, dataset: str) -> None:
    values = table[column]
    if len(pc.unique(values)) == len(values):
        return
    counts = pc.value_counts(values)
    dup = counts.filter(pc.greater(counts.field("counts"), 1)).field("values")[0]
    raise SourceError(f"{dataset}: duplicate {column} {dup.as_py()!r}")
