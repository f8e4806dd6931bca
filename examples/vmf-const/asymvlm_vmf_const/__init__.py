"""Two ablations of AsymVLM's vMF, as a plugin: ``vmf-const`` (one learned kappa shared by all
captions: does per-caption uncertainty matter?) and ``vmf-linear`` (a linear text adapter)."""

from __future__ import annotations

import math

import torch
from torch import nn

from asymvlm.methods import Encoding, Roles
from asymvlm.methods.asymvlm import AsymVLM


class VMFConst(AsymVLM):
    """Text ~ vMF(mu(t), kappa): the adapter gives the direction, one kappa serves every caption."""

    uncertainty_doc = "1/kappa, one learned kappa for every caption (a constant)"
    roles = Roles(ablation_of="asymvlm-vmf")

    def __init__(self, dim: int, init_kappa: float = 0.0, **kwargs) -> None:
        super().__init__(dim, **kwargs)
        kappa = init_kappa if init_kappa > 0 else float(dim)  # 0: the embedding width
        self.log_kappa = nn.Parameter(torch.tensor(math.log(kappa)))

    def encode(self, side: str, x: torch.Tensor) -> Encoding:
        enc = super().encode(side, x)
        if side == "text":
            enc["kappa"] = torch.ones_like(enc["kappa"]) * self.log_kappa.exp()
        return enc


class VMFLinear(AsymVLM):
    """AsymVLM's vMF with a linear text adapter (``depth`` 0) instead of the MLP."""

    uncertainty_doc = "1/kappa of the caption's vMF, kappa from a linear map"

    def __init__(self, dim: int, depth: int = 0, **kwargs) -> None:
        super().__init__(dim, depth=depth, **kwargs)
