"""HierarCaps reader: one caption per level of a four-level caption hierarchy.

* ``hierarcaps``: ``hierarcaps_test.csv`` (id, captions joined by " => ", image_url); one caption
  per level (``level`` 0..3), image_id = file stem, caption_id = f"{id}-{level}",
  path = images/<last component of image_url> (the URL itself when ``images`` is None).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator

import pyarrow as pa

from .common import (
    Request,
    SourceData,
    SourceError,
    captions_table,
    images_table,
    join_url,
    read_text,
    stem,
)

HIERARCAPS_LEVELS = 4


def _csv_records(url: str, text: str) -> Iterator[tuple[int, list[str]]]:
    """``(1-based line where the record starts, fields)`` of a CSV text; a malformed record
    (e.g. a field over :func:`csv.field_size_limit`, usually an unbalanced quote) is a
    :class:`SourceError` naming the file and that line instead of a bare ``csv.Error``."""
    reader = csv.reader(io.StringIO(text, newline=""))
    start = 1
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            hint = ""
            if "field limit" in str(e):
                hint = (
                    f": a field longer than {csv.field_size_limit()} characters, usually a quote "
                    f"opened on line {start} that is never closed (error found on line "
                    f"{reader.line_num})"
                )
            raise SourceError(f"{url}: line {start}: malformed CSV ({e}){hint}") from None
        yield start, row
        start = reader.line_num + 1


def read_hierarcaps(req: Request) -> SourceData:
    ann = req.need("annotations")
    records = _csv_records(ann, read_text(ann))
    _, header = next(records, (1, None))
    columns = ("id", "captions", "image_url")
    if header is None or any(c not in header for c in columns):
        raise SourceError(f"{ann}: line 1: expected a header with columns {columns}, got {header}")
    col = {c: header.index(c) for c in columns}
    images: dict[str, str] = {}
    line_of: dict[str, int] = {}
    caption_ids, caption_images, texts, levels = [], [], [], []
    for number, row in records:
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise SourceError(f"{ann}: line {number}: {len(row)} fields, header has {len(header)}")
        row_id, url = row[col["id"]].strip(), row[col["image_url"]].strip()
        parts = [p.strip() for p in row[col["captions"]].split("=>")]
        if not row_id:
            raise SourceError(f"{ann}: line {number}: empty id")
        if row_id in line_of:
            raise SourceError(
                f"{ann}: line {number}: duplicate id {row_id} (also line {line_of[row_id]})"
            )
        if len(parts) != HIERARCAPS_LEVELS:
            raise SourceError(
                f"{ann}: line {number}: expected {HIERARCAPS_LEVELS} levels joined by ' => ', "
                f"got {len(parts)}"
            )
        name = url.rstrip("/").rpartition("/")[2]
        if not name:
            raise SourceError(f"{ann}: line {number}: empty image_url")
        line_of[row_id] = number
        image_id = stem(name)
        images.setdefault(image_id, join_url(req.images, name) if req.images is not None else url)
        for level, text in enumerate(parts):
            caption_ids.append(f"{row_id}-{level}")
            caption_images.append(image_id)
            texts.append(text)
            levels.append(level)
    ids = sorted(images)
    return SourceData(
        images_table(ids, path=[images[i] for i in ids]),
        captions_table(caption_ids, caption_images, texts, {"level": pa.array(levels, pa.int64())}),
        description={"format": "hierarcaps-csv", "levels": HIERARCAPS_LEVELS},
    )
