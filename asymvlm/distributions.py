"""Directional distributions on the unit sphere S^{d-1} (paper Sec. 4.2), ``loc`` = mu and
``scale`` = kappa: :class:`VonMisesFisher` (exact log-normaliser through a stable log-Bessel) and
:class:`PowerSpherical` (De Cao & Aziz, 2020), their densities and entropies. F_d (App. A.1,
Eq. 4) is the training kernel."""

from __future__ import annotations

import math

import torch
from torch.distributions import Distribution, constraints

_DEBYE_MIN_ORDER = 30.0  # lower orders: Debye at v + n, then n steps of backward recurrence
_KAPPA_FLOOR = 1e-30


def _log_bessel_iv_debye(v: float, x: torch.Tensor) -> torch.Tensor:
    """ln I_v(x) by the uniform asymptotic (Debye) expansion, DLMF 10.41.3, four terms
    (~1e-8 relative for v >= 20, every x > 0 in float64)."""
    root = torch.sqrt(v * v + x * x)
    p = v / root
    eta_v = root + v * torch.log(x / (v + root))
    p2 = p * p
    u1 = p * (3.0 - 5.0 * p2) / 24.0
    u2 = p2 * (81.0 - 462.0 * p2 + 385.0 * p2 * p2) / 1152.0
    u3 = p * p2 * (30375.0 - 369603.0 * p2 + 765765.0 * p2**2 - 425425.0 * p2**3) / 414720.0
    u4 = 4465125.0 - 94121676.0 * p2 + 349922430.0 * p2**2 - 446185740.0 * p2**3
    u4 = p2 * p2 * (u4 + 185910725.0 * p2**4) / 39813120.0
    series = 1.0 + u1 / v + u2 / v**2 + u3 / v**3 + u4 / v**4
    return eta_v - 0.5 * math.log(2.0 * math.pi * v) - 0.5 * torch.log(root / v) + torch.log(series)


def log_bessel_iv(v: float, x: torch.Tensor) -> torch.Tensor:
    """ln I_v(x) for v >= 0, x > 0, stable for v up to thousands and x in [1e-30, 1e12]:
    Debye at order v + n (>= 30), then I_k / I_{k+1} = 2(k+1)/x + I_{k+2} / I_{k+1} down to v.
    Computed in float64, differentiable in x."""
    if v < 0:
        raise ValueError(f"order v must be >= 0, got {v}")
    x64 = x.to(torch.float64).clamp_min(_KAPPA_FLOOR)
    shift = max(0, math.ceil(_DEBYE_MIN_ORDER - v))
    top = v + shift
    log_i = _log_bessel_iv_debye(top, x64)
    if shift:
        rho = torch.exp(log_i - _log_bessel_iv_debye(top + 1.0, x64))  # I_top / I_top+1
        for k in range(shift):
            rho = 2.0 * (top - k) / x64 + 1.0 / rho
            log_i = log_i + torch.log(rho)
    return log_i.to(x.dtype)


def vmf_log_normalizer(kappa: torch.Tensor, dim: int) -> torch.Tensor:
    """Exact ln C_d(kappa) = (d/2-1) ln kappa - (d/2) ln(2 pi) - ln I_{d/2-1}(kappa) (Sec. 4.2)."""
    v = dim / 2.0 - 1.0
    k64 = kappa.to(torch.float64).clamp_min(_KAPPA_FLOOR)
    out = v * torch.log(k64) - (dim / 2.0) * math.log(2.0 * math.pi) - log_bessel_iv(v, k64)
    return out.to(kappa.dtype)


def vmf_log_normalizer_approx(kappa: torch.Tensor, dim: int) -> torch.Tensor:
    """F_d(kappa), ln C_d(kappa) up to a constant (App. A.1, Eq. 4): its derivative is the mean
    of the Ruiz-Antolin--Segura bounds on -I_{d/2} / I_{d/2-1}."""
    a, b = (dim - 1) / 2.0, (dim + 1) / 2.0
    k2 = kappa * kappa
    ra, rb = torch.sqrt(a * a + k2), torch.sqrt(b * b + k2)
    return (dim - 1) / 4.0 * (torch.log(a + ra) + torch.log(a + rb)) - 0.5 * (ra + rb)


def ps_log_normalizer(kappa: torch.Tensor, dim: int) -> torch.Tensor:
    """ln C_d(kappa) of the Power Spherical (Sec. 4.2): C^{-1} = 2^{a+b} pi^b G(a) / G(a+b),
    a = (d-1)/2 + kappa, b = (d-1)/2; kappa = 0 is the uniform density."""
    beta = (dim - 1) / 2.0
    alpha = beta + kappa
    log_inv_c = (alpha + beta) * math.log(2.0) + beta * math.log(math.pi) + torch.lgamma(alpha)
    return -(log_inv_c - torch.lgamma(alpha + beta))


class _Spherical(Distribution):
    """Rotationally symmetric around ``loc`` on the unit sphere."""

    arg_constraints = {"loc": constraints.real_vector, "scale": constraints.nonnegative}
    support = constraints.real_vector  # the unit sphere; torch has no such constraint

    def __init__(self, loc: torch.Tensor, scale: torch.Tensor, validate_args: bool | None = None):
        scale = torch.as_tensor(scale, dtype=loc.dtype, device=loc.device)
        batch_shape = torch.broadcast_shapes(loc.shape[:-1], scale.shape)
        self.loc, self.scale = loc.expand(*batch_shape, loc.shape[-1]), scale.expand(batch_shape)
        self.dim = loc.shape[-1]
        super().__init__(batch_shape, torch.Size([self.dim]), validate_args=validate_args)

    @property
    def mean(self) -> torch.Tensor:
        return self.mean_resultant_length().unsqueeze(-1) * self.loc


class VonMisesFisher(_Spherical):
    """vMF(mu, kappa): p(x) = C_d(kappa) exp(kappa mu^T x) (Sec. 4.2)."""

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        return vmf_log_normalizer(self.scale, self.dim) + self.scale * (self.loc * value).sum(-1)

    def mean_resultant_length(self) -> torch.Tensor:
        """A_d(kappa) = I_{d/2}(kappa) / I_{d/2-1}(kappa) = E[mu^T x]."""
        k64 = self.scale.to(torch.float64).clamp_min(_KAPPA_FLOOR)
        log_ratio = log_bessel_iv(self.dim / 2.0, k64) - log_bessel_iv(self.dim / 2.0 - 1.0, k64)
        return log_ratio.exp().to(self.scale.dtype)

    def entropy(self) -> torch.Tensor:
        log_c = vmf_log_normalizer(self.scale, self.dim)
        return -log_c - self.scale * self.mean_resultant_length()


class PowerSpherical(_Spherical):
    """PS(mu, kappa): p(x) = C_d(kappa) (1 + mu^T x)^kappa (Sec. 4.2); (1 + mu^T x) / 2 ~
    Beta((d-1)/2 + kappa, (d-1)/2)."""

    def _alpha_beta(self) -> tuple[torch.Tensor, torch.Tensor]:
        beta = torch.full_like(self.scale, (self.dim - 1) / 2.0)
        return beta + self.scale, beta

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        log1p_cos = torch.log1p((self.loc * value).sum(-1))
        return ps_log_normalizer(self.scale, self.dim) + self.scale * log1p_cos

    def mean_resultant_length(self) -> torch.Tensor:
        alpha, beta = self._alpha_beta()
        return (alpha - beta) / (alpha + beta)

    def entropy(self) -> torch.Tensor:
        alpha, beta = self._alpha_beta()
        expected_log = math.log(2.0) + torch.digamma(alpha) - torch.digamma(alpha + beta)
        return -(ps_log_normalizer(self.scale, self.dim) + self.scale * expected_log)
