"""Embedding splits on the device (:class:`SplitTensors`), the hold-out validation split and
the epoch's batch count."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

import numpy as np
import torch

from asymvlm import tables


@dataclass
class SplitTensors:
    """One split on the device: what training and evaluation consume.

    The optional tensors are None when the tables lack them: ``image_norm`` (the raw image
    projection norm, ``image_emb * image_norm`` is the unnormalised projection), the
    pre-projection features ``image_pre`` / ``text_pre`` and the frozen model's projection
    matrices ``image_projection`` [d, pre_dim.image] / ``text_projection`` (from
    ``ROOT/projection.npz``, loaded with the pre-projection features).
    """

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
        """Image rows ``images`` and caption rows ``texts`` (of those images), renumbered."""
        split = self.split.subset(images, texts)
        device = self.image_emb.device
        image_rows = torch.as_tensor(images, device=device)
        text_rows = torch.as_tensor(texts, device=device)
        return replace(
            self,
            image_emb=self.image_emb[image_rows],
            text_emb=self.text_emb[text_rows],
            text_to_image=torch.as_tensor(split.text_image_index, device=device),
            split=split,
            image_norm=_rows(self.image_norm, image_rows),
            image_pre=_rows(self.image_pre, image_rows),
            text_pre=_rows(self.text_pre, text_rows),
        )


def _rows(values: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor | None:
    return None if values is None else values[rows]


def _tensor(values: np.ndarray | None, device: torch.device) -> torch.Tensor | None:
    return None if values is None else torch.tensor(values, dtype=torch.float32, device=device)


def load_split(
    root: str, split: str, adapter_input: str = "raw", device: str | torch.device = "cpu"
) -> SplitTensors:
    """Read and validate ``ROOT/<split>`` and move it to ``device``.

    A split without images or without captions is a :class:`~asymvlm.tables.TableError`
    naming it (nothing can be trained or evaluated on it). The optional columns (image
    ``norm``, pre-projection features) are loaded when the tables have them, and with the
    pre-projection features the root's ``projection.npz`` (None where absent).
    """
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
    return SplitTensors(
        image_emb=torch.tensor(data.image_embeddings, dtype=torch.float32, device=device),
        text_emb=torch.tensor(data.text_inputs(adapter_input), dtype=torch.float32, device=device),
        text_to_image=torch.tensor(data.text_image_index, dtype=torch.long, device=device),
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
    rest, out = (data.subset(np.flatnonzero(keep), np.flatnonzero(keep[owner]))
                 for keep in (~held, held))  # fmt: skip
    return rest, out


def steps_per_epoch(n_items: int, batch_size: int) -> int:
    """Full batches per epoch; the ragged tail is dropped unless it is the only batch."""
    if n_items < 1 or batch_size < 1:
        raise ValueError(f"need at least one item and batch_size >= 1, got {n_items}, {batch_size}")
    return max(1, n_items // batch_size)
