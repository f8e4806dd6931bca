"""Small data makers shared by the method tests."""

from __future__ import annotations

import torch

from asymvlm.methods.base import unit


def rotated_pairs(
    n: int = 64, d: int = 16, seed: int = 0, noise: float = 0.1, scale: float = 5.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit images and RAW texts: scale * (a fixed rotation of the image + noise)."""
    g = torch.Generator().manual_seed(seed)
    img = unit(torch.randn(n, d, generator=g))
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=g))
    txt = img @ q.T + noise * torch.randn(n, d, generator=g)
    return img, scale * txt
