"""COCO, COCO-Karpathy and Flickr30k readers (the Karpathy split reader is shared).

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
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from .common import (
    Json,
    Request,
    SourceData,
    SourceError,
    by_extension,
    captions_table,
    images_table,
    join_url,
    load_json,
    numbered_lines,
    read_text,
    stem,
)

KARPATHY_SPLITS = {
    "train": ("train", "restval"),
    "restval": ("restval",),
    "val": ("val",),
    "test": ("test",),
}


def _karpathy_wanted(req: Request) -> tuple[str, ...]:
    try:
        return KARPATHY_SPLITS[req.split]
    except KeyError:
        raise ValueError(
            f"{req.dataset}: split must be one of {sorted(KARPATHY_SPLITS)}, got {req.split!r}"
        ) from None


# -- COCO --------------------------------------------------------------------------------------
def read_coco(req: Request) -> SourceData:
    ann, folder = req.need("annotations"), req.need("images")
    j = Json(ann)
    doc = load_json(ann)
    where_of: dict[str, str] = {}
    ids, paths = [], []
    for i, item in enumerate(j.items(doc, "images", "")):
        where = f"images[{i}]"
        image_id, name = j.ident(item, "id", where), j.string(item, "file_name", where)
        if image_id in where_of:
            raise j.error(where, f"duplicate image id {image_id} (also {where_of[image_id]})")
        where_of[image_id] = where
        ids.append(image_id)
        paths.append(join_url(folder, name))
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
        images_table(ids, path=paths),
        captions_table(caption_ids, caption_images, texts),
        description={"format": "coco-captions-json"},
    )


# -- Karpathy splits (COCO, Flickr30k) ---------------------------------------------------------
def _read_karpathy(req: Request, image_key: Callable[[Json, dict, str], str]) -> SourceData:
    ann, folder = req.need("annotations"), req.need("images")
    wanted = _karpathy_wanted(req)
    j = Json(ann)
    doc = load_json(ann)
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
        paths.append(join_url(folder, subdir, name))
        for caption_id, raw, _ in parsed:
            caption_ids.append(caption_id)
            caption_images.append(image_id)
            texts.append(raw.strip())
    return SourceData(
        images_table(ids, path=paths),
        captions_table(caption_ids, caption_images, texts),
        description={"format": "karpathy-json", "karpathy_splits": list(wanted)},
    )


def read_coco_karpathy(req: Request) -> SourceData:
    return _read_karpathy(req, lambda j, item, where: j.ident(item, "cocoid", where))


def _flickr_karpathy(req: Request) -> SourceData:
    return _read_karpathy(req, lambda j, item, where: stem(j.string(item, "filename", where)))


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
