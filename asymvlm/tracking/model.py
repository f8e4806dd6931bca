"""The trained adapter as an MLflow pyfunc model, and adapters loaded back from a sweep's runs.

:class:`CaptionUncertaintyModel` scores caption uncertainty from frozen text embeddings (served
by ``mlflow models serve``); :func:`load_sweep_adapters` gives the evaluations the stage-2
(seed) adapters of a sweep.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "CaptionTextModel",
    "CaptionUncertaintyModel",
    "load_sweep_adapters",
    "log_text_model",
    "log_uncertainty_model",
]

logger = logging.getLogger(__name__)

# The package that travels with a logged model (``code_paths``): asymvlm itself.
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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

    example = pd.DataFrame({"embedding": [[0.0] * dim], "norm": [1.0]})
    example.at[0, "embedding"] = list(np.eye(dim, dtype=float)[0])
    return mlflow.pyfunc.log_model(
        name=name,
        python_model=CaptionUncertaintyModel(),
        artifacts={"checkpoint": checkpoint_dir},
        code_paths=[PACKAGE],
        pip_requirements=_requirements(),  # given: inferring them costs a subprocess per model
        signature=infer_signature(example, pd.DataFrame({"uncertainty": [1.0], "kappa": [1.0]})),
    )


class CaptionTextModel(_PythonModel):
    """Text in, uncertainty out: the adapter with the frozen encoder its tables were embedded
    with (:class:`asymvlm.Scorer`).

    Input: a DataFrame with a ``text`` column (one caption a row). Output: ``uncertainty`` and
    ``kappa`` (null where the method has none), the numbers of ``asymvlm score-text``. The
    encoder is referenced, not copied into the model (a CLIP is hundreds of MB and every trial
    logs one): its id or folder and the SHA-256 of a folder's files are in the adapter's
    ``config.json``, so the server loads it by id (a hub download) or from the same folder, and
    refuses a folder whose files changed. A missing ``text`` column, an empty or non-string
    caption raises ``MlflowException(INVALID_PARAMETER_VALUE)`` naming the row (HTTP 400 from
    ``mlflow models serve``).
    """

    def load_context(self, context) -> None:
        from asymvlm.scoring import Scorer

        self.scorer = Scorer.from_checkpoint(context.artifacts["checkpoint"], device="cpu")

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        from mlflow.exceptions import MlflowException
        from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

        from asymvlm.scoring import ScoringInputError

        frame = pd.DataFrame(model_input)
        if "text" not in frame:
            raise MlflowException("input needs a 'text' column (one caption a row)",
                                  error_code=INVALID_PARAMETER_VALUE)  # fmt: skip
        try:
            result = self.scorer.caption_uncertainty(list(frame["text"]))
        except ScoringInputError as exc:
            raise MlflowException(f"row {exc.index}: {exc.problem}",
                                  error_code=INVALID_PARAMETER_VALUE) from None  # fmt: skip
        n = len(frame)
        return pd.DataFrame({
            "uncertainty": result.uncertainty if result.uncertainty is not None else [None] * n,
            "kappa": result.kappa if result.kappa is not None else [None] * n,
        }, index=frame.index)  # fmt: skip


def log_text_model(checkpoint_dir: str, name: str = "text-adapter"):
    """Log the checkpoint as a text-input pyfunc model (:class:`CaptionTextModel`) of the
    active run; the adapter's checkpoint must name its encoder (tables written by the
    embedding stage)."""
    import mlflow
    from mlflow.models import infer_signature

    example = pd.DataFrame({"text": ["a dog", "a golden retriever catching a red frisbee"]})
    output = pd.DataFrame({"uncertainty": [1.0, 1.0], "kappa": [1.0, 1.0]})
    return mlflow.pyfunc.log_model(
        name=name,
        python_model=CaptionTextModel(),
        artifacts={"checkpoint": checkpoint_dir},
        code_paths=[PACKAGE],
        pip_requirements=[*_requirements(), *_encoder_requirements(checkpoint_dir), "pillow"],
        signature=infer_signature(example, output),
        input_example=example,
    )


def _encoder_requirements(checkpoint_dir: str) -> list[str]:
    """The library of the encoder the checkpoint names: open_clip_torch for ``open_clip:``
    names, transformers otherwise."""
    from asymvlm.data.encoder import is_open_clip

    with open(os.path.join(checkpoint_dir, "config.json")) as fh:
        model = (json.load(fh).get("encoder") or {}).get("model") or ""
    return ["open_clip_torch"] if is_open_clip(model) else ["transformers"]


def _requirements() -> list[str]:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for package in ("torch", "numpy", "pandas", "scipy", "pyarrow", "mlflow"):
        try:
            out.append(f"{package}=={version(package).split('+')[0]}")
        except PackageNotFoundError:
            out.append(package)
    return out


def load_sweep_adapters(tracking_uri: str, parent_run_id: str) -> dict[str, Any]:
    """The stage-2 (seed) adapters of a sweep, as "method/seed<k>" -> method (with its
    ``adapter_input`` attribute set), loaded from the runs' MLflow models. Only FINISHED runs
    take part: a failed (e.g. diverged) trial has no adapter. A finished run without one (the
    frozen ``clip`` or ``bayesvlm`` of a sweep run before their trials saved a checkpoint) is
    left out with a warning."""
    import mlflow
    from mlflow.exceptions import MlflowException

    from asymvlm.tracking.queries import child_runs

    mlflow.set_tracking_uri(tracking_uri)
    out: dict[str, Any] = {}
    children = child_runs(tracking_uri, parent_run_id, stage="seeds")
    for child in sorted(children, key=lambda c: (c.data.params["method"], c.data.params["seed"])):
        try:
            model = mlflow.pyfunc.load_model(f"runs:/{child.info.run_id}/adapter")
        except MlflowException:
            logger.warning("trial run %s (%s, seed %s) has no adapter model: left out of the "
                           "evaluations", child.info.run_id, child.data.params["method"],
                           child.data.params["seed"])  # fmt: skip
            continue
        adapter = model.unwrap_python_model()  # a CaptionUncertaintyModel
        method = adapter.method
        method.adapter_input = adapter.meta.get("adapter_input", "raw")
        out[f"{child.data.params['method']}/seed{child.data.params['seed']}"] = method
    return out
