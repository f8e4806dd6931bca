"""Reading and validating a split, :func:`read_split`: a folder's parquet files give one table of
their small columns (ids, captions, norms, extra columns), and each list column is streamed
batch by batch (``ParquetFile.iter_batches``) into one float32 matrix per folder, allocated
once. Every check names the file, row and id of the first violation; a list column's checks
run batch by batch (the first batch with a problem is the one reported)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from asymvlm.storage import display, filesystem, join
from asymvlm.tables.files import (
    IMAGE_COLUMNS,
    IMAGES_DIR,
    NORM_MAX,
    NORM_SPREAD,
    PRE_COLUMNS,
    TEXT_COLUMNS,
    TEXTS_DIR,
    TableError,
    check_split,
    fingerprint,
    list_parquet,
)
from asymvlm.tables.split import EmbeddingSplit


def _first(mask: np.ndarray) -> int | None:
    hits = np.flatnonzero(mask)
    return int(hits[0]) if hits.size else None


def _is_list(typ: pa.DataType) -> bool:
    return (pa.types.is_list(typ) or pa.types.is_fixed_size_list(typ)) and (
        pa.types.is_floating(typ.value_type) or pa.types.is_integer(typ.value_type)
    )


def _is_string(typ: pa.DataType) -> bool:
    typ = typ.value_type if pa.types.is_dictionary(typ) else typ
    return pa.types.is_string(typ) or pa.types.is_large_string(typ)


#: About this many bytes of values per batch read from a list column.
_BATCH_BYTES = 1 << 22
#: Buffered reads of a column chunk (not the whole chunk in memory at once).
_BUFFER = 1 << 22


def _schema_error(shown: str, first: str, a: pa.Schema, b: pa.Schema) -> TableError:
    """The first column where file ``shown`` (schema ``b``) differs from ``first`` (``a``)."""
    for name in [*a.names, *b.names]:
        if (name in a.names) != (name in b.names):
            has, lacks = (first, shown) if name in a.names else (shown, first)
            return TableError(f"{lacks}: missing column {name!r} present in {has}")
        if a.field(name).type != b.field(name).type:
            return TableError(
                f"{shown}: column {name!r} has type {b.field(name).type}, but "
                f"{a.field(name).type} in {first} (all files of a folder must share one schema)"
            )
    return TableError(f"{shown}: schema differs from {first}")


@dataclass
class _Folder:
    """The files of one folder: their small columns read as one ``table`` (a list column is
    streamed by :meth:`matrix`); :meth:`error` names a row's file and id."""

    fs: pafs.FileSystem
    paths: list[str]
    files: list[str]
    schema: pa.Schema
    table: pa.Table
    offsets: np.ndarray
    id_name: str
    ids: pa.Array | None = None

    def where(self, row: int) -> str:
        k = int(np.searchsorted(self.offsets, row, side="right") - 1)
        return f"{self.files[k]} row {row - int(self.offsets[k])}"

    def error(self, row: int, msg: str) -> TableError:
        where = self.where(row)
        if self.ids is not None:
            where += f" ({self.id_name} {self.ids[row].as_py()!r})"
        return TableError(f"{where}: {msg}")

    def strings(self, name: str, nulls: bool = False) -> pa.Array:
        """Column ``name`` as one ``string`` array: valid UTF-8 and (unless ``nulls``) no null."""
        col = self.table.column(name)
        if not _is_string(col.type):
            raise TableError(
                f"{self.files[0]}: column {name!r} has type {col.type}, expected string"
            )
        arr = col.cast(pa.string()).combine_chunks()
        try:
            arr.validate(full=True)
        except pa.ArrowInvalid:
            for row, value in enumerate(arr.view(pa.binary()).to_pylist()):
                try:
                    (value or b"").decode("utf-8")
                except UnicodeDecodeError as exc:
                    msg = f"column {name!r} is not valid UTF-8 ({exc.reason} at byte {exc.start})"
                    raise self.error(row, msg) from None
        if arr.null_count and not nulls:
            raise self.error(
                _first(arr.is_null().to_numpy(zero_copy_only=False)), f"{name} is null"
            )
        return arr

    def matrix(self, name: str, width: int, what: str, atol: float | None) -> np.ndarray:
        """A list column as one writable ``[n, width]`` float32 matrix, read batch by batch: no
        null, rows of length ``width`` (``what`` names it), finite, of norm 1 within ``atol``."""
        typ = self.schema.field(name).type
        if not _is_list(typ):
            raise TableError(
                f"{self.files[0]}: column {name!r} has type {typ}, expected list<float32>"
            )
        out = np.empty((int(self.offsets[-1]), width), np.float32)
        for start, col in self._batches(name, max(1, _BATCH_BYTES // (4 * width))):
            self._fill(out[start : start + len(col)], start, col, name, what, atol)
        return out

    def _batches(self, name: str, rows: int) -> Iterator[tuple[int, pa.Array]]:
        """``(first row, values)`` of column ``name`` in batches of ``rows``, file by file."""
        for path, shown, start in zip(self.paths, self.files, self.offsets, strict=False):
            with _reading(shown), _open(self.fs, path) as pf:
                for batch in pf.iter_batches(rows, columns=[name], use_threads=False):
                    yield int(start), batch.column(0)
                    start += batch.num_rows

    def _fill(
        self, out: np.ndarray, start: int, col: pa.Array, name: str, what: str, atol: float | None
    ) -> None:
        """Check one batch of a list column (its rows from ``start`` on) and copy it to ``out``."""
        width = out.shape[1]
        if col.null_count:
            bad = _first(col.is_null().to_numpy(zero_copy_only=False))
            raise self.error(start + bad, f"{name} is null")
        lengths = pc.list_value_length(col).to_numpy()
        bad = _first(lengths != width)
        if bad is not None:
            raise self.error(start + bad, f"{name} has length {lengths[bad]}, {what} is {width}")
        values = col.flatten()
        if values.null_count:
            bad = _first(values.is_null().to_numpy(zero_copy_only=False))
            raise self.error(start + bad // width, f"{name} has null values")
        out.reshape(-1)[:] = values.to_numpy(zero_copy_only=False)
        square = np.einsum("ij,ij->i", out, out, dtype=np.float64)
        bad = _first(~np.isfinite(square))
        if bad is not None:
            raise self.error(start + bad, f"{name} has NaN/inf")
        bad = None if atol is None else _first(np.abs(np.sqrt(square) - 1.0) > atol)
        if bad is not None:
            norm = np.sqrt(square[bad])
            raise self.error(start + bad, f"{name} norm is {norm:.6g}, expected 1 within {atol:g}")

    def norms(self, validate: bool) -> np.ndarray | None:
        """The raw projection norms (None without a ``norm`` column); ``validate``: finite, > 0,
        within ``NORM_SPREAD`` of the folder's median and at most ``NORM_MAX``."""
        if "norm" not in self.table.column_names:
            return None
        col = self.table.column("norm")
        if not (pa.types.is_floating(col.type) or pa.types.is_integer(col.type)):
            raise TableError(
                f"{self.files[0]}: column 'norm' has type {col.type}, expected float32"
            )
        vals = col.to_numpy().astype(np.float64)
        if validate:
            bad = _first(~(np.isfinite(vals) & (vals > 0)))
            if bad is not None:
                raise self.error(bad, f"norm is {vals[bad]:.6g}, must be finite and > 0")
            median = float(np.median(vals)) if vals.size else 1.0
            low, high = median / NORM_SPREAD, min(median * NORM_SPREAD, NORM_MAX)
            bad = _first((vals < low) | (vals > high))
            if bad is not None:
                raise self.error(
                    bad,
                    f"norm is {vals[bad]:.6g}, outside [{low:.3g}, {high:.3g}] (within a factor "
                    f"{NORM_SPREAD:g} of the split's median norm {median:.6g}, at most "
                    f"{NORM_MAX:g})",
                )
        return vals.astype(np.float32)

    def unique(self, ids: pa.Array) -> None:
        if len(pc.unique(ids)) == len(ids):
            return
        first = pc.index_in(ids, value_set=ids).to_numpy(zero_copy_only=False)
        row = _first(first != np.arange(len(ids)))
        msg = f"duplicate {self.id_name}, first seen in {self.where(int(first[row]))}"
        raise self.error(row, msg)


@contextmanager
def _reading(shown: str) -> Iterator[None]:
    """A file that cannot be read is a :class:`TableError` naming it (lacking memory is not)."""
    try:
        yield
    except pa.ArrowMemoryError:
        raise
    except (OSError, pa.ArrowException) as exc:
        raise TableError(f"{shown}: cannot read parquet file ({exc})") from exc


def _open(fs: pafs.FileSystem, path: str) -> pq.ParquetFile:
    """A parquet file read a column chunk at a time (not every row group's at once)."""
    return pq.ParquetFile(path, filesystem=fs, buffer_size=_BUFFER, pre_buffer=False)


def _schema(pf: pq.ParquetFile) -> pa.Schema:
    """A file's schema, fixed-size lists as lists (a folder may mix both)."""
    schema = pf.schema_arrow
    for i, field in enumerate(schema):
        if _is_list(field.type) and pa.types.is_fixed_size_list(field.type):
            schema = schema.set(i, field.with_type(pa.list_(field.type.value_type)))
    return schema


def _read_folder(
    fs: pafs.FileSystem, root: str, folder: str, required, id_name: str, matrices: set[str]
) -> _Folder:
    """Every parquet file of ``folder`` in name order: one schema, and one table of the
    columns other than ``matrices`` (those are read by :meth:`_Folder.matrix`)."""
    files = list_parquet(fs, folder)
    if not files:
        raise TableError(f"{display(root, folder)}: no parquet files in this folder")
    shown, parts, schema = [], [], None
    for path in files:
        name = display(root, path)
        with _reading(name), _open(fs, path) as pf:
            here = _schema(pf)
            missing = [c for c in required if c not in here.names]
            if missing:
                listed = ", ".join(map(repr, missing))
                raise TableError(f"{name}: missing required column(s) {listed}")
            if schema is not None and set(here.names) == set(schema.names):
                here = pa.schema([here.field(c) for c in schema.names])
            if schema is not None and not here.equals(schema):
                raise _schema_error(name, shown[0], schema, here)
            small = [c for c in here.names if c not in matrices]
            table = pf.read(columns=small, use_threads=False).select(small)
        schema = schema or here
        shown.append(name)
        parts.append(table)
    table = pa.concat_tables(parts)
    if not table.num_rows:
        raise TableError(
            f"{display(root, folder)}: no rows ({len(parts)} parquet file(s), all empty)"
        )
    offsets = np.cumsum([0] + [t.num_rows for t in parts])
    out = _Folder(fs, files, shown, schema, table, offsets, id_name)
    out.ids = out.strings(id_name)
    return out


def read_split(
    root: str, split: str, *, validate: bool = True, norm_atol: float = 1e-3
) -> EmbeddingSplit:
    """Read ``ROOT/split``; :class:`TableError` on structural problems and, with ``validate``,
    on non-unit rows (beyond ``norm_atol``), duplicate ids or bad ``norm`` values."""
    manifest = check_split(root, split)
    fs, base = filesystem(root)
    atol = norm_atol if validate else None
    out: dict = {"manifest": manifest}
    folders = {}
    for modality, sub, required, id_name in (
        ("image", IMAGES_DIR, IMAGE_COLUMNS, "image_id"),
        ("text", TEXTS_DIR, TEXT_COLUMNS, "caption_id"),
    ):
        pre, folder = PRE_COLUMNS[modality], join(base, split, sub)
        f = folders[modality] = _read_folder(
            fs, root, folder, required, id_name, {"embedding", pre}
        )
        if validate:
            f.unique(f.ids)
        out[f"{modality}_embeddings"] = f.matrix("embedding", manifest.dim, "manifest dim", atol)
        out[f"{modality}_norms"] = f.norms(validate)
        extra = {}
        for c in f.table.column_names:
            if c not in {*required, "norm", pre}:
                col = f.strings(c, nulls=True) if _is_string(f.table[c].type) else f.table[c]
                extra[c] = col.to_numpy(zero_copy_only=False)
        out[f"extra_{modality}_columns"] = extra
        out[pre] = None
        if pre in f.schema.names:
            width = manifest.pre_dim.get(modality)
            if width is None:
                raise TableError(
                    f"{f.files[0]}: column {pre!r} is present but the manifest has no "
                    f"pre_dim.{modality} (its width)"
                )
            out[pre] = f.matrix(pre, width, f"manifest pre_dim.{modality}", None)
    images, texts = folders["image"], folders["text"]
    owner = texts.strings("image_id")
    index = pc.index_in(owner, value_set=images.ids)
    if index.null_count:
        row = _first(index.is_null().to_numpy(zero_copy_only=False))
        raise texts.error(row, f"unknown image_id {owner[row].as_py()!r}")
    return EmbeddingSplit(
        image_ids=images.ids.to_pylist(),
        caption_ids=texts.ids.to_pylist(),
        text_image_index=index.to_numpy(zero_copy_only=False).astype(np.int64),
        texts=texts.strings("text").to_pylist(),
        fingerprint=fingerprint(root, split, manifest, len(images.ids), len(texts.ids)),
        **out,
    )
