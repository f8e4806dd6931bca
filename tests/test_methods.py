"""Tests for the method registry, the AsymVLM kernels and methods (Sec. 4, 5.2, App. A) and the
deterministic references (``clip``, ``determ-ft``).

Every kernel is checked against the corresponding ``torch.distributions`` log-density for all
pairs, every loss against a formula written out here from the encodings, and every trainable
registered method is trained briefly on synthetic pairs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import special
from torch.nn import functional as F

from asymvlm.distributions import (
    PowerSpherical,
    VonMisesFisher,
    vmf_log_normalizer,
)
from asymvlm.methods import METHODS, Method, build_method
from asymvlm.methods import asymvlm as asym_module
from asymvlm.methods.asymvlm import (
    gaussian_log_likelihood,
    ps_log_likelihood,
    vmf_log_likelihood,
)
from asymvlm.methods.base import register, unit
from tests.helpers import rotated_pairs

F64 = torch.float64
D = 16
SMALL = {"hidden_dim": 64, "depth": 2}
EXPECTED = {
    "asymvlm-vmf",
    "asymvlm-ps",
    "asymvlm-vmf-siglip",
    "asymvlm-ps-siglip",
    "asymvlm-image",
    "symvlm",
    "asymvlm-gauss",
    "probvlm",
    "pfe",
    "pcmepp",
    "prolip",
    "elip",
    "determ-ft",
    "clip",
    "bayesvlm",
}
TRAINABLE = sorted(name for name, cls in METHODS.items() if cls.trainable)


pytestmark = pytest.mark.usefixtures("one_thread")


def pairs64(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``rotated_pairs`` in float64, images re-normalised in float64."""
    img, txt = rotated_pairs(n, seed=seed)
    return unit(img.double()), txt.double()


def random_unit(n: int, d: int, seed: int, dtype: torch.dtype = F64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return unit(torch.randn(n, d, generator=g, dtype=dtype))


def build64(name: str, seed: int = 0, **kwargs) -> Method:
    torch.manual_seed(seed)
    return build_method(name, D, **SMALL, **kwargs).double()


def f_d(kappa: torch.Tensor, d: int) -> torch.Tensor:
    """F_d(kappa) of App. A.1 (Eq. 4), written out from the paper (up to its constant)."""
    a, b = (d - 1) / 2.0, (d + 1) / 2.0
    ra = torch.sqrt(a**2 + kappa**2)
    rb = torch.sqrt(b**2 + kappa**2)
    return (
        (d - 1) / 4.0 * torch.log(a + ra) - 0.5 * ra + (d - 1) / 4.0 * torch.log(a + rb) - 0.5 * rb
    )


def info_nce_by_hand(logits: torch.Tensor) -> torch.Tensor:
    """Eq. 2: 1/2 (mean_r -ln softmax_row(r)[r] + mean_c -ln softmax_col(c)[c])."""
    rows = -(logits.diagonal() - torch.logsumexp(logits, dim=1)).mean()
    cols = -(logits.diagonal() - torch.logsumexp(logits, dim=0)).mean()
    return 0.5 * (rows + cols)


def vmf_pairs(mu: torch.Tensor, kappa: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """[n_mu, n_z] ln vMF(mu_m, kappa_m)(z_n) via the distribution class."""
    return VonMisesFisher(mu[:, None, :], kappa[:, None]).log_prob(z[None, :, :])


def ps_pairs(mu: torch.Tensor, kappa: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    return PowerSpherical(mu[:, None, :], kappa[:, None]).log_prob(z[None, :, :])


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------


def test_registry_names_exactly() -> None:
    assert set(METHODS) == EXPECTED
    assert len(METHODS) == len(EXPECTED)
    for name, cls in METHODS.items():
        assert cls.name == name
        assert issubclass(cls, Method)
    assert TRAINABLE == sorted(EXPECTED - {"clip", "bayesvlm"})


def test_build_method_unknown_lists_known_names() -> None:
    with pytest.raises(ValueError, match="unknown method 'nope'") as info:
        build_method("nope", 8)
    for name in EXPECTED:
        assert name in str(info.value)


def test_build_method_returns_instance_of_dim() -> None:
    for name in ("asymvlm-vmf", "clip", "determ-ft"):
        m = build_method(name, 8, **({} if name == "clip" else {"hidden_dim": 4, "depth": 1}))
        assert isinstance(m, METHODS[name]) and m.dim == 8 and m.name == name


@pytest.mark.parametrize("name", sorted(set(METHODS) - {"bayesvlm"}))
def test_every_method_keeps_the_interface(name: str) -> None:
    """Scores [n_text, n_image] equal log_likelihood; uncertainties are None exactly where the
    method documents none, else finite and positive per item; a finite scalar loss where
    trainable; finite training stats; SigLIP's bias only in the SigLIP variants."""
    img, txt = rotated_pairs(seed=2)
    torch.manual_seed(0)
    model = build_method(name, D, **({} if name == "clip" else SMALL))
    model.fit_start(img, txt)
    with torch.no_grad():
        texts, images = model.encode_texts(txt[:10]), model.encode_images(img[:7])
        scores = model.score(texts, images)
        torch.testing.assert_close(model.log_likelihood(img[:7], txt[:10]), scores)
        u_t, u_i = model.text_uncertainty_from(texts), model.image_uncertainty_from(images)
    assert scores.shape == (10, 7)
    assert (u_t is None and u_i is None) == (model.uncertainty_doc == "none")
    for u, n in ((u_t, 10), (u_i, 7)):
        assert u is None or (u.shape == (n,) and torch.isfinite(u).all() and (u > 0).all())
    if model.trainable:
        loss = model.loss(img, txt, epoch=3)
        assert loss.ndim == 0 and torch.isfinite(loss)
    else:
        with pytest.raises(NotImplementedError):
            model.loss(img, txt)
    assert all(math.isfinite(v) for v in model.training_stats().values())
    if name.startswith("asymvlm") or name == "symvlm":
        assert ("bias" in dict(model.named_parameters())) == name.endswith("siglip")


def test_register_duplicate_raises_and_leaves_registry_intact() -> None:
    before = dict(METHODS)

    with pytest.raises(ValueError, match="registered twice"):

        @register("clip")
        class Impostor(Method):
            pass

    assert METHODS == before
    assert METHODS["clip"].__name__ == "FrozenCLIP"


# --------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("d", [16, 512])
def test_vmf_kernel_exact_equals_distribution(d: int) -> None:
    mu = random_unit(7, d, seed=1)
    z = random_unit(9, d, seed=2)
    kappa = torch.tensor([0.3, 1.0, 4.0, 20.0, 90.0, 400.0, 2000.0], dtype=F64)
    got = vmf_log_likelihood(mu, kappa, z, exact=True)
    assert got.shape == (7, 9) and got.dtype == F64
    torch.testing.assert_close(got, vmf_pairs(mu, kappa, z), rtol=1e-12, atol=1e-9)


def test_vmf_kernel_normaliser_matches_scipy_bessel() -> None:
    """Independent oracle: ln C_d = v ln k - d/2 ln 2pi - (ln ive_v(k) + k), v = d/2 - 1."""
    d = 16
    v = d / 2 - 1
    mu = random_unit(5, d, seed=3)
    z = random_unit(4, d, seed=4)
    kappa = torch.tensor([0.5, 2.0, 10.0, 50.0, 300.0], dtype=F64)
    k = kappa.numpy()
    log_c = v * np.log(k) - d / 2 * math.log(2 * math.pi) - (np.log(special.ive(v, k)) + k)
    want = torch.from_numpy(log_c)[:, None] + kappa[:, None] * (mu @ z.T)
    torch.testing.assert_close(vmf_log_likelihood(mu, kappa, z), want, rtol=1e-9, atol=1e-9)


def test_vmf_kernel_approx_is_exact_plus_constant() -> None:
    """F_d(kappa) - ln C_d(kappa) is (almost) constant: spread < 0.07 over kappa in [0.5, 500]
    at d = 512 (App. A.1); and the difference never depends on z."""
    d = 512
    kappa = torch.logspace(math.log10(0.5), math.log10(500.0), 60, dtype=F64)
    mu = random_unit(60, d, seed=5)
    z = random_unit(11, d, seed=6)
    diff = vmf_log_likelihood(mu, kappa, z, exact=False) - vmf_log_likelihood(mu, kappa, z)
    # independent of z: every row constant to rounding
    assert (diff.max(dim=1).values - diff.min(dim=1).values).max() < 1e-9
    # the approximation is F_d of Eq. 4
    torch.testing.assert_close(diff[:, 0], f_d(kappa, d) - vmf_log_normalizer(kappa, d))
    spread = diff.max() - diff.min()
    assert spread < 0.07
    # ... while ln C_d itself varies by hundreds of nats over the same range: not a trivial pass
    exact = vmf_log_normalizer(kappa, d)
    assert exact.max() - exact.min() > 100.0


def test_ps_kernel_equals_distribution() -> None:
    d = 16
    mu = random_unit(6, d, seed=7)
    z = random_unit(8, d, seed=8)
    z[0] = mu[0]  # mode
    z[1] = unit(-mu[1] + 0.01 * z[1])  # close to the antipode (1 + cos ~ 5e-5)
    kappa = torch.tensor([0.0, 0.5, 3.0, 25.0, 150.0, 1e4], dtype=F64)
    for exact in (True, False):  # closed form: ``exact`` is ignored
        got = ps_log_likelihood(mu, kappa, z, exact=exact)
        torch.testing.assert_close(got, ps_pairs(mu, kappa, z), rtol=1e-12, atol=1e-9)
    # independent closed form of the normaliser (De Cao & Aziz 2020)
    a, b = (d - 1) / 2 + kappa, (d - 1) / 2
    log_c = -((a + b) * math.log(2) + b * math.log(math.pi) + torch.lgamma(a) - torch.lgamma(a + b))
    at_mode = ps_log_likelihood(mu, kappa, mu).diagonal()
    torch.testing.assert_close(at_mode, log_c + kappa * math.log(2.0))
    # at the exact antipode the density is 0 (ln = -inf for kappa > 0); the kernel floors
    # 1 + cos at 1e-6 so that training never sees -inf
    at_antipode = ps_log_likelihood(mu, kappa, -mu).diagonal()
    assert torch.isfinite(at_antipode).all()
    torch.testing.assert_close(at_antipode, log_c + kappa * math.log(1e-6), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kernel", [vmf_log_likelihood, ps_log_likelihood])
@pytest.mark.parametrize("exact", [True, False])
def test_kernel_scale_multiplies(kernel, exact: bool) -> None:
    mu = random_unit(5, 16, seed=9)
    z = random_unit(6, 16, seed=10)
    kappa = torch.tensor([0.7, 3.0, 11.0, 60.0, 250.0], dtype=F64)
    base = kernel(mu, kappa, z, exact=exact)
    for s in (0.37, 2.5, torch.tensor(13.0, dtype=F64)):
        torch.testing.assert_close(kernel(mu, kappa, z, exact=exact, scale=s), s * base)


def test_gaussian_kernel_equals_normal() -> None:
    d = 16
    g = torch.Generator().manual_seed(11)
    mean = torch.randn(5, d, generator=g, dtype=F64)
    var = torch.tensor([0.01, 0.3, 1.0, 2.5, 40.0], dtype=F64)
    z = random_unit(7, d, seed=12)
    normal = torch.distributions.Normal(mean[:, None, :], var.sqrt()[:, None, None])
    want = normal.log_prob(z[None]).sum(-1)
    got = gaussian_log_likelihood(mean, var, z)
    assert got.shape == (5, 7)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-9)


# --------------------------------------------------------------------------------------------
# AsymVLM-vMF / -PS (Sec. 4)
# --------------------------------------------------------------------------------------------

SPHERICAL = ["asymvlm-vmf", "asymvlm-ps", "asymvlm-vmf-siglip", "asymvlm-ps-siglip"]
SPHERICAL += ["asymvlm-image", "symvlm"]
PAIRS_OF = {"vmf": vmf_pairs, "ps": ps_pairs}


def training_kernel(mu: torch.Tensor, kappa: torch.Tensor, z: torch.Tensor, dist: str):
    """The training kernel written out: kappa mu^T z + F_d(kappa) (vMF), the PS log-density."""
    if dist == "vmf":
        return kappa[:, None] * (mu @ z.T) + f_d(kappa, mu.shape[-1])[:, None]
    return ps_pairs(mu, kappa, z)


@pytest.mark.parametrize("name", SPHERICAL)
def test_spherical_methods_by_hand(name: str) -> None:
    """On each probabilistic side kappa = ||g(x)||, kappa mu = g(x) and the uncertainty is
    1/kappa (the other side: unit x, no uncertainty); the score is the distribution's exact
    log-density (the mean of both directions for symvlm); InfoNCE over tau * the training
    kernel (Eq. 2), differentiable in tau."""
    model = build64(name, init_temperature=1.7)
    img, txt = pairs64(12)
    sides = {"text": txt, "image": img}
    with torch.no_grad():
        enc = {"text": model.encode_texts(txt), "image": model.encode_images(img)}
        for side, x in sides.items():
            u = getattr(model, f"{side}_uncertainty")(x)
            if side in model.probabilistic:
                eta = getattr(model, f"{side}_adapter")(x)
                torch.testing.assert_close(enc[side]["kappa"], eta.norm(dim=-1))
                torch.testing.assert_close(enc[side]["kappa"][:, None] * enc[side]["mu"], eta)
                torch.testing.assert_close(u, 1.0 / enc[side]["kappa"])
            else:
                torch.testing.assert_close(enc[side]["mu"], unit(x))
                assert u is None
        if "text" in model.probabilistic:
            torch.testing.assert_close(model.kappa(txt), enc["text"]["kappa"])
        t, i = enc["text"], enc["image"]
        exact, train = [], []
        for dist, z, transpose in ((t, i, False), (i, t, True)):
            if "kappa" in dist:
                ll = PAIRS_OF[model.distribution](dist["mu"], dist["kappa"], z["mu"])
                tl = training_kernel(dist["mu"], dist["kappa"], z["mu"], model.distribution)
                exact.append(ll.T if transpose else ll)
                train.append(tl.T if transpose else tl)
        want = sum(exact) / len(exact)
        torch.testing.assert_close(model.log_likelihood(img, txt), want, rtol=1e-10, atol=1e-8)
    if model.objective == "infonce":
        loss = model.loss(img, txt)
        tau = model.temperature.detach()
        assert float(tau) == pytest.approx(1.7)
        want = info_nce_by_hand(tau * sum(train) / len(train))
        torch.testing.assert_close(loss.detach(), want, rtol=1e-10, atol=1e-10)
        loss.backward()
        assert model.temperature.grad is not None and model.temperature.grad != 0


def test_asymvlm_vmf_infonce_invariant_to_normaliser_constant(monkeypatch) -> None:
    """Why the F_d approximation is harmless for InfoNCE.

    tau * L(m, n) = tau * (kappa_m mu_m^T z_n + ln C(kappa_m)). In the ROW softmax (caption m
    over images n) ln C(kappa_m) is the same for the whole row and cancels whatever it is. In
    the COLUMN softmax (image n over captions m) ln C(kappa_m) varies with m and does NOT cancel
    -- but F_d(kappa) - ln C_d(kappa) = const + eps(kappa) with eps tiny, so exact and
    approximate normalisers give the same loss up to eps's spread over the batch's kappas. A pure
    constant shift of ln C leaves the loss unchanged exactly.
    """
    model = build64("asymvlm-vmf", init_temperature=2.0)
    img, txt = pairs64(64)
    with torch.no_grad():
        approx_loss = model.loss(img, txt)
        t = model.encode_texts(txt)
        exact_ll = vmf_log_likelihood(t["mu"], t["kappa"], img, exact=True)
        exact_loss = info_nce_by_hand(model.temperature * exact_ll)
        # the logits differ by ~13.9 nats (the constant), yet the loss agrees to ~1e-4
        approx_ll = vmf_log_likelihood(t["mu"], t["kappa"], img, exact=False)
        assert (approx_ll - exact_ll).abs().min() > 10.0
        # The gap is bounded by 1/2 tau (spread of eps over the batch's kappas).
        eps = (approx_ll - exact_ll)[:, 0]
        bound = 0.5 * float(model.temperature) * float(eps.max() - eps.min())
    assert bound < 0.1  # eps is tiny compared with the ~13.9-nat constant
    assert abs(float(approx_loss - exact_loss)) <= bound + 1e-6
    assert abs(float(approx_loss - exact_loss)) < 1e-3 * abs(float(exact_loss))

    # a pure constant added to ln C: identical loss (to rounding)
    original = asym_module.vmf_log_normalizer_approx
    monkeypatch.setattr(
        asym_module, "vmf_log_normalizer_approx", lambda k, d: original(k, d) + 123.0
    )
    with torch.no_grad():
        shifted_loss = model.loss(img, txt)
    torch.testing.assert_close(shifted_loss, approx_loss, rtol=1e-12, atol=1e-12)

    # while a kappa-dependent change of ln C (not a constant) does change the loss: the column
    # softmax sees it, so the invariance above is not vacuous
    monkeypatch.setattr(
        asym_module, "vmf_log_normalizer_approx", lambda k, d: original(k, d) + 5.0 * k
    )
    with torch.no_grad():
        tilted_loss = model.loss(img, txt)
    assert abs(float(tilted_loss - approx_loss)) > 1e-3


# --------------------------------------------------------------------------------------------
# Retrieval = argmax log-likelihood (App. A.2)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["asymvlm-vmf", "asymvlm-ps"])
def test_t2i_argmax_is_image_the_caption_points_at(name: str) -> None:
    """End to end: an adapter whose output is always 80 * z_I,3 (zero last weight, bias set)."""
    model = build64(name)
    images = random_unit(10, D, seed=14)
    last = model.text_adapter.net[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.copy_(80.0 * images[3])
    txt = 5.0 * random_unit(4, D, seed=15)
    with torch.no_grad():
        ll = model.log_likelihood(images, txt)
        torch.testing.assert_close(model.kappa(txt), torch.full((4,), 80.0, dtype=F64))
    assert ll.shape == (4, 10)
    assert ll.argmax(dim=1).tolist() == [3, 3, 3, 3]
    # the ranking of images is the ranking by cosine to mu
    cos = images @ images[3]
    assert ll[0].argsort().tolist() == cos.argsort().tolist()


@pytest.mark.parametrize("name", ["asymvlm-vmf", "asymvlm-ps"])
def test_i2t_prefers_concentrated_caption_at_the_image(name: str) -> None:
    model = build64(name)
    images = random_unit(5, D, seed=16)
    z = images[0]
    other = images[1]
    kappas = torch.tensor([1.0, 2.0, 5.0, 10.0, 50.0, 200.0], dtype=F64)
    texts = {
        "mu": torch.cat([z.expand(6, D), other[None]]),
        "kappa": torch.cat([kappas, kappas[-1:]]),
    }
    score = model.score(texts, {"mu": images})  # [7 captions, 5 images]
    # at the mode, the log-density grows with kappa: d/dk (k + ln C_d(k)) = 1 - A_d(k) > 0
    at_mode = score[:6, 0]
    assert (at_mode.diff() > 0).all()
    # i2t for image 0: the most concentrated caption pointing at it wins (over the diffuse one
    # with the same mu and over a concentrated caption pointing elsewhere)
    assert int(score[:, 0].argmax()) == 5
    # away from the mean the order reverses: at the antipode, the diffuse caption is likelier
    antipode = model.score(texts, {"mu": -z[None]})[:6, 0]
    assert (antipode.diff() < 0).all()


# --------------------------------------------------------------------------------------------
# SigLIP variants (App. A.3)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["asymvlm-vmf-siglip", "asymvlm-ps-siglip"])
def test_siglip_loss_by_hand_and_trainable_bias_temperature(name: str) -> None:
    model = build64(name, init_temperature=1.3, init_bias=-4.0)
    img, txt = pairs64(24)
    loss = model.loss(img, txt)
    with torch.no_grad():
        t = model.encode_texts(txt)
        mu, kappa = t["mu"], t["kappa"]
        if model.distribution == "vmf":
            ll = kappa[:, None] * (mu @ img.T) + f_d(kappa, D)[:, None]
        else:
            ll = ps_pairs(mu, kappa, img)
        # The zero point is the training kernel's own log-normaliser at kappa = 0: the uniform
        # density for PS, F_d(0) for vMF (F_d is ln C_d up to a constant; ~470 nats at d=512).
        log_uniform = math.lgamma(D / 2) - math.log(2.0) - D / 2 * math.log(math.pi)
        zero = torch.zeros(1, dtype=F64)
        reference = float(f_d(zero, D)) if model.distribution == "vmf" else log_uniform
        assert model.reference_log_density() == pytest.approx(reference, abs=1e-12)
        tau, b = model.temperature.detach(), model.bias.detach()
        assert (float(tau), float(b)) == pytest.approx((1.3, -4.0))
        logits = tau * (ll - reference) + b
        y = 2.0 * torch.eye(24, dtype=F64) - 1.0
        want = -F.logsigmoid(y * logits).sum() / 24
    torch.testing.assert_close(loss.detach(), want, rtol=1e-10, atol=1e-10)

    # At kappa -> 0 the shifted kernel vanishes: the logits start at the bias, as in SigLIP.
    tiny = torch.full((3,), 1e-6, dtype=F64)
    near_zero = model.kernel({"mu": mu[:3], "kappa": tiny}, {"mu": img}, exact=False)
    near_zero = near_zero - model.reference_log_density()
    assert near_zero.abs().max() < 1e-4

    params = dict(model.named_parameters())
    assert params["bias"] is model.bias and params["temperature"] is model.temperature
    assert model.bias.requires_grad and model.temperature.requires_grad
    loss.backward()
    assert model.bias.grad is not None and float(model.bias.grad) != 0.0
    assert model.temperature.grad is not None and float(model.temperature.grad) != 0.0
    assert set(model.training_stats()) == {"temperature", "bias"}
    assert model.training_stats()["bias"] == pytest.approx(-4.0)


# --------------------------------------------------------------------------------------------
# Ablations: asymvlm-image, symvlm, asymvlm-gauss (Sec. 5.2)
# --------------------------------------------------------------------------------------------


def test_asymvlm_gauss() -> None:
    model = build64("asymvlm-gauss", init_temperature=0.5)
    img, txt = pairs64(16)
    with torch.no_grad():
        out = model.text_adapter(txt)
        assert out.shape == (16, D + 1)
        mean, var = out[:, :D], F.softplus(out[:, D]) + 1e-6
        enc = model.encode_texts(txt)
        torch.testing.assert_close(enc["var"], var)
        torch.testing.assert_close(enc["mean"], mean)
        torch.testing.assert_close(enc["mu"], unit(mean))
        u = model.text_uncertainty(txt)
        assert (u > 0).all()
        torch.testing.assert_close(u, var)
        assert model.image_uncertainty(img) is None
        score = model.log_likelihood(img, txt)
        normal = torch.distributions.Normal(mean[:, None, :], var.sqrt()[:, None, None])
        want = normal.log_prob(img[None]).sum(-1)
        torch.testing.assert_close(score, want, rtol=1e-10, atol=1e-8)
        torch.testing.assert_close(
            model.loss(img, txt), info_nce_by_hand(model.temperature * want), rtol=1e-10, atol=1e-10
        )


# --------------------------------------------------------------------------------------------
# Deterministic references
# --------------------------------------------------------------------------------------------


def test_determ_ft() -> None:
    model = build64("determ-ft")
    assert float(model.temperature.detach()) == pytest.approx(1 / 0.07)
    img, txt = pairs64(16)
    with torch.no_grad():
        t = unit(model.text_adapter(txt))
        cos = t @ img.T
        torch.testing.assert_close(model.log_likelihood(img, txt), cos)
        assert model.kappa(txt) is None
        torch.testing.assert_close(
            model.loss(img, txt), info_nce_by_hand(model.temperature * cos), rtol=1e-10, atol=1e-10
        )
    assert set(model.training_stats()) == {"temperature"}


def test_clip_reference() -> None:
    model = build_method("clip", D)
    assert model.trainable is False
    assert list(model.parameters()) == []
    img, txt = rotated_pairs(16)
    score = model.log_likelihood(img, txt)  # raw, scaled texts
    cos = F.cosine_similarity(txt[:, None, :], img[None, :, :], dim=-1)
    torch.testing.assert_close(score, cos, rtol=1e-5, atol=1e-6)
    assert (txt.norm(dim=-1) > 4.0).all()  # the inputs really were raw


# --------------------------------------------------------------------------------------------
# Every trainable method: a short training run lowers the loss
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TRAINABLE)
def test_training_lowers_loss(name: str) -> None:
    img, txt = rotated_pairs(128, seed=3)
    torch.manual_seed(0)
    model = build_method(name, D, **SMALL)
    assert model.trainable
    model.fit_start(img, txt)  # ELIP draws its gallery; a no-op elsewhere
    params = [p for p in model.parameters() if p.requires_grad]
    assert params
    opt = torch.optim.AdamW(params, lr=1e-3)
    losses = []
    for _ in range(60):
        opt.zero_grad()
        loss = model.loss(img, txt)
        assert loss.ndim == 0 and torch.isfinite(loss)
        loss.backward()
        for p in params:
            assert p.grad is None or torch.isfinite(p.grad).all(), name
        opt.step()
        losses.append(float(loss.detach()))
    with torch.no_grad():
        final = float(model.loss(img, txt))
    initial = losses[0]
    assert math.isfinite(final)
    assert initial - final > 0.1 * abs(initial), (name, initial, final)
    # the trained model still scores and (where defined) gives finite uncertainties
    with torch.no_grad():
        score = model.log_likelihood(img[:8], txt[:8])
        assert score.shape == (8, 8) and torch.isfinite(score).all()
        for u in (model.text_uncertainty(txt[:8]), model.image_uncertainty(img[:8])):
            assert u is None or (u.shape == (8,) and torch.isfinite(u).all())


# --------------------------------------------------------------------------------------------
# Raw vs unit adapter input
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["asymvlm-vmf", "asymvlm-ps"])
def test_asymvlm_sees_the_raw_norm(name: str) -> None:
    model = build64(name)
    img, txt = pairs64(8)
    with torch.no_grad():
        # Zero-initialised biases make the fresh MLP positively homogeneous (mu would ignore
        # the norm); trained adapters have biases, which is what the norm interacts with.
        for p in model.text_adapter.parameters():
            p.add_(0.1 * torch.randn_like(p))
        raw, uni = model.encode_texts(txt), model.encode_texts(unit(txt))
        assert (raw["kappa"] - uni["kappa"]).abs().max() > 1e-3
        assert (raw["mu"] - uni["mu"]).abs().max() > 1e-3
        assert (
            model.log_likelihood(img, txt) - model.log_likelihood(img, unit(txt))
        ).abs().max() > 1e-3


@pytest.mark.parametrize("name", ["clip", "pfe"])
def test_frozen_mean_scores_ignore_the_norm(name: str) -> None:
    torch.manual_seed(0)
    model = build_method(name, D) if name == "clip" else build_method(name, D, **SMALL)
    img, txt = rotated_pairs(8)
    with torch.no_grad():
        torch.testing.assert_close(
            model.log_likelihood(img, txt), model.log_likelihood(img, unit(txt))
        )
        torch.testing.assert_close(
            model.log_likelihood(img, txt), unit(txt) @ img.T, rtol=1e-5, atol=1e-6
        )


# --------------------------------------------------------------------------------------------
# Mixed precision: what the GPU path (bf16 autocast) computes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["asymvlm-vmf", "asymvlm-ps", "asymvlm-vmf-siglip", "symvlm", "asymvlm-image"]
)
def test_bf16_autocast_loss_matches_fp32_at_d512(name: str) -> None:
    """The normalisers (~1e3 nats at d=512) stay in float32 under autocast; only the matmuls
    run in bf16. Checked with CPU autocast, which casts like CUDA autocast."""
    torch.manual_seed(0)
    img, txt = rotated_pairs(128, d=512, seed=2, scale=8.0)
    model = build_method(name, 512, hidden_dim=128, depth=2)
    model.fit_start(img, txt)  # kappa ~ sqrt(d): where bf16 would break ln C
    with torch.no_grad():
        full = model.loss(img, txt)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = model.loss(img, txt)
    assert half.dtype == torch.float32
    assert abs(float(half - full)) < 2e-3 * abs(float(full))
