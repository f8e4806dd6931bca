"""An encoder for tables that have none (the synthetic worlds): :class:`TableEncoder` looks
captions up by their text, so :class:`~asymvlm.Scorer` scores them with the numbers ``asymvlm
score`` gives for the same rows."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import numpy as np
import torch

from asymvlm.scoring.scorer import ScoringInputError
from asymvlm.tables import read_split

__all__ = ["TableEncoder"]


class TableEncoder:
    """Captions' (unit embedding, raw norm) looked up by text in ``splits`` of the tables at
    ``root`` (first row wins); a caption not there is a :class:`ScoringInputError`."""

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
        self.dim = int(dim)
        self.device = torch.device(device)
        self.info = SimpleNamespace(model=f"tables:{root}")

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
            return np.zeros((0, self.dim), np.float32), np.zeros(0, np.float32)
        unit = np.stack([self._rows[t][0] for t in texts]).astype(np.float32)
        norm = np.asarray([self._rows[t][1] for t in texts], np.float32)
        return unit, norm

    def projections(self) -> dict[str, np.ndarray]:
        """None: no pre-projection features."""
        return {}

    def preprocess_images(self, images: list) -> None:
        raise ValueError("a TableEncoder embeds captions only, not images")
