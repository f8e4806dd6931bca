"""``asymvlm report``: everything in one MLflow experiment gathered into ``report.md``.

Reads the sweeps (parent runs ``kind=sweep`` and their seed runs) and the evaluation runs
(``kind=eval-*``, :mod:`asymvlm.evaluation.suite`), and writes to ``DIR``:

* Table 1 analogue per sweep: mean ± std over seeds (test split) of Recall@1, S, R², AUROC,
  AURC and ECE in both directions and RSUM (a trial's MLflow metrics, else its
  ``results.json``; "–" where a run predates a number), captioned with the sweep's protocol
  (``official`` / ``improved``, param ``protocol``), with the paper's CLIP ViT-B/32 numbers
  beside ours where the set-up matches (clearly labelled); ``fig3_<dataset>.png``
  (seed-averaged binned Recall@1 curves); ``fig4_<dataset>.png`` for the ablations (AsymVLM,
  AsymVLM(image), SymVLM, AsymVLM(G)); ``fig_risk_coverage_<dataset>.png`` (seed-averaged
  risk-coverage curves per method, t2i and i2t); a second sweep of the same data set adds
  its name to its figures' names;
* Table 2 analogue (none-of-the-above, with sibling and, where evaluated, far negatives),
  Table 3 analogue (zero-shot after fine-tuning), each stating how a likelihood method combines
  a class's prompt templates;
* the paper's claims judged by the rule written beside them (:mod:`asymvlm.claims`: Table 1's
  S < 0 per retrieval direction, Table 2's rejection and Table 3's zero-shot claims against
  Determ. FT and the frozen model, supported only beyond two standard errors over seeds);
* the HierarCaps analysis (``fig5_hierarcaps.png``) and the OOD suite (``fig_ood_<kind>.png``);
* a closing note: the claims not supported, with their numbers, and for a synthetic world what
  it can and cannot show (the measured curve of generic training captions).

The report (markdown, and HTML with the figures inline, which the MLflow UI shows) and its
figures are also logged to MLflow as a run ``kind=report``, nested under the pipeline run when
there is one.
"""

from __future__ import annotations

import base64
import html
import math
import os
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from asymvlm import claims, paper_numbers, tracking
from asymvlm import results as tables_of_results
from asymvlm.config import redact
from asymvlm.evaluation.hierarcaps import plot_hierarchy
from asymvlm.evaluation.ood import plot_severity
from asymvlm.evaluation.zeroshot import aggregation_note
from asymvlm.plots import plot_binned_recall, plot_risk_coverage

__all__ = ["PROTOCOL_LABELS", "build_report", "protocol_label", "table1_markdown", "trial_values"]

ABLATIONS = ("asymvlm-vmf", "asymvlm-image", "symvlm", "asymvlm-gauss")


def _mean_std(values: Iterable[float]) -> str:
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return "–"
    std = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return f"{statistics.fmean(vals):.3f} ± {std:.3f}" if len(vals) > 1 else f"{vals[0]:.3f}"


def _base(name: str) -> str:
    """ "asymvlm-vmf/seed1" -> "asymvlm-vmf"."""
    return name.split("/", 1)[0]


# -- Table 1, Fig. 3, Fig. 4, risk-coverage ------------------------------------------------------
#: Table 1 cells per direction: (metric suffix, key in a trial's results, heading, scale, digits).
TABLE1_CELLS = (
    ("recall_at_1", "recall@1", "R@1 (%)", 100.0, 2),
    ("spearman", "spearman", "S", 1.0, 2),
    ("r2", "r2", "R²", 1.0, 2),
    ("auroc", "auroc", "AUROC", 1.0, 3),
    ("aupr", "aupr", "AUPR", 1.0, 3),
    ("fpr_at_95tpr", "fpr@95tpr", "FPR@95", 1.0, 3),
    ("aurc", "aurc", "AURC", 1.0, 3),
    ("ece", "ece", "ECE", 1.0, 3),
)
RSUM_DIGITS = 2
PROTOCOL_LABELS = {
    "official": "Protocol: official (the authors' code)",
    "improved": "Protocol: improved (this project's defaults; see README 'Protocols')",
}


def protocol_label(params: Mapping[str, str]) -> str:
    """The caption line naming a sweep's protocol (param ``protocol``; "improved" when a run
    predates it)."""
    value = str(params.get("protocol") or "improved").strip().strip('"') or "improved"
    return PROTOCOL_LABELS.get(value, f"Protocol: {value}")


def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _first(*values: Any) -> float | None:
    return next((v for v in map(_finite, values) if v is not None), None)


def _test_results(results: Any) -> dict:
    """A trial's test-split results from its ``results.json`` (``{"test": {...}, "val": ...}``
    or the test results themselves); {} when there are none."""
    if not isinstance(results, dict):
        return {}
    test = results.get("test")
    return test if isinstance(test, dict) else results


def trial_values(metrics: Mapping[str, float], results: Any) -> dict[str, float | None]:
    """One trial's Table 1 numbers (test split): ``<direction>_<metric>`` and ``rsum``.

    From its MLflow metrics (``t2i_ece``, ``rsum``; a ``test_`` prefix is read too), else from
    its ``results.json`` (``results[direction]["ece"]``, ``results["rsum"]``); None where
    neither has the value (older runs).
    """
    test = _test_results(results)
    out: dict[str, float | None] = {}
    for direction in tables_of_results.DIRECTIONS:
        cell = test.get(direction) if isinstance(test.get(direction), dict) else {}
        for name, key, *_ in TABLE1_CELLS:
            out[f"{direction}_{name}"] = _first(
                metrics.get(f"{direction}_{name}"),
                metrics.get(f"test_{direction}_{name}"),
                cell.get(key),
            )
    top = results if isinstance(results, dict) else {}
    out["rsum"] = _first(
        metrics.get("rsum"), metrics.get("test_rsum"), test.get("rsum"), top.get("rsum")
    )
    return out


def _stat_cell(values: Iterable[float | None], scale: float, digits: int) -> str:
    """mean ± std (sample; 0 for one seed) of the values present, scaled; "–" if none."""
    vals = [scale * v for v in values if v is not None]
    if not vals:
        return "–"
    std = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return f"{statistics.fmean(vals):.{digits}f} ± {std:.{digits}f}"


def table1_markdown(rows: Sequence[Mapping[str, Any]], title: str, caption: str) -> str:
    """Table 1 analogue: per method (``rows``: one per seed, ``method`` + :func:`trial_values`)
    the seed count and mean ± std of R@1 (%), S, R², AUROC, AUPR, FPR@95TPR, AURC and ECE per
    direction, and RSUM."""
    by_method: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        by_method[row["method"]].append(row)
    head = (
        ["Method", "seeds"]
        + [f"{d} {cell[2]}" for d in ("i2t", "t2i") for cell in TABLE1_CELLS]
        + ["RSUM"]
    )
    lines = [
        f"### {title}",
        "",
        caption,
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for method, seeds in by_method.items():
        cells = [method, str(len(seeds))]
        for d in ("i2t", "t2i"):
            for name, _, _, scale, digits in TABLE1_CELLS:
                cells.append(_stat_cell((r.get(f"{d}_{name}") for r in seeds), scale, digits))
        cells.append(_stat_cell((r.get("rsum") for r in seeds), 1.0, RSUM_DIGITS))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _optional_json(uri: str, run_id: str, name: str) -> Any:
    try:
        return tracking.json_artifact(uri, run_id, name)
    except Exception:  # an older run without the artifact: its numbers show as "–"
        return None


def _mean_curve(curves: Sequence[Mapping[str, Sequence[float]]]) -> dict[str, list[float]]:
    """Seed-averaged risk-coverage curve: each seed's risk read (linearly interpolated) at the
    first seed's coverages, then averaged."""
    grid = np.asarray(curves[0]["coverage"], dtype=float)
    risks = []
    for curve in curves:
        x, y = np.asarray(curve["coverage"], float), np.asarray(curve["risk"], float)
        order = np.argsort(x)
        risks.append(np.interp(grid, x[order], y[order]))
    return {"coverage": grid.tolist(), "risk": np.mean(risks, axis=0).tolist()}


def _risk_coverage(test: Mapping[str, Any], direction: str) -> dict | None:
    """A trial's test risk-coverage curve in ``direction`` (``results[direction]
    ["risk_coverage"]``), None where it has none."""
    cell = test.get(direction)
    curve = cell.get("risk_coverage") if isinstance(cell, dict) else None
    if not isinstance(curve, dict):
        return None
    x, y = curve.get("coverage"), curve.get("risk")
    if not x or not y or len(x) != len(y):
        return None
    return {"coverage": [float(v) for v in x], "risk": [float(v) for v in y]}


def _paper_table1(dataset: str | None, model: str | None) -> list[str]:
    """The paper's Table 1 rows where model and data set match theirs, else nothing."""
    paper = paper_numbers.TABLE1.get(dataset or "")
    if not paper or not paper_numbers.matches_paper(model, dataset):
        return []
    lines = [
        f"*Paper (Ju et al. 2025, Table 1, CLIP ViT-B/32 on {dataset}), for comparison — "
        "not produced here:*\n",
        "| Method | i2t R@1 (%) | i2t S | i2t R² | t2i R@1 (%) | t2i S | t2i R² |",
        "|---|---|---|---|---|---|---|",
    ]
    for method, v in paper.items():
        lines.append(
            f"| {method} (paper) | {100 * v['i2t_recall_at_1']:.1f} | "
            f"{v['i2t_spearman']:.3f} | {v['i2t_r2']:.3f} | "
            f"{100 * v['t2i_recall_at_1']:.1f} | {v['t2i_spearman']:.3f} | "
            f"{v['t2i_r2']:.3f} |"
        )
    return lines + [""]


def _gather_trials(uri: str, children: Sequence[Any]) -> tuple[list[dict], dict]:
    """Per seed run: its Table 1 numbers (a row) and its test curves, ``curves[method]
    [direction]["binned" | "risk_coverage"]`` = one curve per seed that has it."""
    rows: list[dict] = []
    curves: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for child in children:
        method = child.data.params["method"]
        trial = _optional_json(uri, child.info.run_id, "results.json")
        rows.append({"method": method, **trial_values(child.data.metrics, trial)})
        binned = _optional_json(uri, child.info.run_id, "binned_recall.json") or {}
        for direction in tables_of_results.DIRECTIONS:
            curve = (binned.get("test") or {}).get(direction)
            if curve:
                curves[method][direction]["binned"].append(curve)
            curve = _risk_coverage(_test_results(trial), direction)
            if curve:
                curves[method][direction]["risk_coverage"].append(curve)
    return rows, curves


def _seed_means(rows: Sequence[Mapping[str, Any]], curves: Mapping) -> dict[str, dict]:
    """Per method and direction, the seed means the figures draw (``plot_binned_recall`` /
    ``plot_risk_coverage`` input)."""
    out: dict[str, dict] = {}
    for method in dict.fromkeys(r["method"] for r in rows):
        seeds = [r for r in rows if r["method"] == method]
        out[method] = {}
        for direction in tables_of_results.DIRECTIONS:
            means = {}
            for name in ("recall_at_1", "spearman", "r2", "aurc"):
                vals = [r[f"{direction}_{name}"] for r in seeds]
                vals = [v for v in vals if v is not None]
                means[name] = statistics.fmean(vals) if vals else None
            got = curves.get(method, {}).get(direction, {})
            binned, rc = got.get("binned"), got.get("risk_coverage")
            out[method][direction] = {
                "recall@1": float("nan") if means["recall_at_1"] is None else means["recall_at_1"],
                "binned_recall@1": [statistics.fmean(v) for v in zip(*binned, strict=True)]
                if binned
                else None,
                "spearman": means["spearman"],
                "r2": means["r2"],
                "aurc": means["aurc"],
                "risk_coverage": _mean_curve(rc) if rc else None,
            }
    return out


def _figure_tag(dataset: str | None, parent, used: set[str]) -> str:
    """``<dataset>``, with the sweep's name when another sweep of the report took it."""
    tag = (dataset or "data").replace("/", "_")
    if tag in used:  # another sweep of the same data set (e.g. under the other protocol)
        name = parent.info.run_name or parent.info.run_id
        tag = f"{tag}_{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}"
    used.add(tag)
    return tag


def _sweep_section(
    uri: str, parent, output: str, used: set[str]
) -> tuple[list[str], dict, list[dict]]:
    """Table 1 analogue of one sweep (its protocol in the caption), the paper's numbers where
    they apply, Fig. 3 / Fig. 4 analogues and the risk-coverage figure; also the rows (one per
    seed run) for the claims."""
    children = tracking.child_runs(uri, parent.info.run_id, stage="seeds")
    if not children:
        return [], {}, []
    params = children[0].data.params
    dataset, model = params.get("dataset"), params.get("embedding_model")
    rows, curves = _gather_trials(uri, children)
    title = f"Table 1 analogue — {parent.info.run_name}: {dataset} ({model})"
    caption = f"*{protocol_label({**params, **parent.data.params})}.*"
    lines = [table1_markdown(rows, title, caption)]
    if parent.data.tags.get("note"):
        lines.append(f"> {parent.data.tags['note']}\n")
    n_failed = int(parent.data.metrics.get("failed_trials", 0))
    if n_failed:
        lines.append(
            f"> {n_failed} trial(s) of this sweep failed (e.g. a diverged learning "
            "rate) and are left out; the sweep's `summary.md` lists them with the "
            "reason.\n"
        )
    lines += _paper_table1(dataset, model)
    results = _seed_means(rows, curves)
    tag = _figure_tag(dataset, parent, used)
    figures = {}
    fig3 = os.path.join(output, f"fig3_{tag}.png")
    plot_binned_recall(results, fig3, title=f"{dataset}")
    figures[fig3] = f"Fig. 3 analogue — Recall@1 per uncertainty level, {dataset}"
    ablations = {m: results[m] for m in ABLATIONS if m in results}
    if len(ablations) >= 2:
        fig4 = os.path.join(output, f"fig4_{tag}.png")
        plot_binned_recall(ablations, fig4, title=f"ablations, {dataset}")
        figures[fig4] = f"Fig. 4 analogue — ablations, {dataset}"
    if any(d.get("risk_coverage") for r in results.values() for d in r.values()):
        path = os.path.join(output, f"fig_risk_coverage_{tag}.png")
        plot_risk_coverage(results, path, title=f"{dataset}")
        figures[path] = (
            f"Risk-coverage — top-1 risk of the most certain queries kept, "
            f"{dataset}, mean over seeds"
        )
    for path, caption in figures.items():
        lines.append(f"![{caption}]({os.path.basename(path)})\n")
    return lines, figures, rows


# -- Tables 2 and 3, Fig. 5, OOD ----------------------------------------------------------------
#: What the paper's Table 2 / Table 3 numbers were measured on, for their column headings.
PAPER_TABLE2_SETUP = "CLIP ViT-B/32 on real data: CIFAR-10 positives, CIFAR-100 negatives"
PAPER_TABLE3_SETUP = (
    "CLIP ViT-B/32 fine-tuned on COCO, real data: CIFAR-10 / CIFAR-100 / STL-10 / ImageNet"
)


def _set_name(location: str | None, default: str) -> str:
    """``/x/tables/synthetic-positives:test`` -> ``synthetic-positives``."""
    if not location:
        return default
    root = str(location).rpartition(":")[0] or str(location)
    return os.path.basename(root.rstrip("/")) or default


def _seed_count(cells: Sequence[Any]) -> str:
    return str(len(cells))


def _table2(runs: list[tuple[dict, dict]]) -> list[str]:
    """Table 2 analogue, one table per none-of-the-above run: per dummy prompt and method the
    seed count and mean ± std (over seeds) of positive and negative accuracy, and the paper's
    numbers (:data:`PAPER_TABLE2_SETUP`) beside them."""
    lines: list[str] = []
    for res, params in runs:
        settings = res.get("settings") or {}
        pos = _set_name(params.get("positives"), "CIFAR-10")
        neg = _set_name(params.get("negatives"), "CIFAR-100")
        pos = (settings.get("positives") or {}).get("name", pos)
        neg = (settings.get("negatives") or {}).get("name", neg)
        far = (settings.get("far_negatives") or {}).get("name")
        sets = f"positives: {pos}, negatives: {neg}" + (f", far negatives: {far}" if far else "")
        rejected = "sibling neg. rejected | far neg. rejected" if far else "neg. acc."
        head = f"| dummy prompt | method | seeds | pos. acc. | {rejected} | paper (pos., neg.) |"
        lines += [
            f"### Table 2 analogue — none-of-the-above ({sets}){_heading(params)}",
            "",
            head,
            "|" + "---|" * head.count(" | ") + "---|",
        ]
        for dummy, per_method in res["dummy"].items():
            grouped: dict[str, list[dict]] = defaultdict(list)
            for name, cell in per_method.items():
                grouped[_base(name)].append(cell)
            for method, cells in grouped.items():
                paper = paper_numbers.TABLE2.get(dummy, {}).get(method)
                ref = f"{paper[0]:.3f}, {paper[1]:.3f}" if paper else "–"
                far_cell = f" {_mean_std(c.get('far_neg_acc') for c in cells)} |" if far else ""
                lines.append(
                    f'| "{dummy}" | {method} | {_seed_count(cells)} | '
                    f"{_mean_std(c['pos_acc'] for c in cells)} | "
                    f"{_mean_std(c['neg_acc'] for c in cells)} |{far_cell} "
                    f"{ref} |"
                )
        for name, cell in res.get("rejection", {}).items():
            paper = paper_numbers.TABLE2["(none)"].get(name)
            ref = f"{paper[0]:.3f}, {paper[1]:.3f}" if paper else "–"
            far_cell = f" {_mean_std([cell.get('far_neg_acc')])} |" if far else ""
            lines.append(
                f"| (none) | {name}-based (frozen) | 1 | {cell['pos_acc']:.3f} | "
                f"{cell['neg_acc']:.3f} |{far_cell} {ref} |"
            )
        how = settings.get("template_aggregation")
        lines += [
            "",
            f"*Ours: mean ± std over the sweep's seeds (one value for the frozen "
            f"model). Paper column: Ju et al. 2025, Table 2 — {PAPER_TABLE2_SETUP}; "
            "not produced here.*",
            "",
        ]
        if far:
            lines += [
                "*Sibling negatives are other children of the positives' level-0 "
                "concepts; far negatives are concepts under level-0 concepts with no "
                "positive class. The frozen baselines' cut is calibrated on the sibling "
                "negatives.*",
                "",
            ]
        if how:
            lines += [f"*{aggregation_note(how)}*", ""]
    return lines


def _paper_table3_cell(method: str) -> str:
    """The paper's Table 3 row of ``method`` (COCO fine-tuning; the frozen CLIP: no
    fine-tuning) as ``a / b / c / d``, "–" where the paper has none."""
    row = paper_numbers.TABLE3["none" if method == "clip" else "coco"].get(method)
    if not row:
        return "–"
    return " / ".join(f"{row[s]:.3f}" for s in ("cifar10", "cifar100", "stl10", "imagenet"))


def _table3(runs: list[tuple[dict, dict]]) -> list[str]:
    """Table 3 analogue, one table per zero-shot run: per method the seed count and mean ± std
    (over seeds) of zero-shot accuracy on each set; the paper's rows where the set-up is theirs,
    else their numbers (:data:`PAPER_TABLE3_SETUP`) in a column beside ours."""
    lines: list[str] = []
    for res, params in runs:
        ft = params.get("fine_tuned_on", "?")
        sets = sorted({s for cells in res.values() for s in cells})
        matched = paper_numbers.matches_paper(params.get("embedding_model"), ft)
        head = ["fine-tuned on", "method", "seeds", *sets]
        head += [] if matched else [f"paper ({PAPER_TABLE3_SETUP})"]
        lines += [
            f"### Table 3 analogue — zero-shot accuracy after fine-tuning{_heading(params)}",
            "",
            "| " + " | ".join(head) + " |",
            "|" + "---|" * len(head),
        ]
        grouped: dict[str, list[dict]] = defaultdict(list)
        for name, cells in res.items():
            grouped[_base(name)].append(cells)
        for method, cells in grouped.items():
            tuned = "– (frozen)" if method == "clip" else ft
            row = [
                tuned,
                method,
                _seed_count(cells),
                *(_mean_std(c.get(s) for c in cells) for s in sets),
            ]
            if not matched:
                row.append(_paper_table3_cell(method))
            lines.append("| " + " | ".join(row) + " |")
            paper = paper_numbers.TABLE3.get(ft, {}).get(method)
            if paper and matched:
                lines.append(
                    f"| {ft} | {method} (paper) | – | "
                    + " | ".join(f"{paper.get(s, float('nan')):.3f}" for s in sets)
                    + " |"
                )
        note = (
            "Paper rows: Ju et al. 2025, Table 3 (CLIP ViT-B/32)."
            if matched
            else f"Paper column: Ju et al. 2025, Table 3 — {PAPER_TABLE3_SETUP} (the "
            "frozen CLIP's row: no fine-tuning); other sets than ours, not produced here."
        )
        lines += [
            "",
            f"*Ours: mean ± std over the sweep's seeds (one value for the frozen model). {note}*",
            "",
            f"*{aggregation_note(params.get('template_aggregation') or 'mean')}*",
            "",
        ]
    return lines


def _heading(params: dict) -> str:
    parts = [p for p in (params.get("sweep"), params.get("note")) if p]
    return f" — {', '.join(parts)}" if parts else ""


def _hierarchy(res: dict, output: str, params: dict, tag: str) -> tuple[list[str], dict]:
    first: dict[str, dict] = {}
    grouped: dict[str, list[dict]] = defaultdict(list)
    for name, cell in res.items():
        grouped[_base(name)].append(cell)
        first.setdefault(_base(name), cell)
    lines = [
        f"### HierarCaps analysis (Fig. 5 analogue){_heading(params)}",
        "",
        "| method | S(level, uncertainty) | S(words, uncertainty) | monotone hierarchies |",
        "|---|---|---|---|",
    ]
    for method, cells in grouped.items():
        lines.append(
            f"| {method} | {_mean_std(c['spearman_level_uncertainty'] for c in cells)} "
            f"| {_mean_std(c['spearman_words_uncertainty'] for c in cells)} | "
            f"{_mean_std(c['monotone_fraction'] for c in cells)} |"
        )
    name = f"fig5_{tag}.png"
    path = os.path.join(output, name)
    plot_hierarchy(first, path)
    lines += [
        "",
        f"![Fig. 5 analogue — uncertainty and paired score per caption level]({name})",
        "",
    ]
    return lines, {path: "fig5"}


def _ood(res: dict, output: str, params: dict, tag: str) -> tuple[list[str], dict]:
    lines = [
        f"### OOD robustness (beyond the paper){_heading(params)}",
        "",
        "| method | perturbation | t2i R@1 | i2t R@1 | t2i MMI | i2t MMI | unc. AUROC |",
        "|---|---|---|---|---|---|---|",
    ]
    grouped: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for name, per in res.items():
        for spec, cell in per.items():
            grouped[_base(name)][spec].append(cell)
    curves: dict[str, dict[str, dict[int, float]]] = defaultdict(dict)
    for method, per in grouped.items():
        for spec, cells in sorted(per.items()):
            lines.append(
                f"| {method} | {spec} | {_mean_std(c['t2i_recall_at_1'] for c in cells)}"
                f" | {_mean_std(c['i2t_recall_at_1'] for c in cells)} | "
                f"{_mean_std(c['t2i_mmi'] for c in cells)} | "
                f"{_mean_std(c['i2t_mmi'] for c in cells)} | "
                f"{_mean_std(c['uncertainty_auroc'] for c in cells)} |"
            )
            kind, severity = spec.split(":")
            curve = curves[kind].setdefault(method, {})
            curve[0] = statistics.fmean(c["clean_t2i_recall_at_1"] for c in cells)
            curve[int(severity)] = statistics.fmean(c["t2i_recall_at_1"] for c in cells)
    figures = {}
    for kind, per_method in curves.items():
        name = f"fig_ood_{kind}{tag}.png"
        path = os.path.join(output, name)
        plot_severity(per_method, path, ylabel="t2i Recall@1", title=kind)
        figures[path] = kind
        lines.append(f"![OOD: t2i Recall@1 vs {kind} severity]({name})\n")
    return lines + [""], figures


# -- entry point --------------------------------------------------------------------------------
def build_report(
    tracking_uri: str, experiment: str, output: str, *, parent: str | None = None
) -> str:
    """Write ``output/report.md`` and ``report.html`` (+ figures) from the experiment and log
    them as a run ``kind=report`` (nested under ``parent``); returns the markdown's path."""
    _, runs = tracking.experiment_runs(tracking_uri, experiment)
    os.makedirs(output, exist_ok=True)
    lines = [
        f"# AsymVLM report — experiment `{experiment}`",
        "",
        f"Tracking store: `{redact(tracking_uri)}`. Values are mean ± std over seeds where "
        "there are several. Rows marked *(paper)* are the numbers published by Ju et al. "
        "(NeurIPS 2025) for CLIP ViT-B/32, shown only where our set-up matches theirs; "
        "elsewhere a *paper* column beside ours names the set-up (model and real data) "
        "they were measured on, for comparing trends, not values.",
        "",
    ]
    figures: dict[str, str] = {}
    sweeps = [r for r in runs if r.data.tags.get("kind") == "sweep"]
    used_tags: set[str] = set()
    judged: list[tuple[str, claims.Verdict]] = []
    for sweep in sweeps:
        section, figs, rows = _sweep_section(tracking_uri, sweep, output, used_tags)
        lines += section
        figures.update(figs)
        if "plumbing only" not in (sweep.data.tags.get("note") or "").lower():
            name = sweep.info.run_name or sweep.info.run_id
            judged += [(name, v) for v in claims.table1_verdicts(rows)]
    evals: dict[str, list] = defaultdict(list)
    for run in runs:
        kind = run.data.tags.get("kind", "")
        if kind.startswith("eval-") and run.info.status == "FINISHED":
            result = tracking.json_artifact(tracking_uri, run.info.run_id, "results.json")
            evals[kind].append((result, run.data.params))
    if evals.get("eval-nota"):
        lines += _table2(evals["eval-nota"])
    if evals.get("eval-zeroshot"):
        lines += _table3(evals["eval-zeroshot"])
    for kind, judge in (
        ("eval-nota", claims.table2_verdicts),
        ("eval-zeroshot", claims.table3_verdicts),
    ):
        for res, params in evals.get(kind, []):
            if "plumbing only" not in (params.get("note") or "").lower():
                source = f"{kind[5:]} ({params.get('sweep') or '–'})"
                judged += [(source, v) for v in judge(res)]
    lines += claims.claims_markdown(judged)
    # One section per evaluation run; figure names get the sweep when there are several.
    for kind, section_fn, prefix in (
        ("eval-hierarcaps", _hierarchy, "hierarcaps"),
        ("eval-ood", _ood, ""),
    ):
        runs_of_kind = evals.get(kind, [])
        for k, (res, params) in enumerate(runs_of_kind):
            tag = prefix if len(runs_of_kind) == 1 else f"{prefix}_{params.get('sweep') or k}"
            section, figs = section_fn(res, output, params, tag)
            lines += section
            figures.update(figs)
    if len(lines) <= 5:
        lines.append("*No sweeps or evaluations in this experiment yet.*")
    elif judged or claims.world_of(evals.get("eval-nota", [])):
        lines += claims.closing_note(judged, claims.world_of(evals.get("eval-nota", [])))
    text = "\n".join(lines) + "\n"
    path = os.path.join(output, "report.md")
    with open(path, "w") as fh:
        fh.write(text)
    page = os.path.join(output, "report.html")
    with open(page, "w") as fh:
        fh.write(report_html(text, output, title=f"AsymVLM report — {experiment}"))
    about = f"Tables and figures of experiment {experiment}"
    with tracking.run(
        tracking_uri, experiment, "report", kind="report", parent=parent, description=about
    ) as run:
        run.log_artifact(path)
        run.log_artifact(page)
        for fig in figures:
            run.log_artifact(fig)
    return path


_IMAGE = re.compile(r'<img src="([^"/:]+\.png)"')


def report_html(markdown_text: str, folder: str, title: str) -> str:
    """The report as one self-contained HTML page: markdown rendered (tables included) by
    markdown-it, figures from ``folder`` inlined as data URIs, so it shows whole in the MLflow
    UI's artifact viewer."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark").enable("table").render(markdown_text)

    def inline(match: re.Match) -> str:
        path = os.path.join(folder, match.group(1))
        if not os.path.isfile(path):
            return match.group(0)
        with open(path, "rb") as fh:
            data = base64.b64encode(fh.read()).decode()
        return f'<img src="data:image/png;base64,{data}"'

    body = _IMAGE.sub(inline, body)
    style = (
        "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;"
        "padding:3px 8px}img{max-width:100%}blockquote{color:#555}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
        f"</title><style>{style}</style></head><body>{body}</body></html>\n"
    )
