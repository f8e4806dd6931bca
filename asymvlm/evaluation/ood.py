"""Retrieval under perturbed inputs (beyond the paper; ELIP Sec. 2): Recall@K, the MMI score
1 - R_ood / R_id and the AUROC of caption uncertainty for perturbed vs clean captions."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from scipy import stats

from asymvlm.evaluation.retrieval import encode_split, evaluate_retrieval
from asymvlm.methods import Method
from asymvlm.metrics import distinct_levels
from asymvlm.splits import SplitTensors
from asymvlm.tables import TableError


def align(clean: SplitTensors, other: SplitTensors) -> tuple[SplitTensors, SplitTensors]:
    """Both splits restricted to the images and captions they share, in the same order."""
    a, b = clean.split, other.split
    shared_images, shared_captions = set(b.image_ids), set(b.caption_ids)
    images = [i for i in a.image_ids if i in shared_images]
    captions = [c for c in a.caption_ids if c in shared_captions]
    if not images or not captions:
        raise TableError(
            "the clean and perturbed splits share no images or captions (are "
            "they copies of the same data?)"
        )
    kept = set(images)
    out = []
    for data in (clean, other):
        split = data.split
        pos_i = {iid: k for k, iid in enumerate(split.image_ids)}
        pos_c = {cid: k for k, cid in enumerate(split.caption_ids)}
        owner = split.text_image_index
        rows_t = [pos_c[c] for c in captions if split.image_ids[owner[pos_c[c]]] in kept]
        out.append(data.subset(np.array([pos_i[i] for i in images]), np.array(rows_t)))
    return out[0], out[1]


def mmi(clean: dict[str, Any], ood: dict[str, Any]) -> dict[str, float]:
    """MultiModal Impact per direction: relative Recall@K drop, per K and the mean over K."""
    out: dict[str, float] = {}
    for direction in ("t2i", "i2t"):
        drops = []
        for k in (1, 5, 10):
            base = clean[direction][f"recall@{k}"]
            drop = 1.0 - ood[direction][f"recall@{k}"] / base if base > 0 else float("nan")
            out[f"{direction}_mmi_at_{k}"] = drop
            drops.append(drop)
        out[f"{direction}_mmi"] = float(np.mean(drops))
    return out


@torch.no_grad()
def ood_retrieval(
    method: Method, clean: SplitTensors, perturbed: SplitTensors, image: bool
) -> dict[str, Any]:
    """Recall@1 on the clean split and with its images (``image``) or captions perturbed, the
    MMI of the perturbed case and, for captions, :func:`uncertainty_auroc`."""
    clean, perturbed = align(clean, perturbed)
    images, texts = (perturbed, clean) if image else (clean, perturbed)
    mixed = SplitTensors(
        image_emb=images.image_emb,
        image_norm=images.image_norm,
        text_emb=texts.text_emb,
        text_to_image=texts.text_to_image,
        split=texts.split,
    )
    base, ood = evaluate_retrieval(method, clean), evaluate_retrieval(method, mixed)
    return {
        "clean_t2i_recall_at_1": base["t2i"]["recall@1"],
        "clean_i2t_recall_at_1": base["i2t"]["recall@1"],
        "t2i_recall_at_1": ood["t2i"]["recall@1"],
        "i2t_recall_at_1": ood["i2t"]["recall@1"],
        **mmi(base, ood),
        "uncertainty_auroc": None if image else uncertainty_auroc(method, clean, perturbed),
    }


@torch.no_grad()
def uncertainty_auroc(method: Method, clean: SplitTensors, perturbed: SplitTensors) -> float | None:
    """P(uncertainty of a perturbed caption > a clean one's), ties half (Mann-Whitney U / n n');
    None without caption uncertainty or with a constant one."""
    u_clean = method.text_uncertainty_from(encode_split(method, clean)[0])
    if u_clean is None:
        return None
    u_pert = method.text_uncertainty_from(encode_split(method, perturbed)[0])
    a, b = u_pert.double().cpu().numpy(), u_clean.double().cpu().numpy()
    if distinct_levels(np.concatenate([a, b])) < 2:
        return None
    return float(stats.mannwhitneyu(a, b).statistic / (len(a) * len(b)))
