"""Frozen vision-language encoders: images and captions to unit embeddings plus raw norms.

``load_encoder(model, device=..., dtype=...)`` builds the encoder for the library a name belongs to:
a transformers CLIP / SigLIP hub id or folder (:mod:`asymvlm.data.encoder.hf`) or an open_clip
model, ``open_clip:ARCH/TAG`` and friends (:mod:`asymvlm.data.encoder.openclip`). Both give the
same float32 outputs -- the unit embedding and the raw norm of the projection -- and record
their provenance (:class:`EncoderInfo`) for the tables' manifest. Names are read without torch
(:mod:`asymvlm.data.encoder.names`); the rest is imported on first use.
"""

from asymvlm.data.encoder.names import (
    OPEN_CLIP_PREFIX,
    is_open_clip,
    local_source,
    looks_like_path,
)

__all__ = [
    "FAMILIES",
    "OPEN_CLIP_PREFIX",
    "Encoder",
    "EncoderInfo",
    "files_sha256",
    "is_open_clip",
    "load_encoder",
    "local_source",
    "looks_like_path",
    "pre_projection_dims",
]
_LAZY = {
    "Encoder": "base",
    "EncoderInfo": "base",
    "files_sha256": "base",
    "load_encoder": "factory",
    "FAMILIES": "hf",
    "pre_projection_dims": "hf",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
