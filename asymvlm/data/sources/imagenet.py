"""ImageNet-style class folders: one folder per class, sorted folder names = class index.

* ``imagenet``: ``images`` = a folder of class folders (sorted folder names = class index),
  image_id = the path relative to it; optional ``annotations`` maps folder -> class name
  (``LOC_synset_mapping.txt`` / ``words.txt`` lines, first comma-separated name, or JSON
  ``{folder: name}`` / Keras ``{"0": [wnid, name]}``); without it, ILSVRC-2012 synset folders
  get CLIP's curated class names (:func:`asymvlm.data.templates.imagenet_class_names`), other
  folders their own name.
"""

from __future__ import annotations

import posixpath

from pydantic import StrictStr, TypeAdapter

from asymvlm.data.templates import imagenet_class_names

from .common import (
    Request,
    SourceData,
    SourceError,
    empty_captions,
    images_table,
    join_url,
    numbered_lines,
    open_fs,
    parse_json,
    prompts_table,
    read_text,
)

_MAPPING = TypeAdapter(dict[str, StrictStr | tuple[StrictStr, StrictStr]])
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")


def _class_mapping(url: str) -> dict[str, str]:
    """Folder name -> human class name, from a text or JSON mapping file."""
    if url.lower().endswith(".json"):  # {folder: name} or Keras {"0": [folder, name]}
        doc = parse_json(url, _MAPPING)
        return dict(v if isinstance(v, tuple) else (k, v) for k, v in doc.items())
    mapping = {}
    for number, line in numbered_lines(read_text(url)):
        sep = "\t" if "\t" in line else None
        parts = line.strip().split(sep, 1)
        if len(parts) != 2 or not parts[1].strip():
            raise SourceError(f"{url}: line {number}: expected 'folder name', got {line[:80]!r}")
        mapping[parts[0].strip()] = parts[1].split(",")[0].strip()
    return mapping


def read_imagenet(req: Request) -> SourceData:
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
            paths.append(join_url(root_url, rel))
            labels.append(index[folder])
    names = imagenet_class_names(folders) or folders
    if req.annotations is not None:
        mapping = _class_mapping(req.annotations)
        missing = [f for f in folders if f not in mapping]
        if missing:
            raise SourceError(f"{req.annotations}: no class name for folder {missing[0]!r}")
        names = [mapping[f] for f in folders]
    return SourceData(
        images_table(ids, path=paths, label=labels),
        empty_captions(),
        prompts_table(names, req.templates),
        description={
            "format": "image-folders",
            "folders": folders,
            "classes": names,
            "templates": list(req.templates),
        },
    )
