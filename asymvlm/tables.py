"""The embedding-table contract shared by every pipeline stage.

Layout under a root (a local path, a ``file://`` URI, ``s3://bucket/prefix`` or any URI that
:func:`pyarrow.fs.FileSystem.from_uri` understands)::

    ROOT/manifest.json                   {"dim": int, "model": str, ...extra keys}
    ROOT/<split>/images/*.parquet        image_id: string, embedding: list<float32>[dim]
    ROOT/<split>/texts/*.parquet         caption_id, image_id, text: string,
                                         embedding: list<float32>[dim], optional norm: float32,
                                         optional extra columns (e.g. level: int)

Every folder may hold several parquet files; they are read in file-name order. Stored embeddings
are unit-norm; the optional ``norm`` column keeps the raw norm of the CLIP text projection, so that
``embedding * norm`` recovers the unnormalised projection that AsymVLM's adapters take as input.

Validation is vectorised (numpy / pyarrow compute); Python only loops to format the message of the
first bad row, which always names the parquet file, the 0-based row index within it and the id.
:func:`read_split` refuses (:class:`TableError`):

* a split whose ``images`` or ``texts`` folder has parquet files but **no rows**;
* string columns (ids, ``text``, extra string columns) that are not valid UTF-8 (file, row,
  column);
* parts that disagree: a column present in one file of a folder but not in another, or a column
  (``embedding``, ``norm``, extra columns) with another type -- the message names both files;
* (``validate=True``) a raw text ``norm`` that is not finite and > 0, or that lies outside
  ``[median / NORM_SPREAD, median * NORM_SPREAD]`` of the split's median norm, or above
  ``NORM_MAX``. Real CLIP/SigLIP text projections have norms of order 1-100 (CLIP ViT-B/32: about
  5-15) and vary by well under 10x within a data set; the adapters take ``embedding * norm`` as
  input, so one corrupt row (say ``1e30``) would overflow float32 or dominate any scale fitted
  to the inputs. ``NORM_SPREAD = 1e4`` leaves four orders of magnitude to legitimate data, and
  ``NORM_MAX = 1e6`` keeps squared norms summed over 10^8 rows finite in float32.

Files are read and written through :mod:`asymvlm.storage` (local paths and object-store URIs,
atomic writes, :class:`~asymvlm.storage.OutputLock` for one writer at a time).
"""

from __future__ import annotations

import json
import posixpath
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from asymvlm.storage import (  # noqa: F401 - OutputLock, read_json, write_json: re-exported
    OutputLock,
    read_json,
    write_json,
)
from asymvlm.storage import atomic_write_bytes as _atomic_write_bytes
from asymvlm.storage import atomic_write_table as _atomic_write_table
from asymvlm.storage import display as _display
from asymvlm.storage import filesystem as _filesystem
from asymvlm.storage import join as _join

__all__ = [
    "EmbeddingSplit",
    "Manifest",
    "OutputLock",
    "TableError",
    "list_splits",
    "read_manifest",
    "read_split",
    "write_manifest",
    "write_split",
]

MANIFEST_NAME = "manifest.json"
IMAGES_DIR = "images"
TEXTS_DIR = "texts"
IMAGE_COLUMNS = ("image_id", "embedding")
TEXT_COLUMNS = ("caption_id", "image_id", "text", "embedding")
_TEXT_RESERVED = frozenset(TEXT_COLUMNS) | {"norm"}
_IMAGE_RESERVED = frozenset(IMAGE_COLUMNS)
#: Bounds on the raw text ``norm`` column (see the module docstring).
NORM_SPREAD = 1e4
NORM_MAX = 1e6


class TableError(ValueError):
    """A table or manifest violates the contract; the message names the file and first bad row."""


# --------------------------------------------------------------------------------------------
# manifest


@dataclass
class Manifest:
    """``manifest.json``: embedding dimension, embedding model name and any extra keys."""

    dim: int
    model: str
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Flat JSON object: ``dim``, ``model`` and the extra keys."""
        return {**self.extra, "dim": int(self.dim), "model": str(self.model)}

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "manifest") -> Manifest:
        """Parse a manifest object; raises :class:`TableError` (naming ``source``) if invalid."""
        if not isinstance(data, dict):
            raise TableError(f"{source}: manifest must be a JSON object, got {type(data).__name__}")
        for key in ("dim", "model"):
            if key not in data:
                raise TableError(f"{source}: manifest has no {key!r} key")
        dim = data["dim"]
        if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
            raise TableError(f"{source}: manifest 'dim' must be a positive int, got {dim!r}")
        model = data["model"]
        if not isinstance(model, str):
            raise TableError(f"{source}: manifest 'model' must be a string, got {model!r}")
        extra = {k: v for k, v in data.items() if k not in ("dim", "model")}
        return cls(dim=dim, model=model, extra=extra)

# --------------------------------------------------------------------------------------------
# files


def _list_parquet(fs: pafs.FileSystem, folder: str) -> list[str]:
    """Parquet files directly in ``folder`` sorted by name (hidden/temporary names skipped)."""
    infos = fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
    files = [
        info.path
        for info in infos
        if info.type == pafs.FileType.File
        and info.base_name.endswith(".parquet")
        and not info.base_name.startswith((".", "_"))
    ]
    return sorted(files, key=posixpath.basename)


def write_part(root: str, split: str, kind: str, part: str, table: pa.Table) -> str:
    """Atomically write ``ROOT/split/kind/part.parquet`` (any table, e.g. ``errors``)."""
    fs, base = _filesystem(root)
    folder = _join(base, split, kind)
    fs.create_dir(folder, recursive=True)
    path = _join(folder, f"{part}.parquet")
    _atomic_write_table(fs, path, table)
    return _display(root, path)


def column_matrix(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """``[n, width]`` float32 from a list / fixed-size-list / tensor column (no validation:
    for tables this package wrote itself, e.g. ``read_parts`` output)."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if isinstance(arr, pa.ExtensionArray):
        return np.asarray(arr.to_numpy_ndarray(), dtype=np.float32)
    width = arr.type.list_size if pa.types.is_fixed_size_list(arr.type) else None
    values = arr.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    if width is None:
        width = values.size // max(len(arr), 1)
    return values.reshape(len(arr), width)


def read_parts(root: str, split: str, kind: str) -> pa.Table | None:
    """All ``ROOT/split/kind/*.parquet`` concatenated in name order, or None if there are none."""
    fs, base = _filesystem(root)
    files = _list_parquet(fs, _join(base, split, kind))
    if not files:
        return None
    return pa.concat_tables([pq.read_table(f, filesystem=fs) for f in files])


def write_manifest(root: str, manifest: Manifest | dict[str, Any]) -> None:
    """Write ``ROOT/manifest.json`` atomically (validates ``dim`` and ``model`` first)."""
    if not isinstance(manifest, Manifest):
        manifest = Manifest.from_dict(manifest)
    else:
        manifest = Manifest.from_dict(manifest.to_dict())
    fs, base = _filesystem(root)
    fs.create_dir(base, recursive=True)
    data = json.dumps(manifest.to_dict(), indent=2, sort_keys=True).encode() + b"\n"
    _atomic_write_bytes(fs, _join(base, MANIFEST_NAME), data)


def read_manifest(root: str) -> Manifest:
    """Read ``ROOT/manifest.json``; :class:`TableError` if missing, not JSON, or lacking keys."""
    fs, base = _filesystem(root)
    path = _join(base, MANIFEST_NAME)
    shown = _display(root, path)
    if fs.get_file_info(path).type != pafs.FileType.File:
        raise TableError(f"{shown}: manifest not found")
    with fs.open_input_stream(path) as f:
        raw = f.read()
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TableError(f"{shown}: manifest is not valid JSON ({exc})") from exc
    return Manifest.from_dict(data, source=shown)


def list_splits(root: str) -> list[str]:
    """Names of the splits under ``root`` (sub-folders holding ``images/`` or ``texts/``)."""
    fs, base = _filesystem(root)
    infos = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
    dirs = [i for i in infos if i.type == pafs.FileType.Directory]
    if not dirs:
        return []
    wanted = [_join(d.path, sub) for d in dirs for sub in (IMAGES_DIR, TEXTS_DIR)]
    present = {i.path for i in fs.get_file_info(wanted) if i.type == pafs.FileType.Directory}
    names = {
        d.base_name
        for d in dirs
        if _join(d.path, IMAGES_DIR) in present or _join(d.path, TEXTS_DIR) in present
    }
    return sorted(names)


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


# --------------------------------------------------------------------------------------------
# writing


def _as_matrix(name: str, values: Any) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float32)
    if arr.ndim != 2 or arr.shape[1] < 1:
        raise ValueError(f"{name} must be a 2-D [n, dim] array, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        row = int(np.nonzero(~np.isfinite(arr).all(axis=1))[0][0])
        raise ValueError(f"{name} row {row} has NaN/inf")
    return np.ascontiguousarray(arr)


def _as_ids(name: str, values: Any, n: int) -> pa.Array:
    ids = [str(v) for v in values] if not isinstance(values, pa.Array) else values.to_pylist()
    if len(ids) != n:
        raise ValueError(f"{name} has {len(ids)} entries, expected {n}")
    return pa.array(ids, type=pa.string())


def _embedding_array(matrix: np.ndarray) -> pa.FixedSizeListArray:
    return pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1)), matrix.shape[1])


def _extra_columns(
    extra: dict[str, Any] | None, n: int, reserved: frozenset[str], what: str
) -> dict[str, pa.Array]:
    out: dict[str, pa.Array] = {}
    for name, values in (extra or {}).items():
        if name in reserved:
            raise ValueError(f"{what} column name {name!r} is reserved")
        arr = values if isinstance(values, pa.Array) else pa.array(np.asarray(values))
        if len(arr) != n:
            raise ValueError(f"{what} column {name!r} has {len(arr)} entries, expected {n}")
        out[name] = arr
    return out


def write_split(
    root: str,
    split: str,
    *,
    image_ids: Any,
    image_embeddings: Any,
    caption_ids: Any,
    caption_image_ids: Any,
    texts: Any,
    text_embeddings: Any,
    text_norms: Any | None = None,
    extra_text_columns: dict[str, Any] | None = None,
    extra_image_columns: dict[str, Any] | None = None,
    part: str = "part-00000",
) -> None:
    """Write ``ROOT/split/images/{part}.parquet`` and ``ROOT/split/texts/{part}.parquet``.

    Embeddings are stored as fixed-size ``list<float32>[dim]``; each file is written to a hidden
    temporary name in its folder and then renamed, so a crash never leaves a half-written file
    under the final name. Shapes, finiteness and ``text_norms`` (positive, finite) are checked
    here; unit norm and caption → image references are checked by :func:`read_split` (captions
    may refer to images in another part). If a manifest exists, ``dim`` must match it.
    """
    img = _as_matrix("image_embeddings", image_embeddings)
    txt = _as_matrix("text_embeddings", text_embeddings)
    dim = img.shape[1]
    if txt.shape[1] != dim:
        raise ValueError(f"text_embeddings dim {txt.shape[1]} != image_embeddings dim {dim}")
    n_img, n_txt = img.shape[0], txt.shape[0]
    if "/" in part or part.startswith((".", "_")) or not part:
        raise ValueError(f"invalid part name {part!r}")

    fs, base = _filesystem(root)
    manifest_path = _join(base, MANIFEST_NAME)
    if fs.get_file_info(manifest_path).type == pafs.FileType.File:
        manifest = read_manifest(root)
        if manifest.dim != dim:
            raise ValueError(f"embedding dim {dim} != manifest dim {manifest.dim} ({root})")

    image_cols: dict[str, pa.Array] = {
        "image_id": _as_ids("image_ids", image_ids, n_img),
        "embedding": _embedding_array(img),
    }
    image_cols.update(_extra_columns(extra_image_columns, n_img, _IMAGE_RESERVED, "image"))

    text_cols: dict[str, pa.Array] = {
        "caption_id": _as_ids("caption_ids", caption_ids, n_txt),
        "image_id": _as_ids("caption_image_ids", caption_image_ids, n_txt),
        "text": _as_ids("texts", texts, n_txt),
        "embedding": _embedding_array(txt),
    }
    if text_norms is not None:
        norms = np.asarray(text_norms, dtype=np.float32).reshape(-1)
        if norms.shape[0] != n_txt:
            raise ValueError(f"text_norms has {norms.shape[0]} entries, expected {n_txt}")
        bad = ~(np.isfinite(norms) & (norms > 0))
        if bad.any():
            row = int(np.nonzero(bad)[0][0])
            raise ValueError(f"text_norms row {row} is {norms[row]!r}: must be finite and > 0")
        text_cols["norm"] = pa.array(norms, type=pa.float32())
    text_cols.update(_extra_columns(extra_text_columns, n_txt, _TEXT_RESERVED, "text"))

    for sub, cols in ((IMAGES_DIR, image_cols), (TEXTS_DIR, text_cols)):
        folder = _join(base, split, sub)
        fs.create_dir(folder, recursive=True)
        _atomic_write_table(fs, _join(folder, f"{part}.parquet"), pa.table(cols))


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
    col: pa.ChunkedArray, dim: int, shown: str, id_name: str, ids: pa.Array
) -> np.ndarray:
    """``[n, dim]`` float32 from a list column, chunk by chunk (no int32 offset overflow)."""
    typ = col.type
    if not (
        pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ)
    ):
        raise TableError(f"{shown}: column 'embedding' has type {typ}, expected list<float32>")
    if not (pa.types.is_floating(typ.value_type) or pa.types.is_integer(typ.value_type)):
        raise TableError(f"{shown}: column 'embedding' has type {typ}, expected list<float32>")
    blocks: list[np.ndarray] = []
    start = 0
    for chunk in col.chunks:
        n = len(chunk)
        if n == 0:
            continue
        if chunk.null_count:
            row = start + _first(chunk.is_null().to_numpy(zero_copy_only=False))
            raise _row_error(shown, row, id_name, ids, "embedding is null")
        lengths = pc.list_value_length(chunk).to_numpy(zero_copy_only=False)
        bad = _first(lengths != dim)
        if bad is not None:
            raise _row_error(
                shown,
                start + bad,
                id_name,
                ids,
                f"embedding has length {int(lengths[bad])}, manifest dim is {dim}",
            )
        values = chunk.flatten()
        if values.null_count:
            flat_null = values.is_null().to_numpy(zero_copy_only=False)
            row = start + _first(flat_null) // dim
            raise _row_error(shown, row, id_name, ids, "embedding has null values")
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


def _text_norms(parts: list[_Part], validate: bool) -> np.ndarray | None:
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
                raise _row_error(p.shown, bad, "caption_id", p.ids, msg)
        blocks.append(vals)
    if validate:
        _check_norm_spread(parts, blocks)
    norms = np.concatenate(blocks) if len(blocks) > 1 else blocks[0]
    return norms.astype(np.float32)


def _check_norm_spread(parts: list[_Part], blocks: list[np.ndarray]) -> None:
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
                "caption_id",
                p.ids,
                f"norm is {vals[bad]:.6g}, outside [{low:.3g}, {high:.3g}] (within a factor "
                f"{NORM_SPREAD:g} of the split's median norm {median:.6g}, at most "
                f"{NORM_MAX:g}); such a row would dominate the raw adapter input "
                "(embedding * norm)",
            )


def read_split(
    root: str, split: str, *, validate: bool = True, norm_atol: float = 1e-3
) -> EmbeddingSplit:
    """Read and (by default) validate ``ROOT/split``; raises :class:`TableError` on violations.

    Structural problems (missing files or columns, wrong embedding length, nulls, captions of
    unknown images) always raise; ``validate`` adds NaN/inf, unit-norm (within ``norm_atol``),
    duplicate-id and ``norm``-column checks.
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
        text_norms=_text_norms(txt_parts, validate),
        extra_text_columns=_extra(txt_parts, _TEXT_RESERVED, "caption_id"),
        manifest=manifest,
        extra_image_columns=_extra(img_parts, _IMAGE_RESERVED, "image_id"),
    )


def _stack(blocks: list[np.ndarray], dim: int) -> np.ndarray:
    if not blocks:
        return np.zeros((0, dim), dtype=np.float32)
    return blocks[0] if len(blocks) == 1 else np.concatenate(blocks, axis=0)
