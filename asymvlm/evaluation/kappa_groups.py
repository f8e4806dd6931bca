"""Probes of a trained adapter on the synthetic world: the concentration kappa it gives to each
kind of text (assumptions G and U of :mod:`asymvlm.synthetic`).

None-of-the-above (paper Sec. 5.4, Table 2) works when the dummy prompt ("a photo") has a
*broad* distribution (low kappa, high uncertainty u = 1/kappa, Sec. 4.3) next to the class
prompts: then an image that fits no class well scores higher under the dummy. Whether it does
is a property of the adapter that can be read off directly, before any accuracy is computed:
:func:`kappa_by_group` gives the median kappa of the training captions per level (``-1``: the
generic captions of U), of the class prompts and of each dummy prompt.
"""

from __future__ import annotations

import numpy as np
import torch

from asymvlm.evaluation.suite import load_classification
from asymvlm.methods import Method
from asymvlm.splits import load_split

__all__ = ["kappa_by_group"]


@torch.no_grad()
def _median_kappa(method: Method, inputs: torch.Tensor) -> float:
    kappa = method.kappa(inputs)
    assert kappa is not None
    return float(kappa.median())


def kappa_by_group(
    method: Method, world: str, classes: str, split: str = "train"
) -> dict[str, float] | None:
    """Median kappa of ``method``'s text adapter per group of texts (None for a method without
    kappa): ``level <l>`` for the captions of each level of ``world``'s ``split`` (``level -1``:
    generic captions), ``class prompts`` for the prompts of the classification set at
    ``classes`` (root, split ``test``) and ``dummy "<text>"`` for each of its dummy prompts."""
    adapter_input = getattr(method, "adapter_input", "raw")
    method.eval()
    data = load_split(world, split, adapter_input)
    if method.kappa(data.text_emb[:1]) is None:
        return None
    levels = np.asarray(data.split.extra_text_columns["level"])
    out: dict[str, float] = {}
    for level in np.unique(levels):
        rows = torch.as_tensor(np.flatnonzero(levels == level))
        out[f"level {int(level)}"] = _median_kappa(method, data.text_emb[rows])
    sets = load_classification(classes, "test")
    out["class prompts"] = _median_kappa(method, sets.class_prompts(adapter_input).inputs)
    for text, inputs in sets.dummy_inputs(adapter_input).items():
        out[f'dummy "{text}"'] = _median_kappa(method, inputs)
    return out
