"""ELIP (evidential retrieval) on cached embeddings: residual adapters on both modalities,
Dirichlet evidence e = exp(tau * cos) over a gallery, the evidential loss (ELIP Eq. 6-10) and
u = K / S (Eq. 4). The authors' code has no ELIP; ``official`` only uses the default init."""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import nn
from torch.distributions import Dirichlet, kl_divergence

from asymvlm.methods.base import Encoding, Init, Method, mlp, unit

MAX_EVIDENCE_LOGIT = 30.0  # cap on tau * cos before exp (e^30 ~ 1e13): overflow safety only


def dirichlet_alpha(cos: torch.Tensor, tau: torch.Tensor | float) -> torch.Tensor:
    """alpha = e + 1, evidence e = exp(tau * cos) (ELIP Eq. 6)."""
    return torch.exp((tau * cos).clamp(max=MAX_EVIDENCE_LOGIT)) + 1.0


def evidential_uncertainty(alpha: torch.Tensor) -> torch.Tensor:
    """Subjective-logic uncertainty mass u = K / S, S = sum_j alpha_j (ELIP Eq. 4), per row."""
    return alpha.shape[-1] / alpha.sum(-1)


def bayes_risk(alpha: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """sum_j y_j (digamma(S) - digamma(alpha_j)) per row (ELIP Eq. 8)."""
    strength = alpha.sum(-1, keepdim=True)
    return (y * (torch.digamma(strength) - torch.digamma(alpha))).sum(-1)


def misleading_evidence_kl(alpha: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """KL(Dir(alpha~) || Dir(1, ..., 1)) per row, alpha~ = y + (1 - y) alpha (ELIP Eq. 9)."""
    alpha_tilde = y + (1.0 - y) * alpha
    return kl_divergence(Dirichlet(alpha_tilde), Dirichlet(torch.ones_like(alpha_tilde)))


def evidential_loss(alpha: torch.Tensor, y: torch.Tensor, kl_weight: float) -> torch.Tensor:
    """Mean over query rows of Bayes risk + lambda_t * KL (ELIP Eq. 8-9), one direction."""
    risk = bayes_risk(alpha, y)
    if kl_weight:
        risk = risk + kl_weight * misleading_evidence_kl(alpha, y)
    return risk.mean()


class ELIP(Method):
    """ELIP on cached embeddings: residual adapters x' = unit(x + mlp(x)) for both modalities.

    The last layer starts at zero (the frozen model), tau = exp(ln tau) from 10, loss 1/2 (L_i2t +
    L_t2i) (Eq. 10). Uncertainty: u = K / S over a fixed gallery of K training items of the other
    modality, drawn in ``fit_start``."""

    uncertainty_doc = "K / S over a fixed gallery of K items (ELIP Eq. 4), both modalities"
    PROTOCOL_KWARGS: ClassVar[dict[str, dict]] = {"official": {"init": "default"}}
    FITTED_BUFFERS = ("gallery_images", "gallery_texts")

    def __init__(
        self,
        dim: int,
        hidden_dim: int = 1024,
        depth: int = 3,
        init_temperature: float = 10.0,
        gallery_size: int = 1000,
        init: Init = "he",
    ) -> None:
        super().__init__(dim)
        self.image_adapter = mlp(dim, dim, hidden_dim, depth, init)
        self.text_adapter = mlp(dim, dim, hidden_dim, depth, init)
        for adapter in (self.image_adapter, self.text_adapter):
            nn.init.zeros_(adapter[-1].weight)
            nn.init.zeros_(adapter[-1].bias)
        self.log_temperature = nn.Parameter(torch.tensor(math.log(init_temperature)))
        self.gallery_size = gallery_size
        for name in self.FITTED_BUFFERS:
            self.register_buffer(name, torch.empty(0, dim), persistent=True)

    @property
    def temperature(self) -> torch.Tensor:
        return self.log_temperature.exp()

    def encode(self, side: str, x: torch.Tensor) -> Encoding:
        return {"mu": unit(x + getattr(self, f"{side}_adapter")(x))}

    def fit_start(self, image_emb: torch.Tensor, text_emb: torch.Tensor) -> None:
        """Draw the fixed reference galleries (raw embeddings, adapted when used)."""
        for name, emb in zip(self.FITTED_BUFFERS, (image_emb, text_emb), strict=True):
            idx = torch.randperm(emb.shape[0], device=emb.device)[: self.gallery_size]
            buf = getattr(self, name)
            setattr(self, name, emb[idx].detach().to(device=buf.device, dtype=buf.dtype).clone())

    def _evidential_u(self, items: Encoding, other: str) -> torch.Tensor:
        """u = K / S of ``items`` over the adapted gallery of the ``other`` side (ELIP Eq. 4)."""
        rows = getattr(self, f"gallery_{other}s")
        if rows.shape[0] == 0:
            raise RuntimeError(
                "ELIP's uncertainty needs a reference gallery: call fit_start(image_emb, "
                "text_emb) with the training set first (or load a state dict that has one)"
            )
        cos = items["mu"] @ self.encode(other, rows)["mu"].T
        return evidential_uncertainty(dirichlet_alpha(cos, self.temperature))

    def text_uncertainty_from(self, texts: Encoding) -> torch.Tensor:
        return self._evidential_u(texts, "image")

    def image_uncertainty_from(self, images: Encoding) -> torch.Tensor:
        return self._evidential_u(images, "text")

    def kl_weight(self, epoch: int) -> float:
        """lambda_t = min(1, t / 15) (ELIP Eq. 9)."""
        return min(1.0, epoch / 15)

    def pair_loss(self, images: Encoding, texts: Encoding, *, epoch: int = 0) -> torch.Tensor:
        cos = images["mu"] @ texts["mu"].T
        alpha = dirichlet_alpha(cos, self.temperature)  # rows: image queries
        y = torch.eye(cos.shape[0], dtype=cos.dtype, device=cos.device)
        lam = self.kl_weight(epoch)
        return 0.5 * (evidential_loss(alpha, y, lam) + evidential_loss(alpha.T, y, lam))
