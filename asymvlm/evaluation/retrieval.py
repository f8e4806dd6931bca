"""Cross-modal retrieval with uncertainty (paper Sec. 5.1, Table 1, Fig. 3).

Encodes a split once (captions in chunks), then hands :func:`asymvlm.metrics.retrieval_metrics`
a score function over caption chunks, so memory stays O(chunk x n_image).

A broken adapter is refused rather than scored: a non-finite encoding (kappa, mu, means,
variances ...), uncertainty or score raises :class:`~asymvlm.errors.NonFiniteError` naming the
method, the quantity and the first caption / image it hit. The check costs one
``torch.isfinite(...).all()`` per tensor; rows are looked up only on failure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from asymvlm.errors import NonFiniteError
from asymvlm.methods import Encoding, Method
from asymvlm.metrics import retrieval_metrics
from asymvlm.training import SplitTensors


def _encode_chunked(fn, x: torch.Tensor, chunk_size: int) -> Encoding:
    parts = [fn(x[i : i + chunk_size]) for i in range(0, x.shape[0], chunk_size)]
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def _ids(data: SplitTensors, kind: str) -> Sequence[str] | None:
    split = data.split
    return getattr(split, "caption_ids" if kind == "caption" else "image_ids", None)


def _named(kind: str, ids: Sequence[str] | None, row: int) -> str:
    """``caption 'c17' (row 17)``, or ``caption row 17`` when the split has no ids."""
    if ids is not None and 0 <= row < len(ids):
        return f"{kind} {ids[row]!r} (row {row})"
    return f"{kind} row {row}"


def _first_bad_row(value: torch.Tensor) -> int:
    bad = ~torch.isfinite(value.reshape(value.shape[0], -1)).all(dim=1)
    return int(bad.nonzero()[0, 0])


def check_finite(
    method: Method, name: str, value: torch.Tensor | None, kind: str, ids: Sequence[str] | None
) -> None:
    """Raise :class:`NonFiniteError` when ``value`` (one row per caption/image) has a NaN/inf:
    ``"asymvlm-vmf: non-finite kappa for caption 'c17' (row 17)"``."""
    if value is None or not torch.is_tensor(value) or not value.is_floating_point():
        return
    if bool(torch.isfinite(value).all()):
        return
    if value.ndim == 0:
        raise NonFiniteError(f"{method.name}: non-finite {name} (a {kind} scalar)")
    row = _first_bad_row(value)
    raise NonFiniteError(f"{method.name}: non-finite {name} for {_named(kind, ids, row)}")


@torch.no_grad()
def encode_split(
    method: Method, data: SplitTensors, chunk_size: int = 8192
) -> tuple[Encoding, Encoding]:
    """(text encoding, image encoding) of a whole split, computed in chunks.

    Raises :class:`NonFiniteError` when any tensor of either encoding is non-finite.
    """
    method.eval()
    texts = _encode_chunked(method.encode_texts, data.text_emb, chunk_size)
    images = _encode_chunked(method.encode_images, data.image_emb, chunk_size)
    for kind, encoding in (("caption", texts), ("image", images)):
        ids = _ids(data, kind)
        for name, value in encoding.items():
            check_finite(method, name, value, kind, ids)
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
    """Recall@K both ways, binned Recall@1 by uncertainty, Spearman S and R^2 (App. B).

    Raises :class:`NonFiniteError` for a non-finite encoding, uncertainty or score (a broken
    adapter), naming the method, the quantity and the first caption/image id it hit.
    """
    n_text, n_image = data.text_emb.shape[0], data.image_emb.shape[0]
    if n_text == 0 or n_image == 0:
        raise ValueError(
            f"{method.name}: cannot evaluate retrieval on a split with {n_image} images and "
            f"{n_text} captions"
        )
    texts, images = encode_split(method, data)
    caption_ids, image_ids = _ids(data, "caption"), _ids(data, "image")
    text_unc = method.text_uncertainty_from(texts)
    image_unc = method.image_uncertainty_from(images)
    check_finite(method, "uncertainty", text_unc, "caption", caption_ids)
    check_finite(method, "uncertainty", image_unc, "image", image_ids)

    def score_fn(start: int, stop: int) -> torch.Tensor:
        scores = method.score({k: v[start:stop] for k, v in texts.items()}, images)
        if not bool(torch.isfinite(scores).all()):
            row = _first_bad_row(scores)
            col = int((~torch.isfinite(scores[row])).nonzero()[0, 0])
            raise NonFiniteError(
                f"{method.name}: non-finite score for {_named('caption', caption_ids, start + row)}"
                f" against {_named('image', image_ids, col)}"
            )
        return scores

    result = retrieval_metrics(
        score_fn,
        n_text=n_text,
        n_image=n_image,
        text_to_image=data.text_to_image,
        text_uncertainty=text_unc,
        image_uncertainty=image_unc,
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
    """Per caption: ``caption_id``, ``kappa`` (where defined, else null) and ``uncertainty``.

    Raises :class:`NonFiniteError` for a non-finite encoding or uncertainty (no NaN is written).
    """
    texts, _ = encode_split(method, data)
    unc = method.text_uncertainty_from(texts)
    check_finite(method, "uncertainty", unc, "caption", _ids(data, "caption"))
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
