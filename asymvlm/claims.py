"""The paper's claims a report judges, each by the rule written beside it.

A claim compares two sets of numbers, one value per training seed: a method against Determ. FT
or the frozen model (Tables 2 and 3 of Ju et al., NeurIPS 2025), or a statistic against 0
(Table 1: Recall@1 falls as the uncertainty rises, S < 0). Its rule (:func:`judge`):

* the difference is ``mean(A) - mean(B)`` and its standard error
  ``SE = sqrt(s_A^2 / n_A + s_B^2 / n_B)`` (sample variances over seeds; 0 for a single value,
  e.g. the frozen model, which has no seed);
* **supports** when the difference lies in the paper's direction by more than ``Z = 2`` standard
  errors and by more than ``MIN_EFFECT = 0.01`` (an accuracy or a Spearman S closer than that
  is not read as an effect: at 1,000 images it is 10 of them, and at a ceiling, where the seeds
  agree to the last image, the standard error alone would call any difference real);
  **contradicts** when it lies in the other direction by as much; **not supported** otherwise;
  **undetermined** when neither side has two seeds (no standard error).

Two standard errors is roughly a two-sided 5 % test with many seeds; with 5 seeds per side it is
lenient (a t-quantile would be about 2.3-2.8), which the report says. The rule judges the
direction of a claim, never the paper's magnitude: the synthetic world is not CLIP on CIFAR.
:data:`GENERIC_CURVE` is the measured dependence of Table 2 on the share of generic training
captions (benchmarks/generic_captions.py), which the report's closing note prints.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "GENERIC_CURVE",
    "MIN_EFFECT",
    "RULE",
    "Z",
    "Verdict",
    "judge",
    "standard_error_of_difference",
    "table1_verdicts",
    "table2_verdicts",
    "table3_verdicts",
    "world_of",
]

#: Standard errors, and the least absolute difference, a difference must exceed to count.
Z = 2.0
MIN_EFFECT = 0.01
RULE = (
    f"supports: the difference lies in the paper's direction by more than {Z:g} standard "
    f"errors (SE = √(s²_A/n_A + s²_B/n_B) over seeds) and by more than {MIN_EFFECT:g}; "
    "contradicts: by as much the other way; otherwise not supported"
)
PROBABILISTIC = ("asymvlm-vmf", "asymvlm-ps")
BASELINE = "determ-ft"
FROZEN = "clip"

#: The p curve of benchmarks/generic_captions.py (demo world, 12 epochs, 5 seeds; docs/
#: synthetic-world.md): p -> method -> (median kappa of "a photo", of the class prompts,
#: sibling negatives rejected, far negatives rejected), dummy prompt "a photo", means over seeds.
GENERIC_CURVE: dict[float, dict[str, tuple[float | None, float | None, float, float]]] = {
    0.0: {
        "asymvlm-vmf": (23.8, 18.6, 0.043, 0.280),
        "asymvlm-ps": (35.6, 26.4, 0.049, 0.266),
        "determ-ft": (None, None, 0.132, 0.361),
        "clip": (None, None, 0.110, 0.559),
    },
    0.005: {
        "asymvlm-vmf": (9.1, 17.4, 0.452, 0.437),
        "asymvlm-ps": (12.5, 24.2, 0.601, 0.439),
        "determ-ft": (None, None, 0.347, 0.182),
        "clip": (None, None, 0.110, 0.559),
    },
    0.01: {
        "asymvlm-vmf": (7.9, 16.5, 0.564, 0.327),
        "asymvlm-ps": (10.4, 23.1, 0.729, 0.336),
        "determ-ft": (None, None, 0.436, 0.070),
        "clip": (None, None, 0.110, 0.559),
    },
    0.02: {
        "asymvlm-vmf": (6.8, 15.6, 0.697, 0.328),
        "asymvlm-ps": (8.8, 22.2, 0.813, 0.356),
        "determ-ft": (None, None, 0.529, 0.033),
        "clip": (None, None, 0.110, 0.559),
    },
    0.05: {
        "asymvlm-vmf": (5.4, 14.9, 0.850, 0.393),
        "asymvlm-ps": (6.4, 21.0, 0.906, 0.443),
        "determ-ft": (None, None, 0.647, 0.036),
        "clip": (None, None, 0.110, 0.559),
    },
}


@dataclass(frozen=True)
class Verdict:
    """One claim judged on one set (or direction)."""

    table: str  # "Table 1", "Table 2", "Table 3"
    claim: str
    where: str  # the evaluation set, negatives kind or retrieval direction
    a: tuple[float, ...]  # one value per seed
    b: tuple[float, ...]
    a_name: str
    b_name: str
    difference: float
    se: float
    verdict: str
    paper: str

    def ours(self) -> str:
        return f"{self.a_name} {_stat(self.a)} vs {self.b_name} {_stat(self.b)}"


def _stat(values: Sequence[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f} (n={len(values)})"


def standard_error_of_difference(a: Sequence[float], b: Sequence[float]) -> float:
    """SE of ``mean(a) - mean(b)`` for independent samples: sqrt(s_a^2/n_a + s_b^2/n_b), a
    side with one value counting as exact (variance 0)."""
    var = 0.0
    for side in (a, b):
        if len(side) > 1:
            var += statistics.variance(side) / len(side)
    return math.sqrt(var)


def judge(a: Sequence[float], b: Sequence[float], direction: int = 1) -> tuple[float, float, str]:
    """``(difference, SE, verdict)`` of the claim that ``mean(a) - mean(b)`` has the sign of
    ``direction`` (+1: a above b), by the rule of the module docstring."""
    if not a or not b:
        raise ValueError("a claim needs values on both sides")
    diff = statistics.fmean(a) - statistics.fmean(b)
    se = standard_error_of_difference(a, b)
    if len(a) < 2 and len(b) < 2:
        return diff, se, "undetermined (no seeds to estimate an error)"
    signed, bar = direction * diff, max(Z * se, MIN_EFFECT)
    if signed > bar:
        return diff, se, "supports"
    if signed < -bar:
        return diff, se, "contradicts"
    return diff, se, "not supported"


def _verdict(
    table: str,
    claim: str,
    where: str,
    a: Sequence[float],
    b: Sequence[float],
    a_name: str,
    b_name: str,
    paper: str,
    direction: int = 1,
) -> Verdict:
    diff, se, verdict = judge(a, b, direction)
    return Verdict(
        table, claim, where, tuple(a), tuple(b), a_name, b_name, diff, se, verdict, paper
    )


def _base(name: str) -> str:
    return name.split("/", 1)[0]


# -- Table 2 -------------------------------------------------------------------------------------
def _paper_table2(method: str, index: int) -> float:
    """The paper's Table 2 value (0: positives, 1: negatives) of ``method``, mean over its three
    dummy prompts."""
    from asymvlm.paper_numbers import TABLE2

    cells = [TABLE2[d][method][index] for d in TABLE2 if method in TABLE2[d] and d != "(none)"]
    return statistics.fmean(cells)


def nota_per_seed(res: Mapping[str, Any], key: str) -> dict[str, list[float]]:
    """Method -> one value per seed (or the frozen model's one) of ``key`` (``neg_acc``,
    ``far_neg_acc``, ``pos_acc``), each the mean over the dummy prompts."""
    by_model: dict[str, list[float]] = defaultdict(list)
    for per_method in res.get("dummy", {}).values():
        for name, cell in per_method.items():
            if key in cell:
                by_model[name].append(float(cell[key]))
    out: dict[str, list[float]] = defaultdict(list)
    for name, values in by_model.items():
        out[_base(name)].append(statistics.fmean(values))
    return dict(out)


def table2_verdicts(res: Mapping[str, Any]) -> list[Verdict]:
    """Table 2's claims on one none-of-the-above result: each probabilistic method rejects more
    (sibling, far) negatives than Determ. FT and than the frozen model, and keeps more
    positives than Determ. FT (values: mean over the dummy prompts, per seed)."""
    out: list[Verdict] = []
    kinds = [("neg_acc", "sibling negatives"), ("far_neg_acc", "far negatives")]
    for method in PROBABILISTIC:
        paper_neg = _paper_table2(method, 1)
        for key, where in kinds:
            values = nota_per_seed(res, key)
            if method not in values:
                continue
            for other, label in ((BASELINE, "Determ. FT"), (FROZEN, "the frozen model")):
                if other not in values:
                    continue
                paper = f"{paper_neg:.3f} vs {_paper_table2(other, 1):.3f} (CIFAR-100)"
                out.append(
                    _verdict(
                        "Table 2",
                        f"{method} rejects more negatives than {label}",
                        where,
                        values[method],
                        values[other],
                        method,
                        other,
                        paper,
                    )
                )
        pos = nota_per_seed(res, "pos_acc")
        if method in pos and BASELINE in pos:
            out.append(
                _verdict(
                    "Table 2",
                    f"{method} keeps more positives than Determ. FT",
                    "positives",
                    pos[method],
                    pos[BASELINE],
                    method,
                    BASELINE,
                    f"{_paper_table2(method, 0):.3f} vs {_paper_table2(BASELINE, 0):.3f} "
                    "(CIFAR-10)",
                )
            )
    return out


# -- Table 3 -------------------------------------------------------------------------------------
def table3_verdicts(res: Mapping[str, Any]) -> list[Verdict]:
    """Table 3's claim on one zero-shot result, per evaluation set: each probabilistic method
    keeps more zero-shot accuracy after fine-tuning than Determ. FT."""
    from asymvlm.paper_numbers import TABLE3

    per: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for name, cells in res.items():
        for s, value in cells.items():
            per[s][_base(name)].append(float(value))
    out: list[Verdict] = []
    for method in PROBABILISTIC:
        paper = TABLE3["coco"][method]
        base = TABLE3["coco"][BASELINE]
        text = f"{paper['cifar10']:.3f} vs {base['cifar10']:.3f} (CIFAR-10; all four sets this way)"
        for s in sorted(per):
            if method in per[s] and BASELINE in per[s]:
                out.append(
                    _verdict(
                        "Table 3",
                        f"{method} keeps more zero-shot accuracy after fine-tuning than Determ. FT",
                        s,
                        per[s][method],
                        per[s][BASELINE],
                        method,
                        BASELINE,
                        text,
                    )
                )
    return out


# -- Table 1 -------------------------------------------------------------------------------------
def table1_verdicts(rows: Sequence[Mapping[str, Any]]) -> list[Verdict]:
    """Table 1's claim per retrieval direction: Recall@1 falls as a probabilistic method's
    uncertainty rises (Spearman S of bin index vs recall below 0; ``rows``: one per seed)."""
    out: list[Verdict] = []
    for method in PROBABILISTIC:
        for direction in ("i2t", "t2i"):
            values = [r.get(f"{direction}_spearman") for r in rows if r["method"] == method]
            values = [float(v) for v in values if v is not None]
            if values:
                out.append(
                    _verdict(
                        "Table 1",
                        f"Recall@1 falls as {method}'s uncertainty rises (S < 0)",
                        direction,
                        values,
                        [0.0],
                        "S",
                        "0",
                        "S ≈ −0.99 to −1.00 (COCO, both directions)",
                        direction=-1,
                    )
                )
    return out


def world_of(nota_runs: Sequence[tuple[Mapping[str, Any], Any]]) -> dict | None:
    """The synthetic world's knobs, from the first none-of-the-above result whose positives are
    a synthetic set (``settings.positives.world``); None when there is none."""
    for res, _ in nota_runs:
        world = ((res.get("settings") or {}).get("positives") or {}).get("world")
        if isinstance(world, dict):
            return world
    return None


# -- markdown ------------------------------------------------------------------------------------
def _bold(verdict: str) -> str:
    return f"**{verdict}**" if verdict in ("supports", "contradicts") else verdict


def claims_markdown(judged: Sequence[tuple[str, Verdict]]) -> list[str]:
    """The claims section: the rule, then one row per ``(source, verdict)`` (source: the sweep
    or evaluation it was judged on)."""
    if not judged:
        return []
    lines = [
        "## The paper's claims, judged by rule",
        "",
        f"Rule, for every row: {RULE}. The direction is the paper's; its magnitudes come "
        "from CLIP ViT-B/32 on real data and are shown for reference only. With 5 seeds a "
        "side, 2 SE is a lenient bar (a t-test would ask for about 2.3–2.8 SE).",
        "",
        "| source | claim | on | ours (mean ± std over seeds) | difference ± SE | "
        "verdict | paper |",
        "|---|---|---|---|---|---|---|",
    ]
    for source, v in judged:
        diff = f"{v.difference:+.3f} ± {v.se:.3f}"
        lines.append(
            f"| {source} | {v.table}: {v.claim} | {v.where} | {v.ours()} | {diff} | "
            f"{_bold(v.verdict)} | {v.paper} |"
        )
    return lines + [""]


def _curve_lines() -> list[str]:
    lines = [
        '| p | κ("a photo") / κ(class prompts), AsymVLM vMF | sibling neg. rejected: vMF / '
        "PS / Determ. FT / frozen | far neg. rejected: vMF / PS / Determ. FT / frozen |",
        "|---|---|---|---|",
    ]
    order = ("asymvlm-vmf", "asymvlm-ps", "determ-ft", "clip")
    for p, row in GENERIC_CURVE.items():
        kappa = row["asymvlm-vmf"]
        sib = " / ".join(f"{row[m][2]:.2f}" for m in order)
        far = " / ".join(f"{row[m][3]:.2f}" for m in order)
        lines.append(f"| {p:g} | {kappa[0]:.1f} / {kappa[1]:.1f} | {sib} | {far} |")
    return lines


def closing_note(
    judged: Sequence[tuple[str, Verdict]], world: Mapping[str, Any] | None
) -> list[str]:
    """The report's closing note: what the judged claims show, plainly, and -- for a synthetic
    world (``world``: its knobs from a manifest) -- what the world can and cannot show, with the
    measured p curve of generic captions (:data:`GENERIC_CURVE`)."""
    lines = ["## Closing note", ""]
    if judged:
        held = [(s, v) for s, v in judged if v.verdict == "supports"]
        lines.append(f"{len(held)} of {len(judged)} judged claims are supported by their rule.")
        missed = [(s, v) for s, v in judged if v.verdict != "supports"]
        if missed:
            lines += ["", "**Not supported here** (the numbers: difference ± SE):", ""]
            lines += [
                f"- {v.table}, {v.claim}, on {v.where} ({s}): {v.difference:+.3f} ± "
                f"{v.se:.3f} — {v.verdict}."
                for s, v in missed
            ]
        lines.append("")
    if world is None:
        return lines
    p = float(world.get("generic_captions", 0.0))
    mis = float(world.get("misalignment", 1.0))
    lines += [
        "**What the synthetic world can and cannot show.** The world encodes mechanisms, and a "
        "claim can only be tested where one is encoded (assumptions in `asymvlm.synthetic`):",
        "",
        f"- *Table 2 (none-of-the-above).* A share p = {p:g} of the training captions are "
        "generic (assumption U; 0.4 % of the real HierarCaps test hierarchies' texts are, fixed "
        "before measuring). A generic caption seen in training teaches the adapter a broad "
        "distribution for texts near the hierarchy's root, so the dummy prompt becomes a "
        "likelihood-ratio test against the image marginal. Without generic captions the dummy "
        "prompts lie outside the training texts and the adapter extrapolates a *high* κ: the "
        "claim then fails for a reason of the world, not of the method. How far the rejection "
        'goes depends on p, which real data does not fix well (5 seeds, dummy "a photo"):',
        "",
        *_curve_lines(),
        "",
        "  Far negatives (concepts under other level-0 concepts) are a different test from "
        "sibling ones: the frozen model's cosine already rejects many of them here (the root "
        "direction of the dummy lies nearer to them than the class prompts do), unlike CLIP on "
        "CIFAR-100 (0.009), so the frozen column is no reference for the paper's.",
        "- *Table 3 (zero-shot after fine-tuning).* "
        + (
            "The world is in the forgetting regime (assumption F, no shared text-encoder "
            "rotation): the frozen encoder is well aligned on the zero-shot domain, so "
            "fine-tuning can only cost accuracy there. The world encodes **no mechanism** by "
            "which one adapter forgets less than another (AsymVLM and Determ. FT move the mean "
            "embedding alike): a gap between them is an outcome of training, not a built-in "
            "effect, and no mechanism here predicts its sign."
            if mis == 0.0
            else f"The frozen text encoder is misaligned by a shared rotation ({mis:g} rad), so "
            "fine-tuning on one domain helps every method on the other: the paper's forgetting "
            "cannot be tested in this world."
        ),
        "- *Not in the world at all:* CLIP's real text geometry (generic prompts near the "
        "text-embedding mean), real class names and templates, and the magnitudes of the "
        "paper's numbers; the paper columns are there for the direction only.",
        "",
    ]
    return lines
