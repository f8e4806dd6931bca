"""Embedding splits on the device (:class:`SplitTensors`), what training, evaluation and scoring
consume; :func:`load_split`, :func:`hold_out_images` and the per-process :class:`SplitCache`."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from asymvlm import tables

__all__ = ["PROCESS_CACHE", "SplitCache", "SplitTensors", "hold_out_images", "load_split"]

logger = logging.getLogger(__name__)


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
    captions: Sequence[str] | None = None  # [n_text] the caption texts

    @property
    def dim(self) -> int:
        return self.image_emb.shape[1]

    def subset(self, images: np.ndarray, texts: np.ndarray) -> SplitTensors:
        """Image rows ``images`` and caption rows ``texts`` (of those images), renumbered; a CPU
        tensor that is its split's array becomes the subset split's array (no second copy)."""
        old = self.split
        split = old.subset(images, texts)
        rows = {"image": torch.as_tensor(images), "text": torch.as_tensor(texts)}

        def take(tensor: torch.Tensor | None, kind: str, name: str) -> torch.Tensor | None:
            was, new = getattr(old, name), getattr(split, name)
            if tensor is None:
                return None
            if tensor.device.type == "cpu" and was is not None and was.size:
                if tensor.data_ptr() == was.__array_interface__["data"][0]:
                    return torch.from_numpy(new)
            return tensor[rows[kind].to(tensor.device)]

        return replace(
            self,
            image_emb=take(self.image_emb, "image", "image_embeddings"),
            text_emb=take(self.text_emb, "text", "text_matrix"),
            text_to_image=torch.as_tensor(split.text_image_index, device=self.text_to_image.device),
            split=split,
            image_norm=take(self.image_norm, "image", "image_norms"),
            image_pre=take(self.image_pre, "image", "image_features_pre"),
            text_pre=take(self.text_pre, "text", "text_features_pre"),
            captions=None if self.captions is None else [self.captions[t] for t in texts],
        )


def _tensor(values: np.ndarray | None, device: torch.device) -> torch.Tensor | None:
    """A float32 tensor on ``device``; on the CPU a writable float32 array is viewed, not copied."""
    if values is None:
        return None
    if values.flags.writeable and values.dtype == np.float32:
        return torch.from_numpy(values).to(device)
    return torch.tensor(values, dtype=torch.float32, device=device)


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
    if adapter_input not in ("raw", "unit"):
        raise ValueError(f"adapter_input must be 'raw' or 'unit', got {adapter_input!r}")
    device = torch.device(device)
    projection = {}
    if data.image_features_pre is not None or data.text_features_pre is not None:
        projection = tables.read_projection(root, data.manifest) or {}
    if adapter_input == "raw" and data.text_norms is None:
        logger.warning(
            f"{root}/{split}: the text table has no `norm` column; the adapter reads raw inputs "
            "(it was trained on embedding x norm) and gets the unit embeddings"
        )
    text = data.raw_text() if adapter_input == "raw" else data.text_matrix
    return SplitTensors(
        image_emb=_tensor(data.image_embeddings, device),
        text_emb=_tensor(text, device),
        text_to_image=torch.from_numpy(data.text_image_index).to(device),
        split=data,
        image_norm=_tensor(data.image_norms, device),
        image_pre=_tensor(data.image_features_pre, device),
        text_pre=_tensor(data.text_features_pre, device),
        image_projection=_tensor(projection.get("image"), device),
        text_projection=_tensor(projection.get("text"), device),
        captions=data.texts,
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
    rest, out = (data.subset(np.flatnonzero(k), np.flatnonzero(k[owner])) for k in (~held, held))
    return rest, out


class SplitCache:
    """Least-recently-used splits (:meth:`load`) and what is derived from them (:meth:`memo`),
    keyed by the tables' manifest too; at most ``max_entries``, ``hits``/``misses`` counted."""

    def __init__(self, max_entries: int = 6) -> None:
        self.max_entries = max_entries
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[tuple, Any] = OrderedDict()
        self._lock = threading.Lock()

    def memo(self, root: str, key: tuple, make: Callable[[], Any]) -> Any:
        """``make()`` once per (tables ``root`` and its manifest, ``key``)."""
        manifest = json.dumps(tables.read_manifest(root).to_dict(), sort_keys=True, default=str)
        key = (root, manifest, *key)
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                self.hits += 1
                return self._entries[key]
        value = make()
        with self._lock:
            self.misses += 1
            self._entries[key] = value
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return value

    def load(
        self, root: str, split: str, adapter_input: str = "raw", device: str | torch.device = "cpu"
    ) -> SplitTensors:
        """``load_split(root, split, adapter_input, device)``, read once per process."""
        device = torch.device(device)
        tables.check_split(root, split)  # a bad root or split: the message every command gives
        key = ("split", split, adapter_input, str(device))
        return self.memo(root, key, lambda: load_split(root, split, adapter_input, device))


#: The cache of this process (a Tune actor running one trial after another).
PROCESS_CACHE = SplitCache()
