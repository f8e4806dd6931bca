"""Classification sets (images, labels, prompts): ImageNet folders, CIFAR, STL-10 (docs/data.md)."""

from __future__ import annotations

import codecs
import importlib
import io
import pickle
import posixpath
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from asymvlm import storage
from asymvlm.data.templates import imagenet_class_names

from .reading import (
    Request,
    SourceData,
    SourceError,
    captions_table,
    images_table,
    join_url,
    numbered_lines,
    prompts_table,
    read_bytes,
)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")


def _classified(
    req: Request, ids: list[str], labels: Any, classes: list[str], desc: dict, **columns: Any
) -> SourceData:
    return SourceData(
        images_table(ids, label=labels, **columns),
        captions_table([]),
        prompts_table(classes, req.templates),
        description={**desc, "classes": classes, "templates": list(req.templates)},
    )


def read_imagenet(req: Request) -> SourceData:
    root_url = req.need("images")
    fs, root = storage.fsspec_filesystem(root_url)
    root = root.rstrip("/")
    folders = sorted(
        name
        for e in fs.ls(root, detail=True)
        if e["type"] == "directory"
        and not (name := posixpath.basename(e["name"].rstrip("/"))).startswith(".")
    )
    if not folders:
        raise SourceError(f"{root_url}: no class folders")
    index = {f: k for k, f in enumerate(folders)}
    found = [p[len(root) + 1 :].partition("/") for p in sorted(fs.find(root))]
    ids = [f"{c}/{r}" for c, _, r in found if c in index and r.lower().endswith(IMAGE_EXTENSIONS)]
    return _classified(
        req,
        ids,
        [index[rel.partition("/")[0]] for rel in ids],
        imagenet_class_names(folders) or folders,
        {"format": "image-folders", "folders": folders},
        path=[join_url(root_url, rel) for rel in ids],
    )


_NUMPY_CORE = "numpy._core" if int(np.__version__.split(".")[0]) >= 2 else "numpy.core"
_NUMPY_PICKLE_NAMES = {("multiarray", "_reconstruct"), ("multiarray", "scalar")}
_NUMPY_PICKLE_NAMES |= {("numeric", "_frombuffer")}


class _SafeUnpickler(pickle.Unpickler):
    """Unpickles plain containers and numpy arrays only (no arbitrary code from a data file)."""

    def find_class(self, module: str, name: str) -> Any:
        package, _, sub = module.rpartition(".")
        if module == "numpy" and name in ("ndarray", "dtype"):
            return getattr(np, name)
        if (module, name) == ("_codecs", "encode"):  # bytes in protocol-2 pickles from Python 3
            return codecs.encode
        if package in ("numpy.core", "numpy._core") and (sub, name) in _NUMPY_PICKLE_NAMES:
            return getattr(importlib.import_module(f"{_NUMPY_CORE}.{sub}"), name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def _unpickle(url: str, *keys: str) -> list[Any]:
    """The values of ``keys`` in the pickled dict at ``url``."""
    try:
        obj = _SafeUnpickler(io.BytesIO(read_bytes(url)), encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as e:
        raise SourceError(f"{url}: not a CIFAR pickle ({e})") from None
    if not isinstance(obj, dict):
        raise SourceError(f"{url}: expected a pickled dict, got {type(obj).__name__}")
    missing = [k for k in keys if k.encode() not in obj]
    if missing:
        raise SourceError(f"{url}: missing key b{missing[0]!r}")
    return [obj[k.encode()] for k in keys]


def _check_labels(y: np.ndarray, n: int, lowest: int, classes: list[str], where: str) -> None:
    if len(y) != n:
        raise SourceError(f"{where}: {len(y)} labels for {n} images")
    bad = np.flatnonzero((y < lowest) | (y >= lowest + len(classes)))
    if len(bad):
        raise SourceError(
            f"{where}[{bad[0]}] = {y[bad[0]]} outside {lowest}..{lowest + len(classes) - 1}"
        )


def _pixel_set(
    req: Request, pixels: np.ndarray, labels: Any, classes: list[str], to_hwc: Callable, desc: dict
) -> SourceData:
    """Images stored inline -> PNG rows, encoded only for the selected ids."""
    from PIL import Image

    ids = [f"{req.dataset}-{req.split}-{i:05d}" for i in range(len(pixels))]
    keep = req.selected(ids)
    labels = None if labels is None else labels[keep].tolist()
    data = []
    for i in keep:
        Image.fromarray(np.ascontiguousarray(to_hwc(pixels[i]))).save(png := io.BytesIO(), "PNG")
        data.append(png.getvalue())
    return _classified(req, [ids[i] for i in keep], labels, classes, desc, data=data)


def _find_root(req: Request, marker: str, folder: str) -> str:
    """The data folder (``images``, else ``annotations``), or the archive's top ``folder`` in it."""
    base = req.images or req.need("annotations")
    return base if storage.exists(join_url(base, marker)) else join_url(base, folder)


class CifarLayout(NamedTuple):
    name: str
    folder: str
    meta: str
    names_key: str
    labels_key: str
    files: dict[str, tuple[str, ...]]


_BATCHES = {"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)}
CIFAR10 = CifarLayout(
    "cifar10", "cifar-10-batches-py", "batches.meta", "label_names", "labels", _BATCHES
)
_FILES = {"train": ("train",), "test": ("test",)}
CIFAR100 = CifarLayout(
    "cifar100", "cifar-100-python", "meta", "fine_label_names", "fine_labels", _FILES
)


def read_cifar(req: Request, layout: CifarLayout) -> SourceData:
    if req.split not in layout.files:
        raise ValueError(f"{req.dataset}: split must be one of {sorted(layout.files)}")
    root = _find_root(req, layout.meta, layout.folder)
    meta = join_url(root, layout.meta)
    (classes,) = _unpickle(meta, layout.names_key)
    try:
        classes = [name.decode("utf-8") for name in classes or None]
    except (AttributeError, TypeError, UnicodeDecodeError) as e:
        raise SourceError(f"{meta}: {layout.names_key}: not a list of class names ({e})") from None
    blocks, labels = [], []
    for name in layout.files[req.split]:
        url = join_url(root, name)
        data, y = _unpickle(url, "data", layout.labels_key)
        data, y = np.asarray(data), np.asarray(y, dtype=np.int64).reshape(-1)
        if data.dtype != np.uint8 or data.shape[1:] != (3072,):
            raise SourceError(
                f"{url}: b'data': expected uint8 (N, 3072), got {data.dtype} {data.shape}"
            )
        _check_labels(y, len(data), 0, classes, f"{url}: {layout.labels_key}")
        blocks.append(data)
        labels.append(y)
    hwc = lambda row: row.reshape(3, 32, 32).transpose(1, 2, 0)  # noqa: E731
    desc = {"format": "cifar-python-pickle", "root": root}
    return _pixel_set(req, np.concatenate(blocks), np.concatenate(labels), classes, hwc, desc)


STL10_SIDE = 96


def read_stl10(req: Request) -> SourceData:
    if req.split not in ("train", "test", "unlabeled"):
        raise ValueError(f"stl10: split must be one of train, test, unlabeled, got {req.split!r}")
    root = _find_root(req, "class_names.txt", "stl10_binary")
    classes = [line.strip() for _, line in numbered_lines(join_url(root, "class_names.txt"))]
    x_url = join_url(root, f"{req.split}_X.bin")
    raw, size = read_bytes(x_url), 3 * STL10_SIDE * STL10_SIDE
    if len(raw) % size:
        raise SourceError(f"{x_url}: {len(raw)} bytes is not a multiple of {size}")
    pixels = np.frombuffer(raw, np.uint8).reshape(-1, 3, STL10_SIDE, STL10_SIDE)
    labels = None
    if req.split != "unlabeled":
        y_url = join_url(root, f"{req.split}_y.bin")
        y = np.frombuffer(read_bytes(y_url), np.uint8).astype(np.int64)
        _check_labels(y, len(pixels), 1, classes, f"{y_url}: byte")
        labels = y - 1
    # each image is stored column-major, one channel after another: (C, W, H) in C order
    desc = {"format": "stl10-binary", "root": root}
    return _pixel_set(req, pixels, labels, classes, lambda img: img.transpose(2, 1, 0), desc)
