"""The embedding-table contract shared by every pipeline stage.

Layout under a root (a local path, a ``file://`` URI, ``s3://bucket/prefix`` or any URI that
:func:`pyarrow.fs.FileSystem.from_uri` understands)::

    ROOT/manifest.json                   {"dim": int, "model": str, optional "pre_dim":
                                          {"image": int, "text": int}, ...extra keys}
    ROOT/projection.npz                  optional: image [dim, pre_dim.image],
                                         text [dim, pre_dim.text] (float32)
    ROOT/<split>/images/*.parquet        image_id: string, embedding: list<float32>[dim],
                                         optional norm: float32,
                                         optional image_features_pre: list<float32>[pre_dim.image],
                                         optional extra columns (e.g. label: int)
    ROOT/<split>/texts/*.parquet         caption_id, image_id, text: string,
                                         embedding: list<float32>[dim], optional norm: float32,
                                         optional text_features_pre: list<float32>[pre_dim.text],
                                         optional extra columns (e.g. level: int)

Every folder may hold several parquet files, read in file-name order. Embeddings are unit-norm;
``embedding * norm`` is the unnormalised projection (the adapters' raw input), and
``embedding * norm == projection @ features_pre`` row by row. :func:`read_split` names the
file, row and id of the first violation (:class:`TableError`).
"""

from __future__ import annotations

from asymvlm.tables.files import (
    IMAGES_DIR,
    MANIFEST_NAME,
    PRE_COLUMNS,
    TEXTS_DIR,
    Manifest,
    TableError,
    column_matrix,
    list_parquet,
    list_splits,
    read_manifest,
    read_parts,
    read_projection,
    write_manifest,
    write_part,
    write_projection,
)
from asymvlm.tables.location import Location, LocationField, parse_location
from asymvlm.tables.read import read_split
from asymvlm.tables.split import EmbeddingSplit
from asymvlm.tables.write import write_split, write_split_pieces

__all__ = [
    "IMAGES_DIR",
    "MANIFEST_NAME",
    "PRE_COLUMNS",
    "TEXTS_DIR",
    "EmbeddingSplit",
    "Location",
    "LocationField",
    "Manifest",
    "TableError",
    "column_matrix",
    "list_parquet",
    "list_splits",
    "parse_location",
    "read_manifest",
    "read_parts",
    "read_projection",
    "read_split",
    "write_manifest",
    "write_part",
    "write_projection",
    "write_split",
    "write_split_pieces",
]
