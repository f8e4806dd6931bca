"""The HierarCaps analysis (paper Sec. 5.3, Fig. 5): a faithful uncertainty falls from general
(level 0) to detailed (level 3) captions."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch
from scipy import stats

from asymvlm.evaluation.retrieval import encode_split
from asymvlm.methods import Method
from asymvlm.metrics import distinct_levels
from asymvlm.splits import SplitTensors
from asymvlm.tables import TableError


@torch.no_grad()
def hierarchy_analysis(method: Method, data: SplitTensors, level_column: str = "level") -> dict:
    """Per level the uncertainty and paired score, their Spearman S with level and length, and
    the share of images whose uncertainty falls at every level (None without uncertainty)."""
    levels_all = data.split.extra_text_columns.get(level_column)
    if levels_all is None:
        raise TableError(
            f"the split has no caption column {level_column!r} (HierarCaps levels): give tables "
            "with caption levels (HierarCaps, the synthetic world)"
        )
    levels = np.asarray(levels_all, dtype=np.int64)
    texts, images = encode_split(method, data)
    owner = data.text_to_image
    paired = _paired_scores(method, texts, images, owner).cpu().numpy()
    unc_t = method.text_uncertainty_from(texts)
    constant = unc_t is None or distinct_levels(unc_t) < 2
    unc = None if constant else unc_t.double().cpu().numpy()
    words = np.array([len(t.split()) for t in data.split.texts])

    per_level: dict[str, dict[str, Any]] = {}
    for level in sorted(set(levels.tolist())):
        rows = levels == level
        cell: dict[str, Any] = {
            "n": int(rows.sum()),
            "paired_log_likelihood_mean": float(paired[rows].mean()),
            "words_mean": float(words[rows].mean()),
        }
        if unc is not None:
            cell["uncertainty_mean"] = float(unc[rows].mean())
            names = ("uncertainty_q25", "uncertainty_median", "uncertainty_q75")
            quartiles = np.quantile(unc[rows], [0.25, 0.5, 0.75]).tolist()
            cell |= dict(zip(names, quartiles, strict=True))
        per_level[str(level)] = cell

    out: dict[str, Any] = {
        "method": method.name,
        "per_level": per_level,
        "n_captions": int(len(levels)),
        "spearman_level_uncertainty": None,
        "spearman_words_uncertainty": None,
        "monotone_fraction": None,
        "n_hierarchies": 0,
    }
    if unc is not None:
        out["spearman_level_uncertainty"] = float(stats.spearmanr(levels, unc).statistic)
        out["spearman_words_uncertainty"] = float(stats.spearmanr(words, unc).statistic)
        fraction, n = _monotone_fraction(owner.cpu().numpy(), levels, unc)
        out |= {"monotone_fraction": fraction, "n_hierarchies": n}
    return out


def _paired_scores(method: Method, texts, images, owner: torch.Tensor, chunk: int = 4096):
    """score(caption m, its own image) for every caption, a chunk x chunk block at a time."""
    out = []
    for rows in (slice(s, s + chunk) for s in range(0, owner.shape[0], chunk)):
        t = {k: v[rows] for k, v in texts.items()}
        out.append(torch.diagonal(method.score(t, {k: v[owner[rows]] for k, v in images.items()})))
    return torch.cat(out)


def _monotone_fraction(owner: np.ndarray, levels: np.ndarray, unc: np.ndarray) -> tuple[float, int]:
    """Fraction of images (with one caption per level, >= 2 levels) whose uncertainty falls
    strictly with the level (a NaN does not fall); and how many such images there are."""
    frame = pd.DataFrame({"owner": owner, "level": levels, "u": unc})
    groups = frame.sort_values(["owner", "level"]).groupby("owner")
    counted = (groups.size() >= 2) & (groups["level"].nunique() == groups.size())
    falls = groups["u"].agg(lambda u: bool(np.all(np.diff(u.to_numpy()) < 0)))
    total = int(counted.sum())
    return (int((counted & falls).sum()) / total if total else float("nan")), total
