"""A trained adapter as an MLflow model, embeddings in or captions in.

Every finished trial of a sweep logs its adapter as the pyfunc model ``adapter``
(:class:`CaptionUncertaintyModel`: frozen text embeddings in, uncertainty out) and, for tables
written by the embedding stage, ``text-adapter`` (:class:`CaptionTextModel`: captions in, the
numbers of ``asymvlm score-text``); both are served by ``mlflow models serve``. The model holds
the adapter's checkpoint folder (:data:`asymvlm.checkpoints.ADAPTER_FILES`) as its artifact;
MLflow's API is reached through :mod:`asymvlm.tracking` only (:func:`log_adapter_models`).
"""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any

import numpy as np
import pandas as pd

from asymvlm.checkpoints import copy_adapter, load_checkpoint, read_checkpoint_meta
from asymvlm.data.encoder.names import is_open_clip
from asymvlm.scoring.scorer import Scorer, ScoringInputError
from asymvlm.tracking import PythonModel, Run, invalid_input, pinned_requirements, signature

__all__ = ["CaptionTextModel", "CaptionUncertaintyModel", "log_adapter_models"]

logger = logging.getLogger(__name__)

#: The libraries every logged model needs (pinned to the versions installed here).
REQUIREMENTS = ("torch", "numpy", "pandas", "scipy", "pyarrow", "mlflow")


class CaptionUncertaintyModel(PythonModel):
    """Scores caption uncertainty from frozen text embeddings with a trained adapter.

    Input: a DataFrame with ``embedding`` (unit text embedding, a list of d floats per row) and,
    for adapters trained on raw features (``adapter_input = "raw"``, the default), ``norm`` (the
    raw projection norm, as in the embedding tables). Output: ``uncertainty`` (the method's
    per-caption uncertainty, e.g. 1/kappa) and ``kappa`` where the method has one (null where
    it has none).

    Bad input -- a missing column, an embedding that is not ``d`` numbers, a NaN/inf embedding
    value, a norm that is not a positive finite number -- raises
    an invalid-input error (:func:`asymvlm.tracking.invalid_input`) naming the row, which the
    scoring server answers with HTTP 400 and that message; a response never holds NaN.
    """

    def load_context(self, context) -> None:
        self.method, self.meta = load_checkpoint(context.artifacts["checkpoint"])

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        import torch

        invalid = invalid_input
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


class CaptionTextModel(PythonModel):
    """Text in, uncertainty out: the adapter with the frozen encoder its tables were embedded
    with (:class:`asymvlm.Scorer`).

    Input: a DataFrame with a ``text`` column (one caption a row). Output: ``uncertainty`` and
    ``kappa`` (null where the method has none), the numbers of ``asymvlm score-text``. The
    encoder is referenced, not copied into the model (a CLIP is hundreds of MB and every trial
    logs one): its id or folder and the SHA-256 of a folder's files are in the adapter's
    ``config.json``, so the server loads it by id (a hub download) or from the same folder, and
    refuses a folder whose files changed. A missing ``text`` column, an empty or non-string
    caption is an invalid-input error naming the row (HTTP 400 from ``mlflow models serve``).
    """

    def load_context(self, context) -> None:
        self.scorer = Scorer.from_checkpoint(context.artifacts["checkpoint"], device="cpu")

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        frame = pd.DataFrame(model_input)
        if "text" not in frame:
            raise invalid_input("input needs a 'text' column (one caption a row)")
        try:
            result = self.scorer.caption_uncertainty(list(frame["text"]))
        except ScoringInputError as exc:
            raise invalid_input(f"row {exc.index}: {exc.problem}") from None
        n = len(frame)
        return pd.DataFrame(
            {
                "uncertainty": result.uncertainty if result.uncertainty is not None else [None] * n,
                "kappa": result.kappa if result.kappa is not None else [None] * n,
            },
            index=frame.index,
        )


def log_adapter_models(run: Run, checkpoint_dir: str) -> list[str]:
    """Log the adapter of the checkpoint folder ``checkpoint_dir`` on ``run``: as ``adapter``
    (embeddings in) and, when its checkpoint names the encoder of its tables (tables written by
    the embedding stage), as ``text-adapter`` (captions in; the encoder is referenced by id or
    folder, not copied). Only the adapter's files travel (no optimiser state, no history).
    Returns the names logged."""
    meta = read_checkpoint_meta(checkpoint_dir) or {}
    dim = int(meta["dim"])
    example = pd.DataFrame({"embedding": [[0.0] * dim], "norm": [1.0]})
    example.at[0, "embedding"] = list(np.eye(dim, dtype=float)[0])
    with tempfile.TemporaryDirectory() as tmp:
        adapter = copy_adapter(checkpoint_dir, os.path.join(tmp, "checkpoint"))
        run.log_pyfunc(
            "adapter",
            CaptionUncertaintyModel(),
            artifacts={"checkpoint": adapter},
            pip_requirements=pinned_requirements(*REQUIREMENTS),
            signature=signature(example, pd.DataFrame({"uncertainty": [1.0], "kappa": [1.0]})),
        )
        logged = ["adapter"]
        model = (meta.get("encoder") or {}).get("model")
        if model:
            texts = pd.DataFrame({"text": ["a dog", "a golden retriever catching a red frisbee"]})
            library = "open_clip_torch" if is_open_clip(model) else "transformers"
            run.log_pyfunc(
                "text-adapter",
                CaptionTextModel(),
                artifacts={"checkpoint": adapter},
                pip_requirements=[*pinned_requirements(*REQUIREMENTS), library, "pillow"],
                signature=signature(
                    texts, pd.DataFrame({"uncertainty": [1.0, 1.0], "kappa": [1.0, 1.0]})
                ),
                input_example=texts,
            )
            logged.append("text-adapter")
    return logged
