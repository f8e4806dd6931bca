"""Tables over seeds: per method (or any grouping) the mean ± std of each column over its seed
runs, as markdown or CSV (Table A.2 layout): the report's tables and each sweep's summary."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

SUMMARY_COLUMNS = [f"{d}_{m}" for d in ("i2t", "t2i") for m in ("recall_at_1", "spearman", "r2")]


def seed_stats(
    rows: Iterable[Mapping[str, Any]] | pd.DataFrame, by: str | list[str], columns: Sequence[str]
) -> pd.DataFrame:
    """Per group of ``by`` (first-seen order): ``seeds`` (rows) and ``<column>_mean``, ``_std``
    (0 for one value) and ``_n`` over the defined values of each column."""
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    values = frame.reindex(columns=list(columns)).apply(pd.to_numeric, errors="coerce")
    keys = [frame[k] for k in ([by] if isinstance(by, str) else by)]
    groups = values.astype(float).groupby(keys, sort=False)
    stats = groups.agg(["mean", "std", "count"])
    stats.columns = [f"{c}_{'n' if k == 'count' else k}" for c, k in stats.columns]
    for column in columns:
        stats.loc[stats[f"{column}_n"] == 1, f"{column}_std"] = 0.0
    stats.insert(0, "seeds", groups.size())
    return stats


def mean_std(
    stats: pd.DataFrame, column: str, scale: float = 1.0, digits: int = 3, bare: bool = False
) -> list[str]:
    """The cells ``mean ± std`` of :func:`seed_stats`' ``column``, scaled ("–": no value;
    ``bare``: a single value without "± 0")."""

    def cell(mean: float, std: float, n: int) -> str:
        if not n > 0:
            return "–"
        shown = f"{scale * mean:.{digits}f}"
        return shown if bare and n == 1 else f"{shown} ± {scale * std:.{digits}f}"

    values = (stats[f"{column}_{k}"] for k in ("mean", "std", "n"))
    return [cell(*cells) for cells in zip(*values, strict=True)]


def markdown(frame: pd.DataFrame) -> str:
    """A frame of text cells as a markdown table (cells kept as written)."""
    return frame.to_markdown(index=False, disable_numparse=True)


def seed_summary(runs: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per method: ``n_seeds`` and the mean, std and n over seeds of each summary column."""
    stats = seed_stats(runs, "method", SUMMARY_COLUMNS)
    return {
        method: {
            "n_seeds": int(row["seeds"]),
            **{
                c: {k: float(row[f"{c}_{k}"]) for k in ("mean", "std")} | {"n": int(row[f"{c}_n"])}
                for c in SUMMARY_COLUMNS
                if row[f"{c}_n"]
            },
        }
        for method, row in stats.iterrows()
    }


def _summary_frame(summary: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """:func:`seed_summary` as :func:`seed_stats` gives it: ``seeds``, ``<col>_mean`` ..."""
    fields = ["seeds"] + [f"{c}_{k}" for c in SUMMARY_COLUMNS for k in ("mean", "std", "n")]
    frame = pd.json_normalize(list(summary.values()), sep="_").set_axis(list(summary))
    return frame.rename(columns={"n_seeds": "seeds"}).reindex(columns=fields)


def stats_table(stats: pd.DataFrame, cells: Iterable[tuple[str, str, float, int]]) -> str:
    """Markdown: per group of :func:`seed_stats` its seeds and ``mean ± std`` of each cell
    ``(column, heading, scale, digits)``."""
    table = {"Method": stats.index, "seeds": stats["seeds"].astype(str)}
    table |= {head: mean_std(stats, col, scale, digits) for col, head, scale, digits in cells}
    return markdown(pd.DataFrame(table))


def summary_markdown(summary: Mapping[str, Mapping[str, Any]], title: str = "") -> str:
    """The table as markdown: R@1 in %, S and R² as is, mean ± std over n seeds."""
    heads = (("recall_at_1", "R@1 (%)", 100.0), ("spearman", "S", 1.0), ("r2", "R²", 1.0))
    cells = [(f"{d}_{c}", f"{d} {h}", s, 2) for d in ("i2t", "t2i") for c, h, s in heads]
    return (
        (f"### {title}\n\n" if title else "") + stats_table(_summary_frame(summary), cells) + "\n"
    )


def summary_csv(summary: Mapping[str, Mapping[str, Any]]) -> str:
    """The table as CSV: one row per method, ``<col>_mean`` / ``<col>_std`` columns."""
    stats = _summary_frame(summary).rename(columns={"seeds": "n_seeds"}).rename_axis("method")
    stats = stats[[c for c in stats.columns if not c.endswith("_n")]]
    return stats.to_csv(float_format=lambda v: repr(float(v)))
