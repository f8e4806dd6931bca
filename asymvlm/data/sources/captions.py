"""Readers: COCO, COCO-Karpathy, Flickr30k, Conceptual Captions, HierarCaps (docs/data.md)."""

from __future__ import annotations

import hashlib
import io
import posixpath
import tarfile
from collections import Counter
from typing import TYPE_CHECKING

import fsspec
import pyarrow as pa
from pydantic import BaseModel, StrictStr, TypeAdapter

from asymvlm import storage

if TYPE_CHECKING:
    import pandas as pd

from .reading import (
    Ident,
    Request,
    SourceData,
    SourceError,
    captions_table,
    images_table,
    join_url,
    numbered_lines,
    parse_json,
    read_text,
    stem,
)

KARPATHY_SPLITS = {"train": ("train", "restval"), "restval": ("restval",), "val": ("val",)}
KARPATHY_SPLITS["test"] = ("test",)
HIERARCAPS_LEVELS = 4
WDS_IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")  # preference order inside one sample


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
    known = {im.id for im in doc.images}
    for k, c in enumerate(doc.annotations):
        if c.image_id not in known:
            raise SourceError(f"{ann}: annotations[{k}]: image_id {c.image_id} is not in 'images'")
    paths = [join_url(folder, im.file_name) for im in doc.images]
    return SourceData(
        images_table([im.id for im in doc.images], path=paths),
        captions_table([(c.id, c.image_id, c.caption.strip()) for c in doc.annotations]),
        description={"format": "coco-captions-json"},
    )


def read_karpathy(req: Request, coco: bool) -> SourceData:
    ann, folder = req.need("annotations"), req.need("images")
    if req.split not in KARPATHY_SPLITS:
        raise ValueError(f"{req.dataset}: split must be one of {sorted(KARPATHY_SPLITS)}")
    images = parse_json(ann, TypeAdapter(_Karpathy)).images
    for i, im in enumerate(images):
        if coco and im.cocoid is None:
            raise SourceError(f"{ann}: images[{i}]: missing 'cocoid'")
    wanted = KARPATHY_SPLITS[req.split]
    keep = [(im.cocoid if coco else stem(im.filename), im) for im in images if im.split in wanted]
    return SourceData(
        images_table(
            [i for i, _ in keep],
            path=[join_url(folder, im.filepath, im.filename) for _, im in keep],
        ),
        captions_table([(s.sentid, i, s.raw.strip()) for i, im in keep for s in im.sentences]),
        description={"format": "karpathy-json", "karpathy_splits": list(wanted)},
    )


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


def _cc_webdataset(ann: str) -> SourceData:
    fs, path = storage.fsspec_filesystem(ann)
    if not fsspec.core.has_magic(path):
        path = path.rstrip("/") + "/*.tar" if fs.isdir(path) else path
    shards = sorted(p for p in fs.glob(path) if p.lower().endswith(".tar"))
    if not shards:
        raise SourceError(f"{ann}: no .tar shards found")
    rows = []
    for path in shards:
        shard = fs.unstrip_protocol(path) if "://" in ann else path
        for key, (image, caption) in _scan_shard(fs, path, shard).items():
            if image is None and caption is not None:
                raise SourceError(f"{shard}: sample {key!r} has a caption but no image member")
            if image is not None:  # else e.g. only KEY.json
                rows.append((key, shard, *image[1:], (caption or "").strip()))
    ids, paths, offsets, lengths, texts = map(list, zip(*rows, strict=True)) if rows else [[]] * 5
    return SourceData(
        images_table(ids, path=paths, offset=offsets, length=lengths),
        captions_table(list(zip([f"{k}-0" for k in ids], ids, texts, strict=True))),
        description={"format": "cc-webdataset", "shards": len(shards)},
    )


def read_cc(req: Request) -> SourceData:
    ann = req.need("annotations")
    if not ann.lower().endswith(".tsv"):
        return _cc_webdataset(ann)
    base = req.images if req.images is not None else posixpath.dirname(ann) or "."
    images: dict[str, str] = {}
    seen: Counter[str] = Counter()
    caps = []
    for number, line in numbered_lines(ann):
        caption, tab, path = line.partition("\t")
        path = path.strip()
        if not tab or "\t" in path or not path:
            raise SourceError(f"{ann}: line {number}: expected 'caption<TAB>path', got {line!r}")
        image_id = hashlib.sha1(path.encode()).hexdigest()[:16]
        images[image_id] = path if "://" in path or path.startswith("/") else join_url(base, path)
        caps.append((f"{image_id}-{seen[image_id]}", image_id, caption.strip()))
        seen[image_id] += 1
    return SourceData(
        images_table(list(images), path=list(images.values())),
        captions_table(caps),
        description={"format": "cc-tsv"},
    )


def read_csv(url: str, columns: tuple[str, ...]) -> pd.DataFrame:
    """A CSV with (at least) ``columns``, every cell a string; row k of the frame is data row
    k + 1 of the file (errors name the file and row)."""
    import pandas as pd  # the only user of pandas among the readers

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
    caps, levels = [], []
    for row, (row_id, captions, url) in enumerate(frame[["id", "captions", "image_url"]].values, 1):
        parts, name = captions.split("=>"), url.strip().rstrip("/").rpartition("/")[2]
        if not row_id.strip() or not name:
            raise SourceError(f"{ann}: row {row}: empty id or image_url")
        if len(parts) != HIERARCAPS_LEVELS:
            raise SourceError(
                f"{ann}: row {row}: expected {HIERARCAPS_LEVELS} levels joined by ' => ', "
                f"got {len(parts)}"
            )
        images.setdefault(stem(name), join_url(req.images, name) if req.images else url.strip())
        caps += [(f"{row_id.strip()}-{k}", stem(name), p.strip()) for k, p in enumerate(parts)]
        levels += range(HIERARCAPS_LEVELS)
    return SourceData(
        images_table(list(images), path=list(images.values())),
        captions_table(caps, level=pa.array(levels, pa.int64())),
        description={"format": "hierarcaps-csv", "levels": HIERARCAPS_LEVELS},
    )
