"""Figures in the paper's style (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_binned_recall(results: Mapping[str, Mapping[str, Any]], path: str, title: str = "") -> str:
    """Fig. 3 style: Recall@1 per uncertainty level of each method's ``evaluate_retrieval``
    result, t2i and i2t side by side; a method without uncertainty as a dashed line."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=False)
    for ax, direction in zip(axes, ("t2i", "i2t"), strict=True):
        for name, res in results.items():
            r = res[direction]
            curve = r.get("binned_recall@1")
            if curve:
                label = name
                if r.get("spearman") is not None:
                    label += f" (S={r['spearman']:+.2f}, R²={r['r2']:.2f})"
                ax.plot(range(1, len(curve) + 1), curve, marker="o", label=label)
            else:
                _flat(ax, name, 1, r["recall@1"])
        ax.set_xlabel("uncertainty level (1 = most certain)")
        ax.set_ylabel("Recall@1")
        ax.set_title(f"{direction} {title}".strip())
    return save_figure(fig, axes, path)


def plot_risk_coverage(results: Mapping[str, Mapping[str, Any]], path: str, title: str = "") -> str:
    """Risk-coverage curves (Geifman & El-Yaniv, 2017), t2i and i2t side by side; a method
    without one as a dashed line at its top-1 risk 1 - Recall@1 (a random subset's)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=False)
    for ax, direction in zip(axes, ("t2i", "i2t"), strict=True):
        for name, res in results.items():
            r = res.get(direction) or {}
            curve = r.get("risk_coverage")
            if curve and curve.get("coverage"):
                label = name if r.get("aurc") is None else f"{name} (AURC={r['aurc']:.3f})"
                ax.plot(curve["coverage"], curve["risk"], marker=".", label=label)
            elif r.get("recall@1") is not None and r["recall@1"] == r["recall@1"]:
                _flat(ax, name, 0, 1.0 - r["recall@1"])
        ax.set_xlim(0.0, 1.0)
        ax.set_xlabel("coverage (fraction of queries kept, most certain first)")
        ax.set_ylabel("top-1 risk (error rate)")
        ax.set_title(f"{direction} {title}".strip())
    return save_figure(fig, axes, path)


def _flat(ax, name: str, x: float, y: float) -> None:
    """A method without uncertainty: a dashed grey line at its overall value ``y``."""
    ax.axhline(y, linestyle="--", linewidth=1, color="grey")
    kw = {"textcoords": "offset points", "xytext": (2, 3), "fontsize": 8, "color": "grey"}
    ax.annotate(f"{name} (no uncertainty)", (x, y), **kw)


def save_figure(fig, axes, path: str) -> str:
    """Grid, legends, tight layout, PNG at 120 dpi; closes the figure and returns ``path``."""
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
