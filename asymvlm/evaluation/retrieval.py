"""Cross-modal retrieval with uncertainty (paper Sec. 5.1, Table 1, Fig. 3).

Encodes a split once (captions in chunks), then hands :func:`asymvlm.metrics.retrieval_metrics`
a score function over caption chunks, so memory stays O(chunk x n_image).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import torch

from asymvlm.methods import Encoding, Method
from asymvlm.metrics import retrieval_metrics
from asymvlm.training import SplitTensors


def _encode_chunked(fn, x: torch.Tensor, chunk_size: int) -> Encoding:
    parts = [fn(x[i : i + chunk_size]) for i in range(0, x.shape[0], chunk_size)]
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


@torch.no_grad()
def encode_split(
    method: Method, data: SplitTensors, chunk_size: int = 8192
) -> tuple[Encoding, Encoding]:
    """(text encoding, image encoding) of a whole split, computed in chunks."""
    method.eval()
    texts = _encode_chunked(method.encode_texts, data.text_emb, chunk_size)
    images = _encode_chunked(method.encode_images, data.image_emb, chunk_size)
    return texts, images


@torch.no_grad()
def evaluate_retrieval(
    method: Method,
    data: SplitTensors,
    n_bins: int = 10,
    ks: tuple[int, ...] = (1, 5, 10),
    chunk_size: int = 1024,
    progress: bool = False,
) -> dict[str, Any]:
    """Recall@K both ways, binned Recall@1 by uncertainty, Spearman S and R^2 (App. B)."""
    texts, images = encode_split(method, data)

    def score_fn(start: int, stop: int) -> torch.Tensor:
        return method.score({k: v[start:stop] for k, v in texts.items()}, images)

    result = retrieval_metrics(
        score_fn,
        n_text=data.text_emb.shape[0],
        n_image=data.image_emb.shape[0],
        text_to_image=data.text_to_image,
        text_uncertainty=method.text_uncertainty_from(texts),
        image_uncertainty=method.image_uncertainty_from(images),
        ks=ks,
        n_bins=n_bins,
        chunk_size=chunk_size,
        progress=progress,
    )
    result["method"] = method.name
    result["n_text"] = int(data.text_emb.shape[0])
    result["n_image"] = int(data.image_emb.shape[0])
    return result


@torch.no_grad()
def caption_scores(method: Method, data: SplitTensors) -> pa.Table:
    """Per caption: ``caption_id``, ``kappa`` (where defined, else null) and ``uncertainty``."""
    texts, _ = encode_split(method, data)
    unc = method.text_uncertainty_from(texts)
    n = data.text_emb.shape[0]
    columns: dict[str, pa.Array] = {"caption_id": pa.array(data.split.caption_ids, pa.string())}
    kappa = texts.get("kappa")
    columns["kappa"] = (
        pa.array(kappa.float().cpu().numpy(), pa.float32())
        if kappa is not None
        else pa.nulls(n, pa.float32())
    )
    columns["uncertainty"] = (
        pa.array(unc.float().cpu().numpy(), pa.float32())
        if unc is not None
        else pa.nulls(n, pa.float32())
    )
    for name, values in data.split.extra_text_columns.items():
        columns[name] = pa.array(np.asarray(values))
    return pa.table(columns)
