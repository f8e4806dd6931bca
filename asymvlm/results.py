"""Result tables: final retrieval metrics under MLflow-safe names and the mean ± std over seeds
(Table A.2 layout, markdown and CSV). Plain Python, no MLflow: the sweep, the report and the
tests share them.
"""

from __future__ import annotations

import csv
import io
import math
import re
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "DIRECTIONS",
    "DIRECTION_MEANINGS",
    "METRIC_MEANINGS",
    "SUMMARY_COLUMNS",
    "retrieval_metric_names",
    "seed_summary",
    "summary_csv",
    "summary_markdown",
]

DIRECTIONS = ("t2i", "i2t")
_FINAL_KEYS = {
    "recall@1": "recall_at_1",
    "recall@5": "recall_at_5",
    "recall@10": "recall_at_10",
    "spearman": "spearman",
    "r2": "r2",
    "auroc": "auroc",
    "aupr": "aupr",
    "fpr@95tpr": "fpr_at_95tpr",
    "aurc": "aurc",
    "e_aurc": "e_aurc",
    "ece": "ece",
}
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
# ECCV Caption / CxC (asymvlm.metrics.eccv): result key -> "<group>_<direction>_<name>"
_ECCV_KEYS = {
    "eccv_map_at_r": ("eccv", "map_at_r"),
    "eccv_rprecision": ("eccv", "rprecision"),
    "eccv_r1": ("eccv", "r1"),
    "cxc_r1": ("cxc", "r1"),
}
_FOLDS = re.compile(r"(coco_1k|folds_\d+)")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _directions(evaluation: Mapping[str, Any], prefix: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for direction in DIRECTIONS:
        for key, name in _FINAL_KEYS.items():
            value = _number((evaluation.get(direction) or {}).get(key))
            if value is not None:
                out[f"{prefix}{direction}_{name}"] = value
    value = _number(evaluation.get("rsum"))
    if value is not None:
        out[f"{prefix}rsum"] = value
    return out


def retrieval_metric_names(evaluation: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Flatten :func:`asymvlm.evaluation.evaluate_retrieval` output into MLflow metric names.

    ``{"t2i": {"recall@1": .3, "spearman": -.9, "ece": .1, ...}, "rsum": 250.0}`` ->
    ``{"t2i_recall_at_1": .3, "t2i_spearman": -.9, "t2i_ece": .1, ..., "rsum": 250.0}``; the
    COCO 1K fold means as ``coco1k_t2i_recall_at_1``, ``coco1k_rsum`` ... (other fold sizes:
    ``folds<size>_...``); ECCV Caption as ``eccv_i2t_map_at_r``, ``eccv_i2t_rprecision``,
    ``eccv_i2t_r1`` and CxC as ``cxc_i2t_r1`` (and ``t2i``). Undefined values (no uncertainty:
    spearman/r2 None) are left out, and so are curves (``risk_coverage``, binned recall).
    """
    out = _directions(evaluation, prefix)
    for key, value in evaluation.items():
        if _FOLDS.fullmatch(str(key)) and isinstance(value, Mapping):
            out.update(_directions(value, f"{prefix}{str(key).replace('_', '')}_"))
    for direction, scores in (evaluation.get("eccv") or {}).items():
        for key, (group, name) in _ECCV_KEYS.items():
            value = _number((scores or {}).get(key))
            if value is not None:
                out[f"{prefix}{group}_{direction}_{name}"] = value
    return out


# -- mean ± std over seeds (Table A.2 layout) ---------------------------------------------------
SUMMARY_COLUMNS = [f"{d}_{m}" for d in ("i2t", "t2i") for m in ("recall_at_1", "spearman", "r2")]


def seed_summary(runs: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per method: mean, std (sample, ddof=1) and n over seeds of every summary column.

    ``runs`` are dicts with ``method`` and the flat final metrics of one seed each.
    """
    by_method: dict[str, list[Mapping[str, Any]]] = {}
    for run in runs:
        by_method.setdefault(run["method"], []).append(run)
    out: dict[str, dict[str, Any]] = {}
    for method, rows in by_method.items():
        cells: dict[str, Any] = {"n_seeds": len(rows)}
        for col in SUMMARY_COLUMNS:
            values = [float(r[col]) for r in rows if r.get(col) is not None]
            if values:
                cells[col] = {
                    "mean": statistics.fmean(values),
                    "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                    "n": len(values),
                }
        out[method] = cells
    return out


def _cell(stats: Mapping[str, float] | None, scale: float) -> str:
    if not stats:
        return "–"
    return f"{scale * stats['mean']:.2f} ± {scale * stats['std']:.2f}"


def summary_markdown(summary: Mapping[str, Mapping[str, Any]], title: str = "") -> str:
    """The table as markdown: R@1 in %, S and R² as is, mean ± std over n seeds."""
    head = ["Method", "seeds"] + [
        f"{d} {m}" for d in ("i2t", "t2i") for m in ("R@1 (%)", "S", "R²")
    ]
    lines = [f"### {title}", ""] if title else []
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method, cells in summary.items():
        row = [method, str(cells["n_seeds"])]
        for col in SUMMARY_COLUMNS:
            row.append(_cell(cells.get(col), 100.0 if "recall" in col else 1.0))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def summary_csv(summary: Mapping[str, Mapping[str, Any]]) -> str:
    """The table as CSV: one row per method, ``<col>_mean`` / ``<col>_std`` columns."""
    buf = io.StringIO()
    fields = ["method", "n_seeds"] + [f"{c}_{s}" for c in SUMMARY_COLUMNS for s in ("mean", "std")]
    writer = csv.DictWriter(buf, fieldnames=fields)
    writer.writeheader()
    for method, cells in summary.items():
        row: dict[str, Any] = {"method": method, "n_seeds": cells["n_seeds"]}
        for col in SUMMARY_COLUMNS:
            stats = cells.get(col)
            row[f"{col}_mean"] = "" if not stats else repr(stats["mean"])
            row[f"{col}_std"] = "" if not stats else repr(stats["std"])
        writer.writerow(row)
    return buf.getvalue()
