"""Protocol ``official`` against the authors' code (the vectors of tests/conformance.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from asymvlm.methods import build_method
from asymvlm.methods.official import from_official_state_dict
from asymvlm.metrics import retrieval_metrics
from tests import conformance

CASES = conformance.cases()
pytestmark = [
    pytest.mark.skipif(not CASES, reason="conformance vectors not found"),
    pytest.mark.usefixtures("one_thread"),
]
RTOL, ATOL = 1e-6, 1e-9
F64 = torch.float64


def close(actual: torch.Tensor | float, expected: np.ndarray | float, what: str) -> None:
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=F64).detach(),
        torch.as_tensor(np.asarray(expected), dtype=F64),
        rtol=RTOL,
        atol=ATOL,
        msg=lambda m: f"{what}: {m}",
    )


@pytest.fixture(scope="module", params=CASES, ids=[f"{m}-seed{s}" for m, s in CASES])
def case(request):
    """(method name, official arrays, inputs, this project's method with official weights)."""
    name, seed = request.param
    arrays, inputs = conformance.load(name, seed)
    model = build_method(name, 512, protocol="official").double()
    official = conformance.official_state_dict(arrays)
    model.load_state_dict(from_official_state_dict(name, official, model.state_dict()))
    return name, arrays, inputs, model


def _batch(inputs) -> tuple[torch.Tensor, torch.Tensor]:
    image, text = (inputs[f"input/{side}_emb"] for side in ("image", "text"))
    return torch.as_tensor(image, dtype=F64), torch.as_tensor(text, dtype=F64)


def test_parameter_count(case) -> None:
    name, arrays, _, model = case
    n_official = sum(
        arrays[f"param/{k}"].size
        if f"param/{k}" in arrays
        else int(np.prod(arrays[f"param_digest/{k}/shape"]))
        for k in (str(n) for n in arrays["init/param_names"])
    )
    assert sum(p.numel() for p in model.parameters()) == n_official


def test_loss_and_gradient(case) -> None:
    name, arrays, inputs, model = case
    image, text = _batch(inputs)
    assert np.array_equal(image.numpy(), arrays["input/image_emb"])
    model.train()
    model.zero_grad()
    loss = model.loss(image, text)
    loss.backward()
    close(loss, arrays["out/loss"], f"{name} loss")
    terms = {k.split("/")[-1]: arrays[k] for k in arrays if k.startswith("out/loss_terms/")}
    if terms:
        ours = model.loss_terms(*model.loss_features(image, text))
        assert set(ours) == set(terms)
        for key, value in terms.items():
            close(ours[key], value, f"{name} loss term {key}")
    norms = {n: p.grad.norm() for n, p in model.named_parameters()}
    assert all(p.grad is not None for p in model.parameters())
    total = math.sqrt(sum(float(v) ** 2 for v in norms.values()))
    close(total, arrays["out/grad_norm"], f"{name} gradient norm")


def test_uncertainties_and_scores(case) -> None:
    name, arrays, inputs, model = case
    image, text = _batch(inputs)
    model.eval()
    with torch.no_grad():
        close(model.text_uncertainty(text), arrays["out/text_uncertainty"], f"{name} text u")
        image_u = model.image_uncertainty(image)
        if "out/image_uncertainty" in arrays:
            close(image_u, arrays["out/image_uncertainty"], f"{name} image u")
        else:
            assert image_u is None
        close(model.log_likelihood(image, text), arrays["out/scores"], f"{name} scores")


def test_binned_recall(case) -> None:
    """The official binned evaluation: t2i by the caption's uncertainty, i2t by its top-1's."""
    name, arrays, inputs, model = case
    images = torch.as_tensor(inputs["input/test_image_emb"], dtype=F64)
    texts = torch.as_tensor(inputs["input/test_text_emb"], dtype=F64)
    owner = torch.as_tensor(inputs["input/test_caption_image_index"]).long()
    model.eval()
    with torch.no_grad():
        enc_t, enc_i = model.encode_texts(texts), model.encode_images(images)
        scores = model.score(enc_t, enc_i)
        unc = model.text_uncertainty_from(enc_t)
    close(unc, arrays["out/test_text_uncertainty"], f"{name} test text u")
    t2i_top1 = scores.argmax(dim=1)
    i2t_top1 = scores.argmax(dim=0)
    assert torch.equal(t2i_top1, torch.as_tensor(arrays["out/test_t2i_top1_image"]).long())
    assert torch.equal(i2t_top1, torch.as_tensor(arrays["out/test_i2t_top1_caption"]).long())

    kw = dict(text_uncertainty=unc, ks=(1,), n_bins=10, chunk_size=256)
    res = retrieval_metrics(lambda a, b: scores[a:b], len(texts), len(images), owner, **kw)
    assert res["i2t"]["uncertainty_source"] == "retrieved_text"
    for direction in ("t2i", "i2t"):
        expected = arrays[f"out/{direction}_binned_r1_stable_sort"].tolist()
        assert res[direction]["binned_recall@1"] == pytest.approx(expected, abs=1e-12)
    assert res["t2i"]["recall@1"] == pytest.approx(float(arrays["out/test_r1_t2i"]), abs=1e-12)
    assert res["i2t"]["recall@1"] == pytest.approx(float(arrays["out/test_r1_i2t"]), abs=1e-12)

    # The numpy-sort variant: the stored order sorts our i2t key, and binning our hits in it
    # gives the official bins (t2i has no ties at bin edges: its two variants agree).
    assert arrays["out/t2i_binned_r1"].tolist() == arrays["out/t2i_binned_r1_stable_sort"].tolist()
    order = torch.as_tensor(arrays["out/test_i2t_sort_order_numpy"]).long()
    key = unc[i2t_top1]
    assert bool((key[order][1:] >= key[order][:-1]).all())
    hits = (owner[i2t_top1] == torch.arange(images.shape[0])).double()
    size = images.shape[0] // 10
    bins = hits[order[: size * 10]].view(10, size).mean(dim=1)
    assert bins.tolist() == pytest.approx(arrays["out/i2t_binned_r1"].tolist(), abs=1e-12)
