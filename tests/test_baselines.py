"""Tests for asymvlm.methods.baselines: each formula against an independent computation, and
each registered baseline (probvlm, pfe, pcmepp, prolip, elip) on small synthetic pairs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import integrate, special
from scipy.stats import gennorm, multivariate_normal

from asymvlm.methods import build_method
from asymvlm.methods.base import unit
from asymvlm.methods.baselines.elip import (
    bayes_risk,
    dirichlet_alpha,
    evidential_loss,
    evidential_uncertainty,
    misleading_evidence_kl,
)
from asymvlm.methods.baselines.gaussian import (
    csd,
    inclusion_hypothesis,
    inclusion_loss,
    log_inclusion,
    mutual_likelihood_score,
    probabilistic_cosine,
)
from asymvlm.methods.baselines.probvlm import ggd_nll, ggd_variance
from tests.helpers import rotated_pairs

F64 = torch.float64
POST_HOC = ["pfe", "pcmepp", "prolip"]
SMALL = {"hidden_dim": 64, "depth": 2}


pytestmark = pytest.mark.usefixtures("one_thread")


def half_noisy_pairs(
    n: int, d: int = 16, seed: int = 0, heavy: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Images in the first d/2 dims; captions = image + light noise, and for every other pair
    heavy noise in the last d/2 dims. Captions are given a common raw norm (3): with raw norms
    that grow with the noise, ReLU heads see the norm, which confounds what is being tested."""
    g = torch.Generator().manual_seed(seed)
    half = d // 2
    img = torch.zeros(n, d)
    img[:, :half] = torch.randn(n, half, generator=g)
    img = unit(img)
    txt = img + 0.05 * torch.randn(n, d, generator=g)
    noisy = torch.arange(n) % 2 == 1
    txt[noisy, half:] += heavy * torch.randn(int(noisy.sum()), half, generator=g)
    return img, 3.0 * unit(txt), noisy


def train(
    method: torch.nn.Module,
    img: torch.Tensor,
    txt: torch.Tensor,
    steps: int,
    *,
    epoch: int = 0,
    lr: float = 1e-3,
) -> list[float]:
    opt = torch.optim.AdamW(method.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = method.loss(img, txt, epoch=epoch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def make(name: str, seed: int = 0, **kwargs) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_method(name, dim=16, **SMALL, **kwargs)


# -- ProbVLM formulas ------------------------------------------------------------------------

GGD_CASES = [  # (x, mu, alpha, beta)
    (0.3, 0.1, 0.5, 2.0),
    (-1.2, 0.4, 0.2, 1.0),
    (0.05, 0.0, 1.7, 0.7),
    (2.0, -0.5, 3.0, 5.0),
    (0.11, 0.1, 0.01, 1.5),
]


def test_ggd_nll_matches_scipy_gennorm() -> None:
    x, mu, alpha, beta = (torch.tensor(c, dtype=F64) for c in zip(*GGD_CASES, strict=True))
    ours = ggd_nll(x, mu, 1.0 / alpha, beta).numpy()
    ref = -gennorm.logpdf(x.numpy(), beta.numpy(), loc=mu.numpy(), scale=alpha.numpy())
    np.testing.assert_allclose(ours, ref, rtol=1e-10)


def test_ggd_variance_matches_scipy_gennorm() -> None:
    _, _, alpha, beta = (torch.tensor(c, dtype=F64) for c in zip(*GGD_CASES, strict=True))
    ours = ggd_variance(1.0 / alpha, beta).numpy()
    ref = gennorm.var(beta.numpy(), scale=alpha.numpy())
    np.testing.assert_allclose(ours, ref, rtol=1e-10)
    # beta = 2 is a Gaussian with sigma^2 = alpha^2 / 2
    assert float(ggd_variance(torch.tensor(2.0), torch.tensor(2.0))) == pytest.approx(0.125)


def test_ggd_nll_finite_with_gradients_at_extremes() -> None:
    x = torch.tensor([0.0, 5.0, 0.0, 5.0, 1e-9])
    mu = torch.tensor([0.0, -5.0, 0.0, -5.0, 0.0], requires_grad=True)
    inv_alpha = torch.tensor([1e-4, 1e4, 1e4, 1e-4, 1.0], requires_grad=True)
    beta = torch.tensor([0.1, 100.0, 0.1, 100.0, 0.1], requires_grad=True)
    nll = ggd_nll(x, mu, inv_alpha, beta)
    nll.sum().backward()
    for t in (nll, mu.grad, inv_alpha.grad, beta.grad):
        assert torch.isfinite(t).all()


# -- PFE / PCME++ / ProLIP formulas ----------------------------------------------------------


def _gaussians(n: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mu = torch.randn(n, d, generator=g, dtype=F64)
    var = torch.rand(n, d, generator=g, dtype=F64) * 0.5 + 0.05
    return mu, var


def test_mutual_likelihood_score_is_log_density_of_difference() -> None:
    """MLS + const = ln int N(x; mu1, S1) N(x; mu2, S2) dx = ln N(mu1; mu2, S1 + S2)."""
    d = 5
    mu1, var1 = _gaussians(4, d, seed=1)
    mu2, var2 = _gaussians(4, d, seed=2)
    ours = mutual_likelihood_score(mu1, var1, mu2, var2).numpy()
    for r in range(4):
        cov = np.diag((var1[r] + var2[r]).numpy())
        ref = multivariate_normal.logpdf(mu1[r].numpy(), mu2[r].numpy(), cov)
        assert ours[r] - 0.5 * d * math.log(2 * math.pi) == pytest.approx(ref, rel=1e-10)


def test_csd_matches_monte_carlo_expected_squared_distance() -> None:
    mu1, var1 = _gaussians(3, 4, seed=3)
    mu2, var2 = _gaussians(2, 4, seed=4)
    ours = csd(mu1, var1, mu2, var2)
    assert ours.shape == (3, 2)
    g = torch.Generator().manual_seed(5)
    n = 400_000
    for i in range(3):
        for j in range(2):
            z1 = mu1[i] + var1[i].sqrt() * torch.randn(n, 4, generator=g, dtype=F64)
            z2 = mu2[j] + var2[j].sqrt() * torch.randn(n, 4, generator=g, dtype=F64)
            mc = ((z1 - z2) ** 2).sum(-1).mean()
            assert float(ours[i, j]) == pytest.approx(float(mc), rel=0.01)


def test_probabilistic_cosine_is_one_minus_half_csd_for_unit_means() -> None:
    mu1, var1 = _gaussians(5, 8, seed=6)
    mu2, var2 = _gaussians(3, 8, seed=7)
    mu1, mu2 = unit(mu1), unit(mu2)
    torch.testing.assert_close(
        probabilistic_cosine(mu1, var1, mu2, var2), 1.0 - 0.5 * csd(mu1, var1, mu2, var2)
    )


INCLUSION_CASES = [  # (mu1, sigma1^2, mu2, sigma2^2)
    (0.0, 1.0, 0.0, 1.0),
    (0.3, 0.2, -0.4, 1.5),
    (1.0, 2.0, 0.0, 0.3),
    (-0.7, 0.05, 0.2, 0.8),
    (2.0, 0.5, 1.5, 3.0),
]


@pytest.mark.parametrize(("m1", "v1", "m2", "v2"), INCLUSION_CASES)
def test_log_inclusion_matches_quadrature(m1: float, v1: float, m2: float, v2: float) -> None:
    def integrand(x: float) -> float:
        p1 = math.exp(-((x - m1) ** 2) / (2 * v1)) / math.sqrt(2 * math.pi * v1)
        p2 = math.exp(-((x - m2) ** 2) / (2 * v2)) / math.sqrt(2 * math.pi * v2)
        return p1 * p1 * p2

    ref, _ = integrate.quad(integrand, -np.inf, np.inf, epsabs=0, epsrel=1e-12)
    t = lambda v: torch.tensor([v], dtype=F64)  # noqa: E731
    ours = log_inclusion(t(m1), t(math.log(v1)), t(m2), t(math.log(v2)))
    assert float(ours) == pytest.approx(math.log(ref), abs=1e-9)


def test_log_inclusion_sums_over_dimensions() -> None:
    mu1, var1 = _gaussians(2, 3, seed=8)
    mu2, var2 = _gaussians(2, 3, seed=9)
    full = log_inclusion(mu1, var1.log(), mu2, var2.log())
    per_dim = sum(
        log_inclusion(
            mu1[:, k : k + 1], var1[:, k : k + 1].log(), mu2[:, k : k + 1], var2[:, k : k + 1].log()
        )
        for k in range(3)
    )
    torch.testing.assert_close(full, per_dim)


def test_inclusion_hypothesis_signs() -> None:
    d = 4
    zero, narrow, wide = torch.zeros(d), torch.full((d,), math.log(0.1)), torch.full((d,), 0.0)
    inside = inclusion_hypothesis(zero + 0.1, narrow, zero, wide)
    outside = inclusion_hypothesis(zero, wide, zero + 0.1, narrow)
    same = inclusion_hypothesis(zero + 0.3, wide, zero + 0.3, wide)
    assert float(inside) > 1.0
    assert float(outside) == pytest.approx(-float(inside))
    assert abs(float(same)) < 1e-6
    # identical distributions: H = 0, so the loss is ln 2
    assert float(inclusion_loss(zero[None], wide[None], zero[None], wide[None])) == pytest.approx(
        math.log(2.0)
    )
    # a narrow Z_v inside a wide Z_t costs less than the reverse
    assert float(inclusion_loss(zero[None], narrow[None], zero[None], wide[None])) < float(
        inclusion_loss(zero[None], wide[None], zero[None], narrow[None])
    )


# -- ELIP formulas ---------------------------------------------------------------------------


def test_dirichlet_alpha_and_uncertainty_mass() -> None:
    cos = torch.zeros(3, 7)
    alpha = dirichlet_alpha(cos, 10.0)
    torch.testing.assert_close(alpha, torch.full((3, 7), 2.0))  # e = exp(0) = 1
    torch.testing.assert_close(evidential_uncertainty(alpha), torch.full((3,), 0.5))
    # u = K / sum(e + 1) with no evidence is 1; the cap at 30 keeps exp finite
    big = dirichlet_alpha(torch.ones(1, 2), torch.tensor(1e4))
    assert torch.isfinite(big).all() and float(big[0, 0]) == pytest.approx(math.exp(30) + 1)


def test_bayes_risk_is_expected_cross_entropy_under_dirichlet() -> None:
    alpha = torch.tensor([[2.0, 5.0, 1.5, 3.0]], dtype=F64)
    y = torch.tensor([[0.0, 1.0, 0.0, 0.0]], dtype=F64)
    rng = np.random.default_rng(0)
    p = rng.dirichlet(alpha[0].numpy(), size=400_000)
    mc = -np.log(p[:, 1]).mean()
    assert float(bayes_risk(alpha, y)[0]) == pytest.approx(mc, rel=5e-3)


def _kl_closed_form(alpha_tilde: np.ndarray) -> float:
    """ELIP's closed form: ln(Gamma(S)/(Gamma(K) prod Gamma(a))) + sum (a-1)(psi(a)-psi(S))."""
    s, k = alpha_tilde.sum(), alpha_tilde.size
    log_norm = special.gammaln(s) - special.gammaln(k) - special.gammaln(alpha_tilde).sum()
    return float(
        log_norm + ((alpha_tilde - 1) * (special.digamma(alpha_tilde) - special.digamma(s))).sum()
    )


def test_misleading_evidence_kl_matches_elip_closed_form() -> None:
    g = torch.Generator().manual_seed(10)
    alpha = 1.0 + 5.0 * torch.rand(3, 6, generator=g, dtype=F64)
    y = torch.zeros(3, 6, dtype=F64)
    y[torch.arange(3), torch.tensor([0, 4, 2])] = 1.0
    ours = misleading_evidence_kl(alpha, y).numpy()
    for r in range(3):
        alpha_tilde = (y[r] + (1 - y[r]) * alpha[r]).numpy()
        assert alpha_tilde[int(y[r].argmax())] == 1.0
        assert ours[r] == pytest.approx(_kl_closed_form(alpha_tilde), rel=1e-9)
    # all-ones alpha~ is the uniform Dirichlet itself
    assert float(misleading_evidence_kl(torch.ones(1, 5), torch.eye(5)[:1])) == pytest.approx(
        0.0, abs=1e-6
    )


def test_evidential_loss_combines_risk_and_weighted_kl() -> None:
    g = torch.Generator().manual_seed(11)
    alpha = 1.0 + 3.0 * torch.rand(4, 4, generator=g, dtype=F64)
    y = torch.eye(4, dtype=F64)
    risk = bayes_risk(alpha, y).mean()
    kl = misleading_evidence_kl(alpha, y).mean()
    assert float(evidential_loss(alpha, y, 0.0)) == pytest.approx(float(risk))
    assert float(evidential_loss(alpha, y, 0.4)) == pytest.approx(float(risk + 0.4 * kl))


# -- every baseline through the Method interface ---------------------------------------------


@pytest.mark.parametrize("name", POST_HOC)
def test_post_hoc_scores_are_frozen_cosines(name: str) -> None:
    img, txt = rotated_pairs(seed=1, scale=1.0)
    method = make(name)
    train(method, img, txt, 5)
    with torch.no_grad():
        for raw in (txt, 7.3 * txt):
            scores = method.log_likelihood(img, raw)
            assert torch.equal(scores, unit(raw) @ unit(img).T)
            torch.testing.assert_close(scores, unit(txt) @ img.T)


# -- ProbVLM ---------------------------------------------------------------------------------


def test_probvlm_uncertainty_is_mean_ggd_variance() -> None:
    img, txt = rotated_pairs()
    method = make("probvlm")
    with torch.no_grad():
        enc = method.encode_texts(txt[:5])
        u = method.text_uncertainty_from(enc)
    alpha = (1.0 / enc["inv_alpha"]).double().numpy()
    ref = gennorm.var(enc["beta"].double().numpy(), scale=alpha).mean(-1)
    np.testing.assert_allclose(u.numpy(), ref, rtol=1e-4)


def test_probvlm_cross_modal_term_makes_noisy_captions_more_uncertain() -> None:
    """With a strong cross-modal term, captions far from their image get wider GGDs."""
    img, txt, _ = half_noisy_pairs(256, seed=0)
    img2, txt2, noisy = half_noisy_pairs(256, seed=100)
    method = make("probvlm", cross_weight=1.0)
    train(method, img, txt, 200)
    with torch.no_grad():
        u = method.text_uncertainty(txt2)
    assert float(u[noisy].mean()) > 1.15 * float(u[~noisy].mean())


# -- PFE uncertainty direction ---------------------------------------------------------------


def test_pfe_noisy_captions_get_higher_uncertainty() -> None:
    img, txt, _ = half_noisy_pairs(256, seed=0)
    img2, txt2, noisy = half_noisy_pairs(256, seed=100)  # held out
    method = make("pfe")
    train(method, img, txt, 200)
    with torch.no_grad():
        u = method.text_uncertainty(txt2)
    assert float(u[noisy].mean()) > 5.0 * float(u[~noisy].mean())


# -- ELIP ------------------------------------------------------------------------------------


def test_elip_starts_at_the_frozen_model() -> None:
    img, txt = rotated_pairs()
    method = make("elip")
    with torch.no_grad():
        assert torch.equal(method.log_likelihood(img, txt), unit(txt) @ unit(img).T)
    train(method, img, txt, 5)
    with torch.no_grad():
        assert not torch.allclose(method.log_likelihood(img, txt), unit(txt) @ unit(img).T)


def test_elip_needs_fit_start() -> None:
    img, txt = rotated_pairs()
    method = make("elip")
    with pytest.raises(RuntimeError, match="fit_start"):
        method.text_uncertainty(txt)
    with pytest.raises(RuntimeError, match="fit_start"):
        method.image_uncertainty(img)


def test_elip_gallery_size_and_dependence() -> None:
    img, txt = rotated_pairs(n=64)
    method = make("elip", gallery_size=20)
    method.fit_start(img, txt)
    assert method.gallery_images.shape == (20, 16) and method.gallery_texts.shape == (20, 16)
    with torch.no_grad():
        u1 = method.text_uncertainty(txt[:8])
        cos = unit(txt[:8]) @ unit(method.gallery_images).T  # zero-init: frozen cosines
        torch.testing.assert_close(u1, 20 / (torch.exp(10 * cos) + 1).sum(-1))
        img2, txt2 = rotated_pairs(n=64, seed=5)
        method.fit_start(img2, txt2)
        u2 = method.text_uncertainty(txt[:8])
    assert not torch.allclose(u1, u2)
    assert ((u1 > 0) & (u1 < 1)).all()
    small = make("elip", gallery_size=1000)
    small.fit_start(img[:30], txt[:30])
    assert small.gallery_images.shape[0] == 30


def test_elip_state_dict_round_trip() -> None:
    img, txt = rotated_pairs()
    method = make("elip", gallery_size=32)
    method.fit_start(img, txt)
    train(method, img, txt, 10, epoch=3)
    fresh = make("elip", seed=1, gallery_size=32)
    fresh.load_state_dict(method.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(fresh.text_uncertainty(txt), method.text_uncertainty(txt))
        torch.testing.assert_close(fresh.image_uncertainty(img), method.image_uncertainty(img))
        torch.testing.assert_close(fresh.log_likelihood(img, txt), method.log_likelihood(img, txt))


def test_elip_kl_weight_anneals() -> None:
    method = make("elip", kl_anneal_epochs=15)
    assert [method.kl_weight(e) for e in (0, 3, 15, 40)] == [0.0, 0.2, 1.0, 1.0]
