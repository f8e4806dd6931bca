"""Readers: an image-caption data set in its annotation format -> image, caption and prompt
tables (the contract: docs/data.md).
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
