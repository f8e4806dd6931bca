"""Offline CIFAR-format stand-ins for the zero-shot sets, from HierarCaps images (docs/data.md)."""

from __future__ import annotations

import os
import pickle
from collections import Counter

import numpy as np

from asymvlm import storage
from asymvlm.data.sources.captions import read_csv
from asymvlm.data.sources.classes import CIFAR10, CIFAR100

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def find_hierarcaps() -> str | None:
    """The read-only HierarCaps copy: ``$ASYMVLM_HIERARCAPS``, else ``../shared/data/hierarcaps``
    beside this checkout; None when neither has the csv."""
    shared = os.path.join(os.path.dirname(_REPO), "shared", "data", "hierarcaps")
    for c in (os.environ.get("ASYMVLM_HIERARCAPS"), shared):
        if c and os.path.isfile(os.path.join(c, "hierarcaps_test.csv")):
            return os.path.abspath(c)
    return None


def _rows(folder: str, names: list[str]) -> np.ndarray:
    from PIL import Image

    out = []
    for name in names:
        with Image.open(os.path.join(folder, name)) as im:
            pixels = np.asarray(im.convert("RGB").resize((32, 32), resample=Image.BICUBIC))
        out.append(pixels.transpose(2, 0, 1).reshape(3072))  # rows are CHW, as the real files
    return np.stack(out).astype(np.uint8)


def write_hierarcaps_cifar(hierarcaps: str, output: str, n_classes: int = 5) -> dict[str, str]:
    """Write ``output/cifar10/cifar-10-batches-py`` and ``output/cifar100/cifar-100-python``
    (test split) from ``hierarcaps`` (csv + images/); returns the two data-set roots."""
    frame = read_csv(os.path.join(hierarcaps, "hierarcaps_test.csv"), ("captions", "image_url"))
    images = os.path.join(hierarcaps, "images")
    rows = [
        (captions.split("=>")[0].strip(), url.rsplit("/", 1)[-1])
        for captions, url in frame[["captions", "image_url"]].values
    ]
    rows = [(c, n) for c, n in rows if os.path.exists(os.path.join(images, n))]
    ranked: list[str] = []  # most frequent first; "animal" and "animals" count as one
    for caption, _ in Counter(c for c, _ in rows).most_common():
        if caption.rstrip("s") not in {r.rstrip("s") for r in ranked}:
            ranked.append(caption)
    if len(ranked) < 2 * n_classes:
        raise ValueError(f"{hierarcaps}: fewer than {2 * n_classes} general captions")
    out = {}
    for layout, classes in (CIFAR10, ranked[:n_classes]), (CIFAR100, ranked[n_classes:]):
        classes = classes[:n_classes]
        root = os.path.join(output, layout.name, layout.folder)
        picked = [(classes.index(c), n) for c, n in rows if c in classes]
        meta = {layout.names_key.encode(): [c.encode() for c in classes]}
        batch = {
            layout.labels_key.encode(): [label for label, _ in picked],
            b"data": _rows(images, [n for _, n in picked]),
        }
        for name, obj in (layout.meta, meta), (layout.files["test"][0], batch):
            storage.write_bytes(os.path.join(root, name), pickle.dumps(obj, protocol=2))
        out[layout.name] = os.path.join(output, layout.name)
    return out
