"""Model names taken apart without loading anything (no torch): library, local files, open_clip."""

from __future__ import annotations

import os
from typing import NamedTuple

OPEN_CLIP_PREFIX = "open_clip:"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".npz")
_USAGE = (
    "use open_clip:ARCH/TAG (a pretrained tag, open_clip.list_pretrained()), open_clip:ARCH/path/"
    "to/weights, open_clip:hf-hub:org/repo or open_clip:local-dir:path/to/folder"
)


def looks_like_path(model: str) -> bool:
    """Whether a model name can only be a local folder (absolute, ./, ../ or ~)."""
    return os.path.isabs(model) or model.startswith(("./", "../", "~", ".\\", "..\\"))


def is_open_clip(model: str) -> bool:
    return str(model).startswith(OPEN_CLIP_PREFIX)


def local_source(model: str) -> str | None:
    """The local folder or weights file (absolute; it may not exist) a model name stands for,
    or None for names resolved elsewhere (hub ids, open_clip tags and ``hf-hub:`` repos)."""
    if is_open_clip(model):
        return parse_name(model).local
    path = os.path.expanduser(os.fspath(model))
    return os.path.abspath(path) if looks_like_path(model) or os.path.exists(path) else None


class OpenClipName(NamedTuple):
    """``name`` (canonical: local paths absolute), ``model_name`` and ``pretrained`` as
    ``open_clip.create_model`` takes them, and ``local`` (the files it reads, or None)."""

    name: str
    model_name: str
    pretrained: str | None
    local: str | None


def parse_name(model: str) -> OpenClipName:
    """Take an ``open_clip:...`` name apart (ValueError naming what is missing)."""
    if not is_open_clip(model):
        raise ValueError(f"{model!r} is not an open_clip model name ({OPEN_CLIP_PREFIX}...)")
    rest = model.removeprefix(OPEN_CLIP_PREFIX)
    kind, _, value = rest.partition(":")
    if kind in ("local-dir", "hf-hub") and not value:
        missing = "folder" if kind == "local-dir" else "repository"
        raise ValueError(f"{model!r} names no {missing}: {_USAGE}")
    if kind == "local-dir":
        local = os.path.abspath(os.path.expanduser(value))
        return OpenClipName(
            f"{OPEN_CLIP_PREFIX}local-dir:{local}", f"local-dir:{local}", None, local
        )
    if kind == "hf-hub":
        return OpenClipName(model, rest, None, None)
    arch, _, pretrained = rest.partition("/")
    if not arch:
        raise ValueError(f"{model!r} names no architecture: {_USAGE}")
    if not pretrained:
        raise ValueError(
            f"{model!r} names no weights (open_clip would initialise it randomly): {_USAGE}"
        )
    if (
        "/" in pretrained
        or looks_like_path(pretrained)
        or pretrained.endswith(_WEIGHT_SUFFIXES)
        or os.path.exists(pretrained)
    ):
        local = os.path.abspath(os.path.expanduser(pretrained))
        return OpenClipName(f"{OPEN_CLIP_PREFIX}{arch}/{local}", arch, local, local)
    return OpenClipName(model, arch, pretrained, None)
