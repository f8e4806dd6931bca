"""The report's part of each sweep: the Table 1 analogue (mean ± std over its seed runs), the
paper's rows where the set-up is theirs, and the Fig. 3/4 and risk-coverage analogues."""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from asymvlm import tracking
from asymvlm.metrics.glossary import DIRECTIONS, retrieval_metric_names
from asymvlm.report import claims, columns, paper_numbers
from asymvlm.report.figures import plot_binned_recall, plot_risk_coverage
from asymvlm.report.seed_tables import markdown, seed_stats, stats_table


def table1(rows: Sequence[Mapping[str, Any]], title: str, params: Mapping[str, str]) -> str:
    """Table 1 analogue: mean ± std over seeds (``rows``) of :data:`columns.TABLE1` both ways."""
    cells = [(f"{d}_{c[0]}", f"{d} {c[1]}", *c[2:]) for d in ("i2t", "t2i") for c in columns.TABLE1]
    cells += columns.TABLE1_BOTH_WAYS
    table = stats_table(seed_stats(rows, "method", [c[0] for c in cells]), cells)
    protocol = str(params.get("protocol") or "improved").strip().strip('"') or "improved"
    caption = columns.PROTOCOL_LABELS.get(protocol, f"Protocol: {protocol}")
    return f"### {title}\n\n*{caption}.*\n\n{table}\n"


def seed_row(uri: str, child) -> dict[str, Any]:
    """A seed run's row from its ``results.json``: method, test numbers and curves (no
    uncertainty numbers for a method with ``Roles(uncertainty=False)``)."""
    try:
        test = tracking.json_artifact(uri, child.info.run_id, "results.json").get("test") or {}
    except Exception:  # a trial without results: its numbers show as "–"
        test = {}
    method = child.data.params["method"]
    curves = ("binned_recall@1", "risk_coverage")
    row = {f"{d}_{k}": (test.get(d) or {}).get(k) for d in DIRECTIONS for k in curves}
    row = {"method": method, **retrieval_metric_names(test), **row}
    if claims.roles(method).uncertainty:
        return row
    return {k: None if k.endswith(columns.UNCERTAINTY_METRICS) else v for k, v in row.items()}


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


def ablations(results: Mapping[str, Any]) -> dict[str, Any]:
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
            for name, head, scale, digits in columns.PAPER_TABLE1
        }
        for method, v in paper.items()
    )
    note = f"Paper (Ju et al. 2025, Table 1, CLIP ViT-B/32 on {dataset}), for comparison"
    return [f"*{note} — not produced here:*\n", markdown(table), ""]


def sweep_section(
    uri: str, parent, output: str, used: set[str]
) -> tuple[list[str], dict, list[dict]]:
    """One sweep's Table 1 analogue, paper rows and figures; its rows (a seed run each) too."""
    children = tracking.child_runs(uri, parent.info.run_id, stage="seeds")
    if not children:
        return [], {}, []
    params = children[0].data.params
    dataset = params.get("dataset")
    model = params.get("embedding_model")
    order = json.loads(parent.data.params.get("methods") or "[]")  # Table 1 in config order
    rows = sorted(
        (seed_row(uri, child) for child in children),
        key=lambda r: order.index(r["method"]) if r["method"] in order else len(order),
    )
    title = f"Table 1 analogue — {parent.info.run_name}: {dataset} ({model})"
    lines = [table1(rows, title, {**params, **parent.data.params})]
    if parent.data.tags.get("note"):
        lines.append(f"> {parent.data.tags['note']}\n")
    n_failed = int(parent.data.metrics.get("failed_trials", 0))
    if n_failed:
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
    figure4 = ablations(results)
    if len(figure4) >= 2:
        fig4 = os.path.join(output, f"fig4_{tag}.png")
        plot_binned_recall(figure4, fig4, title=f"ablations, {dataset}")
        figures[fig4] = f"Fig. 4 analogue — ablations, {dataset}"
    if any(d.get("risk_coverage") for r in results.values() for d in r.values()):
        path = os.path.join(output, f"fig_risk_coverage_{tag}.png")
        figures[plot_risk_coverage(results, path, f"{dataset}")] = (
            f"Risk-coverage — top-1 risk of the most certain queries kept, {dataset}, mean over "
            "seeds"
        )
    lines += [f"![{caption}]({os.path.basename(path)})\n" for path, caption in figures.items()]
    return lines, figures, rows
