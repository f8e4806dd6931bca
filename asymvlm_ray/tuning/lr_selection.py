"""How a sweep chooses each method's lr (paper App. B.4): on the validation split, by the mean
Recall@1 of both directions (:func:`validation_score`), the best finite score of the method's
grid trials (:func:`select_lr`; ties: the smaller lr). The test split never takes part."""

from __future__ import annotations

import math
from operator import attrgetter
from typing import Any

from asymvlm.metrics import glossary
from asymvlm_ray.schema import SweepConfig
from asymvlm_ray.tuning.records import LrSelection, TrialOutcome

#: The MLflow metric (and the :class:`TrialOutcome` field) the lr is chosen by.
SELECTION_METRIC = "val_mean_recall_at_1"


def validation_score(outcome: dict[str, Any]) -> float:
    """The mean validation Recall@1 of t2i and i2t in a run's results (NaN without validation)."""
    val = glossary.retrieval_metric_names(outcome.get("val", {}), prefix="val_")
    score = [val[k] for k in ("val_t2i_recall_at_1", "val_i2t_recall_at_1") if k in val]
    return sum(score) / len(score) if score else float("nan")


def select_lr(grid: list[TrialOutcome]) -> dict[str, LrSelection]:
    """Per method of the finished ``grid`` trials, the lr with the best finite validation score
    (ties: the smaller lr); a method without one is left out."""
    scores: dict[str, dict[float, float]] = {}
    for trial in sorted(grid, key=attrgetter("method", "lr")):
        if math.isfinite(trial.val_mean_recall_at_1):
            scores.setdefault(trial.method, {})[trial.lr] = trial.val_mean_recall_at_1
    picks = {}
    for method, by_lr in scores.items():
        best = max(by_lr, key=by_lr.__getitem__)  # the first of equal scores: the smaller lr
        shown = {f"{lr:g}": score for lr, score in by_lr.items()}
        picks[method] = LrSelection(lr=best, score=by_lr[best], scores_by_lr=shown)
    return picks


def selection(sweep: SweepConfig, grid: list[TrialOutcome]) -> dict[str, LrSelection]:
    """Each method's lr, in the config's order: chosen on ``grid`` when the sweep has several
    (a method that failed at every lr is left out), else the only one."""
    if not sweep.selects_lr:
        return {m: LrSelection(lr=sweep.lr[0], score=None, scores_by_lr={}) for m in sweep.methods}
    picks = select_lr(grid)
    return {m: picks[m] for m in sweep.methods if m in picks}
