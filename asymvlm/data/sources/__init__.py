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

Modules: :mod:`._common` (schemas, errors, reading helpers, table builders, selection),
:mod:`.coco` (COCO, COCO-Karpathy, Flickr30k), :mod:`.conceptual` (CC), :mod:`.hierarcaps`,
:mod:`.pixels` (CIFAR-10/100, STL-10), :mod:`.imagenet`; this package holds :data:`READERS` and
:func:`read_source`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import pyarrow.compute as pc

from ._common import (
    CAPTION_SCHEMA,
    DEFAULT_TEMPLATES,
    IMAGE_SCHEMA,
    PROMPT_SCHEMA,
    SourceData,
    SourceError,
    _check_unique,
    _Request,
    _Selector,
    open_fs,
)
from .coco import _read_coco, _read_coco_karpathy, _read_flickr30k
from .conceptual import _read_cc
from .hierarcaps import _read_hierarcaps
from .imagenet import _read_imagenet
from .pixels import _read_cifar10, _read_cifar100, _read_stl10

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
