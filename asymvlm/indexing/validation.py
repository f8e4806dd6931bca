"""How the queries of a split fare (each caption as a text -> image query, each image as an
image -> text query), ranked by the method's own score as an index ranks: the outcomes the
decisions are fitted on (:func:`fit_policies`) and the selective-retrieval benchmark reads."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from asymvlm.evaluation.retrieval import encode_split
from asymvlm.indexing.decision import DecisionPolicy, fit_policy
from asymvlm.indexing.forms import InnerProductForm, cap_cosine
from asymvlm.methods import Method
from asymvlm.splits import SplitTensors, load_split

#: Captions scored at a time.
CHUNK = 1024


@dataclass
class QueryOutcomes:
    """Per text query (caption): kappa, whether its first image is its own, the widened k and
    whether the widened answer holds its image; per image query: the first caption's kappa and
    whether it is one of the image's captions."""

    kappa: np.ndarray
    hit_first: np.ndarray
    widened_k: np.ndarray
    hit_widened: np.ndarray
    image_kappa: np.ndarray
    image_hit_first: np.ndarray


def widened_k(cap_counts: np.ndarray, k: int, widen_max: int) -> np.ndarray:
    """Results of a widened answer: the images in the caption's cap, at least k, at most
    ``widen_max``."""
    return np.clip(cap_counts, k, max(k, widen_max))


@torch.no_grad()
def query_outcomes(
    method: Method, form: InnerProductForm, data: SplitTensors, k: int = 10, widen_max: int = 100
) -> QueryOutcomes:
    """The :class:`QueryOutcomes` of every caption and image of ``data`` (ties: lower row)."""
    texts, images = encode_split(method, data)
    n_text, n_image = len(data.text_emb), len(data.image_emb)
    owner = data.text_to_image.long().cpu()
    ranks, cap_counts = [], []
    best_score = torch.full((n_image,), -torch.inf, dtype=torch.float64)
    best_row = torch.zeros(n_image, dtype=torch.long)
    z = form.image_items(images)
    for start in range(0, n_text, CHUNK):
        part = {name: value[start : start + CHUNK] for name, value in texts.items()}
        scores = method.score(part, images).double()
        target = owner[start : start + CHUNK, None]
        paired = scores.gather(1, target)
        lower = torch.arange(n_image) < target
        rank = (scores > paired).sum(1) + ((scores == paired) & lower).sum(1)
        ranks.append(rank)
        if "kappa" in part:
            cosine = form.text_queries(part) @ z.T
            threshold = cap_cosine(form.family, part["kappa"], method.dim)
            cap_counts.append((cosine.double() >= threshold[:, None]).sum(1))
        chunk_best, chunk_row = scores.max(dim=0)  # the first maximum: the lower caption row
        better = chunk_best > best_score  # an earlier chunk keeps a tie
        best_row = torch.where(better, chunk_row + start, best_row)
        best_score = torch.where(better, chunk_best, best_score)
    rank = torch.cat(ranks).numpy()
    kappa = texts.get("kappa")
    kappa = kappa.double().cpu().numpy() if kappa is not None else np.full(n_text, np.nan)
    counts = torch.cat(cap_counts).numpy() if cap_counts else np.full(n_text, k)
    wide = widened_k(counts, k, widen_max)
    return QueryOutcomes(
        kappa=kappa,
        hit_first=rank == 0,
        widened_k=wide,
        hit_widened=rank < wide,
        image_kappa=kappa[best_row.numpy()],
        image_hit_first=(owner[best_row] == torch.arange(n_image)).numpy(),
    )


def fit_policies(
    method: Method,
    form: InnerProductForm,
    tables: str,
    split: str,
    target_risk: float,
    widen_max: int,
    k: int = 10,
) -> dict[str, DecisionPolicy]:
    """Both directions' :class:`DecisionPolicy` on ``tables``/``split`` (none without kappa)."""
    if form.family == "cosine":
        return {}
    outcomes = query_outcomes(
        method, form, load_split(tables, split, method.adapter_input), k, widen_max
    )
    return {
        "t2i": fit_policy(outcomes.kappa, outcomes.hit_first, outcomes.hit_widened, target_risk),
        "i2t": fit_policy(outcomes.image_kappa, outcomes.image_hit_first, None, target_risk),
    }
