"""Frozen vision-language encoders: images and captions to unit embeddings plus raw norms."""

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
