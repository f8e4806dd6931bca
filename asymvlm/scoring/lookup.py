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
        self._rows: dict[str, tuple[np.ndarray, float]] = {}
        for name in splits:
            split = read_split(root, name)
            norms = split.text_norms if split.text_norms is not None else [1.0] * len(split.texts)
            for text, unit, norm in zip(split.texts, split.text_embeddings, norms, strict=True):
                self._rows.setdefault(text, (unit, float(norm)))
            self.dim = int(split.manifest.dim)
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
        unit = np.asarray([self._rows[t][0] for t in texts], np.float32).reshape(-1, self.dim)
        return unit, np.asarray([self._rows[t][1] for t in texts], np.float32)

    def projections(self) -> dict[str, np.ndarray]:
        return {}
