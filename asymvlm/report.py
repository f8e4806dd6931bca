"""``asymvlm report``: one MLflow experiment as ``report.md`` and ``report.html`` (analogues of
Tables 1-3, Figs. 3-5, the OOD suite; claims judged by :mod:`asymvlm.claims`)."""

from __future__ import annotations

import base64
import html
import json
import os
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from asymvlm import claims, paper_numbers, tracking
from asymvlm.config import redact
from asymvlm.evaluation.hierarcaps import plot_hierarchy
from asymvlm.evaluation.ood import plot_severity
from asymvlm.evaluation.zeroshot import aggregation_note
from asymvlm.paper_numbers import TABLE2, TABLE3
from asymvlm.plots import plot_binned_recall, plot_risk_coverage
from asymvlm.results import DIRECTIONS, markdown, mean_std, seed_stats, stats_table
from asymvlm.results import retrieval_metric_names as metric_names

#: How the names of an uncertainty's numbers and curves end (``t2i_spearman``, ``i2t_e_aurc``).
UNCERTAINTY_METRICS = (
    "spearman",
    "r2",
    "auroc",
    "aupr",
    "fpr_at_95tpr",
    "aurc",
    "binned_recall@1",
    "risk_coverage",
)
#: Table 1 cells per direction: (MLflow name without the direction, heading, scale, digits).
TABLE1_CELLS = [
    ("recall_at_1", "R@1 (%)", 100.0, 2),
    ("spearman", "S", 1.0, 2),
    ("r2", "R²", 1.0, 2),
    ("auroc", "AUROC", 1.0, 3),
    ("aupr", "AUPR", 1.0, 3),
    ("fpr_at_95tpr", "FPR@95", 1.0, 3),
    ("aurc", "AURC", 1.0, 3),
    ("ece", "ECE", 1.0, 3),
]
PROTOCOL_LABELS = {
    "official": "Protocol: official (the authors' code)",
    "improved": "Protocol: improved (this project's defaults; see README 'Protocols')",
}
#: What the paper's Table 2 / Table 3 numbers were measured on, for their column headings.
PAPER_TABLE2_SETUP = "CLIP ViT-B/32 on real data: CIFAR-10 positives, CIFAR-100 negatives"
TABLE2_SETS = ("CIFAR-10", "CIFAR-100", None)  # the sets' names where a run logs none
PAPER_TABLE3_SETUP = (
    "CLIP ViT-B/32 fine-tuned on COCO, real data: CIFAR-10 / CIFAR-100 / STL-10 / ImageNet"
)


def _base(name: str) -> str:
    return name.split("/", 1)[0]  # "asymvlm-vmf/seed1" -> "asymvlm-vmf"


def _table1(rows: Sequence[Mapping[str, Any]], title: str, params: Mapping[str, str]) -> str:
    """Table 1 analogue: mean ± std over seeds (``rows``) of :data:`TABLE1_CELLS` both ways."""
    cells = [(f"{d}_{c[0]}", f"{d} {c[1]}", *c[2:]) for d in ("i2t", "t2i") for c in TABLE1_CELLS]
    cells.append(("rsum", "RSUM", 1.0, 2))
    table = stats_table(seed_stats(rows, "method", [c[0] for c in cells]), cells)
    protocol = str(params.get("protocol") or "improved").strip().strip('"') or "improved"
    caption = PROTOCOL_LABELS.get(protocol, f"Protocol: {protocol}")
    return f"### {title}\n\n*{caption}.*\n\n{table}\n"


def _trial(uri: str, child) -> dict[str, Any]:
    """A seed run's row from its ``results.json``: method, test numbers and curves (no
    uncertainty numbers for a method with ``Roles(uncertainty=False)``)."""
    try:
        test = tracking.json_artifact(uri, child.info.run_id, "results.json").get("test") or {}
    except Exception:  # a trial without results: its numbers show as "–"
        test = {}
    method = child.data.params["method"]
    curves = ("binned_recall@1", "risk_coverage")
    row = {f"{d}_{k}": (test.get(d) or {}).get(k) for d in DIRECTIONS for k in curves}
    row = {"method": method, **metric_names(test), **row}
    if claims.roles(method).uncertainty:
        return row
    return {k: None if k.endswith(UNCERTAINTY_METRICS) else v for k, v in row.items()}


def _seed_means(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict]:
    """Per method and direction, the seed means the figures draw."""
    out: dict[str, dict] = defaultdict(dict)
    for method, group in pd.DataFrame(rows).groupby("method", sort=False):
        for d in DIRECTIONS:
            means = {
                n: pd.to_numeric(group.get(f"{d}_{n}", pd.Series()), errors="coerce").mean()
                for n in ("recall_at_1", "spearman", "r2", "aurc")
            }
            binned = [c for c in group[f"{d}_binned_recall@1"] if c]
            risk = [c for c in group[f"{d}_risk_coverage"] if c]
            out[method][d] = {k: None if pd.isna(v) else float(v) for k, v in means.items()} | {
                "recall@1": float(means["recall_at_1"]),
                "binned_recall@1": np.mean(binned, axis=0).tolist() if binned else None,
                "risk_coverage": risk
                and {
                    "coverage": risk[0]["coverage"],
                    "risk": np.mean([c["risk"] for c in risk], 0),
                },
            }
    return out


def _ablations(results: Mapping[str, Any]) -> dict[str, Any]:
    """Fig. 4's methods: those with ``Roles(ablation_of=...)`` and what they ablate."""
    of = {claims.roles(m).ablation_of for m in results}
    return {m: r for m, r in results.items() if m in of or claims.roles(m).ablation_of}


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
    note = f"Paper (Ju et al. 2025, Table 1, CLIP ViT-B/32 on {dataset}), for comparison"
    return [f"*{note} — not produced here:*\n", markdown(table), ""]


def _sweep_section(
    uri: str, parent, output: str, used: set[str]
) -> tuple[list[str], dict, list[dict]]:
    """One sweep's Table 1 analogue, paper rows, Figs. 3/4 and risk-coverage analogues; also
    its rows (one per seed run) for the claims."""
    children = tracking.child_runs(uri, parent.info.run_id, stage="seeds")
    if not children:
        return [], {}, []
    params = children[0].data.params
    dataset, model = params.get("dataset"), params.get("embedding_model")
    order = json.loads(parent.data.params.get("methods") or "[]")  # Table 1 in config order
    rows = sorted(
        (_trial(uri, child) for child in children),
        key=lambda r: order.index(r["method"]) if r["method"] in order else len(order),
    )
    title = f"Table 1 analogue — {parent.info.run_name}: {dataset} ({model})"
    lines = [_table1(rows, title, {**params, **parent.data.params})]
    if parent.data.tags.get("note"):
        lines.append(f"> {parent.data.tags['note']}\n")
    if n_failed := int(parent.data.metrics.get("failed_trials", 0)):
        lines.append(
            f"> {n_failed} trial(s) of this sweep failed (e.g. a diverged learning "
            "rate) and are left out; the sweep's `summary.md` lists them with the reason.\n"
        )
    lines += _paper_table1(dataset, model)
    results = _seed_means(rows)
    tag = (dataset or "data").replace("/", "_")  # and the sweep's name if another took it
    if tag in used:
        tag += "_" + re.sub(r"[^A-Za-z0-9_.-]+", "_", parent.info.run_name or parent.info.run_id)
    used.add(tag)
    fig3 = plot_binned_recall(results, os.path.join(output, f"fig3_{tag}.png"), f"{dataset}")
    figures = {fig3: f"Fig. 3 analogue — Recall@1 per uncertainty level, {dataset}"}
    ablations = _ablations(results)
    if len(ablations) >= 2:
        fig4 = os.path.join(output, f"fig4_{tag}.png")
        plot_binned_recall(ablations, fig4, title=f"ablations, {dataset}")
        figures[fig4] = f"Fig. 4 analogue — ablations, {dataset}"
    if any(d.get("risk_coverage") for r in results.values() for d in r.values()):
        path = os.path.join(output, f"fig_risk_coverage_{tag}.png")
        figures[plot_risk_coverage(results, path, f"{dataset}")] = (
            f"Risk-coverage — top-1 risk of the most certain queries kept, {dataset}, mean over "
            "seeds"
        )
    lines += [f"![{caption}]({os.path.basename(path)})\n" for path, caption in figures.items()]
    return lines, figures, rows


def _heading(params: dict) -> str:
    parts = [p for p in (params.get("sweep"), params.get("note")) if p]
    return f" — {', '.join(parts)}" if parts else ""


def _pair(paper: tuple[float, float] | None) -> str:
    return f"{paper[0]:.3f}, {paper[1]:.3f}" if paper else "–"


def _table2(runs: list[tuple[dict, dict]]) -> list[str]:
    """Table 2 analogue per none-of-the-above run, the paper's numbers beside ours."""
    lines: list[str] = []
    for res, params in runs:
        settings = res.get("settings") or {}
        roles = ("positives", "negatives", "far_negatives")
        pos, neg, far = (
            (settings.get(r) or {}).get("name") or s
            for r, s in zip(roles, TABLE2_SETS, strict=True)
        )
        sets = f"positives: {pos}, negatives: {neg}" + (f", far negatives: {far}" if far else "")
        keys = {"pos_acc": "pos. acc.", "neg_acc": "sibling neg. rejected" if far else "neg. acc."}
        keys |= {"far_neg_acc": "far neg. rejected"} if far else {}
        cells = [
            {**cell, "dummy": dummy, "method": _base(name)}
            for dummy, per_method in res["dummy"].items()
            for name, cell in per_method.items()
        ]
        stats = seed_stats(cells, ["dummy", "method"], list(keys))
        table = stats.index.to_frame(index=False, name=["dummy prompt", "method"])
        table["dummy prompt"] = [f'"{d}"' for d in table["dummy prompt"]]
        table["seeds"] = stats["seeds"].astype(str).to_numpy()
        for key, head in keys.items():
            table[head] = mean_std(stats, key, bare=True)
        table["paper (pos., neg.)"] = [_pair(TABLE2.get(d, {}).get(m)) for d, m in stats.index]
        for name, cell in res.get("rejection", {}).items():
            values = ["–" if cell.get(k) is None else f"{cell[k]:.3f}" for k in keys]
            paper = _pair(TABLE2["(none)"].get(name))
            table.loc[len(table)] = ["(none)", f"{name}-based (frozen)", "1", *values, paper]
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
    """Table 3 analogue per zero-shot run, the paper's numbers beside ours (its COCO rows
    unless the set-up is the paper's)."""
    lines: list[str] = []
    for res, params in runs:
        ft = params.get("fine_tuned_on", "?")
        sets = sorted({s for cells in res.values() for s in cells})
        matched = paper_numbers.matches_paper(params.get("embedding_model"), ft)
        setup = PAPER_TABLE3_SETUP.replace("COCO", ft) if matched else PAPER_TABLE3_SETUP
        rows = [{**cells, "method": _base(name)} for name, cells in res.items()]
        stats = seed_stats(rows, "method", sets)
        table = pd.DataFrame(
            {"fine-tuned on": ["– (frozen)" if m == "clip" else ft for m in stats.index]}
            | {"method": stats.index, "seeds": stats["seeds"].astype(str).to_numpy()}
            | {s: mean_std(stats, s, bare=True) for s in sets}
        )
        paper = [TABLE3["none" if m == "clip" else ft if matched else "coco"] for m in stats.index]
        paper = [p.get(m) for p, m in zip(paper, stats.index, strict=True)]
        table[f"paper ({setup})"] = [
            " / ".join(f"{v:.3f}" for v in p.values()) if p else "–" for p in paper
        ]
        lines += [
            f"### Table 3 analogue — zero-shot accuracy after fine-tuning{_heading(params)}",
            "",
            markdown(table),
            "",
            "*Ours: mean ± std over the sweep's seeds (one value for the frozen model). Paper "
            f"column: Ju et al. 2025, Table 3 — {setup} (the frozen CLIP's row: no fine-tuning); "
            "other sets than ours, not produced here.*",
            "",
            f"*{aggregation_note(params.get('template_aggregation') or 'mean')}*",
            "",
        ]
    return lines


def _hierarchy(res: dict, output: str, params: dict, tag: str) -> tuple[list[str], dict]:
    """The HierarCaps table and the Fig. 5 analogue of each method's first model."""
    keys = {
        "spearman_level_uncertainty": "S(level, uncertainty)",
        "spearman_words_uncertainty": "S(words, uncertainty)",
        "monotone_fraction": "monotone hierarchies",
    }
    stats = seed_stats([{**c, "method": _base(n)} for n, c in res.items()], "method", list(keys))
    table = pd.DataFrame(
        {"method": stats.index} | {h: mean_std(stats, k, bare=True) for k, h in keys.items()}
    )
    first = {m: next(c for n, c in res.items() if _base(n) == m) for m in map(_base, res)}
    path = plot_hierarchy(first, os.path.join(output, f"fig5_{tag}.png"))
    return [
        f"### HierarCaps analysis (Fig. 5 analogue){_heading(params)}\n",
        markdown(table),
        "",
        "![Fig. 5 analogue — uncertainty and paired score per caption level]"
        f"({os.path.basename(path)})",
        "",
    ], {path: "fig5"}


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
    table = stats.index.to_frame(index=False, name=["method", "perturbation"])
    for key, head in keys.items():
        table[head] = mean_std(stats, key, bare=True)
    curves: dict[str, dict[str, dict[int, float]]] = defaultdict(dict)
    for (method, spec), row in stats.iterrows():
        kind, severity = spec.split(":")
        curve = curves[kind].setdefault(method, {0: row["clean_t2i_recall_at_1_mean"]})
        curve[int(severity)] = row["t2i_recall_at_1_mean"]
    lines = [f"### OOD robustness (beyond the paper){_heading(params)}", "", markdown(table)]
    figures = {}
    for kind, per_method in curves.items():
        name = f"fig_ood_{kind}{tag}.png"
        figures[plot_severity(per_method, os.path.join(output, name), "t2i Recall@1", kind)] = kind
        lines.append(f"![OOD: t2i Recall@1 vs {kind} severity]({name})\n")
    return lines + [""], figures


def build_report(
    tracking_uri: str, experiment: str, output: str, *, parent: str | None = None
) -> str:
    """Write ``output/report.md``, ``report.html`` and figures, logged as a run ``kind=report``
    (nested under ``parent``); returns the markdown's path."""
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
        if "plumbing only" not in sweep.data.tags.get("note", "").lower():
            name = sweep.info.run_name or sweep.info.run_id
            judged += [(name, v) for v in claims.table1_verdicts(rows)]
    evals: dict[str, list] = defaultdict(list)
    for run in runs:
        kind = run.data.tags.get("kind", "")
        if kind.startswith("eval-") and run.info.status == "FINISHED":
            result = tracking.json_artifact(tracking_uri, run.info.run_id, "results.json")
            evals[kind].append((result, run.data.params))
    lines += _table2(evals["eval-nota"]) + _table3(evals["eval-zeroshot"])
    verdicts = {"eval-nota": claims.table2_verdicts, "eval-zeroshot": claims.table3_verdicts}
    for kind, judge in verdicts.items():
        for res, params in evals[kind]:
            if "plumbing only" not in (params.get("note") or "").lower():
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
    path, page = os.path.join(output, "report.md"), os.path.join(output, "report.html")
    Path(path).write_text(text)
    Path(page).write_text(_html(text, output, title=f"AsymVLM report — {experiment}"))
    about = f"Tables and figures of experiment {experiment}"
    with tracking.run(
        tracking_uri, experiment, "report", kind="report", parent=parent, description=about
    ) as run:
        for artifact in (path, page, *figures):
            run.log_artifact(artifact)
    return path


_IMAGE = re.compile(r'<img src="([^"/:]+\.png)"')


def _html(markdown_text: str, folder: str, title: str) -> str:
    """The report as one HTML page, figures inlined (the MLflow UI's viewer shows it whole)."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark").enable("table").render(markdown_text)

    def inline(match: re.Match) -> str:
        png = Path(folder, match.group(1)).read_bytes()
        return f'<img src="data:image/png;base64,{base64.b64encode(png).decode()}"'

    style = (
        "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;"
        "padding:3px 8px}img{max-width:100%}blockquote{color:#555}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
        f"</title><style>{style}</style></head><body>{_IMAGE.sub(inline, body)}</body></html>\n"
    )
