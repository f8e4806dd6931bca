"""Zero-shot classification (paper Sec. 5.4, Tables 2 and 3): cosine methods use CLIP's
:func:`prompt_ensemble`; likelihood methods combine a class's prompt log-likelihoods by their
mean (default) or, ``"logmeanexp"``, the log of the mean likelihood (the class as a mixture of
its prompts; never below the mean, by Jensen: a dummy class has one prompt, real classes many)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from asymvlm.methods import Method
from asymvlm.methods.base import unit
from asymvlm.tables import TableError

__all__ = [
    "ClassPrompts",
    "class_scores",
    "none_of_the_above",
    "prompt_ensemble",
    "rejection_baselines",
    "zero_shot_accuracy",
]


@dataclass
class ClassPrompts:
    """Prompt features [n_prompts, d] (adapter inputs) and their classes 0..n_classes-1."""

    inputs: torch.Tensor
    class_index: torch.Tensor
    n_classes: int

    def __post_init__(self) -> None:
        present = torch.unique(self.class_index)
        if present.numel() != self.n_classes or int(present.min()) != 0:
            raise TableError(
                f"every class 0..{self.n_classes - 1} needs at least one prompt; the "
                f"prompts cover {present.tolist()}"
            )


def prompt_ensemble(mu: torch.Tensor, class_index: torch.Tensor, n_classes: int) -> torch.Tensor:
    """CLIP's prompt ensemble (Radford et al. 2021, Sec. 3.1.4): per class the direction of the
    mean of its unit prompt embeddings, [n_classes, d]."""
    summed = torch.zeros(n_classes, mu.shape[1], dtype=mu.dtype, device=mu.device)
    summed.index_add_(0, class_index.to(mu.device), mu)
    return unit(summed)


def _mean(per_prompt: torch.Tensor, class_index: torch.Tensor, counts: torch.Tensor):
    """[n, n_classes]: the mean over each class's prompts of ``per_prompt`` [n, n_prompts]."""
    summed = torch.zeros(per_prompt.shape[0], len(counts), dtype=per_prompt.dtype)
    return summed.index_add_(1, class_index, per_prompt) / counts


def _log_mean_exp(per_prompt: torch.Tensor, class_index: torch.Tensor, counts: torch.Tensor):
    """[n, n_classes]: ln((1/K_c) sum_{k in c} exp(per_prompt_k)), stabilised by the class's
    largest term."""
    index = class_index.unsqueeze(0).expand_as(per_prompt)
    peak = torch.full((per_prompt.shape[0], len(counts)), -torch.inf, dtype=per_prompt.dtype)
    peak.scatter_reduce_(1, index, per_prompt, reduce="amax")
    summed = torch.zeros_like(peak)
    summed.index_add_(1, class_index, torch.exp(per_prompt - peak.gather(1, index)))
    return peak + torch.log(summed) - torch.log(counts)


AGGREGATIONS = {"mean": _mean, "logmeanexp": _log_mean_exp}


@torch.no_grad()
def class_scores(
    method: Method,
    image_emb: torch.Tensor,
    prompts: ClassPrompts,
    chunk_size: int = 4096,
    aggregation: str = "mean",
) -> torch.Tensor:
    """[n_image, n_classes]: the cosine to the :func:`prompt_ensemble` for cosine methods, else
    the score combined over the class's prompts by ``aggregation``."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(
            f"template aggregation must be one of {list(AGGREGATIONS)}, got {aggregation!r}"
        )
    method.eval()
    texts = method.encode_texts(prompts.inputs)
    cosine = type(method).score is Method.score
    if cosine:
        texts = {"mu": prompt_ensemble(texts["mu"], prompts.class_index, prompts.n_classes)}
    counts = torch.bincount(prompts.class_index, minlength=prompts.n_classes).to(image_emb.dtype)
    out = []
    for start in range(0, image_emb.shape[0], chunk_size):
        images = method.encode_images(image_emb[start : start + chunk_size])
        per_text = method.score(texts, images).T.float()  # [chunk, n_classes or n_prompts]
        combine = AGGREGATIONS[aggregation]
        out.append(per_text if cosine else combine(per_text, prompts.class_index, counts))
    return torch.cat(out)


def zero_shot_accuracy(
    method: Method,
    image_emb: torch.Tensor,
    labels: torch.Tensor,
    prompts: ClassPrompts,
    aggregation: str = "mean",
) -> float:
    """Top-1 accuracy of maximum-score classification (Table 3)."""
    predicted = class_scores(method, image_emb, prompts, aggregation=aggregation).argmax(1)
    return float((predicted == labels).double().mean())


def none_of_the_above(
    method: Method,
    positives: torch.Tensor,
    labels: torch.Tensor,
    negatives: torch.Tensor,
    prompts: ClassPrompts,
    dummies: Mapping[str, torch.Tensor],
    far_negatives: torch.Tensor | None = None,
    aggregation: str = "mean",
) -> dict[str, dict[str, float]]:
    """Table 2, per dummy prompt (name -> its prompt rows), each alone as one more class: a
    prediction of it is a rejection (a tie goes to the class). ``pos_acc``: positives given
    their class; ``neg_acc`` (``far_neg_acc``): negatives (far negatives) rejected."""
    names = list(dummies)
    dummy_prompts = ClassPrompts(
        inputs=torch.cat([dummies[n] for n in names]),
        class_index=torch.cat([torch.full((dummies[n].shape[0],), k) for k, n in enumerate(names)]),
        n_classes=len(names),
    )
    sets = {"pos": positives, "neg": negatives, "far": far_negatives}
    rejected, predicted = {}, {}
    for key, images in ((k, x) for k, x in sets.items() if x is not None):
        classes = class_scores(method, images, prompts, aggregation=aggregation)
        extra = class_scores(method, images, dummy_prompts, aggregation=aggregation)
        best, predicted[key] = classes.max(1)
        rejected[key] = extra > best.unsqueeze(1)  # [n_images, n_dummies]
    out: dict[str, dict[str, float]] = {}
    for k, name in enumerate(names):
        pos_kept = (predicted["pos"] == labels) & ~rejected["pos"][:, k]
        out[name] = {
            "pos_acc": float(pos_kept.double().mean()),
            "neg_acc": float(rejected["neg"][:, k].double().mean()),
            "pos_rejected": float(rejected["pos"][:, k].double().mean()),
        }
        if "far" in rejected:
            out[name]["far_neg_acc"] = float(rejected["far"][:, k].double().mean())
    return out


def _softmax_stats(
    method: Method, images: torch.Tensor, prompts: ClassPrompts, temperature: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    probs = (temperature * class_scores(method, images, prompts)).softmax(1).numpy()
    top2 = np.sort(probs, axis=1)[:, -2:]
    return probs.argmax(1), top2[:, 1], top2[:, 1] - top2[:, 0]


def rejection_baselines(
    method: Method,
    positives: torch.Tensor,
    labels: torch.Tensor,
    negatives: torch.Tensor,
    prompts: ClassPrompts,
    *,
    temperature: float = 100.0,
    far_negatives: torch.Tensor | None = None,
) -> dict[str, dict[str, Any]]:
    """The frozen model's threshold (max softmax probability) and margin (top-1 minus top-2)
    rejection (Table 2, "None"): the cut-off maximises the mean of positive and negative
    accuracy on a seeded half of the images; accuracies are reported on the other half."""
    sets = {"pos": positives, "neg": negatives, "far": far_negatives}
    got = {
        k: _softmax_stats(method, x, prompts, temperature) for k, x in sets.items() if x is not None
    }
    correct = got["pos"][0] == labels.numpy()
    rng = np.random.default_rng(0)
    cal_p = rng.random(len(correct)) < 0.5
    cal_n = rng.random(len(got["neg"][0])) < 0.5
    out: dict[str, dict[str, Any]] = {}
    for k, name in ((1, "threshold"), (2, "margin")):
        sp, sn = got["pos"][k], got["neg"][k]
        values = np.unique(np.concatenate([sp[cal_p], sn[cal_n]]))
        # Cuts halfway between neighbouring calibration scores (and below / above all).
        candidates = np.concatenate(
            [values[:1] - 1e-12, 0.5 * (values[1:] + values[:-1]), values[-1:] + 1e-12]
        )
        best_cut, best_value = 0.0, -1.0
        for cut in candidates:  # accept when score >= cut
            pos_acc = np.mean(correct[cal_p] & (sp[cal_p] >= cut)) if cal_p.any() else 0.0
            neg_acc = np.mean(sn[cal_n] < cut) if cal_n.any() else 0.0
            if 0.5 * (pos_acc + neg_acc) > best_value:
                best_cut, best_value = float(cut), 0.5 * (pos_acc + neg_acc)
        out[name] = {
            "pos_acc": float(np.mean(correct[~cal_p] & (sp[~cal_p] >= best_cut))),
            "neg_acc": float(np.mean(sn[~cal_n] < best_cut)),
            "cut": best_cut,
        }
        if "far" in got:
            out[name]["far_neg_acc"] = float(np.mean(got["far"][k] < best_cut))
    return out
