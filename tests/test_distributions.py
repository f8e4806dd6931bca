"""asymvlm.distributions against mpmath, scipy, power_spherical and Monte Carlo (Sec. 4.2)."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch
from scipy.stats import vonmises_fisher

from asymvlm.distributions import (
    PowerSpherical,
    VonMisesFisher,
    log_bessel_iv,
    ps_log_normalizer,
    vmf_log_normalizer,
    vmf_log_normalizer_approx,
)

F64 = torch.float64
CLASSES = [VonMisesFisher, PowerSpherical]


def _unit(*shape: int, seed: int = 0) -> torch.Tensor:
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)
    return x / x.norm(dim=-1, keepdim=True)


def _mp_log_iv(v: float, x: float) -> float:
    mpmath.mp.dps = 40
    return float(mpmath.log(mpmath.besseli(v, x)))


@pytest.mark.parametrize("v", [0.0, 0.5, 7.5, 31.0, 255.0])
def test_log_bessel_matches_mpmath(v: float) -> None:
    for x in (1e-6, 1e-2, 1.0, 17.0, 400.0, 3e4, 1e6):
        ref = _mp_log_iv(v, x)
        ours = log_bessel_iv(v, torch.tensor(x, dtype=F64)).item()
        assert abs(ours - ref) <= 1e-9 * max(1.0, abs(ref)), (v, x)


@pytest.mark.parametrize("dim", [3, 64, 512, 1024])
def test_vmf_log_prob_matches_scipy(dim: int) -> None:
    mu = _unit(dim, seed=dim)
    x = _unit(6, dim, seed=dim + 1)
    x[0], x[1] = mu, -mu
    for kappa in (0.3, 50.0, 700.0, 1e6):
        ours = VonMisesFisher(mu, torch.tensor(kappa, dtype=F64)).log_prob(x).numpy()
        with np.errstate(all="ignore"):
            ref = vonmises_fisher(mu.numpy(), kappa).logpdf(x.numpy())
        if not np.all(np.isfinite(ref)):  # scipy's ive underflows at large d, small kappa
            v = dim / 2 - 1
            log_c = v * math.log(kappa) - dim / 2 * math.log(2 * math.pi) - _mp_log_iv(v, kappa)
            ref = log_c + kappa * (x @ mu).numpy()
        np.testing.assert_allclose(ours, ref, rtol=1e-9, atol=1e-9)
        with np.errstate(all="ignore"):
            ref = vonmises_fisher(mu.numpy(), kappa).entropy()
        if np.isfinite(ref) and kappa < 1e5:  # scipy's underflows or loses digits
            entropy = VonMisesFisher(mu, torch.tensor(kappa, dtype=F64)).entropy()
            np.testing.assert_allclose(float(entropy), ref, rtol=1e-7, atol=1e-7)


def test_normalisers_at_small_kappa_are_the_uniform_density() -> None:
    for dim in (3, 512, 1024):
        uniform = math.lgamma(dim / 2) - math.log(2) - dim / 2 * math.log(math.pi)
        got = vmf_log_normalizer(torch.tensor([1e-6, 1e-9], dtype=F64), dim)
        np.testing.assert_allclose(got.numpy(), uniform, atol=1e-6)
        assert float(ps_log_normalizer(torch.zeros((), dtype=F64), dim)) == pytest.approx(uniform)


@pytest.mark.parametrize("dim", [2, 64, 1024])
def test_finite_values_and_gradients_across_kappa(dim: int) -> None:
    kappa = torch.logspace(-6, 6, 49, dtype=torch.float32).requires_grad_(True)
    mu, z = _unit(49, dim).float(), _unit(49, dim, seed=3).float()
    for cls in CLASSES:
        lp, ent = cls(mu, kappa).log_prob(z), cls(mu, kappa).entropy()
        (g,) = torch.autograd.grad((lp + ent + vmf_log_normalizer_approx(kappa, dim)).sum(), kappa)
        assert torch.isfinite(lp).all() and torch.isfinite(ent).all() and torch.isfinite(g).all()


@pytest.mark.parametrize("dim", [3, 16, 128, 512])
def test_approx_derivative_within_ruiz_antolin_segura_bounds(dim: int) -> None:
    """dF_d/dkappa and the exact d ln C_d/dkappa = -A_d(kappa) lie between the bounds on
    -I_{d/2}/I_{d/2-1} (App. A.1, Remark 2), and agree closely for VLM dimensions."""
    kappa = torch.logspace(-3, 5, 200, dtype=F64).requires_grad_(True)
    (approx,) = torch.autograd.grad(vmf_log_normalizer_approx(kappa, dim).sum(), kappa)
    (exact,) = torch.autograd.grad(vmf_log_normalizer(kappa, dim).sum(), kappa)
    k, v = kappa.detach(), dim / 2.0
    mean_length = VonMisesFisher(_unit(dim), k).mean_resultant_length()
    np.testing.assert_allclose(exact.numpy(), -mean_length.numpy(), rtol=1e-7, atol=1e-10)
    lower = k / (v - 0.5 + torch.sqrt((v + 0.5) ** 2 + k**2))
    upper = k / (v - 0.5 + torch.sqrt((v - 0.5) ** 2 + k**2))
    for deriv in (approx, -mean_length):
        assert torch.all(deriv <= -lower + 1e-12) and torch.all(deriv >= -upper - 1e-12)
    if dim >= 128:
        np.testing.assert_allclose(approx.numpy(), exact.numpy(), atol=2e-3)


def test_approx_is_exact_up_to_a_constant_at_d512() -> None:
    """F_d - ln C_d is flat (< 0.07 nats) over kappa in [0.5, 500], while ln C_d moves by
    hundreds of nats (App. A.1)."""
    kappa = torch.linspace(0.5, 500, 400, dtype=F64)
    exact = vmf_log_normalizer(kappa, 512)
    diff = vmf_log_normalizer_approx(kappa, 512) - exact
    assert float(diff.max() - diff.min()) < 0.07 and abs(float(diff.mean()) - 469.674) < 0.05
    assert float(exact.max() - exact.min()) > 100.0


@pytest.mark.parametrize("dim", [3, 512])
def test_power_spherical_matches_reference_package_and_paper(dim: int) -> None:
    ref_pkg = pytest.importorskip("power_spherical")
    mu, x = _unit(dim, seed=7), _unit(5, dim, seed=8)
    for kappa in (0.01, 30.0, 1000.0):
        k = torch.tensor(kappa, dtype=F64)
        ours, ref = PowerSpherical(mu, k), ref_pkg.PowerSpherical(mu, k)
        np.testing.assert_allclose(ours.log_prob(x).numpy(), ref.log_prob(x).numpy(), rtol=1e-10)
        np.testing.assert_allclose(ours.entropy().numpy(), ref.entropy().numpy(), rtol=1e-10)


def test_vmf_mean_resultant_length_against_scipy_samples() -> None:
    samples = vonmises_fisher(np.eye(5)[0], 4.0).rvs(50000, random_state=1)[:, 0]
    expected = float(VonMisesFisher(_unit(5), torch.tensor(4.0, dtype=F64)).mean_resultant_length())
    assert abs(samples.mean() - expected) < 4 * samples.std() / math.sqrt(50000)


@pytest.mark.parametrize("cls", CLASSES)
def test_shapes_and_concentration(cls) -> None:
    """Batch shapes broadcast; density at the mode rises and entropy falls with kappa."""
    loc, scale = _unit(4, 3, 8), torch.rand(4, 3, dtype=F64) * 10
    d = cls(loc, scale)
    assert (d.batch_shape, d.event_shape, d.mean.shape) == ((4, 3), (8,), (4, 3, 8))
    assert cls(loc[0, 0], scale[0]).batch_shape == (3,) and d.log_prob(loc).shape == (4, 3)
    mu, k = _unit(32), torch.tensor([1.0, 10.0, 100.0], dtype=F64)
    assert torch.all(cls(mu, k).log_prob(mu).diff() > 0)
    assert torch.all(cls(mu, k).entropy().diff() < 0)
