"""Reading and validating a split: :func:`read_split` (see :mod:`asymvlm.tables` for the
contract and what is refused; :class:`EmbeddingSplit` lives in :mod:`asymvlm.tables.split`).

Memory. Each ``list<float>`` column (``embedding`` and the pre-projection features) goes
straight into one float32 matrix per folder, allocated once from the row counts in the parquet
footers: a file's column is read in batches of at most about 32 MiB (``iter_batches``, buffered
column-chunk reads), each batch's values buffer viewed by numpy without a copy and copied once
into its rows of the matrix. Only the other columns (ids, captions, norms, extra columns) are
kept as Arrow tables, and the checks run block by block, so reading a split peaks near the size
of its matrices. The reader reports the same problem for a file as reading it whole would: the
checks of a list column keep the order of the chunks ``pq.read_table`` gives (row groups, cut
every 2^17 rows), and a pre-projection column's problems are reported at their turn, after the
checks of the other columns, as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from asymvlm.storage import display, filesystem, join
from asymvlm.tables.columns import (
    RowBuffer,
    StringColumn,
    check_list_type,
    check_unit,
    check_utf8,
    fill_matrix,
    first_nonfinite,
    first_true,
    is_list_of_numbers,
    row_error,
    string_column,
)
from asymvlm.tables.files import (
    IMAGE_COLUMNS,
    IMAGE_PRE,
    IMAGE_RESERVED,
    IMAGES_DIR,
    NORM_MAX,
    NORM_SPREAD,
    TEXT_COLUMNS,
    TEXT_PRE,
    TEXT_RESERVED,
    TEXTS_DIR,
    Manifest,
    TableError,
    list_parquet,
    read_manifest,
)
from asymvlm.tables.split import EmbeddingSplit

__all__ = ["EmbeddingSplit", "read_split"]

#: ``pq.read_table`` cuts a row group into chunks of this many rows; the checks of a list
#: column report the first problem of the first chunk that has one, in this order.
_READ_CHUNK = 1 << 17
#: About this many bytes of float32 per batch read from a list column.
_BATCH_BYTES = 1 << 25
#: Buffered reads of a column chunk (not the whole chunk in memory at once).
_BUFFER = 1 << 22


# --------------------------------------------------------------------------------------------
# one folder (images/ or texts/)


@dataclass
class _Part:
    """One parquet file of a folder: its schema, ids and the columns other than the list
    columns (those are in the folder's matrices, from row ``start`` on)."""

    shown: str
    ids: pa.Array
    schema: pa.Schema
    table: pa.Table
    start: int
    #: A pre-projection column's problem (structural, or NaN/inf with ``validate``), raised at
    #: its turn by :func:`_pre_features`.
    pre_error: TableError | None = None
    pre_nonfinite: TableError | None = None


@dataclass
class _Folder:
    parts: list[_Part]
    embeddings: np.ndarray
    #: The pre-projection matrix when the column could be read from the files (else None).
    pre: np.ndarray | None = None
    rows: int = 0
    pre_buffer: RowBuffer | None = field(default=None, repr=False)


def _unreadable(fs: pafs.FileSystem, path: str, shown: str, exc: Exception) -> TableError:
    """The reader's message for a file that cannot be read: pyarrow's own, as reading the whole
    file gives it (that reading is only tried here, on the error path)."""
    try:
        pq.read_table(path, filesystem=fs)
    except (OSError, pa.ArrowException) as whole:
        exc = whole
    return TableError(f"{shown}: cannot read parquet file ({exc})")


def _open(fs: pafs.FileSystem, path: str, shown: str) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(path, filesystem=fs, pre_buffer=False, buffer_size=_BUFFER)
    except (OSError, pa.ArrowException) as exc:
        raise _unreadable(fs, path, shown, exc) from exc


def _footer_rows(fs: pafs.FileSystem, path: str) -> int:
    """Rows of a file from its footer (0 when it cannot be read: the reader names it later)."""
    try:
        return int(pq.read_metadata(path, filesystem=fs).num_rows)
    except (OSError, pa.ArrowException):
        return 0


def _chunks(
    pf: pq.ParquetFile, name: str, shown: str, width: int
) -> Iterator[tuple[pa.Array, bool]]:
    """Column ``name`` of a file in batches, each with whether it ends one of the chunks
    ``pq.read_table`` would give (a row group, cut every ``_READ_CHUNK`` rows)."""
    rows = max(1, _BATCH_BYTES // (4 * max(width, 1)))
    batch = 1 << min(17, max(0, rows.bit_length() - 1))  # a power of two dividing _READ_CHUNK
    try:
        for group in range(pf.num_row_groups):
            in_group = 0
            size = pf.metadata.row_group(group).num_rows
            for record in pf.iter_batches(
                batch_size=batch, row_groups=[group], columns=[name], use_threads=False
            ):
                col = record.column(0)
                while len(col):
                    take = min(len(col), _READ_CHUNK - in_group % _READ_CHUNK)
                    piece, col = col.slice(0, take), col.slice(take)
                    in_group += take
                    yield piece, in_group % _READ_CHUNK == 0 or in_group >= size
    except (OSError, pa.ArrowException) as exc:
        raise TableError(f"{shown}: cannot read parquet file ({exc})") from exc


def _read_small(pf: pq.ParquetFile, columns: list[str], shown: str) -> pa.Table:
    try:
        return pf.read(columns=columns, use_threads=False)
    except (OSError, pa.ArrowException) as exc:
        raise TableError(f"{shown}: cannot read parquet file ({exc})") from exc


def _read_folder(
    fs: pafs.FileSystem,
    root: str,
    folder: str,
    required: tuple[str, ...],
    id_name: str,
    dim: int,
    validate: bool,
    norm_atol: float,
    pre: tuple[str, int | None, str],
) -> _Folder:
    """Read and check every file of a folder in name order; ``pre`` = (pre-projection column,
    its width from the manifest or None, what names the width)."""
    files = list_parquet(fs, folder)
    if not files:
        raise TableError(f"{display(root, folder)}: no parquet files in this folder")
    total = sum(_footer_rows(fs, path) for path in files)
    emb = RowBuffer(total, dim)
    pre_name, pre_width, pre_what = pre
    out = _Folder(parts=[], embeddings=emb.data)
    start = 0
    for path in files:
        shown = display(root, path)
        with _open(fs, path, shown) as pf:
            schema = pf.schema_arrow
            missing = [c for c in required if c not in schema.names]
            if missing:
                raise TableError(
                    f"{shown}: missing required column(s) {', '.join(map(repr, missing))}"
                )
            if out.parts:
                _same_kind(out.parts[0], shown, schema, "embedding", _value_type)
            small = _read_small(
                pf, [c for c in schema.names if c not in ("embedding", pre_name)], shown
            )
            ids = string_column(small, id_name, shown, id_name, None)
            n = len(ids)
            check_list_type(schema.field("embedding").type, "embedding", shown)
            rows = emb.rows(start, n)
            report = fill_matrix(_chunks(pf, "embedding", shown, dim), rows, dim)
            error = report.error(shown, id_name, ids, "embedding", dim, "manifest dim")
            if error is not None:
                raise error
            if validate:
                check_unit(rows, norm_atol, shown, id_name, ids)
            part = _Part(shown, ids, schema, small, start)
            if pre_name in schema.names and pre_width is not None:
                _read_pre(pf, part, out, total, pre, id_name, validate)
        out.parts.append(part)
        start += n
    if not start:
        raise TableError(
            f"{display(root, folder)}: no rows ({len(out.parts)} parquet file(s), all empty)"
        )
    out.rows = start
    out.embeddings = emb.result(start)
    if out.pre_buffer is not None:
        out.pre = out.pre_buffer.result(start)
        out.pre_buffer = None
    # Arrow's allocator keeps the freed batches for reuse; hand them back (milliseconds).
    pa.default_memory_pool().release_unused()
    return out


def _read_pre(
    pf: pq.ParquetFile,
    part: _Part,
    folder: _Folder,
    total: int,
    pre: tuple[str, int | None, str],
    id_name: str,
    validate: bool,
) -> None:
    """Copy a file's pre-projection column into the folder's matrix; its problems are kept on
    the part and raised at their turn (:func:`_pre_features`)."""
    name, width, what = pre
    assert width is not None
    if not is_list_of_numbers(part.schema.field(name).type):
        return  # refused at its turn, naming the type
    if folder.pre_buffer is None:
        folder.pre_buffer = RowBuffer(total, width)
    n = len(part.ids)
    rows = folder.pre_buffer.rows(part.start, n)
    report = fill_matrix(_chunks(pf, name, part.shown, width), rows, width)
    part.pre_error = report.error(part.shown, id_name, part.ids, name, width, what)
    if part.pre_error is None and validate:
        bad = first_nonfinite(rows)
        if bad is not None:
            part.pre_nonfinite = row_error(
                part.shown, bad, id_name, part.ids, f"{name} has NaN/inf"
            )


def _value_type(typ: pa.DataType) -> pa.DataType:
    """What must agree between the parts of a folder for the embedding column: the value type
    (float32 vs float64 ...); list or fixed-size list and the child's name may differ between
    writers, and every row's length is checked against the manifest anyway."""
    return typ.value_type if hasattr(typ, "value_type") else typ


def _same_kind(first: _Part, shown: str, schema: pa.Schema, name: str, key=lambda t: t) -> None:
    """:class:`TableError` naming both files when column ``name`` differs in type."""
    a, b = first.schema.field(name).type, schema.field(name).type
    if key(a) != key(b):
        raise TableError(
            f"{shown}: column {name!r} has type {b}, but {a} in {first.shown} "
            "(all files of a folder must share one schema)"
        )


# --------------------------------------------------------------------------------------------
# checks across the files of a folder


def _locate(parts: list[_Part], row: int) -> tuple[_Part, int]:
    """Map a global row to ``(part, row within that part's file)``."""
    offsets = np.cumsum([0] + [len(p.ids) for p in parts])
    k = int(np.searchsorted(offsets, row, side="right") - 1)
    return parts[k], row - int(offsets[k])


def check_unique(parts: list[_Part], all_ids: pa.Array, id_name: str) -> None:
    if len(pc.unique(all_ids)) == len(all_ids):
        return
    first = pc.index_in(all_ids, value_set=all_ids).to_numpy(zero_copy_only=False)
    row = first_true(first != np.arange(len(all_ids)))
    part, local = _locate(parts, row)
    prev_part, prev_local = _locate(parts, int(first[row]))
    raise row_error(
        part.shown,
        local,
        id_name,
        part.ids,
        f"duplicate {id_name}, first seen in {prev_part.shown} row {prev_local}",
    )


def _concat_ids(parts: list[_Part]) -> pa.Array:
    return pa.concat_arrays([p.ids for p in parts]) if parts else pa.array([], pa.string())


def _same_columns(parts: list[_Part], names: list[str]) -> None:
    """Every file holds each of ``names`` (or none does); else name a file with and without."""
    for name in names:
        has = [name in p.schema.names for p in parts]
        if any(has) and not all(has):
            with_, without = parts[has.index(True)], parts[has.index(False)]
            raise TableError(
                f"{without.shown}: missing column {name!r} present in {with_.shown} "
                "(all files of a folder must share one schema)"
            )


def _extra(parts: list[_Part], reserved: frozenset[str], id_name: str) -> dict[str, np.ndarray]:
    names = list(dict.fromkeys(c for p in parts for c in p.schema.names))
    names = [c for c in names if c not in reserved]
    _same_columns(parts, names)
    out: dict[str, np.ndarray] = {}
    for name in names:
        for p in parts[1:]:
            _same_kind(parts[0], p.shown, p.schema, name)
        cols = [p.table.column(name) for p in parts]
        typ = cols[0].type
        value_type = typ.value_type if pa.types.is_dictionary(typ) else typ
        if pa.types.is_string(value_type) or pa.types.is_large_string(value_type):
            for p, col in zip(parts, cols, strict=True):
                arr = col.cast(value_type).combine_chunks() if len(col) else pa.array([], typ)
                check_utf8(arr, name, p.shown, id_name, p.ids)
        arr = pa.chunked_array([c for col in cols for c in col.chunks], type=typ)
        out[name] = arr.to_numpy()
    return out


def _norms(parts: list[_Part], validate: bool, id_name: str) -> np.ndarray | None:
    """The raw projection norms of a folder (texts or images), or None without a ``norm``
    column; ``validate``: finite, > 0 and within the spread bounds."""
    if not any("norm" in p.schema.names for p in parts):
        return None
    _same_columns(parts, ["norm"])
    blocks = []
    for p in parts:
        col = p.table.column("norm")
        if not (pa.types.is_floating(col.type) or pa.types.is_integer(col.type)):
            raise TableError(f"{p.shown}: column 'norm' has type {col.type}, expected float32")
        _same_kind(parts[0], p.shown, p.schema, "norm")
        vals = col.cast(pa.float64()).to_numpy() if len(col) else np.zeros(0)
        if validate:
            bad = first_true(~(np.isfinite(vals) & (vals > 0)))
            if bad is not None:
                msg = f"norm is {vals[bad]!r}, must be finite and > 0"
                raise row_error(p.shown, bad, id_name, p.ids, msg)
        blocks.append(vals)
    if validate:
        _check_norm_spread(parts, blocks, id_name)
    norms = np.concatenate(blocks) if len(blocks) > 1 else blocks[0]
    return norms.astype(np.float32)


def _check_norm_spread(parts: list[_Part], blocks: list[np.ndarray], id_name: str) -> None:
    """Raw norms within ``NORM_SPREAD`` of the split's median and at most ``NORM_MAX``."""
    everything = np.concatenate(blocks)
    if not everything.size:
        return
    median = float(np.median(everything))
    low, high = median / NORM_SPREAD, min(median * NORM_SPREAD, NORM_MAX)
    for p, vals in zip(parts, blocks, strict=True):
        bad = first_true((vals < low) | (vals > high))
        if bad is not None:
            raise row_error(
                p.shown,
                bad,
                id_name,
                p.ids,
                f"norm is {vals[bad]:.6g}, outside [{low:.3g}, {high:.3g}] (within a factor "
                f"{NORM_SPREAD:g} of the split's median norm {median:.6g}, at most "
                f"{NORM_MAX:g}); such a row would dominate the raw adapter input "
                "(embedding * norm)",
            )


def _pre_features(folder: _Folder, manifest: Manifest, modality: str) -> np.ndarray | None:
    """The ``<modality>_features_pre`` matrix of a folder ``[n, pre_dim]``, or None when no
    file has the column; its width is the manifest's ``pre_dim.<modality>``. The problems found
    while reading it are raised here, in the order of the checks."""
    parts = folder.parts
    name = IMAGE_PRE if modality == "image" else TEXT_PRE
    if not any(name in p.schema.names for p in parts):
        return None
    _same_columns(parts, [name])
    width = manifest.pre_dim.get(modality)
    if width is None:
        raise TableError(
            f"{parts[0].shown}: column {name!r} is present but the manifest has no "
            f"pre_dim.{modality} (its width)"
        )
    for p in parts:
        _same_kind(parts[0], p.shown, p.schema, name, _value_type)
        check_list_type(p.schema.field(name).type, name, p.shown)
        if p.pre_error is not None:
            raise p.pre_error
        if p.pre_nonfinite is not None:
            raise p.pre_nonfinite
    assert folder.pre is not None  # every file's column was read into it
    return folder.pre


# --------------------------------------------------------------------------------------------
# the split


def read_split(
    root: str, split: str, *, validate: bool = True, norm_atol: float = 1e-3
) -> EmbeddingSplit:
    """Read and (by default) validate ``ROOT/split``; raises :class:`TableError` on violations.

    Structural problems (missing files or columns, wrong embedding length, nulls, captions of
    unknown images) always raise; ``validate`` adds NaN/inf, unit-norm (within ``norm_atol``),
    duplicate-id and ``norm``-column checks. The optional ``norm`` (images and texts) and
    pre-projection columns are read when present (``image_norms``, ``text_norms``,
    ``image_features_pre``, ``text_features_pre``; None otherwise). The matrices are writable
    float32 arrays of their own; ``texts`` is a :class:`~asymvlm.tables.columns.StringColumn`.
    """
    manifest = read_manifest(root)
    dim = manifest.dim
    fs, base = filesystem(root)
    pre_dim = manifest.pre_dim

    images = _read_folder(
        fs,
        root,
        join(base, split, IMAGES_DIR),
        IMAGE_COLUMNS,
        "image_id",
        dim,
        validate,
        norm_atol,
        (IMAGE_PRE, pre_dim.get("image"), "manifest pre_dim.image"),
    )
    texts = _read_folder(
        fs,
        root,
        join(base, split, TEXTS_DIR),
        TEXT_COLUMNS,
        "caption_id",
        dim,
        validate,
        norm_atol,
        (TEXT_PRE, pre_dim.get("text"), "manifest pre_dim.text"),
    )
    img_parts, txt_parts = images.parts, texts.parts

    image_ids = _concat_ids(img_parts)
    caption_ids = _concat_ids(txt_parts)
    if validate:
        check_unique(img_parts, image_ids, "image_id")
        check_unique(txt_parts, caption_ids, "caption_id")

    index_blocks = []
    text_arrays: list[pa.Array] = []
    for p in txt_parts:
        cap_img = string_column(p.table, "image_id", p.shown, "caption_id", p.ids)
        idx = pc.index_in(cap_img, value_set=image_ids)
        if idx.null_count:
            row = first_true(idx.is_null().to_numpy(zero_copy_only=False))
            raise row_error(
                p.shown, row, "caption_id", p.ids, f"unknown image_id {cap_img[row].as_py()!r}"
            )
        index_blocks.append(idx.to_numpy(zero_copy_only=False).astype(np.int64))
        text_arrays.append(string_column(p.table, "text", p.shown, "caption_id", p.ids))

    return EmbeddingSplit(
        image_ids=image_ids.to_pylist(),
        image_embeddings=images.embeddings,
        caption_ids=caption_ids.to_pylist(),
        text_image_index=np.concatenate(index_blocks) if index_blocks else np.zeros(0, np.int64),
        texts=StringColumn(pa.chunked_array(text_arrays, type=pa.string())),
        text_embeddings=texts.embeddings,
        text_norms=_norms(txt_parts, validate, "caption_id"),
        extra_text_columns=_extra(txt_parts, TEXT_RESERVED, "caption_id"),
        manifest=manifest,
        extra_image_columns=_extra(img_parts, IMAGE_RESERVED, "image_id"),
        image_norms=_norms(img_parts, validate, "image_id"),
        image_features_pre=_pre_features(images, manifest, "image"),
        text_features_pre=_pre_features(texts, manifest, "text"),
    )
