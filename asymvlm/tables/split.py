"""One split in memory: :class:`EmbeddingSplit` (what :func:`~asymvlm.tables.read_split`
returns; see :mod:`asymvlm.tables` for the contract)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from asymvlm.tables.files import Manifest


@dataclass(eq=False)
class EmbeddingSplit:
    """One split read from the tables: images, captions and their unit-norm embeddings.

    The text matrix is stored once: the unit embeddings, or -- after
    ``text_inputs("raw", in_place=True)`` -- the raw adapter inputs ``embedding * norm`` in the
    same memory (:attr:`text_is_raw`); then :attr:`text_embeddings` is derived on access
    (``raw / norm``, a new array, equal to the stored unit rows within float32 rounding).
    """

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
    #: Raw image-projection norms (``embedding * norm`` is the unnormalised projection), as
    #: ``text_norms`` for captions; None when the image tables have no ``norm`` column.
    image_norms: np.ndarray | None = None
    #: Pre-projection features ``[n, pre_dim.<modality>]`` (None when the column is absent).
    image_features_pre: np.ndarray | None = None
    text_features_pre: np.ndarray | None = None
    _warned_no_norm: bool = field(default=False, init=False, repr=False)

    @property
    def n_images(self) -> int:
        return len(self.image_ids)

    @property
    def n_texts(self) -> int:
        return len(self.caption_ids)

    @property
    def text_is_raw(self) -> bool:
        """Whether the stored text matrix holds the raw inputs (``text_inputs('raw',
        in_place=True)``) rather than the unit embeddings."""
        return bool(self.__dict__.get("_raw_text", False))

    @property
    def text_matrix(self) -> np.ndarray:
        """The text matrix as stored (no copy): the unit embeddings, or the raw inputs when
        :attr:`text_is_raw`."""
        return self.__dict__["_text_matrix"]

    def subset(self, images: np.ndarray, texts: np.ndarray) -> EmbeddingSplit:
        """The split restricted to image rows ``images`` and caption rows ``texts`` (captions
        must belong to those images); caption-to-image indices are renumbered. A split that
        stores raw text inputs gives one that does too."""
        images, texts = np.asarray(images, dtype=np.int64), np.asarray(texts, dtype=np.int64)
        new_index = np.full(self.n_images, -1, dtype=np.int64)
        new_index[images] = np.arange(len(images))
        owner = new_index[self.text_image_index[texts]]
        if (owner < 0).any():
            raise ValueError("subset: some captions belong to images left out")
        out = EmbeddingSplit(
            image_ids=[self.image_ids[i] for i in images],
            image_embeddings=self.image_embeddings[images],
            caption_ids=[self.caption_ids[t] for t in texts],
            text_image_index=owner,
            texts=[self.texts[t] for t in texts],
            text_embeddings=self.text_matrix[texts],
            text_norms=None if self.text_norms is None else self.text_norms[texts],
            extra_text_columns={k: v[texts] for k, v in self.extra_text_columns.items()},
            manifest=self.manifest,
            extra_image_columns={k: v[images] for k, v in self.extra_image_columns.items()},
            image_norms=_rows(self.image_norms, images),
            image_features_pre=_rows(self.image_features_pre, images),
            text_features_pre=_rows(self.text_features_pre, texts),
        )
        out.__dict__["_raw_text"] = self.text_is_raw
        return out

    def text_inputs(self, adapter_input: str = "raw", *, in_place: bool = False) -> np.ndarray:
        """Text-side adapter input, ``[n_text, dim]`` float32.

        ``"raw"``: ``embedding * norm``, the unnormalised CLIP text projection (the official
        AsymVLM adapter input); without a ``norm`` column this warns once and falls back to the
        unit embeddings. ``"unit"``: the unit embeddings (the stored ones, not copied, unless the
        split stores the raw inputs).

        ``in_place=True`` (``"raw"``): multiply the stored unit matrix by the norms in place
        instead of making a new ``[n_text, dim]`` array, and keep the result as the split's
        text matrix (:attr:`text_is_raw`); later calls return it without a copy. The values are
        those of the copying call, bit for bit.
        """
        if adapter_input not in ("raw", "unit"):
            raise ValueError(f"adapter_input must be 'raw' or 'unit', got {adapter_input!r}")
        if adapter_input == "unit":
            return self.text_embeddings
        if self.text_norms is None:
            if not self._warned_no_norm:
                warnings.warn(
                    "text table has no `norm` column: adapter_input='raw' falls back to the "
                    "unit-norm text embeddings",
                    UserWarning,
                    stacklevel=2,
                )
                self._warned_no_norm = True
            return self.text_embeddings
        if self.text_is_raw:
            return self.text_matrix
        norms = self.text_norms[:, None]
        if not in_place:
            return (self.text_embeddings * norms).astype(np.float32, copy=False)
        matrix = self.text_matrix
        if matrix.dtype != np.float32 or not matrix.flags.writeable:
            matrix = (matrix * norms).astype(np.float32, copy=False)
        else:
            np.multiply(matrix, norms, out=matrix)
        self.__dict__["_text_matrix"] = matrix
        self.__dict__["_raw_text"] = True
        return matrix


def _get_text_embeddings(self: EmbeddingSplit) -> np.ndarray:
    matrix = self.__dict__["_text_matrix"]
    if not self.__dict__.get("_raw_text", False):
        return matrix
    assert self.text_norms is not None  # raw inputs are only stored with norms
    return (matrix / self.text_norms[:, None]).astype(np.float32, copy=False)


def _set_text_embeddings(self: EmbeddingSplit, value: np.ndarray) -> None:
    self.__dict__["_text_matrix"] = value
    self.__dict__["_raw_text"] = False


# The dataclass field ``text_embeddings`` (a constructor argument) is stored as the text matrix;
# reading it derives the unit rows when the split holds the raw inputs (class docstring).
EmbeddingSplit.text_embeddings = property(  # type: ignore[assignment,method-assign]
    _get_text_embeddings,
    _set_text_embeddings,
    doc="``[n_text, dim]`` float32 unit text embeddings (derived when :attr:`text_is_raw`).",
)


def _rows(values: np.ndarray | None, rows: np.ndarray) -> np.ndarray | None:
    return None if values is None else values[rows]
