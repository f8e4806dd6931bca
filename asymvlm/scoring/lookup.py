"""An encoder for tables that have none: captions looked up by their text in embedding tables.

An adapter trained on tables without an encoder -- the synthetic worlds
(:mod:`asymvlm.synthetic`), embeddings computed elsewhere -- cannot embed a caption it has not
seen as text. :class:`TableEncoder` stands in for the frozen encoder wherever the captions'
embeddings are already in tables: each caption is looked up by its text, so
:class:`~asymvlm.Scorer` scores the captions of a held-out split (new to the adapter) with the
numbers ``asymvlm score`` gives for the same rows:

    >>> scorer = Scorer.from_pretrained(folder, encoder=TableEncoder(world))  # doctest: +SKIP
    >>> scorer.caption_uncertainty(["a photo of c3", "a photo of c3 / c17 / object 42"])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from asymvlm.scoring.scorer import ScoringInputError
from asymvlm.tables import read_split

__all__ = ["TableEncoder"]


@dataclass(frozen=True)
class _Info:
    """What the scorer asks of an encoder's description."""

    model: str


class TableEncoder:
    """Captions' embeddings (unit vector and raw norm) looked up by text in the splits
    ``splits`` of the tables at ``root`` (a caption that occurs several times takes its first
    row). Only captions: it embeds no images. A caption not in the tables is a
    :class:`~asymvlm.scoring.ScoringInputError` naming it."""

    def __init__(self, root: str, splits: Sequence[str] = ("test",), device: str = "cpu") -> None:
        rows: dict[str, tuple[np.ndarray, float]] = {}
        dim = None
        for name in splits:
            split = read_split(root, name)
            dim = split.manifest.dim
            norms = split.text_norms
            embeddings = split.text_embeddings
            for i, text in enumerate(split.texts):
                if text not in rows:
                    rows[text] = (embeddings[i], 1.0 if norms is None else float(norms[i]))
        if dim is None:
            raise ValueError("TableEncoder needs at least one split")
        self._rows = rows
        self._dim = int(dim)
        self.device = torch.device(device)
        self.info = _Info(model=f"tables:{root}")

    @property
    def dim(self) -> int:
        """The embedding width."""
        return self._dim

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, text: object) -> bool:
        return text in self._rows

    def captions(self) -> list[str]:
        """Every caption it can embed, in table order."""
        return list(self._rows)

    def encode_texts(self, texts: list[str], pre: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(unit embeddings [n, dim], raw norms [n]) of ``texts``, from the tables."""
        if pre:
            raise ValueError("a TableEncoder has no pre-projection features")
        for i, text in enumerate(texts):
            if text not in self._rows:
                raise ScoringInputError("caption", i, f"{text!r} is not in the tables")
        if not texts:
            return np.zeros((0, self._dim), np.float32), np.zeros(0, np.float32)
        unit = np.stack([self._rows[t][0] for t in texts]).astype(np.float32)
        norm = np.asarray([self._rows[t][1] for t in texts], np.float32)
        return unit, norm

    def projections(self) -> dict[str, np.ndarray]:
        """None: no pre-projection features."""
        return {}

    def preprocess_images(self, images: list) -> None:
        raise ValueError("a TableEncoder embeds captions only, not images")
