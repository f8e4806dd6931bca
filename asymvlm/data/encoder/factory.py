"""The encoder a model name belongs to: :func:`load_encoder`."""

from __future__ import annotations

from typing import Any

from asymvlm.data.encoder.base import Encoder
from asymvlm.data.encoder.names import is_open_clip

__all__ = ["load_encoder"]


def load_encoder(model: str = "openai/clip-vit-base-patch32", *args: Any, **kwargs: Any) -> Encoder:
    """The frozen encoder ``model`` names: ``open_clip:...`` an open_clip model, anything else a
    transformers CLIP / SigLIP hub id or folder (only that library is imported)."""
    if is_open_clip(model):
        from asymvlm.data.encoder.openclip import OpenClipEncoder

        return OpenClipEncoder(model, *args, **kwargs)
    from asymvlm.data.encoder.hf import TransformersEncoder

    return TransformersEncoder(model, *args, **kwargs)
