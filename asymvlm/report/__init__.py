"""The report of one MLflow experiment (``asymvlm report``): the paper's tables, figures and claims
beside ours. :func:`.document.build_report` writes ``report.md`` and ``report.html`` from the
sections of :mod:`.sweep_sections` (Table 1, Figs. 3-4) and :mod:`.evaluation_sections` (Tables
2-3, HierarCaps, OOD); :mod:`.columns` says which metrics each table shows (add a metric to the
report there); :mod:`.claims` judges the paper's claims, :mod:`.paper_numbers` holds its numbers;
:mod:`.seed_tables` (mean ± std over seeds) and :mod:`.figures` (every figure) serve the sweeps'
summaries and the demo too."""
