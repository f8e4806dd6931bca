"""The report of one MLflow experiment (``asymvlm report``, :func:`build_report`): the paper's
tables, figures and claims beside ours. :mod:`.document` writes ``report.md`` and ``report.html``
from the sections of :mod:`.sweep_sections` (Table 1, Figs. 3-4) and :mod:`.evaluation_sections`
(Tables 2-3, HierarCaps, OOD); :mod:`.columns` says which metrics each table shows (add a metric
to the report there); :mod:`.claims` judges the paper's claims, :mod:`.paper_numbers` holds its
numbers; :mod:`.seed_tables` (mean ± std over seeds) and :mod:`.figures` (every figure) serve the
sweeps' summaries and the demo too, so ``build_report`` is imported on first use only."""

from typing import Any

__all__ = ["build_report"]


def __getattr__(name: str) -> Any:
    if name == "build_report":
        from asymvlm.report.document import build_report

        return build_report
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
