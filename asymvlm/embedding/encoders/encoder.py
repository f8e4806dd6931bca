"""What every frozen encoder shares: provenance, device and precision, unit and raw norm."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

_HASHED_SUFFIXES = (".safetensors", ".bin", ".json", ".txt", ".model", ".tiktoken", ".pt", ".pth")
#: Precision names (the config's and torch's spellings).
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
DTYPES |= {str(t).removeprefix("torch."): t for t in list(DTYPES.values())}


def files_sha256(location: str | os.PathLike) -> str:
    """SHA-256 over (name, length, bytes) of a weights file or of a model folder's top-level
    weight/config/tokenizer files, sorted by name."""
    path = Path(location)
    if path.is_file():
        files = [path]
    else:
        hashed = (f for f in path.iterdir() if f.name.endswith(_HASHED_SUFFIXES) and f.is_file())
        files = sorted(f for f in hashed if not f.name.startswith("."))
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode("utf-8") + b"\0" + file.stat().st_size.to_bytes(8, "little"))
        with file.open("rb") as handle:
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
    """A frozen vision-language model (pixels and captions -> unit embeddings and raw norms);
    ``load_model=False`` builds a preprocessing-only one."""

    info: SimpleNamespace
    model: Any
    image_size: int
    max_text_length: int

    def __init__(self, device: str, dtype: str) -> None:
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        if dtype == "auto":
            cuda = self.device.type == "cuda"
            dtype = ("bf16" if torch.cuda.is_bf16_supported() else "fp16") if cuda else "fp32"
        if dtype.lower() not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; use 'auto' or one of {sorted(DTYPES)}")
        self.dtype = DTYPES[dtype.lower()]

    @property
    def dim(self) -> int:
        return self.info.dim

    def _info(self, **provenance: Any) -> SimpleNamespace:
        """The embeddings' provenance, stored beside the tables: ``provenance`` (model, family,
        dim, revision, files_sha256, preprocessing), the dtype and the device."""
        dtype = str(self.dtype).removeprefix("torch.")
        return SimpleNamespace(**provenance, dtype=dtype, device=str(self.device))

    def pre_dims(self) -> dict[str, int]:
        """Widths of the pre-projection features (transformers CLIP only)."""
        raise ValueError(
            "pre-projection features are written for transformers CLIP models only, not "
            f"{self.info.family} ({self.info.model!r})"
        )

    def projections(self) -> dict[str, np.ndarray]:
        return self.pre_dims()  # raises

    def _run(self, kind: str, inputs: Any, pre: bool) -> tuple[np.ndarray, ...]:
        if self.model is None:
            raise RuntimeError(
                f"the encoder of {self.info.model!r} was built with load_model=False: "
                "it can preprocess but not encode"
            )
        width = self.pre_dims()[kind] if pre else None
        if not len(inputs):
            out = (np.zeros((0, self.dim), np.float32), np.zeros(0, np.float32))
            return out if width is None else (*out, np.zeros((0, width), np.float32))
        with torch.inference_mode():
            return getattr(self, f"_{kind}")(inputs, pre)

    def encode_pixels(self, pixel_values: np.ndarray, pre: bool = False) -> tuple[np.ndarray, ...]:
        """Pixels [n, 3, H, W] to (unit embeddings float32 [n, d], raw norms [n]); with ``pre``
        also the pre-projection features float32 [n, pre_dims.image]."""
        pixels = torch.as_tensor(np.asarray(pixel_values), dtype=self.dtype, device=self.device)
        return self._run("image", pixels, pre)

    def encode_texts(self, texts: list[str], pre: bool = False) -> tuple[np.ndarray, ...]:
        """Captions to (unit embeddings float32 [n, d], raw norms [n]); with ``pre`` also the
        pre-projection features float32 [n, pre_dims.text]."""
        return self._run("text", [str(t) for t in texts], pre)

    def preprocess_images(self, images: list) -> np.ndarray:
        """PIL images to float32 pixels [n, 3, H, W] with the model's own transform (CPU)."""
        if not images:
            return np.zeros((0, 3, self.image_size, self.image_size), np.float32)
        return np.ascontiguousarray(self._preprocess(list(images)), dtype=np.float32)

    def token_lengths(self, texts: list[str]) -> list[int]:
        """Token count of each caption, truncated as encoded."""
        return [self.max_text_length] * len(texts)
