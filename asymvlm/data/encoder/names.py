"""Model names without loading anything (no torch): which library a name belongs to, the local
files it stands for, and open_clip names taken apart (:func:`parse_name`)."""

from __future__ import annotations

import os
from dataclasses import dataclass

#: The prefix that names an open_clip model (``open_clip:ViT-B-32/laion2b_s34b_b79k``).
OPEN_CLIP_PREFIX = "open_clip:"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".npz")


def looks_like_path(model: str) -> bool:
    """Whether a model name can only be a local folder (absolute, ./, ../ or ~)."""
    return os.path.isabs(model) or model.startswith(("./", "../", "~", ".\\", "..\\"))


def is_open_clip(model: str) -> bool:
    """Whether ``model`` names an open_clip model (``open_clip:...``)."""
    return str(model).startswith(OPEN_CLIP_PREFIX)


def local_source(model: str) -> str | None:
    """The local folder or weights file a model name stands for (absolute, ``~`` expanded;
    it may not exist), or None for names resolved elsewhere (hub ids, open_clip's pretrained
    tags and ``hf-hub:`` repos)."""
    if is_open_clip(model):
        return parse_name(model).local
    path = os.path.expanduser(os.fspath(model))
    if looks_like_path(model) or os.path.exists(path):
        return os.path.abspath(path)
    return None


@dataclass(frozen=True)
class OpenClipName:
    """An ``open_clip:`` model name taken apart: ``name`` (canonical: local paths absolute),
    ``model_name`` and ``pretrained`` as ``open_clip.create_model`` takes them, and ``local``
    (the folder or weights file it reads, or None)."""

    name: str
    model_name: str
    pretrained: str | None
    local: str | None


def _absolute(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


def parse_name(model: str) -> OpenClipName:
    """Take an ``open_clip:...`` name apart (ValueError naming what is missing)."""
    if not model.startswith(OPEN_CLIP_PREFIX):
        raise ValueError(f"{model!r} is not an open_clip model name ({OPEN_CLIP_PREFIX}...)")
    rest = model[len(OPEN_CLIP_PREFIX) :]
    usage = (
        "use open_clip:ARCH/TAG (a pretrained tag, open_clip.list_pretrained()), "
        "open_clip:ARCH/path/to/weights, open_clip:hf-hub:org/repo or "
        "open_clip:local-dir:path/to/folder"
    )
    if rest.startswith("local-dir:"):
        path = rest[len("local-dir:") :]
        if not path:
            raise ValueError(f"{model!r} names no folder: {usage}")
        local = _absolute(path)
        name = f"local-dir:{local}"
        return OpenClipName(OPEN_CLIP_PREFIX + name, name, None, local)
    if rest.startswith("hf-hub:"):
        if not rest[len("hf-hub:") :]:
            raise ValueError(f"{model!r} names no repository: {usage}")
        return OpenClipName(model, rest, None, None)
    arch, _, pretrained = rest.partition("/")
    if not arch:
        raise ValueError(f"{model!r} names no architecture: {usage}")
    if not pretrained:
        raise ValueError(
            f"{model!r} names no weights (open_clip would initialise it randomly): {usage}"
        )
    is_file = (
        "/" in pretrained
        or looks_like_path(pretrained)
        or pretrained.endswith(_WEIGHT_SUFFIXES)
        or os.path.exists(pretrained)
    )
    if is_file:
        local = _absolute(pretrained)
        return OpenClipName(f"{OPEN_CLIP_PREFIX}{arch}/{local}", arch, local, local)
    return OpenClipName(model, arch, pretrained, None)
