"""A decision per query from its kappa (docs/search.md, "Decisions"): answer, widen or abstain,
with thresholds set on a validation split for a target risk (selective retrieval), and the
probability that the first result is right, fitted on the same split (isotonic in ln kappa).

Text -> image reads the query's kappa; image -> text the kappa of the first caption found, the
uncertainty the paper bins image -> text retrieval by (Fig. 3)."""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict
from sklearn.isotonic import IsotonicRegression

#: What an abstaining answer says.
TOO_VAGUE = "too vague to answer: say more"


class DecisionPolicy(BaseModel):
    """Thresholds on kappa and the confidence curve of one direction."""

    model_config = ConfigDict(extra="forbid")

    target_risk: float  # the highest share of wrong answers among those given
    answer_kappa: float | None  # kappa >= this: the first k results (None: no kappa is enough)
    abstain_kappa: float | None  # kappa < this: no results; in between: widened results
    widen: bool  # whether this direction widens (text -> image) or only answers and abstains
    log_kappa: list[float]  # isotonic knots: ln kappa ...
    confidence_at: list[float]  # ... and the probability that the first result is right
    validation: dict[str, float]  # queries, coverage and risk on the validation split

    def confidence(self, kappa: np.ndarray) -> np.ndarray:
        """P(first result right | kappa), piecewise linear between the fitted knots."""
        return np.interp(np.log(np.asarray(kappa, np.float64)), self.log_kappa, self.confidence_at)

    def decide(self, kappa: float) -> Literal["answer", "widen", "abstain"]:
        """The decision for one query of this kappa."""
        if self.answer_kappa is not None and kappa >= self.answer_kappa:
            return "answer"
        if self.abstain_kappa is not None and kappa >= self.abstain_kappa:
            return "widen"
        return "abstain"


def _boundary(kappa_desc: np.ndarray, ok: np.ndarray) -> float:
    """The kappa above which the longest prefix of queries (by kappa, descending) is ``ok``
    (inf: no prefix is)."""
    good = np.flatnonzero(ok)
    return float(kappa_desc[good[-1]]) if len(good) else float("inf")


def _threshold(kappa: float) -> float | None:
    return None if np.isinf(kappa) else kappa


def fit_policy(
    kappa: np.ndarray,
    hit_first: np.ndarray,
    hit_widened: np.ndarray | None,
    target_risk: float,
) -> DecisionPolicy:
    """Thresholds for ``target_risk`` from validation queries' kappa, whether their first result
    was right and (text -> image) whether a widened answer held a right one (None: no widening).

    Answered: the most queries (highest kappa first) whose first results are wrong at most
    ``target_risk`` of the time; widened: the next ones, as long as the answers given so far stay
    within the risk; the rest abstain."""
    kappa = np.asarray(kappa, np.float64)
    order = np.argsort(-kappa, kind="stable")
    k_desc, first = kappa[order], np.asarray(hit_first, bool)[order]
    count = np.arange(1, len(k_desc) + 1)
    answer_kappa = _boundary(k_desc, np.cumsum(~first) <= target_risk * count)
    answered = k_desc >= answer_kappa
    right = first if hit_widened is None else np.where(answered, first, hit_widened[order])
    abstain_kappa = _boundary(k_desc, np.cumsum(~right) <= target_risk * count)
    abstain_kappa = min(abstain_kappa, answer_kappa)
    if hit_widened is None:
        answer_kappa = abstain_kappa = min(answer_kappa, abstain_kappa)
    isotonic = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip")
    isotonic.fit(np.log(kappa), np.asarray(hit_first, np.float64))
    given = k_desc >= abstain_kappa
    return DecisionPolicy(
        target_risk=target_risk,
        answer_kappa=_threshold(answer_kappa),
        abstain_kappa=_threshold(abstain_kappa),
        widen=hit_widened is not None,
        log_kappa=isotonic.X_thresholds_.tolist(),
        confidence_at=isotonic.y_thresholds_.tolist(),
        validation={
            "queries": float(len(kappa)),
            "coverage": float(given.mean()) if len(given) else 0.0,
            "risk": float((~right[given]).mean()) if given.any() else 0.0,
        },
    )
