"""Writing one part of a split: every id and caption given and a table's columns of one length
(refused here, naming them); :func:`~asymvlm.tables.read_split` checks the values."""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import ExitStack
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from asymvlm.storage import atomic_path, uri_join
from asymvlm.tables.files import IMAGE_PRE, IMAGES_DIR, TEXT_PRE, TEXTS_DIR, TableError


def _matrix(values: Any) -> pa.FixedSizeListArray:
    matrix = np.ascontiguousarray(values, dtype=np.float32)
    if matrix.ndim != 2:
        raise ValueError(f"expected a 2-D [n, width] matrix, got shape {matrix.shape}")
    return pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1)), matrix.shape[1])


def _strings(name: str, values: Any) -> pa.Array:
    """``values`` as strings (numbers written out); a missing one (None, NaN, pandas' NA) is
    refused, naming its row, rather than written as the text 'None' or 'nan'."""
    try:
        array = pa.array(values, from_pandas=True)  # missing values: nulls
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # mixed types: each one's own text
        array = pa.array([str(v) for v in values], pa.string())
    if array.null_count:
        row = array.is_null().to_numpy(zero_copy_only=False).argmax()
        raise TableError(f"write_split: {name} row {row} is missing (None, NaN or NA)")
    return array if pa.types.is_string(array.type) else array.cast(pa.string())


def _one_length(kind: str, columns: dict[str, Any]) -> None:
    """Refuse the columns of one table (``kind``: image or caption) when their lengths differ."""
    lengths = {name: len(values) for name, values in columns.items() if values is not None}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{name} {n}" for name, n in lengths.items())
        raise TableError(f"write_split: one row per {kind} in every {kind} column, got {listed}")


def _table(
    columns: dict[str, pa.Array], norms: Any, pre: str, features: Any, extra: dict[str, Any] | None
) -> pa.Table:
    """``columns`` with the ``norm``, pre-projection and extra columns given (None: none)."""
    reserved = {*columns, "norm", pre}
    if norms is not None:
        columns["norm"] = pa.array(np.asarray(norms, dtype=np.float32).reshape(-1))
    if features is not None:
        columns[pre] = _matrix(features)
    for name, values in (extra or {}).items():
        if name in reserved:
            raise ValueError(f"column name {name!r} is reserved")
        columns[name] = values if isinstance(values, pa.Array) else pa.array(np.asarray(values))
    return pa.table(columns)


def _tables(
    *,
    image_ids: Any,
    image_embeddings: Any,
    caption_ids: Any,
    caption_image_ids: Any,
    texts: Any,
    text_embeddings: Any,
    text_norms: Any = None,
    image_norms: Any = None,
    image_features_pre: Any = None,
    text_features_pre: Any = None,
    extra_text_columns: dict[str, Any] | None = None,
    extra_image_columns: dict[str, Any] | None = None,
) -> tuple[pa.Table, pa.Table]:
    """The images and texts tables of a piece."""
    image_columns = dict(
        image_ids=image_ids,
        image_embeddings=image_embeddings,
        image_norms=image_norms,
        image_features_pre=image_features_pre,
    )
    _one_length("image", image_columns | (extra_image_columns or {}))
    caption_columns = dict(
        caption_ids=caption_ids,
        caption_image_ids=caption_image_ids,
        texts=texts,
        text_embeddings=text_embeddings,
        text_norms=text_norms,
        text_features_pre=text_features_pre,
    )
    _one_length("caption", caption_columns | (extra_text_columns or {}))
    images = {"image_id": _strings("image_ids", image_ids), "embedding": _matrix(image_embeddings)}
    captions = {
        "caption_id": _strings("caption_ids", caption_ids),
        "image_id": _strings("caption_image_ids", caption_image_ids),
        "text": _strings("texts", texts),
        "embedding": _matrix(text_embeddings),
    }
    return (
        _table(images, image_norms, IMAGE_PRE, image_features_pre, extra_image_columns),
        _table(captions, text_norms, TEXT_PRE, text_features_pre, extra_text_columns),
    )


def write_split(root: str, split: str, *, part: str = "part-00000", **columns: Any) -> None:
    """Write ``ROOT/split/{images,texts}/{part}.parquet`` atomically from ``columns``: ids,
    texts, embeddings and optional norms, pre-projection features and extra columns."""
    write_split_pieces(root, split, [columns], part=part)


def write_split_pieces(
    root: str, split: str, pieces: Iterable[dict[str, Any]], *, part: str = "part-00000"
) -> int:
    """Write one part of a split from ``pieces`` (:func:`write_split`'s arguments), a row group
    each; both files appear after the last. Returns the number of pieces."""
    if not part or "/" in part or part.startswith((".", "_")):
        raise ValueError(f"invalid part name {part!r}")
    uris = [uri_join(root, split, sub, f"{part}.parquet") for sub in (IMAGES_DIR, TEXTS_DIR)]
    writers: list[pq.ParquetWriter] = []
    count = 0
    with ExitStack() as stack:
        for piece in pieces:
            both = _tables(**piece)
            if not writers:
                for uri, table in zip(uris, both, strict=True):
                    fs, tmp = stack.enter_context(atomic_path(uri))
                    writer = pq.ParquetWriter(tmp, table.schema, filesystem=fs)
                    writers.append(stack.enter_context(writer))
            for writer, table in zip(writers, both, strict=True):
                writer.write_table(table)
            count += 1
        if not writers:
            raise ValueError(f"part {part!r} of split {split!r} has no pieces")
    return count
