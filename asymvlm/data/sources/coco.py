"""COCO, COCO-Karpathy and Flickr30k readers.

* ``coco``: ``captions_{train,val}2017.json``; image_id = image id, caption_id = annotation id.
* ``coco-karpathy``: ``dataset_coco.json``; ``split`` train (= train + restval), restval, val or
  test; image_id = cocoid, caption_id = sentid, path = images/filepath/filename.
* ``flickr30k``: Karpathy ``dataset_flickr30k.json`` (image_id = file stem), ``results.csv``
  (``image_name| comment_number| comment``) or ``results_20130124.token``
  (``NAME.jpg#N<TAB>caption``); image_id = stem, caption_id = f"{stem}#{N}".
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from pydantic import BaseModel, StrictStr, TypeAdapter

from .common import (
    Ident,
    Request,
    SourceData,
    SourceError,
    by_extension,
    captions_table,
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


def _first_duplicate(url: str, ids: list[str], where: list[str], what: str) -> None:
    seen: dict[str, str] = {}
    for i, at in zip(ids, where, strict=True):
        if i in seen:
            raise SourceError(f"{url}: {at}: duplicate {what} {i} (also {seen[i]})")
        seen[i] = at


def read_coco(req: Request) -> SourceData:
    ann, folder = req.need("annotations"), req.need("images")
    doc = parse_json(ann, TypeAdapter(_Coco))
    ids = [im.id for im in doc.images]
    _first_duplicate(ann, ids, [f"images[{i}]" for i in range(len(ids))], "image id")
    caps = doc.annotations
    where = [f"annotations[{k}]" for k in range(len(caps))]
    _first_duplicate(ann, [c.id for c in caps], where, "annotation id")
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
    try:
        wanted = KARPATHY_SPLITS[req.split]
    except KeyError:
        raise ValueError(
            f"{req.dataset}: split must be one of {sorted(KARPATHY_SPLITS)}, got {req.split!r}"
        ) from None
    images = parse_json(ann, TypeAdapter(_Karpathy)).images
    ids = []
    for i, im in enumerate(images):
        if coco and im.cocoid is None:
            raise SourceError(f"{ann}: images[{i}]: missing 'cocoid'")
        ids.append(im.cocoid if coco else stem(im.filename))
    _first_duplicate(ann, ids, [f"images[{i}]" for i in range(len(ids))], "image id")
    sentences = [
        (s.sentid, f"images[{i}].sentences[{k}]")
        for i, im in enumerate(images)
        for k, s in enumerate(im.sentences)
    ]
    _first_duplicate(ann, [s for s, _ in sentences], [at for _, at in sentences], "sentid")
    keep = [(i, im) for i, im in zip(ids, images, strict=True) if im.split in wanted]
    caps = [(s.sentid, i, s.raw.strip()) for i, im in keep for s in im.sentences]
    return SourceData(
        images_table(
            [i for i, _ in keep],
            path=[join_url(folder, im.filepath, im.filename) for _, im in keep],
        ),
        captions_table([c[0] for c in caps], [c[1] for c in caps], [c[2] for c in caps]),
        description={"format": "karpathy-json", "karpathy_splits": list(wanted)},
    )


def read_coco_karpathy(req: Request) -> SourceData:
    return _read_karpathy(req, coco=True)


def _flickr_karpathy(req: Request) -> SourceData:
    return _read_karpathy(req, coco=False)


# -- Flickr30k caption files -------------------------------------------------------------------
_MERGED_NUMBER = re.compile(r"\s*(\d+)\s+(\S.*)$")  # "| 4   A dog ..." (missing second '|')


def _flickr_rows(
    req: Request, rows: Iterator[tuple[int, str, str, str]], ann: str, fmt: str
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
        image_id = stem(name)
        path = join_url(folder, name)
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
        images_table(ids, path=[images[i] for i in ids]),
        captions_table(caption_ids, caption_images, texts),
        description={"format": fmt},
    )


def _flickr_results_csv(req: Request) -> SourceData:
    ann = req.need("annotations")

    def rows() -> Iterator[tuple[int, str, str, str]]:
        for k, (number, line) in enumerate(numbered_lines(read_text(ann))):
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


def _flickr_token(req: Request) -> SourceData:
    ann = req.need("annotations")

    def rows() -> Iterator[tuple[int, str, str, str]]:
        for number, line in numbered_lines(read_text(ann)):
            key, tab, text = line.partition("\t")
            name, hash_, index = key.strip().rpartition("#")
            if not tab or not hash_:
                raise SourceError(
                    f"{ann}: line {number}: expected 'NAME.jpg#N<TAB>caption', got {line[:80]!r}"
                )
            yield number, name, index, text

    return _flickr_rows(req, rows(), ann, "flickr30k-token")


_FLICKR_FORMATS = {".json": _flickr_karpathy, ".csv": _flickr_results_csv, ".token": _flickr_token}


def read_flickr30k(req: Request) -> SourceData:
    return by_extension(req.need("annotations"), _FLICKR_FORMATS)(req)
