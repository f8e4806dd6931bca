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

Every folder may hold several parquet files; they are read in file-name order. Stored embeddings
are unit-norm; the optional ``norm`` columns keep the raw norm of the CLIP projection (texts and
images), so that ``embedding * norm`` recovers the unnormalised projection that AsymVLM's adapters
(texts) and the official ProbVLM/PFE protocol (images) take as input.

The optional pre-projection columns hold the frozen encoder's pooled output before its final
linear projection (CLIP: the ``vision_model`` / ``text_model`` pooler output), written by
``asymvlm embed --pre-projection``; ``projection.npz`` holds those projections, so that
``embedding * norm == projection @ features_pre`` row by row. BayesVLM's Laplace posterior over
the projection layers is fitted on them (:mod:`asymvlm.methods.bayesvlm`).

Validation is vectorised (numpy / pyarrow compute); Python only loops to format the message of the
first bad row, which always names the parquet file, the 0-based row index within it and the id.
:func:`read_split` refuses (:class:`TableError`):

* a split whose ``images`` or ``texts`` folder has parquet files but **no rows**;
* string columns (ids, ``text``, extra string columns) that are not valid UTF-8 (file, row,
  column);
* parts that disagree: a column present in one file of a folder but not in another, or a column
  (``embedding``, ``norm``, pre-projection, extra columns) with another type -- the message names
  both files;
* pre-projection rows whose length is not the manifest's ``pre_dim`` (or a manifest without it),
  null rows or values, and (``validate=True``) NaN/inf values, like ``embedding``;
* (``validate=True``) a raw ``norm`` (texts or images) that is not finite and > 0, or that lies
  outside ``[median / NORM_SPREAD, median * NORM_SPREAD]`` of the split's median norm, or above
  ``NORM_MAX``. Real CLIP/SigLIP text projections have norms of order 1-100 (CLIP ViT-B/32: about
  5-15) and vary by well under 10x within a data set; the adapters take ``embedding * norm`` as
  input, so one corrupt row (say ``1e30``) would overflow float32 or dominate any scale fitted
  to the inputs. ``NORM_SPREAD = 1e4`` leaves four orders of magnitude to legitimate data, and
  ``NORM_MAX = 1e6`` keeps squared norms summed over 10^8 rows finite in float32.

Files are read and written through :mod:`asymvlm.storage` (local paths and object-store URIs,
atomic writes, :class:`~asymvlm.storage.OutputLock` for one writer at a time). The package:
:mod:`.files` (names, manifest, parts, projection), :mod:`.write` (:func:`write_split`,
:func:`write_split_pieces`), :mod:`.split` (:class:`EmbeddingSplit`), :mod:`.read`
(:func:`read_split`) and :mod:`.columns` (the reader's column helpers).

Memory: :func:`read_split` copies each ``list<float>`` column once, batch by batch, into one
preallocated float32 matrix per folder, and checks it block by block, so reading a split costs
about its float32 matrices (plus one batch); the captions stay in Arrow memory
(:class:`~asymvlm.tables.columns.StringColumn`).
"""

from __future__ import annotations

from asymvlm.tables.columns import StringColumn
from asymvlm.tables.files import (  # noqa: F401 - the names every stage uses
    IMAGE_COLUMNS,
    IMAGE_PRE,
    IMAGES_DIR,
    MANIFEST_NAME,
    NORM_MAX,
    NORM_SPREAD,
    PRE_COLUMNS,
    PROJECTION_NAME,
    TEXT_COLUMNS,
    TEXT_PRE,
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
    "EmbeddingSplit",
    "Location",
    "LocationField",
    "Manifest",
    "StringColumn",
    "TableError",
    "list_splits",
    "parse_location",
    "read_manifest",
    "read_projection",
    "read_split",
    "write_manifest",
    "write_projection",
    "write_split",
    "write_split_pieces",
]
