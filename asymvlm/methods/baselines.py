"""Probabilistic baselines, ported to cached frozen embeddings (paper Sec. 5, App. B.3).

* ``probvlm``: ProbVLM (Upadhyay et al. 2023) -- per modality a BayesCap adapter predicting a
  generalised Gaussian GGD(mu_hat, alpha, beta) per dimension; retrieval by the cosine of mu_hat.
* ``pfe``: PFE* (Shi & Jain 2019), post-hoc -- frozen means, a variance head per modality,
  trained with the mutual likelihood score (MLS) of matched pairs.
* ``pcmepp``: PCME++* (Chun 2024), post-hoc -- frozen means, log-variance heads, BCE over the
  pair matrix with logits -a * CSD + b (ProLIP Eq. 1).
* ``prolip``: ProLIP* (Chun et al. 2025), post-hoc -- the same heads, the probabilistic pairwise
  contrastive loss (PPCL, ProLIP Eq. 2) and the image-in-text inclusion loss (Eq. 3-5).
* ``elip``: ELIP (evidential retrieval) -- residual adapters on both modalities, Dirichlet
  evidence e = exp(tau * cos) over a gallery, evidential loss (ELIP Eq. 6-10), u = K / S (Eq. 4).

Every uncertainty returned here is "higher = more uncertain". The post-hoc methods (pfe,
pcmepp, prolip) never move the means, so their retrieval scores are the frozen model's cosines.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.distributions import Dirichlet, kl_divergence
from torch.nn import functional as F

from asymvlm.methods.base import Encoding, Method, mlp, register, sigmoid_pair_loss, unit

# --------------------------------------------------------------------------------------------
# ProbVLM: generalised Gaussian (ProbVLM supplementary Eq. 5)
# --------------------------------------------------------------------------------------------

#: Ranges for the GGD parameters (1/alpha and beta) and the residual ratio |x - mu| / alpha.
#: beta >= 0.1 (the official port's floor) keeps the variance finite in float32:
#: alpha^2 Gamma(3/beta)/Gamma(1/beta) <= 1e8 * Gamma(30)/Gamma(10) ~ 2.4e33.
INV_ALPHA_RANGE = (1e-4, 1e4)
BETA_RANGE = (1e-1, 1e2)
RATIO_RANGE = (1e-4, 1e3)
#: Cap on beta * log(ratio) before exponentiating (e^30 ~ 1e13): overflow safety only.
_MAX_LOG_POWER = 30.0


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


class BayesCapAdapter(nn.Module):
    """ProbVLM's BayesCap MLP: residual backbone h = x + mlp(x), then three heads on h.

    The heads are Linear-ReLU-Linear of width d, as in the official BayesCap_MLP. 1/alpha and
    beta go through softplus, plus the lower end of their range, and are capped above.
    """

    def __init__(self, dim: int, hidden_dim: int, depth: int) -> None:
        super().__init__()
        self.backbone = mlp(dim, dim, hidden_dim, depth)
        self.mu_head = mlp(dim, dim, dim, 1)
        self.inv_alpha_head = mlp(dim, dim, dim, 1)
        self.beta_head = mlp(dim, dim, dim, 1)

    def forward(self, x: torch.Tensor) -> Encoding:
        h = x + self.backbone(x)
        mu_hat = self.mu_head(h)
        inv_alpha = (F.softplus(self.inv_alpha_head(h)) + INV_ALPHA_RANGE[0]).clamp(
            max=INV_ALPHA_RANGE[1]
        )
        beta = (F.softplus(self.beta_head(h)) + BETA_RANGE[0]).clamp(max=BETA_RANGE[1])
        return {"mu_hat": mu_hat, "mu": unit(mu_hat), "inv_alpha": inv_alpha, "beta": beta}


def probvlm_criterion(
    enc: Encoding, target: torch.Tensor, l1_weight: float, nll_weight: float
) -> torch.Tensor:
    """ProbVLM's combined criterion T1 * L1(mu_hat, z) + T2 * mean GGD NLL of z (Eq. 5)."""
    l1 = (enc["mu_hat"] - target).abs().mean()
    nll = ggd_nll(target, enc["mu_hat"], enc["inv_alpha"], enc["beta"]).mean()
    return l1_weight * l1 + nll_weight * nll


@register("probvlm")
class ProbVLM(Method):
    """ProbVLM: a BayesCap adapter per modality; GGD(mu_hat, alpha, beta) per dimension.

    Loss (as the official code trains it): for each modality, T1 * L1(mu_hat, z) + T2 * GGD NLL
    of its own frozen unit embedding z, plus ``cross_weight`` times the same criterion with the
    other modality's embedding as the target (image head -> text embedding and vice versa,
    supp. Eq. 5). Score: cosine of unit(mu_hat_text) and unit(mu_hat_image). Uncertainty (both
    modalities): mean over dimensions of the GGD variance alpha^2 Gamma(3/beta)/Gamma(1/beta)
    (the official port returned its reciprocal, a precision; this is the variance).
    """

    uncertainty_doc = "mean GGD variance alpha^2 Gamma(3/beta)/Gamma(1/beta) over dims (both)"

    def __init__(
        self,
        dim: int,
        hidden_dim: int = 1024,
        depth: int = 3,
        l1_weight: float = 1.0,
        nll_weight: float = 5e-2,
        cross_weight: float = 1e-4,
    ) -> None:
        super().__init__(dim)
        self.l1_weight, self.nll_weight, self.cross_weight = l1_weight, nll_weight, cross_weight
        self.image_adapter = BayesCapAdapter(dim, hidden_dim, depth)
        self.text_adapter = BayesCapAdapter(dim, hidden_dim, depth)

    def encode_texts(self, text_emb: torch.Tensor) -> Encoding:
        return self.text_adapter(text_emb)

    def encode_images(self, image_emb: torch.Tensor) -> Encoding:
        return self.image_adapter(image_emb)

    def text_uncertainty_from(self, texts: Encoding) -> torch.Tensor:
        return ggd_variance(texts["inv_alpha"], texts["beta"]).mean(-1)

    def image_uncertainty_from(self, images: Encoding) -> torch.Tensor:
        return ggd_variance(images["inv_alpha"], images["beta"]).mean(-1)

    def loss_features(
        self, image_emb: torch.Tensor, text_emb: torch.Tensor
    ) -> tuple[Encoding, Encoding]:
        """The heads' outputs plus each frozen unit embedding ``z`` (the regression target)."""
        img = {**self.encode_images(image_emb), "z": unit(image_emb)}
        txt = {**self.encode_texts(text_emb), "z": unit(text_emb)}
        return img, txt

    def pair_loss(self, images: Encoding, texts: Encoding, *, epoch: int = 0) -> torch.Tensor:
        w = (self.l1_weight, self.nll_weight)
        z_i, z_t = images["z"], texts["z"]
        own = probvlm_criterion(images, z_i, *w) + probvlm_criterion(texts, z_t, *w)
        cross = probvlm_criterion(images, z_t, *w) + probvlm_criterion(texts, z_i, *w)
        return own + self.cross_weight * cross


# --------------------------------------------------------------------------------------------
# Post-hoc Gaussian baselines: PFE*, PCME++*, ProLIP*
# --------------------------------------------------------------------------------------------


def mutual_likelihood_score(
    mu1: torch.Tensor, var1: torch.Tensor, mu2: torch.Tensor, var2: torch.Tensor
) -> torch.Tensor:
    """PFE's MLS, -1/2 sum_l [(mu1 - mu2)^2 / (s1^2 + s2^2) + ln(s1^2 + s2^2)] (constant dropped).

    Broadcasts over leading dimensions and sums the last one.
    """
    var = var1 + var2
    return -0.5 * ((mu1 - mu2) ** 2 / var + torch.log(var)).sum(-1)


def csd(
    mu1: torch.Tensor, var1: torch.Tensor, mu2: torch.Tensor, var2: torch.Tensor
) -> torch.Tensor:
    """Closed-form sampled distance (ProLIP Eq. 1), all pairs: [n1, n2].

    d(Z1, Z2) = ||mu1 - mu2||^2 + sum(sigma1^2 + sigma2^2).
    """
    sq = (mu1 * mu1).sum(-1, keepdim=True) - 2.0 * mu1 @ mu2.T + (mu2 * mu2).sum(-1)
    return sq + var1.sum(-1, keepdim=True) + var2.sum(-1)


def probabilistic_cosine(
    mu1: torch.Tensor, var1: torch.Tensor, mu2: torch.Tensor, var2: torch.Tensor
) -> torch.Tensor:
    """mu1^T mu2 - 1/2 sum(sigma1^2 + sigma2^2), all pairs [n1, n2] (ProLIP Eq. 2, App. A.4).

    Equals 1 - CSD / 2 for unit means.
    """
    return mu1 @ mu2.T - 0.5 * (var1.sum(-1, keepdim=True) + var2.sum(-1))


#: ln of the constant of int p1^2 p2 dx per dimension: -ln(2 pi) - 1/2 ln(2 pi) + 1/2 ln(pi).
_INCLUSION_CONST = -1.5 * math.log(2.0 * math.pi) + 0.5 * math.log(math.pi)


def log_inclusion(
    mu1: torch.Tensor,
    log_var1: torch.Tensor,
    mu2: torch.Tensor,
    log_var2: torch.Tensor,
    *,
    log_eps: float = 0.0,
) -> torch.Tensor:
    """inc(Z1, Z2) = ln int p1(x)^2 p2(x) dx for diagonal Gaussians, summed over dims (Eq. 3).

    Derived afresh (ProLIP's printed Eq. 3 doubles the log-variance coefficients): per dim
    -ln s1^2 - 1/2 ln s2^2 - 1/2 ln A + B^2 / (4A) - C + const with A = 1/s1^2 + 1/(2 s2^2),
    B = 2 mu1/s1^2 + mu2/s2^2, C = mu1^2/s1^2 + mu2^2/(2 s2^2); the constant is kept, so this
    is the exact log-integral. ``log_eps`` < 0 scales the precisions in A, B, C by e^log_eps
    (ProLIP's stabiliser, Sec. 3.3); 0 gives the exact value.
    """
    p1 = torch.exp(log_eps - log_var1)
    p2 = torch.exp(log_eps - log_var2)
    a = p1 + 0.5 * p2
    b = 2.0 * mu1 * p1 + mu2 * p2
    c = mu1**2 * p1 + 0.5 * mu2**2 * p2
    per_dim = -log_var1 - 0.5 * log_var2 - 0.5 * torch.log(a) + b**2 / (4.0 * a) - c
    return (per_dim + _INCLUSION_CONST).sum(-1)


def inclusion_hypothesis(
    mu1: torch.Tensor,
    log_var1: torch.Tensor,
    mu2: torch.Tensor,
    log_var2: torch.Tensor,
    *,
    log_eps: float = 0.0,
) -> torch.Tensor:
    """H(Z1 in Z2) = inc(Z1, Z2) - inc(Z2, Z1) (ProLIP Eq. 4): > 0 when Z1 lies inside Z2."""
    return log_inclusion(mu1, log_var1, mu2, log_var2, log_eps=log_eps) - log_inclusion(
        mu2, log_var2, mu1, log_var1, log_eps=log_eps
    )


def inclusion_loss(
    mu1: torch.Tensor,
    log_var1: torch.Tensor,
    mu2: torch.Tensor,
    log_var2: torch.Tensor,
    *,
    scale: float = 10.0,
    log_eps: float = 0.0,
) -> torch.Tensor:
    """L_inc(Z1 in Z2) = -ln sigmoid(c * H(Z1 in Z2)), averaged over rows (ProLIP Eq. 5)."""
    h = inclusion_hypothesis(mu1, log_var1, mu2, log_var2, log_eps=log_eps)
    return -F.logsigmoid(scale * h).mean()


def _inverse_softplus(y: float) -> float:
    return y + math.log(-math.expm1(-y))


class _PostHocGaussian(Method):
    """Frozen means mu = unit(x); a per-dimension variance head per modality (App. B.3).

    ``encode_*`` return ``mu`` (frozen unit embedding), ``var`` (sigma^2) and ``log_var``.
    Score: cosine of the frozen means. Uncertainty (both modalities): mean sigma^2 over dims.
    """

    uncertainty_doc = "mean sigma^2 over dimensions (both modalities)"

    def __init__(self, dim: int, hidden_dim: int = 1024, depth: int = 3) -> None:
        super().__init__(dim)
        self.image_var_head = mlp(dim, dim, hidden_dim, depth)
        self.text_var_head = mlp(dim, dim, hidden_dim, depth)

    def _gaussian(self, head: nn.Module, x: torch.Tensor) -> Encoding:
        raise NotImplementedError

    def encode_texts(self, text_emb: torch.Tensor) -> Encoding:
        return self._gaussian(self.text_var_head, text_emb)

    def encode_images(self, image_emb: torch.Tensor) -> Encoding:
        return self._gaussian(self.image_var_head, image_emb)

    def text_uncertainty_from(self, texts: Encoding) -> torch.Tensor:
        return texts["var"].mean(-1)

    def image_uncertainty_from(self, images: Encoding) -> torch.Tensor:
        return images["var"].mean(-1)


@register("pfe")
class PFE(_PostHocGaussian):
    """PFE*: sigma^2 = softplus(mlp(x)) per dimension, means frozen.

    Loss: -mean over matched pairs of MLS(image, text) (PFE's mutual likelihood score).
    Score: frozen cosine. Uncertainty: mean sigma^2 (higher = more uncertain), both modalities.
    """

    #: Floor added to softplus so that ln(s1^2 + s2^2) stays finite.
    min_var: float = 1e-6

    def _gaussian(self, head: nn.Module, x: torch.Tensor) -> Encoding:
        var = F.softplus(head(x)) + self.min_var
        return {"mu": unit(x), "var": var, "log_var": torch.log(var)}

    def pair_loss(self, images: Encoding, texts: Encoding, *, epoch: int = 0) -> torch.Tensor:
        img, txt = images, texts
        return -mutual_likelihood_score(img["mu"], img["var"], txt["mu"], txt["var"]).mean()


class _LogVarianceHeads(_PostHocGaussian):
    """PCME++-style heads: ln sigma^2 = mlp(mu) on the frozen unit embedding."""

    def _init_log_var(self, value: float | None) -> None:
        """Set the heads' output bias, so ln sigma^2 starts near ``value`` (None: leave it)."""
        if value is not None:
            for head in (self.image_var_head, self.text_var_head):
                nn.init.constant_(head[-1].bias, value)

    def _gaussian(self, head: nn.Module, x: torch.Tensor) -> Encoding:
        mu = unit(x)
        log_var = head(mu)
        return {"mu": mu, "var": torch.exp(log_var), "log_var": log_var}


@register("pcmepp")
class PCMEPP(_LogVarianceHeads):
    """PCME++*: ln sigma^2 = mlp(mu), means frozen; probabilistic matching loss.

    Logits -a * CSD(image, text) + b over the B x B pair matrix, BCE with positives on the
    diagonal, doubled as the official code does (i2t + t2i). a = softplus(a_raw) stays positive
    (init 5); b is free (init 5). ``init_log_var`` optionally sets the heads' output bias (the
    official port leaves the default init). Score: frozen cosine. Uncertainty: mean
    exp(ln sigma^2), both modalities.
    """

    def __init__(
        self,
        dim: int,
        hidden_dim: int = 1024,
        depth: int = 3,
        init_scale: float = 5.0,
        init_shift: float = 5.0,
        init_log_var: float | None = None,
    ) -> None:
        super().__init__(dim, hidden_dim, depth)
        self._init_log_var(init_log_var)
        self.scale_raw = nn.Parameter(torch.tensor(_inverse_softplus(init_scale)))
        self.shift = nn.Parameter(torch.tensor(float(init_shift)))

    @property
    def scale(self) -> torch.Tensor:
        return F.softplus(self.scale_raw)

    def pair_loss(self, images: Encoding, texts: Encoding, *, epoch: int = 0) -> torch.Tensor:
        img, txt = images, texts
        logits = -self.scale * csd(img["mu"], img["var"], txt["mu"], txt["var"]) + self.shift
        target = torch.eye(logits.shape[0], dtype=logits.dtype, device=logits.device)
        return 2.0 * F.binary_cross_entropy_with_logits(logits, target)

    def training_stats(self) -> dict[str, float]:
        return {"scale": float(self.scale.detach()), "shift": float(self.shift.detach())}


@register("prolip")
class ProLIP(_LogVarianceHeads):
    """ProLIP*: the PCME++ heads with ProLIP's objective, means frozen.

    Loss: PPCL (Eq. 2), logits s * (mu_v^T mu_t - 1/2 sum(sigma_v^2 + sigma_t^2)) + b with the
    pairwise log-sigmoid loss (s = exp(ln s) > 0, init 10; b init -10), plus
    ``inclusion_weight`` * L_inc(Z_v in Z_t) on matched pairs (Eq. 3-5, c = ``inclusion_scale``;
    0 disables). The heads' output bias starts at ``init_log_var`` = -10, as ProLIP initialises
    ln sigma^2 (Sec. 4.1). Score: frozen cosine. Uncertainty: mean sigma^2 (both modalities).
    """

    def __init__(
        self,
        dim: int,
        hidden_dim: int = 1024,
        depth: int = 3,
        init_scale: float = 10.0,
        init_bias: float = -10.0,
        inclusion_weight: float = 0.01,
        inclusion_scale: float = 10.0,
        inclusion_log_eps: float = 0.0,
        init_log_var: float | None = -10.0,
    ) -> None:
        super().__init__(dim, hidden_dim, depth)
        self._init_log_var(init_log_var)
        self.log_scale = nn.Parameter(torch.tensor(math.log(init_scale)))
        self.bias = nn.Parameter(torch.tensor(float(init_bias)))
        self.inclusion_weight = inclusion_weight
        self.inclusion_scale = inclusion_scale
        self.inclusion_log_eps = inclusion_log_eps

    def pair_loss(self, images: Encoding, texts: Encoding, *, epoch: int = 0) -> torch.Tensor:
        img, txt = images, texts
        sim = probabilistic_cosine(img["mu"], img["var"], txt["mu"], txt["var"])
        total = sigmoid_pair_loss(self.log_scale.exp() * sim + self.bias)
        if self.inclusion_weight:
            total = total + self.inclusion_weight * inclusion_loss(
                img["mu"],
                img["log_var"],
                txt["mu"],
                txt["log_var"],
                scale=self.inclusion_scale,
                log_eps=self.inclusion_log_eps,
            )
        return total

    def training_stats(self) -> dict[str, float]:
        return {"scale": float(self.log_scale.detach().exp()), "bias": float(self.bias.detach())}


# --------------------------------------------------------------------------------------------
# ELIP: evidential retrieval (ELIP Eq. 4, 6-10)
# --------------------------------------------------------------------------------------------

#: Cap on tau * cos before exp (e^30 ~ 1e13): overflow safety only; a pair reaches it only when
#: tau > 30, so unlike ELIP's clamp at +-10 with tau = 100 it does not kill the gradients.
MAX_EVIDENCE_LOGIT = 30.0


def dirichlet_alpha(cos: torch.Tensor, tau: torch.Tensor | float) -> torch.Tensor:
    """alpha = e + 1 with evidence e = exp(tau * cos) (ELIP Eq. 6; tau * cos capped at 30)."""
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


@register("elip")
class ELIP(Method):
    """ELIP on cached embeddings: residual adapters x' = unit(x + mlp(x)) for both modalities.

    The last Linear of each mlp is zero-initialised, so training starts at the frozen model.
    Evidence e = exp(tau * cos) with tau = exp(ln tau) learnable (init 10), alpha = e + 1
    (Eq. 6); loss 1/2 (L_i2t + L_t2i) over the batch (Eq. 10), each the Bayes risk (Eq. 8) plus
    lambda_t KL to the uniform Dirichlet (Eq. 9), lambda_t = min(1, epoch / kl_anneal_epochs).
    Score: cosine of the adapted embeddings. Uncertainty u = K / S (Eq. 4) of a caption over a
    FIXED gallery of K training images (of an image, over K training captions), both adapted;
    the gallery is drawn once in ``fit_start`` and saved with the state dict.
    """

    uncertainty_doc = "K / S over a fixed gallery of K items (ELIP Eq. 4), both modalities"
    _gallery_names = ("gallery_images", "gallery_texts")

    def __init__(
        self,
        dim: int,
        hidden_dim: int = 1024,
        depth: int = 3,
        init_temperature: float = 10.0,
        kl_anneal_epochs: int = 15,
        gallery_size: int = 1000,
    ) -> None:
        super().__init__(dim)
        self.image_adapter = mlp(dim, dim, hidden_dim, depth)
        self.text_adapter = mlp(dim, dim, hidden_dim, depth)
        for adapter in (self.image_adapter, self.text_adapter):
            nn.init.zeros_(adapter[-1].weight)
            nn.init.zeros_(adapter[-1].bias)
        self.log_temperature = nn.Parameter(torch.tensor(math.log(init_temperature)))
        self.kl_anneal_epochs = kl_anneal_epochs
        self.gallery_size = gallery_size
        for name in self._gallery_names:
            self.register_buffer(name, torch.empty(0, dim), persistent=True)

    @property
    def temperature(self) -> torch.Tensor:
        return self.log_temperature.exp()

    def encode_texts(self, text_emb: torch.Tensor) -> Encoding:
        return {"mu": unit(text_emb + self.text_adapter(text_emb))}

    def encode_images(self, image_emb: torch.Tensor) -> Encoding:
        return {"mu": unit(image_emb + self.image_adapter(image_emb))}

    # -- gallery -----------------------------------------------------------------------------
    def fit_start(self, image_emb: torch.Tensor, text_emb: torch.Tensor) -> None:
        """Draw the fixed reference galleries (raw embeddings, adapted when used)."""
        for name, emb in zip(self._gallery_names, (image_emb, text_emb), strict=True):
            n = emb.shape[0]
            idx = torch.randperm(n, device=emb.device)[: min(self.gallery_size, n)]
            buf = getattr(self, name)
            setattr(self, name, emb[idx].detach().to(device=buf.device, dtype=buf.dtype).clone())

    def _gallery(self, name: str) -> torch.Tensor:
        gallery = getattr(self, name)
        if gallery.shape[0] == 0:
            raise RuntimeError(
                "ELIP's uncertainty needs a reference gallery: call fit_start(image_emb, "
                "text_emb) with the training set first (or load a state dict that has one)"
            )
        return gallery

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        # The galleries' size is only known after fit_start: resize before copying.
        for name in self._gallery_names:
            saved = state_dict.get(prefix + name)
            if isinstance(saved, torch.Tensor):
                buf = getattr(self, name)
                setattr(self, name, torch.empty(saved.shape, dtype=buf.dtype, device=buf.device))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # -- uncertainty -------------------------------------------------------------------------
    def text_uncertainty_from(self, texts: Encoding) -> torch.Tensor:
        gallery = self.encode_images(self._gallery("gallery_images"))["mu"]
        return evidential_uncertainty(dirichlet_alpha(texts["mu"] @ gallery.T, self.temperature))

    def image_uncertainty_from(self, images: Encoding) -> torch.Tensor:
        gallery = self.encode_texts(self._gallery("gallery_texts"))["mu"]
        return evidential_uncertainty(dirichlet_alpha(images["mu"] @ gallery.T, self.temperature))

    # -- training ----------------------------------------------------------------------------
    def kl_weight(self, epoch: int) -> float:
        """lambda_t = min(1, t / kl_anneal_epochs) (ELIP Eq. 9)."""
        if self.kl_anneal_epochs <= 0:
            return 1.0
        return min(1.0, epoch / self.kl_anneal_epochs)

    def pair_loss(self, images: Encoding, texts: Encoding, *, epoch: int = 0) -> torch.Tensor:
        cos = images["mu"] @ texts["mu"].T
        alpha = dirichlet_alpha(cos, self.temperature)  # rows: image queries
        y = torch.eye(cos.shape[0], dtype=cos.dtype, device=cos.device)
        lam = self.kl_weight(epoch)
        return 0.5 * (evidential_loss(alpha, y, lam) + evidential_loss(alpha.T, y, lam))

    def training_stats(self) -> dict[str, float]:
        return {"temperature": float(self.temperature.detach())}


# BayesVLM (Baumann et al. 2024) would go here: a KFAC Laplace posterior over the last projection
# layers, which needs the pre-projection pooled activations in the embedding cache. Not
# implemented (the paper does not compare against it in the main experiments, App. B.3).
