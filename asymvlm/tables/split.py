"""One split in memory: :class:`EmbeddingSplit`, what :func:`~asymvlm.tables.read_split` returns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from asymvlm.tables.files import Manifest


@dataclass(eq=False)
class EmbeddingSplit:
    """Images, captions and their unit-norm embeddings; the text matrix is stored once, as the
    raw inputs after :meth:`raw_text` (:attr:`text_embeddings` then derives the unit rows)."""

    image_ids: list[str]
    image_embeddings: np.ndarray
    caption_ids: list[str]
    text_image_index: np.ndarray
    texts: Sequence[str]
    text_embeddings: np.ndarray
    text_norms: np.ndarray | None
    extra_text_columns: dict[str, np.ndarray]
    manifest: Manifest
    extra_image_columns: dict[str, np.ndarray] = field(default_factory=dict)
    image_norms: np.ndarray | None = None
    #: Pre-projection features ``[n, pre_dim.<modality>]`` (None when the column is absent).
    image_features_pre: np.ndarray | None = None
    text_features_pre: np.ndarray | None = None
    text_is_raw: bool = False
    #: The tables' :func:`~asymvlm.tables.files.fingerprint` (None for a split made in memory).
    fingerprint: str | None = None

    @property
    def n_images(self) -> int:
        return len(self.image_ids)

    @property
    def n_texts(self) -> int:
        return len(self.caption_ids)

    @property
    def text_matrix(self) -> np.ndarray:
        """The text matrix as stored: unit rows, or the raw inputs when :attr:`text_is_raw`."""
        return self.__dict__["_text"]

    def subset(self, images: np.ndarray, texts: np.ndarray) -> EmbeddingSplit:
        """Image rows ``images`` and caption rows ``texts`` (of those images), renumbered."""
        images, texts = np.asarray(images, dtype=np.int64), np.asarray(texts, dtype=np.int64)
        new_index = np.full(self.n_images, -1, dtype=np.int64)
        new_index[images] = np.arange(len(images))
        owner = new_index[self.text_image_index[texts]]
        if (owner < 0).any():
            raise ValueError("subset: some captions belong to images left out")

        def rows(values: np.ndarray | None, at: np.ndarray) -> np.ndarray | None:
            return None if values is None else values[at]

        return replace(
            self,
            image_ids=[self.image_ids[i] for i in images],
            image_embeddings=self.image_embeddings[images],
            caption_ids=[self.caption_ids[t] for t in texts],
            text_image_index=owner,
            texts=[self.texts[t] for t in texts],
            text_embeddings=self.text_matrix[texts],
            text_norms=rows(self.text_norms, texts),
            extra_text_columns={k: v[texts] for k, v in self.extra_text_columns.items()},
            extra_image_columns={k: v[images] for k, v in self.extra_image_columns.items()},
            image_norms=rows(self.image_norms, images),
            image_features_pre=rows(self.image_features_pre, images),
            text_features_pre=rows(self.text_features_pre, texts),
        )

    def raw_text(self) -> np.ndarray:
        """The raw text inputs ``embedding * norm`` (the official AsymVLM adapter input), made
        once in place of the unit matrix; without a ``norm`` column the unit rows."""
        if self.text_norms is None:
            return self.text_matrix
        if not self.text_is_raw:
            matrix = self.text_matrix
            if not matrix.flags.writeable or matrix.dtype != np.float32:
                matrix = self.__dict__["_text"] = np.array(matrix, np.float32)
            np.multiply(matrix, self.text_norms[:, None], out=matrix)
            self.text_is_raw = True
        return self.text_matrix


def _unit_text(self: EmbeddingSplit) -> np.ndarray:
    if not self.text_is_raw:
        return self.text_matrix
    return (self.text_matrix / self.text_norms[:, None]).astype(np.float32, copy=False)


def _store_text(self: EmbeddingSplit, value: np.ndarray) -> None:
    self.__dict__["_text"] = value
    self.text_is_raw = False


# The constructor's ``text_embeddings`` is stored as the text matrix; read, it is the unit rows.
EmbeddingSplit.text_embeddings = property(_unit_text, _store_text)  # type: ignore[assignment]
