"""AsymVLM (paper Sec. 4) and its ablations (Sec. 5.2).

* ``asymvlm-vmf`` / ``asymvlm-ps``: a text adapter g_T maps f_T(t) to eta; kappa = ||eta||,
  mu = eta / kappa; the caption is vMF(mu, kappa) or PS(mu, kappa); images stay deterministic.
  L(m, n) = ln p_{z_T,m}(z_I,n); loss = symmetric InfoNCE over tau * L (Eq. 2), tau trainable.
* ``asymvlm-vmf-siglip`` / ``asymvlm-ps-siglip``: the SigLIP pairwise loss with the same kernel
  (App. A.3).
* ``asymvlm-image``: only images are probabilistic; ``symvlm``: both, symmetrised kernel;
  ``asymvlm-gauss``: isotropic Gaussian text embedding with the Gaussian log-likelihood kernel.

Uncertainty of a caption is u = 1/kappa (Sec. 4.3); for ``asymvlm-gauss`` it is sigma^2.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import nn

from asymvlm.distributions import (
    ps_log_normalizer,
    uniform_log_density,
    vmf_log_normalizer,
    vmf_log_normalizer_approx,
)
from asymvlm.methods.base import (
    Adapter,
    Encoding,
    Init,
    Method,
    info_nce,
    register,
    sigmoid_pair_loss,
    unit,
)

_MIN_KAPPA = 1e-6
_COS_FLOOR = -1.0 + 1e-6


def vmf_log_likelihood(
    mu: torch.Tensor,
    kappa: torch.Tensor,
    z: torch.Tensor,
    *,
    exact: bool = True,
    scale: torch.Tensor | float = 1.0,
) -> torch.Tensor:
    """vMF kernel L(m, n) = kappa_m mu_m^T z_n + ln C_d(kappa_m), shape [n_mu, n_z] (Sec. 4.2).

    ``exact=False`` uses F_d(kappa) (App. A.1, Eq. 4) instead of the exact log-normaliser: equal
    up to a constant, cheaper, and what the training loss uses. ``scale`` (the InfoNCE
    temperature) multiplies L inside the single matrix product, kappa mu = eta being the
    adapter's raw output: one pass over the [n_mu, n_z] matrix.
    """
    dim = mu.shape[-1]
    log_c = vmf_log_normalizer(kappa, dim) if exact else vmf_log_normalizer_approx(kappa, dim)
    eta = (scale * kappa).unsqueeze(-1) * mu
    bias = (scale * log_c).unsqueeze(-1)
    if torch.is_autocast_enabled(z.device.type):
        # Half-precision matmul, but ln C (~1e3 at d=512) is added in float32: in bf16 it
        # would swamp the kappa mu^T z differences.
        return (eta @ z.T).float() + bias
    return torch.addmm(bias, eta, z.T)


def ps_log_likelihood(
    mu: torch.Tensor,
    kappa: torch.Tensor,
    z: torch.Tensor,
    *,
    exact: bool = True,
    scale: torch.Tensor | float = 1.0,
) -> torch.Tensor:
    """PS kernel L(m, n) = kappa_m ln(1 + mu_m^T z_n) + ln C_d(kappa_m), [n_mu, n_z] (Sec. 4.2).

    The normaliser is closed-form, so ``exact`` is accepted for symmetry and ignored; ``scale``
    multiplies L (see :func:`vmf_log_likelihood`).
    """
    log1p_cos = torch.log1p((mu @ z.T).clamp_min(_COS_FLOOR))
    log_c = ps_log_normalizer(kappa, mu.shape[-1])
    return torch.addcmul((scale * log_c).unsqueeze(-1), (scale * kappa).unsqueeze(-1), log1p_cos)


KERNELS = {"vmf": vmf_log_likelihood, "ps": ps_log_likelihood}


def spherical_head(eta: torch.Tensor) -> Encoding:
    """Decompose the adapter output eta = kappa * mu (App. B.1).

    In float32 even under autocast: the normalisers of kappa (lgamma, Bessel, F_d) are of
    order 1e3 at d=512 and need the precision.
    """
    eta = eta.to(torch.promote_types(eta.dtype, torch.float32))
    kappa = eta.norm(dim=-1).clamp_min(_MIN_KAPPA)
    return {"mu": eta / kappa.unsqueeze(-1), "kappa": kappa}


class _Spherical(Method):
    """Shared machinery: a kernel, a trainable temperature, and InfoNCE or SigLIP loss.

    Protocol ``official`` (the authors' code): PyTorch's default init, inputs unscaled, and
    retrieval scores with the training kernel (for vMF the approximate normaliser F_d, App. A.1,
    whose values differ from the exact log-likelihood by a constant plus <= 0.07 nats);
    ``improved``: He init, calibrated input scale, the exact log-likelihood.
    """

    PROTOCOL_KWARGS: ClassVar[dict[str, dict]] = {
        "official": {"init": "default", "calibrate_input": False, "exact_scores": False},
    }

    distribution: ClassVar[str] = "vmf"
    objective: ClassVar[str] = "infonce"

    def __init__(
        self,
        dim: int,
        hidden_dim: int = 1024,
        depth: int = 3,
        init_temperature: float = 1.0,
        init_bias: float = -10.0,
        distribution: str | None = None,
        calibrate_input: bool = True,
        init: Init = "he",
        exact_scores: bool = True,
    ) -> None:
        super().__init__(dim)
        self.calibrate_input = calibrate_input
        self.init, self.exact_scores = init, exact_scores
        if distribution is not None:
            self.distribution = distribution
        if self.distribution not in KERNELS:
            raise ValueError(f"distribution must be one of {sorted(KERNELS)}")
        self.hidden_dim, self.depth = hidden_dim, depth
        # tau multiplies the log-likelihood, raw parameter as in the official code.
        self.temperature = nn.Parameter(torch.tensor(float(init_temperature)))
        if self.objective == "siglip":
            self.bias = nn.Parameter(torch.tensor(float(init_bias)))

    def kernel(
        self,
        mu: torch.Tensor,
        kappa: torch.Tensor,
        z: torch.Tensor,
        *,
        exact: bool | None = None,
        scale: torch.Tensor | float = 1.0,
    ) -> torch.Tensor:
        """The kernel L (Sec. 4.2); ``exact`` None: the protocol's retrieval kernel."""
        exact = self.exact_scores if exact is None else exact
        return KERNELS[self.distribution](mu, kappa, z, exact=exact, scale=scale)

    def objective_loss(self, scaled_log_lik: torch.Tensor) -> torch.Tensor:
        """Eq. 2 (InfoNCE over tau * L) or App. A.3 (SigLIP over tau * L + b).

        Takes tau * L (the kernels fold tau in). For SigLIP the kernel is taken relative to
        the uniform density on the sphere, a constant shift (irrelevant for InfoNCE) that puts
        L = 0 at kappa = 0 so the bias b starts on the same scale as SigLIP's.
        """
        if self.objective == "infonce":
            return info_nce(scaled_log_lik)
        shift = self.bias - self.temperature * self.reference_log_density()
        return sigmoid_pair_loss(scaled_log_lik + shift)

    def reference_log_density(self) -> float:
        """The training kernel's log-normaliser at kappa = 0: the uniform density on the sphere
        (for vMF up to F_d's constant offset, since the training kernel uses F_d)."""
        if self.distribution == "vmf":
            zero = torch.zeros(1, dtype=torch.float64)
            return float(vmf_log_normalizer_approx(zero, self.dim))
        return uniform_log_density(self.dim)

    def pair_loss(self, images: Encoding, texts: Encoding, *, epoch: int = 0) -> torch.Tensor:
        """tau * L on the batch (training kernel: F_d for vMF), then Eq. 2 or App. A.3."""
        tau_l = self.score(texts, images, exact=False, scale=self.temperature)
        return self.objective_loss(tau_l)

    def training_stats(self) -> dict[str, float]:
        stats = {"temperature": float(self.temperature.detach())}
        if self.objective == "siglip":
            stats["bias"] = float(self.bias.detach())
        return stats


@register("asymvlm-vmf")
class AsymVLM(_Spherical):
    """Text ~ vMF(mu(t), kappa(t)), images deterministic (Sec. 4). Uncertainty 1/kappa."""

    uncertainty_doc = "1/kappa of the caption's vMF (Sec. 4.3)"

    def __init__(self, dim: int, hidden_dim: int = 1024, depth: int = 3, **kwargs) -> None:
        super().__init__(dim, hidden_dim, depth, **kwargs)
        self.text_adapter = Adapter(dim, dim, hidden_dim, depth, self.init)

    def encode_texts(self, text_emb: torch.Tensor) -> Encoding:
        return spherical_head(self.text_adapter(text_emb))

    def score(
        self, texts: Encoding, images: Encoding, *, exact: bool | None = None, scale: float = 1.0
    ) -> torch.Tensor:
        """Log-likelihood ln p_{z_T}(z_I) (App. A.2), exact normaliser unless ``exact=False``."""
        return self.kernel(texts["mu"], texts["kappa"], images["mu"], exact=exact, scale=scale)

    def text_uncertainty_from(self, texts: Encoding) -> torch.Tensor:
        return 1.0 / texts["kappa"]

    def kappa(self, text_emb: torch.Tensor) -> torch.Tensor:
        return self.encode_texts(text_emb)["kappa"]


@register("asymvlm-ps")
class AsymVLMPS(AsymVLM):
    """Text ~ PowerSpherical(mu(t), kappa(t)) (Sec. 4.2). Uncertainty 1/kappa."""

    distribution = "ps"
    uncertainty_doc = "1/kappa of the caption's Power Spherical (Sec. 4.3)"


@register("asymvlm-vmf-siglip")
class AsymVLMSigLIP(AsymVLM):
    """AsymVLM-vMF trained with the SigLIP pairwise loss (App. A.3)."""

    objective = "siglip"


@register("asymvlm-ps-siglip")
class AsymVLMPSSigLIP(AsymVLMPS):
    """AsymVLM-PS trained with the SigLIP pairwise loss (App. A.3)."""

    objective = "siglip"


@register("asymvlm-image")
class AsymVLMImage(_Spherical):
    """Ablation (Sec. 5.2): only images are probabilistic, z_I ~ vMF; texts deterministic.

    L(m, n) = ln p_{z_I,n}(f_T(t_m)); uncertainty 1/kappa of the image.
    """

    uncertainty_doc = "image only: 1/kappa of the image's vMF"

    def __init__(self, dim: int, hidden_dim: int = 1024, depth: int = 3, **kwargs) -> None:
        super().__init__(dim, hidden_dim, depth, **kwargs)
        self.image_adapter = Adapter(dim, dim, hidden_dim, depth, self.init)

    def encode_images(self, image_emb: torch.Tensor) -> Encoding:
        return spherical_head(self.image_adapter(image_emb))

    def score(
        self, texts: Encoding, images: Encoding, *, exact: bool | None = None, scale: float = 1.0
    ) -> torch.Tensor:
        return self.kernel(images["mu"], images["kappa"], texts["mu"], exact=exact, scale=scale).T

    def image_uncertainty_from(self, images: Encoding) -> torch.Tensor:
        return 1.0 / images["kappa"]


@register("symvlm")
class SymVLM(AsymVLM):
    """Ablation (Sec. 5.2): both modalities spherical; symmetrised kernel.

    L(m, n) = 1/2 [ln p_{z_T,m}(mu_I,n) + ln p_{z_I,n}(mu_T,m)], each density evaluated at the
    other modality's mean direction. Uncertainty 1/kappa for texts and for images.
    """

    uncertainty_doc = "1/kappa for captions and for images"

    def __init__(self, dim: int, hidden_dim: int = 1024, depth: int = 3, **kwargs) -> None:
        super().__init__(dim, hidden_dim, depth, **kwargs)
        self.image_adapter = Adapter(dim, dim, hidden_dim, depth, self.init)

    def encode_images(self, image_emb: torch.Tensor) -> Encoding:
        return spherical_head(self.image_adapter(image_emb))

    def score(
        self, texts: Encoding, images: Encoding, *, exact: bool | None = None, scale: float = 1.0
    ) -> torch.Tensor:
        half = 0.5 * scale
        t2i = self.kernel(texts["mu"], texts["kappa"], images["mu"], exact=exact, scale=half)
        i2t = self.kernel(images["mu"], images["kappa"], texts["mu"], exact=exact, scale=half)
        return t2i + i2t.T

    def image_uncertainty_from(self, images: Encoding) -> torch.Tensor:
        return 1.0 / images["kappa"]


def gaussian_log_likelihood(mean: torch.Tensor, var: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """ln N(z_n; m_m, sigma_m^2 I) for all pairs, [n_m, n_z] (AsymVLM(G), Sec. 5.2)."""
    dim = mean.shape[-1]
    sq = (mean * mean).sum(-1, keepdim=True) - 2.0 * mean @ z.T + (z * z).sum(-1)
    return -0.5 * sq / var.unsqueeze(-1) - 0.5 * dim * torch.log(2.0 * math.pi * var).unsqueeze(-1)


@register("asymvlm-gauss")
class AsymVLMGauss(_Spherical):
    """Ablation AsymVLM(G) (Sec. 5.2): caption ~ N(m(t), sigma^2(t) I), then normalised.

    The adapter outputs d + 1 numbers: the mean m and a variance (softplus). The kernel is the
    Gaussian log-likelihood of the image embedding; the retrieval direction is m / ||m||.
    Uncertainty sigma^2.
    """

    uncertainty_doc = "sigma^2 of the caption's isotropic Gaussian"

    def __init__(self, dim: int, hidden_dim: int = 1024, depth: int = 3, **kwargs) -> None:
        super().__init__(dim, hidden_dim, depth, **kwargs)
        self.text_adapter = Adapter(dim, dim + 1, hidden_dim, depth, self.init)

    def encode_texts(self, text_emb: torch.Tensor) -> Encoding:
        out = self.text_adapter(text_emb)
        mean = out[..., : self.dim]
        var = nn.functional.softplus(out[..., self.dim]) + 1e-6
        return {"mean": mean, "mu": unit(mean), "var": var}

    def score(
        self, texts: Encoding, images: Encoding, *, exact: bool | None = None, scale: float = 1.0
    ) -> torch.Tensor:
        return scale * gaussian_log_likelihood(texts["mean"], texts["var"], images["mu"])

    def text_uncertainty_from(self, texts: Encoding) -> torch.Tensor:
        return texts["var"]
