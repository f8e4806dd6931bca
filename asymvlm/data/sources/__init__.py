"""Readers: an image-caption data set in its real annotation format -> two pyarrow tables.

Nothing here decodes or even stats image files (a missing or corrupt image is a per-row error of
the embedding stage); only the pixel-in-annotation sets (CIFAR, STL-10) are turned into PNG bytes.
Every path may be local or an fsspec URL (``s3://bucket/key``, ...); :func:`open_fs` (the storage
layer's :func:`asymvlm.storage.fsspec_filesystem`) is the one place that opens them (it honours
``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` for s3).

Contract::

    read_source(dataset, *, annotations, images, split, sample=None, seed=0, id_list=None,
                templates=None) -> SourceData

    SourceData.images     one row per image, sorted by image_id (IMAGE_SCHEMA)
        image_id  string  unique, deterministic
        path      string  nullable; the file to read (local path or URL)
        offset    int64   nullable; with ``length``: byte range of the image inside ``path``
        length    int64   nullable   (WebDataset tar shards; null = the whole file)
        data      binary  nullable; encoded PNG bytes when the set stores pixels inline
        label     int64   nullable; class index (classification sets)
    SourceData.captions   sorted by (image_id, caption_id) (CAPTION_SCHEMA + extra columns)
        caption_id string unique, deterministic; image_id string (always in ``images``);
        text string (whitespace-stripped; empty captions are kept, the pipeline reports them);
        extra columns, e.g. ``level: int64`` for HierarCaps (0 = most general)
    SourceData.prompts    classification sets only, else None (PROMPT_SCHEMA): class_index,
        class_name, template, text -- one row per class x template, in that order
    SourceData.description  JSON-serialisable dict for the manifest: dataset, split,
        annotations, images, format, counts, sample, seed, id_list (+ sampled_ids, classes ...)

Data sets (``READERS``; ``split`` is only a label unless said otherwise):

* ``coco``: official ``captions_{train,val}2017.json``; ``images`` = the image folder.
  image_id = str(image id), caption_id = str(annotation id), path = images/file_name.
* ``coco-karpathy``: ``dataset_coco.json``; ``split`` selects train (= train + restval), restval,
  val or test. image_id = str(cocoid), caption_id = str(sentid),
  path = images/filepath/filename.
* ``flickr30k``: by extension -- Karpathy ``dataset_flickr30k.json`` (split selects as above,
  image_id = file-name stem, caption_id = str(sentid)); ``results.csv`` (``image_name|
  comment_number| comment`` with a header; the Kaggle copy's one line that lacks the second
  ``|`` is accepted) or ``results_20130124.token`` (``NAME.jpg#N<TAB>caption``): all images,
  image_id = stem, caption_id = f"{stem}#{N}".
* ``cc`` (Conceptual Captions): ``*.tsv`` (``caption<TAB>path``, no header, like the GCC TSV
  but naming downloaded files; relative paths are resolved against ``images`` or else the TSV's
  folder), ``*.parquet`` (``caption`` + ``path`` or ``url``, optional ``key``/``image_id``),
  or img2dataset WebDataset shards (``annotations`` = a ``.tar``, a folder of ``*.tar`` or a
  glob): ``KEY.jpg|jpeg|png|webp`` + ``KEY.txt``; path = the shard, offset/length = the
  member's data bytes, image_id = KEY. TSV/parquet rows without a key get image_id =
  sha1(path as written)[:16], stable when rows are dropped or reordered; a path listed twice is
  one image with two captions. caption_id = f"{image_id}-{n}" (n-th caption of that image).
* ``hierarcaps``: ``hierarcaps_test.csv`` (id, captions joined by " => ", image_url); one caption
  per level (``level`` 0..3), image_id = file stem, caption_id = f"{id}-{level}",
  path = images/<last component of image_url> (the URL itself when ``images`` is None).
* ``cifar10`` / ``cifar100``: the python pickle batches (``images`` or ``annotations`` = the
  ``cifar-10-batches-py`` / ``cifar-100-python`` folder or its parent); split train/test;
  image_id = f"cifar10-{split}-{index:05d}"; PNG bytes + label; fine labels for CIFAR-100.
* ``stl10``: ``stl10_binary`` (or its parent); split train/test/unlabeled; labels 0-based.
* ``imagenet``: ``images`` = a folder of class folders (sorted folder names = class index),
  image_id = the path relative to it; optional ``annotations`` maps folder -> class name
  (``LOC_synset_mapping.txt`` / ``words.txt`` lines, first comma-separated name, or JSON
  ``{folder: name}`` / Keras ``{"0": [wnid, name]}``).

Selection (any data set): ``id_list`` (a text file, one image id per line) keeps exactly those
ids (an unknown id is an error naming it); then ``sample=N`` keeps
``ids[numpy.random.default_rng(seed).choice(len(ids), N, replace=False)]`` of the sorted
remaining ids, recorded in ``description["sampled_ids"]`` (sorted). Captions follow their images.

Errors: a malformed annotation file raises :class:`SourceError` (a ``ValueError``) at once,
naming the file and the 1-based line (text formats) or the JSON key path, e.g.
``dataset_coco.json: images[17].sentences[0]: missing 'raw'``.
"""

from __future__ import annotations

import codecs
import csv
import hashlib
import importlib
import io
import json
import os
import pickle
import posixpath
import re
import tarfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from asymvlm.storage import fsspec_filesystem

__all__ = [
    "CAPTION_SCHEMA",
    "DEFAULT_TEMPLATES",
    "IMAGE_SCHEMA",
    "PROMPT_SCHEMA",
    "READERS",
    "SourceData",
    "SourceError",
    "open_fs",
    "read_source",
]

DEFAULT_TEMPLATES: tuple[str, ...] = (
    "a photo of a {}.",
    "a blurry photo of a {}.",
    "a photo of the large {}.",
    "a photo of the small {}.",
    "itap of a {}.",
)

IMAGE_SCHEMA = pa.schema(
    [
        ("image_id", pa.string()),
        ("path", pa.string()),
        ("offset", pa.int64()),
        ("length", pa.int64()),
        ("data", pa.binary()),
        ("label", pa.int64()),
    ]
)
CAPTION_SCHEMA = pa.schema(
    [("caption_id", pa.string()), ("image_id", pa.string()), ("text", pa.string())]
)
PROMPT_SCHEMA = pa.schema(
    [
        ("class_index", pa.int64()),
        ("class_name", pa.string()),
        ("template", pa.string()),
        ("text", pa.string()),
    ]
)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")
WDS_IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")  # preference order inside one sample
KARPATHY_SPLITS = {
    "train": ("train", "restval"),
    "restval": ("restval",),
    "val": ("val",),
    "test": ("test",),
}
HIERARCAPS_LEVELS = 4


class SourceError(ValueError):
    """A malformed annotation file; the message names the file and the line or JSON key path."""


@dataclass
class SourceData:
    """What a reader returns; see the module docstring for the columns."""

    images: pa.Table
    captions: pa.Table
    prompts: pa.Table | None = None
    description: dict[str, Any] = field(default_factory=dict)


# -- file systems ------------------------------------------------------------------------------
open_fs = fsspec_filesystem  # the storage layer's resolver (s3 honours AWS_ENDPOINT_URL)


def _read_bytes(url: str) -> bytes:
    fs, path = open_fs(url)
    with fs.open(path, "rb") as f:
        return f.read()


def _read_text(url: str) -> str:
    raw = _read_bytes(url)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise SourceError(f"{url}: line {line}: not UTF-8 ({e.reason})") from None


def _lines(text: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, line) for the non-blank lines (only \\n ends a line)."""
    for number, line in enumerate(text.split("\n"), 1):
        line = line.rstrip("\r")
        if line.strip():
            yield number, line


def _join(base: str, *parts: str) -> str:
    """``base/part/...`` for local paths and URLs alike (empty parts are skipped)."""
    out = base.rstrip("/")
    for part in parts:
        if part:
            out += "/" + part.strip("/")
    return out


def _parent(url: str) -> str:
    head, _, _ = url.rstrip("/").rpartition("/")
    return head or "."


def _is_absolute(path: str) -> bool:
    return "://" in path or path.startswith("/")


def _stem(name: str) -> str:
    return posixpath.splitext(posixpath.basename(name))[0]


def _with_protocol(fs: fsspec.AbstractFileSystem, path: str, like: str) -> str:
    """A listed path in the form of the URL it came from (plain path stays plain)."""
    return fs.unstrip_protocol(path) if "://" in like else path


def _require(value: str | None, name: str, dataset: str) -> str:
    if value is None:
        raise ValueError(f"{dataset}: needs {name}=")
    return os.fspath(value)


# -- JSON with key-path errors -----------------------------------------------------------------
def _load_json(url: str) -> Any:
    text = _read_text(url)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise SourceError(
            f"{url}: line {e.lineno} column {e.colno}: invalid JSON: {e.msg}"
        ) from None


def _jtype(value: Any) -> str:
    return "null" if value is None else type(value).__name__


class _Json:
    """Typed access to a parsed JSON document; errors name the file and the key path."""

    def __init__(self, url: str):
        self.url = url

    def error(self, where: str, message: str) -> SourceError:
        return SourceError(f"{self.url}: {where}: {message}" if where else f"{self.url}: {message}")

    def get(self, obj: Any, key: str, where: str, types: Any, what: str) -> Any:
        if not isinstance(obj, dict):
            raise self.error(where, f"expected an object, got {_jtype(obj)}")
        if key not in obj:
            raise self.error(where, f"missing {key!r}")
        value = obj[key]
        if not isinstance(value, types) or isinstance(value, bool):
            path = f"{where}.{key}" if where else key
            raise self.error(path, f"expected {what}, got {_jtype(value)}")
        return value

    def string(self, obj: Any, key: str, where: str) -> str:
        return self.get(obj, key, where, str, "a string")

    def ident(self, obj: Any, key: str, where: str) -> str:
        return str(self.get(obj, key, where, (int, str), "an integer or string id"))

    def items(self, obj: Any, key: str, where: str) -> list:
        return self.get(obj, key, where, list, "a list")

    def optional_string(self, obj: Any, key: str, where: str) -> str:
        return self.string(obj, key, where) if key in obj else ""


# -- table builders ----------------------------------------------------------------------------
def _images_table(image_id: Sequence[str], **columns: Any) -> pa.Table:
    n = len(image_id)
    arrays = [pa.array(image_id, pa.string())]
    for f in list(IMAGE_SCHEMA)[1:]:
        values = columns.pop(f.name, None)
        arrays.append(pa.nulls(n, f.type) if values is None else pa.array(values, f.type))
    if columns:
        raise TypeError(f"unknown image columns {sorted(columns)}")
    return pa.Table.from_arrays(arrays, schema=IMAGE_SCHEMA)


def _captions_table(
    caption_id: Sequence[str],
    image_id: Sequence[str],
    text: Sequence[str],
    extra: dict[str, pa.Array] | None = None,
) -> pa.Table:
    table = pa.Table.from_arrays(
        [
            pa.array(caption_id, pa.string()),
            pa.array(image_id, pa.string()),
            pa.array(text, pa.string()),
        ],
        schema=CAPTION_SCHEMA,
    )
    for name, values in (extra or {}).items():
        table = table.append_column(name, values)
    return table


def _prompts_table(names: Sequence[str], templates: Sequence[str]) -> pa.Table:
    rows = [
        (k, name, t, t.format(name.replace("_", " ")))
        for k, name in enumerate(names)
        for t in templates
    ]
    return pa.Table.from_arrays(
        [pa.array([r[i] for r in rows], f.type) for i, f in enumerate(PROMPT_SCHEMA)],
        schema=PROMPT_SCHEMA,
    )


def _empty_captions() -> pa.Table:
    return _captions_table([], [], [])


# -- selection ---------------------------------------------------------------------------------
class _Selector:
    """``id_list`` restriction, then a seeded sample; decided once, on the first id list seen."""

    def __init__(self, sample: int | None, seed: int, id_list: str | None):
        if sample is not None and sample < 0:
            raise ValueError(f"sample must be >= 0, got {sample}")
        self.sample, self.seed, self.id_list = sample, seed, id_list
        self.chosen: pa.Array | None = None  # sorted selected ids

    @property
    def active(self) -> bool:
        return self.sample is not None or self.id_list is not None

    def mask(self, ids: pa.Array | pa.ChunkedArray) -> pa.Array | None:
        """Boolean mask of the selected ``ids``, or None when everything is kept."""
        if not self.active:
            return None
        if self.chosen is None:
            self.chosen = self._resolve(ids)
        return pc.is_in(ids, value_set=self.chosen)

    def _resolve(self, ids: pa.Array | pa.ChunkedArray) -> pa.Array:
        pool = pc.unique(ids)
        if isinstance(pool, pa.ChunkedArray):
            pool = pool.combine_chunks()
        pool = pool.take(pc.sort_indices(pool))
        if self.id_list is not None:
            numbers, wanted = [], []
            for number, line in _lines(_read_text(self.id_list)):
                numbers.append(number)
                wanted.append(line.strip())
            known = pc.is_in(pa.array(wanted, pa.string()), value_set=pool).to_numpy(
                zero_copy_only=False
            )
            if not known.all():
                k = int(np.flatnonzero(~known)[0])
                raise SourceError(
                    f"{self.id_list}: line {numbers[k]}: unknown id {wanted[k]!r} "
                    f"(not among the {len(pool)} ids of the data set)"
                )
            pool = pa.array(sorted(set(wanted)), pa.string())
        if self.sample is not None:
            if self.sample > len(pool):
                raise SourceError(f"sample={self.sample} but only {len(pool)} ids are available")
            picked = np.random.default_rng(self.seed).choice(
                len(pool), size=self.sample, replace=False
            )
            pool = pool.take(pa.array(np.sort(picked)))
        return pool


@dataclass(frozen=True)
class _Request:
    dataset: str
    annotations: str | None
    images: str | None
    split: str
    templates: tuple[str, ...]
    select: _Selector

    def need(self, name: str) -> str:
        return _require(getattr(self, name), name, self.dataset)

    def root(self) -> str:
        """The data folder of a pixel set: ``images``, else ``annotations``."""
        value = self.images if self.images is not None else self.annotations
        return _require(value, "images", self.dataset)

    def selected(self, ids: Sequence[str]) -> np.ndarray:
        """Indices of ``ids`` that survive the selection (to skip work on the others)."""
        mask = self.select.mask(pa.array(ids, pa.string()))
        if mask is None:
            return np.arange(len(ids))
        return np.flatnonzero(mask.to_numpy(zero_copy_only=False))


def _karpathy_wanted(req: _Request) -> tuple[str, ...]:
    try:
        return KARPATHY_SPLITS[req.split]
    except KeyError:
        raise ValueError(
            f"{req.dataset}: split must be one of {sorted(KARPATHY_SPLITS)}, got {req.split!r}"
        ) from None


# -- COCO --------------------------------------------------------------------------------------
def _read_coco(req: _Request) -> SourceData:
    ann, folder = req.need("annotations"), req.need("images")
    j = _Json(ann)
    doc = _load_json(ann)
    where_of: dict[str, str] = {}
    ids, paths = [], []
    for i, item in enumerate(j.items(doc, "images", "")):
        where = f"images[{i}]"
        image_id, name = j.ident(item, "id", where), j.string(item, "file_name", where)
        if image_id in where_of:
            raise j.error(where, f"duplicate image id {image_id} (also {where_of[image_id]})")
        where_of[image_id] = where
        ids.append(image_id)
        paths.append(_join(folder, name))
    caption_ids, caption_images, texts = [], [], []
    seen: dict[str, str] = {}
    for k, item in enumerate(j.items(doc, "annotations", "")):
        where = f"annotations[{k}]"
        caption_id = j.ident(item, "id", where)
        image_id = j.ident(item, "image_id", where)
        text = j.string(item, "caption", where)
        if caption_id in seen:
            raise j.error(where, f"duplicate annotation id {caption_id} (also {seen[caption_id]})")
        if image_id not in where_of:
            raise j.error(where, f"image_id {image_id} is not in 'images'")
        seen[caption_id] = where
        caption_ids.append(caption_id)
        caption_images.append(image_id)
        texts.append(text.strip())
    return SourceData(
        _images_table(ids, path=paths),
        _captions_table(caption_ids, caption_images, texts),
        description={"format": "coco-captions-json"},
    )


# -- Karpathy splits (COCO, Flickr30k) ---------------------------------------------------------
def _read_karpathy(req: _Request, image_key: Callable[[_Json, dict, str], str]) -> SourceData:
    ann, folder = req.need("annotations"), req.need("images")
    wanted = _karpathy_wanted(req)
    j = _Json(ann)
    doc = _load_json(ann)
    where_of: dict[str, str] = {}
    caption_where: dict[str, str] = {}
    ids, paths, caption_ids, caption_images, texts = [], [], [], [], []
    for i, item in enumerate(j.items(doc, "images", "")):
        where = f"images[{i}]"
        split = j.string(item, "split", where)
        name = j.string(item, "filename", where)
        subdir = j.optional_string(item, "filepath", where)
        image_id = image_key(j, item, where)
        sentences = j.items(item, "sentences", where)
        parsed = []
        for s, sentence in enumerate(sentences):
            at = f"{where}.sentences[{s}]"
            parsed.append((j.ident(sentence, "sentid", at), j.string(sentence, "raw", at), at))
        if image_id in where_of:
            raise j.error(where, f"duplicate image id {image_id} (also {where_of[image_id]})")
        where_of[image_id] = where
        for caption_id, _, at in parsed:
            if caption_id in caption_where:
                raise j.error(
                    at, f"duplicate sentid {caption_id} (also {caption_where[caption_id]})"
                )
            caption_where[caption_id] = at
        if split not in wanted:
            continue
        ids.append(image_id)
        paths.append(_join(folder, subdir, name))
        for caption_id, raw, _ in parsed:
            caption_ids.append(caption_id)
            caption_images.append(image_id)
            texts.append(raw.strip())
    return SourceData(
        _images_table(ids, path=paths),
        _captions_table(caption_ids, caption_images, texts),
        description={"format": "karpathy-json", "karpathy_splits": list(wanted)},
    )


def _read_coco_karpathy(req: _Request) -> SourceData:
    return _read_karpathy(req, lambda j, item, where: j.ident(item, "cocoid", where))


def _flickr_karpathy(req: _Request) -> SourceData:
    return _read_karpathy(req, lambda j, item, where: _stem(j.string(item, "filename", where)))


# -- Flickr30k caption files -------------------------------------------------------------------
_MERGED_NUMBER = re.compile(r"\s*(\d+)\s+(\S.*)$")  # "| 4   A dog ..." (missing second '|')


def _flickr_rows(
    req: _Request, rows: Iterator[tuple[int, str, str, str]], ann: str, fmt: str
) -> SourceData:
    """Flickr30k caption rows ``(line, image file name, caption number, text)`` -> tables."""
    folder = req.need("images")
    images: dict[str, str] = {}
    line_of: dict[str, int] = {}
    caption_ids, caption_images, texts = [], [], []
    for number, name, index, text in rows:
        if not name:
            raise SourceError(f"{ann}: line {number}: empty image name")
        if not index.isdigit():
            raise SourceError(f"{ann}: line {number}: caption number {index!r} is not an integer")
        image_id = _stem(name)
        path = _join(folder, name)
        if images.setdefault(image_id, path) != path:
            raise SourceError(f"{ann}: line {number}: {name!r} and {images[image_id]!r} share id")
        caption_id = f"{image_id}#{int(index)}"
        if caption_id in line_of:
            raise SourceError(
                f"{ann}: line {number}: duplicate caption {caption_id} "
                f"(also line {line_of[caption_id]})"
            )
        line_of[caption_id] = number
        caption_ids.append(caption_id)
        caption_images.append(image_id)
        texts.append(text.strip())
    ids = sorted(images)
    return SourceData(
        _images_table(ids, path=[images[i] for i in ids]),
        _captions_table(caption_ids, caption_images, texts),
        description={"format": fmt},
    )


def _flickr_results_csv(req: _Request) -> SourceData:
    ann = req.need("annotations")

    def rows() -> Iterator[tuple[int, str, str, str]]:
        for k, (number, line) in enumerate(_lines(_read_text(ann))):
            parts = line.split("|", 2)
            if k == 0 and parts[0].strip().lower() == "image_name":
                continue
            if len(parts) == 2 and (m := _MERGED_NUMBER.match(parts[1])):
                parts = [parts[0], m.group(1), m.group(2)]
            if len(parts) != 3:
                raise SourceError(
                    f"{ann}: line {number}: expected 'image_name| comment_number| comment', "
                    f"got {line[:80]!r}"
                )
            yield number, parts[0].strip(), parts[1].strip(), parts[2]

    return _flickr_rows(req, rows(), ann, "flickr30k-results-csv")


def _flickr_token(req: _Request) -> SourceData:
    ann = req.need("annotations")

    def rows() -> Iterator[tuple[int, str, str, str]]:
        for number, line in _lines(_read_text(ann)):
            key, tab, text = line.partition("\t")
            name, hash_, index = key.strip().rpartition("#")
            if not tab or not hash_:
                raise SourceError(
                    f"{ann}: line {number}: expected 'NAME.jpg#N<TAB>caption', got {line[:80]!r}"
                )
            yield number, name, index, text

    return _flickr_rows(req, rows(), ann, "flickr30k-token")


def _by_extension(url: str, table: dict[str, Callable], default: Callable | None = None):
    lower = url.lower().rstrip("/")
    for ext, fn in table.items():
        if lower.endswith(ext):
            return fn
    if default is None:
        raise SourceError(f"{url}: cannot tell the format (expected one of {sorted(table)})")
    return default


_FLICKR_FORMATS = {".json": _flickr_karpathy, ".csv": _flickr_results_csv, ".token": _flickr_token}


def _read_flickr30k(req: _Request) -> SourceData:
    return _by_extension(req.need("annotations"), _FLICKR_FORMATS)(req)


# -- Conceptual Captions -----------------------------------------------------------------------
def _path_id(path: str) -> str:
    return hashlib.sha1(path.encode("utf-8")).hexdigest()[:16]


def _cc_rows(
    req: _Request, ann: str, rows: Iterator[tuple[str, str, str, str | None]], fmt: str
) -> SourceData:
    """Rows ``(where, caption, path as written, key or None)`` -> tables (see module doc)."""
    base = req.images if req.images is not None else _parent(ann)
    image_path: dict[str, str] = {}
    n_captions: dict[str, int] = {}
    caption_ids, caption_images, texts = [], [], []
    for where, caption, path, key in rows:
        if not path:
            raise SourceError(f"{ann}: {where}: empty path")
        image_id = key if key is not None else _path_id(path)
        resolved = path if _is_absolute(path) else _join(base, path)
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
        _images_table(ids, path=[image_path[i] for i in ids]),
        _captions_table(caption_ids, caption_images, texts),
        description={"format": fmt},
    )


def _cc_tsv(req: _Request) -> SourceData:
    ann = req.need("annotations")

    def rows() -> Iterator[tuple[str, str, str, None]]:
        for number, line in _lines(_read_text(ann)):
            parts = line.split("\t")
            if len(parts) != 2:
                raise SourceError(
                    f"{ann}: line {number}: expected 'caption<TAB>path', got {len(parts)} fields"
                )
            yield f"line {number}", parts[0], parts[1].strip(), None

    return _cc_rows(req, ann, rows(), "cc-tsv")


def _cc_parquet(req: _Request) -> SourceData:
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


def _cc_webdataset(req: _Request) -> SourceData:
    ann = req.need("annotations")
    fs, shards = _list_shards(ann)
    shard_of: dict[str, str] = {}
    ids, paths, offsets, lengths, texts = [], [], [], [], []
    for path in shards:
        shard = _with_protocol(fs, path, ann)
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
        _images_table(ids, path=paths, offset=offsets, length=lengths),
        _captions_table([f"{k}-0" for k in ids], ids, texts),
        description={"format": "cc-webdataset", "shards": len(shards)},
    )


_CC_FORMATS = {".tsv": _cc_tsv, ".parquet": _cc_parquet}


def _read_cc(req: _Request) -> SourceData:
    return _by_extension(req.need("annotations"), _CC_FORMATS, default=_cc_webdataset)(req)


# -- HierarCaps --------------------------------------------------------------------------------
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


def _read_hierarcaps(req: _Request) -> SourceData:
    ann = req.need("annotations")
    records = _csv_records(ann, _read_text(ann))
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
        image_id = _stem(name)
        images.setdefault(image_id, _join(req.images, name) if req.images is not None else url)
        for level, text in enumerate(parts):
            caption_ids.append(f"{row_id}-{level}")
            caption_images.append(image_id)
            texts.append(text)
            levels.append(level)
    ids = sorted(images)
    return SourceData(
        _images_table(ids, path=[images[i] for i in ids]),
        _captions_table(
            caption_ids, caption_images, texts, {"level": pa.array(levels, pa.int64())}
        ),
        description={"format": "hierarcaps-csv", "levels": HIERARCAPS_LEVELS},
    )


# -- classification sets with inline pixels ----------------------------------------------------
def _numpy_global(module: str, name: str) -> Any:
    for prefix in ("numpy._core.", "numpy.core."):
        try:
            return getattr(importlib.import_module(prefix + module), name)
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"numpy has no {module}.{name}")


_NUMPY_PICKLE_NAMES = {"multiarray": ("_reconstruct", "scalar"), "numeric": ("_frombuffer",)}


class _SafeUnpickler(pickle.Unpickler):
    """Unpickles plain containers and numpy arrays only (no arbitrary code from a data file)."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "numpy" and name in ("ndarray", "dtype"):
            return getattr(np, name)
        if (module, name) == ("_codecs", "encode"):  # bytes in protocol-2 pickles from Python 3
            return codecs.encode
        package, _, sub = module.rpartition(".")
        if package in ("numpy.core", "numpy._core") and name in _NUMPY_PICKLE_NAMES.get(sub, ()):
            return _numpy_global(sub, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def _unpickle(url: str) -> dict:
    try:
        obj = _SafeUnpickler(io.BytesIO(_read_bytes(url)), encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as e:
        raise SourceError(f"{url}: not a CIFAR pickle ({e})") from None
    if not isinstance(obj, dict):
        raise SourceError(f"{url}: expected a pickled dict, got {type(obj).__name__}")
    return obj


def _pickled(obj: dict, key: str, url: str) -> Any:
    for k in (key.encode(), key):
        if k in obj:
            return obj[k]
    raise SourceError(f"{url}: missing key b{key!r}")


def _names(values: Any, where: str) -> list[str]:
    if not isinstance(values, list | tuple) or not values:
        raise SourceError(f"{where}: expected a non-empty list of class names")
    names = []
    for k, v in enumerate(values):
        try:
            names.append(v.decode("utf-8") if isinstance(v, bytes) else str(v))
        except UnicodeDecodeError as e:
            raise SourceError(f"{where}[{k}]: class name is not UTF-8 ({e.reason})") from None
    return names


def _png(hwc: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(hwc)).save(buffer, format="PNG")
    return buffer.getvalue()


def _pixel_set(
    req: _Request,
    name: str,
    pixels: np.ndarray,
    labels: np.ndarray | None,
    classes: list[str],
    to_hwc: Callable[[np.ndarray], np.ndarray],
    description: dict[str, Any],
) -> SourceData:
    """Images stored inline -> PNG rows (only for the selected ids) + prompts."""
    ids = [f"{name}-{req.split}-{i:05d}" for i in range(len(pixels))]
    keep = req.selected(ids)
    return SourceData(
        _images_table(
            [ids[i] for i in keep],
            data=[_png(to_hwc(pixels[i])) for i in keep],
            label=None if labels is None else labels[keep].tolist(),
        ),
        _empty_captions(),
        _prompts_table(classes, req.templates),
        description={**description, "classes": classes, "templates": list(req.templates)},
    )


def _find_root(base: str, marker: str, folder: str) -> str:
    """``base`` if it holds ``marker``, else ``base/folder`` (the archive's top folder)."""
    fs, path = open_fs(base)
    if fs.exists(_join(path, marker)):
        return base
    return _join(base, folder)


@dataclass(frozen=True)
class _Cifar:
    name: str
    folder: str
    meta: str
    names_key: str
    labels_key: str
    files: dict[str, tuple[str, ...]]


_CIFAR10 = _Cifar(
    "cifar10",
    "cifar-10-batches-py",
    "batches.meta",
    "label_names",
    "labels",
    {"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)},
)
_CIFAR100 = _Cifar(
    "cifar100",
    "cifar-100-python",
    "meta",
    "fine_label_names",
    "fine_labels",
    {"train": ("train",), "test": ("test",)},
)


def _read_cifar(req: _Request, layout: _Cifar) -> SourceData:
    if req.split not in layout.files:
        raise ValueError(f"{req.dataset}: split must be one of {sorted(layout.files)}")
    root = _find_root(req.root(), layout.meta, layout.folder)
    meta = _join(root, layout.meta)
    classes = _names(
        _pickled(_unpickle(meta), layout.names_key, meta), f"{meta}: {layout.names_key}"
    )
    blocks, labels = [], []
    for name in layout.files[req.split]:
        url = _join(root, name)
        batch = _unpickle(url)
        data = np.asarray(_pickled(batch, "data", url))
        if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
            raise SourceError(
                f"{url}: b'data': expected a uint8 array of shape (N, 3072), "
                f"got {data.dtype} {data.shape}"
            )
        y = np.asarray(_pickled(batch, layout.labels_key, url), dtype=np.int64).reshape(-1)
        if len(y) != len(data):
            raise SourceError(f"{url}: {len(y)} labels for {len(data)} images")
        bad = np.flatnonzero((y < 0) | (y >= len(classes)))
        if len(bad):
            raise SourceError(
                f"{url}: {layout.labels_key}[{bad[0]}] = {y[bad[0]]} outside 0..{len(classes) - 1}"
            )
        blocks.append(data)
        labels.append(y)
    return _pixel_set(
        req,
        layout.name,
        np.concatenate(blocks),
        np.concatenate(labels),
        classes,
        lambda row: row.reshape(3, 32, 32).transpose(1, 2, 0),
        {"format": "cifar-python-pickle", "root": root},
    )


def _read_cifar10(req: _Request) -> SourceData:
    return _read_cifar(req, _CIFAR10)


def _read_cifar100(req: _Request) -> SourceData:
    return _read_cifar(req, _CIFAR100)


STL10_SIDE = 96
_STL10_BYTES = 3 * STL10_SIDE * STL10_SIDE


def _read_stl10(req: _Request) -> SourceData:
    splits = ("train", "test", "unlabeled")
    if req.split not in splits:
        raise ValueError(f"stl10: split must be one of {splits}, got {req.split!r}")
    root = _find_root(req.root(), "class_names.txt", "stl10_binary")
    names_url = _join(root, "class_names.txt")
    classes = [line.strip() for _, line in _lines(_read_text(names_url))]
    x_url = _join(root, f"{req.split}_X.bin")
    raw = _read_bytes(x_url)
    if len(raw) % _STL10_BYTES:
        raise SourceError(f"{x_url}: {len(raw)} bytes is not a multiple of {_STL10_BYTES}")
    pixels = np.frombuffer(raw, np.uint8).reshape(-1, 3, STL10_SIDE, STL10_SIDE)
    labels = None
    if req.split != "unlabeled":
        y_url = _join(root, f"{req.split}_y.bin")
        y = np.frombuffer(_read_bytes(y_url), np.uint8).astype(np.int64)
        if len(y) != len(pixels):
            raise SourceError(f"{y_url}: {len(y)} labels for {len(pixels)} images in {x_url}")
        bad = np.flatnonzero((y < 1) | (y > len(classes)))
        if len(bad):
            raise SourceError(
                f"{y_url}: byte {bad[0]}: label {y[bad[0]]} outside 1..{len(classes)}"
            )
        labels = y - 1
    # each image is stored column-major, one channel after another: (C, W, H) in C order
    return _pixel_set(
        req,
        "stl10",
        pixels,
        labels,
        classes,
        lambda img: img.transpose(2, 1, 0),
        {"format": "stl10-binary", "root": root},
    )


# -- ImageNet-style class folders --------------------------------------------------------------
def _class_mapping(url: str) -> dict[str, str]:
    """Folder name -> human class name, from a text or JSON mapping file."""
    if url.lower().endswith(".json"):
        doc = _load_json(url)
        if not isinstance(doc, dict):
            raise SourceError(f"{url}: expected an object, got {_jtype(doc)}")
        mapping = {}
        for key, value in doc.items():
            if isinstance(value, str):
                mapping[key] = value
            elif (
                isinstance(value, list)
                and len(value) == 2
                and all(isinstance(v, str) for v in value)
            ):
                mapping[value[0]] = value[1]  # Keras imagenet_class_index.json
            else:
                raise SourceError(f"{url}: {key}: expected a name or [folder, name], got {value!r}")
        return mapping
    mapping = {}
    for number, line in _lines(_read_text(url)):
        sep = "\t" if "\t" in line else None
        parts = line.strip().split(sep, 1)
        if len(parts) != 2 or not parts[1].strip():
            raise SourceError(f"{url}: line {number}: expected 'folder name', got {line[:80]!r}")
        mapping[parts[0].strip()] = parts[1].split(",")[0].strip()
    return mapping


def _read_imagenet(req: _Request) -> SourceData:
    root_url = req.need("images")
    fs, root = open_fs(root_url)
    root = root.rstrip("/")
    folders = sorted(
        posixpath.basename(e["name"].rstrip("/"))
        for e in fs.ls(root, detail=True)
        if e["type"] == "directory"
    )
    folders = [f for f in folders if not f.startswith(".")]
    if not folders:
        raise SourceError(f"{root_url}: no class folders")
    index = {f: k for k, f in enumerate(folders)}
    ids, paths, labels = [], [], []
    for found in sorted(fs.find(root)):
        rel = found[len(root) + 1 :]
        folder, _, rest = rel.partition("/")
        if folder in index and rest and rel.lower().endswith(IMAGE_EXTENSIONS):
            ids.append(rel)
            paths.append(_join(root_url, rel))
            labels.append(index[folder])
    names = folders
    if req.annotations is not None:
        mapping = _class_mapping(req.annotations)
        missing = [f for f in folders if f not in mapping]
        if missing:
            raise SourceError(f"{req.annotations}: no class name for folder {missing[0]!r}")
        names = [mapping[f] for f in folders]
    return SourceData(
        _images_table(ids, path=paths, label=labels),
        _empty_captions(),
        _prompts_table(names, req.templates),
        description={
            "format": "image-folders",
            "folders": folders,
            "classes": names,
            "templates": list(req.templates),
        },
    )


READERS: dict[str, Callable[[_Request], SourceData]] = {
    "coco": _read_coco,
    "coco-karpathy": _read_coco_karpathy,
    "flickr30k": _read_flickr30k,
    "cc": _read_cc,
    "hierarcaps": _read_hierarcaps,
    "cifar10": _read_cifar10,
    "cifar100": _read_cifar100,
    "stl10": _read_stl10,
    "imagenet": _read_imagenet,
}


# -- entry point -------------------------------------------------------------------------------
def _check_unique(table: pa.Table, column: str, dataset: str) -> None:
    values = table[column]
    if len(pc.unique(values)) == len(values):
        return
    counts = pc.value_counts(values)
    dup = counts.filter(pc.greater(counts.field("counts"), 1)).field("values")[0]
    raise SourceError(f"{dataset}: duplicate {column} {dup.as_py()!r}")


def read_source(
    dataset: str,
    *,
    annotations: str | None,
    images: str | None,
    split: str,
    sample: int | None = None,
    seed: int = 0,
    id_list: str | None = None,
    templates: Sequence[str] | None = None,
) -> SourceData:
    """Read one split of ``dataset`` (a key of :data:`READERS`); see the module docstring."""
    try:
        reader = READERS[dataset]
    except KeyError:
        raise ValueError(f"unknown data set {dataset!r}; known: {sorted(READERS)}") from None
    templates = DEFAULT_TEMPLATES if templates is None else tuple(templates)
    bad = [t for t in templates if t.count("{}") != 1]
    if not templates or bad:
        raise ValueError(f"templates must each hold one '{{}}', got {list(templates)}")
    annotations = None if annotations is None else os.fspath(annotations)
    images = None if images is None else os.fspath(images)
    id_list = None if id_list is None else os.fspath(id_list)
    selector = _Selector(sample, seed, id_list)
    out = reader(_Request(dataset, annotations, images, split, templates, selector))

    image_table, caption_table = out.images, out.captions
    _check_unique(image_table, "image_id", dataset)
    _check_unique(caption_table, "caption_id", dataset)
    known = pc.is_in(caption_table["image_id"], value_set=image_table["image_id"])
    if caption_table.num_rows and not pc.all(known).as_py():
        orphan = caption_table.filter(pc.invert(known))["image_id"][0].as_py()
        raise SourceError(f"{dataset}: a caption refers to unknown image {orphan!r}")
    mask = selector.mask(image_table["image_id"])
    if mask is not None:
        image_table = image_table.filter(mask)
        caption_table = caption_table.filter(
            pc.is_in(caption_table["image_id"], value_set=image_table["image_id"])
        )
    image_table = image_table.sort_by("image_id").combine_chunks()
    caption_table = caption_table.sort_by(
        [("image_id", "ascending"), ("caption_id", "ascending")]
    ).combine_chunks()
    counts = {"images": image_table.num_rows, "captions": caption_table.num_rows}
    if out.prompts is not None:
        counts["prompts"] = out.prompts.num_rows
    description = {
        "dataset": dataset,
        "split": split,
        "annotations": annotations,
        "images": images,
        **out.description,
        "counts": counts,
        "sample": sample,
        "seed": seed,
        "id_list": id_list,
    }
    if sample is not None:
        description["sampled_ids"] = selector.chosen.to_pylist()
    return SourceData(image_table, caption_table, out.prompts, description)
