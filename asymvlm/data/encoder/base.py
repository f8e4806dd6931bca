"""What every frozen encoder shares: the provenance record, the name -> library dispatch, device
and precision names, and the (unit embedding, raw norm) split of a projection."""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

_HASHED_SUFFIXES = (".safetensors", ".bin", ".json", ".txt", ".model", ".tiktoken", ".pt", ".pth")
_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


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
            name
            for name in os.listdir(folder)
            if not name.startswith(".")
            and name.endswith(_HASHED_SUFFIXES)
            and os.path.isfile(os.path.join(folder, name))
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


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    try:
        return _DTYPES[dtype.lower()]
    except KeyError:
        raise ValueError(
            f"Unknown dtype {dtype!r}; use 'auto' or one of {sorted(_DTYPES)}"
        ) from None


def unit_and_norm(projected: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """A projection [n, d] as (unit embeddings float32 [n, d], raw norms float32 [n])."""
    projected = projected.float()
    norms = torch.linalg.vector_norm(projected, dim=-1)
    unit = projected / norms.clamp_min(torch.finfo(torch.float32).tiny).unsqueeze(-1)
    return unit.cpu().numpy(), norms.cpu().numpy()


class Encoder:
    """A frozen vision-language model: images / captions to unit embeddings + raw norms
    (``preprocess_images``, ``encode_pixels``, ``tokenize``, ``token_lengths``,
    ``encode_texts``); transformers CLIP also gives BayesVLM's pre-projection features."""

    info: EncoderInfo
    model: Any
    model_name: str

    @property
    def dim(self) -> int:
        return self.info.dim

    def token_lengths(self, texts: list[str]) -> list[int]:
        """Token count of each caption, truncated as encoded."""
        raise NotImplementedError

    def pre_dims(self) -> dict[str, int]:
        raise ValueError(
            f"pre-projection features are written for transformers CLIP models only, not "
            f"{self.info.family} ({self.model_name!r})"
        )

    def projections(self) -> dict[str, np.ndarray]:
        self.pre_dims()
        raise AssertionError("unreachable")

    def _require_model(self):
        if self.model is None:
            raise RuntimeError(
                f"Encoder for {self.model_name!r} was built with load_model=False: "
                "it can preprocess but not encode"
            )
        return self.model

    def _empty(self, pre: str | None = None) -> tuple[np.ndarray, ...]:
        empty = (np.zeros((0, self.dim), dtype=np.float32), np.zeros((0,), dtype=np.float32))
        if pre is None:
            return empty
        return (*empty, np.zeros((0, self.pre_dims()[pre]), dtype=np.float32))

    def __repr__(self) -> str:
        i = self.info
        return f"Encoder({i.model!r}, family={i.family}, dim={i.dim}, {i.dtype} on {i.device})"
