"""``asymvlm report``: everything in one MLflow experiment gathered into ``report.md``.

Reads the sweeps (parent runs ``kind=sweep`` and their seed runs) and the evaluation runs
(``kind=eval-*``, :mod:`asymvlm.evaluation.suite`), and writes to ``DIR``:

* Table 1 analogue per data set / embedding model: mean ± std over seeds of Recall@1, S, R²
  in both directions, with the paper's CLIP ViT-B/32 numbers beside ours where the set-up
  matches (clearly labelled); ``fig3_<dataset>.png`` (seed-averaged binned Recall@1 curves);
  ``fig4_<dataset>.png`` for the ablations (AsymVLM, AsymVLM(image), SymVLM, AsymVLM(G));
* Table 2 analogue (none-of-the-above), Table 3 analogue (zero-shot after fine-tuning);
* the HierarCaps analysis (``fig5_hierarcaps.png``) and the OOD suite (``fig_ood_<kind>.png``).

The report (markdown, and HTML with the figures inline, which the MLflow UI shows) and its
figures are also logged to MLflow as a run ``kind=report``, nested under the pipeline run when
there is one.
"""

from __future__ import annotations

import base64
import html
import os
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable

from asymvlm import paper_numbers, tracking
from asymvlm import results as tables_of_results
from asymvlm.config import redact
from asymvlm.evaluation.hierarcaps import plot_hierarchy
from asymvlm.evaluation.ood import plot_severity
from asymvlm.plots import plot_binned_recall

__all__ = ["build_report"]

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


# -- Table 1, Fig. 3, Fig. 4 ----------------------------------------------------------------------
def _sweep_section(uri: str, parent, output: str) -> tuple[list[str], dict]:
    children = tracking.child_runs(uri, parent.info.run_id, stage="seeds")
    if not children:
        return [], {}
    params = children[0].data.params
    dataset, model = params.get("dataset"), params.get("embedding_model")
    rows = [{"method": c.data.params["method"], **c.data.metrics} for c in children]
    summary = tables_of_results.seed_summary(rows)
    title = f"Table 1 analogue — {parent.info.run_name}: {dataset} ({model})"
    lines = [tables_of_results.summary_markdown(summary, title=title)]
    if parent.data.tags.get("note"):
        lines.append(f"> {parent.data.tags['note']}\n")
    n_failed = int(parent.data.metrics.get("failed_trials", 0))
    if n_failed:
        lines.append(f"> {n_failed} trial(s) of this sweep failed (e.g. a diverged learning "
                     "rate) and are left out; the sweep's `summary.md` lists them with the "
                     "reason.\n")  # fmt: skip
    paper = paper_numbers.TABLE1.get(dataset or "")
    if paper and paper_numbers.matches_paper(model, dataset):
        lines.append(f"*Paper (Ju et al. 2025, Table 1, CLIP ViT-B/32 on {dataset}), for "
                     "comparison — not produced here:*\n")  # fmt: skip
        lines.append("| Method | i2t R@1 (%) | i2t S | i2t R² | t2i R@1 (%) | t2i S | t2i R² |")
        lines.append("|---|---|---|---|---|---|---|")
        for method, v in paper.items():
            lines.append(
                f"| {method} (paper) | {100 * v['i2t_recall_at_1']:.1f} | {v['i2t_spearman']:.3f}"
                f" | {v['i2t_r2']:.3f} | {100 * v['t2i_recall_at_1']:.1f} | "
                f"{v['t2i_spearman']:.3f} | {v['t2i_r2']:.3f} |"
            )
        lines.append("")
    # Seed-averaged binned curves (test split).
    curves: dict[str, dict[str, list[list[float]]]] = defaultdict(lambda: defaultdict(list))
    for child in children:
        try:
            data = tracking.json_artifact(uri, child.info.run_id, "binned_recall.json")
        except Exception:  # a run without the artifact is shown in the table only
            continue
        for direction, curve in (data.get("test") or {}).items():
            if curve:
                curves[child.data.params["method"]][direction].append(curve)
    results: dict[str, dict] = {}
    for method, cells in summary.items():
        entry = {}
        for direction in ("t2i", "i2t"):
            got = curves.get(method, {}).get(direction)
            mean_curve = [statistics.fmean(v) for v in zip(*got, strict=True)] if got else None
            entry[direction] = {
                "recall@1": cells.get(f"{direction}_recall_at_1", {}).get("mean", float("nan")),
                "binned_recall@1": mean_curve,
                "spearman": cells.get(f"{direction}_spearman", {}).get("mean"),
                "r2": cells.get(f"{direction}_r2", {}).get("mean"),
            }
        results[method] = entry
    figures = {}
    tag = (dataset or "data").replace("/", "_")
    fig3 = os.path.join(output, f"fig3_{tag}.png")
    plot_binned_recall(results, fig3, title=f"{dataset}")
    figures[fig3] = f"Fig. 3 analogue — Recall@1 per uncertainty level, {dataset}"
    ablations = {m: results[m] for m in ABLATIONS if m in results}
    if len(ablations) >= 2:
        fig4 = os.path.join(output, f"fig4_{tag}.png")
        plot_binned_recall(ablations, fig4, title=f"ablations, {dataset}")
        figures[fig4] = f"Fig. 4 analogue — ablations, {dataset}"
    for path, caption in figures.items():
        lines.append(f"![{caption}]({os.path.basename(path)})\n")
    return lines, figures


# -- Tables 2 and 3, Fig. 5, OOD ----------------------------------------------------------------
def _table2(results: list[dict]) -> list[str]:
    lines = ["### Table 2 analogue — none-of-the-above (positives: CIFAR-10, negatives: "
             "CIFAR-100)", "", "| dummy prompt | method | pos. acc. | neg. acc. | paper (pos., "
             "neg.) |", "|---|---|---|---|---|"]  # fmt: skip
    for res in results:
        for dummy, per_method in res["dummy"].items():
            grouped: dict[str, list[dict]] = defaultdict(list)
            for name, cell in per_method.items():
                grouped[_base(name)].append(cell)
            for method, cells in grouped.items():
                paper = paper_numbers.TABLE2.get(dummy, {}).get(method)
                ref = f"{paper[0]:.3f}, {paper[1]:.3f}" if paper else "–"
                lines.append(f"| \"{dummy}\" | {method} | "
                             f"{_mean_std(c['pos_acc'] for c in cells)} | "
                             f"{_mean_std(c['neg_acc'] for c in cells)} | {ref} |")  # fmt: skip
        for name, cell in res.get("rejection", {}).items():
            paper = paper_numbers.TABLE2["(none)"].get(name)
            ref = f"{paper[0]:.3f}, {paper[1]:.3f}" if paper else "–"
            lines.append(f"| (none) | {name}-based (frozen) | {cell['pos_acc']:.3f} | "
                         f"{cell['neg_acc']:.3f} | {ref} |")  # fmt: skip
    return lines + ["", "*Paper numbers: Ju et al. 2025, Table 2 (CLIP ViT-B/32).*", ""]


def _table3(runs: list[tuple[dict, dict]]) -> list[str]:
    lines = ["### Table 3 analogue — zero-shot accuracy after fine-tuning", ""]
    sets = sorted({s for res, _ in runs for cells in res.values() for s in cells})
    lines += ["| fine-tuned on | method | " + " | ".join(sets) + " |",
              "|---|---|" + "---|" * len(sets)]  # fmt: skip
    for res, params in runs:
        ft = params.get("fine_tuned_on", "?")
        grouped: dict[str, list[dict]] = defaultdict(list)
        for name, cells in res.items():
            grouped[_base(name)].append(cells)
        for method, cells in grouped.items():
            row = [_mean_std(c.get(s) for c in cells) for s in sets]
            lines.append(f"| {ft} | {method} | " + " | ".join(row) + " |")
            paper = paper_numbers.TABLE3.get(ft, {}).get(method)
            if paper and paper_numbers.matches_paper(params.get("embedding_model"), ft):
                lines.append(f"| {ft} | {method} (paper) | "
                             + " | ".join(f"{paper.get(s, float('nan')):.3f}" for s in sets)
                             + " |")  # fmt: skip
    return lines + [""]


def _heading(params: dict) -> str:
    parts = [p for p in (params.get("sweep"), params.get("note")) if p]
    return f" — {', '.join(parts)}" if parts else ""


def _hierarchy(res: dict, output: str, params: dict, tag: str) -> tuple[list[str], dict]:
    first: dict[str, dict] = {}
    grouped: dict[str, list[dict]] = defaultdict(list)
    for name, cell in res.items():
        grouped[_base(name)].append(cell)
        first.setdefault(_base(name), cell)
    lines = [f"### HierarCaps analysis (Fig. 5 analogue){_heading(params)}", "",
             "| method | S(level, uncertainty) | S(words, uncertainty) | monotone hierarchies |",
             "|---|---|---|---|"]  # fmt: skip
    for method, cells in grouped.items():
        lines.append(f"| {method} | {_mean_std(c['spearman_level_uncertainty'] for c in cells)} "
                     f"| {_mean_std(c['spearman_words_uncertainty'] for c in cells)} | "
                     f"{_mean_std(c['monotone_fraction'] for c in cells)} |")  # fmt: skip
    name = f"fig5_{tag}.png"
    path = os.path.join(output, name)
    plot_hierarchy(first, path)
    lines += ["", f"![Fig. 5 analogue — uncertainty and paired score per caption level]({name})",
              ""]  # fmt: skip
    return lines, {path: "fig5"}


def _ood(res: dict, output: str, params: dict, tag: str) -> tuple[list[str], dict]:
    lines = [f"### OOD robustness (beyond the paper){_heading(params)}", "",
             "| method | perturbation | t2i R@1 | i2t R@1 | t2i MMI | i2t MMI | unc. AUROC |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    grouped: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for name, per in res.items():
        for spec, cell in per.items():
            grouped[_base(name)][spec].append(cell)
    curves: dict[str, dict[str, dict[int, float]]] = defaultdict(dict)
    for method, per in grouped.items():
        for spec, cells in sorted(per.items()):
            lines.append(f"| {method} | {spec} | {_mean_std(c['t2i_recall_at_1'] for c in cells)}"
                         f" | {_mean_std(c['i2t_recall_at_1'] for c in cells)} | "
                         f"{_mean_std(c['t2i_mmi'] for c in cells)} | "
                         f"{_mean_std(c['i2t_mmi'] for c in cells)} | "
                         f"{_mean_std(c['uncertainty_auroc'] for c in cells)} |")  # fmt: skip
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
    lines = [f"# AsymVLM report — experiment `{experiment}`", "",
             f"Tracking store: `{redact(tracking_uri)}`. Values are mean ± std over seeds where "
             "there are several. Rows marked *(paper)* are the numbers published by Ju et al. "
             "(NeurIPS 2025) for CLIP ViT-B/32, shown only where our set-up matches theirs.",
             ""]  # fmt: skip
    figures: dict[str, str] = {}
    sweeps = [r for r in runs if r.data.tags.get("kind") == "sweep"]
    for sweep in sweeps:
        section, figs = _sweep_section(tracking_uri, sweep, output)
        lines += section
        figures.update(figs)
    evals: dict[str, list] = defaultdict(list)
    for run in runs:
        kind = run.data.tags.get("kind", "")
        if kind.startswith("eval-") and run.info.status == "FINISHED":
            result = tracking.json_artifact(tracking_uri, run.info.run_id, "results.json")
            evals[kind].append((result, run.data.params))
    if evals.get("eval-nota"):
        lines += _table2([res for res, _ in evals["eval-nota"]])
    if evals.get("eval-zeroshot"):
        lines += _table3(evals["eval-zeroshot"])
    # One section per evaluation run; figure names get the sweep when there are several.
    for kind, section_fn, prefix in (("eval-hierarcaps", _hierarchy, "hierarcaps"),
                                     ("eval-ood", _ood, "")):  # fmt: skip
        runs_of_kind = evals.get(kind, [])
        for k, (res, params) in enumerate(runs_of_kind):
            tag = prefix if len(runs_of_kind) == 1 else f"{prefix}_{params.get('sweep') or k}"
            section, figs = section_fn(res, output, params, tag)
            lines += section
            figures.update(figs)
    if len(lines) <= 5:
        lines.append("*No sweeps or evaluations in this experiment yet.*")
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
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
             "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;"
             "padding:3px 8px}img{max-width:100%}blockquote{color:#555}")  # fmt: skip
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
            f"</title><style>{style}</style></head><body>{body}</body></html>\n")  # fmt: skip
