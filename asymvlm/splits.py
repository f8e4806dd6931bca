"""Embedding splits on the device: :class:`SplitTensors`, what training, evaluation and
scoring consume; :func:`load_split`, :func:`hold_out_images` and the per-process
:class:`SplitCache` (a Tune actor runs trial after trial on the same tables: keyed by root,
split, adapter input, device and the manifest's content)."""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np
import torch

from asymvlm import tables

__all__ = [
    "PROCESS_CACHE",
    "SplitCache",
    "SplitTensors",
    "hold_out_images",
    "load_split",
]


@dataclass
class SplitTensors:
    """One split on the device; the optional tensors are None when the tables lack them."""

    image_emb: torch.Tensor  # [n_image, d] unit
    text_emb: torch.Tensor  # [n_text, d] adapter input (raw or unit)
    text_to_image: torch.Tensor  # [n_text] long
    split: tables.EmbeddingSplit
    image_norm: torch.Tensor | None = None  # [n_image]
    image_pre: torch.Tensor | None = None  # [n_image, pre_dim.image]
    text_pre: torch.Tensor | None = None  # [n_text, pre_dim.text]
    image_projection: torch.Tensor | None = None  # [d, pre_dim.image]
    text_projection: torch.Tensor | None = None  # [d, pre_dim.text]

    @property
    def dim(self) -> int:
        return self.image_emb.shape[1]

    def subset(self, images: np.ndarray, texts: np.ndarray) -> SplitTensors:
        """Image rows ``images`` and caption rows ``texts`` (of those images), renumbered; a
        tensor that is its split's array stays its subset split's array (one copy per row)."""
        old = self.split
        split = old.subset(images, texts)
        device = self.image_emb.device
        image_rows = torch.as_tensor(images, device=device)
        text_rows = torch.as_tensor(texts, device=device)
        return replace(
            self,
            image_emb=_take(
                self.image_emb, image_rows, old.image_embeddings, split.image_embeddings
            ),
            text_emb=_take(self.text_emb, text_rows, old.text_matrix, split.text_matrix),
            text_to_image=torch.as_tensor(split.text_image_index, device=device),
            split=split,
            image_norm=_take(self.image_norm, image_rows, old.image_norms, split.image_norms),
            image_pre=_take(
                self.image_pre, image_rows, old.image_features_pre, split.image_features_pre
            ),
            text_pre=_take(
                self.text_pre, text_rows, old.text_features_pre, split.text_features_pre
            ),
        )


def _shares(tensor: torch.Tensor, array: np.ndarray | None) -> bool:
    """Whether ``tensor`` is ``array``'s memory as is (a CPU tensor from ``torch.from_numpy``)."""
    return (
        array is not None
        and array.size > 0
        and tensor.device.type == "cpu"
        and tuple(array.shape) == tuple(tensor.shape)
        and array.dtype.itemsize == tensor.element_size()
        and array.__array_interface__["data"][0] == tensor.data_ptr()
    )


def _take(
    values: torch.Tensor | None,
    rows: torch.Tensor,
    old: np.ndarray | None,
    new: np.ndarray | None,
) -> torch.Tensor | None:
    """``values[rows]``; when ``values`` is ``old``'s memory, the array ``new`` (``old[rows]``,
    already made by the split's subset) is viewed instead of copying the rows again."""
    if values is None:
        return None
    if new is not None and _shares(values, old):
        return _as_tensor(new, values.dtype, values.device)
    return values[rows]


def _as_tensor(values: np.ndarray, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``values`` as a ``dtype`` tensor on ``device``: on the CPU a writable array of that
    dtype is viewed (``torch.from_numpy``, no copy), otherwise one copy is made."""
    if values.flags.writeable and values.dtype.isnative:
        return torch.from_numpy(values).to(device=device, dtype=dtype)
    return torch.tensor(values, dtype=dtype, device=device)


def _tensor(values: np.ndarray | None, device: torch.device) -> torch.Tensor | None:
    return None if values is None else _as_tensor(values, torch.float32, device)


def load_split(
    root: str, split: str, adapter_input: str = "raw", device: str | torch.device = "cpu"
) -> SplitTensors:
    """Read and validate ``ROOT/<split>`` onto ``device`` (an empty split is a
    :class:`~asymvlm.tables.TableError`). The raw text inputs are made in place and on the CPU
    the tensors are the split's arrays: a split costs its float32 matrices once."""
    data = tables.read_split(root, split)
    if len(data.image_ids) == 0 or len(data.caption_ids) == 0:
        raise tables.TableError(
            f"{root}/{split}: the split is empty ({len(data.image_ids)} images, "
            f"{len(data.caption_ids)} captions); training and evaluation need at least one of each"
        )
    device = torch.device(device)
    projection = None
    if data.image_features_pre is not None or data.text_features_pre is not None:
        projection = tables.read_projection(root, data.manifest)
    projection = projection or {}
    text = data.text_inputs(adapter_input, in_place=True)
    return SplitTensors(
        image_emb=_as_tensor(data.image_embeddings, torch.float32, device),
        text_emb=_as_tensor(text, torch.float32, device),
        text_to_image=_as_tensor(data.text_image_index, torch.long, device),
        split=data,
        image_norm=_tensor(data.image_norms, device),
        image_pre=_tensor(data.image_features_pre, device),
        text_pre=_tensor(data.text_features_pre, device),
        image_projection=_tensor(projection.get("image"), device),
        text_projection=_tensor(projection.get("text"), device),
    )


def hold_out_images(
    data: SplitTensors, fraction: float, seed: int = 0
) -> tuple[SplitTensors, SplitTensors]:
    """Split one split into (rest, held-out) by image: a seeded ``fraction`` of the images and
    all their captions form the held-out part -- a validation split for data sets that ship
    only train and test (COCO 2017, CC). The choice depends only on the image ids and seed."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"hold-out fraction must be in (0, 1), got {fraction}")
    ids = data.split.image_ids
    n_image = len(ids)
    order = np.argsort([hashlib.sha256(f"{seed}:{i}".encode()).hexdigest() for i in ids])
    held = np.zeros(n_image, dtype=bool)
    held[order[: max(1, int(round(fraction * n_image)))]] = True
    owner = data.text_to_image.cpu().numpy()
    rest, out = (
        data.subset(np.flatnonzero(keep), np.flatnonzero(keep[owner])) for keep in (~held, held)
    )
    return rest, out


# -- splits loaded once per process ----------------------------------------------------------
T = TypeVar("T")


class SplitCache:
    """Least-recently-used splits (:meth:`load`) and what is derived from them (:meth:`memo`),
    at most ``max_entries``; ``hits`` and ``misses`` count lookups."""

    def __init__(self, max_entries: int = 6) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple, object] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def _key(self, root: str, *rest: object) -> tuple:
        manifest = json.dumps(tables.read_manifest(root).to_dict(), sort_keys=True, default=str)
        return (root, manifest, *rest)

    def _get(self, key: tuple, make: Callable[[], T]) -> T:
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                self.hits += 1
                return self._entries[key]
        value = make()
        with self._lock:
            self.misses += 1
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return value

    def load(
        self,
        root: str,
        split: str,
        adapter_input: str = "raw",
        device: str | torch.device = "cpu",
    ) -> SplitTensors:
        """``load_split(root, split, adapter_input, device)``, read once per process."""
        device = torch.device(device)
        key = self._key(root, "split", split, adapter_input, str(device))
        return self._get(key, lambda: load_split(root, split, adapter_input, device))

    def memo(self, root: str, key: tuple, make: Callable[[], T]) -> T:
        """``make()`` once per (tables ``root`` and its manifest, ``key``): for what is derived
        from a split, e.g. its held-out validation part."""
        return self._get(self._key(root, *key), make)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


#: The cache of this process (a Tune actor running one trial after another).
PROCESS_CACHE = SplitCache()
