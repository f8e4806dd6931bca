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
        class_name, template, text -- one row per class x template, in that order; the
        templates are the data set's zero-shot templates as CLIP's evaluation uses them
        (``templates=None``: :func:`asymvlm.data.templates.templates_for`)
    SourceData.description  JSON-serialisable dict for the manifest: dataset, split,
        annotations, images, format, counts, sample, seed, id_list (+ sampled_ids, classes ...)

Data sets (``READERS``; ``split`` is only a label unless said otherwise), each documented in
its module: ``coco``, ``coco-karpathy``, ``flickr30k`` (:mod:`.coco`); ``cc`` (Conceptual
Captions, :mod:`.conceptual`); ``hierarcaps`` (:mod:`.hierarcaps`); ``cifar10``, ``cifar100``,
``stl10`` (:mod:`.pixels`); ``imagenet`` (:mod:`.imagenet`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import pyarrow.compute as pc

from asymvlm.data.templates import templates_for

from .coco import read_coco, read_coco_karpathy, read_flickr30k
from .common import (
    CAPTION_SCHEMA,
    DEFAULT_TEMPLATES,
    IMAGE_SCHEMA,
    PROMPT_SCHEMA,
    Request,
    Selector,
    SourceData,
    SourceError,
    check_unique,
    open_fs,
)
from .conceptual import read_cc
from .hierarcaps import read_hierarcaps
from .imagenet import read_imagenet
from .pixels import read_cifar10, read_cifar100, read_stl10

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

READERS: dict[str, Callable[[Request], SourceData]] = {
    "coco": read_coco,
    "coco-karpathy": read_coco_karpathy,
    "flickr30k": read_flickr30k,
    "cc": read_cc,
    "hierarcaps": read_hierarcaps,
    "cifar10": read_cifar10,
    "cifar100": read_cifar100,
    "stl10": read_stl10,
    "imagenet": read_imagenet,
}


# -- entry point -------------------------------------------------------------------------------
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
    templates = templates_for(dataset) if templates is None else tuple(templates)
    bad = [t for t in templates if t.count("{}") != 1]
    if not templates or bad:
        raise ValueError(f"templates must each hold one '{{}}', got {list(templates)}")
    annotations = None if annotations is None else os.fspath(annotations)
    images = None if images is None else os.fspath(images)
    id_list = None if id_list is None else os.fspath(id_list)
    selector = Selector(sample, seed, id_list)
    out = reader(Request(dataset, annotations, images, split, templates, selector))

    image_table, caption_table = out.images, out.captions
    check_unique(image_table, "image_id", dataset)
    check_unique(caption_table, "caption_id", dataset)
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
