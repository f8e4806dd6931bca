"""A trained adapter as MLflow pyfunc models, logged for every trial of a sweep and served by
``mlflow models serve``: ``adapter`` (text embeddings in) and ``text-adapter`` (captions in).
This module is their ``loader_module``: no code or pickle comes with a model (docs/sharing.md)."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np
import pandas as pd
import torch

from asymvlm.checkpoints import copy_adapter, load_checkpoint, read_checkpoint_meta
from asymvlm.embedding.encoders.names import is_open_clip
from asymvlm.scoring.scorer import Scorer, ScoringInputError
from asymvlm.tracking import Run, invalid_input, pinned_requirements, signature

#: The libraries every logged model needs (pinned to the versions installed here).
REQUIREMENTS = ("asymvlm", "torch", "numpy", "pandas", "scipy", "pyarrow", "safetensors", "mlflow")
#: The ``model_config`` of the captions-in model (the embeddings-in model has none).
TEXT_INPUT = {"input": "text"}


def _load_pyfunc(data_path: str, model_config: dict[str, Any] | None = None) -> Any:
    """MLflow's entry to a logged model: ``data_path`` is its checkpoint folder."""
    if (model_config or {}).get("input") == TEXT_INPUT["input"]:
        return CaptionTextModel(data_path)
    return CaptionUncertaintyModel(data_path)


def _answer(index: pd.Index, uncertainty: Any, kappa: Any) -> pd.DataFrame:
    """The models' output: ``uncertainty`` and ``kappa`` per row, null where undefined."""
    columns = {"uncertainty": uncertainty, "kappa": kappa}
    nulls = [None] * len(index)
    return pd.DataFrame(
        {k: nulls if v is None else np.asarray(v, np.float64) for k, v in columns.items()},
        index=index,
    )


class CaptionUncertaintyModel:
    """Text embeddings in (``embedding``, and ``norm`` for adapters on raw features),
    ``uncertainty`` and ``kappa`` out; bad input is an invalid-input error (HTTP 400)."""

    def __init__(self, checkpoint: str) -> None:
        self.method, self.meta = load_checkpoint(checkpoint)

    def predict(self, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        invalid, frame, dim = invalid_input, pd.DataFrame(model_input), int(self.meta["dim"])
        raw = self.meta.get("adapter_input", "raw") == "raw"
        for column in ("embedding", "norm") if raw else ("embedding",):
            if column not in frame:
                raise invalid(
                    f"input needs a {column!r} column (norm: this adapter reads raw features)"
                )
        if len(frame) == 0:
            raise invalid("input has no rows")
        emb = np.empty((len(frame), dim), dtype=np.float32)
        for row, value in enumerate(frame["embedding"]):
            try:
                vector = np.asarray(value, dtype=np.float32)
            except (TypeError, ValueError):
                vector = np.empty(0, np.float32)
            if vector.shape != (dim,) or not np.isfinite(vector).all():
                raise invalid(f"row {row}: 'embedding' must be {dim} finite numbers")
            emb[row] = vector
        if raw:
            norm = pd.to_numeric(frame["norm"], errors="coerce").to_numpy(dtype=np.float32)
            bad = np.flatnonzero(~(np.isfinite(norm) & (norm > 0)))
            if len(bad):
                value = frame["norm"].iloc[bad[0]]
                shown = repr(value) if isinstance(value, str) else str(value)
                raise invalid(f"row {bad[0]}: 'norm' must be a positive finite number, not {shown}")
            emb = emb * norm[:, None]
        with torch.no_grad():
            texts = self.method.encode_texts(torch.from_numpy(emb))
            unc = self.method.text_uncertainty_from(texts)
        for name, value in (("uncertainty", unc), ("kappa", texts.get("kappa"))):
            if value is not None and not torch.isfinite(value).all():
                row = int(torch.nonzero(~torch.isfinite(value))[0])
                raise invalid(f"row {row}: the adapter gives a non-finite {name} for this input")
        return _answer(frame.index, unc, texts.get("kappa"))


class CaptionTextModel:
    """Captions in (``text``), the numbers of ``asymvlm score-text`` out (:class:`Scorer`)."""

    def __init__(self, checkpoint: str) -> None:
        self.scorer = Scorer.from_checkpoint(checkpoint, device="cpu")

    def predict(self, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        frame = pd.DataFrame(model_input)
        if "text" not in frame:
            raise invalid_input("input needs a 'text' column (one caption a row)")
        try:
            result = self.scorer.caption_uncertainty(list(frame["text"]))
        except ScoringInputError as exc:
            raise invalid_input(f"row {exc.index}: {exc.problem}") from None
        return _answer(frame.index, result.uncertainty, result.kappa)


def log_adapter_models(run: Run, checkpoint_dir: str) -> list[str]:
    """Log ``checkpoint_dir`` on ``run`` as ``adapter`` and, with an encoder, ``text-adapter``:
    each the adapter's folder and this module as its loader, no code or pickle of its own. No
    input example: MLflow would load each model (and its encoder) to check it while logging."""
    meta = read_checkpoint_meta(checkpoint_dir) or {}
    example = pd.DataFrame({"embedding": [[1.0] + [0.0] * (int(meta["dim"]) - 1)], "norm": [1.0]})
    output = pd.DataFrame({"uncertainty": [1.0], "kappa": [1.0]})  # a schema: any rows will do
    with tempfile.TemporaryDirectory() as tmp:
        adapter = copy_adapter(checkpoint_dir, os.path.join(tmp, "checkpoint"))
        run.log_model(
            "adapter",
            __name__,
            adapter,
            pip_requirements=pinned_requirements(*REQUIREMENTS),
            signature=signature(example, output),
        )
        logged = ["adapter"]
        model = (meta.get("encoder") or {}).get("model")
        if model:
            texts = pd.DataFrame({"text": ["a dog", "a golden retriever catching a red frisbee"]})
            library = "open_clip_torch" if is_open_clip(model) else "transformers"
            run.log_model(
                "text-adapter",
                __name__,
                adapter,
                model_config=TEXT_INPUT,
                pip_requirements=[*pinned_requirements(*REQUIREMENTS), library, "pillow"],
                signature=signature(texts, output),
            )
            logged.append("text-adapter")
    return logged
