"""Writing one part of a split: :func:`write_split` (see :mod:`asymvlm.tables`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from asymvlm.storage import atomic_write_table as _atomic_write_table
from asymvlm.storage import filesystem as _filesystem
from asymvlm.storage import join as _join
from asymvlm.tables.files import (
    _IMAGE_RESERVED,
    _TEXT_RESERVED,
    IMAGE_PRE,
    IMAGES_DIR,
    MANIFEST_NAME,
    TEXT_PRE,
    TEXTS_DIR,
    read_manifest,
)


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


def _as_norms(name: str, values: Any, n: int) -> pa.Array:
    norms = np.asarray(values, dtype=np.float32).reshape(-1)
    if norms.shape[0] != n:
        raise ValueError(f"{name} has {norms.shape[0]} entries, expected {n}")
    bad = ~(np.isfinite(norms) & (norms > 0))
    if bad.any():
        row = int(np.nonzero(bad)[0][0])
        raise ValueError(f"{name} row {row} is {norms[row]!r}: must be finite and > 0")
    return pa.array(norms, type=pa.float32())


def _embedding_array(matrix: np.ndarray) -> pa.FixedSizeListArray:
    return pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1)), matrix.shape[1])


def _pre_array(
    name: str, values: Any, n: int, modality: str, pre_dim: dict[str, int] | None
) -> pa.FixedSizeListArray:
    """The ``<modality>_features_pre`` column; its width must be the manifest's pre_dim."""
    matrix = _as_matrix(name, values)
    if matrix.shape[0] != n:
        raise ValueError(f"{name} has {matrix.shape[0]} rows, expected {n}")
    if pre_dim is not None:
        if modality not in pre_dim:
            raise ValueError(
                f"{name}: the manifest has no pre_dim.{modality}; record it there before "
                "writing pre-projection columns"
            )
        if matrix.shape[1] != pre_dim[modality]:
            raise ValueError(
                f"{name} has width {matrix.shape[1]}, manifest pre_dim.{modality} is "
                f"{pre_dim[modality]}"
            )
    return _embedding_array(matrix)


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
    image_norms: Any | None = None,
    image_features_pre: Any | None = None,
    text_features_pre: Any | None = None,
    part: str = "part-00000",
) -> None:
    """Write ``ROOT/split/images/{part}.parquet`` and ``ROOT/split/texts/{part}.parquet``.

    Embeddings are stored as fixed-size ``list<float32>[dim]``; each file is written to a hidden
    temporary name in its folder and then renamed, so a crash never leaves a half-written file
    under the final name. Shapes, finiteness and the raw ``text_norms`` / ``image_norms``
    (positive, finite) are checked here; unit norm and caption → image references are checked
    by :func:`~asymvlm.tables.read_split` (captions may refer to images in another part). If a
    manifest exists, ``dim`` must match it, and the widths of ``image_features_pre`` /
    ``text_features_pre`` its ``pre_dim``.
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
    pre_dim = None
    if fs.get_file_info(manifest_path).type == pafs.FileType.File:
        manifest = read_manifest(root)
        if manifest.dim != dim:
            raise ValueError(f"embedding dim {dim} != manifest dim {manifest.dim} ({root})")
        pre_dim = manifest.pre_dim

    image_cols: dict[str, pa.Array] = {
        "image_id": _as_ids("image_ids", image_ids, n_img),
        "embedding": _embedding_array(img),
    }
    if image_norms is not None:
        image_cols["norm"] = _as_norms("image_norms", image_norms, n_img)
    if image_features_pre is not None:
        image_cols[IMAGE_PRE] = _pre_array(
            "image_features_pre", image_features_pre, n_img, "image", pre_dim
        )
    image_cols.update(_extra_columns(extra_image_columns, n_img, _IMAGE_RESERVED, "image"))

    text_cols: dict[str, pa.Array] = {
        "caption_id": _as_ids("caption_ids", caption_ids, n_txt),
        "image_id": _as_ids("caption_image_ids", caption_image_ids, n_txt),
        "text": _as_ids("texts", texts, n_txt),
        "embedding": _embedding_array(txt),
    }
    if text_norms is not None:
        text_cols["norm"] = _as_norms("text_norms", text_norms, n_txt)
    if text_features_pre is not None:
        text_cols[TEXT_PRE] = _pre_array(
            "text_features_pre", text_features_pre, n_txt, "text", pre_dim
        )
    text_cols.update(_extra_columns(extra_text_columns, n_txt, _TEXT_RESERVED, "text"))

    for sub, cols in ((IMAGES_DIR, image_cols), (TEXTS_DIR, text_cols)):
        folder = _join(base, split, sub)
        fs.create_dir(folder, recursive=True)
        _atomic_write_table(fs, _join(folder, f"{part}.parquet"), pa.table(cols))
