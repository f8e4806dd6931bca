"""Zero-shot classification and none-of-the-above rejection on hand-built embeddings."""

from __future__ import annotations

import math

import pytest
import torch

from asymvlm.evaluation.zeroshot import (
    ClassPrompts,
    class_scores,
    none_of_the_above,
    prompt_ensemble,
    rejection_baselines,
    zero_shot_accuracy,
)
from asymvlm.methods import build_method
from asymvlm.methods.base import unit
from tests.helpers import IdentityVMF

D = 8


def _world(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    basis = torch.eye(D, dtype=torch.float64)
    prompts = ClassPrompts(inputs=20.0 * basis[:3], class_index=torch.arange(3), n_classes=3)
    labels = torch.arange(3).repeat_interleave(10)
    positives = unit(basis[labels] + 0.1 * torch.randn(30, D, generator=g, dtype=torch.float64))
    negatives = basis[5:8].repeat(4, 1)  # orthogonal to every class: fit none of them
    dummy = 0.5 * unit(basis[:3].sum(0, keepdim=True))  # "a photo": vague, between classes
    return prompts, positives, labels, negatives, dummy


def nota(method, positives, labels, negatives, prompts, dummy, **kw) -> dict[str, float]:
    return none_of_the_above(method, positives, labels, negatives, prompts, {"d": dummy}, **kw)["d"]


def test_cosine_methods_score_against_clips_prompt_ensemble() -> None:
    """CLIP's ensemble: a class's unit prompt embeddings averaged, then re-normalised."""
    clip = build_method("clip", D)
    g = torch.Generator().manual_seed(3)
    raw = torch.randn(5, D, generator=g)
    prompts = ClassPrompts(inputs=raw, class_index=torch.tensor([0, 1, 0, 1, 1]), n_classes=2)
    image = unit(torch.randn(4, D, generator=g))
    unit_prompts = raw / raw.norm(dim=1, keepdim=True)
    weights = []
    for c in range(2):  # as CLIP's notebook: normalise, mean, normalise
        mean = unit_prompts[prompts.class_index == c].mean(0)
        weights.append(mean / mean.norm())
    weights = torch.stack(weights)
    want = image @ weights.T
    torch.testing.assert_close(class_scores(clip, image, prompts), want)
    torch.testing.assert_close(prompt_ensemble(unit_prompts, prompts.class_index, 2), weights)
    # Not the mean of the cosines: a class whose prompts disagree is not penalised for it.
    mean_cos = torch.stack(
        [(image @ unit_prompts[prompts.class_index == c].T).mean(1) for c in range(2)], 1
    )
    assert not torch.allclose(class_scores(clip, image, prompts), mean_cos)
    assert zero_shot_accuracy(clip, image, want.argmax(1), prompts) == 1.0
    with pytest.raises(ValueError, match="every class"):
        ClassPrompts(inputs=raw[:2], class_index=torch.tensor([0, 2]), n_classes=3)


def test_likelihood_methods_combine_a_class_prompts_by_mean_or_logmeanexp() -> None:
    """The mean of the log-likelihoods (default) or ln((1/K) sum_k p(z | prompt_k)): at least
    the mean (Jensen), equal to it for a class of one prompt; unknown names refused."""
    method = IdentityVMF(D)
    basis = torch.eye(D, dtype=torch.float64)
    inputs = torch.stack([20 * basis[0], 5 * basis[1], 10 * basis[2], 30 * basis[3], 8 * basis[4]])
    prompts = ClassPrompts(inputs=inputs, class_index=torch.tensor([0, 0, 1, 1, 2]), n_classes=3)
    rows = [[1.0, 0.5, 0.0, 0.2, 0.3, 0, 0, 0], [0.0, 0.1, 1.0, 0.0, 0.0, 0, 0, 0]]
    image = unit(torch.tensor(rows, dtype=torch.float64))
    per_prompt = method.log_likelihood(image, inputs).T  # [n_image, n_prompts]
    groups = (slice(0, 2), slice(2, 4), slice(4, 5))
    mean = class_scores(method, image, prompts).double()
    want = torch.stack([per_prompt[:, g].mean(1) for g in groups], 1)
    torch.testing.assert_close(mean, want, rtol=1e-5, atol=1e-4)  # scores are float32
    got = class_scores(method, image, prompts, aggregation="logmeanexp").double()
    lme = [torch.logsumexp(per_prompt[:, g], 1) - math.log(g.stop - g.start) for g in groups]
    torch.testing.assert_close(got, torch.stack(lme, 1), rtol=1e-5, atol=1e-4)
    assert (got[:, :2] > mean[:, :2] + 1e-3).all()  # the templates disagree: a strict gap
    torch.testing.assert_close(got[:, 2], mean[:, 2])
    with pytest.raises(ValueError, match="template aggregation"):
        class_scores(method, image, prompts, aggregation="max")
    positives, labels = _world()[1:3]
    wrong = labels.clone()
    wrong[:6] = (wrong[:6] + 1) % 3
    assert zero_shot_accuracy(method, positives, wrong, _world()[0]) == pytest.approx(24 / 30)


def test_far_negatives_are_counted_apart_from_the_negatives() -> None:
    """``far_neg_acc``: far negatives rejected by the dummy prompt or the frozen model's cut."""
    prompts, positives, labels, negatives, dummy = _world()
    basis = torch.eye(D, dtype=torch.float64)
    far = basis[0].repeat(6, 1)  # on class 0: not rejected
    out = nota(IdentityVMF(D), positives, labels, negatives, prompts, dummy, far_negatives=far)
    assert out["neg_acc"] == 1.0 and out["far_neg_acc"] == 0.0
    assert "far_neg_acc" not in nota(IdentityVMF(D), positives, labels, negatives, prompts, dummy)
    halfway = unit(basis[0] + basis[1]).repeat(20, 1)
    clip, far = build_method("clip", D), torch.cat([halfway[:3], far])
    base = rejection_baselines(
        clip, positives, labels, halfway, prompts, temperature=10.0, far_negatives=far
    )
    for name in ("threshold", "margin"):
        assert base[name]["pos_acc"] == 1.0 and base[name]["neg_acc"] == 1.0
        assert 0.0 < base[name]["cut"] <= 1.0
        assert base[name]["far_neg_acc"] == pytest.approx(3 / 9)


def _reference_nota(method, positives, labels, negatives, prompts, rows) -> dict[str, float]:
    """Table 2 by its definition: the dummy's rows appended as class ``n``, argmax."""
    n = prompts.n_classes
    index = torch.cat([prompts.class_index, torch.full((rows.shape[0],), n)])
    both = ClassPrompts(torch.cat([prompts.inputs, rows]), index, n + 1)
    pos = class_scores(method, positives, both).argmax(1)
    neg = class_scores(method, negatives, both).argmax(1)
    hits = {"pos_acc": pos == labels, "neg_acc": neg == n, "pos_rejected": pos == n}
    return {key: float(hit.double().mean()) for key, hit in hits.items()}


def test_the_vague_dummy_prompt_wins_for_images_of_no_class_each_dummy_tried_alone() -> None:
    """``none_of_the_above`` scores the classes once; each dummy's numbers are those of the
    dummy appended alone as an extra class (a vague, a sharp and a two-prompt dummy here)."""
    prompts, positives, labels, negatives, dummy = _world()
    dummies = {"vague": dummy, "sharp": 40 * dummy, "two rows": torch.cat([dummy, 2 * dummy])}
    got = {}
    for method in (IdentityVMF(D), build_method("clip", D)):
        got[method.name] = none_of_the_above(method, positives, labels, negatives, prompts, dummies)
        for name, rows in dummies.items():
            want = _reference_nota(method, positives, labels, negatives, prompts, rows)
            assert got[method.name][name] == want, (name, method.name)
    asym, clip = got[IdentityVMF(D).name], got["clip"]
    assert asym["vague"] == {"pos_acc": 1.0, "neg_acc": 1.0, "pos_rejected": 0.0}
    assert asym["sharp"]["neg_acc"] == 0.0  # a large kappa is no longer "none of the above"
    # The frozen model's cosine cannot prefer the dummy: it is no closer to an orthogonal image.
    assert clip["vague"]["pos_acc"] == 1.0 and clip["vague"]["neg_acc"] == 0.0
