"""Every figure, in the paper's style (matplotlib, headless): Recall@1 per uncertainty level (Figs.
3-4), risk-coverage, uncertainty per caption level (Fig. 5), a metric against severity (OOD)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402


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


def plot_hierarchy(results: dict[str, dict], path: str, title: str = "") -> str:
    """Fig. 5 style: uncertainty per level, paired log-likelihood per level, per method."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, (name, res) in enumerate(results.items()):
        color = colors[k % len(colors)]  # the same method has the same colour in both panels
        levels = sorted(res["per_level"], key=int)
        x = [int(level) for level in levels]
        cells = [res["per_level"][level] for level in levels]
        if "uncertainty_median" in cells[0]:
            med = [c["uncertainty_median"] for c in cells]
            lo = [c["uncertainty_median"] - c["uncertainty_q25"] for c in cells]
            hi = [c["uncertainty_q75"] - c["uncertainty_median"] for c in cells]
            frac = res.get("monotone_fraction")
            label = f"{name} (monotone {frac:.0%})" if frac is not None else name
            axes[0].errorbar(x, med, yerr=[lo, hi], marker="o", capsize=3, label=label, color=color)
        axes[1].plot(
            x, [c["paired_log_likelihood_mean"] for c in cells], marker="o", label=name, color=color
        )
    axes[0].set_title(f"caption uncertainty by level {title}".strip())
    axes[0].set_ylabel("uncertainty (median, IQR)")
    axes[1].set_title("score of the paired image by level")
    axes[1].set_ylabel("mean log-likelihood / score")
    for ax in axes:
        ax.set_xlabel("level (0 = general, 3 = detailed)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return save_figure(fig, axes, path)


def plot_severity(
    curves: dict[str, dict[int, float]], path: str, ylabel: str = "Recall@1", title: str = ""
) -> str:
    """One line per method: a metric against perturbation severity (0 = clean)."""
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for name, curve in curves.items():
        xs = sorted(curve)
        ax.plot(xs, [curve[x] for x in xs], marker="o", label=name)
    ax.set_xlabel("severity (0 = clean)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return save_figure(fig, [ax], path)


def plot_kappa_cuts(
    histogram: Mapping[str, list[float]], cuts: Mapping[str, float], path: str
) -> str:
    """The distribution of a pool's ln κ (``edges``, ``counts``) and where each selection
    rule's κ threshold cuts it (a dashed line per rule)."""
    fig, ax = plt.subplots(figsize=(7, 3.8))
    edges, counts = histogram["edges"], histogram["counts"]
    if counts:
        ax.stairs(counts, edges, fill=True, alpha=0.6, label="captions")
    for (name, kappa), color in zip(cuts.items(), plt.cm.tab10.colors, strict=False):
        ax.axvline(math.log(kappa), color=color, linestyle="--", label=f"{name}: κ ≥ {kappa:.4g}")
    ax.set_xlabel("ln κ (right: more specific)")
    ax.set_ylabel("captions")
    ax.set_title("κ of the pool's captions and where each rule cuts")
    return save_figure(fig, [ax], path)


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
