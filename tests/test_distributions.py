"""Oracle tests for asymvlm.distributions (paper Sec. 4.2, App. A.1)."""

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
    uniform_log_density,
    vmf_log_normalizer,
    vmf_log_normalizer_approx,
    vmf_mean_resultant_length,
)

F64 = torch.float64


def _unit(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=F64)
    return x / x.norm(dim=-1, keepdim=True)


def _mp_log_iv(v: float, x: float) -> float:
    mpmath.mp.dps = 40
    return float(mpmath.log(mpmath.besseli(v, x)))


@pytest.mark.parametrize("v", [0.0, 0.5, 1.0, 7.5, 31.0, 255.0, 511.0])
@pytest.mark.parametrize("x", [1e-6, 1e-2, 1.0, 17.0, 400.0, 3e4, 1e6])
def test_log_bessel_matches_mpmath(v: float, x: float) -> None:
    ours = log_bessel_iv(v, torch.tensor(x, dtype=F64)).item()
    ref = _mp_log_iv(v, x)
    assert abs(ours - ref) <= 1e-9 * max(1.0, abs(ref))


@pytest.mark.parametrize("dim", [3, 16, 64, 512, 1024])
@pytest.mark.parametrize("kappa", [0.3, 5.0, 50.0, 700.0, 1e4, 1e6])
def test_vmf_log_prob_matches_scipy(dim: int, kappa: float) -> None:
    mu = _unit(dim, seed=dim)
    x = _unit(6, dim, seed=dim + 1)
    x[0] = mu
    x[1] = -mu
    ours = VonMisesFisher(mu, torch.tensor(kappa, dtype=F64)).log_prob(x).numpy()
    with np.errstate(all="ignore"):
        ref = vonmises_fisher(mu.numpy(), kappa).logpdf(x.numpy())
    if not np.all(np.isfinite(ref)):
        # scipy's ive underflows for large d and small kappa: fall back to mpmath.
        v = dim / 2 - 1
        log_c = v * math.log(kappa) - dim / 2 * math.log(2 * math.pi) - _mp_log_iv(v, kappa)
        ref = log_c + kappa * (x @ mu).numpy()
    np.testing.assert_allclose(ours, ref, rtol=1e-9, atol=1e-9)


def test_vmf_log_normalizer_small_kappa_limit_is_uniform() -> None:
    for dim in (3, 512, 1024):
        got = vmf_log_normalizer(torch.tensor([1e-6, 1e-9], dtype=F64), dim)
        np.testing.assert_allclose(got.numpy(), uniform_log_density(dim), atol=1e-6)


@pytest.mark.parametrize("dim", [2, 3, 64, 512, 1024])
def test_finite_values_and_gradients_across_kappa(dim: int) -> None:
    kappa = torch.logspace(-6, 6, 49, dtype=torch.float32).requires_grad_(True)
    mu = _unit(49, dim).float()
    z = _unit(49, dim, seed=3).float()
    for dist_cls in (VonMisesFisher, PowerSpherical):
        lp = dist_cls(mu, kappa).log_prob(z)
        ent = dist_cls(mu, kappa).entropy()
        approx = vmf_log_normalizer_approx(kappa, dim)
        (g,) = torch.autograd.grad((lp + ent + approx).sum(), kappa)
        assert torch.isfinite(lp).all() and torch.isfinite(ent).all()
        assert torch.isfinite(g).all(), dist_cls.__name__


@pytest.mark.parametrize("dim", [3, 16, 128, 512, 1024])
def test_approx_derivative_within_ruiz_antolin_segura_bounds(dim: int) -> None:
    """dF_d/dkappa lies between the bounds on -I_{d/2}/I_{d/2-1} (App. A.1, Remark 2)."""
    kappa = torch.logspace(-3, 5, 200, dtype=F64).requires_grad_(True)
    (deriv,) = torch.autograd.grad(vmf_log_normalizer_approx(kappa, dim).sum(), kappa)
    v = dim / 2.0
    k = kappa.detach()
    lower = k / (v - 0.5 + torch.sqrt((v + 0.5) ** 2 + k**2))  # < I_v / I_{v-1}
    upper = k / (v - 0.5 + torch.sqrt((v - 0.5) ** 2 + k**2))  # > I_v / I_{v-1}
    assert torch.all(deriv <= -lower + 1e-15)
    assert torch.all(deriv >= -upper - 1e-15)
    # ... and close to the exact derivative of ln C_d, which is -A_d(kappa).
    exact = -vmf_mean_resultant_length(k, dim)
    assert torch.all(exact <= -lower + 1e-12) and torch.all(exact >= -upper - 1e-12)
    if dim >= 128:  # the approximation is tight in the dimensions VLMs use
        np.testing.assert_allclose(deriv.numpy(), exact.numpy(), atol=2e-3)


def test_approx_is_exact_up_to_a_constant_at_d512() -> None:
    """F_d(kappa) - ln C_d(kappa) is flat in kappa over the training range (field notes)."""
    kappa = torch.linspace(0.5, 500, 400, dtype=F64)
    diff = vmf_log_normalizer_approx(kappa, 512) - vmf_log_normalizer(kappa, 512)
    assert float(diff.max() - diff.min()) < 0.07
    assert abs(float(diff.mean()) - 469.674) < 0.05


def test_autograd_of_exact_normalizer_is_minus_mean_resultant_length() -> None:
    for dim in (3, 64, 512):
        kappa = torch.tensor([0.01, 1.0, 20.0, 900.0], dtype=F64, requires_grad=True)
        (g,) = torch.autograd.grad(vmf_log_normalizer(kappa, dim).sum(), kappa)
        expected = -vmf_mean_resultant_length(kappa.detach(), dim)
        np.testing.assert_allclose(g.numpy(), expected.numpy(), rtol=1e-7, atol=1e-10)


@pytest.mark.parametrize("dim", [3, 32, 512])
@pytest.mark.parametrize("kappa", [0.01, 2.0, 30.0, 1000.0])
def test_power_spherical_matches_reference_package(dim: int, kappa: float) -> None:
    ref_pkg = pytest.importorskip("power_spherical")
    mu = _unit(dim, seed=7)
    x = _unit(5, dim, seed=8)
    k = torch.tensor(kappa, dtype=F64)
    ours = PowerSpherical(mu, k)
    ref = ref_pkg.PowerSpherical(mu, k)
    np.testing.assert_allclose(ours.log_prob(x).numpy(), ref.log_prob(x).numpy(), rtol=1e-10)
    np.testing.assert_allclose(ours.entropy().numpy(), ref.entropy().numpy(), rtol=1e-10)


def test_power_spherical_normaliser_matches_paper_kernel() -> None:
    """Sec. 4.2: ln C = -(d-1+k) ln2 - lnG((d-1)/2+k) + lnG(d-1+k) - ((d-1)/2) ln pi."""
    dim = 512
    k = torch.tensor([0.0, 1.0, 77.0, 5000.0], dtype=F64)
    paper = (
        -(dim - 1 + k) * math.log(2)
        - torch.lgamma((dim - 1) / 2 + k)
        + torch.lgamma(dim - 1 + k)
        - (dim - 1) / 2 * math.log(math.pi)
    )
    np.testing.assert_allclose(ps_log_normalizer(k, dim).numpy(), paper.numpy(), rtol=1e-12)


@pytest.mark.parametrize("cls", [VonMisesFisher, PowerSpherical])
@pytest.mark.parametrize("dim,kappa", [(3, 0.5), (3, 20.0), (64, 10.0), (64, 200.0), (512, 50.0)])
def test_samples_have_the_right_mean_resultant_length(cls, dim: int, kappa: float) -> None:
    torch.manual_seed(0)
    mu = _unit(dim, seed=11)
    dist = cls(mu, torch.tensor(kappa, dtype=F64))
    x = dist.sample((5000,))
    assert x.shape == (5000, dim)
    np.testing.assert_allclose(x.norm(dim=-1).numpy(), 1.0, atol=1e-9)
    cos = (x @ mu).numpy()
    expected = float(dist.mean_resultant_length())
    se = cos.std() / math.sqrt(len(cos))
    assert abs(cos.mean() - expected) < 5 * se + 1e-4
    # The tangent component is isotropic: its mean vanishes.
    tangent = x - torch.from_numpy(cos)[:, None] * mu
    assert tangent.mean(0).norm() < 5 * math.sqrt(dim / 5000)


def test_vmf_mean_resultant_length_against_scipy_samples() -> None:
    mu = np.eye(5)[0]
    samples = vonmises_fisher(mu, 4.0).rvs(50000, random_state=1)
    expected = float(vmf_mean_resultant_length(torch.tensor(4.0, dtype=F64), 5))
    assert abs(samples[:, 0].mean() - expected) < 4 * samples[:, 0].std() / math.sqrt(50000)


def test_vmf_entropy_monte_carlo() -> None:
    torch.manual_seed(1)
    dist = VonMisesFisher(_unit(10, seed=2), torch.tensor(6.0, dtype=F64))
    x = dist.sample((40000,))
    mc = -dist.log_prob(x).mean()
    assert abs(float(mc - dist.entropy())) < 0.02


def test_batch_shapes_and_broadcasting() -> None:
    loc = _unit(4, 3, 8)
    scale = torch.rand(4, 3, dtype=F64) * 10
    for cls in (VonMisesFisher, PowerSpherical):
        d = cls(loc, scale)
        assert d.batch_shape == (4, 3) and d.event_shape == (8,)
        s = d.rsample((5,))
        assert s.shape == (5, 4, 3, 8)
        assert d.log_prob(s).shape == (5, 4, 3)
        assert d.mean.shape == (4, 3, 8)
        # One direction, several concentrations.
        d2 = cls(loc[0, 0], scale[0])
        assert d2.batch_shape == (3,)


@pytest.mark.parametrize("cls", [VonMisesFisher, PowerSpherical])
def test_rsample_is_differentiable_in_loc_and_scale(cls) -> None:
    torch.manual_seed(0)
    loc = _unit(16).requires_grad_(True)
    scale = torch.tensor(5.0, dtype=F64, requires_grad=True)
    x = cls(loc / loc.norm(), scale).rsample((256,))
    target = torch.zeros(16, dtype=F64)
    target[3] = 1.0
    (x @ target).mean().backward()
    assert loc.grad is not None and torch.isfinite(loc.grad).all() and loc.grad.abs().sum() > 0
    assert scale.grad is not None and torch.isfinite(scale.grad)


def test_higher_concentration_means_higher_density_at_mode() -> None:
    mu = _unit(32)
    k = torch.tensor([1.0, 10.0, 100.0], dtype=F64)
    for cls in (VonMisesFisher, PowerSpherical):
        lp = cls(mu, k).log_prob(mu)
        assert torch.all(lp[1:] > lp[:-1])
        ent = cls(mu, k).entropy()
        assert torch.all(ent[1:] < ent[:-1])
