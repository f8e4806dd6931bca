"""Image-caption readers: COCO, COCO-Karpathy, Flickr30k, Conceptual Captions, HierarCaps.

* ``coco``: ``captions_{train,val}2017.json``; image_id = image id, caption_id = annotation id.
* ``coco-karpathy``: ``dataset_coco.json``; ``split`` train (= train + restval), restval, val or
  test; image_id = cocoid, caption_id = sentid, path = images/filepath/filename.
* ``flickr30k``: Karpathy ``dataset_flickr30k.json`` (image_id = file stem, caption_id = sentid),
  ``results.csv`` (``image_name| comment_number| comment``) or ``results_20130124.token``
  (``NAME.jpg#N<TAB>caption``): image_id = stem, caption_id = f"{stem}#{N}".
* ``cc``: ``*.tsv`` (``caption<TAB>path``, no header; relative paths against ``images``, else the
  TSV's folder), ``*.parquet`` (``caption`` + ``path`` or ``url``, optional ``key``/``image_id``)
  or img2dataset WebDataset shards (a ``.tar``, a folder of them or a glob: ``KEY.jpg|jpeg|png|
  webp`` + ``KEY.txt``; path = the shard, offset/length = the member's bytes, image_id = KEY).
  Without a key, image_id = sha1(path as written)[:16]; caption_id = f"{image_id}-{n}".
* ``hierarcaps``: ``hierarcaps_test.csv`` (id, captions joined by " => ", image_url): one caption
  per level (``level`` 0..3), image_id = file stem, caption_id = f"{id}-{level}", path =
  images/<last component of image_url> (the URL itself without ``images``).
"""

from __future__ import annotations

import hashlib
import io
import posixpath
import re
import tarfile
from collections import Counter
from collections.abc import Iterable

import fsspec
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, StrictStr, TypeAdapter

from asymvlm import storage

from .common import (
    Ident,
    Request,
    SourceData,
    SourceError,
    captions_table,
    first_duplicate,
    images_table,
    join_url,
    numbered_lines,
    parse_json,
    read_text,
    stem,
)

KARPATHY_SPLITS = {
    "train": ("train", "restval"),
    "restval": ("restval",),
    "val": ("val",),
    "test": ("test",),
}
HIERARCAPS_LEVELS = 4
WDS_IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")  # preference order inside one sample


# -- COCO and Karpathy JSON --------------------------------------------------------------------
class _CocoImage(BaseModel):
    id: Ident
    file_name: StrictStr


class _CocoCaption(BaseModel):
    id: Ident
    image_id: Ident
    caption: StrictStr


class _Coco(BaseModel):
    images: list[_CocoImage]
    annotations: list[_CocoCaption]


class _Sentence(BaseModel):
    sentid: Ident
    raw: StrictStr


class _KarpathyImage(BaseModel):
    split: StrictStr
    filename: StrictStr
    filepath: StrictStr = ""
    sentences: list[_Sentence]
    cocoid: Ident | None = None


class _Karpathy(BaseModel):
    images: list[_KarpathyImage]


def read_coco(req: Request) -> SourceData:
    ann, folder = req.need("annotations"), req.need("images")
    doc = parse_json(ann, TypeAdapter(_Coco))
    ids, caps = [im.id for im in doc.images], doc.annotations
    first_duplicate(ann, ids, [f"images[{i}]" for i in range(len(ids))], "image id")
    where = [f"annotations[{k}]" for k in range(len(caps))]
    first_duplicate(ann, [c.id for c in caps], where, "annotation id")
    known = set(ids)
    for c, at in zip(caps, where, strict=True):
        if c.image_id not in known:
            raise SourceError(f"{ann}: {at}: image_id {c.image_id} is not in 'images'")
    return SourceData(
        images_table(ids, path=[join_url(folder, im.file_name) for im in doc.images]),
        captions_table(
            [c.id for c in caps], [c.image_id for c in caps], [c.caption.strip() for c in caps]
        ),
        description={"format": "coco-captions-json"},
    )


def _read_karpathy(req: Request, coco: bool) -> SourceData:
    ann, folder = req.need("annotations"), req.need("images")
    if req.split not in KARPATHY_SPLITS:
        raise ValueError(f"{req.dataset}: split must be one of {sorted(KARPATHY_SPLITS)}")
    wanted = KARPATHY_SPLITS[req.split]
    images = parse_json(ann, TypeAdapter(_Karpathy)).images
    for i, im in enumerate(images):
        if coco and im.cocoid is None:
            raise SourceError(f"{ann}: images[{i}]: missing 'cocoid'")
    ids = [im.cocoid if coco else stem(im.filename) for im in images]
    first_duplicate(ann, ids, [f"images[{i}]" for i in range(len(ids))], "image id")
    sentences = [
        (s.sentid, f"images[{i}].sentences[{k}]")
        for i, im in enumerate(images)
        for k, s in enumerate(im.sentences)
    ]
    first_duplicate(ann, *zip(*sentences, strict=True), "sentid")
    keep = [(i, im) for i, im in zip(ids, images, strict=True) if im.split in wanted]
    caps = [(s.sentid, i, s.raw.strip()) for i, im in keep for s in im.sentences]
    return SourceData(
        images_table(
            [i for i, _ in keep],
            path=[join_url(folder, im.filepath, im.filename) for _, im in keep],
        ),
        captions_table(*zip(*caps, strict=True)) if caps else captions_table([], [], []),
        description={"format": "karpathy-json", "karpathy_splits": list(wanted)},
    )


def read_coco_karpathy(req: Request) -> SourceData:
    return _read_karpathy(req, coco=True)


# -- Flickr30k caption files -------------------------------------------------------------------
_MERGED_NUMBER = re.compile(r"\s*(\d+)\s+(\S.*)$")  # "| 4   A dog ..." (missing second '|')


def _flickr_line(ann: str, number: int, line: str, token: bool) -> tuple[str, str, str] | None:
    """(image file name, caption number, text) of one line, None for the csv's header."""
    if token:
        key, tab, text = line.partition("\t")
        name, hash_, index = key.strip().rpartition("#")
        if tab and hash_:
            return name, index, text
        raise SourceError(
            f"{ann}: line {number}: expected 'NAME.jpg#N<TAB>caption', got {line[:80]!r}"
        )
    parts = [p.strip() for p in line.split("|", 2)]
    if parts[0].lower() == "image_name":
        return None
    if len(parts) == 2 and (m := _MERGED_NUMBER.match(parts[1])):
        parts = [parts[0], m.group(1), m.group(2)]
    if len(parts) != 3:
        raise SourceError(
            f"{ann}: line {number}: expected 'image_name| comment_number| comment', "
            f"got {line[:80]!r}"
        )
    return parts[0], parts[1], parts[2]


def read_flickr30k(req: Request) -> SourceData:
    ann, folder = req.need("annotations"), req.need("images")
    fmt = posixpath.splitext(ann.lower().rstrip("/"))[1]
    if fmt == ".json":
        return _read_karpathy(req, coco=False)
    if fmt not in (".csv", ".token"):
        raise SourceError(f"{ann}: cannot tell the format (expected .json, .csv or .token)")
    images: dict[str, str] = {}
    line_of: dict[str, int] = {}
    for number, line in numbered_lines(ann):
        row = _flickr_line(ann, number, line, token=fmt == ".token")
        if row is None:
            continue
        name, index, text = row
        if not name or not index.isdigit():
            raise SourceError(f"{ann}: line {number}: bad image name or caption number {index!r}")
        image_id = stem(name)
        if images.setdefault(image_id, join_url(folder, name)) != join_url(folder, name):
            raise SourceError(f"{ann}: line {number}: {name!r} and {images[image_id]!r} share id")
        caption_id = f"{image_id}#{int(index)}"
        if caption_id in line_of:
            raise SourceError(
                f"{ann}: line {number}: duplicate caption {caption_id} "
                f"(also line {line_of[caption_id][0]})"
            )
        line_of[caption_id] = (number, image_id, text.strip())
    caps = list(line_of.items())
    return SourceData(
        images_table(sorted(images), path=[images[i] for i in sorted(images)]),
        captions_table([c for c, _ in caps], [r[1] for _, r in caps], [r[2] for _, r in caps]),
        description={"format": "flickr30k-" + ("token" if fmt == ".token" else "results-csv")},
    )


# -- Conceptual Captions -----------------------------------------------------------------------
def _cc_pairs(req: Request, ann: str, rows: Iterable[tuple[str, str, str, str | None]], fmt: str):
    """Rows ``(where, caption, path as written, key or None)`` -> tables (see module doc)."""
    base = req.images if req.images is not None else posixpath.dirname(ann.rstrip("/")) or "."
    image_path: dict[str, str] = {}
    seen: Counter[str] = Counter()
    caption_ids, caption_images, texts = [], [], []
    for where, caption, path, key in rows:
        if not path:
            raise SourceError(f"{ann}: {where}: empty path")
        image_id = key if key is not None else hashlib.sha1(path.encode()).hexdigest()[:16]
        resolved = path if "://" in path or path.startswith("/") else join_url(base, path)
        if image_path.setdefault(image_id, resolved) != resolved:
            raise SourceError(
                f"{ann}: {where}: image id {image_id!r} names both {resolved!r} "
                f"and {image_path[image_id]!r}"
            )
        caption_ids.append(f"{image_id}-{seen[image_id]}")
        seen[image_id] += 1
        caption_images.append(image_id)
        texts.append(caption.strip())
    return SourceData(
        images_table(list(image_path), path=list(image_path.values())),
        captions_table(caption_ids, caption_images, texts),
        description={"format": fmt},
    )


def _strings(table: pa.Table, name: str, url: str) -> list[str | None]:
    """A parquet column as Python strings (parquet does not check UTF-8: named by row)."""
    try:
        raw = table[name].cast(pa.string()).cast(pa.binary()).to_pylist()
    except pa.ArrowException as e:
        raise SourceError(f"{url}: column {name!r} is not a string column ({e})") from None
    out = []
    for row, value in enumerate(raw):
        try:
            out.append(None if value is None else value.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise SourceError(
                f"{url}: row {row}: column {name!r} is not UTF-8 ({e.reason})"
            ) from None
    return out


def _cc_parquet(req: Request, ann: str) -> SourceData:
    fs, path = storage.fsspec_filesystem(ann)
    with fs.open(path, "rb") as f:
        table = pq.read_table(f)
    names = table.column_names
    location = next((c for c in ("path", "url") if c in names), None)
    key = next((c for c in ("key", "image_id") if c in names), None)
    if "caption" not in names or location is None:
        raise SourceError(f"{ann}: needs columns 'caption' and 'path' (or 'url'), has {names}")
    captions, locations = _strings(table, "caption", ann), _strings(table, location, ann)
    keys = _strings(table, key, ann) if key else [None] * len(captions)
    for r, (loc, k) in enumerate(zip(locations, keys, strict=True)):
        if loc is None or (key and not k):
            raise SourceError(f"{ann}: row {r}: empty {location!r} or {key!r}")
    rows = zip([f"row {r}" for r in range(len(captions))], captions, locations, keys, strict=True)
    return _cc_pairs(req, ann, ((w, c or "", p.strip(), k) for w, c, p, k in rows), "cc-parquet")


def _scan_shard(fs: fsspec.AbstractFileSystem, path: str, shard: str) -> dict[str, list]:
    """``{key: [image (ext, offset, size) or None, caption or None]}`` of one tar shard."""
    samples: dict[str, list] = {}
    rank = WDS_IMAGE_EXTENSIONS.index
    try:
        with fs.open(path, "rb") as f, tarfile.open(fileobj=f, mode="r:") as tar:
            for member in tar:
                folder, base = posixpath.split(member.name)
                if not member.isfile() or base.startswith("."):
                    continue
                name, _, ext = base.partition(".")
                sample = samples.setdefault(posixpath.join(folder, name), [None, None])
                ext = ext.lower()
                if ext in WDS_IMAGE_EXTENSIONS:
                    if sample[0] is None or rank(ext) < rank(sample[0][0]):
                        sample[0] = (ext, member.offset_data, member.size)
                elif ext == "txt":
                    try:
                        sample[1] = tar.extractfile(member).read().decode("utf-8")
                    except UnicodeDecodeError:
                        raise SourceError(f"{shard}: {member.name}: caption is not UTF-8") from None
    except tarfile.TarError as e:
        raise SourceError(f"{shard}: not a readable uncompressed tar ({e})") from None
    return samples


def _cc_webdataset(req: Request, ann: str) -> SourceData:
    fs, path = storage.fsspec_filesystem(ann)
    if not fsspec.core.has_magic(path):
        path = path.rstrip("/") + "/*.tar" if fs.isdir(path) else path
    shards = sorted(p for p in fs.glob(path) if p.lower().endswith(".tar"))
    if not shards:
        raise SourceError(f"{ann}: no .tar shards found")
    shard_of: dict[str, str] = {}
    ids, paths, offsets, lengths, texts = [], [], [], [], []
    for path in shards:
        shard = fs.unstrip_protocol(path) if "://" in ann else path
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


def read_cc(req: Request) -> SourceData:
    ann = req.need("annotations")
    if ann.lower().endswith(".parquet"):
        return _cc_parquet(req, ann)
    if not ann.lower().endswith(".tsv"):
        return _cc_webdataset(req, ann)
    rows = []
    for number, line in numbered_lines(ann):
        parts = line.split("\t")
        if len(parts) != 2:
            raise SourceError(
                f"{ann}: line {number}: expected 'caption<TAB>path', got {len(parts)} fields"
            )
        rows.append((f"line {number}", parts[0], parts[1].strip(), None))
    return _cc_pairs(req, ann, rows, "cc-tsv")


# -- HierarCaps --------------------------------------------------------------------------------
def read_csv(url: str, columns: tuple[str, ...]) -> pd.DataFrame:
    """A CSV with (at least) ``columns``, every cell a string; row k of the frame is data row
    k + 1 of the file (errors name the file and row)."""
    try:
        frame = pd.read_csv(io.StringIO(read_text(url)), dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise SourceError(f"{url}: malformed CSV ({' '.join(str(e).split())})") from None
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise SourceError(f"{url}: no column(s) {missing} (has {list(frame.columns)})")
    return frame.fillna("")


def read_hierarcaps(req: Request) -> SourceData:
    ann = req.need("annotations")
    frame = read_csv(ann, ("id", "captions", "image_url"))
    images: dict[str, str] = {}
    row_of: dict[str, int] = {}
    caption_ids, caption_images, texts, levels = [], [], [], []
    for row, (row_id, captions, url) in enumerate(frame[["id", "captions", "image_url"]].values, 1):
        row_id, url = row_id.strip(), url.strip()
        parts = [p.strip() for p in captions.split("=>")]
        name = url.rstrip("/").rpartition("/")[2]
        if not row_id or not name:
            raise SourceError(f"{ann}: row {row}: empty id or image_url")
        if row_id in row_of:
            raise SourceError(
                f"{ann}: row {row}: duplicate id {row_id} (also row {row_of[row_id]})"
            )
        if len(parts) != HIERARCAPS_LEVELS:
            raise SourceError(
                f"{ann}: row {row}: expected {HIERARCAPS_LEVELS} levels joined by ' => ', "
                f"got {len(parts)}"
            )
        row_of[row_id] = row
        images.setdefault(stem(name), join_url(req.images, name) if req.images else url)
        caption_ids += [f"{row_id}-{level}" for level in range(HIERARCAPS_LEVELS)]
        caption_images += [stem(name)] * HIERARCAPS_LEVELS
        texts += parts
        levels += range(HIERARCAPS_LEVELS)
    return SourceData(
        images_table(list(images), path=list(images.values())),
        captions_table(caption_ids, caption_images, texts, level=pa.array(levels, pa.int64())),
        description={"format": "hierarcaps-csv", "levels": HIERARCAPS_LEVELS},
    )
