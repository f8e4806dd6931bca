"""The report of one MLflow experiment (``asymvlm report``, :func:`build_report`): the paper's
tables, figures and claims beside ours, a module per part:

* :mod:`.document` gathers the runs and writes ``report.md`` and ``report.html``;
* :mod:`.sweep_sections` (Table 1, Figs. 3-4 per sweep) and :mod:`.evaluation_sections`
  (Tables 2-3, HierarCaps, OOD per evaluation run) make the sections;
* :mod:`.columns` says which metrics each table shows: add a metric to the report there;
* :mod:`.claims` judges the paper's claims; :mod:`.paper_numbers` holds the paper's numbers.

``build_report`` is imported on first use, so that importing one part loads no other."""

from typing import Any

__all__ = ["build_report"]


def __getattr__(name: str) -> Any:
    if name == "build_report":
        from asymvlm.report.document import build_report

        return build_report
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
