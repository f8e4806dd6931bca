"""Retrieval under perturbed inputs (beyond the paper; ELIP Sec. 2): Recall@K on clean and
perturbed copies (``asymvlm embed --image-perturbation`` / ``--text-perturbation``), the MMI
score 1 - R_ood / R_id, and the AUROC of caption uncertainty for perturbed vs clean captions.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from scipy import stats

from asymvlm.evaluation.retrieval import encode_split, evaluate_retrieval
from asymvlm.methods import Method
from asymvlm.splits import SplitTensors
from asymvlm.tables import TableError

__all__ = ["align", "mmi", "ood_retrieval", "plot_severity", "uncertainty_auroc"]

KS = (1, 5, 10)


def align(clean: SplitTensors, other: SplitTensors) -> tuple[SplitTensors, SplitTensors]:
    """Both splits restricted to the images and captions they share, in the same order."""
    a, b = clean.split, other.split
    other_images, other_captions = set(b.image_ids), set(b.caption_ids)  # once, not per id
    images = [i for i in a.image_ids if i in other_images]
    captions = [c for c in a.caption_ids if c in other_captions]
    if not images or not captions:
        raise TableError(
            "the clean and perturbed splits share no images or captions (are "
            "they copies of the same data?)"
        )
    out = []
    for data in (clean, other):
        pos_i = {iid: k for k, iid in enumerate(data.split.image_ids)}
        pos_c = {cid: k for k, cid in enumerate(data.split.caption_ids)}
        rows_i = np.array([pos_i[i] for i in images])
        owner = data.split.text_image_index
        kept = set(images)
        rows_t = np.array(
            [pos_c[c] for c in captions if data.split.image_ids[owner[pos_c[c]]] in kept]
        )
        out.append(data.subset(rows_i, rows_t))
    return out[0], out[1]


def _mix(images_from: SplitTensors, texts_from: SplitTensors) -> SplitTensors:
    return SplitTensors(
        image_emb=images_from.image_emb,
        image_norm=images_from.image_norm,
        text_emb=texts_from.text_emb,
        text_to_image=texts_from.text_to_image,
        split=texts_from.split,
    )


def mmi(clean: dict[str, Any], ood: dict[str, Any]) -> dict[str, float]:
    """MultiModal Impact per direction: relative Recall@K drop, per K and the mean over K."""
    out: dict[str, float] = {}
    for direction in ("t2i", "i2t"):
        drops = []
        for k in KS:
            base = clean[direction][f"recall@{k}"]
            drop = 1.0 - ood[direction][f"recall@{k}"] / base if base > 0 else float("nan")
            out[f"{direction}_mmi_at_{k}"] = drop
            drops.append(drop)
        out[f"{direction}_mmi"] = float(np.mean(drops))
    return out


@torch.no_grad()
def ood_retrieval(
    method: Method,
    clean: SplitTensors,
    image_ood: SplitTensors | None = None,
    text_ood: SplitTensors | None = None,
) -> dict[str, Any]:
    """Retrieval on clean / image-perturbed / caption-perturbed / both, with MMI per case."""
    if image_ood is None and text_ood is None:
        raise ValueError("give image_ood, text_ood or both")
    base = clean
    if image_ood is not None:
        base, image_ood = align(base, image_ood)
    if text_ood is not None:
        base, text_ood = align(base, text_ood)
        if image_ood is not None:
            image_ood, _ = align(image_ood, text_ood)
    cases = {"clean": base}
    if image_ood is not None:
        cases["image_ood"] = _mix(image_ood, base)
    if text_ood is not None:
        cases["text_ood"] = _mix(base, text_ood)
    if image_ood is not None and text_ood is not None:
        cases["both_ood"] = _mix(image_ood, text_ood)
    results = {name: evaluate_retrieval(method, data) for name, data in cases.items()}
    out: dict[str, Any] = {"method": method.name, "cases": results}
    for name in cases:
        if name != "clean":
            out[f"mmi_{name}"] = mmi(results["clean"], results[name])
    if text_ood is not None:
        out["uncertainty_auroc"] = uncertainty_auroc(method, base, text_ood)
    return out


@torch.no_grad()
def uncertainty_auroc(method: Method, clean: SplitTensors, perturbed: SplitTensors) -> float | None:
    """P(uncertainty of a perturbed caption > a clean one's), ties half (Mann-Whitney U / n n');
    None without caption uncertainty."""
    u_clean = method.text_uncertainty_from(encode_split(method, clean)[0])
    if u_clean is None:
        return None
    u_pert = method.text_uncertainty_from(encode_split(method, perturbed)[0])
    a, b = u_pert.double().cpu().numpy(), u_clean.double().cpu().numpy()
    u = stats.mannwhitneyu(a, b, alternative="two-sided").statistic
    return float(u / (len(a) * len(b)))


def plot_severity(
    curves: dict[str, dict[int, float]], path: str, ylabel: str = "Recall@1", title: str = ""
) -> str:
    """One line per method: a metric against perturbation severity (0 = clean)."""
    from asymvlm.plots import plt, save_figure

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for name, curve in curves.items():
        xs = sorted(curve)
        ax.plot(xs, [curve[x] for x in xs], marker="o", label=name)
    ax.set_xlabel("severity (0 = clean)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return save_figure(fig, [ax], path)
