"""What every frozen encoder shares: the provenance record, device and precision names, and the
(unit embedding, raw norm) split of a projection."""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

_HASHED_SUFFIXES = (".safetensors", ".bin", ".json", ".txt", ".model", ".tiktoken", ".pt", ".pth")
#: Precision names (the config's and torch's spellings).
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
DTYPES.update({str(t).removeprefix("torch."): t for t in list(DTYPES.values())})


@dataclass
class EncoderInfo:
    """Provenance of the embeddings an :class:`Encoder` produces (stored beside the tables)."""

    model: str
    revision: str | None
    files_sha256: str | None
    family: str
    dim: int
    dtype: str
    device: str
    preprocessing: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def files_sha256(location: str | os.PathLike) -> str:
    """SHA-256 over (name, length, bytes) of a weights file or of a model folder's top-level
    weight/config/tokenizer files, sorted by name."""
    location = os.fspath(location)
    if os.path.isfile(location):
        folder, names = os.path.dirname(location), [os.path.basename(location)]
    else:
        folder = location
        names = sorted(
            n
            for n in os.listdir(folder)
            if not n.startswith(".")
            and n.endswith(_HASHED_SUFFIXES)
            and os.path.isfile(os.path.join(folder, n))
        )
    digest = hashlib.sha256()
    for name in names:
        path = os.path.join(folder, name)
        digest.update(name.encode("utf-8") + b"\0")
        digest.update(os.path.getsize(path).to_bytes(8, "little"))
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def unit_and_norm(projected: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """A projection [n, d] as (unit embeddings float32 [n, d], raw norms float32 [n])."""
    projected = projected.float()
    norms = torch.linalg.vector_norm(projected, dim=-1)
    unit = projected / norms.clamp_min(torch.finfo(torch.float32).tiny).unsqueeze(-1)
    return unit.cpu().numpy(), norms.cpu().numpy()


class Encoder:
    """A frozen vision-language model: ``preprocess_images`` (PIL -> pixels, CPU),
    ``encode_pixels`` and ``encode_texts`` (-> unit embeddings, raw norms[, pre-projection
    features]), ``token_lengths``; ``load_model=False`` builds a preprocessing-only one."""

    info: EncoderInfo
    model: Any
    image_size: int
    max_text_length: int

    def __init__(self, device: str, dtype: str) -> None:
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        if dtype == "auto" and self.device.type == "cuda":
            dtype = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        try:
            self.dtype = DTYPES["fp32" if dtype == "auto" else dtype.lower()]
        except KeyError:
            raise ValueError(
                f"unknown dtype {dtype!r}; use 'auto' or one of {sorted(DTYPES)}"
            ) from None

    @property
    def dim(self) -> int:
        return self.info.dim

    def _info(self, model: str, family: str, dim: int, **kw: Any) -> EncoderInfo:
        dtype = str(self.dtype).removeprefix("torch.")
        return EncoderInfo(
            model, family=family, dim=dim, dtype=dtype, device=str(self.device), **kw
        )

    def pre_dims(self) -> dict[str, int]:
        """Widths of the pre-projection features (transformers CLIP only)."""
        raise ValueError(
            "pre-projection features are written for transformers CLIP models only, not "
            f"{self.info.family} ({self.info.model!r})"
        )

    def projections(self) -> dict[str, np.ndarray]:
        return self.pre_dims()  # raises

    def _net(self, pixels: Any = None) -> Any:
        """The model, ready for a batch (``pixels`` as a tensor on its device and in its dtype)."""
        if self.model is None:
            raise RuntimeError(
                f"the encoder of {self.info.model!r} was built with load_model=False: "
                "it can preprocess but not encode"
            )
        if pixels is None:
            return self.model
        return self.model, torch.as_tensor(np.asarray(pixels), dtype=self.dtype, device=self.device)

    def preprocess_images(self, images: list) -> np.ndarray:
        """PIL images to float32 pixels [n, 3, H, W] with the model's own transform (CPU)."""
        if not images:
            return np.zeros((0, 3, self.image_size, self.image_size), np.float32)
        return np.ascontiguousarray(self._preprocess(list(images)), dtype=np.float32)

    def _preprocess(self, images: list) -> Any:
        raise NotImplementedError

    def token_lengths(self, texts: list[str]) -> list[int]:
        """Token count of each caption, truncated as encoded."""
        return [self.max_text_length] * len(texts)

    def empty(self, pre: str | None = None) -> tuple[np.ndarray, ...]:
        """The outputs for no rows (with ``pre``: the ``"image"``/``"text"`` features too)."""
        out = (np.zeros((0, self.dim), np.float32), np.zeros(0, np.float32))
        return out if pre is None else (*out, np.zeros((0, self.pre_dims()[pre]), np.float32))
