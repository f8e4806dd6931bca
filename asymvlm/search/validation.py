"""How the queries of a split fare (each caption as a text -> image query, each image as an
image -> text query), ranked by the method's own score as an index ranks: the outcomes the
decisions are fitted on (:func:`fit_policies`) and the selective-retrieval benchmark reads."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from asymvlm.evaluation.retrieval import encode_split
from asymvlm.methods import Method
from asymvlm.search.decision import DecisionPolicy, fit_policy
from asymvlm.search.forms import InnerProductForm, cap_cosine
from asymvlm.splits import SplitTensors, load_split

#: Captions scored at a time.
CHUNK = 1024


@dataclass
class QueryOutcomes:
    """Per text query (caption): kappa, whether its first image is its own, the widened k and
    whether the widened answer holds its image, the top score and the top-1 margin; per image
    query: the first caption's kappa and whether it is one of the image's captions."""

    kappa: np.ndarray
    hit_first: np.ndarray
    widened_k: np.ndarray
    hit_widened: np.ndarray
    top_score: np.ndarray
    margin: np.ndarray
    image_kappa: np.ndarray
    image_hit_first: np.ndarray
    image_top_score: np.ndarray
    image_margin: np.ndarray


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
    out = {name: [] for name in ("hit_first", "cap_counts", "top_score", "margin", "rank")}
    best_score = torch.full((n_image,), -torch.inf, dtype=torch.float64)
    best_row = torch.zeros(n_image, dtype=torch.long)
    second = torch.full((n_image,), -torch.inf, dtype=torch.float64)
    z = form.image_items(images)
    for start in range(0, n_text, CHUNK):
        part = {name: value[start : start + CHUNK] for name, value in texts.items()}
        scores = method.score(part, images).double()
        target = owner[start : start + CHUNK, None]
        paired = scores.gather(1, target)
        lower = torch.arange(n_image) < target
        rank = (scores > paired).sum(1) + ((scores == paired) & lower).sum(1)
        top2 = scores.topk(min(2, n_image), dim=1).values
        out["rank"].append(rank)
        out["top_score"].append(top2[:, 0])
        out["margin"].append(top2[:, 0] - top2[:, -1])
        if "kappa" in part:
            cosine = form.text_queries(part) @ z.T
            threshold = cap_cosine(form.family, part["kappa"], method.dim)
            out["cap_counts"].append((cosine.double() >= threshold[:, None]).sum(1))
        columns = scores.T  # [image, caption]: the best two captions per image so far
        col_top = columns.topk(min(2, len(columns[0])), dim=1)
        better = col_top.values[:, 0] > best_score
        second = torch.where(
            better,
            torch.maximum(best_score, col_top.values[:, -1]),
            torch.maximum(second, col_top.values[:, 0]),
        )
        best_row = torch.where(better, col_top.indices[:, 0] + start, best_row)
        best_score = torch.where(better, col_top.values[:, 0], best_score)
    rank = torch.cat(out["rank"]).numpy()
    kappa = texts.get("kappa")
    kappa = kappa.double().cpu().numpy() if kappa is not None else np.full(n_text, np.nan)
    counts = torch.cat(out["cap_counts"]).numpy() if out["cap_counts"] else np.full(n_text, k)
    wide = widened_k(counts, k, widen_max)
    return QueryOutcomes(
        kappa=kappa,
        hit_first=rank == 0,
        widened_k=wide,
        hit_widened=rank < wide,
        top_score=torch.cat(out["top_score"]).numpy(),
        margin=torch.cat(out["margin"]).numpy(),
        image_kappa=kappa[best_row.numpy()],
        image_hit_first=(owner[best_row] == torch.arange(n_image)).numpy(),
        image_top_score=best_score.numpy(),
        image_margin=(best_score - second).numpy(),
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
    outcomes = query_outcomes(method, form, load_split(tables, split, method.adapter_input), k, widen_max)
    return {
        "t2i": fit_policy(outcomes.kappa, outcomes.hit_first, outcomes.hit_widened, target_risk),
        "i2t": fit_policy(outcomes.image_kappa, outcomes.image_hit_first, None, target_risk),
    }
