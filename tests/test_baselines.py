"""The baselines' formulas against scipy, quadrature and Monte Carlo, and their uncertainties."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import integrate, special
from scipy.stats import gennorm, multivariate_normal, norm

from asymvlm.methods import build_method
from asymvlm.methods.base import unit
from asymvlm.methods.elip import (
    bayes_risk,
    dirichlet_alpha,
    evidential_loss,
    misleading_evidence_kl,
)
from asymvlm.methods.gaussian import (
    csd,
    inclusion_loss,
    log_inclusion,
    mutual_likelihood_score,
    probabilistic_cosine,
)
from asymvlm.methods.probvlm import ggd_nll, ggd_variance
from tests.helpers import rotated_pairs

F64 = torch.float64

pytestmark = pytest.mark.usefixtures("one_thread")


def half_noisy_pairs(n: int, seed: int, d: int = 16) -> tuple[torch.Tensor, ...]:
    """Images in the first d/2 dims; captions = image + light noise, every other one with heavy
    noise in the last d/2 dims; all captions of raw norm 3 (so heads cannot read the noise off
    the norm)."""
    g = torch.Generator().manual_seed(seed)
    img = torch.zeros(n, d)
    img[:, : d // 2] = torch.randn(n, d // 2, generator=g)
    img = unit(img)
    txt = img + 0.05 * torch.randn(n, d, generator=g)
    noisy = torch.arange(n) % 2 == 1
    txt[noisy, d // 2 :] += torch.randn(int(noisy.sum()), d // 2, generator=g)
    return img, 3.0 * unit(txt), noisy


def _gaussians(n: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mu = torch.randn(n, d, generator=g, dtype=F64)
    return mu, torch.rand(n, d, generator=g, dtype=F64) * 0.5 + 0.05


# -- formulas --------------------------------------------------------------------------------
def test_ggd_nll_and_variance_match_scipy_gennorm() -> None:
    cases = [(0.3, 0.1, 0.5, 2.0), (-1.2, 0.4, 0.2, 1.0), (0.05, 0.0, 1.7, 0.7), (2.0, -0.5, 3, 5)]
    x, mu, alpha, beta = (torch.tensor(c, dtype=F64) for c in zip(*cases, strict=True))
    ref = -gennorm.logpdf(x.numpy(), beta.numpy(), loc=mu.numpy(), scale=alpha.numpy())
    np.testing.assert_allclose(ggd_nll(x, mu, 1.0 / alpha, beta).numpy(), ref, rtol=1e-10)
    ref_var = gennorm.var(beta.numpy(), scale=alpha.numpy())
    np.testing.assert_allclose(ggd_variance(1.0 / alpha, beta).numpy(), ref_var, rtol=1e-10)
    # at the extremes of the heads' ranges: finite values and gradients
    x = torch.tensor([0.0, 5.0, 0.0, 5.0, 1e-9])
    mu = torch.tensor([0.0, -5.0, 0.0, -5.0, 0.0], requires_grad=True)
    inv_alpha = torch.tensor([1e-4, 1e4, 1e4, 1e-4, 1.0], requires_grad=True)
    beta = torch.tensor([0.1, 100.0, 0.1, 100.0, 0.1], requires_grad=True)
    nll = ggd_nll(x, mu, inv_alpha, beta)
    nll.sum().backward()
    assert all(torch.isfinite(t).all() for t in (nll, mu.grad, inv_alpha.grad, beta.grad))


def test_mutual_likelihood_score_is_log_density_of_difference() -> None:
    """MLS + const = ln int N(x; mu1, S1) N(x; mu2, S2) dx = ln N(mu1; mu2, S1 + S2)."""
    (mu1, var1), (mu2, var2) = _gaussians(4, 5, seed=1), _gaussians(4, 5, seed=2)
    ours = mutual_likelihood_score(mu1, var1, mu2, var2).numpy() - 2.5 * math.log(2 * math.pi)
    for r in range(4):
        cov = np.diag((var1[r] + var2[r]).numpy())
        ref = multivariate_normal.logpdf(mu1[r].numpy(), mu2[r].numpy(), cov)
        assert ours[r] == pytest.approx(ref, rel=1e-10)


def test_csd_and_probabilistic_cosine() -> None:
    """CSD = E||z1 - z2||^2 (Monte Carlo); probabilistic cosine = 1 - CSD / 2 for unit means."""
    (mu1, var1), (mu2, var2) = _gaussians(3, 4, seed=3), _gaussians(2, 4, seed=4)
    ours = csd(mu1, var1, mu2, var2)
    g, n = torch.Generator().manual_seed(5), 100_000
    for i in range(3):
        for j in range(2):
            z1 = mu1[i] + var1[i].sqrt() * torch.randn(n, 4, generator=g, dtype=F64)
            z2 = mu2[j] + var2[j].sqrt() * torch.randn(n, 4, generator=g, dtype=F64)
            assert float(ours[i, j]) == pytest.approx(
                float(((z1 - z2) ** 2).sum(-1).mean()), rel=0.01
            )
    mu1, mu2 = unit(mu1), unit(mu2)
    torch.testing.assert_close(
        probabilistic_cosine(mu1, var1, mu2, var2), 1.0 - 0.5 * csd(mu1, var1, mu2, var2)
    )


def test_log_inclusion_matches_quadrature_and_the_loss_its_sign() -> None:
    """inc(Z1, Z2) = ln int p1^2 p2 dx per dimension, summed over dimensions (ProLIP Eq. 3);
    L_inc is ln 2 for identical Gaussians and smaller for a narrow Z1 inside a wide Z2."""
    cases = [(0.0, 1.0, 0.0, 1.0), (0.3, 0.2, -0.4, 1.5), (-0.7, 0.05, 0.2, 0.8), (2, 0.5, 1.5, 3)]

    def integrand(x: float, m1: float, v1: float, m2: float, v2: float) -> float:
        return norm.pdf(x, m1, math.sqrt(v1)) ** 2 * norm.pdf(x, m2, math.sqrt(v2))

    refs = [math.log(integrate.quad(integrand, -np.inf, np.inf, args=c)[0]) for c in cases]
    m1, v1, m2, v2 = (torch.tensor([c], dtype=F64) for c in zip(*cases, strict=True))
    ours = log_inclusion(m1, v1.log(), m2, v2.log())  # the four cases as dims of one Gaussian
    assert float(ours) == pytest.approx(sum(refs), abs=1e-8)
    zero, narrow, wide = torch.zeros(1, 4), torch.full((1, 4), math.log(0.1)), torch.zeros(1, 4)
    assert float(inclusion_loss(zero, wide, zero, wide)) == pytest.approx(math.log(2.0))
    inside = float(inclusion_loss(zero, narrow, zero, wide))
    assert inside < 0.01 < float(inclusion_loss(zero, wide, zero, narrow))


def test_evidential_loss_is_bayes_risk_plus_weighted_kl() -> None:
    """alpha = exp(tau cos) + 1, tau cos capped at 30 (Eq. 6); Bayes risk = E[-ln p_y] under
    Dir(alpha) (Monte Carlo); the KL has ELIP's closed form (Eq. 9); the loss their weighted sum."""
    big = dirichlet_alpha(torch.ones(1, 2), torch.tensor(1e4))
    assert float(big[0, 0]) == pytest.approx(math.exp(30) + 1)
    alpha = torch.tensor([[2.0, 5.0, 1.5, 3.0]], dtype=F64)
    y = torch.tensor([[0.0, 1.0, 0.0, 0.0]], dtype=F64)
    p = np.random.default_rng(0).dirichlet(alpha[0].numpy(), size=200_000)
    assert float(bayes_risk(alpha, y)[0]) == pytest.approx(-np.log(p[:, 1]).mean(), rel=5e-3)
    alpha = 1.0 + 5.0 * torch.rand(3, 6, generator=torch.Generator().manual_seed(10), dtype=F64)
    y = torch.zeros(3, 6, dtype=F64)
    y[torch.arange(3), torch.tensor([0, 4, 2])] = 1.0
    kl = misleading_evidence_kl(alpha, y)
    a = (y + (1 - y) * alpha).numpy()
    s = a.sum(-1, keepdims=True)
    ref = special.gammaln(s) - special.gammaln(6) - special.gammaln(a).sum(-1, keepdims=True)
    ref += ((a - 1) * (special.digamma(a) - special.digamma(s))).sum(-1, keepdims=True)
    np.testing.assert_allclose(kl.numpy(), ref[:, 0], rtol=1e-9)
    risk = bayes_risk(alpha, y).mean()
    assert float(evidential_loss(alpha, y, 0.0)) == pytest.approx(float(risk))
    assert float(evidential_loss(alpha, y, 0.4)) == pytest.approx(float(risk + 0.4 * kl.mean()))


# -- the baselines' uncertainties ------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "ratio", "kwargs"), [("pfe", 5.0, {}), ("probvlm", 1.15, {"cross_weight": 1.0})]
)
def test_noisy_captions_get_higher_uncertainty(name: str, ratio: float, kwargs: dict) -> None:
    """Held-out captions far from their image get wider distributions."""
    img, txt, _ = half_noisy_pairs(256, seed=0)
    _, held_out, noisy = half_noisy_pairs(256, seed=100)
    torch.manual_seed(0)
    method = build_method(name, 16, hidden_dim=64, depth=2, **kwargs)
    opt = torch.optim.AdamW(method.parameters(), lr=1e-3)
    for _ in range(200):
        opt.zero_grad()
        method.loss(img, txt).backward()
        opt.step()
    with torch.no_grad():
        u = method.text_uncertainty(held_out)
    assert float(u[noisy].mean()) > ratio * float(u[~noisy].mean())


def test_elip_gallery_uncertainty_and_state_dict() -> None:
    """ELIP starts at the frozen cosine; u = K / S over a gallery of K training items drawn by
    fit_start (refused before it), restored by load_state_dict."""
    img, txt = rotated_pairs(n=64)
    torch.manual_seed(0)
    method = build_method("elip", 16, hidden_dim=64, depth=2, gallery_size=20)
    with pytest.raises(RuntimeError, match="fit_start"):
        method.text_uncertainty(txt)
    with torch.no_grad():
        assert torch.equal(method.log_likelihood(img, txt), unit(txt) @ unit(img).T)
    method.fit_start(img, txt)
    assert method.gallery_images.shape == (20, 16) and method.gallery_texts.shape == (20, 16)
    with torch.no_grad():
        u = method.text_uncertainty(txt[:8])
        cos = unit(txt[:8]) @ unit(method.gallery_images).T
    torch.testing.assert_close(u, 20 / (torch.exp(10 * cos) + 1).sum(-1))
    assert [method.kl_weight(e) for e in (0, 3, 15, 40)] == [0.0, 0.2, 1.0, 1.0]
    torch.nn.init.normal_(method.text_adapter[-1].weight)  # away from the frozen model
    fresh = build_method("elip", 16, hidden_dim=64, depth=2)
    fresh.load_state_dict(method.state_dict())
    with torch.no_grad():
        assert not torch.allclose(method.log_likelihood(img, txt), unit(txt) @ unit(img).T)
        torch.testing.assert_close(fresh.image_uncertainty(img), method.image_uncertainty(img))
        torch.testing.assert_close(fresh.log_likelihood(img, txt), method.log_likelihood(img, txt))
