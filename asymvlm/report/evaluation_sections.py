"""The report's part of each evaluation run: the Table 2 and 3 analogues with the paper's numbers
beside ours, the HierarCaps table with the Fig. 5 analogue, the OOD table with severity curves."""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Sequence

import pandas as pd

from asymvlm.evaluation.registry import EvaluationResult
from asymvlm.report import columns, paper_numbers
from asymvlm.report.figures import plot_hierarchy, plot_severity
from asymvlm.report.paper_numbers import TABLE2, TABLE3
from asymvlm.report.seed_tables import markdown, mean_std, seed_stats


def _base(name: str) -> str:
    return name.split("/", 1)[0]  # "asymvlm-vmf/seed1" -> "asymvlm-vmf"


def _heading(result: EvaluationResult) -> str:
    parts = [p for p in (result.sweep, result.note) if p]
    return f" — {', '.join(parts)}" if parts else ""


def _pair(paper: tuple[float, float] | None) -> str:
    return f"{paper[0]:.3f}, {paper[1]:.3f}" if paper else "–"


def _aggregation_note(aggregation: str) -> str:
    """How a likelihood method's class score combined the prompts, in one sentence."""
    text = {
        "mean": "the mean of the log-likelihoods over the class's prompt templates",
        "logmeanexp": "the log of the mean likelihood over the class's prompt templates",
    }
    return (
        f"A likelihood method's class score: {text.get(aggregation, aggregation)} "
        f"(`template_aggregation: {aggregation}`; the paper leaves this open, the other "
        "option is documented in `asymvlm.evaluation.zeroshot`). Cosine methods use CLIP's "
        "prompt ensemble."
    )


def table2(runs: Sequence[EvaluationResult]) -> list[str]:
    """Table 2 analogue per none-of-the-above run, the paper's numbers beside ours."""
    lines: list[str] = []
    for result in runs:
        settings = result.numbers.get("settings") or {}
        roles = ("positives", "negatives", "far_negatives")
        pos, neg, far = (
            (settings.get(r) or {}).get("name") or s
            for r, s in zip(roles, columns.TABLE2_SETS, strict=True)
        )
        sets = f"positives: {pos}, negatives: {neg}" + (f", far negatives: {far}" if far else "")
        keys = columns.TABLE2_FAR if far else columns.TABLE2
        cells = [
            {**cell, "dummy": dummy, "method": _base(name)}
            for dummy, per_method in result.numbers["dummy"].items()
            for name, cell in per_method.items()
        ]
        stats = seed_stats(cells, ["dummy", "method"], list(keys))
        table = stats.index.to_frame(index=False, name=["dummy prompt", "method"])
        table["dummy prompt"] = [f'"{d}"' for d in table["dummy prompt"]]
        table["seeds"] = stats["seeds"].astype(str).to_numpy()
        for key, head in keys.items():
            table[head] = mean_std(stats, key, bare=True)
        table["paper (pos., neg.)"] = [_pair(TABLE2.get(d, {}).get(m)) for d, m in stats.index]
        for name, cell in result.numbers.get("rejection", {}).items():
            values = ["–" if cell.get(k) is None else f"{cell[k]:.3f}" for k in keys]
            paper = _pair(TABLE2["(none)"].get(name))
            table.loc[len(table)] = ["(none)", f"{name}-based (frozen)", "1", *values, paper]
        lines += [
            f"### Table 2 analogue — none-of-the-above ({sets}){_heading(result)}",
            "",
            markdown(table),
            "",
            "*Ours: mean ± std over the sweep's seeds (one value for the frozen model). Paper "
            f"column: Ju et al. 2025, Table 2 — {columns.PAPER_TABLE2_SETUP}; not produced here.*",
            "",
        ]
        if far:
            lines += [
                "*Sibling negatives are other children of the positives' level-0 concepts; far "
                "negatives are concepts under level-0 concepts with no positive class. The frozen "
                "baselines' cut is calibrated on the sibling negatives.*",
                "",
            ]
        if settings.get("template_aggregation"):
            lines += [f"*{_aggregation_note(settings['template_aggregation'])}*", ""]
    return lines


def table3(runs: Sequence[EvaluationResult]) -> list[str]:
    """Table 3 analogue per zero-shot run, the paper's numbers (COCO's unless ours) beside ours."""
    lines: list[str] = []
    for result in runs:
        ft = result.fine_tuned_on
        sets = sorted({s for cells in result.numbers.values() for s in cells})
        matched = paper_numbers.matches_paper(result.embedding_model, ft)
        setup = columns.PAPER_TABLE3_SETUP.replace("COCO", ft if matched else "COCO")
        rows = [{**cells, "method": _base(name)} for name, cells in result.numbers.items()]
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
            f"### Table 3 analogue — zero-shot accuracy after fine-tuning{_heading(result)}",
            "",
            markdown(table),
            "",
            "*Ours: mean ± std over the sweep's seeds (one value for the frozen model). Paper "
            f"column: Ju et al. 2025, Table 3 — {setup} (the frozen CLIP's row: no fine-tuning); "
            "other sets than ours, not produced here.*",
            "",
            f"*{_aggregation_note(result.template_aggregation)}*",
            "",
        ]
    return lines


def hierarcaps_section(result: EvaluationResult, output: str, tag: str) -> tuple[list[str], dict]:
    """The HierarCaps table and the Fig. 5 analogue of each method's first model."""
    models = result.numbers
    rows = [{**cells, "method": _base(name)} for name, cells in models.items()]
    stats = seed_stats(rows, "method", list(columns.HIERARCAPS))
    table = pd.DataFrame(
        {"method": stats.index}
        | {h: mean_std(stats, k, bare=True) for k, h in columns.HIERARCAPS.items()}
    )
    first = {m: next(c for n, c in models.items() if _base(n) == m) for m in map(_base, models)}
    path = plot_hierarchy(first, os.path.join(output, f"fig5_{tag}.png"))
    return [
        f"### HierarCaps analysis (Fig. 5 analogue){_heading(result)}\n",
        markdown(table),
        "",
        "![Fig. 5 analogue — uncertainty and paired score per caption level]"
        f"({os.path.basename(path)})",
        "",
    ], {path: "fig5"}


def ood_section(result: EvaluationResult, output: str, tag: str) -> tuple[list[str], dict]:
    """The OOD table per method and perturbation, and t2i Recall@1 against severity."""
    models = result.numbers
    order = {m: k for k, m in enumerate(dict.fromkeys(_base(n) for n in models))}
    cells = [
        {**c, "method": _base(n), "spec": s} for n, per in models.items() for s, c in per.items()
    ]
    cells.sort(key=lambda c: (order[c["method"]], c["spec"]))
    stats = seed_stats(cells, ["method", "spec"], [*columns.OOD, "clean_t2i_recall_at_1"])
    table = stats.index.to_frame(index=False, name=["method", "perturbation"])
    for key, head in columns.OOD.items():
        table[head] = mean_std(stats, key, bare=True)
    curves: dict[str, dict[str, dict[int, float]]] = defaultdict(dict)
    for (method, spec), row in stats.iterrows():
        kind, severity = spec.split(":")
        curve = curves[kind].setdefault(method, {0: row["clean_t2i_recall_at_1_mean"]})
        curve[int(severity)] = row["t2i_recall_at_1_mean"]
    lines = [f"### OOD robustness (beyond the paper){_heading(result)}", "", markdown(table)]
    figures = {}
    for kind, per_method in curves.items():
        name = f"fig_ood_{kind}{tag}.png"
        figures[plot_severity(per_method, os.path.join(output, name), "t2i Recall@1", kind)] = kind
        lines.append(f"![OOD: t2i Recall@1 vs {kind} severity]({name})\n")
    return lines + [""], figures
