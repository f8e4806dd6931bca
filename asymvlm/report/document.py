"""``asymvlm report``: one MLflow experiment as ``report.md`` and ``report.html``, its sections
in order (:mod:`.sweep_sections`, :mod:`.evaluation_sections`, the claims of :mod:`.claims`)."""

from __future__ import annotations

import base64
import html
import os
import re
from pathlib import Path

from asymvlm import tracking
from asymvlm.config import redact
from asymvlm.evaluation.registry import logged_evaluations
from asymvlm.report import claims
from asymvlm.report.evaluation_sections import hierarcaps_section, ood_section, table2, table3
from asymvlm.report.sweep_sections import sweep_section


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
        section, figs, rows = sweep_section(tracking_uri, sweep, output, used_tags)
        lines += section
        figures.update(figs)
        if "plumbing only" not in sweep.data.tags.get("note", "").lower():
            name = sweep.info.run_name or sweep.info.run_id
            judged += [(name, v) for v in claims.table1_verdicts(rows)]
    evaluations = logged_evaluations(tracking_uri, runs)
    lines += table2(evaluations["nota"]) + table3(evaluations["zeroshot"])
    for kind, judge in (("nota", claims.table2_verdicts), ("zeroshot", claims.table3_verdicts)):
        for result in evaluations[kind]:
            if not result.plumbing_only:
                judged += [(f"{kind} ({result.sweep or '–'})", v) for v in judge(result.numbers)]
    lines += claims.claims_markdown(judged)
    for kind, section_of, prefix in (
        ("hierarcaps", hierarcaps_section, "hierarcaps"),
        ("ood", ood_section, ""),
    ):
        of_kind = evaluations[kind]
        for k, result in enumerate(of_kind):
            tag = prefix if len(of_kind) == 1 else f"{prefix}_{result.sweep or k}"
            section, figs = section_of(result, output, tag)
            lines += section
            figures.update(figs)
    world = claims.world_of(evaluations["nota"])
    if len(lines) <= 5:
        lines.append("*No sweeps or evaluations in this experiment yet.*")
    elif judged or world:
        lines += claims.closing_note(judged, world)
    text = "\n".join(lines) + "\n"
    path = os.path.join(output, "report.md")
    page = os.path.join(output, "report.html")
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
