"""Perturbations (deterministic, graded by severity) and the OOD retrieval measures."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from asymvlm.data.perturb import (
    CAPTION_PERTURBATIONS,
    IMAGE_PERTURBATIONS,
    perturb_caption,
    perturb_image,
)
from asymvlm.evaluation.ood import align, mmi, ood_retrieval, uncertainty_auroc
from asymvlm.methods import build_method
from asymvlm.splits import SplitTensors
from tests.helpers import IdentityVMF, write_perturbed_pair

CAPTION = "A young man riding a bike next to a large white dog on the street."


@pytest.mark.parametrize("kind", sorted(IMAGE_PERTURBATIONS))
def test_image_perturbations_are_seeded_and_graded(kind) -> None:
    smooth = np.add.outer(np.arange(96), np.arange(96))[:, :, None] * [1, 2, 3] % 256
    photo = Image.fromarray(smooth.astype(np.uint8))  # gradients: blur and JPEG change them
    base = np.asarray(photo, dtype=np.float64)
    a = perturb_image(photo, f"{kind}:3", seed=1)
    assert a.size == photo.size and a.mode == "RGB"
    assert np.array_equal(np.asarray(a), np.asarray(perturb_image(photo, f"{kind}:3", seed=1)))
    noisy = [np.asarray(perturb_image(photo, f"{kind}:{s}", seed=1)) for s in (1, 5)]
    errors = [np.mean((x - base) ** 2) for x in noisy]
    assert 0 < errors[0] < errors[1], errors


@pytest.mark.parametrize("kind", sorted(CAPTION_PERTURBATIONS))
def test_caption_perturbations_are_seeded_and_graded(kind) -> None:
    outs = {s: perturb_caption(CAPTION, f"{kind}:{s}", seed=4) for s in (1, 5)}
    assert outs[1] == perturb_caption(CAPTION, f"{kind}:1", seed=4) and outs[5] != CAPTION

    def changed(text: str) -> int:
        return sum(a != b for a, b in zip(text.split(), CAPTION.split(), strict=False))

    many = [changed(perturb_caption(CAPTION, f"{kind}:5", seed=k)) for k in range(20)]
    few = [changed(perturb_caption(CAPTION, f"{kind}:1", seed=k)) for k in range(20)]
    assert np.mean(many) > np.mean(few)


def test_caption_perturbations_keep_what_they_should() -> None:
    swapped = perturb_caption(CAPTION, "word_order:5", seed=0)
    assert sorted(swapped.split()) == sorted(CAPTION.split()) and swapped != CAPTION
    synonyms = perturb_caption(CAPTION, "synonyms:5", seed=0)  # every known word replaced
    for word in ("man", "bike", "large", "white", "dog", "street"):
        assert f" {word} " not in f" {synonyms} "
    with pytest.raises(ValueError, match="typos"):
        perturb_caption(CAPTION, "typo:2", seed=0)
    with pytest.raises(ValueError, match="SEVERITY"):
        perturb_caption(CAPTION, "typos:6", seed=0)


def test_mmi_and_auroc_see_the_damage(tmp_path) -> None:
    clean, noisy = write_perturbed_pair(tmp_path, noise=3.0, kappa_scale=0.2)
    out = ood_retrieval(IdentityVMF(16), clean, noisy, image=False)
    assert out["clean_t2i_recall_at_1"] == 1.0
    assert out["t2i_mmi_at_1"] > 0.5  # most captions lost their image
    assert out["uncertainty_auroc"] == 1.0  # every perturbed caption is less concentrated


def test_identical_copies_have_no_impact(tmp_path) -> None:
    clean, _ = write_perturbed_pair(tmp_path, noise=0.05)
    for image in (True, False):
        out = ood_retrieval(build_method("clip", 16), clean, clean, image=image)
        assert out["t2i_mmi"] == 0.0 and out["i2t_mmi"] == 0.0
        assert out["uncertainty_auroc"] is None  # images perturbed, or clip: no uncertainty
    assert uncertainty_auroc(IdentityVMF(16), clean, clean) is None  # one kappa: undefined


def test_mmi_by_hand() -> None:
    """MMI at K: the relative drop of Recall@K; MMI: their mean over K = 1, 5, 10."""
    clean = {d: {"recall@1": 0.5, "recall@5": 0.8, "recall@10": 1.0} for d in ("t2i", "i2t")}
    ood = {d: {"recall@1": 0.25, "recall@5": 0.8, "recall@10": 0.5} for d in ("t2i", "i2t")}
    got = mmi(clean, ood)
    assert got["t2i_mmi_at_1"] == 0.5 and got["t2i_mmi_at_5"] == 0.0
    assert got["t2i_mmi"] == pytest.approx((0.5 + 0.0 + 0.5) / 3)


def test_alignment_drops_what_the_perturbation_lost(tmp_path) -> None:
    clean, noisy = write_perturbed_pair(tmp_path, noise=0.05)
    keep = np.arange(1, 40)
    fewer = noisy.split.subset(keep, keep)
    noisy = SplitTensors(
        noisy.image_emb[1:], noisy.text_emb[1:], torch.as_tensor(fewer.text_image_index), fewer
    )
    a, b = align(clean, noisy)
    assert a.split.caption_ids == b.split.caption_ids == clean.split.caption_ids[1:]
    assert torch.equal(a.text_to_image, b.text_to_image)
