"""The concentration kappa a trained adapter gives to each kind of text of the synthetic world:
none-of-the-above (Sec. 5.4) works when the dummy prompt gets a low kappa next to the classes'."""

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
    """Median kappa (None for a method without) per ``level <l>`` of ``world``'s captions,
    for the ``class prompts`` of ``classes`` (split test) and each ``dummy "<text>"``."""
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
