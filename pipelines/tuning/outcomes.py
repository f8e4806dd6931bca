"""What finished trials leave: their outcome in MLflow (:func:`log_outcome`), their adapters
(:func:`adapter_directory`), the lr selection (:func:`select_lr`) and the failures table."""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Iterator
from typing import Any

from asymvlm import results, storage, tracking
from pipelines.tuning.trials import SELECTION_METRIC


def failures_markdown(failed: list[dict[str, Any]]) -> str:
    """The failed trials under the summary table: how many, which, and why."""
    if not failed:
        return ""
    lines = [
        "",
        f"**{len(failed)} trial(s) failed** and are left out of the selection and the table above:",
        "",
        "| stage | method | lr | seed | reason |",
        "|---|---|---|---|---|",
    ]
    for f in failed:
        reason = f["reason"].replace("|", "\\|")
        lines.append(f"| {f['stage']} | {f['method']} | {f['lr']:g} | {f['seed']} | {reason} |")
    return "\n".join(lines) + "\n"


def select_lr(grid: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per method, the lr with the best finite validation score (ties: the smaller lr); a
    method none of whose lrs finished is absent."""
    best: dict[str, dict[str, Any]] = {}
    scores: dict[str, dict[str, float]] = {}
    for r in sorted(grid, key=lambda r: (r["method"], r["lr"])):
        score = float(r[SELECTION_METRIC])
        if not math.isfinite(score):
            continue
        scores.setdefault(r["method"], {})[f"{r['lr']:g}"] = score
        current = best.get(r["method"])
        if current is None or score > current["score"]:
            best[r["method"]] = {"lr": r["lr"], "score": score}
    for method in best:
        best[method]["scores_by_lr"] = scores[method]
    return best


def log_outcome(
    run: tracking.Run,
    result: dict[str, Any],
    checkpoint=None,
    member_dir: str = "",
) -> None:
    """A finished trial's final metrics, binned Recall@1 curves (JSON + PNG), every number of
    its evaluation (results.json) and its adapter (:func:`adapter_directory`)."""
    from asymvlm.plots import plot_binned_recall
    from asymvlm.scoring.models import log_adapter_models

    out = result["outcome"]
    method, lr, seed = result["method"], result["lr"], result["seed"]
    run.log_metrics(
        {
            **results.retrieval_metric_names(out.get("test", {})),
            **results.retrieval_metric_names(out.get("val", {}), prefix="val_"),
            SELECTION_METRIC: result[SELECTION_METRIC],
        }
    )
    curves = {
        split: {d: out[split][d].get("binned_recall@1") for d in results.DIRECTIONS}
        for split in ("val", "test")
        if split in out
    }
    run.log_json("binned_recall.json", curves)
    # every number of the evaluation, lists too (risk-coverage curves for the report)
    run.log_json("results.json", {split: out[split] for split in ("val", "test") if split in out})
    shown = out.get("test") or out.get("val")
    if shown:
        with tempfile.TemporaryDirectory() as tmp:
            png = plot_binned_recall(
                {method: shown},
                os.path.join(tmp, "binned_recall.png"),
                title=f"{method} lr={lr:g} seed={seed}",
            )
            run.log_artifact(png)
    with adapter_directory(out, checkpoint, member_dir) as model:
        if model is not None:  # embeddings in; and captions in when it names its encoder
            log_adapter_models(run, model)


@contextlib.contextmanager
def adapter_directory(
    out: dict[str, Any], checkpoint=None, member_dir: str = ""
) -> Iterator[str | None]:
    """A local folder holding a finished trial's adapter for the block: its Ray Train run's
    checkpoint, else ``checkpoint`` (a pack's: the member's ``member_dir``); None without."""
    if out.get("checkpoint"):
        from ray.train import Checkpoint

        # (path, filesystem) as Ray Train wrote it (pyarrow's own, for object stores)
        checkpoint = Checkpoint(*storage.ray_storage(out["checkpoint"]))
    if checkpoint is None:
        yield None
        return
    with checkpoint.as_directory() as directory:
        yield os.path.join(directory, member_dir) if member_dir else directory
