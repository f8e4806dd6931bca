"""MLflow tracking of training runs and sweeps (names, artifacts, the adapter as a model).

Plain MLflow, no Ray: the sweep driver in ``pipelines/`` is the only writer (one writer keeps a
SQLite store free of lock contention), and ``asymvlm report`` reads what is written here.

* Per-epoch metrics: ``train_loss``, ``temperature``, ``kappa_mean``, ``kappa_p05/p50/p95``
  (whatever :meth:`asymvlm.training.Trainer.stats` gives), with ``step`` = epoch.
* Final metrics (:func:`retrieval_metric_names`): ``t2i_recall_at_1/5/10``, ``t2i_spearman``,
  ``t2i_r2`` and the same for ``i2t``; validation-split copies carry a ``val_`` prefix.
* Artifacts: the binned Recall@1 curves as JSON and a Fig. 3-style PNG; the adapter as an MLflow
  pyfunc model (:class:`CaptionUncertaintyModel`) that scores caption uncertainty from
  embeddings; on the sweep's parent run, the mean ± std table over seeds (Table A.2 layout).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import statistics
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "CaptionUncertaintyModel",
    "DIRECTIONS",
    "default_artifact_location",
    "default_tracking_uri",
    "experiment_id",
    "git_commit",
    "log_history",
    "log_uncertainty_model",
    "retrieval_metric_names",
    "seed_summary",
    "summary_csv",
    "summary_markdown",
]

# Artifact downloads inside reports and evaluations: no per-file progress bars.
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

DIRECTIONS = ("t2i", "i2t")
_FINAL_KEYS = {"recall@1": "recall_at_1", "recall@5": "recall_at_5", "recall@10": "recall_at_10",
               "spearman": "spearman", "r2": "r2"}  # fmt: skip


def default_tracking_uri(output: str) -> str:
    """A local SQLite store beside the outputs (MLflow >= 3.13 refuses a bare ./mlruns)."""
    return "sqlite:///" + os.path.join(os.path.abspath(output), "mlflow.db")


def default_artifact_location(tracking_uri: str) -> str | None:
    """Artifacts of a local SQLite store go beside the database (``mlartifacts/``), not into
    ``./mlruns`` of whatever directory the run started in; servers choose their own (None)."""
    if tracking_uri.startswith("sqlite:///"):
        database = tracking_uri.removeprefix("sqlite:///")
        folder = os.path.join(os.path.dirname(os.path.abspath(database)), "mlartifacts")
        return "file://" + folder
    return None


def experiment_id(client, name: str, tracking_uri: str) -> str:
    """The id of experiment ``name``, created (artifacts beside a SQLite store) if missing."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    return client.create_experiment(name, artifact_location=default_artifact_location(tracking_uri))


def git_commit(path: str | None = None) -> str:
    """The commit of the checkout holding ``path`` (this package by default), or "unknown"."""
    where = path or os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(
            ["git", "-C", where, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def retrieval_metric_names(evaluation: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Flatten :func:`asymvlm.evaluation.evaluate_retrieval` output into MLflow metric names.

    ``{"t2i": {"recall@1": .3, "spearman": -.9, ...}}`` -> ``{"t2i_recall_at_1": .3,
    "t2i_spearman": -.9, ...}``; undefined values (no uncertainty: spearman/r2 None) are left out.
    """
    out: dict[str, float] = {}
    for direction in DIRECTIONS:
        for key, name in _FINAL_KEYS.items():
            value = evaluation.get(direction, {}).get(key)
            if value is not None and math.isfinite(float(value)):
                out[f"{prefix}{direction}_{name}"] = float(value)
    return out


def log_history(client, run_id: str, history: Sequence[Mapping[str, float]]) -> None:
    """Per-epoch scalars with step = epoch, in batches (one request per 1000 values)."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    metrics = [
        Metric(key, float(value), now, int(row["epoch"]))
        for row in history
        for key, value in row.items()
        if key != "epoch" and isinstance(value, int | float) and math.isfinite(float(value))
    ]
    for start in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[start : start + 1000])


# -- the adapter as an MLflow model ------------------------------------------------------------
try:  # mlflow is a dependency, but keep `import asymvlm.tracking` cheap to fail clearly
    from mlflow.pyfunc import PythonModel as _PythonModel
except ImportError:  # pragma: no cover
    _PythonModel = object  # type: ignore[assignment,misc]


class CaptionUncertaintyModel(_PythonModel):
    """Scores caption uncertainty from frozen text embeddings with a trained adapter.

    Input: a DataFrame with ``embedding`` (unit text embedding, a list of d floats per row) and,
    for adapters trained on raw features (``adapter_input = "raw"``, the default), ``norm`` (the
    raw projection norm, as in the embedding tables). Output: ``uncertainty`` (the method's
    per-caption uncertainty, e.g. 1/kappa) and ``kappa`` where the method has one (null where
    it has none).

    Bad input -- a missing column, an embedding that is not ``d`` numbers, a NaN/inf embedding
    value, a norm that is not a positive finite number -- raises
    ``MlflowException(INVALID_PARAMETER_VALUE)`` naming the row, which the scoring server answers
    with HTTP 400 and that message; a response never holds NaN.
    """

    def load_context(self, context) -> None:
        from asymvlm.training import load_checkpoint

        self.method, self.meta = load_checkpoint(context.artifacts["checkpoint"])

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        import torch
        from mlflow.exceptions import MlflowException
        from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

        def invalid(message: str) -> MlflowException:
            return MlflowException(message, error_code=INVALID_PARAMETER_VALUE)

        frame = pd.DataFrame(model_input)
        dim = int(self.meta["dim"])
        raw = self.meta.get("adapter_input", "raw") == "raw"
        needed = {"embedding": "one list of floats per caption"}
        if raw:
            needed["norm"] = "the raw projection norm per caption: this adapter reads raw features"
        for column, what in needed.items():
            if column not in frame:
                raise invalid(f"input needs a {column!r} column ({what})")
        if len(frame) == 0:
            raise invalid("input has no rows")
        emb = np.empty((len(frame), dim), dtype=np.float32)
        for row, value in enumerate(frame["embedding"]):
            try:
                vector = np.asarray(value, dtype=np.float64)
            except (TypeError, ValueError):
                raise invalid(f"row {row}: 'embedding' must be a list of {dim} numbers") from None
            if vector.shape != (dim,):
                got = f"{vector.shape[0]} values" if vector.ndim == 1 else f"shape {vector.shape}"
                raise invalid(f"row {row}: 'embedding' has {got}; this adapter expects dim {dim}")
            if not np.isfinite(vector).all():
                raise invalid(f"row {row}: 'embedding' holds a NaN or infinite value")
            emb[row] = vector
        if not np.isfinite(emb).all():  # finite float64 beyond the float32 range
            row = int(np.flatnonzero(~np.isfinite(emb).all(axis=1))[0])
            raise invalid(f"row {row}: 'embedding' holds a value beyond float32's range")
        if raw:
            norm = pd.to_numeric(frame["norm"], errors="coerce").to_numpy(dtype=np.float64)
            bad = ~(np.isfinite(norm) & (norm > 0) & (norm < np.finfo(np.float32).max))
            if bad.any():
                row = int(np.flatnonzero(bad)[0])
                value = frame["norm"].iloc[row]
                shown = repr(value) if isinstance(value, str) else str(value)
                raise invalid(f"row {row}: 'norm' must be a positive finite number, got {shown}")
            emb = emb * norm.astype(np.float32)[:, None]
        with torch.no_grad():
            texts = self.method.encode_texts(torch.from_numpy(emb))
            unc = self.method.text_uncertainty_from(texts)
        kappa = texts.get("kappa")
        out: dict[str, Any] = {}
        for name, value in (("uncertainty", unc), ("kappa", kappa)):
            if value is None:
                out[name] = [None] * len(frame)
                continue
            array = value.float().numpy().astype(np.float64)
            if not np.isfinite(array).all():
                row = int(np.flatnonzero(~np.isfinite(array))[0])
                raise invalid(f"row {row}: the adapter gives a non-finite {name} for this input")
            out[name] = array
        return pd.DataFrame(out, index=frame.index)


def log_uncertainty_model(checkpoint_dir: str, dim: int, name: str = "adapter"):
    """Log the checkpoint as a pyfunc model of the active run (this package travels with it)."""
    import mlflow
    from mlflow.models import infer_signature

    package = os.path.dirname(os.path.abspath(__file__))
    example = pd.DataFrame({"embedding": [[0.0] * dim], "norm": [1.0]})
    example.at[0, "embedding"] = list(np.eye(dim, dtype=float)[0])
    return mlflow.pyfunc.log_model(
        name=name,
        python_model=CaptionUncertaintyModel(),
        artifacts={"checkpoint": checkpoint_dir},
        code_paths=[package],
        pip_requirements=_requirements(),  # given: inferring them costs a subprocess per model
        signature=infer_signature(example, pd.DataFrame({"uncertainty": [1.0], "kappa": [1.0]})),
    )


def _requirements() -> list[str]:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for package in ("torch", "numpy", "pandas", "scipy", "pyarrow", "mlflow"):
        try:
            out.append(f"{package}=={version(package).split('+')[0]}")
        except PackageNotFoundError:
            out.append(package)
    return out


# -- mean ± std over seeds (Table A.2 layout) ---------------------------------------------------
SUMMARY_COLUMNS = [f"{d}_{m}" for d in ("i2t", "t2i") for m in ("recall_at_1", "spearman", "r2")]


def seed_summary(runs: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per method: mean, std (sample, ddof=1) and n over seeds of every summary column.

    ``runs`` are dicts with ``method`` and the flat final metrics of one seed each.
    """
    by_method: dict[str, list[Mapping[str, Any]]] = {}
    for run in runs:
        by_method.setdefault(run["method"], []).append(run)
    out: dict[str, dict[str, Any]] = {}
    for method, rows in by_method.items():
        cells: dict[str, Any] = {"n_seeds": len(rows)}
        for col in SUMMARY_COLUMNS:
            values = [float(r[col]) for r in rows if r.get(col) is not None]
            if values:
                cells[col] = {
                    "mean": statistics.fmean(values),
                    "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                    "n": len(values),
                }
        out[method] = cells
    return out


def _cell(stats: Mapping[str, float] | None, scale: float) -> str:
    if not stats:
        return "–"
    return f"{scale * stats['mean']:.2f} ± {scale * stats['std']:.2f}"


def summary_markdown(summary: Mapping[str, Mapping[str, Any]], title: str = "") -> str:
    """The table as markdown: R@1 in %, S and R² as is, mean ± std over n seeds."""
    head = ["Method", "seeds"] + [
        f"{d} {m}" for d in ("i2t", "t2i") for m in ("R@1 (%)", "S", "R²")
    ]
    lines = [f"### {title}", ""] if title else []
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method, cells in summary.items():
        row = [method, str(cells["n_seeds"])]
        for col in SUMMARY_COLUMNS:
            row.append(_cell(cells.get(col), 100.0 if "recall" in col else 1.0))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def summary_csv(summary: Mapping[str, Mapping[str, Any]]) -> str:
    """The table as CSV: one row per method, ``<col>_mean`` / ``<col>_std`` columns."""
    buf = io.StringIO()
    fields = ["method", "n_seeds"] + [f"{c}_{s}" for c in SUMMARY_COLUMNS for s in ("mean", "std")]
    writer = csv.DictWriter(buf, fieldnames=fields)
    writer.writeheader()
    for method, cells in summary.items():
        row: dict[str, Any] = {"method": method, "n_seeds": cells["n_seeds"]}
        for col in SUMMARY_COLUMNS:
            stats = cells.get(col)
            row[f"{col}_mean"] = "" if not stats else repr(stats["mean"])
            row[f"{col}_std"] = "" if not stats else repr(stats["std"])
        writer.writerow(row)
    return buf.getvalue()


def write_json(path: str, payload: Any) -> str:
    with open(path, "w") as fh:
        json.dump(payload, fh, indent=2)
    return path
