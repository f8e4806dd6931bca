"""Conceptual Captions (``cc``) readers: TSV, parquet and img2dataset WebDataset shards.

* ``cc`` (Conceptual Captions): ``*.tsv`` (``caption<TAB>path``, no header, like the GCC TSV
  but naming downloaded files; relative paths are resolved against ``images`` or else the TSV's
  folder), ``*.parquet`` (``caption`` + ``path`` or ``url``, optional ``key``/``image_id``),
  or img2dataset WebDataset shards (``annotations`` = a ``.tar``, a folder of ``*.tar`` or a
  glob): ``KEY.jpg|jpeg|png|webp`` + ``KEY.txt``; path = the shard, offset/length = the
  member's data bytes, image_id = KEY. TSV/parquet rows without a key get image_id =
  sha1(path as written)[:16], stable when rows are dropped or reordered; a path listed twice is
  one image with two captions. caption_id = f"{image_id}-{n}" (n-th caption of that image).
"""

from __future__ import annotations

import hashlib
import posixpath
import tarfile
from collections.abc import Iterator

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from .common import (
    Request,
    SourceData,
    SourceError,
    by_extension,
    captions_table,
    images_table,
    is_absolute,
    join_url,
    numbered_lines,
    open_fs,
    parent_url,
    read_text,
    with_protocol,
)

WDS_IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")  # preference order inside one sample


def _path_id(path: str) -> str:
    return hashlib.sha1(path.encode("utf-8")).hexdigest()[:16]


def _cc_rows(
    req: Request, ann: str, rows: Iterator[tuple[str, str, str, str | None]], fmt: str
) -> SourceData:
    """Rows ``(where, caption, path as written, key or None)`` -> tables (see module doc)."""
    base = req.images if req.images is not None else parent_url(ann)
    image_path: dict[str, str] = {}
    n_captions: dict[str, int] = {}
    caption_ids, caption_images, texts = [], [], []
    for where, caption, path, key in rows:
        if not path:
            raise SourceError(f"{ann}: {where}: empty path")
        image_id = key if key is not None else _path_id(path)
        resolved = path if is_absolute(path) else join_url(base, path)
        if image_path.setdefault(image_id, resolved) != resolved:
            raise SourceError(
                f"{ann}: {where}: image id {image_id!r} names both {resolved!r} "
                f"and {image_path[image_id]!r}"
            )
        n = n_captions.get(image_id, 0)
        n_captions[image_id] = n + 1
        caption_ids.append(f"{image_id}-{n}")
        caption_images.append(image_id)
        texts.append(caption.strip())
    ids = list(image_path)
    return SourceData(
        images_table(ids, path=[image_path[i] for i in ids]),
        captions_table(caption_ids, caption_images, texts),
        description={"format": fmt},
    )


def _cc_tsv(req: Request) -> SourceData:
    ann = req.need("annotations")

    def rows() -> Iterator[tuple[str, str, str, None]]:
        for number, line in numbered_lines(read_text(ann)):
            parts = line.split("\t")
            if len(parts) != 2:
                raise SourceError(
                    f"{ann}: line {number}: expected 'caption<TAB>path', got {len(parts)} fields"
                )
            yield f"line {number}", parts[0], parts[1].strip(), None

    return _cc_rows(req, ann, rows(), "cc-tsv")


def _cc_parquet(req: Request) -> SourceData:
    ann = req.need("annotations")
    fs, path = open_fs(ann)
    with fs.open(path, "rb") as f:
        names = pq.ParquetFile(f).schema_arrow.names
        location = next((c for c in ("path", "url") if c in names), None)
        key = next((c for c in ("key", "image_id") if c in names), None)
        if "caption" not in names or location is None:
            raise SourceError(f"{ann}: needs columns 'caption' and 'path' (or 'url'), has {names}")
        columns = ["caption", location] + ([key] if key else [])
        table = pq.read_table(f, columns=columns)
    captions = _utf8_column(table, "caption", ann)
    locations = _utf8_column(table, location, ann)
    keys = _utf8_column(table, key, ann) if key else [None] * len(captions)

    def rows() -> Iterator[tuple[str, str, str, str | None]]:
        for r, (caption, loc, k) in enumerate(zip(captions, locations, keys, strict=True)):
            if loc is None:
                raise SourceError(f"{ann}: row {r}: null {location!r}")
            if key and not k:
                raise SourceError(f"{ann}: row {r}: empty {key!r}")
            yield f"row {r}", caption or "", loc.strip(), k

    return _cc_rows(req, ann, rows(), "cc-parquet")


def _utf8_column(table: pa.Table, name: str, url: str) -> list[str | None]:
    """A parquet column as Python strings; invalid UTF-8 (parquet does not check it) is a
    :class:`SourceError` naming the file, row and column."""
    try:
        col = table[name].cast(pa.string())
    except pa.ArrowInvalid as e:
        raise SourceError(f"{url}: column {name!r} is not a string column ({e})") from None
    row = 0
    for chunk in col.chunks:
        try:
            chunk.validate(full=True)
        except pa.ArrowInvalid:
            for k, value in enumerate(chunk.cast(pa.binary()).to_pylist()):
                try:
                    (value or b"").decode("utf-8")
                except UnicodeDecodeError as e:
                    raise SourceError(
                        f"{url}: row {row + k}: column {name!r} is not UTF-8 ({e.reason})"
                    ) from None
        row += len(chunk)
    return col.to_pylist()


def _list_shards(url: str) -> tuple[fsspec.AbstractFileSystem, list[str]]:
    fs, path = open_fs(url)
    if fsspec.core.has_magic(path):
        found = fs.glob(path)
    elif fs.isdir(path):
        found = fs.glob(path.rstrip("/") + "/*.tar")
    else:
        found = [path]
    shards = sorted(p for p in found if p.lower().endswith(".tar"))
    if not shards:
        raise SourceError(f"{url}: no .tar shards found")
    return fs, shards


def _scan_shard(fs: fsspec.AbstractFileSystem, path: str, shard: str) -> dict[str, list]:
    """``{key: [image (ext, offset, size) or None, caption or None]}`` of one tar shard."""
    samples: dict[str, list] = {}
    try:
        with fs.open(path, "rb") as f, tarfile.open(fileobj=f, mode="r:") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                folder, base = posixpath.split(member.name)
                if base.startswith("."):
                    continue
                stem, _, ext = base.partition(".")
                key = posixpath.join(folder, stem) if folder else stem
                ext = ext.lower()
                sample = samples.setdefault(key, [None, None])
                if ext in WDS_IMAGE_EXTENSIONS:
                    current = sample[0]
                    rank = WDS_IMAGE_EXTENSIONS.index(ext)
                    if current is None or rank < WDS_IMAGE_EXTENSIONS.index(current[0]):
                        sample[0] = (ext, member.offset_data, member.size)
                elif ext == "txt":
                    raw = tar.extractfile(member).read()
                    try:
                        sample[1] = raw.decode("utf-8")
                    except UnicodeDecodeError:
                        raise SourceError(f"{shard}: {member.name}: caption is not UTF-8") from None
    except tarfile.TarError as e:
        raise SourceError(f"{shard}: not a readable uncompressed tar ({e})") from None
    return samples


def _cc_webdataset(req: Request) -> SourceData:
    ann = req.need("annotations")
    fs, shards = _list_shards(ann)
    shard_of: dict[str, str] = {}
    ids, paths, offsets, lengths, texts = [], [], [], [], []
    for path in shards:
        shard = with_protocol(fs, path, ann)
        for key, (image, caption) in _scan_shard(fs, path, shard).items():
            if image is None and caption is None:
                continue  # e.g. only KEY.json
            if image is None:
                raise SourceError(f"{shard}: sample {key!r} has a caption but no image member")
            if key in shard_of:
                raise SourceError(f"{shard}: sample key {key!r} also in {shard_of[key]}")
            shard_of[key] = shard
            ids.append(key)
            paths.append(shard)
            offsets.append(image[1])
            lengths.append(image[2])
            texts.append((caption or "").strip())
    return SourceData(
        images_table(ids, path=paths, offset=offsets, length=lengths),
        captions_table([f"{k}-0" for k in ids], ids, texts),
        description={"format": "cc-webdataset", "shards": len(shards)},
    )


_CC_FORMATS = {".tsv": _cc_tsv, ".parquet": _cc_parquet}


def read_cc(req: Request) -> SourceData:
    return by_extension(req.need("annotations"), _CC_FORMATS, default=_cc_webdataset)(req)
