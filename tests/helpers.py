"""Small data makers shared by the tests."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import numpy as np
import pytest
import torch

from asymvlm import tables
from asymvlm.methods.asymvlm import AsymVLM, spherical_head
from asymvlm.methods.base import unit
from asymvlm.splits import SplitTensors, load_split

#: A line a library wrote to the console: a level word, a timestamp, a Ray worker's prefix, a C++
#: log line (ours are bare, or start "warning: " / "error: ").
_LIBRARY_LINE = re.compile(
    r"\b(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b|^\s*\[?\d{4}[-/]\d\d[-/]\d\d|\(\w*\s?pid=\d+|"
    r"\.(cc|h):\d+\]?:|Traceback|Warning:"
)


def library_lines(console: str) -> list[str]:
    """The lines of ``console`` that a library wrote (which belong in the log file)."""
    return [line for line in console.splitlines() if _LIBRARY_LINE.search(line)]


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rotated_pairs(
    n: int = 64, d: int = 16, seed: int = 0, noise: float = 0.1, scale: float = 5.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit images and RAW texts: scale * (a fixed rotation of the image + noise)."""
    g = torch.Generator().manual_seed(seed)
    img = unit(torch.randn(n, d, generator=g))
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=g))
    txt = img @ q.T + noise * torch.randn(n, d, generator=g)
    return img, scale * txt


def _find_hierarcaps() -> Path | None:
    """The read-only HierarCaps copy (see :func:`asymvlm.data.demo_sets.find_hierarcaps`)."""
    from asymvlm.data.demo_sets import find_hierarcaps

    found = find_hierarcaps()
    return Path(found) if found else None


#: Folder with hierarcaps_test.csv and images/ (None when the shared data is not present).
HIERARCAPS = _find_hierarcaps()
requires_hierarcaps = pytest.mark.skipif(
    HIERARCAPS is None, reason="real HierarCaps data not found (../shared/data/hierarcaps)"
)


def hierarcaps_subset(folder: Path, n: int = 6) -> tuple[str, str]:
    """The first ``n`` HierarCaps hierarchies and their images in ``folder``: (csv, images)."""
    import shutil

    folder = Path(folder)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    lines = (HIERARCAPS / "hierarcaps_test.csv").read_text().splitlines()[: n + 1]
    (folder / "hierarcaps_test.csv").write_text("\n".join(lines) + "\n")
    for line in lines[1:]:
        name = line.rsplit("/", 1)[1]
        shutil.copy(HIERARCAPS / "images" / name, folder / "images" / name)
    return str(folder / "hierarcaps_test.csv"), str(folder / "images")


def tiny_encoders(folder: Path) -> dict[str, str]:
    """Tiny random CLIP, SigLIP and open_clip models under ``folder``: family -> model name."""
    from asymvlm.data.tiny import save_tiny_clip, save_tiny_open_clip, save_tiny_siglip

    return {
        "clip": save_tiny_clip(str(folder / "clip")),
        "siglip": save_tiny_siglip(str(folder / "siglip")),
        "open_clip": save_tiny_open_clip(str(folder / "open_clip")),
    }


class IdentityVMF(AsymVLM):
    """AsymVLM whose adapter is the identity: eta = the prompt feature (kappa = its norm)."""

    def encode_texts(self, text_emb: torch.Tensor):
        return spherical_head(text_emb)


def write_hierarchies(root: str, kappas: np.ndarray, dim: int = 8) -> None:
    """One image per row of ``kappas``; caption (image i, level l) points at image i with
    concentration kappas[i, l] and has l + 1 words."""
    rng = np.random.default_rng(0)
    images = rng.standard_normal((len(kappas), dim))
    images /= np.linalg.norm(images, axis=1, keepdims=True)
    ids = [f"img{i}" for i in range(len(kappas))]
    caps = [(i, level) for i in range(len(kappas)) for level in range(4)]
    texts = images[[i for i, _ in caps]] + 0.05 * rng.standard_normal((len(caps), dim))
    texts /= np.linalg.norm(texts, axis=1, keepdims=True)
    tables.write_manifest(root, {"dim": dim, "model": "hand-built"})
    tables.write_split(
        root,
        "test",
        image_ids=ids,
        image_embeddings=images,
        caption_ids=[f"c{i}-{level}" for i, level in caps],
        caption_image_ids=[ids[i] for i, _ in caps],
        texts=[" ".join(["word"] * (level + 1)) for _, level in caps],
        text_embeddings=texts,
        text_norms=np.array([kappas[i, level] for i, level in caps]),
        extra_text_columns={"level": np.array([level for _, level in caps])},
    )


def write_perturbed_pair(
    folder: Path, noise: float, kappa_scale: float = 1.0
) -> tuple[SplitTensors, SplitTensors]:
    """Tables ``clean`` and a caption-perturbed copy ``typos`` (noisier directions, kappa scaled
    by ``kappa_scale``) in ``folder``, and their test splits."""
    rng = np.random.default_rng(0)
    n, d = 40, 16
    images = rng.standard_normal((n, d))
    images /= np.linalg.norm(images, axis=1, keepdims=True)
    ids = [f"i{k}" for k in range(n)]
    for name, eps, scale in (("clean", 0.05, 1.0), ("typos", noise, kappa_scale)):
        texts = images + eps * rng.standard_normal((n, d))
        texts /= np.linalg.norm(texts, axis=1, keepdims=True)
        root = str(folder / name)
        tables.write_manifest(root, {"dim": d, "model": "hand-built"})
        captions = dict(caption_ids=[f"c{k}" for k in range(n)], caption_image_ids=ids)
        text = dict(texts=["x"] * n, text_embeddings=texts, text_norms=np.full(n, 20.0 * scale))
        tables.write_split(root, "test", image_ids=ids, image_embeddings=images, **captions, **text)
    return load_split(str(folder / "clean"), "test"), load_split(str(folder / "typos"), "test")
