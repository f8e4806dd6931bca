"""Deterministic references: ``clip`` (the frozen model's cosine, nothing to train) and
``determ-ft`` (the text adapter MLP without kappa, InfoNCE on tau * cos; Tables 2-3)."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from asymvlm.methods.base import Adapter, Encoding, Init, Method, Roles, info_nce, unit


class FrozenCLIP(Method):
    """The frozen VLM: cosine scores, nothing to train, no uncertainty."""

    trainable = False
    roles = Roles(uncertainty=False)

    def __init__(self, dim: int, **adapter_kwargs: object) -> None:
        """Adapter sizes (``hidden_dim``, ``depth``) are accepted and ignored."""
        super().__init__(dim)


class DeterministicFT(Method):
    """Deterministic fine-tuning of the text side with the adapter of App. B.1."""

    roles = Roles(uncertainty=False)
    PROTOCOL_KWARGS: ClassVar[dict[str, dict]] = {
        "official": {"init": "default", "calibrate_input": False},
    }

    def __init__(
        self,
        dim: int,
        hidden_dim: int = 1024,
        depth: int = 3,
        init_temperature: float = 1 / 0.07,
        calibrate_input: bool = True,
        init: Init = "he",
    ) -> None:
        super().__init__(dim)
        self.calibrate_input = calibrate_input
        self.text_adapter = Adapter(dim, dim, hidden_dim, depth, init)
        self.temperature = nn.Parameter(torch.tensor(float(init_temperature)))

    def encode_texts(self, text_emb: torch.Tensor) -> Encoding:
        return {"mu": unit(self.text_adapter(text_emb))}

    def pair_loss(self, images: Encoding, texts: Encoding, *, epoch: int = 0) -> torch.Tensor:
        return info_nce((self.temperature * texts["mu"]) @ images["mu"].T)
