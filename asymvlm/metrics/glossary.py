"""The final numbers of a retrieval evaluation: their MLflow names (``t2i_recall_at_1``, ``rsum``,
``coco1k_...``, ``eccv_...``) and meanings, for Tune's trials, the report, model cards and docs."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

DIRECTIONS = ("t2i", "i2t")
#: The final numbers of a direction; MLflow names spell "@" as "_at_".
_FINAL_KEYS = "recall@1 recall@5 recall@10 spearman r2 auroc aupr fpr@95tpr aurc e_aurc ece".split()
#: Each final retrieval metric's meaning, by its MLflow name without ``t2i_``/``i2t_``/``val_``.
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
            if _number(value) is not None:
                out[f"{prefix}{group}_{direction}_{name}"] = _number(value)
    return out
