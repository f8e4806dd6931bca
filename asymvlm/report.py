"""``asymvlm report``: the sweeps and evaluation runs of one MLflow experiment as ``report.md``
and ``report.html``: Tables 1-3, Figs. 3-5 and the OOD suite as analogues of the paper's, its
claims judged (:mod:`asymvlm.claims`), logged as a run ``kind=report``.
"""

from __future__ import annotations

import base64
import html
import os
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from asymvlm import claims, paper_numbers, tracking
from asymvlm.config import redact
from asymvlm.evaluation.hierarcaps import plot_hierarchy
from asymvlm.evaluation.ood import plot_severity
from asymvlm.evaluation.zeroshot import aggregation_note
from asymvlm.plots import plot_binned_recall, plot_risk_coverage
from asymvlm.results import DIRECTIONS, markdown, mean_std, retrieval_metric_names, seed_stats

__all__ = ["PROTOCOL_LABELS", "build_report", "protocol_label", "table1_markdown"]

ABLATIONS = ("asymvlm-vmf", "asymvlm-image", "symvlm", "asymvlm-gauss")
#: Table 1 cells per direction: (MLflow name without the direction, heading, scale, digits).
TABLE1_CELLS = (
    ("recall_at_1", "R@1 (%)", 100.0, 2),
    ("spearman", "S", 1.0, 2),
    ("r2", "R²", 1.0, 2),
    ("auroc", "AUROC", 1.0, 3),
    ("aupr", "AUPR", 1.0, 3),
    ("fpr_at_95tpr", "FPR@95", 1.0, 3),
    ("aurc", "AURC", 1.0, 3),
    ("ece", "ECE", 1.0, 3),
)
PROTOCOL_LABELS = {
    "official": "Protocol: official (the authors' code)",
    "improved": "Protocol: improved (this project's defaults; see README 'Protocols')",
}
#: What the paper's Table 2 / Table 3 numbers were measured on, for their column headings.
PAPER_TABLE2_SETUP = "CLIP ViT-B/32 on real data: CIFAR-10 positives, CIFAR-100 negatives"
PAPER_TABLE3_SETUP = (
    "CLIP ViT-B/32 fine-tuned on COCO, real data: CIFAR-10 / CIFAR-100 / STL-10 / ImageNet"
)


def protocol_label(params: Mapping[str, str]) -> str:
    """The caption line naming a sweep's protocol (param ``protocol``, else "improved")."""
    value = str(params.get("protocol") or "improved").strip().strip('"') or "improved"
    return PROTOCOL_LABELS.get(value, f"Protocol: {value}")


def _base(name: str) -> str:
    """ "asymvlm-vmf/seed1" -> "asymvlm-vmf"."""
    return name.split("/", 1)[0]


def table1_markdown(rows: Sequence[Mapping[str, Any]], title: str, caption: str) -> str:
    """Table 1 analogue: per method (``rows``: one per seed, ``method`` and the MLflow names
    of its test numbers) the seeds and mean ± std of :data:`TABLE1_CELLS` both ways, and RSUM."""
    cells = [(f"{d}_{c[0]}", f"{d} {c[1]}", *c[2:]) for d in ("i2t", "t2i") for c in TABLE1_CELLS]
    cells.append(("rsum", "RSUM", 1.0, 2))
    stats = seed_stats(rows, "method", [c[0] for c in cells])
    table = pd.DataFrame({"Method": stats.index, "seeds": stats["seeds"].astype(str)})
    for col, head, scale, digits in cells:
        table[head] = mean_std(stats, col, scale, digits)
    return f"### {title}\n\n{caption}\n\n{markdown(table)}\n"


def _trial(uri: str, child) -> dict[str, Any]:
    """A seed run's row: its method, test numbers under their MLflow names and test curves
    (``<direction>_binned``, ``<direction>_risk``) from its ``results.json``."""
    try:
        test = tracking.json_artifact(uri, child.info.run_id, "results.json").get("test") or {}
    except Exception:  # a trial without results: its numbers show as "–"
        test = {}
    row = {"method": child.data.params["method"], **retrieval_metric_names(test)}
    for d in DIRECTIONS:
        cell = test.get(d) or {}
        row |= {f"{d}_binned": cell.get("binned_recall@1"), f"{d}_risk": cell.get("risk_coverage")}
    return row


def _mean_curve(curves: Sequence[Mapping[str, Sequence[float]]]) -> dict[str, list[float]]:
    """The mean over seeds of risk-coverage curves, each read (interpolated) at the first's
    coverages."""
    grid = np.asarray(curves[0]["coverage"], dtype=float)
    risks = []
    for curve in curves:
        x, y = np.asarray(curve["coverage"], float), np.asarray(curve["risk"], float)
        order = np.argsort(x)
        risks.append(np.interp(grid, x[order], y[order]))
    return {"coverage": grid.tolist(), "risk": np.mean(risks, axis=0).tolist()}


def _paper_table1(dataset: str | None, model: str | None) -> list[str]:
    """The paper's Table 1 rows where model and data set are theirs, else nothing."""
    paper = paper_numbers.TABLE1.get(dataset or "")
    if not paper or not paper_numbers.matches_paper(model, dataset):
        return []
    table = pd.DataFrame(
        {"Method": f"{method} (paper)"}
        | {
            f"{d} {head}": f"{scale * v[f'{d}_{name}']:.{digits}f}"
            for d in ("i2t", "t2i")
            for name, head, scale, digits in (
                ("recall_at_1", "R@1 (%)", 100, 1),
                ("spearman", "S", 1, 3),
                ("r2", "R²", 1, 3),
            )
        }
        for method, v in paper.items()
    )
    return [
        f"*Paper (Ju et al. 2025, Table 1, CLIP ViT-B/32 on {dataset}), for comparison — "
        "not produced here:*\n",
        markdown(table),
        "",
    ]


def _seed_means(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict]:
    """Per method and direction, the seed means the figures draw."""
    names = ("recall_at_1", "spearman", "r2", "aurc")
    stats = seed_stats(rows, "method", [f"{d}_{n}" for d in DIRECTIONS for n in names])
    out: dict[str, dict] = {}
    for method, row in stats.iterrows():
        out[method] = {}
        for d in DIRECTIONS:
            means = {n: float(row[f"{d}_{n}_mean"]) if row[f"{d}_{n}_n"] else None for n in names}
            seeds = [r for r in rows if r["method"] == method]
            binned = [r[f"{d}_binned"] for r in seeds if r[f"{d}_binned"]]
            risk = [r[f"{d}_risk"] for r in seeds if r[f"{d}_risk"]]
            out[method][d] = {
                "recall@1": float("nan") if means["recall_at_1"] is None else means["recall_at_1"],
                "binned_recall@1": np.mean(binned, axis=0).tolist() if binned else None,
                "spearman": means["spearman"],
                "r2": means["r2"],
                "aurc": means["aurc"],
                "risk_coverage": _mean_curve(risk) if risk else None,
            }
    return out


def _figure_tag(dataset: str | None, parent, used: set[str]) -> str:
    """``<dataset>``, with the sweep's name when another sweep of the report took it."""
    tag = (dataset or "data").replace("/", "_")
    if tag in used:
        name = parent.info.run_name or parent.info.run_id
        tag = f"{tag}_{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}"
    used.add(tag)
    return tag


def _sweep_section(
    uri: str, parent, output: str, used: set[str]
) -> tuple[list[str], dict, list[dict]]:
    """One sweep's Table 1 analogue, the paper's numbers where they apply, the Fig. 3 / Fig. 4
    analogues and the risk-coverage figure; also its rows (one per seed run) for the claims."""
    children = tracking.child_runs(uri, parent.info.run_id, stage="seeds")
    if not children:
        return [], {}, []
    params = children[0].data.params
    dataset, model = params.get("dataset"), params.get("embedding_model")
    rows = [_trial(uri, child) for child in children]
    title = f"Table 1 analogue — {parent.info.run_name}: {dataset} ({model})"
    caption = f"*{protocol_label({**params, **parent.data.params})}.*"
    lines = [table1_markdown(rows, title, caption)]
    if parent.data.tags.get("note"):
        lines.append(f"> {parent.data.tags['note']}\n")
    if n_failed := int(parent.data.metrics.get("failed_trials", 0)):
        lines.append(
            f"> {n_failed} trial(s) of this sweep failed (e.g. a diverged learning "
            "rate) and are left out; the sweep's `summary.md` lists them with the reason.\n"
        )
    lines += _paper_table1(dataset, model)
    results = _seed_means(rows)
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
    lines += [f"![{caption}]({os.path.basename(path)})\n" for path, caption in figures.items()]
    return lines, figures, rows


def _set_name(location: str | None, default: str) -> str:
    """``/x/tables/synthetic-positives:test`` -> ``synthetic-positives``."""
    if not location:
        return default
    root = str(location).rpartition(":")[0] or str(location)
    return os.path.basename(root.rstrip("/")) or default


def _heading(params: dict) -> str:
    parts = [p for p in (params.get("sweep"), params.get("note")) if p]
    return f" — {', '.join(parts)}" if parts else ""


def _pair(paper: tuple[float, float] | None) -> str:
    return f"{paper[0]:.3f}, {paper[1]:.3f}" if paper else "–"


def _table2(runs: list[tuple[dict, dict]]) -> list[str]:
    """Table 2 analogue per none-of-the-above run: per dummy prompt and method the seeds and
    mean ± std of positive and negative accuracy, the paper's numbers beside them."""
    lines: list[str] = []
    for res, params in runs:
        settings = res.get("settings") or {}
        pos = (settings.get("positives") or {}).get("name") or _set_name(
            params.get("positives"), "CIFAR-10"
        )
        neg = (settings.get("negatives") or {}).get("name") or _set_name(
            params.get("negatives"), "CIFAR-100"
        )
        far = (settings.get("far_negatives") or {}).get("name")
        sets = f"positives: {pos}, negatives: {neg}" + (f", far negatives: {far}" if far else "")
        keys = {"pos_acc": "pos. acc.", "neg_acc": "sibling neg. rejected" if far else "neg. acc."}
        keys |= {"far_neg_acc": "far neg. rejected"} if far else {}
        cells = [
            {**cell, "dummy": dummy, "method": _base(name)}
            for dummy, per_method in res["dummy"].items()
            for name, cell in per_method.items()
        ]
        stats = seed_stats(cells, ["dummy", "method"], list(keys))
        table = pd.DataFrame(
            {
                "dummy prompt": [f'"{d}"' for d, _ in stats.index],
                "method": [m for _, m in stats.index],
                "seeds": stats["seeds"].astype(str).to_numpy(),
            }
        )
        for key, head in keys.items():
            table[head] = mean_std(stats, key, bare=True)
        table["paper (pos., neg.)"] = [
            _pair(paper_numbers.TABLE2.get(d, {}).get(m)) for d, m in stats.index
        ]
        for name, cell in res.get("rejection", {}).items():
            values = [cell.get(k) for k in keys]
            table.loc[len(table)] = [
                "(none)",
                f"{name}-based (frozen)",
                "1",
                *("–" if v is None else f"{v:.3f}" for v in values),
                _pair(paper_numbers.TABLE2["(none)"].get(name)),
            ]
        lines += [
            f"### Table 2 analogue — none-of-the-above ({sets}){_heading(params)}",
            "",
            markdown(table),
            "",
            "*Ours: mean ± std over the sweep's seeds (one value for the frozen model). Paper "
            f"column: Ju et al. 2025, Table 2 — {PAPER_TABLE2_SETUP}; not produced here.*",
            "",
        ]
        if far:
            lines += [
                "*Sibling negatives are other children of the positives' level-0 concepts; far "
                "negatives are concepts under level-0 concepts with no positive class. The frozen "
                "baselines' cut is calibrated on the sibling negatives.*",
                "",
            ]
        if how := settings.get("template_aggregation"):
            lines += [f"*{aggregation_note(how)}*", ""]
    return lines


def _table3(runs: list[tuple[dict, dict]]) -> list[str]:
    """Table 3 analogue per zero-shot run: per method the seeds and mean ± std of zero-shot
    accuracy on each set; the paper's rows where the set-up is theirs, else a column."""
    lines: list[str] = []
    for res, params in runs:
        ft = params.get("fine_tuned_on", "?")
        sets = sorted({s for cells in res.values() for s in cells})
        matched = paper_numbers.matches_paper(params.get("embedding_model"), ft)
        stats = seed_stats(
            [{**cells, "method": _base(name)} for name, cells in res.items()], "method", sets
        )
        cells = {s: mean_std(stats, s, bare=True) for s in sets}
        rows = []
        for k, method in enumerate(stats.index):
            tuned = "– (frozen)" if method == "clip" else ft
            row = [tuned, method, str(stats["seeds"].iloc[k]), *(cells[s][k] for s in sets)]
            if not matched:
                paper = paper_numbers.TABLE3["none" if method == "clip" else "coco"].get(method)
                sets4 = ("cifar10", "cifar100", "stl10", "imagenet")
                row.append(" / ".join(f"{paper[s]:.3f}" for s in sets4) if paper else "–")
            rows.append(row)
            paper = paper_numbers.TABLE3.get(ft, {}).get(method)
            if paper and matched:
                values = [f"{paper.get(s, float('nan')):.3f}" for s in sets]
                rows.append([ft, f"{method} (paper)", "–", *values])
        head = ["fine-tuned on", "method", "seeds", *sets]
        head += [] if matched else [f"paper ({PAPER_TABLE3_SETUP})"]
        note = (
            "Paper rows: Ju et al. 2025, Table 3 (CLIP ViT-B/32)."
            if matched
            else f"Paper column: Ju et al. 2025, Table 3 — {PAPER_TABLE3_SETUP} (the "
            "frozen CLIP's row: no fine-tuning); other sets than ours, not produced here."
        )
        lines += [
            f"### Table 3 analogue — zero-shot accuracy after fine-tuning{_heading(params)}",
            "",
            markdown(pd.DataFrame(rows, columns=head)),
            "",
            f"*Ours: mean ± std over the sweep's seeds (one value for the frozen model). {note}*",
            "",
            f"*{aggregation_note(params.get('template_aggregation') or 'mean')}*",
            "",
        ]
    return lines


def _hierarchy(res: dict, output: str, params: dict, tag: str) -> tuple[list[str], dict]:
    """The HierarCaps table (a constant uncertainty's undefined Spearman shows as "–") and
    the Fig. 5 analogue of each method's first model."""
    keys = {
        "spearman_level_uncertainty": "S(level, uncertainty)",
        "spearman_words_uncertainty": "S(words, uncertainty)",
        "monotone_fraction": "monotone hierarchies",
    }
    stats = seed_stats([{**c, "method": _base(n)} for n, c in res.items()], "method", list(keys))
    table = pd.DataFrame({"method": stats.index})
    for key, head in keys.items():
        table[head] = mean_std(stats, key, bare=True)
    first: dict[str, dict] = {}
    for name, cell in res.items():
        first.setdefault(_base(name), cell)
    name = f"fig5_{tag}.png"
    path = os.path.join(output, name)
    plot_hierarchy(first, path)
    lines = [
        f"### HierarCaps analysis (Fig. 5 analogue){_heading(params)}",
        "",
        markdown(table),
        "",
        f"![Fig. 5 analogue — uncertainty and paired score per caption level]({name})",
        "",
    ]
    return lines, {path: "fig5"}


def _ood(res: dict, output: str, params: dict, tag: str) -> tuple[list[str], dict]:
    """The OOD table per method and perturbation, and t2i Recall@1 against severity."""
    keys = {
        "t2i_recall_at_1": "t2i R@1",
        "i2t_recall_at_1": "i2t R@1",
        "t2i_mmi": "t2i MMI",
        "i2t_mmi": "i2t MMI",
        "uncertainty_auroc": "unc. AUROC",
    }
    order = {m: k for k, m in enumerate(dict.fromkeys(_base(n) for n in res))}
    cells = [{**c, "method": _base(n), "spec": s} for n, per in res.items() for s, c in per.items()]
    cells.sort(key=lambda c: (order[c["method"]], c["spec"]))
    stats = seed_stats(cells, ["method", "spec"], [*keys, "clean_t2i_recall_at_1"])
    table = pd.DataFrame(
        {"method": [m for m, _ in stats.index], "perturbation": [s for _, s in stats.index]}
    )
    for key, head in keys.items():
        table[head] = mean_std(stats, key, bare=True)
    curves: dict[str, dict[str, dict[int, float]]] = defaultdict(dict)
    for (method, spec), row in stats.iterrows():
        kind, severity = spec.split(":")
        curve = curves[kind].setdefault(method, {})
        curve[0] = row["clean_t2i_recall_at_1_mean"]
        curve[int(severity)] = row["t2i_recall_at_1_mean"]
    lines = [f"### OOD robustness (beyond the paper){_heading(params)}", "", markdown(table)]
    figures = {}
    for kind, per_method in curves.items():
        name = f"fig_ood_{kind}{tag}.png"
        path = os.path.join(output, name)
        plot_severity(per_method, path, ylabel="t2i Recall@1", title=kind)
        figures[path] = kind
        lines.append(f"![OOD: t2i Recall@1 vs {kind} severity]({name})\n")
    return lines + [""], figures


def _plumbing(note: str | None) -> bool:
    return "plumbing only" in (note or "").lower()


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
    used_tags: set[str] = set()
    judged: list[tuple[str, claims.Verdict]] = []
    for sweep in (r for r in runs if r.data.tags.get("kind") == "sweep"):
        section, figs, rows = _sweep_section(tracking_uri, sweep, output, used_tags)
        lines += section
        figures.update(figs)
        if not _plumbing(sweep.data.tags.get("note")):
            name = sweep.info.run_name or sweep.info.run_id
            judged += [(name, v) for v in claims.table1_verdicts(rows)]
    evals: dict[str, list] = defaultdict(list)
    for run in runs:
        kind = run.data.tags.get("kind", "")
        if kind.startswith("eval-") and run.info.status == "FINISHED":
            result = tracking.json_artifact(tracking_uri, run.info.run_id, "results.json")
            evals[kind].append((result, run.data.params))
    lines += _table2(evals["eval-nota"]) + _table3(evals["eval-zeroshot"])
    for kind, judge in (
        ("eval-nota", claims.table2_verdicts),
        ("eval-zeroshot", claims.table3_verdicts),
    ):
        for res, params in evals[kind]:
            if not _plumbing(params.get("note")):
                source = f"{kind[5:]} ({params.get('sweep') or '–'})"
                judged += [(source, v) for v in judge(res)]
    lines += claims.claims_markdown(judged)
    for kind, section_fn, prefix in (
        ("eval-hierarcaps", _hierarchy, "hierarcaps"),
        ("eval-ood", _ood, ""),
    ):
        of_kind = evals[kind]
        for k, (res, params) in enumerate(of_kind):
            tag = prefix if len(of_kind) == 1 else f"{prefix}_{params.get('sweep') or k}"
            section, figs = section_fn(res, output, params, tag)
            lines += section
            figures.update(figs)
    world = claims.world_of(evals["eval-nota"])
    if len(lines) <= 5:
        lines.append("*No sweeps or evaluations in this experiment yet.*")
    elif judged or world:
        lines += claims.closing_note(judged, world)
    text = "\n".join(lines) + "\n"
    path = os.path.join(output, "report.md")
    page = os.path.join(output, "report.html")
    with open(path, "w") as fh:
        fh.write(text)
    with open(page, "w") as fh:
        fh.write(report_html(text, output, title=f"AsymVLM report — {experiment}"))
    about = f"Tables and figures of experiment {experiment}"
    with tracking.run(
        tracking_uri, experiment, "report", kind="report", parent=parent, description=about
    ) as run:
        for artifact in (path, page, *figures):
            run.log_artifact(artifact)
    return path


_IMAGE = re.compile(r'<img src="([^"/:]+\.png)"')


def report_html(markdown_text: str, folder: str, title: str) -> str:
    """The report as one HTML page (markdown-it), figures from ``folder`` inlined as data URIs
    so that the MLflow UI's artifact viewer shows it whole."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark").enable("table").render(markdown_text)

    def inline(match: re.Match) -> str:
        path = os.path.join(folder, match.group(1))
        if not os.path.isfile(path):
            return match.group(0)
        with open(path, "rb") as fh:
            return f'<img src="data:image/png;base64,{base64.b64encode(fh.read()).decode()}"'

    style = (
        "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;"
        "padding:3px 8px}img{max-width:100%}blockquote{color:#555}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
        f"</title><style>{style}</style></head><body>{_IMAGE.sub(inline, body)}</body></html>\n"
    )
