"""Readers: a data set's annotation files -> image, caption and prompt tables (docs/data.md)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import pyarrow.compute as pc

from asymvlm.data.templates import templates_for
from asymvlm.storage import absolute
from asymvlm.storage import fsspec_filesystem as open_fs

from .captions import read_cc, read_coco, read_hierarcaps, read_karpathy
from .classes import CIFAR10, CIFAR100, read_cifar, read_imagenet, read_stl10
from .reading import CAPTION_SCHEMA, IMAGE_SCHEMA, Request, SourceData, SourceError

__all__ = [
    "CAPTION_SCHEMA",
    "IMAGE_SCHEMA",
    "READERS",
    "SourceData",
    "SourceError",
    "open_fs",
    "read_source",
]

READERS: dict[str, Callable[[Request], SourceData]] = {
    "coco": read_coco,
    "coco-karpathy": partial(read_karpathy, coco=True),
    "flickr30k": partial(read_karpathy, coco=False),
    "cc": read_cc,
    "hierarcaps": read_hierarcaps,
    "cifar10": partial(read_cifar, layout=CIFAR10),
    "cifar100": partial(read_cifar, layout=CIFAR100),
    "stl10": read_stl10,
    "imagenet": read_imagenet,
}


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
    """Read one split of ``dataset`` (a key of :data:`READERS`), selected and sorted by id."""
    if dataset not in READERS:
        raise ValueError(f"unknown data set {dataset!r}; known: {sorted(READERS)}")
    templates = templates_for(dataset) if templates is None else tuple(templates)
    if not templates or any(t.count("{}") != 1 for t in templates):
        raise ValueError(f"templates must each hold one '{{}}', got {list(templates)}")
    annotations, images, id_list = (p and absolute(p) for p in (annotations, images, id_list))
    req = Request(dataset, annotations, images, split, templates, sample, seed, id_list)
    out = READERS[dataset](req)
    for table, key in (out.images, "image_id"), (out.captions, "caption_id"):
        counts = pc.value_counts(table[key])
        dup = counts.filter(pc.greater(counts.field("counts"), 1))
        if len(dup):
            where = annotations or images
            raise SourceError(f"{where}: duplicate {key} {dup[0]['values'].as_py()!r}")
    image_table = out.images.take(req.selected(out.images["image_id"].to_pylist()))
    image_table = image_table.sort_by("image_id").combine_chunks()
    captions = out.captions.filter(pc.is_in(out.captions["image_id"], image_table["image_id"]))
    captions = captions.sort_by([("image_id", "ascending"), ("caption_id", "ascending")])
    counts = {"images": image_table.num_rows, "captions": captions.num_rows}
    if out.prompts is not None:
        counts["prompts"] = out.prompts.num_rows
    description = dict(dataset=dataset, split=split, annotations=annotations, images=images)
    description |= {**out.description, "counts": counts, "sample": sample, "seed": seed}
    description["id_list"] = id_list
    if sample is not None:
        description["sampled_ids"] = req.chosen.to_pylist()
    return SourceData(image_table, captions.combine_chunks(), out.prompts, description)
