"""ProbVLM (Upadhyay et al. 2023), ported to cached frozen embeddings (paper Sec. 5, App. B.3).

Per modality a BayesCap adapter predicts a generalised Gaussian GGD(mu_hat, alpha, beta) per
dimension; retrieval is the cosine of the two mean heads.

Two protocols (README "Protocols"):

* ``official`` -- the authors' port exactly: a two-hidden-layer residual backbone, PyTorch's
  default init, raw heads (1/alpha = softplus, beta = softplus), the regression targets are the
  raw inputs, the GGD term is linearised and clamped (:func:`official_criterion`), and the
  uncertainty is what their evaluation sorts: 1 / mean GGD variance with their guards
  (:func:`official_precision`) -- a *precision*, so its bin 0 holds the least certain captions.
* ``improved`` -- the exact power (|x - mu|/alpha)^beta (:func:`ggd_nll`), unit targets, a
  three-hidden-layer backbone with He init, floors on 1/alpha and beta, and the mean GGD
  *variance* as uncertainty (higher = more uncertain, like every other method).
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import nn
from torch.nn import functional as F

from asymvlm.methods.base import Encoding, Init, Method, mlp, register, unit

#: Ranges for the GGD parameters (1/alpha and beta) and the residual ratio |x - mu| / alpha.
#: beta >= 0.1 (the official port's floor) keeps the variance finite in float32:
#: alpha^2 Gamma(3/beta)/Gamma(1/beta) <= 1e8 * Gamma(30)/Gamma(10) ~ 2.4e33.
INV_ALPHA_RANGE = (1e-4, 1e4)
BETA_RANGE = (1e-1, 1e2)
RATIO_RANGE = (1e-4, 1e3)
#: Cap on beta * log(ratio) before exponentiating (e^30 ~ 1e13): overflow safety only.
_MAX_LOG_POWER = 30.0

#: The official port's constants: eps on 1/alpha and beta in the loss, the clamp of its
#: linearised residual term, and the guards of its uncertainty.
OFFICIAL_EPS = 1e-4
OFFICIAL_RESIDUAL_RANGE = (1e-4, 1e3)
OFFICIAL_ALPHA_EPS = 1e-5
OFFICIAL_ALPHA_RANGE = (1e-4, 5.0)
OFFICIAL_BETA_SHIFT = 0.1
OFFICIAL_BETA_RANGE = (0.1, 5.0)


def ggd_nll(
    x: torch.Tensor, mu: torch.Tensor, inv_alpha: torch.Tensor, beta: torch.Tensor
) -> torch.Tensor:
    """Elementwise negative log-density of GGD(mu, alpha, beta) at x (ProbVLM supp. Eq. 5).

    -ln p = (|x - mu| / alpha)^beta - ln beta + ln(2 alpha) + ln Gamma(1/beta), with the ratio
    |x - mu| / alpha clamped to ``RATIO_RANGE`` and the power capped, so it never overflows
    (exact inside those ranges). ``inv_alpha`` is 1/alpha, as the ProbVLM heads predict it.
    """
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
    """The official port's per-element GGD term: its linearised stand-in for Eq. 5's NLL.

    clamp(|x - mu| (1/alpha + eps)(beta + eps), 1e-4, 1e3) - ln(1/alpha + eps)
    + ln Gamma(1/(beta + eps)) - ln(beta + eps), eps = 1e-4: the residual enters as
    beta |x - mu| / alpha instead of (|x - mu| / alpha)^beta, and ln 2 is dropped.
    """
    r, b = inv_alpha + OFFICIAL_EPS, beta + OFFICIAL_EPS
    residual = ((x - mu).abs() * r * b).clamp(*OFFICIAL_RESIDUAL_RANGE)
    return residual - torch.log(r) + torch.lgamma(1 / b) - torch.log(b)


def official_precision(inv_alpha: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """The official port's "uncertainty": 1 / mean_d GGD variance, with its guards.

    alpha = clamp(1 / (1/alpha + 1e-5), 1e-4, 5), beta' = clamp(beta + 0.1, 0.1, 5); returns
    1 / mean_d ggd_variance(1/alpha, beta') -- larger = *more certain*.
    """
    alpha = (1.0 / (inv_alpha + OFFICIAL_ALPHA_EPS)).clamp(*OFFICIAL_ALPHA_RANGE)
    beta = (beta + OFFICIAL_BETA_SHIFT).clamp(*OFFICIAL_BETA_RANGE)
    return 1.0 / ggd_variance(1.0 / alpha, beta).mean(-1)


class BayesCapAdapter(nn.Module):
    """ProbVLM's BayesCap MLP: residual backbone h = x + mlp(x), then three heads on h.

    The heads are Linear-ReLU-Linear of width d, as in the official BayesCap_MLP; 1/alpha and
    beta go through softplus. ``floors`` (protocol ``improved``) adds the lower end of their
    ranges and caps them above; without it the heads are raw softplus, as in the official port.
    """

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


def probvlm_criterion(
    enc: Encoding, target: torch.Tensor, l1_weight: float, nll_weight: float, official: bool
) -> torch.Tensor:
    """ProbVLM's criterion T1 * L1(mu_hat, z) + T2 * mean GGD term of z (supp. Eq. 5).

    The GGD term is the exact NLL (:func:`ggd_nll`) or the official port's linearised one
    (:func:`official_ggd_term`).
    """
    term = official_ggd_term if official else ggd_nll
    l1 = (enc["mu_hat"] - target).abs().mean()
    nll = term(target, enc["mu_hat"], enc["inv_alpha"], enc["beta"]).mean()
    return l1_weight * l1 + nll_weight * nll


@register("probvlm")
class ProbVLM(Method):
    """ProbVLM: a BayesCap adapter per modality; GGD(mu_hat, alpha, beta) per dimension.

    Loss (as the official code trains it): for each modality, T1 * L1(mu_hat, z) + T2 * GGD term
    of its own frozen embedding z, plus ``cross_weight`` times the same criterion with the
    other modality's embedding as the target (image head -> text embedding and vice versa,
    supp. Eq. 5); z is the unit embedding (``improved``) or the raw input (``official``). Score:
    cosine of unit(mu_hat_text) and unit(mu_hat_image). Uncertainty (both modalities): the mean
    GGD variance alpha^2 Gamma(3/beta)/Gamma(1/beta) over dimensions (``improved``), or the
    official port's precision (:func:`official_precision`, ``official``).
    """

    uncertainty_doc = "mean GGD variance alpha^2 Gamma(3/beta)/Gamma(1/beta) over dims (both)"
    OFFICIAL_RAW_IMAGES = True  # the backbone and the targets see the image norm
    PROTOCOL_KWARGS: ClassVar[dict[str, dict]] = {
        "official": {"depth": 2, "init": "default", "official": True},
    }

    def __init__(
        self,
        dim: int,
        hidden_dim: int = 1024,
        depth: int = 3,
        l1_weight: float = 1.0,
        nll_weight: float = 5e-2,
        cross_weight: float = 1e-4,
        init: Init = "he",
        official: bool = False,
    ) -> None:
        super().__init__(dim)
        self.l1_weight, self.nll_weight, self.cross_weight = l1_weight, nll_weight, cross_weight
        self.official = official
        if official:
            self.uncertainty_doc = "1 / mean GGD variance (a precision: larger = more certain)"
        self.image_adapter = BayesCapAdapter(dim, hidden_dim, depth, init, floors=not official)
        self.text_adapter = BayesCapAdapter(dim, hidden_dim, depth, init, floors=not official)

    def encode_texts(self, text_emb: torch.Tensor) -> Encoding:
        return self.text_adapter(text_emb)

    def encode_images(self, image_emb: torch.Tensor) -> Encoding:
        return self.image_adapter(image_emb)

    def _uncertainty(self, enc: Encoding) -> torch.Tensor:
        if self.official:
            return official_precision(enc["inv_alpha"], enc["beta"])
        return ggd_variance(enc["inv_alpha"], enc["beta"]).mean(-1)

    def text_uncertainty_from(self, texts: Encoding) -> torch.Tensor:
        return self._uncertainty(texts)

    def image_uncertainty_from(self, images: Encoding) -> torch.Tensor:
        return self._uncertainty(images)

    def loss_features(
        self, image_emb: torch.Tensor, text_emb: torch.Tensor
    ) -> tuple[Encoding, Encoding]:
        """The heads' outputs plus each frozen embedding ``z`` (the regression target)."""
        target = (lambda x: x) if self.official else unit
        img = {**self.encode_images(image_emb), "z": target(image_emb)}
        txt = {**self.encode_texts(text_emb), "z": target(text_emb)}
        return img, txt

    def loss_terms(self, images: Encoding, texts: Encoding) -> dict[str, torch.Tensor]:
        """The four criteria: own targets (``loss_i``, ``loss_t``), cross-modal ones."""
        w = (self.l1_weight, self.nll_weight, self.official)
        z_i, z_t = images["z"], texts["z"]
        return {
            "loss_i": probvlm_criterion(images, z_i, *w),
            "loss_t": probvlm_criterion(texts, z_t, *w),
            "loss_i4t": probvlm_criterion(images, z_t, *w),
            "loss_t4i": probvlm_criterion(texts, z_i, *w),
        }

    def pair_loss(self, images: Encoding, texts: Encoding, *, epoch: int = 0) -> torch.Tensor:
        t = self.loss_terms(images, texts)
        return t["loss_i"] + t["loss_t"] + self.cross_weight * (t["loss_i4t"] + t["loss_t4i"])
