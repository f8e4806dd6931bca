"""Writing one part of a split: :func:`write_split` (see :mod:`asymvlm.tables`), and
:func:`write_split_pieces`, which writes a part given as consecutive pieces, one row group
each, holding one piece in memory at a time."""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import ExitStack
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from asymvlm.storage import atomic_path, filesystem, join, uri_join
from asymvlm.tables.files import (
    IMAGE_PRE,
    IMAGE_RESERVED,
    IMAGES_DIR,
    MANIFEST_NAME,
    TEXT_PRE,
    TEXT_RESERVED,
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


def _check_part_name(part: str) -> None:
    if "/" in part or part.startswith((".", "_")) or not part:
        raise ValueError(f"invalid part name {part!r}")


def _manifest_pre_dim(fs: pafs.FileSystem, base: str, root: str, dim: int) -> dict | None:
    """The manifest's ``pre_dim`` (None without a manifest); ``dim`` must be the manifest's."""
    if fs.get_file_info(join(base, MANIFEST_NAME)).type != pafs.FileType.File:
        return None
    manifest = read_manifest(root)
    if manifest.dim != dim:
        raise ValueError(f"embedding dim {dim} != manifest dim {manifest.dim} ({root})")
    return manifest.pre_dim


def _matrices(
    image_embeddings: Any, text_embeddings: Any, dim: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Both embedding matrices as checked float32 (``dim``: the width they must have)."""
    img = _as_matrix("image_embeddings", image_embeddings)
    txt = _as_matrix("text_embeddings", text_embeddings)
    if dim is not None and img.shape[1] != dim:
        raise ValueError(f"image_embeddings dim {img.shape[1]} != {dim} of the first piece")
    if txt.shape[1] != img.shape[1]:
        raise ValueError(
            f"text_embeddings dim {txt.shape[1]} != image_embeddings dim {img.shape[1]}"
        )
    return img, txt


def _split_tables(
    img: np.ndarray,
    txt: np.ndarray,
    *,
    image_ids: Any,
    caption_ids: Any,
    caption_image_ids: Any,
    texts: Any,
    text_norms: Any | None = None,
    extra_text_columns: dict[str, Any] | None = None,
    extra_image_columns: dict[str, Any] | None = None,
    image_norms: Any | None = None,
    image_features_pre: Any | None = None,
    text_features_pre: Any | None = None,
    pre_dim: dict | None = None,
) -> tuple[pa.Table, pa.Table]:
    """The images and texts tables of a part from its checked matrices (:func:`_matrices`)
    and the other columns (checked as :func:`write_split` documents)."""
    n_img, n_txt = img.shape[0], txt.shape[0]

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
    image_cols.update(_extra_columns(extra_image_columns, n_img, IMAGE_RESERVED, "image"))

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
    text_cols.update(_extra_columns(extra_text_columns, n_txt, TEXT_RESERVED, "text"))
    return pa.table(image_cols), pa.table(text_cols)


def write_split(root: str, split: str, *, part: str = "part-00000", **columns: Any) -> None:
    """Write ``ROOT/split/images/{part}.parquet`` and ``ROOT/split/texts/{part}.parquet``
    atomically from ``columns`` (``image_ids``, ``image_embeddings``, ``caption_ids``,
    ``caption_image_ids``, ``texts``, ``text_embeddings``, optional ``text_norms``,
    ``image_norms``, ``image_features_pre``, ``text_features_pre``, ``extra_text_columns``,
    ``extra_image_columns``). Shapes, finiteness, positive norms and the manifest's ``dim`` /
    ``pre_dim`` are checked here; unit norm and references by :func:`read_split`."""
    write_split_pieces(root, split, [columns], part=part)


def write_split_pieces(
    root: str, split: str, pieces: Iterable[dict[str, Any]], *, part: str = "part-00000"
) -> int:
    """Write one part of a split given as consecutive ``pieces`` -- each the keyword arguments
    of :func:`write_split` for a run of images and their captions -- one row group per piece,
    holding one piece in memory at a time. Returns the number of pieces.

    The files read back as :func:`write_split` of the pieces joined would write them; they
    are written to hidden temporary names and renamed only after the last piece (a failure
    leaves no part behind). Every piece must have the first one's columns and types.
    """
    _check_part_name(part)
    fs, base = filesystem(root)
    uris = [uri_join(root, split, sub, f"{part}.parquet") for sub in (IMAGES_DIR, TEXTS_DIR)]
    writers: list[pq.ParquetWriter] = []
    pre_dim: dict | None = None
    dim: int | None = None
    count = 0
    with ExitStack() as stack:
        for piece in pieces:
            rest = dict(piece)
            img, txt = _matrices(rest.pop("image_embeddings"), rest.pop("text_embeddings"), dim)
            if dim is None:
                dim = img.shape[1]
                pre_dim = _manifest_pre_dim(fs, base, root, dim)
            tables_ = _split_tables(img, txt, **rest, pre_dim=pre_dim)
            del img, txt, rest
            if not writers:
                for uri, table in zip(uris, tables_, strict=True):
                    out_fs, tmp = stack.enter_context(atomic_path(uri))
                    writer = pq.ParquetWriter(tmp, table.schema, filesystem=out_fs)
                    writers.append(stack.enter_context(writer))
            for writer, table in zip(writers, tables_, strict=True):
                if table.schema != writer.schema:
                    diff = sorted(set(map(str, table.schema)) ^ set(map(str, writer.schema)))
                    raise ValueError(
                        f"piece {count} of part {part!r}: its columns differ from the first "
                        f"piece's ({'; '.join(diff)})"
                    )
                writer.write_table(table)
            count += 1
        if not writers:
            raise ValueError(f"part {part!r} of split {split!r} has no pieces")
    return count
