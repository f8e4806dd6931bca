"""Zero-shot classification and none-of-the-above rejection on hand-built embeddings."""

from __future__ import annotations

import pytest
import torch

from asymvlm.evaluation.zeroshot import (
    ClassPrompts,
    class_scores,
    none_of_the_above,
    rejection_baselines,
    zero_shot_accuracy,
)
from asymvlm.methods import build_method
from asymvlm.methods.asymvlm import AsymVLM, spherical_head
from asymvlm.methods.base import unit

D = 8


class IdentityVMF(AsymVLM):
    """AsymVLM whose adapter is the identity: eta = the prompt feature (kappa = its norm)."""

    def encode_texts(self, text_emb: torch.Tensor):
        return spherical_head(text_emb)


def _world(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    basis = torch.eye(D, dtype=torch.float64)
    prompts = ClassPrompts(inputs=20.0 * basis[:3], class_index=torch.arange(3), n_classes=3)
    labels = torch.arange(3).repeat_interleave(10)
    positives = unit(basis[labels] + 0.1 * torch.randn(30, D, generator=g, dtype=torch.float64))
    negatives = basis[5:8].repeat(4, 1)  # orthogonal to every class: fit none of them
    dummy = 0.5 * unit(basis[:3].sum(0, keepdim=True))  # "a photo": vague, between classes
    return prompts, positives, labels, negatives, dummy


def test_the_vague_dummy_prompt_wins_for_images_of_no_class() -> None:
    prompts, positives, labels, negatives, dummy = _world()
    asym = none_of_the_above(IdentityVMF(D), positives, labels, negatives, prompts, dummy)
    assert asym == {"pos_acc": 1.0, "neg_acc": 1.0, "pos_rejected": 0.0}
    # The frozen model's cosine cannot prefer the dummy: it is no closer to an orthogonal image.
    clip = none_of_the_above(build_method("clip", D), positives, labels, negatives, prompts, dummy)
    assert clip["pos_acc"] == 1.0 and clip["neg_acc"] == 0.0


def test_a_concentrated_dummy_prompt_does_not_win() -> None:
    """The same direction with a large kappa is no longer "none of the above"."""
    prompts, positives, labels, negatives, dummy = _world()
    sharp = none_of_the_above(IdentityVMF(D), positives, labels, negatives, prompts, 40 * dummy)
    assert sharp["neg_acc"] == 0.0


def test_class_score_is_the_mean_over_templates() -> None:
    clip = build_method("clip", D)
    basis = torch.eye(D)
    prompts = ClassPrompts(
        inputs=torch.stack([basis[0], basis[1], basis[2], basis[3]]),
        class_index=torch.tensor([0, 0, 1, 1]),
        n_classes=2,
    )
    image = unit(torch.tensor([[1.0, 0.5, 0.0, 0.2, 0, 0, 0, 0]]))
    got = class_scores(clip, image, prompts)
    want = torch.stack([(image[0, 0] + image[0, 1]) / 2, (image[0, 2] + image[0, 3]) / 2])
    torch.testing.assert_close(got[0], want)
    assert zero_shot_accuracy(clip, image, torch.tensor([0]), prompts) == 1.0
    with pytest.raises(ValueError, match="every class"):
        ClassPrompts(inputs=basis[:2], class_index=torch.tensor([0, 2]), n_classes=3)


def test_zero_shot_accuracy_counts_maximum_likelihood_hits() -> None:
    prompts, positives, labels, _, _ = _world()
    wrong = labels.clone()
    wrong[:6] = (wrong[:6] + 1) % 3
    assert zero_shot_accuracy(IdentityVMF(D), positives, labels, prompts) == 1.0
    assert zero_shot_accuracy(IdentityVMF(D), positives, wrong, prompts) == pytest.approx(24 / 30)


def test_rejection_baselines_find_a_separating_cut() -> None:
    """Positives sit on their class, negatives halfway between two classes: the frozen model's
    top probability (and margin) is high for the first and low for the second, so the cut chosen
    on the calibration half separates the held-out half perfectly."""
    prompts, positives, labels, _, _ = _world()
    basis = torch.eye(D, dtype=torch.float64)
    negatives = unit(basis[0] + basis[1]).repeat(20, 1) + 0.0
    out = rejection_baselines(build_method("clip", D), positives, labels, negatives, prompts,
                              temperature=10.0)  # fmt: skip
    for name in ("threshold", "margin"):
        assert out[name]["pos_acc"] == 1.0 and out[name]["neg_acc"] == 1.0
        assert 0.0 < out[name]["cut"] <= 1.0
