"""The method registry, the method interface, AsymVLM (Sec. 4, 5.2, App. A) and the references."""

from __future__ import annotations

import inspect
import math
import subprocess
import sys

import pytest
import torch
from pydantic import ValidationError
from torch.nn import functional as F

from asymvlm.distributions import PowerSpherical, VonMisesFisher, vmf_log_normalizer
from asymvlm.methods import METHODS, Method, build_method, check_method_kwargs, method_arguments
from asymvlm.methods.asymvlm import spherical_log_likelihood
from asymvlm.methods.base import unit
from asymvlm.methods.bayesvlm import fit_projection_posterior
from tests.helpers import rotated_pairs

F64 = torch.float64
D = 16
SMALL = {"hidden_dim": 64, "depth": 2}
SPHERICAL = ["asymvlm-vmf", "asymvlm-ps", "asymvlm-vmf-siglip", "asymvlm-ps-siglip"]
SPHERICAL += ["asymvlm-image", "symvlm"]
DISTRIBUTION = {"vmf": VonMisesFisher, "ps": PowerSpherical}

pytestmark = pytest.mark.usefixtures("one_thread")


def pairs64(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    img, txt = rotated_pairs(n, seed=seed)
    return unit(img.double()), txt.double()


def random_unit(n: int, d: int, seed: int) -> torch.Tensor:
    return unit(torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=F64))


def build64(name: str, seed: int = 0, **kwargs) -> Method:
    torch.manual_seed(seed)
    return build_method(name, D, **SMALL, **kwargs).double()


def f_d(kappa: torch.Tensor, d: int) -> torch.Tensor:
    """F_d(kappa) of App. A.1 (Eq. 4), written out from the paper."""
    a, b = (d - 1) / 2.0, (d + 1) / 2.0
    ra, rb = torch.sqrt(a**2 + kappa**2), torch.sqrt(b**2 + kappa**2)
    return (
        (d - 1) / 4.0 * torch.log(a + ra) - 0.5 * ra + (d - 1) / 4.0 * torch.log(a + rb) - 0.5 * rb
    )


def info_nce_by_hand(logits: torch.Tensor) -> torch.Tensor:
    """Eq. 2: 1/2 (mean_r -ln softmax_row(r)[r] + mean_c -ln softmax_col(c)[c])."""
    rows = -(logits.diagonal() - torch.logsumexp(logits, dim=1)).mean()
    cols = -(logits.diagonal() - torch.logsumexp(logits, dim=0)).mean()
    return 0.5 * (rows + cols)


def pairs_log_prob(family: str, mu: torch.Tensor, kappa: torch.Tensor, z: torch.Tensor):
    """[n_mu, n_z] log-densities through the distribution class."""
    return DISTRIBUTION[family](mu[:, None, :], kappa[:, None]).log_prob(z[None, :, :])


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_methods_arguments_are_declared(name) -> None:
    """The keys a method takes come from its constructor; its defaults validate and build it."""
    defaults = {k: p.default for k, p in method_arguments(name).items() if p.default is not p.empty}
    assert check_method_kwargs(name, defaults) == defaults
    assert build_method(name, D, **SMALL, **defaults).dim == D
    with pytest.raises(ValidationError) as err:
        check_method_kwargs(name, {"bogus": 1})
    assert err.value.errors()[0]["loc"] == ("bogus",)
    assert f"{name} takes {', '.join(defaults) or 'no arguments'}" in str(err.value)


def test_method_arguments_are_converted_and_checked() -> None:
    kwargs = {"calibrate_input": "false", "init_temperature": "0.5", "init": "default"}
    converted = check_method_kwargs("asymvlm-vmf", kwargs)
    assert converted == {"calibrate_input": False, "init_temperature": 0.5, "init": "default"}
    assert type(converted["calibrate_input"]) is bool
    with pytest.raises(ValidationError) as err:  # bayesvlm's Literal, unchecked before
        check_method_kwargs("bayesvlm", {"fisher": "exact", "prior_steps": "10"})
    assert [(e["loc"], e["input"]) for e in err.value.errors()] == [(("fisher",), "exact")]
    posterior = inspect.signature(fit_projection_posterior).parameters
    declared = {k: p.default for k, p in method_arguments("bayesvlm").items()}
    assert {k: posterior[k].default for k in declared} == declared


def test_registry() -> None:
    assert set(SPHERICAL) | {"clip", "bayesvlm", "determ-ft"} <= set(METHODS)
    assert all(cls.name == name and issubclass(cls, Method) for name, cls in METHODS.items())
    assert not METHODS["clip"].trainable and not METHODS["bayesvlm"].trainable
    assert METHODS["asymvlm-vmf"].trainable and METHODS["determ-ft"].trainable
    with pytest.raises(ValueError, match="unknown method 'nope'") as info:
        build_method("nope", 8)
    assert all(name in str(info.value) for name in METHODS)
    with pytest.raises(ValueError, match="unknown protocol"):
        build_method("clip", 8, protocol="nope")
    with pytest.raises(ValueError, match="init must be"):
        build_method("determ-ft", 8, init="xavier")
    with pytest.raises(ValueError, match="registered twice"):
        METHODS.add("clip", type("Impostor", (Method,), {}))
    assert METHODS["clip"].__name__ == "FrozenCLIP"


def test_a_built_in_method_knows_its_name_before_the_registry_is_read() -> None:
    """As a Ray worker unpickling one does (the registry loads the built-ins when first read)."""
    code = "from asymvlm.methods import base, gaussian; print(gaussian.PFE.name)"
    code += "; print(base.METHODS._discovered)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout == "pfe\nFalse\n"


@pytest.mark.parametrize("name", sorted(set(METHODS) - {"bayesvlm"}))
def test_every_method_keeps_the_interface_and_trains(name: str) -> None:
    """Scores [n_text, n_image] equal log_likelihood; uncertainties are None exactly where the
    method documents none, else finite and positive per item; finite training stats; where
    trainable, 60 AdamW steps lower the loss by 10 % with finite gradients throughout."""
    img, txt = rotated_pairs(128, seed=3)
    torch.manual_seed(0)
    model = build_method(name, D, **SMALL)
    assert isinstance(model, METHODS[name]) and model.dim == D
    model.fit_start(img, txt)
    with torch.no_grad():
        texts, images = model.encode_texts(txt[:10]), model.encode_images(img[:7])
        scores = model.score(texts, images)
        torch.testing.assert_close(model.log_likelihood(img[:7], txt[:10]), scores)
        u_t, u_i = model.text_uncertainty(txt[:10]), model.image_uncertainty(img[:7])
    assert scores.shape == (10, 7)
    assert (u_t is None and u_i is None) == (model.uncertainty_doc == "none")
    for u, n in ((u_t, 10), (u_i, 7)):
        assert u is None or (u.shape == (n,) and torch.isfinite(u).all() and (u > 0).all())
    assert all(math.isfinite(v) for v in model.training_stats().values())
    assert math.isfinite(model.calibration_scale())
    if name in SPHERICAL:
        assert ("bias" in dict(model.named_parameters())) == name.endswith("siglip")
    if not model.trainable:
        with pytest.raises(NotImplementedError):
            model.loss(img, txt)
        return
    loss = model.loss(img, txt, epoch=3)
    assert loss.ndim == 0 and torch.isfinite(loss)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3)
    losses = []
    for _ in range(60):
        opt.zero_grad()
        loss = model.loss(img, txt)
        loss.backward()
        assert all(p.grad is None or torch.isfinite(p.grad).all() for p in params), name
        opt.step()
        losses.append(float(loss.detach()))
    final = float(model.loss(img, txt).detach())
    assert losses[0] - final > 0.1 * abs(losses[0]), (name, losses[0], final)


# -- kernels (Sec. 4.2) ------------------------------------------------------------------------
@pytest.mark.parametrize("d", [16, 512])
def test_spherical_kernels_equal_the_distributions(d: int) -> None:
    """All-pairs kernels against the distributions' log_prob; ``scale`` multiplies; F_d in
    place of ln C_d (``exact=False``) shifts every row by F_d - ln C_d; PS floors 1 + cos."""
    mu, z = random_unit(7, d, seed=1), random_unit(9, d, seed=2)
    z[0] = mu[0]
    kappa = torch.tensor([0.3, 1.0, 4.0, 20.0, 90.0, 400.0, 2000.0], dtype=F64)
    for family in ("vmf", "ps"):
        got = spherical_log_likelihood(family, mu, kappa, z)
        assert got.shape == (7, 9) and got.dtype == F64
        want = pairs_log_prob(family, mu, kappa, z)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-9)
        s = torch.tensor(2.5, dtype=F64)
        torch.testing.assert_close(spherical_log_likelihood(family, mu, kappa, z, scale=s), s * got)
    approx = spherical_log_likelihood("vmf", mu, kappa, z, exact=False)
    shift = (f_d(kappa, d) - vmf_log_normalizer(kappa, d))[:, None]
    torch.testing.assert_close(approx, pairs_log_prob("vmf", mu, kappa, z) + shift)
    at_antipode = spherical_log_likelihood("ps", mu, kappa, -mu).diagonal()
    mode = spherical_log_likelihood("ps", mu, kappa, mu).diagonal()
    torch.testing.assert_close(at_antipode - mode, kappa * (math.log(1e-6) - math.log(2.0)))


# -- AsymVLM and its ablations (Sec. 4, 5.2, App. A) ---------------------------------------------
@pytest.mark.parametrize("name", SPHERICAL)
def test_spherical_methods_by_hand(name: str) -> None:
    """On each probabilistic side kappa mu = g(x) and the uncertainty is 1/kappa (the other
    side: unit x, none); the score is the exact log-density (the mean of both directions for
    symvlm); the loss is InfoNCE over tau * the training kernel (Eq. 2) or SigLIP over
    tau * (kernel - its value at kappa = 0) + b (App. A.3); tau and b get gradients."""
    model = build64(name, init_temperature=1.3, init_bias=-4.0)
    img, txt = pairs64(12)
    with torch.no_grad():
        enc = {"text": model.encode_texts(txt), "image": model.encode_images(img)}
        for side, x in {"text": txt, "image": img}.items():
            u = getattr(model, f"{side}_uncertainty")(x)
            if side in model.probabilistic:
                eta = getattr(model, f"{side}_adapter")(x)
                torch.testing.assert_close(enc[side]["kappa"][:, None] * enc[side]["mu"], eta)
                torch.testing.assert_close(u, 1.0 / eta.norm(dim=-1))
                if side == "text":
                    torch.testing.assert_close(model.kappa(x), eta.norm(dim=-1))
            else:
                torch.testing.assert_close(enc[side]["mu"], unit(x))
                assert u is None
        exact, train = [], []
        for dist, z, flip in ((enc["text"], enc["image"], 0), (enc["image"], enc["text"], 1)):
            if "kappa" in dist:
                mu, kappa = dist["mu"], dist["kappa"]
                ll = pairs_log_prob(model.distribution, mu, kappa, z["mu"])
                tl = ll if model.distribution == "ps" else kappa[:, None] * (mu @ z["mu"].T)
                tl = tl if model.distribution == "ps" else tl + f_d(kappa, D)[:, None]
                exact.append(ll.T if flip else ll)
                train.append(tl.T if flip else tl)
        torch.testing.assert_close(
            model.log_likelihood(img, txt), sum(exact) / len(exact), rtol=1e-10, atol=1e-8
        )
        tau = model.temperature.detach()
        assert float(tau) == pytest.approx(1.3)
        tau_l = tau * sum(train) / len(train)
        if model.objective == "infonce":
            want = info_nce_by_hand(tau_l)
        else:
            zero = math.lgamma(D / 2) - math.log(2.0) - D / 2 * math.log(math.pi)  # uniform
            zero = (
                float(f_d(torch.zeros((), dtype=F64), D)) if model.distribution == "vmf" else zero
            )
            y = 2.0 * torch.eye(12, dtype=F64) - 1.0
            want = -F.logsigmoid(y * (tau_l - tau * zero + model.bias.detach())).sum() / 12
    loss = model.loss(img, txt)
    torch.testing.assert_close(loss.detach(), want, rtol=1e-10, atol=1e-10)
    loss.backward()
    assert float(model.temperature.grad) != 0.0
    assert model.objective == "infonce" or float(model.bias.grad) != 0.0


@pytest.mark.parametrize("family", ["vmf", "ps"])
def test_retrieval_is_argmax_log_likelihood(family: str) -> None:
    """App. A.2: a caption pointing at image 3 retrieves it and ranks images by cosine; at the
    image the most concentrated caption is the likeliest, at the antipode the most diffuse."""
    model = build64(f"asymvlm-{family}")
    images = random_unit(10, D, seed=14)
    with torch.no_grad():
        model.text_adapter.net[-1].weight.zero_()
        model.text_adapter.net[-1].bias.copy_(80.0 * images[3])
        ll = model.log_likelihood(images, 5.0 * random_unit(4, D, seed=15))
    assert ll.argmax(dim=1).tolist() == [3] * 4
    assert ll[0].argsort().tolist() == (images @ images[3]).argsort().tolist()
    kappas = torch.tensor([1.0, 2.0, 5.0, 10.0, 50.0, 200.0], dtype=F64)
    texts = {"mu": images[0].expand(6, D), "kappa": kappas}
    assert (model.score(texts, {"mu": images[:1]})[:, 0].diff() > 0).all()
    assert (model.score(texts, {"mu": -images[:1]})[:, 0].diff() < 0).all()


def test_asymvlm_gauss() -> None:
    model = build64("asymvlm-gauss", init_temperature=0.5)
    img, txt = pairs64(16)
    with torch.no_grad():
        out = model.text_adapter(txt)
        mean, var = out[:, :D], F.softplus(out[:, D]) + 1e-6
        enc = model.encode_texts(txt)
        torch.testing.assert_close(enc["mu"], unit(mean))
        torch.testing.assert_close(model.text_uncertainty(txt), var)
        assert model.image_uncertainty(img) is None
        normal = torch.distributions.Normal(mean[:, None, :], var.sqrt()[:, None, None])
        want = normal.log_prob(img[None]).sum(-1)
        torch.testing.assert_close(model.log_likelihood(img, txt), want, rtol=1e-10, atol=1e-8)
        torch.testing.assert_close(model.loss(img, txt), info_nce_by_hand(0.5 * want))


def test_deterministic_references() -> None:
    """``clip``: the frozen cosine; ``determ-ft``: the adapter's cosine, InfoNCE at tau = 1/0.07."""
    img, txt = pairs64(16)
    clip = build_method("clip", D)
    assert not clip.trainable and list(clip.parameters()) == []
    cos = F.cosine_similarity(txt[:, None, :], img[None, :, :], dim=-1)
    torch.testing.assert_close(clip.log_likelihood(img, txt), cos)
    model = build64("determ-ft")
    with torch.no_grad():
        cos = unit(model.text_adapter(txt)) @ img.T
        torch.testing.assert_close(model.log_likelihood(img, txt), cos)
        assert model.kappa(txt) is None
        torch.testing.assert_close(model.loss(img, txt), info_nce_by_hand(cos / 0.07))
    assert model.training_stats() == {"temperature": pytest.approx(1 / 0.07)}


@pytest.mark.parametrize("name", ["asymvlm-vmf", "asymvlm-ps-siglip", "symvlm"])
def test_bf16_autocast_loss_matches_fp32_at_d512(name: str) -> None:
    """The normalisers stay in float32 under autocast; only the matmuls run in bf16."""
    torch.manual_seed(0)
    img, txt = rotated_pairs(128, d=512, seed=2, scale=8.0)
    model = build_method(name, 512, hidden_dim=128, depth=2)
    model.fit_start(img, txt)
    with torch.no_grad():
        full = model.loss(img, txt)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = model.loss(img, txt)
    assert half.dtype == torch.float32
    assert abs(float(half - full)) < 2e-3 * abs(float(full))


def test_methods_all_expands_to_the_registry(tmp_path, add_method) -> None:
    """A sweep's ``methods: all`` is every registered method in registry order, plugins too."""
    from asymvlm.methods.asymvlm import AsymVLM
    from asymvlm_ray import schema

    add_method("plugin-vmf", type("Plugin", (AsymVLM,), {}))
    doc = {"embeddings": str(tmp_path), "methods": "all", "lr": [1e-3], "seeds": [0]}
    cfg = schema.sweep_config({**doc, "output": str(tmp_path / "o")}, source="space.yaml")
    assert cfg.methods == list(METHODS) and cfg.methods[-1] == "plugin-vmf"
    assert set(SPHERICAL) < set(cfg.methods)
    assert cfg.train_config("plugin-vmf").method == "plugin-vmf"
