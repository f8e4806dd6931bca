"""Frozen vision-language encoders: images and captions to unit embeddings plus raw norms."""

from __future__ import annotations

from typing import Any

from asymvlm.embedding.encoders.names import is_open_clip, local_source

__all__ = ["Encoder", "files_sha256", "load_encoder", "local_source"]


def load_encoder(model: str, device: str = "auto", dtype: str = "auto", **kwargs: Any):
    """The frozen :class:`Encoder` ``model`` names: ``open_clip:...`` an open_clip model, anything
    else a transformers CLIP / SigLIP hub id or folder (only that library is imported)."""
    if is_open_clip(model):
        from asymvlm.embedding.encoders.openclip import OpenClipEncoder as cls
    else:
        from asymvlm.embedding.encoders.hf import TransformersEncoder as cls
    return cls(model, device, dtype, **kwargs)


def __getattr__(name: str):  # torch is imported only when an encoder is wanted
    if name in ("Encoder", "files_sha256"):
        from asymvlm.embedding.encoders import encoder as base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
