"""Post-hoc Gaussian baselines (paper Sec. 5, App. B.3): frozen means, a variance head per
modality, retrieval by the frozen cosine: PFE* (Shi & Jain 2019), PCME++* (Chun 2024) and ProLIP*
(Chun et al. 2025); their ``official`` variants: docs/protocols.md."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import nn
from torch.nn import functional as F

from asymvlm.methods.base import Encoding, Init, Method, mlp, sigmoid_pair_loss, unit


def mutual_likelihood_score(
    mu1: torch.Tensor, var1: torch.Tensor, mu2: torch.Tensor, var2: torch.Tensor
) -> torch.Tensor:
    """PFE's MLS, -1/2 sum_l [(mu1 - mu2)^2 / (s1^2 + s2^2) + ln(s1^2 + s2^2)] (no constant)."""
    var = var1 + var2
    return -0.5 * ((mu1 - mu2) ** 2 / var + torch.log(var)).sum(-1)


def csd(
    mu1: torch.Tensor, var1: torch.Tensor, mu2: torch.Tensor, var2: torch.Tensor
) -> torch.Tensor:
    """Closed-form sampled distance ||mu1 - mu2||^2 + sum(s1^2 + s2^2) (ProLIP Eq. 1), [n1, n2]."""
    sq = (mu1 * mu1).sum(-1, keepdim=True) - 2.0 * mu1 @ mu2.T + (mu2 * mu2).sum(-1)
    return sq + var1.sum(-1, keepdim=True) + var2.sum(-1)


def probabilistic_cosine(
    mu1: torch.Tensor, var1: torch.Tensor, mu2: torch.Tensor, var2: torch.Tensor
) -> torch.Tensor:
    """mu1^T mu2 - 1/2 sum(s1^2 + s2^2) (ProLIP Eq. 2, App. A.4), [n1, n2]."""
    return mu1 @ mu2.T - 0.5 * (var1.sum(-1, keepdim=True) + var2.sum(-1))


#: ln of the constant of int p1^2 p2 dx per dimension: -ln(2 pi) - 1/2 ln(2 pi) + 1/2 ln(pi).
_INCLUSION_CONST = -1.5 * math.log(2.0 * math.pi) + 0.5 * math.log(math.pi)


def log_inclusion(
    mu1: torch.Tensor, log_var1: torch.Tensor, mu2: torch.Tensor, log_var2: torch.Tensor
) -> torch.Tensor:
    """inc(Z1, Z2) = ln int p1(x)^2 p2(x) dx of diagonal Gaussians, summed over dims (ProLIP
    Eq. 3, derived afresh: the printed one doubles the log-variance coefficients)."""
    p1, p2 = torch.exp(-log_var1), torch.exp(-log_var2)
    a = p1 + 0.5 * p2
    b = 2.0 * mu1 * p1 + mu2 * p2
    c = mu1**2 * p1 + 0.5 * mu2**2 * p2
    per_dim = -log_var1 - 0.5 * log_var2 - 0.5 * torch.log(a) + b**2 / (4.0 * a) - c
    return (per_dim + _INCLUSION_CONST).sum(-1)


def inclusion_loss(
    mu1: torch.Tensor, log_var1: torch.Tensor, mu2: torch.Tensor, log_var2: torch.Tensor
) -> torch.Tensor:
    """L_inc(Z1 in Z2) = -ln sigmoid(c H), H = inc(Z1, Z2) - inc(Z2, Z1), c = 10 (ProLIP
    Eq. 4-5), averaged over rows."""
    h = log_inclusion(mu1, log_var1, mu2, log_var2) - log_inclusion(mu2, log_var2, mu1, log_var1)
    return -F.logsigmoid(10.0 * h).mean()


def vib_kl(mu: torch.Tensor, log_var: torch.Tensor, cap: float = 1e4) -> torch.Tensor:
    """The official ProLIP port's VIB term, -1/2 mean(1 + v/2 - mu^2 - exp(v/2)) with
    v = ln sigma^2, and 0 above ``cap`` as the port."""
    half = 0.5 * log_var
    kl = -0.5 * (1.0 + half - mu**2 - torch.exp(half)).mean()
    return torch.where(kl > cap, torch.zeros_like(kl), kl)


class _PostHocGaussian(Method):
    """Frozen means and a variance head per modality; encodings ``mu``, ``var`` = sigma^2 =
    exp(head(mu)), ``log_var``. ``official``: the authors' port's variant of the method."""

    uncertainty_doc = "mean sigma^2 over dimensions (both modalities)"
    PROTOCOL_KWARGS: ClassVar[dict[str, dict]] = {"official": {"init": "default", "official": True}}

    def __init__(
        self, dim: int, hidden_dim: int = 1024, depth: int = 3, init: Init = "he", official=False
    ) -> None:
        super().__init__(dim)
        self.official = official
        self.image_var_head = mlp(dim, dim, hidden_dim, depth, init)
        self.text_var_head = mlp(dim, dim, hidden_dim, depth, init)

    def encode(self, side: str, x: torch.Tensor) -> Encoding:
        mu = unit(x)
        log_var = getattr(self, f"{side}_var_head")(mu)
        return {"mu": mu, "var": torch.exp(log_var), "log_var": log_var}

    def uncertainty_from(self, enc: Encoding) -> torch.Tensor:
        return enc["var"].mean(-1)


class PFE(_PostHocGaussian):
    """PFE*: sigma^2 = softplus(mlp(x)) per dimension, means frozen.

    Loss -mean MLS of the pairs on unit means, sigma^2 floored at 1e-6, or (``official``, the
    port) twice it on raw inputs, no floor."""

    OFFICIAL_RAW_IMAGES = True

    def encode(self, side: str, x: torch.Tensor) -> Encoding:
        var = F.softplus(getattr(self, f"{side}_var_head")(x)) + (0.0 if self.official else 1e-6)
        mu = unit(x)
        mean = x if self.official else mu
        return {"mu": mu, "mean": mean, "var": var, "log_var": torch.log(var)}

    def pair_loss(self, images: Encoding, texts: Encoding, *, epoch: int = 0) -> torch.Tensor:
        mls = mutual_likelihood_score(images["mean"], images["var"], texts["mean"], texts["var"])
        return -(2.0 if self.official else 1.0) * mls.mean()


class PCMEPP(_PostHocGaussian):
    """PCME++*: ln sigma^2 = mlp(mu), means frozen; probabilistic matching loss.

    BCE over the logits -a CSD + b of the pair matrix, doubled (i2t + t2i) as the official
    code; a = softplus(a_raw), or a_raw (``official``); a and b start at 5."""

    def __init__(self, dim: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(dim, *args, **kwargs)
        raw = 5.0 if self.official else 5.0 + math.log(-math.expm1(-5.0))
        self.scale_raw = nn.Parameter(torch.tensor(raw))
        self.shift = nn.Parameter(torch.tensor(5.0))

    @property
    def scale(self) -> torch.Tensor:
        """a: softplus(a_raw), or a_raw itself (``official``)."""
        return self.scale_raw if self.official else F.softplus(self.scale_raw)

    def pair_loss(self, images: Encoding, texts: Encoding, *, epoch: int = 0) -> torch.Tensor:
        dist = csd(images["mu"], images["var"], texts["mu"], texts["var"])
        logits = -self.scale * dist + self.shift
        target = torch.eye(logits.shape[0], dtype=logits.dtype, device=logits.device)
        return 2.0 * F.binary_cross_entropy_with_logits(logits, target)

    def calibration_scale(self) -> float:
        """2a: -a CSD = 2a cos + terms constant per pair of items, for unit means."""
        return 2.0 * float(self.scale.detach())

    def training_stats(self) -> dict[str, float]:
        return {"scale": float(self.scale.detach()), "shift": float(self.shift.detach())}


class ProLIP(_PostHocGaussian):
    """ProLIP*: the PCME++ heads with ProLIP's objective, means frozen.

    PPCL (Eq. 2) over s * probabilistic cosine + b, s, b learnt from 10, -10, the heads' last
    bias at -10, plus 0.01 L_inc(Z_v in Z_t) (Eq. 3-5); ``official`` (the port): s, b fixed at
    1, 0, the heads as initialised and 1e-5 times the port's VIB term instead of L_inc."""

    def __init__(self, dim: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(dim, *args, **kwargs)
        if not self.official:
            self.log_scale = nn.Parameter(torch.tensor(math.log(10.0)))
            self.bias = nn.Parameter(torch.tensor(-10.0))
            for head in (self.image_var_head, self.text_var_head):
                nn.init.constant_(head[-1].bias, -10.0)

    def logit_scale_bias(self) -> tuple[torch.Tensor | float, torch.Tensor | float]:
        """(s, b) of the PPCL logits: learnt, or the official port's fixed (1, 0)."""
        return (1.0, 0.0) if self.official else (self.log_scale.exp(), self.bias)

    def loss_terms(self, images: Encoding, texts: Encoding) -> dict[str, torch.Tensor]:
        """``ppcl`` (Eq. 2) and ``inclusion`` (Eq. 5) or the port's ``vib``, each weighted."""
        img, txt = images, texts
        s, b = self.logit_scale_bias()
        sim = probabilistic_cosine(img["mu"], img["var"], txt["mu"], txt["var"])
        if self.official:
            kl = vib_kl(img["mu"], img["log_var"]) + vib_kl(txt["mu"], txt["log_var"])
            return {"ppcl": sigmoid_pair_loss(s * sim + b), "vib": 1e-5 * kl}
        inclusion = inclusion_loss(img["mu"], img["log_var"], txt["mu"], txt["log_var"])
        return {"ppcl": sigmoid_pair_loss(s * sim + b), "inclusion": 0.01 * inclusion}

    def pair_loss(self, images: Encoding, texts: Encoding, *, epoch: int = 0) -> torch.Tensor:
        return sum(self.loss_terms(images, texts).values())

    def calibration_scale(self) -> float:
        """s: the PPCL logits are s * cos + terms constant per pair of items."""
        return float(torch.as_tensor(self.logit_scale_bias()[0]).detach())

    def training_stats(self) -> dict[str, float]:
        if self.official:
            return {}
        return {"scale": float(self.log_scale.detach().exp()), "bias": float(self.bias.detach())}
