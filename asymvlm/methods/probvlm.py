"""ProbVLM (Upadhyay et al. 2023) on cached frozen embeddings (paper Sec. 5, App. B.3): a BayesCap
adapter per modality predicts GGD(mu_hat, alpha, beta) per dimension, retrieval is the cosine of
the mean heads; ``official`` vs ``improved``: docs/protocols.md."""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import nn
from torch.nn import functional as F

from asymvlm.methods.base import Encoding, Init, Method, mlp, unit

INV_ALPHA_RANGE = (1e-4, 1e4)  # of 1/alpha
BETA_RANGE = (1e-1, 1e2)  # beta >= 0.1 keeps the variance finite in float32
RATIO_RANGE = (1e-4, 1e3)  # of |x - mu| / alpha
_MAX_LOG_POWER = 30.0  # cap on beta ln(ratio) before exp: overflow safety only
OFFICIAL_EPS = 1e-4  # the port's constants: loss eps and the guards of its uncertainty
OFFICIAL_ALPHA_EPS, OFFICIAL_ALPHA_RANGE = 1e-5, (1e-4, 5.0)
OFFICIAL_BETA_SHIFT, OFFICIAL_BETA_RANGE = 0.1, (0.1, 5.0)


def ggd_nll(
    x: torch.Tensor, mu: torch.Tensor, inv_alpha: torch.Tensor, beta: torch.Tensor
) -> torch.Tensor:
    """-ln GGD(x; mu, alpha, beta) = (|x - mu| / alpha)^beta - ln beta + ln(2 alpha)
    + ln Gamma(1/beta) elementwise (ProbVLM supp. Eq. 5), the ratio clamped, the power capped."""
    ratio = ((x - mu).abs() * inv_alpha).clamp(*RATIO_RANGE)
    power = torch.exp((beta * torch.log(ratio)).clamp(max=_MAX_LOG_POWER))
    return power - torch.log(beta) - torch.log(inv_alpha) + math.log(2.0) + torch.lgamma(1 / beta)


def ggd_variance(inv_alpha: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """Elementwise variance of GGD(mu, alpha, beta): alpha^2 Gamma(3/beta) / Gamma(1/beta)."""
    log_var = -2.0 * torch.log(inv_alpha) + torch.lgamma(3 / beta) - torch.lgamma(1 / beta)
    return torch.exp(log_var)


def official_ggd_term(
    x: torch.Tensor, mu: torch.Tensor, inv_alpha: torch.Tensor, beta: torch.Tensor
) -> torch.Tensor:
    """The port's linearised GGD term: clamp(|x - mu| (1/alpha + eps)(beta + eps), 1e-4, 1e3)
    - ln(1/alpha + eps) + ln Gamma(1/(beta + eps)) - ln(beta + eps)."""
    r, b = inv_alpha + OFFICIAL_EPS, beta + OFFICIAL_EPS
    residual = ((x - mu).abs() * r * b).clamp(*RATIO_RANGE)
    return residual - torch.log(r) + torch.lgamma(1 / b) - torch.log(b)


def official_precision(inv_alpha: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """The port's "uncertainty", 1 / mean_d GGD variance (guarded alpha, beta): a precision."""
    alpha = (1.0 / (inv_alpha + OFFICIAL_ALPHA_EPS)).clamp(*OFFICIAL_ALPHA_RANGE)
    beta = (beta + OFFICIAL_BETA_SHIFT).clamp(*OFFICIAL_BETA_RANGE)
    return 1.0 / ggd_variance(1.0 / alpha, beta).mean(-1)


class BayesCapAdapter(nn.Module):
    """ProbVLM's BayesCap: h = x + mlp(x), then Linear-ReLU-Linear heads for mu_hat, 1/alpha and
    beta (softplus; ``floors`` enforces their ranges)."""

    def __init__(
        self, dim: int, hidden_dim: int, depth: int, init: Init = "he", floors: bool = True
    ) -> None:
        super().__init__()
        self.floors = floors
        self.backbone = mlp(dim, dim, hidden_dim, depth, init)
        self.mu_head = mlp(dim, dim, dim, 1, init)
        self.inv_alpha_head = mlp(dim, dim, dim, 1, init)
        self.beta_head = mlp(dim, dim, dim, 1, init)

    def forward(self, x: torch.Tensor) -> Encoding:
        h = x + self.backbone(x)
        mu_hat = self.mu_head(h)
        inv_alpha = F.softplus(self.inv_alpha_head(h))
        beta = F.softplus(self.beta_head(h))
        if self.floors:
            inv_alpha = (inv_alpha + INV_ALPHA_RANGE[0]).clamp(max=INV_ALPHA_RANGE[1])
            beta = (beta + BETA_RANGE[0]).clamp(max=BETA_RANGE[1])
        return {"mu_hat": mu_hat, "mu": unit(mu_hat), "inv_alpha": inv_alpha, "beta": beta}


class ProbVLM(Method):
    """ProbVLM: a BayesCap adapter per modality; GGD(mu_hat, alpha, beta) per dimension.

    Loss per modality: L1(mu_hat, z) + 0.05 mean GGD term on its own embedding plus
    ``cross_weight`` times that on the other modality's (supp. Eq. 5). Uncertainty: the mean
    GGD variance (``improved``) or the port's precision (``official``), both modalities."""

    uncertainty_doc = "mean GGD variance alpha^2 Gamma(3/beta)/Gamma(1/beta) over dims (both)"
    OFFICIAL_RAW_IMAGES = True
    PROTOCOL_KWARGS: ClassVar[dict[str, dict]] = {
        "official": {"depth": 2, "init": "default", "official": True},
    }

    def __init__(
        self,
        dim: int,
        hidden_dim: int = 1024,
        depth: int = 3,
        cross_weight: float = 1e-4,
        init: Init = "he",
        official: bool = False,
    ) -> None:
        super().__init__(dim)
        self.cross_weight = cross_weight
        self.official = official
        if official:
            self.uncertainty_doc = "1 / mean GGD variance (a precision: larger = more certain)"
        self.image_adapter = BayesCapAdapter(dim, hidden_dim, depth, init, floors=not official)
        self.text_adapter = BayesCapAdapter(dim, hidden_dim, depth, init, floors=not official)

    def encode(self, side: str, x: torch.Tensor) -> Encoding:
        return getattr(self, f"{side}_adapter")(x)

    def uncertainty_from(self, enc: Encoding) -> torch.Tensor:
        if self.official:
            return official_precision(enc["inv_alpha"], enc["beta"])
        return ggd_variance(enc["inv_alpha"], enc["beta"]).mean(-1)

    def loss_features(
        self, image_emb: torch.Tensor, text_emb: torch.Tensor
    ) -> tuple[Encoding, Encoding]:
        """The heads' outputs plus each frozen embedding ``z`` (the regression target)."""
        target = (lambda x: x) if self.official else unit
        img = {**self.encode_images(image_emb), "z": target(image_emb)}
        txt = {**self.encode_texts(text_emb), "z": target(text_emb)}
        return img, txt

    def criterion(self, enc: Encoding, target: torch.Tensor) -> torch.Tensor:
        """L1(mu_hat, z) + 0.05 mean GGD term of z (supp. Eq. 5), exact or the port's."""
        term = official_ggd_term if self.official else ggd_nll
        l1 = (enc["mu_hat"] - target).abs().mean()
        nll = term(target, enc["mu_hat"], enc["inv_alpha"], enc["beta"]).mean()
        return l1 + 5e-2 * nll

    def loss_terms(self, images: Encoding, texts: Encoding) -> dict[str, torch.Tensor]:
        """The criteria on own targets (``loss_i``, ``loss_t``) and cross-modal ones."""
        return {
            "loss_i": self.criterion(images, images["z"]),
            "loss_t": self.criterion(texts, texts["z"]),
            "loss_i4t": self.criterion(images, texts["z"]),
            "loss_t4i": self.criterion(texts, images["z"]),
        }

    def pair_loss(self, images: Encoding, texts: Encoding, *, epoch: int = 0) -> torch.Tensor:
        t = self.loss_terms(images, texts)
        return t["loss_i"] + t["loss_t"] + self.cross_weight * (t["loss_i4t"] + t["loss_t4i"])
