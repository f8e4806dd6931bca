"""AsymVLM (paper Sec. 4) and its ablations (Sec. 5.2): a text adapter maps f_T(t) to
eta = kappa mu, the caption vMF(mu, kappa) or PS(mu, kappa), images points; trained by InfoNCE over
tau * L (Eq. 2) or SigLIP's loss (App. A.3); the uncertainty is 1/kappa (Sec. 4.3)."""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import torch
from torch import nn

from asymvlm.distributions import ps_log_normalizer, vmf_log_normalizer, vmf_log_normalizer_approx
from asymvlm.methods.base import (
    Adapter,
    Encoding,
    Init,
    Method,
    Roles,
    info_nce,
    sigmoid_pair_loss,
    unit,
)

Family = Literal["vmf", "ps"]
_MIN_KAPPA = 1e-6
_COS_FLOOR = -1.0 + 1e-6


def spherical_log_likelihood(
    family: Family,
    mu: torch.Tensor,
    kappa: torch.Tensor,
    z: torch.Tensor,
    *,
    exact: bool = True,
    scale: torch.Tensor | float = 1.0,
) -> torch.Tensor:
    """scale * ln p(z_n | mu_m, kappa_m) for all pairs, [n_mu, n_z] (Sec. 4.2): vMF
    kappa mu^T z + ln C_d (F_d of App. A.1, Eq. 4, where not ``exact``: the training kernel) or
    PS kappa ln(1 + mu^T z) + ln C_d (closed form)."""
    dim = mu.shape[-1]
    if family == "ps":
        log1p_cos = torch.log1p((mu @ z.T).clamp_min(_COS_FLOOR))
        bias = (scale * ps_log_normalizer(kappa, dim)).unsqueeze(-1)
        return torch.addcmul(bias, (scale * kappa).unsqueeze(-1), log1p_cos)
    log_c = vmf_log_normalizer(kappa, dim) if exact else vmf_log_normalizer_approx(kappa, dim)
    eta = (scale * kappa).unsqueeze(-1) * mu
    bias = (scale * log_c).unsqueeze(-1)
    if torch.is_autocast_enabled(z.device.type):
        return (eta @ z.T).float() + bias  # ln C (~1e3 at d=512) added in float32
    return torch.addmm(bias, eta, z.T)


def spherical_head(eta: torch.Tensor) -> Encoding:
    """kappa = ||eta||, mu = eta / kappa (App. B.1), in float32 at least (the normalisers)."""
    eta = eta.to(torch.promote_types(eta.dtype, torch.float32))
    kappa = eta.norm(dim=-1).clamp_min(_MIN_KAPPA)
    return {"mu": eta / kappa.unsqueeze(-1), "kappa": kappa}


def gaussian_log_likelihood(mean: torch.Tensor, var: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """ln N(z_n; m_m, sigma_m^2 I) for all pairs, [n_m, n_z] (AsymVLM(G), Sec. 5.2)."""
    dim = mean.shape[-1]
    sq = (mean * mean).sum(-1, keepdim=True) - 2.0 * mean @ z.T + (z * z).sum(-1)
    return -0.5 * sq / var.unsqueeze(-1) - 0.5 * dim * torch.log(2.0 * math.pi * var).unsqueeze(-1)


class _Spherical(Method):
    """Spherical distributions on the ``probabilistic`` sides, a trained temperature tau, and
    InfoNCE or SigLIP over tau * L (``official`` and ``improved``: docs/protocols.md)."""

    PROTOCOL_KWARGS: ClassVar[dict[str, dict]] = {
        "official": {"init": "default", "calibrate_input": False, "exact_scores": False},
    }
    distribution: ClassVar[Family] = "vmf"
    objective: ClassVar[Literal["infonce", "siglip"]] = "infonce"
    probabilistic: ClassVar[tuple[str, ...]] = ("text",)
    text_out: ClassVar[int] = 0  # extra text adapter outputs (asymvlm-gauss: the variance)

    def __init__(
        self,
        dim: int,
        hidden_dim: int = 1024,
        depth: int = 3,
        init_temperature: float = 1.0,
        init_bias: float = -10.0,
        calibrate_input: bool = True,
        init: Init = "he",
        exact_scores: bool = True,
    ) -> None:
        super().__init__(dim)
        self.calibrate_input = calibrate_input
        self.exact_scores = exact_scores
        self.temperature = nn.Parameter(torch.tensor(float(init_temperature)))
        if self.objective == "siglip":
            self.bias = nn.Parameter(torch.tensor(float(init_bias)))
        for modality in self.probabilistic:
            out = dim + (self.text_out if modality == "text" else 0)
            setattr(self, f"{modality}_adapter", Adapter(dim, out, hidden_dim, depth, init))

    def encode(self, side: str, x: torch.Tensor) -> Encoding:
        if side in self.probabilistic:
            return spherical_head(getattr(self, f"{side}_adapter")(x))
        return super().encode(side, x)

    def score(
        self,
        texts: Encoding,
        images: Encoding,
        *,
        exact: bool | None = None,
        scale: torch.Tensor | float = 1.0,
    ) -> torch.Tensor:
        """[n_text, n_image] L (App. A.2): ln p_{z_T}(z_I), the transpose of ln p_{z_I}(z_T)
        (``asymvlm-image``) or the mean of both (``symvlm``); ``exact`` None: the protocol's."""
        exact = self.exact_scores if exact is None else exact
        half = 0.5 * scale if len(self.probabilistic) == 2 else scale
        kernel = lambda d, z: spherical_log_likelihood(  # noqa: E731
            self.distribution, d["mu"], d["kappa"], z["mu"], exact=exact, scale=half
        )
        out = 0.0
        if "text" in self.probabilistic:
            out = kernel(texts, images)
        if "image" in self.probabilistic:
            out = out + kernel(images, texts).T
        return out

    def uncertainty_from(self, enc: Encoding) -> torch.Tensor | None:
        return 1.0 / enc["kappa"] if "kappa" in enc else None

    def kappa(self, text_emb: torch.Tensor) -> torch.Tensor | None:
        return self.encode_texts(text_emb).get("kappa")

    def reference_log_density(self) -> float:
        """The training kernel's ln C at kappa = 0, F_d(0) (vMF) or the uniform density (PS):
        SigLIP's logits are taken relative to it, so the bias b starts at SigLIP's scale."""
        if self.distribution == "vmf":
            return float(vmf_log_normalizer_approx(torch.zeros(1, dtype=torch.float64), self.dim))
        return math.lgamma(self.dim / 2.0) - math.log(2.0) - (self.dim / 2.0) * math.log(math.pi)

    def pair_loss(self, images: Encoding, texts: Encoding, *, epoch: int = 0) -> torch.Tensor:
        """InfoNCE over tau * L (Eq. 2) or SigLIP over tau * (L - L_0) + b (App. A.3), with the
        training kernel."""
        tau_l = self.score(texts, images, exact=False, scale=self.temperature)
        if self.objective == "infonce":
            return info_nce(tau_l)
        shift = self.bias - self.temperature * self.reference_log_density()
        return sigmoid_pair_loss(tau_l + shift)

    def training_stats(self) -> dict[str, float]:
        stats = super().training_stats()
        if self.objective == "siglip":
            stats["bias"] = float(self.bias.detach())
        return stats


class AsymVLM(_Spherical):
    """Text ~ vMF(mu(t), kappa(t)), images deterministic (Sec. 4)."""

    uncertainty_doc = "1/kappa of the caption's vMF (Sec. 4.3)"
    roles = Roles(claims=True)


class AsymVLMPS(AsymVLM):
    """Text ~ PowerSpherical(mu(t), kappa(t)) (Sec. 4.2)."""

    distribution = "ps"
    uncertainty_doc = "1/kappa of the caption's Power Spherical (Sec. 4.3)"


class AsymVLMSigLIP(AsymVLM):
    """AsymVLM-vMF trained with the SigLIP pairwise loss (App. A.3)."""

    objective = "siglip"
    roles = Roles()


class AsymVLMPSSigLIP(AsymVLMPS):
    """AsymVLM-PS trained with the SigLIP pairwise loss (App. A.3)."""

    objective = "siglip"
    roles = Roles()


class AsymVLMImage(_Spherical):
    """Ablation (Sec. 5.2): images ~ vMF, texts deterministic; L(m, n) = ln p_{z_I,n}(t_m)."""

    probabilistic = ("image",)
    uncertainty_doc = "image only: 1/kappa of the image's vMF"
    roles = Roles(ablation_of="asymvlm-vmf")


class SymVLM(_Spherical):
    """Ablation (Sec. 5.2): both modalities vMF; L = 1/2 [ln p_{z_T}(mu_I) + ln p_{z_I}(mu_T)]."""

    probabilistic = ("text", "image")
    uncertainty_doc = "1/kappa for captions and for images"
    roles = Roles(ablation_of="asymvlm-vmf")


class AsymVLMGauss(_Spherical):
    """Ablation AsymVLM(G) (Sec. 5.2): caption ~ N(m(t), sigma^2(t) I), then normalised.

    sigma^2 = softplus; L is the Gaussian log-likelihood of the image."""

    text_out = 1
    uncertainty_doc = "sigma^2 of the caption's isotropic Gaussian"
    roles = Roles(ablation_of="asymvlm-vmf")

    def encode_texts(self, text_emb: torch.Tensor) -> Encoding:
        out = self.text_adapter(text_emb)
        mean = out[..., : self.dim]
        var = nn.functional.softplus(out[..., self.dim]) + 1e-6
        return {"mean": mean, "mu": unit(mean), "var": var}

    def score(
        self, texts: Encoding, images: Encoding, *, scale: torch.Tensor | float = 1.0, **_: object
    ) -> torch.Tensor:
        return scale * gaussian_log_likelihood(texts["mean"], texts["var"], images["mu"])

    def uncertainty_from(self, enc: Encoding) -> torch.Tensor | None:
        return enc.get("var")
