"""Reading and validating a split: :func:`read_split` (the contract: :mod:`asymvlm.tables`).

Each parquet file is read whole (``pq.read_table``) and checked chunk by chunk (row groups);
the ``list<float>`` columns of a folder become one float32 matrix, concatenated once from
numpy views of the Arrow values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from asymvlm.storage import display, filesystem, join
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

#: Rows per block when checking a matrix (NaN/inf, unit norm).
_CHECK_ROWS = 1 << 15


def row_error(shown: str, row: int, id_name: str, ids: Any, msg: str) -> TableError:
    ident = ids[row].as_py() if ids is not None and row < len(ids) else None
    return TableError(f"{shown} row {row} ({id_name} {ident!r}): {msg}")


def first_true(mask: np.ndarray) -> int | None:
    hits = np.flatnonzero(mask)
    return int(hits[0]) if hits.size else None


def check_utf8(arr: pa.Array, name: str, shown: str, id_name: str, ids: Any) -> None:
    """:class:`TableError` naming file, row and column of invalid UTF-8 (parquet does not
    check it on write)."""
    try:
        arr.validate(full=True)
        return
    except pa.ArrowInvalid:
        pass
    raw = arr.cast(pa.large_binary() if pa.types.is_large_string(arr.type) else pa.binary())
    for row, value in enumerate(raw.to_pylist()):
        try:
            (value or b"").decode("utf-8")
        except UnicodeDecodeError as exc:
            what = (
                f"column {name!r} is not valid UTF-8 ({exc.reason} at byte {exc.start}: "
                f"{value[max(0, exc.start - 16) : exc.start + 4]!r})"
            )
            if ids is None:  # the id column itself: its value cannot be shown
                raise TableError(f"{shown} row {row}: {what}") from None
            raise row_error(shown, row, id_name, ids, what) from None
    raise TableError(f"{shown}: column {name!r} is not a valid string column")


def string_column(table: pa.Table, name: str, shown: str, id_name: str, ids: Any) -> pa.Array:
    """Column ``name`` as one ``string`` array; refused when it is not a string column, holds
    invalid UTF-8 or a null."""
    col = table.column(name)
    typ = col.type.value_type if pa.types.is_dictionary(col.type) else col.type
    if not (pa.types.is_string(typ) or pa.types.is_large_string(typ)):
        raise TableError(f"{shown}: column {name!r} has type {col.type}, expected string")
    arr = col.cast(pa.string()).combine_chunks() if len(col) else pa.array([], pa.string())
    check_utf8(arr, name, shown, id_name, ids)
    if arr.null_count:
        row = first_true(arr.is_null().to_numpy(zero_copy_only=False))
        raise row_error(shown, row, id_name, ids if ids is not None else arr, f"{name} is null")
    return arr


def is_list_of_numbers(typ: pa.DataType) -> bool:
    return (
        pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ)
    ) and (pa.types.is_floating(typ.value_type) or pa.types.is_integer(typ.value_type))


def check_list_type(typ: pa.DataType, name: str, shown: str) -> None:
    if not is_list_of_numbers(typ):
        raise TableError(f"{shown}: column {name!r} has type {typ}, expected list<float32>")


def _list_values(
    table: pa.Table, name: str, width: int, shown: str, id_name: str, ids: pa.Array, what: str
) -> list[np.ndarray]:
    """The rows of a list column as ``[rows, width]`` numpy views, one per chunk. The first
    chunk with a problem is refused: a null row, else a row of another length, else null
    values (``what`` names the width)."""
    views, start = [], 0
    for chunk in table[name].chunks:
        if chunk.null_count:
            row = start + first_true(chunk.is_null().to_numpy(zero_copy_only=False))
            raise row_error(shown, row, id_name, ids, f"{name} is null")
        lengths = pc.list_value_length(chunk).to_numpy(zero_copy_only=False)
        bad = first_true(lengths != width)
        if bad is not None:
            msg = f"{name} has length {lengths[bad]}, {what} is {width}"
            raise row_error(shown, start + bad, id_name, ids, msg)
        values = chunk.flatten()
        if values.null_count:
            row = start + first_true(values.is_null().to_numpy(zero_copy_only=False)) // width
            raise row_error(shown, row, id_name, ids, f"{name} has null values")
        views.append(values.to_numpy(zero_copy_only=False).reshape(len(chunk), width))
        start += len(chunk)
    return views


def _first_bad(views: list[np.ndarray], test) -> tuple[int, Any] | None:
    """The first row (over the blocks) where ``test(block)`` is true, with its value."""
    start = 0
    for view in views:
        for lo in range(0, len(view), _CHECK_ROWS):
            mask, values = test(view[lo : lo + _CHECK_ROWS])
            bad = first_true(mask)
            if bad is not None:
                return start + lo + bad, values[bad]
        start += len(view)
    return None


def _nonfinite(block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return ~np.isfinite(block).all(axis=1), block


def _check_unit(views: list[np.ndarray], atol: float, shown: str, id_name: str, ids) -> None:
    """The first row with NaN/inf, else the first whose norm is not 1 within ``atol``."""
    bad = _first_bad(views, _nonfinite)
    if bad is not None:
        raise row_error(shown, bad[0], id_name, ids, "embedding has NaN/inf")

    def off_unit(block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        norms = np.sqrt(np.einsum("ij,ij->i", block, block, dtype=np.float64))
        return np.abs(norms - 1.0) > atol, norms

    bad = _first_bad(views, off_unit)
    if bad is not None:
        msg = f"embedding norm is {bad[1]:.6g}, expected 1 within {atol:g}"
        raise row_error(shown, bad[0], id_name, ids, msg)


@dataclass
class _Part:
    """One parquet file of a folder: its ids and table."""

    shown: str
    ids: pa.Array
    table: pa.Table

    @property
    def schema(self) -> pa.Schema:
        return self.table.schema


def _matrix(blocks: list[np.ndarray], width: int) -> np.ndarray:
    """The blocks as one writable float32 matrix (the one copy)."""
    if not blocks:
        return np.zeros((0, width), np.float32)
    return np.concatenate(blocks, dtype=np.float32, casting="unsafe")


def _value_type(typ: pa.DataType) -> pa.DataType:
    """The list value type: list or fixed-size list may differ between the parts of a folder."""
    return typ.value_type if hasattr(typ, "value_type") else typ


def _same_kind(first: _Part, shown: str, schema: pa.Schema, name: str, key=lambda t: t) -> None:
    """:class:`TableError` naming both files when column ``name`` differs in type."""
    a, b = first.schema.field(name).type, schema.field(name).type
    if key(a) != key(b):
        raise TableError(
            f"{shown}: column {name!r} has type {b}, but {a} in {first.shown} "
            "(all files of a folder must share one schema)"
        )


def _read_folder(
    fs: pafs.FileSystem,
    root: str,
    folder: str,
    required: tuple[str, ...],
    id_name: str,
    dim: int,
    validate: bool,
    norm_atol: float,
) -> tuple[list[_Part], np.ndarray]:
    """Read and check every file of a folder in name order: (parts, embeddings)."""
    files = list_parquet(fs, folder)
    if not files:
        raise TableError(f"{display(root, folder)}: no parquet files in this folder")
    parts: list[_Part] = []
    emb: list[np.ndarray] = []
    for path in files:
        shown = display(root, path)
        try:
            table = pq.read_table(path, filesystem=fs)
        except (OSError, pa.ArrowException) as exc:
            raise TableError(f"{shown}: cannot read parquet file ({exc})") from exc
        missing = [c for c in required if c not in table.column_names]
        if missing:
            raise TableError(f"{shown}: missing required column(s) {', '.join(map(repr, missing))}")
        if parts:
            _same_kind(parts[0], shown, table.schema, "embedding", _value_type)
        ids = string_column(table, id_name, shown, id_name, None)
        check_list_type(table.schema.field("embedding").type, "embedding", shown)
        views = _list_values(table, "embedding", dim, shown, id_name, ids, "manifest dim")
        if validate:
            _check_unit(views, norm_atol, shown, id_name, ids)
        emb += views
        parts.append(_Part(shown, ids, table))
    if not sum(len(p.ids) for p in parts):
        raise TableError(
            f"{display(root, folder)}: no rows ({len(parts)} parquet file(s), all empty)"
        )
    return parts, _matrix(emb, dim)


def _locate(parts: list[_Part], row: int) -> tuple[_Part, int]:
    """Map a row of the folder to ``(part, row within that part's file)``."""
    offsets = np.cumsum([0] + [len(p.ids) for p in parts])
    k = int(np.searchsorted(offsets, row, side="right") - 1)
    return parts[k], row - int(offsets[k])


def _check_unique(parts: list[_Part], all_ids: pa.Array, id_name: str) -> None:
    if len(pc.unique(all_ids)) == len(all_ids):
        return
    first = pc.index_in(all_ids, value_set=all_ids).to_numpy(zero_copy_only=False)
    row = first_true(first != np.arange(len(all_ids)))
    part, local = _locate(parts, row)
    prev_part, prev_local = _locate(parts, int(first[row]))
    msg = f"duplicate {id_name}, first seen in {prev_part.shown} row {prev_local}"
    raise row_error(part.shown, local, id_name, part.ids, msg)


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
    names = [
        c for c in dict.fromkeys(c for p in parts for c in p.schema.names) if c not in reserved
    ]
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
        out[name] = pa.chunked_array([c for col in cols for c in col.chunks], type=typ).to_numpy()
    return out


def _norms(parts: list[_Part], validate: bool, id_name: str) -> np.ndarray | None:
    """The raw projection norms of a folder, or None without a ``norm`` column; ``validate``:
    finite, > 0, within ``NORM_SPREAD`` of the split's median and at most ``NORM_MAX``."""
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
        bad = first_true(~(np.isfinite(vals) & (vals > 0))) if validate else None
        if bad is not None:
            msg = f"norm is {vals[bad]!r}, must be finite and > 0"
            raise row_error(p.shown, bad, id_name, p.ids, msg)
        blocks.append(vals)
    norms = np.concatenate(blocks)
    if validate and norms.size:
        median = float(np.median(norms))
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
    return norms.astype(np.float32)


def _pre_features(
    parts: list[_Part], manifest: Manifest, modality: str, validate: bool, id_name: str
) -> np.ndarray | None:
    """The ``<modality>_features_pre`` matrix ``[n, pre_dim]`` (None when no file has the
    column), checked after the other columns."""
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
    blocks: list[np.ndarray] = []
    for p in parts:
        _same_kind(parts[0], p.shown, p.schema, name, _value_type)
        check_list_type(p.schema.field(name).type, name, p.shown)
        what = f"manifest pre_dim.{modality}"
        views = _list_values(p.table, name, width, p.shown, id_name, p.ids, what)
        bad = _first_bad(views, _nonfinite) if validate else None
        if bad is not None:
            raise row_error(p.shown, bad[0], id_name, p.ids, f"{name} has NaN/inf")
        blocks += views
    return _matrix(blocks, width)


def read_split(
    root: str, split: str, *, validate: bool = True, norm_atol: float = 1e-3
) -> EmbeddingSplit:
    """Read and (by default) validate ``ROOT/split``; raises :class:`TableError` on violations.

    Structural problems always raise; ``validate`` adds NaN/inf, unit-norm (within
    ``norm_atol``), duplicate-id and ``norm``-column checks.
    """
    manifest = read_manifest(root)
    fs, base = filesystem(root)
    checks = (manifest.dim, validate, norm_atol)
    folder = join(base, split, IMAGES_DIR)
    img_parts, img_emb = _read_folder(fs, root, folder, IMAGE_COLUMNS, "image_id", *checks)
    folder = join(base, split, TEXTS_DIR)
    txt_parts, txt_emb = _read_folder(fs, root, folder, TEXT_COLUMNS, "caption_id", *checks)
    image_ids = pa.concat_arrays([p.ids for p in img_parts])
    caption_ids = pa.concat_arrays([p.ids for p in txt_parts])
    if validate:
        _check_unique(img_parts, image_ids, "image_id")
        _check_unique(txt_parts, caption_ids, "caption_id")
    index_blocks, texts = [], []
    for p in txt_parts:
        cap_img = string_column(p.table, "image_id", p.shown, "caption_id", p.ids)
        idx = pc.index_in(cap_img, value_set=image_ids)
        if idx.null_count:
            row = first_true(idx.is_null().to_numpy(zero_copy_only=False))
            msg = f"unknown image_id {cap_img[row].as_py()!r}"
            raise row_error(p.shown, row, "caption_id", p.ids, msg)
        index_blocks.append(idx.to_numpy(zero_copy_only=False).astype(np.int64))
        texts += string_column(p.table, "text", p.shown, "caption_id", p.ids).to_pylist()
    return EmbeddingSplit(
        image_ids=image_ids.to_pylist(),
        image_embeddings=img_emb,
        caption_ids=caption_ids.to_pylist(),
        text_image_index=np.concatenate(index_blocks),
        texts=texts,
        text_embeddings=txt_emb,
        text_norms=_norms(txt_parts, validate, "caption_id"),
        extra_text_columns=_extra(txt_parts, TEXT_RESERVED, "caption_id"),
        manifest=manifest,
        extra_image_columns=_extra(img_parts, IMAGE_RESERVED, "image_id"),
        image_norms=_norms(img_parts, validate, "image_id"),
        image_features_pre=_pre_features(img_parts, manifest, "image", validate, "image_id"),
        text_features_pre=_pre_features(txt_parts, manifest, "text", validate, "caption_id"),
    )
