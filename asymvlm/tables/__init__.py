"""The embedding-table contract every stage shares (docs/data.md, "Embedding tables")."""

from __future__ import annotations

from asymvlm.tables.files import (
    IMAGES_DIR,
    MANIFEST_NAME,
    PRE_COLUMNS,
    TEXTS_DIR,
    Manifest,
    TableError,
    check_split,
    column_matrix,
    fingerprint,
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
    "fingerprint",
    "list_parquet",
    "check_split",
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
