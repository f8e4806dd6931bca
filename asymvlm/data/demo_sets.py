"""Offline stand-ins for the zero-shot sets, made from the real HierarCaps images.

The demo has no CIFAR download. It builds CIFAR-10- and CIFAR-100-format folders (python pickle
batches, 32 x 32 images, exactly the files the real readers take) from the HierarCaps images:
the classes are the most frequent general (level-0) captions, e.g. "dog", "pizza"; images of
the first ``n_classes`` of them are the positives (the "CIFAR-10" set), images of the next ones
the negatives (the "CIFAR-100" set, whose classes the positives' prompts do not name). With the
tiny random CLIP of the demo the numbers mean nothing; the files exercise the real code path.
"""

from __future__ import annotations

import csv
import os
import pickle
from collections import Counter

import numpy as np

__all__ = ["find_hierarcaps", "write_hierarcaps_cifar"]

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def find_hierarcaps() -> str | None:
    """The read-only HierarCaps copy: ``$ASYMVLM_HIERARCAPS``, else ``../shared/data/hierarcaps``
    beside this checkout; None when neither has the csv. A local lookup only: no cache, no
    network (:func:`asymvlm.data.hierarcaps_fetch.locate_hierarcaps` adds those)."""
    candidates = [
        os.environ.get("ASYMVLM_HIERARCAPS"),
        os.path.join(os.path.dirname(_REPO), "shared", "data", "hierarcaps"),
    ]
    for c in candidates:
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
    with open(os.path.join(hierarcaps, "hierarcaps_test.csv"), newline="", encoding="utf-8") as fh:
        rows = [
            (r["captions"].split("=>")[0].strip(), r["image_url"].rsplit("/", 1)[-1])
            for r in csv.DictReader(fh)
        ]
    images = os.path.join(hierarcaps, "images")
    rows = [(c, n) for c, n in rows if os.path.exists(os.path.join(images, n))]
    ranked: list[str] = []  # most frequent first; "animal" and "animals" count as one
    for caption, _ in Counter(c for c, _ in rows).most_common():
        if caption.rstrip("s") not in {r.rstrip("s") for r in ranked}:
            ranked.append(caption)
    ranked = ranked[: 2 * n_classes]
    if len(ranked) < 2 * n_classes:
        raise ValueError(f"{hierarcaps}: fewer than {2 * n_classes} general captions")
    pos_classes, neg_classes = ranked[:n_classes], ranked[n_classes:]
    out = {}
    for name, folder, meta, names_key, labels_key, batch, classes in (
        (
            "cifar10",
            "cifar-10-batches-py",
            "batches.meta",
            b"label_names",
            b"labels",
            "test_batch",
            pos_classes,
        ),
        (
            "cifar100",
            "cifar-100-python",
            "meta",
            b"fine_label_names",
            b"fine_labels",
            "test",
            neg_classes,
        ),
    ):
        root = os.path.join(output, name, folder)
        os.makedirs(root, exist_ok=True)
        picked = [(classes.index(c), n) for c, n in rows if c in classes]
        with open(os.path.join(root, meta), "wb") as fh:
            pickle.dump({names_key: [c.encode() for c in classes]}, fh, protocol=2)
        payload = {
            labels_key: [label for label, _ in picked],
            b"data": _rows(images, [n for _, n in picked]),
        }
        with open(os.path.join(root, batch), "wb") as fh:
            pickle.dump(payload, fh, protocol=2)
        out[name] = os.path.join(output, name)
    return out
