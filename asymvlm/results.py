"""Result tables: final retrieval metrics under MLflow-safe names and the mean ± std over seeds
(Table A.2 layout, markdown and CSV)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

DIRECTIONS = ("t2i", "i2t")
#: The final numbers of a direction; MLflow names spell "@" as "_at_".
_FINAL_KEYS = "recall@1 recall@5 recall@10 spearman r2 auroc aupr fpr@95tpr aurc e_aurc ece".split()
#: What each final retrieval metric says, by its MLflow name without the direction
#: (``t2i_``/``i2t_``) or split (``val_``) prefix: for model cards and the documentation.
METRIC_MEANINGS = {
    "recall_at_1": "Recall@1: the share of queries whose best match is a right one",
    "recall_at_5": "Recall@5: the share of queries with a right match among the best 5",
    "recall_at_10": "Recall@10: the share of queries with a right match among the best 10",
    "spearman": "S: Spearman correlation of the uncertainty bin (10 equal bins, most certain "
    "first) with Recall@1 in the bin; -1: recall falls steadily as uncertainty rises",
    "r2": "R²: how well a line fits that binned Recall@1 curve",
    "auroc": "AUROC of the uncertainty as a detector of top-1 errors (0.5: blind, 1: perfect)",
    "aupr": "AUPR: average precision of the uncertainty as a detector of top-1 errors "
    "(chance: the error rate, 1: perfect)",
    "fpr_at_95tpr": "FPR@95TPR: the share of correct queries flagged when the uncertainty "
    "threshold flags 95 % of the errors (lower is better)",
    "aurc": "AURC: area under the risk-coverage curve, keeping the most certain queries "
    "first (lower is better)",
    "e_aurc": "E-AURC: AURC minus the best AURC possible for the same errors (lower is better)",
    "ece": "ECE: expected calibration error of the top-1 probability of softmax(tau x score) "
    "over the gallery (lower is better)",
    "rsum": "RSUM: R@1 + R@5 + R@10 of both directions, in percent (0-600)",
}
#: The directions' names, for the same readers.
DIRECTION_MEANINGS = {
    "t2i": "text to image: a caption retrieves its image",
    "i2t": "image to text: an image retrieves one of its captions",
}
_FOLDS = re.compile(r"(coco_1k|folds_\d+)")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _directions(evaluation: Mapping[str, Any], prefix: str) -> dict[str, float]:
    out = {
        f"{prefix}{d}_{key.replace('@', '_at_')}": _number((evaluation.get(d) or {}).get(key))
        for d in DIRECTIONS
        for key in _FINAL_KEYS
    } | {f"{prefix}rsum": _number(evaluation.get("rsum"))}
    return {k: v for k, v in out.items() if v is not None}


def retrieval_metric_names(evaluation: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """:func:`asymvlm.evaluation.evaluate_retrieval`'s defined numbers under MLflow names:
    ``t2i_recall_at_1``, ``rsum``, ``coco1k_t2i_recall_at_1`` (``folds<size>_...``),
    ``eccv_i2t_map_at_r``, ``cxc_i2t_r1`` ...; curves left out."""
    out = _directions(evaluation, prefix)
    for key, value in evaluation.items():
        if _FOLDS.fullmatch(str(key)) and isinstance(value, Mapping):
            out.update(_directions(value, f"{prefix}{str(key).replace('_', '')}_"))
    for direction, scores in (evaluation.get("eccv") or {}).items():
        for key, value in (scores or {}).items():  # eccv_map_at_r -> eccv_<direction>_map_at_r
            group, name = key.split("_", 1)
            if (value := _number(value)) is not None:
                out[f"{prefix}{group}_{direction}_{name}"] = value
    return out


# -- mean ± std over seeds (Table A.2 layout) ---------------------------------------------------
SUMMARY_COLUMNS = [f"{d}_{m}" for d in ("i2t", "t2i") for m in ("recall_at_1", "spearman", "r2")]


def seed_stats(
    rows: Iterable[Mapping[str, Any]] | pd.DataFrame, by: str | list[str], columns: Sequence[str]
) -> pd.DataFrame:
    """Per group of ``by`` (first-seen order): ``seeds`` (rows) and ``<column>_mean``, ``_std``
    (0 for one value) and ``_n`` over the defined values of each column."""
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    values = frame.reindex(columns=list(columns)).apply(pd.to_numeric, errors="coerce")
    keys = [frame[k] for k in ([by] if isinstance(by, str) else by)]
    groups = values.astype(float).groupby(keys, sort=False)
    stats = groups.agg(["mean", "std", "count"])
    stats.columns = [f"{c}_{'n' if k == 'count' else k}" for c, k in stats.columns]
    for column in columns:
        stats.loc[stats[f"{column}_n"] == 1, f"{column}_std"] = 0.0
    stats.insert(0, "seeds", groups.size())
    return stats


def mean_std(
    stats: pd.DataFrame, column: str, scale: float = 1.0, digits: int = 3, bare: bool = False
) -> list[str]:
    """The cells ``mean ± std`` of :func:`seed_stats`' ``column``, scaled ("–": no value;
    ``bare``: a single value without "± 0")."""
    return [
        "–"
        if not n > 0
        else f"{scale * mean:.{digits}f}"
        + ("" if bare and n == 1 else f" ± {scale * std:.{digits}f}")
        for mean, std, n in zip(
            *(stats[f"{column}_{k}"] for k in ("mean", "std", "n")), strict=True
        )
    ]


def markdown(frame: pd.DataFrame) -> str:
    """A frame of text cells as a markdown table (cells kept as written)."""
    return frame.to_markdown(index=False, disable_numparse=True)


def seed_summary(runs: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per method: ``n_seeds`` and the mean, std and n over seeds (``runs``) of each summary
    column that has a value."""
    stats = seed_stats(runs, "method", SUMMARY_COLUMNS)
    return {
        method: {
            "n_seeds": int(row["seeds"]),
            **{
                c: {k: float(row[f"{c}_{k}"]) for k in ("mean", "std")} | {"n": int(row[f"{c}_n"])}
                for c in SUMMARY_COLUMNS
                if row[f"{c}_n"]
            },
        }
        for method, row in stats.iterrows()
    }


def _summary_frame(summary: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """:func:`seed_summary` as :func:`seed_stats` gives it: ``seeds``, ``<col>_mean`` ..."""
    fields = ["seeds"] + [f"{c}_{k}" for c in SUMMARY_COLUMNS for k in ("mean", "std", "n")]
    frame = pd.json_normalize(list(summary.values()), sep="_").set_axis(list(summary))
    return frame.rename(columns={"n_seeds": "seeds"}).reindex(columns=fields)


def stats_table(stats: pd.DataFrame, cells: Iterable[tuple[str, str, float, int]]) -> str:
    """Markdown: per group of :func:`seed_stats` its seeds and ``mean ± std`` of each cell
    ``(column, heading, scale, digits)``."""
    table = {"Method": stats.index, "seeds": stats["seeds"].astype(str)}
    table |= {head: mean_std(stats, col, scale, digits) for col, head, scale, digits in cells}
    return markdown(pd.DataFrame(table))


def summary_markdown(summary: Mapping[str, Mapping[str, Any]], title: str = "") -> str:
    """The table as markdown: R@1 in %, S and R² as is, mean ± std over n seeds."""
    heads = (("recall_at_1", "R@1 (%)", 100.0), ("spearman", "S", 1.0), ("r2", "R²", 1.0))
    cells = [(f"{d}_{c}", f"{d} {h}", s, 2) for d in ("i2t", "t2i") for c, h, s in heads]
    return (
        (f"### {title}\n\n" if title else "") + stats_table(_summary_frame(summary), cells) + "\n"
    )


def summary_csv(summary: Mapping[str, Mapping[str, Any]]) -> str:
    """The table as CSV: one row per method, ``<col>_mean`` / ``<col>_std`` columns."""
    stats = _summary_frame(summary).rename(columns={"seeds": "n_seeds"}).rename_axis("method")
    stats = stats[[c for c in stats.columns if not c.endswith("_n")]]
    return stats.to_csv(float_format=lambda v: repr(float(v)))
