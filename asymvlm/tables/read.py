"""Reading and validating a split: :class:`EmbeddingSplit` and :func:`read_split` (see
:mod:`asymvlm.tables` for the contract and what is refused)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from asymvlm.storage import display as _display
from asymvlm.storage import filesystem as _filesystem
from asymvlm.storage import join as _join
from asymvlm.tables.files import (
    _IMAGE_RESERVED,
    _TEXT_RESERVED,
    IMAGE_COLUMNS,
    IMAGE_PRE,
    IMAGES_DIR,
    NORM_MAX,
    NORM_SPREAD,
    TEXT_COLUMNS,
    TEXT_PRE,
    TEXTS_DIR,
    Manifest,
    TableError,
    _list_parquet,
    read_manifest,
)

# --------------------------------------------------------------------------------------------
# the split


@dataclass(eq=False)
class EmbeddingSplit:
    """One split read from the tables: images, captions and their unit-norm embeddings."""

    image_ids: list[str]
    image_embeddings: np.ndarray
    caption_ids: list[str]
    text_image_index: np.ndarray
    texts: list[str]
    text_embeddings: np.ndarray
    text_norms: np.ndarray | None
    extra_text_columns: dict[str, np.ndarray]
    manifest: Manifest
    extra_image_columns: dict[str, np.ndarray] = field(default_factory=dict)
    #: Raw image-projection norms (``embedding * norm`` is the unnormalised projection), as
    #: ``text_norms`` for captions; None when the image tables have no ``norm`` column.
    image_norms: np.ndarray | None = None
    #: Pre-projection features ``[n, pre_dim.<modality>]`` (None when the column is absent).
    image_features_pre: np.ndarray | None = None
    text_features_pre: np.ndarray | None = None
    _warned_no_norm: bool = field(default=False, init=False, repr=False)

    @property
    def n_images(self) -> int:
        return len(self.image_ids)

    @property
    def n_texts(self) -> int:
        return len(self.caption_ids)

    def subset(self, images: np.ndarray, texts: np.ndarray) -> EmbeddingSplit:
        """The split restricted to image rows ``images`` and caption rows ``texts`` (captions
        must belong to those images); caption-to-image indices are renumbered."""
        images, texts = np.asarray(images, dtype=np.int64), np.asarray(texts, dtype=np.int64)
        new_index = np.full(self.n_images, -1, dtype=np.int64)
        new_index[images] = np.arange(len(images))
        owner = new_index[self.text_image_index[texts]]
        if (owner < 0).any():
            raise ValueError("subset: some captions belong to images left out")
        return EmbeddingSplit(
            image_ids=[self.image_ids[i] for i in images],
            image_embeddings=self.image_embeddings[images],
            caption_ids=[self.caption_ids[t] for t in texts],
            text_image_index=owner,
            texts=[self.texts[t] for t in texts],
            text_embeddings=self.text_embeddings[texts],
            text_norms=None if self.text_norms is None else self.text_norms[texts],
            extra_text_columns={k: v[texts] for k, v in self.extra_text_columns.items()},
            manifest=self.manifest,
            extra_image_columns={k: v[images] for k, v in self.extra_image_columns.items()},
            image_norms=_rows(self.image_norms, images),
            image_features_pre=_rows(self.image_features_pre, images),
            text_features_pre=_rows(self.text_features_pre, texts),
        )

    def text_inputs(self, adapter_input: str = "raw") -> np.ndarray:
        """Text-side adapter input, ``[n_text, dim]`` float32.

        ``"raw"``: ``embedding * norm``, the unnormalised CLIP text projection (the official
        AsymVLM adapter input); without a ``norm`` column this warns once and falls back to the
        unit embeddings. ``"unit"``: the stored unit embeddings (not copied).
        """
        if adapter_input == "unit":
            return self.text_embeddings
        if adapter_input != "raw":
            raise ValueError(f"adapter_input must be 'raw' or 'unit', got {adapter_input!r}")
        if self.text_norms is None:
            if not self._warned_no_norm:
                warnings.warn(
                    "text table has no `norm` column: adapter_input='raw' falls back to the "
                    "unit-norm text embeddings",
                    UserWarning,
                    stacklevel=2,
                )
                self._warned_no_norm = True
            return self.text_embeddings
        return (self.text_embeddings * self.text_norms[:, None]).astype(np.float32, copy=False)


def _rows(values: np.ndarray | None, rows: np.ndarray) -> np.ndarray | None:
    return None if values is None else values[rows]


# --------------------------------------------------------------------------------------------
# reading and validation


def _row_error(shown: str, row: int, id_name: str, ids: pa.ChunkedArray, msg: str) -> TableError:
    ident = ids[row].as_py() if ids is not None and row < len(ids) else None
    return TableError(f"{shown} row {row} ({id_name} {ident!r}): {msg}")


def _first(mask: np.ndarray) -> int | None:
    hits = np.flatnonzero(mask)
    return int(hits[0]) if hits.size else None


def _string_column(table: pa.Table, name: str, shown: str, id_name: str, ids: Any) -> pa.Array:
    col = table.column(name)
    typ = col.type
    if pa.types.is_dictionary(typ):
        typ = typ.value_type
    if not (pa.types.is_string(typ) or pa.types.is_large_string(typ)):
        raise TableError(f"{shown}: column {name!r} has type {col.type}, expected string")
    arr = col.cast(pa.string()).combine_chunks() if len(col) else pa.array([], pa.string())
    _check_utf8(arr, name, shown, id_name, ids)
    if arr.null_count:
        row = _first(np.asarray(arr.is_null().to_numpy(zero_copy_only=False)))
        ref = ids if ids is not None else arr
        raise _row_error(shown, row, id_name, ref, f"{name} is null")
    return arr


def _check_utf8(arr: pa.Array, name: str, shown: str, id_name: str, ids: Any) -> None:
    """:class:`TableError` naming file, row and column if a string column holds invalid UTF-8
    (parquet does not check it on write; Python would fail later on that row)."""
    try:
        arr.validate(full=True)
        return
    except pa.ArrowInvalid:
        pass
    raw = arr.cast(pa.large_binary() if pa.types.is_large_string(arr.type) else pa.binary())
    for row, value in enumerate(raw.to_pylist()):
        if value is None:
            continue
        try:
            value.decode("utf-8")
        except UnicodeDecodeError as exc:
            what = (
                f"column {name!r} is not valid UTF-8 ({exc.reason} at byte {exc.start}: "
                f"{value[max(0, exc.start - 16) : exc.start + 4]!r})"
            )
            if ids is None:  # the id column itself: its value cannot be shown
                raise TableError(f"{shown} row {row}: {what}") from None
            raise _row_error(shown, row, id_name, ids, what) from None
    raise TableError(f"{shown}: column {name!r} is not a valid string column")


def _embedding_matrix(
    col: pa.ChunkedArray,
    dim: int,
    shown: str,
    id_name: str,
    ids: pa.Array,
    name: str = "embedding",
    width_of: str = "manifest dim",
) -> np.ndarray:
    """``[n, dim]`` float32 from a list column ``name`` (``embedding`` or a pre-projection
    column, whose width ``width_of`` names), chunk by chunk (no int32 offset overflow)."""
    typ = col.type
    if not (
        pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ)
    ):
        raise TableError(f"{shown}: column {name!r} has type {typ}, expected list<float32>")
    if not (pa.types.is_floating(typ.value_type) or pa.types.is_integer(typ.value_type)):
        raise TableError(f"{shown}: column {name!r} has type {typ}, expected list<float32>")
    blocks: list[np.ndarray] = []
    start = 0
    for chunk in col.chunks:
        n = len(chunk)
        if n == 0:
            continue
        if chunk.null_count:
            row = start + _first(chunk.is_null().to_numpy(zero_copy_only=False))
            raise _row_error(shown, row, id_name, ids, f"{name} is null")
        lengths = pc.list_value_length(chunk).to_numpy(zero_copy_only=False)
        bad = _first(lengths != dim)
        if bad is not None:
            raise _row_error(
                shown,
                start + bad,
                id_name,
                ids,
                f"{name} has length {int(lengths[bad])}, {width_of} is {dim}",
            )
        values = chunk.flatten()
        if values.null_count:
            flat_null = values.is_null().to_numpy(zero_copy_only=False)
            row = start + _first(flat_null) // dim
            raise _row_error(shown, row, id_name, ids, f"{name} has null values")
        flat = values.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
        blocks.append(flat.reshape(n, dim))
        start += n
    if not blocks:
        return np.zeros((0, dim), dtype=np.float32)
    return blocks[0] if len(blocks) == 1 else np.concatenate(blocks, axis=0)


def _check_unit(emb: np.ndarray, norm_atol: float, shown: str, id_name: str, ids: pa.Array) -> None:
    finite = np.isfinite(emb).all(axis=1)
    bad = _first(~finite)
    if bad is not None:
        raise _row_error(shown, bad, id_name, ids, "embedding has NaN/inf")
    norms = np.sqrt(np.einsum("ij,ij->i", emb, emb, dtype=np.float64))
    bad = _first(np.abs(norms - 1.0) > norm_atol)
    if bad is not None:
        raise _row_error(
            shown,
            bad,
            id_name,
            ids,
            f"embedding norm is {norms[bad]:.6g}, expected 1 within {norm_atol:g}",
        )


def _read_table(fs: pafs.FileSystem, path: str, shown: str, required: tuple[str, ...]) -> pa.Table:
    try:
        table = pq.read_table(path, filesystem=fs)
    except (OSError, pa.ArrowException) as exc:
        raise TableError(f"{shown}: cannot read parquet file ({exc})") from exc
    missing = [c for c in required if c not in table.column_names]
    if missing:
        raise TableError(f"{shown}: missing required column(s) {', '.join(map(repr, missing))}")
    return table


@dataclass
class _Part:
    shown: str
    ids: pa.Array
    embeddings: np.ndarray
    table: pa.Table


def _read_parts(
    fs: pafs.FileSystem,
    root: str,
    folder: str,
    required: tuple[str, ...],
    id_name: str,
    dim: int,
    validate: bool,
    norm_atol: float,
) -> list[_Part]:
    files = _list_parquet(fs, folder)
    if not files:
        raise TableError(f"{_display(root, folder)}: no parquet files in this folder")
    parts: list[_Part] = []
    for path in files:
        shown = _display(root, path)
        table = _read_table(fs, path, shown, required)
        if parts:
            _same_kind(parts[0], shown, table, "embedding", _value_type)
        ids = _string_column(table, id_name, shown, id_name, None)
        emb = _embedding_matrix(table.column("embedding"), dim, shown, id_name, ids)
        if validate:
            _check_unit(emb, norm_atol, shown, id_name, ids)
        parts.append(_Part(shown, ids, emb, table))
    if not sum(len(p.ids) for p in parts):
        raise TableError(
            f"{_display(root, folder)}: no rows ({len(parts)} parquet file(s), all empty)"
        )
    return parts


def _value_type(typ: pa.DataType) -> pa.DataType:
    """What must agree between the parts of a folder for the embedding column: the value type
    (float32 vs float64 ...); list or fixed-size list and the child's name may differ between
    writers, and every row's length is checked against the manifest anyway."""
    return typ.value_type if hasattr(typ, "value_type") else typ


def _same_kind(first: _Part, shown: str, table: pa.Table, name: str, key=lambda t: t) -> None:
    """:class:`TableError` naming both files when column ``name`` differs in type."""
    a, b = first.table.schema.field(name).type, table.schema.field(name).type
    if key(a) != key(b):
        raise TableError(
            f"{shown}: column {name!r} has type {b}, but {a} in {first.shown} "
            "(all files of a folder must share one schema)"
        )


def _locate(parts: list[_Part], row: int) -> tuple[_Part, int]:
    """Map a global row to ``(part, row within that part's file)``."""
    offsets = np.cumsum([0] + [len(p.ids) for p in parts])
    k = int(np.searchsorted(offsets, row, side="right") - 1)
    return parts[k], row - int(offsets[k])


def _check_unique(parts: list[_Part], all_ids: pa.Array, id_name: str) -> None:
    if len(pc.unique(all_ids)) == len(all_ids):
        return
    first = pc.index_in(all_ids, value_set=all_ids).to_numpy(zero_copy_only=False)
    row = _first(first != np.arange(len(all_ids)))
    part, local = _locate(parts, row)
    prev_part, prev_local = _locate(parts, int(first[row]))
    raise _row_error(
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
        has = [name in p.table.column_names for p in parts]
        if any(has) and not all(has):
            with_, without = parts[has.index(True)], parts[has.index(False)]
            raise TableError(
                f"{without.shown}: missing column {name!r} present in {with_.shown} "
                "(all files of a folder must share one schema)"
            )


def _extra(parts: list[_Part], reserved: frozenset[str], id_name: str) -> dict[str, np.ndarray]:
    names = list(dict.fromkeys(c for p in parts for c in p.table.column_names))
    names = [c for c in names if c not in reserved]
    _same_columns(parts, names)
    out: dict[str, np.ndarray] = {}
    for name in names:
        for p in parts[1:]:
            _same_kind(parts[0], p.shown, p.table, name)
        cols = [p.table.column(name) for p in parts]
        typ = cols[0].type
        value_type = typ.value_type if pa.types.is_dictionary(typ) else typ
        if pa.types.is_string(value_type) or pa.types.is_large_string(value_type):
            for p, col in zip(parts, cols, strict=True):
                arr = col.cast(value_type).combine_chunks() if len(col) else pa.array([], typ)
                _check_utf8(arr, name, p.shown, id_name, p.ids)
        arr = pa.chunked_array([c for col in cols for c in col.chunks], type=typ)
        out[name] = arr.to_numpy()
    return out


def _norms(parts: list[_Part], validate: bool, id_name: str) -> np.ndarray | None:
    """The raw projection norms of a folder (texts or images), or None without a ``norm``
    column; ``validate``: finite, > 0 and within the spread bounds."""
    if not any("norm" in p.table.column_names for p in parts):
        return None
    _same_columns(parts, ["norm"])
    blocks = []
    for p in parts:
        col = p.table.column("norm")
        if not (pa.types.is_floating(col.type) or pa.types.is_integer(col.type)):
            raise TableError(f"{p.shown}: column 'norm' has type {col.type}, expected float32")
        _same_kind(parts[0], p.shown, p.table, "norm")
        vals = col.cast(pa.float64()).to_numpy() if len(col) else np.zeros(0)
        if validate:
            bad = _first(~(np.isfinite(vals) & (vals > 0)))
            if bad is not None:
                msg = f"norm is {vals[bad]!r}, must be finite and > 0"
                raise _row_error(p.shown, bad, id_name, p.ids, msg)
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
        bad = _first((vals < low) | (vals > high))
        if bad is not None:
            raise _row_error(
                p.shown,
                bad,
                id_name,
                p.ids,
                f"norm is {vals[bad]:.6g}, outside [{low:.3g}, {high:.3g}] (within a factor "
                f"{NORM_SPREAD:g} of the split's median norm {median:.6g}, at most "
                f"{NORM_MAX:g}); such a row would dominate the raw adapter input "
                "(embedding * norm)",
            )


def _pre_features(
    parts: list[_Part], manifest: Manifest, modality: str, validate: bool, id_name: str
) -> np.ndarray | None:
    """The ``<modality>_features_pre`` column of a folder as ``[n, pre_dim]`` float32, or None
    when no file has it; its width is the manifest's ``pre_dim.<modality>``."""
    name = IMAGE_PRE if modality == "image" else TEXT_PRE
    if not any(name in p.table.column_names for p in parts):
        return None
    _same_columns(parts, [name])
    width = manifest.pre_dim.get(modality)
    if width is None:
        raise TableError(
            f"{parts[0].shown}: column {name!r} is present but the manifest has no "
            f"pre_dim.{modality} (its width)"
        )
    blocks = []
    for p in parts:
        _same_kind(parts[0], p.shown, p.table, name, _value_type)
        matrix = _embedding_matrix(p.table.column(name), width, p.shown, id_name, p.ids, name,
                                   f"manifest pre_dim.{modality}")  # fmt: skip
        if validate:
            bad = _first(~np.isfinite(matrix).all(axis=1))
            if bad is not None:
                raise _row_error(p.shown, bad, id_name, p.ids, f"{name} has NaN/inf")
        blocks.append(matrix)
    return _stack(blocks, width)


def read_split(
    root: str, split: str, *, validate: bool = True, norm_atol: float = 1e-3
) -> EmbeddingSplit:
    """Read and (by default) validate ``ROOT/split``; raises :class:`TableError` on violations.

    Structural problems (missing files or columns, wrong embedding length, nulls, captions of
    unknown images) always raise; ``validate`` adds NaN/inf, unit-norm (within ``norm_atol``),
    duplicate-id and ``norm``-column checks. The optional ``norm`` (images and texts) and
    pre-projection columns are read when present (``image_norms``, ``text_norms``,
    ``image_features_pre``, ``text_features_pre``; None otherwise).
    """
    manifest = read_manifest(root)
    dim = manifest.dim
    fs, base = _filesystem(root)

    img_parts = _read_parts(
        fs,
        root,
        _join(base, split, IMAGES_DIR),
        IMAGE_COLUMNS,
        "image_id",
        dim,
        validate,
        norm_atol,
    )
    txt_parts = _read_parts(
        fs,
        root,
        _join(base, split, TEXTS_DIR),
        TEXT_COLUMNS,
        "caption_id",
        dim,
        validate,
        norm_atol,
    )

    image_ids = _concat_ids(img_parts)
    caption_ids = _concat_ids(txt_parts)
    if validate:
        _check_unique(img_parts, image_ids, "image_id")
        _check_unique(txt_parts, caption_ids, "caption_id")

    index_blocks = []
    texts: list[str] = []
    for p in txt_parts:
        cap_img = _string_column(p.table, "image_id", p.shown, "caption_id", p.ids)
        idx = pc.index_in(cap_img, value_set=image_ids)
        if idx.null_count:
            row = _first(idx.is_null().to_numpy(zero_copy_only=False))
            raise _row_error(
                p.shown, row, "caption_id", p.ids, f"unknown image_id {cap_img[row].as_py()!r}"
            )
        index_blocks.append(idx.to_numpy(zero_copy_only=False).astype(np.int64))
        texts.extend(_string_column(p.table, "text", p.shown, "caption_id", p.ids).to_pylist())

    return EmbeddingSplit(
        image_ids=image_ids.to_pylist(),
        image_embeddings=_stack([p.embeddings for p in img_parts], dim),
        caption_ids=caption_ids.to_pylist(),
        text_image_index=np.concatenate(index_blocks) if index_blocks else np.zeros(0, np.int64),
        texts=texts,
        text_embeddings=_stack([p.embeddings for p in txt_parts], dim),
        text_norms=_norms(txt_parts, validate, "caption_id"),
        extra_text_columns=_extra(txt_parts, _TEXT_RESERVED, "caption_id"),
        manifest=manifest,
        extra_image_columns=_extra(img_parts, _IMAGE_RESERVED, "image_id"),
        image_norms=_norms(img_parts, validate, "image_id"),
        image_features_pre=_pre_features(img_parts, manifest, "image", validate, "image_id"),
        text_features_pre=_pre_features(txt_parts, manifest, "text", validate, "caption_id"),
    )


def _stack(blocks: list[np.ndarray], dim: int) -> np.ndarray:
    if not blocks:
        return np.zeros((0, dim), dtype=np.float32)
    return blocks[0] if len(blocks) == 1 else np.concatenate(blocks, axis=0)
