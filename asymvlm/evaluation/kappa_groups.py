"""The concentration kappa a trained adapter gives to each kind of text of the synthetic world:
none-of-the-above (Sec. 5.4) works when the dummy prompt gets a low kappa next to the classes'."""

from __future__ import annotations

import numpy as np
import torch

from asymvlm.evaluation.suite import adapter_input, load_classification
from asymvlm.methods import Method
from asymvlm.splits import load_split


@torch.no_grad()
def kappa_by_group(
    method: Method, world: str, classes: str, split: str = "train"
) -> dict[str, float] | None:
    """Median kappa (None for a method without) per ``level <l>`` of ``world``'s captions,
    for the ``class prompts`` of ``classes`` (split test) and each ``dummy "<text>"``."""
    method.eval()
    data = load_split(world, split, adapter_input(method))
    if method.kappa(data.text_emb[:1]) is None:
        return None
    levels = np.asarray(data.split.extra_text_columns["level"])
    sets = load_classification(classes, "test")
    groups = {
        f"level {int(v)}": data.text_emb[torch.as_tensor(levels == v)] for v in np.unique(levels)
    }
    groups["class prompts"] = sets.class_prompts(adapter_input(method)).inputs
    for text, inputs in sets.dummy_inputs(adapter_input(method)).items():
        groups[f'dummy "{text}"'] = inputs
    return {name: float(method.kappa(x).median()) for name, x in groups.items()}
