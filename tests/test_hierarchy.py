"""The HierarCaps analysis on hand-built hierarchies whose uncertainty must (not) fall."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from asymvlm.evaluation.hierarcaps import _monotone_fraction, hierarchy_analysis
from asymvlm.methods import build_method
from asymvlm.splits import load_split
from tests.helpers import IdentityVMF, write_hierarchies

D, N_IMAGES = 8, 6


def test_uncertainty_falling_with_level_is_recognised(tmp_path) -> None:
    kappas = np.tile([2.0, 5.0, 12.0, 30.0], (N_IMAGES, 1))  # detailed = concentrated
    write_hierarchies(str(tmp_path), kappas)
    data = load_split(str(tmp_path), "test", adapter_input="raw")
    res = hierarchy_analysis(IdentityVMF(D), data)
    assert res["monotone_fraction"] == 1.0 and res["n_hierarchies"] == N_IMAGES
    # Falling; not exactly -1: levels tie within a level, the (float32) uncertainties do not.
    assert res["spearman_level_uncertainty"] < -0.95 and res["spearman_words_uncertainty"] < -0.95
    means = [res["per_level"][str(level)]["uncertainty_mean"] for level in range(4)]
    np.testing.assert_allclose(means, 1 / kappas[0], rtol=1e-6)
    # The paired score is the model's own log-likelihood of the true pair.
    method = IdentityVMF(D)
    ll = method.score(method.encode_texts(data.text_emb), method.encode_images(data.image_emb))
    want = ll[torch.arange(len(ll)), data.text_to_image].numpy()
    want = want[data.split.extra_text_columns["level"] == 2].mean()
    assert res["per_level"]["2"]["paired_log_likelihood_mean"] == pytest.approx(want)


def test_methods_without_uncertainty_and_missing_levels(tmp_path) -> None:
    write_hierarchies(str(tmp_path), np.ones((N_IMAGES, 4)))
    data = load_split(str(tmp_path), "test")
    res = hierarchy_analysis(build_method("clip", D), data)
    assert res["monotone_fraction"] is None and res["spearman_level_uncertainty"] is None
    assert set(res["per_level"]) == {"0", "1", "2", "3"}
    const = hierarchy_analysis(IdentityVMF(D), load_split(str(tmp_path), "test"))
    assert const["monotone_fraction"] is None and const["spearman_words_uncertainty"] is None
    assert "uncertainty_mean" not in const["per_level"]["0"]  # a constant 1/kappa: undefined
    data.split.extra_text_columns.pop("level")
    with pytest.raises(ValueError, match="level"):
        hierarchy_analysis(build_method("clip", D), data)


def test_monotone_fraction_counts_complete_hierarchies_that_fall_strictly() -> None:
    owner = np.array([0, 0, 0, 1, 1, 2, 2, 3, 4, 4])
    levels = np.array([2, 0, 1, 0, 1, 0, 0, 0, 0, 1])
    # image 0 falls (by level 3, 2, 1), 1 rises, 2 repeats a level and 3 has one caption (not
    # counted), 4 has a NaN (does not fall).
    unc = np.array([1.0, 3.0, 2.0, 1.0, 1.0, 2.0, 1.0, 5.0, np.nan, 1.0])
    assert _monotone_fraction(owner, levels, unc) == (1 / 3, 3)
    assert math.isnan(_monotone_fraction(owner[:0], levels[:0], unc[:0])[0])


def test_analyze_without_adapters_evaluates_the_frozen_model(small_world, capsys) -> None:
    from asymvlm.cli import main

    assert main(["analyze", "hierarcaps", "--data", f"{small_world}:test"]) == 0
    assert set(json.loads(capsys.readouterr().out)) == {"clip"}
    assert main(["analyze", "ood", "--data", f"{small_world}:test", "--perturbed", "typos:3"]) == 2
    assert "--perturbed expects KIND:SEVERITY=ROOT:SPLIT" in capsys.readouterr().err
