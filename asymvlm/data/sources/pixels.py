"""Classification sets with inline pixels (CIFAR-10/100, STL-10): pixels -> PNG bytes + label.

The CIFAR pickles are read by a restricted unpickler (plain containers and numpy arrays only).

* ``cifar10`` / ``cifar100``: the python pickle batches (``images`` or ``annotations`` = the
  ``cifar-10-batches-py`` / ``cifar-100-python`` folder or its parent); split train/test;
  image_id = f"cifar10-{split}-{index:05d}"; PNG bytes + label; fine labels for CIFAR-100.
* ``stl10``: ``stl10_binary`` (or its parent); split train/test/unlabeled; labels 0-based.
"""

from __future__ import annotations

import codecs
import importlib
import io
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .common import (
    Request,
    SourceData,
    SourceError,
    empty_captions,
    images_table,
    join_url,
    numbered_lines,
    open_fs,
    prompts_table,
    read_bytes,
    read_text,
)


def _numpy_global(module: str, name: str) -> Any:
    for prefix in ("numpy._core.", "numpy.core."):
        try:
            return getattr(importlib.import_module(prefix + module), name)
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"numpy has no {module}.{name}")


_NUMPY_PICKLE_NAMES = {"multiarray": ("_reconstruct", "scalar"), "numeric": ("_frombuffer",)}


class _SafeUnpickler(pickle.Unpickler):
    """Unpickles plain containers and numpy arrays only (no arbitrary code from a data file)."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "numpy" and name in ("ndarray", "dtype"):
            return getattr(np, name)
        if (module, name) == ("_codecs", "encode"):  # bytes in protocol-2 pickles from Python 3
            return codecs.encode
        package, _, sub = module.rpartition(".")
        if package in ("numpy.core", "numpy._core") and name in _NUMPY_PICKLE_NAMES.get(sub, ()):
            return _numpy_global(sub, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def _unpickle(url: str) -> dict:
    try:
        obj = _SafeUnpickler(io.BytesIO(read_bytes(url)), encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as e:
        raise SourceError(f"{url}: not a CIFAR pickle ({e})") from None
    if not isinstance(obj, dict):
        raise SourceError(f"{url}: expected a pickled dict, got {type(obj).__name__}")
    return obj


def _pickled(obj: dict, key: str, url: str) -> Any:
    for k in (key.encode(), key):
        if k in obj:
            return obj[k]
    raise SourceError(f"{url}: missing key b{key!r}")


def _names(values: Any, where: str) -> list[str]:
    if not isinstance(values, list | tuple) or not values:
        raise SourceError(f"{where}: expected a non-empty list of class names")
    names = []
    for k, v in enumerate(values):
        try:
            names.append(v.decode("utf-8") if isinstance(v, bytes) else str(v))
        except UnicodeDecodeError as e:
            raise SourceError(f"{where}[{k}]: class name is not UTF-8 ({e.reason})") from None
    return names


def _png(hwc: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(hwc)).save(buffer, format="PNG")
    return buffer.getvalue()


def _pixel_set(
    req: Request,
    name: str,
    pixels: np.ndarray,
    labels: np.ndarray | None,
    classes: list[str],
    to_hwc: Callable[[np.ndarray], np.ndarray],
    description: dict[str, Any],
) -> SourceData:
    """Images stored inline -> PNG rows (only for the selected ids) + prompts."""
    ids = [f"{name}-{req.split}-{i:05d}" for i in range(len(pixels))]
    keep = req.selected(ids)
    return SourceData(
        images_table(
            [ids[i] for i in keep],
            data=[_png(to_hwc(pixels[i])) for i in keep],
            label=None if labels is None else labels[keep].tolist(),
        ),
        empty_captions(),
        prompts_table(classes, req.templates),
        description={**description, "classes": classes, "templates": list(req.templates)},
    )


def _find_root(base: str, marker: str, folder: str) -> str:
    """``base`` if it holds ``marker``, else ``base/folder`` (the archive's top folder)."""
    fs, path = open_fs(base)
    if fs.exists(join_url(path, marker)):
        return base
    return join_url(base, folder)


@dataclass(frozen=True)
class _Cifar:
    name: str
    folder: str
    meta: str
    names_key: str
    labels_key: str
    files: dict[str, tuple[str, ...]]


_CIFAR10 = _Cifar(
    "cifar10",
    "cifar-10-batches-py",
    "batches.meta",
    "label_names",
    "labels",
    {"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)},
)
_CIFAR100 = _Cifar(
    "cifar100",
    "cifar-100-python",
    "meta",
    "fine_label_names",
    "fine_labels",
    {"train": ("train",), "test": ("test",)},
)


def _read_cifar(req: Request, layout: _Cifar) -> SourceData:
    if req.split not in layout.files:
        raise ValueError(f"{req.dataset}: split must be one of {sorted(layout.files)}")
    root = _find_root(req.root(), layout.meta, layout.folder)
    meta = join_url(root, layout.meta)
    classes = _names(
        _pickled(_unpickle(meta), layout.names_key, meta), f"{meta}: {layout.names_key}"
    )
    blocks, labels = [], []
    for name in layout.files[req.split]:
        url = join_url(root, name)
        batch = _unpickle(url)
        data = np.asarray(_pickled(batch, "data", url))
        if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
            raise SourceError(
                f"{url}: b'data': expected a uint8 array of shape (N, 3072), "
                f"got {data.dtype} {data.shape}"
            )
        y = np.asarray(_pickled(batch, layout.labels_key, url), dtype=np.int64).reshape(-1)
        if len(y) != len(data):
            raise SourceError(f"{url}: {len(y)} labels for {len(data)} images")
        bad = np.flatnonzero((y < 0) | (y >= len(classes)))
        if len(bad):
            raise SourceError(
                f"{url}: {layout.labels_key}[{bad[0]}] = {y[bad[0]]} outside 0..{len(classes) - 1}"
            )
        blocks.append(data)
        labels.append(y)
    return _pixel_set(
        req,
        layout.name,
        np.concatenate(blocks),
        np.concatenate(labels),
        classes,
        lambda row: row.reshape(3, 32, 32).transpose(1, 2, 0),
        {"format": "cifar-python-pickle", "root": root},
    )


def read_cifar10(req: Request) -> SourceData:
    return _read_cifar(req, _CIFAR10)


def read_cifar100(req: Request) -> SourceData:
    return _read_cifar(req, _CIFAR100)


STL10_SIDE = 96
_STL10_BYTES = 3 * STL10_SIDE * STL10_SIDE


def read_stl10(req: Request) -> SourceData:
    splits = ("train", "test", "unlabeled")
    if req.split not in splits:
        raise ValueError(f"stl10: split must be one of {splits}, got {req.split!r}")
    root = _find_root(req.root(), "class_names.txt", "stl10_binary")
    names_url = join_url(root, "class_names.txt")
    classes = [line.strip() for _, line in numbered_lines(read_text(names_url))]
    x_url = join_url(root, f"{req.split}_X.bin")
    raw = read_bytes(x_url)
    if len(raw) % _STL10_BYTES:
        raise SourceError(f"{x_url}: {len(raw)} bytes is not a multiple of {_STL10_BYTES}")
    pixels = np.frombuffer(raw, np.uint8).reshape(-1, 3, STL10_SIDE, STL10_SIDE)
    labels = None
    if req.split != "unlabeled":
        y_url = join_url(root, f"{req.split}_y.bin")
        y = np.frombuffer(read_bytes(y_url), np.uint8).astype(np.int64)
        if len(y) != len(pixels):
            raise SourceError(f"{y_url}: {len(y)} labels for {len(pixels)} images in {x_url}")
        bad = np.flatnonzero((y < 1) | (y > len(classes)))
        if len(bad):
            raise SourceError(
                f"{y_url}: byte {bad[0]}: label {y[bad[0]]} outside 1..{len(classes)}"
            )
        labels = y - 1
    # each image is stored column-major, one channel after another: (C, W, H) in C order
    return _pixel_set(
        req,
        "stl10",
        pixels,
        labels,
        classes,
        lambda img: img.transpose(2, 1, 0),
        {"format": "stl10-binary", "root": root},
    )
